//! A thread's frames of one of the pool's cores ([`CoreFrames`]): through the core's cache when
//! the thread could claim it (LLFree's [`CoreCache`]), one locked instruction fewer per frame
//! than the shared path. A fault handler thread populates a vCPU's chunks through the vCPU's
//! core; a device (balloon, virtio-mem) frees and allocates through its own core, so that the
//! frames it gives back go to one tree's counter in one locked instruction per run.
//!
//! A core has at most one cache at a time: the pool hands each of its cores' caches to one
//! thread of this process ([`Pool::core_frames`]); the cores of a zone are this process's own
//! slots, so no other process uses them. What a cache holds is free memory
//! ([`Pool::free_frames`] counts it) that other cores still get once nothing else is left, and
//! the core's slot records it, so that a crash loses none of it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use llfree::{CoreCache, CoreId, FrameId};

use super::{Frame, FrameSize, Pool};

/// One of the pool's cores as one thread uses it: through the core's cache if the thread
/// holds it, else on the shared path beside the holder. The cache's frames go back when it is
/// dropped.
#[derive(Debug)]
pub struct CoreFrames {
    pool: Arc<Pool>,
    core: usize,
    cache: Option<CoreCache>,
}

impl Pool {
    /// `core` for the calling thread: with the core's cache if no other thread holds it and the
    /// core is this process's, else on the shared path.
    pub fn core_frames(self: &Arc<Self>, core: usize) -> CoreFrames {
        let claimed = core
            .checked_sub(self.cores.start)
            .and_then(|slot| self.cache_claims.get(slot))
            .is_some_and(|claim| {
                claim
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            });
        CoreFrames {
            pool: Arc::clone(self),
            core,
            cache: claimed.then(|| self.llfree.core_cache(CoreId(core))),
        }
    }

    /// `core` on the shared path, without its cache (a thread's occasional frame, e.g. a device
    /// access that populates a chunk).
    pub fn shared_core(self: &Arc<Self>, core: usize) -> CoreFrames {
        CoreFrames {
            pool: Arc::clone(self),
            core,
            cache: None,
        }
    }
}

impl CoreFrames {
    /// The core whose frames these are.
    pub fn core(&self) -> usize {
        self.core
    }

    /// Whether these are frames of `pool`.
    pub fn is_of(&self, pool: &Pool) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.pool), pool)
    }

    /// Whether this thread holds the core's cache.
    pub fn is_cached(&self) -> bool {
        self.cache.is_some()
    }

    /// Allocates a frame as [`Pool::alloc`] does with this core; `None` when the pool is
    /// exhausted.
    pub fn alloc(&mut self, size: FrameSize) -> Option<Frame> {
        let Some(cache) = &mut self.cache else {
            return self.pool.alloc(self.core, size);
        };
        let FrameId(index) = self.pool.llfree.get_cached(cache, size.order()).ok()?;
        Some(Frame {
            index: index as u64,
            size,
        })
    }

    /// Returns a frame to the pool as [`Pool::free`] does with this core. Its contents must
    /// have been scrubbed already.
    pub fn free(&mut self, frame: Frame) -> Result<(), llfree::Error> {
        let Some(cache) = &mut self.cache else {
            return self.pool.free(self.core, frame);
        };
        let index = FrameId(frame.index as usize);
        self.pool
            .llfree
            .put_cached(cache, index, frame.size.order())
    }
}

impl Drop for CoreFrames {
    fn drop(&mut self) {
        if let Some(cache) = &mut self.cache {
            self.pool.llfree.release_cache(cache);
            self.pool.cache_claims[self.core - self.pool.cores.start]
                .store(false, Ordering::Release);
        }
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
        let mut frames = pool.core_frames(1);
        assert!(frames.is_cached(), "a free core");
        assert!(!pool.core_frames(1).is_cached(), "held");
        assert!(!pool.core_frames(2).is_cached(), "not a core of the pool");
        // The first get reserves a tree for the core, the second takes a batch of it.
        let taken: Vec<Frame> = (0..2)
            .map(|_| frames.alloc(FrameSize::Huge).expect("frame"))
            .collect();
        assert!(taken.iter().all(|&frame| pool.is_allocated(frame)));
        // The rest of the batch is free memory.
        assert!(pool.allocator().cached_frames() > 0);
        assert_eq!(pool.free_frames(), pool.size() / 4096 - 2 * 512);
        for &frame in &taken {
            frames.free(frame).expect("free");
        }
        assert!(frames.free(taken[0]).is_err(), "freed twice");
        assert_eq!(pool.free_frames(), pool.size() / 4096);
        drop(frames);
        assert_eq!(pool.allocator().cached_frames(), 0);
        assert_eq!(pool.free_frames(), pool.size() / 4096);
        pool.allocator().validate().expect("consistent");
        assert!(pool.core_frames(1).is_cached(), "given back");
    }
}
