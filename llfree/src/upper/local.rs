//! Per-core data: the reserved tree, its local free counter, the last-allocated hint and the
//! in-reservation flag, packed into one 64-bit word; plus the reserve-on-free history.
//!
//! Several threads may share one core id: every change is a compare-and-swap on the word. The
//! in-reservation flag serialises the slow paths (sync, reservation, draining) of one core without
//! blocking its fast path: allocations and frees go on while a reservation is being searched.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{CHILD_FRAMES, TREE_FRAMES};

/// Bits of the hint (a frame number).
const HINT_MASK: u64 = (1 << 40) - 1;
/// Position of the local free counter.
const FREE_SHIFT: u32 = 40;
/// Mask of the local free counter (after shifting).
const FREE_MASK: u64 = 0x7fff;
/// A tree is reserved.
const PRESENT: u64 = 1 << 62;
/// A thread runs a slow path (sync, reservation or drain) for this core.
const RESERVING: u64 = 1 << 63;

/// The frame `frames` frames after `frame`, wrapping around inside its tree: the hint after a
/// whole-child allocation at `frame`.
#[inline]
pub fn after(frame: usize, frames: usize) -> usize {
    frame - frame % TREE_FRAMES + (frame % TREE_FRAMES + frames) % TREE_FRAMES
}

/// A snapshot of the per-core word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalState(u64);

impl LocalState {
    /// A reservation of `tree` with `free` frames and the hint `hint` (inside the tree).
    fn reserved(hint: usize, free: usize) -> Self {
        LocalState(PRESENT | (free as u64) << FREE_SHIFT | hint as u64)
    }
    /// Whether a tree is reserved.
    #[inline]
    pub fn present(self) -> bool {
        self.0 & PRESENT != 0
    }
    /// The last allocated frame (or the start of the reserved tree).
    #[inline]
    pub fn hint(self) -> usize {
        (self.0 & HINT_MASK) as usize
    }
    /// The reserved tree.
    #[inline]
    pub fn tree(self) -> usize {
        self.hint() / TREE_FRAMES
    }
    /// Free frames counted locally.
    #[inline]
    pub fn free(self) -> usize {
        ((self.0 >> FREE_SHIFT) & FREE_MASK) as usize
    }
    #[inline]
    fn with_free(self, free: usize) -> Self {
        LocalState(self.0 & !(FREE_MASK << FREE_SHIFT) | (free as u64) << FREE_SHIFT)
    }
    /// Whether `tree` is the reserved tree.
    #[inline]
    pub fn owns(self, tree: usize) -> bool {
        self.present() && self.tree() == tree
    }
}

/// The data of one core, on its own pair of cache lines (128 bytes, so that the adjacent-line
/// prefetcher does not make neighbours share; aligned to one line, as the metadata region is).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Local {
    state: AtomicU64,
    /// Reserve-on-free history: tree << 16 | consecutive frees into it.
    frees: AtomicU64,
    /// The frames this core's cache holds (tree << 32 | frames; see
    /// [`crate::CoreCache`]): in a region shared by processes, what recovery gives back to
    /// their tree when the cache's owner died. Zero in regions made before it existed.
    cached: AtomicU64,
    /// Fills the pair of lines.
    _padding: [u64; 13],
}

