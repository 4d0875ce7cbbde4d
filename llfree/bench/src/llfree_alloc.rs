//! The [`FrameAllocator`] adapters of [`llfree::LLFree`].
//!
//! [`LLFreeAlloc::new`] (`llfree`): the thread that first uses a core id claims it (module
//! `core_claim`) and allocates through the core's [`CoreCache`]; other threads on that core id
//! use the shared per-core path. [`FrameAllocator::drain`] gives the caller's cache and claim
//! back. [`LLFreeAlloc::shared`] (`llfree-shared`): every thread calls the shared
//! [`LLFree::get`] and [`LLFree::put`]. [`LLFreeAlloc::vm_path`] (`llfree-vm`): gets and puts
//! through the core's cache, every put included, as guest memory takes them (a fault handler
//! thread populates a vCPU's chunks through its cache of the vCPU's core; a device's thread
//! frees frames through its cache of the device's core, one tree at a time).

use crate::core_claim::Claimed;
use crate::frame_alloc::{AllocError, FrameAllocator};
use llfree::{
    Config, CoreCache, CoreId, FrameId, InitError, LLFree, Order, GIANT_ORDER, MAX_ORDER,
};

/// LLFree with volatile metadata, driven through the harness.
#[derive(Debug)]
pub struct LLFreeAlloc {
    llfree: LLFree,
    caches: Claimed<CoreCache>,
    path: Path,
}

/// Which of LLFree's calls the threads make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Gets and puts through the core's cache ([`LLFreeAlloc::new`]).
    Cached,
    /// The shared `get` and `put` ([`LLFreeAlloc::shared`]).
    Shared,
    /// Gets and every put through the cache ([`LLFreeAlloc::vm_path`]).
    Vm,
}

impl LLFreeAlloc {
    /// Creates a volatile LLFree with the default configuration for `cores` cores and `frames`
    /// free frames.
    pub fn new(cores: usize, frames: usize) -> Result<Self, InitError> {
        let llfree = LLFree::new(Config::new(cores, frames))?;
        let caches = Claimed::new((0..cores).map(|core| llfree.core_cache(CoreId(core))));
        Ok(Self {
            llfree,
            caches,
            path: Path::Cached,
        })
    }

    /// Creates a volatile LLFree as [`LLFreeAlloc::new`] does, whose threads all take the
    /// shared `get` and `put` (no core caches).
    pub fn shared(cores: usize, frames: usize) -> Result<Self, InitError> {
        let mut alloc = Self::new(cores, frames)?;
        alloc.path = Path::Shared;
        Ok(alloc)
    }

    /// Creates a volatile LLFree as [`LLFreeAlloc::new`] does, whose threads get and put
    /// through their core's cache whatever a frame's tree, as guest memory does.
    pub fn vm_path(cores: usize, frames: usize) -> Result<Self, InitError> {
        let mut alloc = Self::new(cores, frames)?;
        alloc.path = Path::Vm;
        Ok(alloc)
    }

    /// The wrapped allocator.
    pub fn llfree(&self) -> &LLFree {
        &self.llfree
    }

    /// A get through the caller's cache of `core` where it holds the core's claim, else the
    /// shared path.
    #[inline(never)]
    fn get_through_cache(&self, core: usize, order: usize) -> Result<usize, AllocError> {
        let cached = self
            .caches
            .with(core, |cache| self.llfree.get_cached(cache, Order(order)));
        let frame = cached.unwrap_or_else(|| self.llfree.get(CoreId(core), Order(order)))?;
        Ok(frame.0)
    }
}

