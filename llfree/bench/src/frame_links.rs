//! The per-frame link array of the list-based allocators: one 64-byte entry per frame holding the
//! next pointer and an allocated flag, like Linux's `struct page` array (paper §5.4).

use crate::frame_alloc::{check_frame, AllocError};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

/// Marks the end of a list.
pub const NIL: u32 = u32::MAX;

#[repr(align(64))]
#[derive(Default)]
struct FrameLink {
    next: AtomicU32,
    allocated: AtomicBool,
}

/// The link array of a zone.
pub struct FrameLinks {
    links: Box<[FrameLink]>,
}

impl std::fmt::Debug for FrameLinks {
    /// The counts, not the links (one per frame).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameLinks")
            .field("frames", &self.len())
            .field("allocated", &self.allocated())
            .finish()
    }
}

impl FrameLinks {
    /// Creates the links of `frames` free frames split into `lists` runs of [`share`]; each run is
    /// chained in ascending order and ends in [`NIL`].
    pub fn new(frames: usize, lists: usize) -> Result<Self, AllocError> {
        if frames == 0 || frames >= NIL as usize {
            return Err(AllocError::Zone {
                frames,
                reason: "list allocators manage 1 to 2^32 - 2 frames",
            });
        }
        let links: Box<[FrameLink]> = (0..frames).map(|_| FrameLink::default()).collect();
        for range in (0..lists).map(|list| share(frames, lists, list)) {
            for frame in range.clone() {
                let next = if frame + 1 < range.end {
                    frame as u32 + 1
                } else {
                    NIL
                };
                links[frame].next.store(next, Relaxed);
            }
        }
        Ok(Self { links })
    }

    /// The number of frames.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// The frame after `frame` in its list.
    #[inline]
    pub fn next(&self, frame: u32) -> u32 {
        self.links[frame as usize].next.load(Relaxed)
    }

    /// Links `frame` in front of `next`.
    #[inline]
    pub fn set_next(&self, frame: u32, next: u32) {
        self.links[frame as usize].next.store(next, Relaxed);
    }

    /// Records that `frame`, just taken from a list, is allocated.
    #[inline]
    pub fn mark_allocated(&self, frame: u32) {
        self.links[frame as usize].allocated.store(true, Relaxed);
    }

    /// Checks that `frame` is a valid, allocated order-0 frame and marks it free.
    #[inline]
    pub fn mark_free(&self, frame: usize) -> Result<u32, AllocError> {
        check_frame(frame, 0, self.links.len())?;
        if self.links[frame].allocated.swap(false, Relaxed) {
            Ok(frame as u32)
        } else {
            Err(AllocError::Frame(llfree::Error::NotAllocated {
                frame,
                order: 0,
            }))
        }
    }

    /// Counts the allocated frames (a linear scan; for statistics only).
    pub fn allocated(&self) -> usize {
        self.links
            .iter()
            .filter(|link| link.allocated.load(Relaxed))
            .count()
    }
}

/// The frames of list `list` when `frames` frames are split evenly between `lists` lists.
pub fn share(frames: usize, lists: usize, list: usize) -> std::ops::Range<usize> {
    list * frames / lists..(list + 1) * frames / lists
}

/// The error of the list allocators for orders other than 0.
pub fn order_zero_only(order: usize) -> Result<(), AllocError> {
    match order {
        0 => Ok(()),
        _ => Err(AllocError::Frame(llfree::Error::InvalidOrder(order))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_ranges_and_tracks_allocation() {
        let links = FrameLinks::new(6, 2).unwrap();
        assert_eq!((links.next(0), links.next(2), links.next(5)), (1, NIL, NIL));
        links.mark_allocated(4);
        assert_eq!(links.allocated(), 1);
        assert_eq!(links.mark_free(4), Ok(4));
        assert!(links.mark_free(4).is_err());
        assert!(links.mark_free(6).is_err());
        assert!(FrameLinks::new(0, 1).is_err());
    }
}
