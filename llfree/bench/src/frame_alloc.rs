//! The interface every benchmarked page-frame allocator implements.

use thiserror::Error;

/// An allocation or free of a benchmarked allocator failed.
///
/// Frame errors are LLFree's own (`Memory`, `InvalidOrder`, `OutOfRange`, `Misaligned`,
/// `NotAllocated`, `WrongOrder`), so every allocator reports them alike.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// The request failed; the same errors as LLFree's.
    #[error(transparent)]
    Frame(#[from] llfree::Error),
    /// Another thread currently uses this core id of an allocator without synchronisation.
    #[error("core {0} is in use by another thread")]
    CoreBusy(usize),
    /// The zone cannot be managed by this allocator.
    #[error("invalid zone of {frames} frames: {reason}")]
    Zone {
        /// Frames requested.
        frames: usize,
        /// Why the zone is rejected.
        reason: &'static str,
    },
}

/// A page-frame allocator driven by the benchmark harness.
///
/// Frames are numbered from 0 in units of 4 KiB; a frame of order `o` is `2^o` frames, aligned to
/// `2^o`. `core` selects per-core state; ids beyond the allocator's cores wrap around.
pub trait FrameAllocator: Sync {
    /// A short name used on the command line and in the CSV output.
    fn name(&self) -> &'static str;

    /// Whether [`get`](Self::get) and [`put`](Self::put) accept `order`.
    fn supports_order(&self, order: usize) -> bool;

    /// Allocates a frame of `order` on `core` and returns its first frame number.
    fn get(&self, core: usize, order: usize) -> Result<usize, AllocError>;

    /// Frees the frame of `order` starting at `frame`, which was allocated with `get`.
    fn put(&self, core: usize, frame: usize, order: usize) -> Result<(), AllocError>;

    /// Returns the core's cached frames or reservation to the global pool, where it has one.
    fn drain(&self, core: usize);

    /// The calling thread stops using `core`: what it keeps for the core on its own (a claim, a
    /// private cache) goes back, while the core's shared state stays. Nothing by default.
    fn leave(&self, _core: usize) {}

    /// The number of free base frames, including those cached per core.
    fn free_frames(&self) -> usize;

    /// The number of base frames in the zone.
    fn frames(&self) -> usize;
}

/// Checks the range and alignment of a frame of `order` in a zone of `frames` frames.
pub fn check_frame(frame: usize, order: usize, frames: usize) -> Result<(), AllocError> {
    if frame & ((1 << order) - 1) != 0 {
        return Err(AllocError::Frame(llfree::Error::Misaligned {
            frame,
            order,
        }));
    }
    match frame.checked_add(1 << order) {
        Some(end) if end <= frames => Ok(()),
        _ => Err(AllocError::Frame(llfree::Error::OutOfRange {
            frame,
            order,
            frames,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_frame_rejects_misaligned_and_out_of_range() {
        assert_eq!(check_frame(512, 9, 1024), Ok(()));
        assert_eq!(
            check_frame(3, 1, 1024),
            Err(AllocError::Frame(llfree::Error::Misaligned {
                frame: 3,
                order: 1
            }))
        );
        assert!(matches!(
            check_frame(1024, 0, 1024),
            Err(AllocError::Frame(llfree::Error::OutOfRange { .. }))
        ));
        assert!(matches!(
            check_frame(usize::MAX & !1, 1, 1024),
            Err(AllocError::Frame(llfree::Error::OutOfRange { .. }))
        ));
    }
}