impl FrameAllocator for LLFreeAlloc {
    fn name(&self) -> &'static str {
        match self.path {
            Path::Cached => "llfree",
            Path::Shared => "llfree-shared",
            Path::Vm => "llfree-vm",
        }
    }

    fn supports_order(&self, order: usize) -> bool {
        order <= MAX_ORDER || order == GIANT_ORDER
    }

    #[inline]
    fn get(&self, core: usize, order: usize) -> Result<usize, AllocError> {
        // The shared path calls LLFree alone.
        if self.path == Path::Shared {
            return Ok(self.llfree.get(CoreId(core), Order(order))?.0);
        }
        self.get_through_cache(core, order)
    }

    #[inline]
    fn put(&self, core: usize, frame: usize, order: usize) -> Result<(), AllocError> {
        let (frame, order) = (FrameId(frame), Order(order));
        // The cached path keeps only frames of the core's reserved tree (the others skip the
        // claim and reserve trees on free); guest memory's path keeps every frame.
        let through_cache = match self.path {
            Path::Cached => self.llfree.reserves(CoreId(core), frame),
            Path::Vm => true,
            Path::Shared => false,
        };
        if through_cache {
            let put = |cache: &mut CoreCache| self.llfree.put_cached(cache, frame, order);
            match self.caches.with(core, put) {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => return Err(e.into()),
                None => {}
            }
        }
        self.llfree
            .put(CoreId(core), frame, order)
            .map_err(AllocError::from)
    }

    /// Gives back the caller's cache of `core` and its claim, then the core's reservation.
    fn drain(&self, core: usize) {
        self.leave(core);
        self.llfree.drain(CoreId(core));
    }

    /// Gives back the caller's cache of `core` and its claim.
    fn leave(&self, core: usize) {
        self.caches
            .release(core, |cache| self.llfree.release_cache(cache));
    }

    /// The allocator's free frames and those the caches hold (counted once where a get
    /// borrowed them from a cache).
    fn free_frames(&self) -> usize {
        self.llfree.available_frames()
    }

    fn frames(&self) -> usize {
        self.llfree.frames()
    }
}

impl Drop for LLFreeAlloc {
    /// Gives back what caches still hold (of threads that did not drain).
    fn drop(&mut self) {
        for cache in self.caches.values_mut() {
            self.llfree.release_cache(cache);
        }
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

    #[test]
    fn the_vm_path_gets_and_puts_through_caches() {
        let alloc = LLFreeAlloc::vm_path(2, 1 << 16).unwrap();
        assert_eq!(alloc.name(), "llfree-vm");
        exhausts_exactly(&alloc);
        let frames: Vec<usize> = (0..100).map(|_| alloc.get(0, 0).unwrap()).collect();
        assert!(
            alloc.llfree().cached_frames() > 0,
            "gets fill the core's cache"
        );
        let cached = alloc.llfree().cached_frames();
        for frame in frames {
            alloc.put(0, frame, 0).unwrap();
        }
        // The puts went to the cache.
        assert_eq!(alloc.llfree().cached_frames(), cached + 100);
        // Threads on the same cores beside this thread's cache, which they borrow from.
        stress(&alloc, 2, &[0, 0, 1, 9], 20_000);
        alloc.drain(0);
        assert_eq!(alloc.llfree().free_frames(), alloc.frames());
        alloc.llfree().validate().unwrap();
    }

    #[test]
    fn the_shared_adapter_never_fills_a_cache() {
        let alloc = LLFreeAlloc::shared(2, 1 << 16).unwrap();
        assert_eq!(alloc.name(), "llfree-shared");
        exhausts_exactly(&alloc);
        let frames: Vec<usize> = (0..100).map(|_| alloc.get(0, 0).unwrap()).collect();
        for frame in frames {
            alloc.put(0, frame, 0).unwrap();
        }
        // Nothing sits in a cache: every free frame is the allocator's own.
        assert_eq!(alloc.llfree().free_frames(), alloc.frames());
        assert_eq!(alloc.free_frames(), alloc.frames());
        stress(&alloc, 2, &[0, 0, 1, 9], 20_000);
        assert_eq!(alloc.llfree().free_frames(), alloc.frames());
    }
}
