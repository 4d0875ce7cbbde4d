//! Child entries: the 16-bit state of one 2 MiB child.
//!
//! Bits 0..=9 count the free 4 KiB frames (0..=512). [`HUGE`] marks a child allocated as one
//! 2 MiB frame, [`PAIR`] additionally marks the two children of an order-10 frame, and [`GIANT`]
//! marks the children of a 1 GiB frame. Two neighbouring children share one `AtomicU32`, so an
//! order-10 frame is one 32-bit compare-and-swap; 16 pairs (one tree) fill one cache line.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::CHILD_FRAMES;

/// Mask of the free counter.
const FREE_MASK: u16 = 0x3ff;
/// The child is allocated as a huge frame (order 9 or 10).
pub const HUGE: u16 = 1 << 12;
/// The child is half of an order-10 frame.
pub const PAIR: u16 = 1 << 13;
/// The child belongs to a giant (order 18) frame; the first child of the frame commits it.
pub const GIANT: u16 = 1 << 14;
/// All flag bits.
const FLAGS: u16 = HUGE | PAIR | GIANT;

/// The decoded state of one child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Child(u16);

impl Child {
    /// An entirely free child.
    pub const FREE: Child = Child(CHILD_FRAMES as u16);
    /// A child that does not exist (padding at the end of the zone).
    pub const ABSENT: Child = Child(0);

    /// A child with `free` free frames and the given flags.
    #[inline]
    pub const fn new(free: usize, flags: u16) -> Self {
        Child(free as u16 | flags)
    }
    /// Free frames.
    #[inline]
    pub const fn free(self) -> usize {
        (self.0 & FREE_MASK) as usize
    }
    /// Flag bits.
    #[inline]
    pub const fn flags(self) -> u16 {
        self.0 & FLAGS
    }
    /// Whether any bit outside the counter and the flags is set, or the counter is too large.
    pub const fn is_malformed(self) -> bool {
        self.0 & !(FREE_MASK | FLAGS) != 0 || self.free() > CHILD_FRAMES
    }
}

/// Two neighbouring children in one atomic word: the even child in the low half.
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct ChildPair(AtomicU32);

/// Decodes both halves of a pair word.
#[inline]
const fn split(word: u32) -> [Child; 2] {
    [Child(word as u16), Child((word >> 16) as u16)]
}

/// Encodes both halves of a pair word.
#[inline]
const fn join(pair: [Child; 2]) -> u32 {
    pair[0].0 as u32 | (pair[1].0 as u32) << 16
}

impl ChildPair {
    /// Reads both children.
    #[inline]
    pub fn load(&self) -> [Child; 2] {
        split(self.0.load(Ordering::Acquire))
    }

    /// Writes both children (initialisation and recovery only).
    pub fn store(&self, pair: [Child; 2]) {
        self.0.store(join(pair), Ordering::Release);
    }

    /// Atomically replaces child `half` (0 or 1) by `f(child)` while `f` returns `Some`.
    /// Returns the previous value, or the value that made `f` refuse.
    ///
    /// Each half has its own code with a constant shift and mask: indexing a `[Child; 2]` at
    /// run time went through the stack, and the reload before the `lock cmpxchg` could not be
    /// forwarded from the stores.
    #[inline]
    pub fn update(
        &self,
        half: usize,
        f: impl FnMut(Child) -> Option<Child>,
    ) -> Result<Child, Child> {
        if half & 1 == 0 {
            self.update_half::<0>(f)
        } else {
            self.update_half::<16>(f)
        }
    }

    /// [`Self::update`] of the child in bits `SHIFT..SHIFT + 16`.
    #[inline]
    fn update_half<const SHIFT: u32>(
        &self,
        mut f: impl FnMut(Child) -> Option<Child>,
    ) -> Result<Child, Child> {
        stop!();
        let child = |word: u32| Child((word >> SHIFT) as u16);
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let new = f(child(word))?;
                Some(word & !(0xffff << SHIFT) | u32::from(new.0) << SHIFT)
            })
            .map(child)
            .map_err(child)
    }

    /// Atomically replaces both children if they equal `current`.
    pub fn exchange(&self, current: [Child; 2], new: [Child; 2]) -> Result<(), [Child; 2]> {
        stop!();
        self.0
            .compare_exchange(
                join(current),
                join(new),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| ())
            .map_err(split)
    }

    /// Reserves `frames` base frames of child `half` for an allocation (decrements the counter).
    /// Returns the free frames before.
    #[inline]
    pub fn take(&self, half: usize, frames: usize) -> Option<usize> {
        self.update(half, |c| {
            (c.flags() == 0 && c.free() >= frames).then(|| Child::new(c.free() - frames, 0))
        })
        .ok()
        .map(Child::free)
    }

    /// Returns `frames` base frames to child `half` (increments the counter).
    ///
    /// A plain atomic add: the caller gives back frames it took or whose bits it just cleared,
    /// so the counter stays at most 512 and the flags (zero while base frames are allocated)
    /// are not touched.
    #[inline]
    pub fn give(&self, half: usize, frames: usize) {
        stop!();
        let old = self
            .0
            .fetch_add((frames as u32) << (16 * half), Ordering::AcqRel);
        debug_assert!(
            split(old)[half].flags() == 0 && split(old)[half].free() + frames <= CHILD_FRAMES,
            "child counter overflow: {old:#x}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counter_and_flags() {
        let c = Child::new(300, HUGE | PAIR);
        assert_eq!(c.free(), 300);
        assert_eq!(c.flags(), HUGE | PAIR);
        assert!(!c.is_malformed());
        assert!(Child(0x3ff).is_malformed());
        assert!(Child(1 << 15).is_malformed());
    }

    #[test]
    fn halves_are_independent() {
        let pair = ChildPair::default();
        pair.store([Child::FREE, Child::FREE]);
        assert_eq!(pair.take(1, 10), Some(512));
        assert_eq!(pair.load(), [Child::FREE, Child::new(502, 0)]);
        assert_eq!(pair.take(1, 503), None);
        pair.give(1, 10);
        assert_eq!(pair.load(), [Child::FREE; 2]);
    }

    #[test]
    fn take_refuses_huge_children() {
        let pair = ChildPair::default();
        pair.store([Child::new(0, HUGE), Child::FREE]);
        assert_eq!(pair.take(0, 1), None);
        assert!(pair
            .exchange([Child::FREE; 2], [Child::new(0, HUGE | PAIR); 2])
            .is_err());
    }
}
