//! The lower level: allocation mechanisms inside one 64 MiB tree.
//!
//! Every child (2 MiB) has a [`child::Child`] entry and a [`bitfield::Bitfield`]. The lower level
//! alone is the crash-consistent state of a persistent allocator; every allocation and free is
//! committed by **one atomic change in one cache line**:
//!
//! * **Orders 0 to 6** first take `2^order` frames from the child counter, then set an aligned run
//!   of bits inside one bitfield word with one CAS. The bit change is the commit: after a crash the
//!   counters are recomputed from the bitfields, so a crash between the two steps loses nothing; a
//!   crash after the bits are set but before the caller received the frame loses that one frame.
//! * **Orders 7 and 8** set two or four whole words, one CAS each, and roll back when a race is
//!   lost. A crash in between leaves some words set: less than one frame of the order is lost.
//! * **Order 9** changes the child entry from "512 free" to "huge" with one CAS; the bitfield stays
//!   zero and the huge flag is authoritative on recovery.
//! * **Order 10** changes the two child entries that share one 32-bit word with one CAS.
//! * **Order 18** (1 GiB, 512 children) is claimed by the upper level first, so its children are
//!   exclusively owned by the allocating thread. Children 2..512 are marked [`child::GIANT`], then
//!   the pair holding the first child is marked with one CAS: this commits the frame. Recovery
//!   treats marked children whose first child is unmarked as an unfinished allocation (or free)
//!   and frees them. A free first clears the first pair (uncommitting the frame), then the rest.
//!
//! Frees run in the opposite order: clear the authoritative state, then raise the counter.
//!
//! Base frames are taken from partially used children before entirely free ones, so that free
//! children stay available as huge frames (the child-level analogue of the tree heuristic).

pub mod bitfield;
pub mod child;
mod recovery;

use bitfield::{Bitfield, ClearError};
use child::{Child, ChildPair, GIANT, HUGE, PAIR};

use crate::flush::persist;
use crate::{Error, CHILD_FRAMES, GIANT_ORDER, HUGE_ORDER, TREE_CHILDREN, TREE_FRAMES};

/// Children in one giant frame.
const GIANT_CHILDREN: usize = 1 << (GIANT_ORDER - HUGE_ORDER);
/// A child that is part of a giant frame.
const GIANT_CHILD: Child = Child::new(0, GIANT);
/// A child that is an order-9 frame.
pub(crate) const HUGE_CHILD: Child = Child::new(0, HUGE);
/// A child that is half of an order-10 frame.
const PAIR_CHILD: Child = Child::new(0, HUGE | PAIR);

/// The lower-level metadata of a zone.
///
/// The slices point into the allocator's metadata region, which the allocator keeps alive for at
/// least as long as this value (see `LLFree`).
pub(crate) struct Lower {
    /// Child entries in pairs; 16 pairs (one cache line) per tree, padding children are absent.
    pairs: &'static [ChildPair],
    /// One bitfield per existing child.
    fields: &'static [Bitfield],
    /// Write back changed cache lines (ADR platforms).
    flush: bool,
}

impl Lower {
    /// Bytes needed for the child entries of `children` children.
    pub fn pairs_size(children: usize) -> usize {
        children.div_ceil(TREE_CHILDREN) * TREE_CHILDREN * 2
    }

    /// Bytes needed for the bitfields of `children` children.
    pub fn fields_size(children: usize) -> usize {
        children * std::mem::size_of::<Bitfield>()
    }

    /// Creates the lower level over `pairs` and `fields` (neither initialised nor recovered).
    pub fn new(pairs: &'static [ChildPair], fields: &'static [Bitfield], flush: bool) -> Self {
        Self {
            pairs,
            fields,
            flush,
        }
    }

    /// Number of existing children.
    pub fn children(&self) -> usize {
        self.fields.len()
    }

    #[inline]
    fn pair(&self, child: usize) -> &ChildPair {
        &self.pairs[child / 2]
    }

    /// The state of one child.
    #[inline]
    pub fn child(&self, child: usize) -> Child {
        self.pair(child).load()[child % 2]
    }

    /// Marks every child free (a fresh zone).
    pub fn init_fresh(&self) {
        for (index, pair) in self.pairs.iter().enumerate() {
            pair.store([0, 1].map(|half| {
                if index * 2 + half < self.children() {
                    Child::FREE
                } else {
                    Child::ABSENT
                }
            }));
        }
        for (child, field) in self.fields.iter().enumerate() {
            field.reset();
            self.persist_field(child);
        }
        self.persist_range(0..self.pairs.len());
    }

    /// Allocates `1 << order` frames (order <= 10) in the tree of `hint`, searching its children
    /// from the child of `hint`. Returns the first frame, or `None` if this tree has no room.
    #[inline]
    pub fn get(&self, hint: usize, order: usize) -> Option<usize> {
        if order >= HUGE_ORDER {
            return self.get_whole_children(hint, order == 10);
        }
        // Fast path (inlined into the caller): the hint's child.
        self.get_base(hint / CHILD_FRAMES, order)
            .or_else(|| self.get_base_elsewhere(hint, order))
    }

