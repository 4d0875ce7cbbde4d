//! ListLocked (paper §5.4): one global LIFO free list protected by a spin lock, as in Windows and
//! Darwin. Order 0 only.

use crate::frame_alloc::{AllocError, FrameAllocator};
use crate::frame_links::{order_zero_only, FrameLinks, NIL};
use crate::spin::SpinLock;

#[derive(Debug)]
struct ListHead {
    head: u32,
    len: usize,
}

/// A spin-locked global free list of frames.
#[derive(Debug)]
pub struct ListLocked {
    list: SpinLock<ListHead>,
    links: FrameLinks,
}

impl ListLocked {
    /// Creates a zone of `frames` free frames.
    pub fn new(frames: usize) -> Result<Self, AllocError> {
        Ok(Self {
            links: FrameLinks::new(frames, 1)?,
            list: SpinLock::new(ListHead {
                head: 0,
                len: frames,
            }),
        })
    }
}

impl FrameAllocator for ListLocked {
    fn name(&self) -> &'static str {
        "list-locked"
    }

    fn supports_order(&self, order: usize) -> bool {
        order == 0
    }

    fn get(&self, _core: usize, order: usize) -> Result<usize, AllocError> {
        order_zero_only(order)?;
        let frame = {
            let mut list = self.list.lock();
            let frame = list.head;
            if frame == NIL {
                return Err(AllocError::Frame(llfree::Error::Memory { order }));
            }
            list.head = self.links.next(frame);
            list.len -= 1;
            frame
        };
        self.links.mark_allocated(frame);
        Ok(frame as usize)
    }

    fn put(&self, _core: usize, frame: usize, order: usize) -> Result<(), AllocError> {
        order_zero_only(order)?;
        let frame = self.links.mark_free(frame)?;
        let mut list = self.list.lock();
        self.links.set_next(frame, list.head);
        list.head = frame;
        list.len += 1;
        Ok(())
    }

    fn drain(&self, _core: usize) {}

    fn free_frames(&self) -> usize {
        self.list.lock().len
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
    fn lifo_order_and_errors() {
        let alloc = ListLocked::new(16).unwrap();
        assert_eq!(alloc.get(0, 0), Ok(0));
        assert_eq!(alloc.get(0, 0), Ok(1));
        alloc.put(0, 0, 0).unwrap();
        assert_eq!(alloc.get(1, 0), Ok(0));
        assert_eq!(
            alloc.get(0, 1),
            Err(AllocError::Frame(llfree::Error::InvalidOrder(1)))
        );
        alloc.put(0, 0, 0).unwrap();
        alloc.put(0, 1, 0).unwrap();
        rejects_bad_puts(&alloc);
        exhausts_exactly(&alloc);
    }

    #[test]
    fn stress_threads() {
        stress(&ListLocked::new(4096).unwrap(), 4, &[0], 50_000);
    }
}
