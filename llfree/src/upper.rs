//! The upper level: allocation strategies over 64 MiB trees.
//!
//! Each core reserves a tree and allocates from it through its local counter, so cores rarely
//! share cache lines. A new tree is searched in the paper's order: the reserved tree's cache-line
//! neighbourhood, then partial trees, then free trees, then any tree with enough frames, and
//! finally the reservations of other cores are drained and the search repeated.
//!
//! One deliberate difference: the paper also takes *free* trees from the neighbourhood. That lets
//! base-frame allocations break up entirely free trees while partial ones exist elsewhere; taking
//! only partial trees there raised the huge frames recovered in the fragmentation benchmark
//! (`llfree-bench frag`, 8 GiB) from 44.5 % to 45.9 %. Free trees come first for huge frames,
//! and after a higher-order allocation failed on a fragmented tree; the search then ends at the
//! first free tree instead of scanning every tree for a partial one (a fresh zone has none). After a number of
//! consecutive frees into a tree that is not reserved, the freeing core reserves it
//! (reserve-on-free).

pub mod local;
pub mod trees;

use local::Local;
use trees::{Class, Trees};

/// What a tree search is looking for.
#[derive(Debug, Clone, Copy)]
pub struct Search {
    /// The tree to start from (the current or initial tree of the core).
    pub start: usize,
    /// Frames the allocation needs.
    pub frames: usize,
    /// Prefer free trees, which are not fragmented: the previous tree could not serve the order
    /// although it had enough free frames, or the order takes whole children, which partial
    /// trees seldom have.
    pub prefer_free: bool,
}

impl Trees {
    /// Finds and reserves a tree for `search`. Returns the tree and its free frames.
    ///
    /// One pass over the tree entries from `search.start` on, wrapping around, remembers the
    /// first partial, free and merely large enough tree; the pass stops early at the first tree
    /// of the preferred class. A lost race for the chosen tree repeats the pass.
    pub fn search(&self, search: Search) -> Option<(usize, usize)> {
        const ATTEMPTS: usize = 4;
        let preferred = if search.prefer_free {
            Class::Free
        } else {
            Class::Partial
        };
        for _ in 0..ATTEMPTS {
            // First tree of each class: [allocated (large enough), partial, free].
            let mut found = [None; 3];
            // Visits a tree; true ends the pass (the first tree of the preferred class).
            let mut visit = |tree: usize| {
                let (free, reserved) = self.load(tree);
                if reserved || free < search.frames as isize {
                    return false;
                }
                let class = self.class(free as usize);
                let slot = &mut found[class as usize];
                slot.is_none() && {
                    *slot = Some(tree);
                    class == preferred
                }
            };
            // Plain loops (an iterator chain cost a reservation thousands of instructions in a
            // large zone).
            let _ = (search.start..self.len()).any(&mut visit) || (0..search.start).any(&mut visit);
            let [fits, partial, free] = found;
            let choice = if search.prefer_free {
                free.or(partial).or(fits)
            } else {
                partial.or(free).or(fits)
            };
            let tree = choice?;
            if let Some(free) = self.reserve(tree, |free| free >= search.frames) {
                return Some((tree, free));
            }
        }
        None
    }
}

/// Per-core data of all cores, in the allocator's metadata region.
pub struct Locals(&'static [Local]);

impl Locals {
    /// The slots `locals`, as they are.
    pub fn new(locals: &'static [Local]) -> Self {
        Self(locals)
    }

    /// Empties every slot: no reservation, no free history.
    pub fn init(&self) {
        for local in self.0 {
            local.reset();
        }
    }

    /// The data of `core` (core ids beyond the slots share them).
    #[inline]
    pub fn get(&self, core: usize) -> &Local {
        // Avoid the division on the hot path when the core id is in range.
        match self.0.get(core) {
            Some(local) => local,
            None => &self.0[core % self.0.len()],
        }
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// All slots.
    pub fn iter(&self) -> impl Iterator<Item = &Local> {
        self.0.iter()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::TREE_FRAMES;

    /// Unreserved trees with the `free` counts and the default thresholds, leaked for the test.
    pub(crate) fn trees(free: &[usize]) -> Trees {
        let entries: &'static [trees::TreeEntry] = Box::leak(
            (0..free.len())
                .map(|_| trees::TreeEntry::default())
                .collect(),
        );
        let trees = Trees::new(
            entries,
            free.len(),
            TREE_FRAMES / 8,
            TREE_FRAMES - TREE_FRAMES / 8,
        );
        trees.init(free);
        trees
    }

    fn search(start: usize, frames: usize, prefer_free: bool) -> Search {
        Search {
            start,
            frames,
            prefer_free,
        }
    }

    #[test]
    fn prefers_partial_trees() {
        let full = TREE_FRAMES;
        let mut free = vec![10; 64];
        free[40] = 5000;
        free[2] = 6000;
        free[50] = full;
        let t = trees(&free);
        // Partial trees in the neighbourhood of tree 35 (trees 32..64) come first.
        assert_eq!(t.search(search(35, 1, false)), Some((40, 5000)));
        // Then partial trees anywhere, then free trees.
        assert_eq!(t.search(search(35, 1, false)), Some((2, 6000)));
        assert_eq!(t.search(search(35, 1, false)), Some((50, full)));
        // Nothing big enough.
        assert_eq!(t.search(search(0, full + 1, false)), None);
        // Fragmented: free trees first.
        let t = trees(&free);
        assert_eq!(t.search(search(1, 512, true)), Some((50, full)));
    }

    #[test]
    fn falls_back_to_allocated_trees() {
        let t = trees(&[0, 10, 0]);
        assert_eq!(t.search(search(2, 4, false)), Some((1, 10)));
        assert_eq!(t.search(search(2, 1, false)), None);
    }

    #[test]
    fn global_search_finds_partial_before_free() {
        let full = TREE_FRAMES;
        let mut free = vec![10; 96];
        free[70] = full;
        free[90] = 3000;
        let t = trees(&free);
        assert_eq!(t.search(search(0, 1, false)), Some((90, 3000)));
        assert_eq!(t.search(search(0, 1, false)), Some((70, full)));
    }
}
