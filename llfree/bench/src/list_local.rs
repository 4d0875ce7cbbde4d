//! ListLocal (paper §5.4): per-core free lists only, the ideal case of a list allocator. Every
//! core starts with an equal share of the zone, frees go to the freeing core's list, and frames
//! never move back: a core whose list is empty is out of memory. Order 0 only.
//!
//! A core's list has no lock. To stay correct when threads share a core id, the first thread that
//! uses a core claims it (one compare-and-swap); other threads get [`AllocError::CoreBusy`] until
//! the owner calls [`FrameAllocator::drain`] for that core, which only releases the claim.

use crate::core_claim::Claim;
use crate::frame_alloc::{AllocError, FrameAllocator};
use crate::frame_links::{order_zero_only, share, FrameLinks, NIL};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};

#[derive(Debug)]
#[repr(align(64))]
struct LocalList {
    owner: Claim,
    head: AtomicU32,
    len: AtomicUsize,
}

/// Per-core free lists without any sharing between cores.
#[derive(Debug)]
pub struct ListLocal {
    lists: Box<[LocalList]>,
    links: FrameLinks,
}

impl ListLocal {
    /// Creates a zone of `frames` free frames split evenly between `cores` lists.
    pub fn new(cores: usize, frames: usize) -> Result<Self, AllocError> {
        if cores == 0 || cores > frames {
            return Err(AllocError::Zone {
                frames,
                reason: "ListLocal needs between 1 and `frames` cores",
            });
        }
        let lists = (0..cores)
            .map(|core| share(frames, cores, core))
            .map(|range| LocalList {
                owner: Claim::default(),
                head: AtomicU32::new(range.start as u32),
                len: AtomicUsize::new(range.len()),
            })
            .collect();
        Ok(Self {
            links: FrameLinks::new(frames, cores)?,
            lists,
        })
    }

    /// The list of `core`, once the calling thread owns it.
    #[inline]
    fn claim(&self, core: usize) -> Result<&LocalList, AllocError> {
        let list = &self.lists[core % self.lists.len()];
        if list.owner.claim() {
            Ok(list)
        } else {
            Err(AllocError::CoreBusy(core))
        }
    }
}

impl FrameAllocator for ListLocal {
    fn name(&self) -> &'static str {
        "list-local"
    }

    fn supports_order(&self, order: usize) -> bool {
        order == 0
    }

    fn get(&self, core: usize, order: usize) -> Result<usize, AllocError> {
        order_zero_only(order)?;
        let list = self.claim(core)?;
        let frame = list.head.load(Relaxed);
        if frame == NIL {
            return Err(AllocError::Frame(llfree::Error::Memory { order }));
        }
        list.head.store(self.links.next(frame), Relaxed);
        list.len.store(list.len.load(Relaxed) - 1, Relaxed);
        self.links.mark_allocated(frame);
        Ok(frame as usize)
    }

    fn put(&self, core: usize, frame: usize, order: usize) -> Result<(), AllocError> {
        order_zero_only(order)?;
        let list = self.claim(core)?;
        let frame = self.links.mark_free(frame)?;
        self.links.set_next(frame, list.head.load(Relaxed));
        list.head.store(frame, Relaxed);
        list.len.store(list.len.load(Relaxed) + 1, Relaxed);
        Ok(())
    }

    /// Releases the calling thread's claim on `core`; the frames stay in the core's list.
    fn drain(&self, core: usize) {
        let list = &self.lists[core % self.lists.len()];
        // Changes nothing when another thread or no thread owns the list.
        list.owner.release();
    }

    fn free_frames(&self) -> usize {
        self.lists.iter().map(|list| list.len.load(Relaxed)).sum()
    }

    fn frames(&self) -> usize {
        self.links.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{exhausts_exactly, rejects_bad_puts, stress};

    #[test]
    fn cores_start_with_equal_shares_and_never_steal() {
        let alloc = ListLocal::new(2, 10).unwrap();
        assert_eq!(alloc.get(1, 0), Ok(5));
        let frames: Vec<_> = (0..4).map(|_| alloc.get(0, 0).unwrap()).collect();
        assert_eq!(frames, vec![0, 1, 2, 3]);
        assert_eq!(alloc.get(0, 0), Ok(4));
        assert_eq!(
            alloc.get(0, 0),
            Err(AllocError::Frame(llfree::Error::Memory { order: 0 }))
        );
        // A free on core 0 lands in core 0's list.
        alloc.put(0, 5, 0).unwrap();
        assert_eq!(alloc.get(0, 0), Ok(5));
        assert!(ListLocal::new(3, 2).is_err());
    }

    #[test]
    fn single_core_errors() {
        let alloc = ListLocal::new(1, 64).unwrap();
        rejects_bad_puts(&alloc);
        exhausts_exactly(&alloc);
    }

    #[test]
    fn a_core_is_owned_by_one_thread_until_drained() {
        let alloc = ListLocal::new(1, 64).unwrap();
        let frame = alloc.get(0, 0).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(alloc.get(0, 0), Err(AllocError::CoreBusy(0))));
        });
        alloc.drain(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                alloc.put(0, frame, 0).unwrap();
                alloc.drain(0);
            });
        });
        assert_eq!(alloc.free_frames(), 64);
    }

    #[test]
    fn stress_threads() {
        stress(&ListLocal::new(4, 4096).unwrap(), 4, &[0], 50_000);
    }
}
