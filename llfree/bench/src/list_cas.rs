//! ListCAS (paper §5.4): one global lock-free LIFO free list (a Treiber stack). The head packs
//! the first frame (low 32 bits) with a tag (high 32 bits) that every successful update
//! increments, so that a stale compare-and-swap cannot succeed after the head was popped and
//! pushed again (ABA). Order 0 only.

use crate::frame_alloc::{AllocError, FrameAllocator};
use crate::frame_links::{order_zero_only, FrameLinks, NIL};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

#[derive(Debug)]
#[repr(align(64))]
struct TaggedHead(AtomicU64);

/// A lock-free global free list of frames.
#[derive(Debug)]
pub struct ListCas {
    head: TaggedHead,
    links: FrameLinks,
}

fn pack(tag: u64, frame: u32) -> u64 {
    (tag << 32) | u64::from(frame)
}

impl ListCas {
    /// Creates a zone of `frames` free frames.
    pub fn new(frames: usize) -> Result<Self, AllocError> {
        Ok(Self {
            links: FrameLinks::new(frames, 1)?,
            head: TaggedHead(AtomicU64::new(pack(0, 0))),
        })
    }
}

impl FrameAllocator for ListCas {
    fn name(&self) -> &'static str {
        "list-cas"
    }

    fn supports_order(&self, order: usize) -> bool {
        order == 0
    }

    fn get(&self, _core: usize, order: usize) -> Result<usize, AllocError> {
        order_zero_only(order)?;
        let mut head = self.head.0.load(Acquire);
        loop {
            let frame = head as u32;
            if frame == NIL {
                return Err(AllocError::Frame(llfree::Error::Memory { order }));
            }
            // A stale `next` (the frame was popped meanwhile) is harmless: the tag changed, so
            // the compare-and-swap fails.
            let next = pack((head >> 32).wrapping_add(1), self.links.next(frame));
            match self
                .head
                .0
                .compare_exchange_weak(head, next, Acquire, Acquire)
            {
                Ok(_) => {
                    self.links.mark_allocated(frame);
                    return Ok(frame as usize);
                }
                Err(current) => head = current,
            }
        }
    }

    fn put(&self, _core: usize, frame: usize, order: usize) -> Result<(), AllocError> {
        order_zero_only(order)?;
        let frame = self.links.mark_free(frame)?;
        let mut head = self.head.0.load(Relaxed);
        loop {
            self.links.set_next(frame, head as u32);
            let new = pack((head >> 32).wrapping_add(1), frame);
            match self
                .head
                .0
                .compare_exchange_weak(head, new, Release, Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(current) => head = current,
            }
        }
    }

    fn drain(&self, _core: usize) {}

    /// A linear scan over the links: for statistics only.
    fn free_frames(&self) -> usize {
        self.links.len() - self.links.allocated()
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
    fn lifo_order_and_tags() {
        let alloc = ListCas::new(16).unwrap();
        assert_eq!(alloc.get(0, 0), Ok(0));
        alloc.put(0, 0, 0).unwrap();
        assert_eq!(alloc.head.0.load(Relaxed), pack(2, 0));
        assert_eq!(
            alloc.get(0, 2),
            Err(AllocError::Frame(llfree::Error::InvalidOrder(2)))
        );
        rejects_bad_puts(&alloc);
        exhausts_exactly(&alloc);
    }

    #[test]
    fn stress_threads() {
        stress(&ListCas::new(4096).unwrap(), 4, &[0], 100_000);
    }

    #[test]
    fn stress_tiny_zone_for_aba() {
        stress(&ListCas::new(8).unwrap(), 4, &[0], 200_000);
    }
}