impl Local {
    #[inline]
    fn update(
        &self,
        f: impl FnMut(LocalState) -> Option<LocalState>,
    ) -> Result<LocalState, LocalState> {
        let mut f = f;
        stop!();
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                f(LocalState(v)).map(|s| s.0)
            })
            .map(LocalState)
            .map_err(LocalState)
    }

    /// The current state.
    #[inline]
    pub fn load(&self) -> LocalState {
        LocalState(self.state.load(Ordering::Acquire))
    }

    /// Fast path: takes `frames` from the local counter. Returns the state before.
    ///
    /// Whole children (huge and order-10 frames) also move the hint past the frame, in the same
    /// atomic update, so that the next one is looked for where this one ends: the lower level
    /// finds a run of them one child entry each.
    #[inline]
    pub fn take(&self, frames: usize) -> Option<LocalState> {
        self.update(|s| {
            (s.present() && s.free() >= frames).then(|| {
                let taken = s.with_free(s.free() - frames);
                if frames < CHILD_FRAMES {
                    return taken;
                }
                LocalState(taken.0 & !HINT_MASK | after(s.hint(), frames) as u64)
            })
        })
        .ok()
    }

    /// Takes at least `frames` and at most `batch.max(frames)` frames from the local counter, as
    /// many as it has, for a [`crate::CoreCache`]. Returns the state before and the frames taken.
    #[inline]
    pub fn take_batch(&self, frames: usize, batch: usize) -> Option<(LocalState, usize)> {
        let want = batch.max(frames);
        self.update(|s| {
            (s.present() && s.free() >= frames).then(|| s.with_free(s.free() - s.free().min(want)))
        })
        .ok()
        .map(|s| (s, s.free().min(want)))
    }

    /// Whether `tree` is reserved here (one plain load).
    #[inline]
    pub fn owns(&self, tree: usize) -> bool {
        self.load().owns(tree)
    }

    /// Adds `frames` to the local counter if `tree` is reserved here.
    #[inline]
    pub fn give(&self, tree: usize, frames: usize) -> bool {
        self.update(|s| s.owns(tree).then(|| s.with_free(s.free() + frames)))
            .is_ok()
    }

    /// Moves the hint to `frame` if its tree is still reserved here.
    #[inline]
    pub fn set_hint(&self, frame: usize) {
        let tree = frame / TREE_FRAMES;
        let _ = self.update(|s| {
            s.owns(tree)
                .then_some(LocalState(s.0 & !HINT_MASK | frame as u64))
        });
    }

    /// Starts a slow path. Fails if another thread of this core runs one.
    pub fn begin_slow_path(&self) -> Option<LocalState> {
        self.update(|s| (s.0 & RESERVING == 0).then_some(LocalState(s.0 | RESERVING)))
            .ok()
    }

    /// Ends a slow path without changing the reservation.
    pub fn end_slow_path(&self) {
        self.state.fetch_and(!RESERVING, Ordering::AcqRel);
    }

    /// Installs a new reservation (ending the slow path); returns the previous state.
    pub fn install(&self, hint: usize, free: usize) -> LocalState {
        stop!();
        LocalState(
            self.state
                .swap(LocalState::reserved(hint, free).0, Ordering::AcqRel),
        )
    }

    /// Removes the reservation (ending the slow path); returns the previous state.
    pub fn uninstall(&self) -> LocalState {
        stop!();
        LocalState(self.state.swap(0, Ordering::AcqRel))
    }

    /// Records a free into a tree this core has not reserved. Returns how many consecutive frees
    /// went to `tree`.
    pub fn count_free(&self, tree: usize) -> usize {
        let last = self.frees.load(Ordering::Relaxed);
        let count = if (last >> 16) as usize == tree {
            (last & 0xffff) + 1
        } else {
            1
        };
        self.frees
            .store((tree as u64) << 16 | count.min(0xffff), Ordering::Relaxed);
        count as usize
    }

    /// Empties the slot: no reservation, no free history.
    pub fn reset(&self) {
        self.state.store(0, Ordering::Release);
        self.cached.store(0, Ordering::Release);
        self.reset_frees();
    }

    /// Records that this core's cache holds `frames` frames of `tree` (a plain store: only the
    /// cache's thread writes it).
    #[inline]
    pub fn set_cached(&self, tree: usize, frames: usize) {
        let word = if frames == 0 {
            0
        } else {
            (tree as u64) << 32 | frames as u64
        };
        self.cached.store(word, Ordering::Release);
    }

    /// The tree and the frames this core's cache holds, if any.
    pub fn cached(&self) -> Option<(usize, usize)> {
        let word = self.cached.load(Ordering::Acquire);
        (word != 0).then(|| ((word >> 32) as usize, (word & u64::from(u32::MAX)) as usize))
    }

    /// Forgets the reserve-on-free history.
    pub fn reset_frees(&self) {
        self.frees.store(u64::MAX, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_path_counts_down() {
        let local = Local::default();
        assert_eq!(local.take(1), None);
        assert!(local.begin_slow_path().is_some());
        assert!(local.begin_slow_path().is_none());
        let old = local.install(3 * TREE_FRAMES, 10);
        assert!(!old.present());
        assert_eq!(local.take(4).unwrap().free(), 10);
        assert_eq!(local.take(7), None);
        assert!(local.give(3, 2));
        assert!(!local.give(2, 2));
        assert_eq!(local.load().free(), 8);
        local.set_hint(3 * TREE_FRAMES + 700);
        assert_eq!(local.load().hint(), 3 * TREE_FRAMES + 700);
        local.set_hint(5);
        assert_eq!(local.load().tree(), 3);
        assert!(local.begin_slow_path().is_some());
        let old = local.uninstall();
        assert_eq!((old.tree(), old.free()), (3, 8));
        assert!(!local.load().present());
    }

    #[test]
    fn counts_consecutive_frees() {
        let local = Local::default();
        local.reset_frees();
        assert_eq!(local.count_free(7), 1);
        assert_eq!(local.count_free(7), 2);
        assert_eq!(local.count_free(8), 1);
        assert_eq!(local.count_free(7), 1);
    }
}
