//! The tree array: per 64 MiB tree a 16-bit entry with a free counter and a reserved flag.
//!
//! Each entry has a cache line of its own. While a tree is reserved by a core, its free frames
//! live in that core's local counter and the entry collects the frees of other cores; packed 32
//! to a line, those frees made every core that frees into trees it has not reserved fight over
//! the same few lines (llfree-bench rand, order 0, two threads: 87 ns per free packed, 48 ns
//! with a line per entry).
//!
//! The counter may be negative: a core that found no counted frame anywhere takes one the lower
//! level still has free, which some [`crate::CoreCache`] counts, and owes it to the tree
//! ([`Trees::borrow`]) until that cache gives its frames back. The 15 counter bits hold the
//! counter plus [`BIAS`].

use std::sync::atomic::{AtomicU16, Ordering};

use crate::{GIANT_ORDER, TREE_FRAMES};

/// The reserved flag.
const RESERVED: u16 = 1 << 15;
/// Added to the counter in the entry, so that it can be negative: from -`BIAS` to
/// `TREE_FRAMES`.
const BIAS: u16 = (RESERVED - 1) - TREE_FRAMES as u16;
/// The bits of a zero counter.
const ZERO: u16 = BIAS;
/// The bits of an entirely free, unreserved tree.
const FULL: u16 = BIAS + TREE_FRAMES as u16;

/// The counter of an entry (without the reserved flag).
#[inline]
fn counter(v: u16) -> isize {
    (v & !RESERVED) as isize - BIAS as isize
}

/// Bytes of one tree entry (a cache line).
pub const ENTRY_SIZE: usize = 64;
/// Trees in one giant frame.
pub const GIANT_TREES: usize = (1 << GIANT_ORDER) / TREE_FRAMES;

/// The entry of one tree, on a cache line of its own.
#[repr(C, align(64))]
#[derive(Default)]
pub struct TreeEntry(AtomicU16);
const _: () = assert!(std::mem::size_of::<TreeEntry>() == ENTRY_SIZE);

/// How full a tree is, for the reservation heuristic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Almost all frames are taken.
    Allocated = 0,
    /// Neither almost free nor almost allocated.
    Partial = 1,
    /// Almost all frames are free.
    Free = 2,
}

/// The tree array, in the allocator's metadata region.
pub struct Trees {
    entries: &'static [TreeEntry],
    len: usize,
    /// Trees with fewer free frames are [`Class::Allocated`].
    almost_allocated: usize,
    /// Trees with more free frames are [`Class::Free`].
    almost_free: usize,
}

impl Trees {
    /// The array of `len` trees in `entries` (at least `len`), as they are.
    pub fn new(
        entries: &'static [TreeEntry],
        len: usize,
        almost_allocated: usize,
        almost_free: usize,
    ) -> Self {
        debug_assert!(entries.len() >= len);
        Self {
            entries,
            len,
            almost_allocated,
            almost_free,
        }
    }

    /// Makes every tree unreserved with the given free counts (one per tree).
    pub fn init(&self, free: &[usize]) {
        debug_assert_eq!(free.len(), self.len);
        for (tree, free) in free.iter().enumerate() {
            self.entry(tree)
                .store(ZERO + *free as u16, Ordering::Relaxed);
        }
    }

    /// Number of trees.
    pub fn len(&self) -> usize {
        self.len
    }

    fn entry(&self, tree: usize) -> &AtomicU16 {
        &self.entries[tree].0
    }

    /// The global free counter (negative while the tree is owed frames) and the reserved flag
    /// of `tree`.
    pub fn load(&self, tree: usize) -> (isize, bool) {
        let v = self.entry(tree).load(Ordering::Acquire);
        (counter(v), v & RESERVED != 0)
    }

    /// Classifies a free count.
    pub fn class(&self, free: usize) -> Class {
        if free < self.almost_allocated {
            Class::Allocated
        } else if free > self.almost_free {
            Class::Free
        } else {
            Class::Partial
        }
    }

