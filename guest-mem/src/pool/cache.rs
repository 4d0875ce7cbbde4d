//! A thread's own cache of one of the pool's cores ([`CoreFrames`]): a fault handler thread
//! populates a vCPU's chunks through it, one locked instruction fewer per frame than the shared
//! path (LLFree's [`CoreCache`]).
//!
//! A core has at most one cache at a time: the pool hands each of its cores' caches to one
//! thread of this process ([`Pool::claim_cache`]); the cores of a zone are this process's own
//! slots, so no other process uses them. What a cache holds is free memory
//! ([`Pool::free_frames`] counts it) that other cores still get once nothing else is left, and
//! the core's slot records it, so that a crash loses none of it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use llfree::{CoreCache, CoreId, FrameId};

use super::{Frame, FrameSize, Pool};

/// Frames of one of the pool's cores that only the thread holding this allocates; they go back
/// when it is dropped.
#[derive(Debug)]
pub struct CoreFrames {
    pool: Arc<Pool>,
    core: usize,
    cache: CoreCache,
}

impl Pool {
    /// Hands the cache of `core` (one of this process's cores) to the calling thread; `None` if
    /// another thread holds it or the core is not this process's.
    pub fn claim_cache(self: &Arc<Self>, core: usize) -> Option<CoreFrames> {
        let claim = self.cache_claims.get(core.checked_sub(self.cores.start)?)?;
        claim
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        Some(CoreFrames {
            pool: Arc::clone(self),
            core,
            cache: self.llfree.core_cache(CoreId(core)),
        })
    }
}

impl CoreFrames {
    /// The core whose frames these are.
    pub fn core(&self) -> usize {
        self.core
    }

    /// Allocates a frame as [`Pool::alloc`] does with this core; `None` when the pool is
    /// exhausted.
    pub fn alloc(&mut self, size: FrameSize) -> Option<Frame> {
        let FrameId(index) = self
            .pool
            .llfree
            .get_cached(&mut self.cache, size.order())
            .ok()?;
        Some(Frame {
            index: index as u64,
            size,
        })
    }
}

impl Drop for CoreFrames {
    fn drop(&mut self) {
        self.pool.llfree.release_cache(&mut self.cache);
        self.pool.cache_claims[self.core - self.pool.cores.start].store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{Backing, PoolConfig};

    #[test]
    fn one_thread_at_a_time_holds_a_core_s_cache_and_its_frames_count_as_free() {
        let mut config = PoolConfig::new(Backing::Anonymous, 256 << 20);
        config.cores = 2;
        let pool = Pool::new(config).expect("pool");
        let mut frames = pool.claim_cache(1).expect("a free core");
        assert!(pool.claim_cache(1).is_none(), "held");
        assert!(pool.claim_cache(2).is_none(), "not a core of the pool");
        // The first get reserves a tree for the core, the second takes a batch of it.
        let taken: Vec<Frame> = (0..2)
            .map(|_| frames.alloc(FrameSize::Huge).expect("frame"))
            .collect();
        assert!(taken.iter().all(|&frame| pool.is_allocated(frame)));
        // The rest of the batch is free memory.
        assert!(pool.allocator().cached_frames() > 0);
        assert_eq!(pool.free_frames(), pool.size() / 4096 - 2 * 512);
        for frame in taken {
            pool.free(frames.core(), frame).expect("free");
        }
        drop(frames);
        assert_eq!(pool.allocator().cached_frames(), 0);
        assert_eq!(pool.free_frames(), pool.size() / 4096);
        pool.allocator().validate().expect("consistent");
        assert!(pool.claim_cache(1).is_some(), "given back");
    }
}