    /// Allocates `1 << order` base frames in another child of the tree of `hint` than the
    /// hint's: partially used children first, entirely free ones last, so that they stay
    /// available as huge frames.
    #[inline(never)]
    fn get_base_elsewhere(&self, hint: usize, order: usize) -> Option<usize> {
        let others = self.children_from(hint).skip(1);
        others
            .clone()
            .filter(|c| self.child(*c) != Child::FREE)
            .find_map(|c| self.get_base(c, order))
            .or_else(|| others.clone().find_map(|c| self.get_base(c, order)))
    }

    /// The existing children of the tree of `hint`, starting at the child of `hint`.
    #[inline]
    fn children_from(&self, hint: usize) -> impl Iterator<Item = usize> + Clone {
        let first = hint / TREE_FRAMES * TREE_CHILDREN;
        let start = hint / CHILD_FRAMES % TREE_CHILDREN;
        let end = (first + TREE_CHILDREN).min(self.children());
        (0..TREE_CHILDREN)
            .map(move |i| first + (start + i) % TREE_CHILDREN)
            .filter(move |c| *c < end)
    }

    /// Allocates `1 << order` base frames in `child`: takes them from its counter, then sets
    /// their bits, searching from the word where the used frames end.
    #[inline]
    fn get_base(&self, child: usize, order: usize) -> Option<usize> {
        let frames = 1 << order;
        let pair = self.pair(child);
        let free = pair.take(child % 2, frames)?;
        let word = (CHILD_FRAMES - free) / 64 % bitfield::WORDS;
        if let Some(bit) = self.fields[child].set_first_zeros(word, order) {
            self.persist_field(child);
            return Some(child * CHILD_FRAMES + bit);
        }
        pair.give(child % 2, frames);
        None
    }

    /// Allocates a huge frame (one child) or, with `pair`, an order-10 frame (an aligned pair of
    /// children) in the tree of `hint`: the first entirely free child (pair) of the tree's cache
    /// line of child entries, from the hint's pair on.
    #[inline(never)]
    fn get_whole_children(&self, hint: usize, pair: bool) -> Option<usize> {
        let first = hint / TREE_FRAMES * TREE_CHILDREN;
        let pairs = &self.pairs[first / 2..][..TREE_CHILDREN / 2];
        // From the hint's pair on (where the last allocation of the core was), wrapping around:
        // a run of huge allocations then looks at one pair each, not at all it filled before.
        let start = hint / CHILD_FRAMES % TREE_CHILDREN / 2;
        for k in 0..pairs.len() {
            let i = (start + k) % pairs.len();
            let [even, odd] = pairs[i].load();
            let child = first + 2 * i;
            let frame = if pair {
                (even == Child::FREE && odd == Child::FREE)
                    .then(|| self.get_pair(child))
                    .flatten()
            } else {
                (even == Child::FREE)
                    .then(|| self.get_huge(child))
                    .flatten()
                    .or_else(|| {
                        (odd == Child::FREE)
                            .then(|| self.get_huge(child + 1))
                            .flatten()
                    })
            };
            if frame.is_some() {
                return frame;
            }
        }
        None
    }

    /// Allocates `child` as a huge frame if it is entirely free (see `LLFree::get_at`).
    pub fn get_huge_at(&self, child: usize) -> bool {
        self.get_huge(child).is_some()
    }

    fn get_huge(&self, child: usize) -> Option<usize> {
        self.pair(child)
            .update(child % 2, |c| (c == Child::FREE).then_some(HUGE_CHILD))
            .ok()?;
        self.persist_pair(child);
        Some(child * CHILD_FRAMES)
    }

    fn get_pair(&self, child: usize) -> Option<usize> {
        self.pair(child)
            .exchange([Child::FREE; 2], [PAIR_CHILD; 2])
            .ok()?;
        self.persist_pair(child);
        Some(child * CHILD_FRAMES)
    }

    /// Frees `1 << order` frames (order <= 10) starting at `frame`.
    #[inline]
    pub fn put(&self, frame: usize, order: usize) -> Result<(), Error> {
        let child = frame / CHILD_FRAMES;
        let pair = self.pair(child);
        let wrong_order = Error::WrongOrder { frame, order };
        let not_allocated = Error::NotAllocated { frame, order };
        match order {
            HUGE_ORDER => pair
                .update(child % 2, |c| (c == HUGE_CHILD).then_some(Child::FREE))
                .map(|_| ())
                .map_err(|c| {
                    if c == Child::FREE {
                        not_allocated
                    } else {
                        wrong_order
                    }
                })?,
            10 => pair
                .exchange([PAIR_CHILD; 2], [Child::FREE; 2])
                .map_err(|c| {
                    if c == [Child::FREE; 2] {
                        not_allocated
                    } else {
                        wrong_order
                    }
                })?,
            _ => {
                if self.child(child).flags() != 0 {
                    return Err(wrong_order);
                }
                match self.fields[child].clear(frame % CHILD_FRAMES, order) {
                    Ok(()) => {}
                    Err(ClearError::NotSet) => return Err(not_allocated),
                    Err(ClearError::Partial { cleared_frames }) => {
                        self.persist_field(child);
                        pair.give(child % 2, cleared_frames);
                        return Err(not_allocated);
                    }
                }
                self.persist_field(child);
                pair.give(child % 2, 1 << order);
            }
        }
        self.persist_pair(child);
        Ok(())
    }

