//! The [`FrameAllocator`] adapter of [`llfree::LLFree`].

use crate::frame_alloc::{AllocError, FrameAllocator};
use llfree::{Config, CoreId, FrameId, InitError, LLFree, Order, GIANT_ORDER, MAX_ORDER};

/// LLFree with volatile metadata, driven through the harness.
#[derive(Debug)]
pub struct LLFreeAlloc {
    llfree: LLFree,
}

impl LLFreeAlloc {
    /// Creates a volatile LLFree with the default configuration for `cores` cores and `frames`
    /// free frames.
    pub fn new(cores: usize, frames: usize) -> Result<Self, InitError> {
        Ok(Self {
            llfree: LLFree::new(Config::new(cores, frames))?,
        })
    }

    /// The wrapped allocator.
    pub fn llfree(&self) -> &LLFree {
        &self.llfree
    }
}

impl FrameAllocator for LLFreeAlloc {
    fn name(&self) -> &'static str {
        "llfree"
    }

    fn supports_order(&self, order: usize) -> bool {
        order <= MAX_ORDER || order == GIANT_ORDER
    }

    #[inline]
    fn get(&self, core: usize, order: usize) -> Result<usize, AllocError> {
        let frame = self.llfree.get(CoreId(core), Order(order))?;
        Ok(frame.0)
    }

    #[inline]
    fn put(&self, core: usize, frame: usize, order: usize) -> Result<(), AllocError> {
        self.llfree
            .put(CoreId(core), FrameId(frame), Order(order))
            .map_err(AllocError::from)
    }

    fn drain(&self, core: usize) {
        self.llfree.drain(CoreId(core));
    }

    fn free_frames(&self) -> usize {
        self.llfree.free_frames()
    }

    fn frames(&self) -> usize {
        self.llfree.frames()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{exhausts_exactly, rejects_bad_puts, stress};

    #[test]
    fn errors_are_translated() {
        let alloc = LLFreeAlloc::new(1, 1 << 14).unwrap();
        rejects_bad_puts(&alloc);
        let frame = alloc.get(0, 3).unwrap();
        assert!(matches!(
            alloc.put(0, frame + 1, 3),
            Err(AllocError::Frame(llfree::Error::Misaligned { .. }))
        ));
        alloc.put(0, frame, 3).unwrap();
        assert!(alloc.supports_order(GIANT_ORDER) && !alloc.supports_order(11));
        assert!(LLFreeAlloc::new(1, 100).is_err());
    }

    #[test]
    fn exhausts_exactly_on_one_core() {
        exhausts_exactly(&LLFreeAlloc::new(1, 1 << 14).unwrap());
    }

    #[test]
    fn stress_all_orders() {
        let alloc = LLFreeAlloc::new(4, 1 << 16).unwrap();
        stress(&alloc, 4, &[0, 0, 0, 1, 2, 5, 9, 10], 20_000);
        assert_eq!(alloc.llfree().free_huge(), 128);
    }
}