    /// Reserves `tree` if it is unreserved and `accept(free)` holds; moves its free counter out
    /// and returns it.
    pub fn reserve(&self, tree: usize, accept: impl Fn(usize) -> bool) -> Option<usize> {
        stop!();
        self.entry(tree)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                let free = counter(v);
                (v & RESERVED == 0 && free >= 0 && accept(free as usize)).then_some(RESERVED | ZERO)
            })
            .ok()
            .map(|v| counter(v) as usize)
    }

    /// Clears the reservation of `tree` and adds the frames its core still counted.
    pub fn unreserve(&self, tree: usize, free: usize) {
        stop!();
        let result = self
            .entry(tree)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some((v & !RESERVED) + free as u16)
            });
        debug_assert!(result.is_ok_and(|v| v & RESERVED != 0));
    }

    /// Takes the frames freed into a reserved `tree` by other cores (the owner's sync).
    pub fn take_foreign_frees(&self, tree: usize) -> usize {
        stop!();
        self.entry(tree)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v & RESERVED != 0 && counter(v) > 0).then_some(RESERVED | ZERO)
            })
            .map_or(0, |v| counter(v) as usize)
    }

    /// Adds freed frames to the global counter of `tree`.
    pub fn add(&self, tree: usize, frames: usize) {
        stop!();
        self.entry(tree).fetch_add(frames as u16, Ordering::AcqRel);
    }

    /// Takes `frames` from the global counter of an unreserved `tree` (an allocation without a
    /// reservation).
    pub fn take(&self, tree: usize, frames: usize) -> bool {
        self.entry(tree)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v & RESERVED == 0 && counter(v) >= frames as isize).then(|| v - frames as u16)
            })
            .is_ok()
    }

    /// Takes `frames` from the global counter of `tree`, reserved or not, even below zero (down
    /// to -[`BIAS`]): for frames the lower level has free while a cache counts them.
    pub fn borrow(&self, tree: usize, frames: usize) -> bool {
        stop!();
        self.entry(tree)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v & !RESERVED >= frames as u16).then(|| v - frames as u16)
            })
            .is_ok()
    }

    /// Claims the `GIANT_TREES` trees from `first` (aligned) if all are entirely free and
    /// unreserved.
    pub fn claim_giant_at(&self, first: usize) -> bool {
        for tree in first..first + GIANT_TREES {
            stop!();
            let claimed =
                self.entry(tree)
                    .compare_exchange(FULL, ZERO, Ordering::AcqRel, Ordering::Relaxed);
            if claimed.is_err() {
                for claimed in first..tree {
                    self.add(claimed, TREE_FRAMES);
                }
                return false;
            }
        }
        true
    }

    /// Claims `GIANT_TREES` entirely free, unreserved, aligned trees among the first `trees`
    /// (those entirely inside the zone). Returns the first tree.
    pub fn claim_giant(&self, trees: usize) -> Option<usize> {
        (0..trees / GIANT_TREES * GIANT_TREES)
            .step_by(GIANT_TREES)
            .find(|&first| {
                (first..first + GIANT_TREES).all(|t| self.entry(t).load(Ordering::Relaxed) == FULL)
                    && self.claim_giant_at(first)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trees(free: &[usize]) -> Trees {
        super::super::tests::trees(free)
    }

    #[test]
    fn reserve_moves_the_counter_out() {
        let t = trees(&[100, TREE_FRAMES]);
        assert_eq!(t.reserve(0, |f| f >= 200), None);
        assert_eq!(t.reserve(0, |f| f >= 100), Some(100));
        assert_eq!(t.load(0), (0, true));
        assert_eq!(t.reserve(0, |_| true), None);
        t.add(0, 5);
        assert_eq!(t.take_foreign_frees(0), 5);
        assert_eq!(t.take_foreign_frees(0), 0);
        t.unreserve(0, 42);
        assert_eq!(t.load(0), (42, false));
    }

    #[test]
    fn borrowed_frames_make_the_counter_negative() {
        let t = trees(&[3, 0]);
        assert!(t.borrow(0, 5));
        assert_eq!(t.load(0), (-2, false));
        assert!(!t.take(0, 1));
        assert_eq!(t.reserve(0, |_| true), None);
        t.add(0, 10);
        assert_eq!(t.reserve(0, |_| true), Some(8));
        assert!(t.borrow(0, 1));
        assert_eq!(t.take_foreign_frees(0), 0);
        t.unreserve(0, 8);
        assert_eq!(t.load(0), (7, false));
        assert!(t.borrow(1, BIAS as usize));
        assert!(!t.borrow(1, 1));
        assert_eq!(t.load(1), (-(BIAS as isize), false));
    }

    #[test]
    fn classes_follow_thresholds() {
        let t = trees(&[0]);
        assert_eq!(t.class(0), Class::Allocated);
        assert_eq!(t.class(2047), Class::Allocated);
        assert_eq!(t.class(2048), Class::Partial);
        assert_eq!(t.class(14336), Class::Partial);
        assert_eq!(t.class(14337), Class::Free);
    }

    #[test]
    fn giant_claims_sixteen_free_trees() {
        let mut free = vec![TREE_FRAMES; 40];
        free[3] = 10;
        let t = trees(&free);
        assert_eq!(t.claim_giant(40), Some(16));
        assert_eq!(t.claim_giant(40), None);
        assert!((16..32).all(|i| t.load(i) == (0, false)));
        assert!(!t.take(16, 1));
        assert!(t.take(0, 1));
    }
}