    /// Marks the 512 free children of the giant frame at `frame` allocated. The caller owns them
    /// (it claimed their 16 trees in the upper level). Returns false if a child was not free.
    pub fn get_giant(&self, frame: usize) -> bool {
        let first = frame / CHILD_FRAMES;
        let pairs = first / 2 + 1..(first + GIANT_CHILDREN) / 2;
        for (done, p) in pairs.clone().enumerate() {
            if self.pairs[p]
                .exchange([Child::FREE; 2], [GIANT_CHILD; 2])
                .is_err()
            {
                self.release_pairs(pairs.start..pairs.start + done);
                return false;
            }
        }
        self.persist_range(pairs.clone());
        // Commit: the first child becomes a giant child.
        if self
            .pair(first)
            .exchange([Child::FREE; 2], [GIANT_CHILD; 2])
            .is_err()
        {
            self.release_pairs(pairs);
            return false;
        }
        self.persist_pair(first);
        true
    }

    /// Frees the giant frame at `frame`.
    pub fn put_giant(&self, frame: usize) -> Result<(), Error> {
        let first = frame / CHILD_FRAMES;
        // Uncommit: the first pair is cleared with one CAS.
        self.pair(first)
            .exchange([GIANT_CHILD; 2], [Child::FREE; 2])
            .map_err(|c| {
                if c[0] == Child::FREE {
                    Error::NotAllocated {
                        frame,
                        order: GIANT_ORDER,
                    }
                } else {
                    Error::WrongOrder {
                        frame,
                        order: GIANT_ORDER,
                    }
                }
            })?;
        self.persist_pair(first);
        self.release_pairs(first / 2 + 1..(first + GIANT_CHILDREN) / 2);
        Ok(())
    }

    fn release_pairs(&self, pairs: std::ops::Range<usize>) {
        for p in pairs.clone() {
            self.pairs[p].store([Child::FREE; 2]);
        }
        self.persist_range(pairs);
    }

    /// Whether the `1 << order` frames at `frame` are free.
    pub fn is_free(&self, frame: usize, order: usize) -> bool {
        let child = frame / CHILD_FRAMES;
        match order {
            HUGE_ORDER => self.child(child) == Child::FREE,
            10 => self.pair(child).load() == [Child::FREE; 2],
            GIANT_ORDER => (child..child + GIANT_CHILDREN).all(|c| self.child(c) == Child::FREE),
            _ => {
                self.child(child).flags() == 0
                    && self.fields[child].is_zero(frame % CHILD_FRAMES, order)
            }
        }
    }

    /// Whether the `1 << order` frames at `frame` are allocated as exactly one frame of this
    /// order (for base orders: whether all their bits are set; runs do not record their order).
    pub fn is_allocated(&self, frame: usize, order: usize) -> bool {
        let child = frame / CHILD_FRAMES;
        match order {
            HUGE_ORDER => self.child(child) == HUGE_CHILD,
            10 => self.pair(child).load() == [PAIR_CHILD; 2],
            GIANT_ORDER => (child..child + GIANT_CHILDREN).all(|c| self.child(c) == GIANT_CHILD),
            _ => {
                self.child(child).flags() == 0
                    && self.fields[child].is_full(frame % CHILD_FRAMES, order)
            }
        }
    }

    /// Free frames of the children of `tree`.
    pub fn tree_free(&self, tree: usize) -> usize {
        let first = tree * TREE_CHILDREN;
        (first..(first + TREE_CHILDREN).min(self.children()))
            .map(|c| self.child(c).free())
            .sum()
    }

    #[inline]
    fn persist_field(&self, child: usize) {
        if self.flush {
            persist((&self.fields[child] as *const Bitfield).cast());
        }
    }

    #[inline]
    fn persist_pair(&self, child: usize) {
        if self.flush {
            persist((self.pair(child) as *const ChildPair).cast());
        }
    }

    fn persist_range(&self, pairs: std::ops::Range<usize>) {
        if self.flush {
            for p in (pairs.start & !15..pairs.end).step_by(16) {
                persist((&self.pairs[p] as *const ChildPair).cast());
            }
        }
    }
}

#[cfg(test)]
mod tests;
