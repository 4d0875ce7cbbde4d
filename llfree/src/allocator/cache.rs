//! Per-thread caches of a core's frames ([`CoreCache`]): the fast path of a thread that keeps
//! its own cache, e.g. a vCPU thread.
//!
//! [`LLFree::get`] and [`LLFree::put`] change the per-core word with a compare-and-swap on every
//! call, since any number of threads may share a core. A cache takes frames from that word in
//! batches and counts them with plain arithmetic; only the lower level is changed atomically. An
//! order-0 get or put then needs two locked instructions (child counter and bitfield) instead of
//! three, and a huge one needs one instead of two.
//!
//! Cached frames are free in the lower level and counted nowhere else: frames of the core's
//! reserved tree taken from its local counter, or frames freed through the cache into one tree
//! (a device's thread gives frames back through its cache one tree at a time). Once the core
//! does not reserve that tree (another core drained it, the reservation moved on, or it never
//! had it), the cache's next get gives them back to the tree, as does a free into another
//! tree. A cache holds at most [`LIMIT`] frames that other cores cannot reserve meanwhile.
//!
//! A core has at most one cache at a time (its owner's thread keeps it). The core's slot records
//! how many frames of which tree the cache holds, with a plain store after each operation, so
//! that when the cache's process dies, [`LLFree::recover_slots`] gives them back to their tree
//! even when survivors drained the dead core's reservation first.

use super::{check_order, LLFree};
use crate::upper::local::{after, Local};
use crate::{CoreId, Error, FrameId, Order, HUGE_ORDER, MAX_ORDER, TREE_FRAMES};

/// Frames a cache takes from its core's local counter at once (16 MiB): one compare-and-swap
/// on the per-core word per 4096 base frames, or per 8 huge frames.
const BATCH: usize = TREE_FRAMES / 4;
/// A cache that frees bring above this many frames gives back all but [`BATCH`].
const LIMIT: usize = 2 * BATCH;

/// A private cache of one core's frames, for one thread ([`LLFree::core_cache`]).
///
/// Its frames are counted neither in the tree nor in the core's local counter:
/// [`LLFree::free_frames`] and [`LLFree::validate`] see them once [`LLFree::release_cache`] gave
/// them back, which the owner must do before it drops the cache (debug builds check). A crash
/// loses nothing: recovery counts free frames from the lower level, and in a region shared by
/// processes [`LLFree::recover_slots`] gives a dead owner's cached frames back to their tree
/// (the core's slot records them). One cache per core. A giant frame needs 16 trees whose
/// frames no cache holds.
#[derive(Debug)]
pub struct CoreCache {
    /// The core whose reservation the frames come from.
    core: usize,
    /// The tree of the cached frames and of the hint (`usize::MAX` before the first frame).
    tree: usize,
    /// Cached frames.
    frames: usize,
    /// Where the next allocation starts looking.
    hint: usize,
}

impl CoreCache {
    /// Frames the cache holds.
    pub fn frames(&self) -> usize {
        self.frames
    }
}

impl Drop for CoreCache {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            debug_assert_eq!(self.frames, 0, "a CoreCache was dropped with frames in it");
        }
    }
}

impl LLFree {
    /// An empty cache of `core`'s frames for the calling thread. A core has one cache at a time
    /// (its slot records what the cache holds); any number of [`LLFree::get`] callers may share
    /// the core beside it.
    pub fn core_cache(&self, core: CoreId) -> CoreCache {
        CoreCache {
            core: core.0,
            tree: usize::MAX,
            frames: 0,
            hint: 0,
        }
    }

    /// [`LLFree::get`] through `cache`.
    #[inline]
    pub fn get_cached(&self, cache: &mut CoreCache, order: Order) -> Result<FrameId, Error> {
        let order = order.0;
        if order > MAX_ORDER {
            check_order(order)?;
            return self.get_frames(cache.core, order).map(FrameId);
        }
        let frames = 1 << order;
        let local = self.locals.get(cache.core);
        let fragmented = if self.fill(cache, local, frames) {
            if let Some(frame) = self.lower.get(cache.hint, order) {
                cache.frames -= frames;
                local.set_cached(cache.tree, cache.frames);
                cache.hint = if order < HUGE_ORDER {
                    frame
                } else {
                    after(frame, frames)
                };
                return Ok(FrameId(frame));
            }
            // Enough frames, but none in the order's shape.
            true
        } else {
            false
        };
        // The tree's frames go back to its counters before the slow path syncs or replaces it.
        self.release_cache(cache);
        self.get_slow(cache.core, local, order, fragmented)
            .map(FrameId)
    }

    /// Makes `cache` hold at least `frames` frames of the tree `local` reserves, giving back
    /// frames of a tree it no longer reserves. False if the local counter has too few.
    #[inline]
    fn fill(&self, cache: &mut CoreCache, local: &Local, frames: usize) -> bool {
        let owned = local.owns(cache.tree);
        if owned && cache.frames >= frames {
            return true;
        }
        if !owned {
            self.release_cache(cache);
        }
        let Some((state, taken)) = local.take_batch(frames, BATCH) else {
            return false;
        };
        if state.tree() != cache.tree {
            // A new reservation (perhaps made since the load above): start where it says.
            self.release_cache(cache);
            cache.tree = state.tree();
            cache.hint = state.hint();
        }
        cache.frames += taken;
        local.set_cached(cache.tree, cache.frames);
        true
    }

    /// Whether `core` reserves the tree of `frame` right now (one plain load).
    #[inline]
    pub fn reserves(&self, core: CoreId, frame: FrameId) -> bool {
        self.locals.get(core.0).owns(frame.0 / TREE_FRAMES)
    }

    /// [`LLFree::put`] through `cache`: the frame goes to the cache, whatever its tree, and only
    /// the lower level is changed atomically. Frees into the tree the cache holds frames of add
    /// to them; a frame of another tree first gives those back (one locked instruction for a
    /// run of frees into one tree, where the shared path takes one per free). Frames of a tree
    /// the core does not reserve wait in the cache until then: the tree's counter owes them,
    /// and a get that finds nothing else borrows them (as it borrows the core's own cached
    /// frames). A tree that owes frames already (its counter below zero: gets borrowed frames
    /// that caches count) gets the frame at once, so that a frame borrowed from one cache and
    /// freed into another is never counted by both, and what a tree owes stays below what
    /// caches took of it.
    #[inline]
    pub fn put_cached(
        &self,
        cache: &mut CoreCache,
        frame: FrameId,
        order: Order,
    ) -> Result<(), Error> {
        let (frame, order) = (frame.0, order.0);
        if order > MAX_ORDER {
            return self.put_frames(cache.core, frame, order);
        }
        self.check(frame, order)?;
        self.lower.put(frame, order)?;
        let tree = frame / TREE_FRAMES;
        if self.trees.load(tree).0 < 0 {
            self.trees.add(tree, 1 << order);
            return Ok(());
        }
        if cache.tree != tree {
            self.release_cache(cache);
            cache.tree = tree;
            cache.hint = frame;
        }
        let local = self.locals.get(cache.core);
        cache.frames += 1 << order;
        if cache.frames > LIMIT {
            self.give_back(local, tree, cache.frames - BATCH);
            cache.frames = BATCH;
        }
        local.set_cached(cache.tree, cache.frames);
        Ok(())
    }

    /// Gives the frames of `cache` back to its tree (to the core's local counter while the core
    /// reserves it). The cache stays usable.
    pub fn release_cache(&self, cache: &mut CoreCache) {
        if cache.frames > 0 {
            let local = self.locals.get(cache.core);
            // Recorded as gone first: a crash in between loses the frames until the region is
            // recovered whole, instead of counting them twice.
            local.set_cached(cache.tree, 0);
            self.give_back(local, cache.tree, cache.frames);
            cache.frames = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, CHILD_FRAMES};

    fn zone(cores: usize, trees: usize) -> LLFree {
        LLFree::new(Config::new(cores, trees * TREE_FRAMES)).unwrap()
    }

    #[test]
    fn takes_batches_and_gives_them_back() {
        let alloc = zone(2, 4);
        let mut cache = alloc.core_cache(CoreId(0));
        let frame = alloc.get_cached(&mut cache, Order(0)).unwrap();
        // The first get reserved a tree; the second takes a batch from it.
        let second = alloc.get_cached(&mut cache, Order(0)).unwrap();
        assert_eq!(cache.frames(), BATCH - 1);
        assert_eq!(alloc.free_frames(), alloc.frames() - 2 - cache.frames());
        assert_eq!(alloc.cached_frames(), cache.frames());
        assert!(alloc.reserves(CoreId(0), frame) && !alloc.reserves(CoreId(1), frame));
        alloc.put_cached(&mut cache, frame, Order(0)).unwrap();
        alloc.put_cached(&mut cache, second, Order(0)).unwrap();
        assert_eq!(cache.frames(), BATCH + 1);
        assert_eq!(
            alloc.put_cached(&mut cache, frame, Order(0)),
            Err(Error::NotAllocated {
                frame: frame.0,
                order: 0
            })
        );
        alloc.release_cache(&mut cache);
        assert_eq!(alloc.free_frames(), alloc.frames());
        assert_eq!(alloc.cached_frames(), 0);
        alloc.validate().unwrap();
    }

    #[test]
    fn every_order_round_trips() {
        let alloc = zone(1, 32);
        let mut cache = alloc.core_cache(CoreId(0));
        for order in (0..=MAX_ORDER).chain([crate::GIANT_ORDER]) {
            let frame = alloc.get_cached(&mut cache, Order(order)).unwrap();
            assert!(alloc.is_allocated(frame, Order(order)));
            alloc.put_cached(&mut cache, frame, Order(order)).unwrap();
            assert!(alloc.is_free(frame, Order(order)));
        }
        assert_eq!(
            alloc.get_cached(&mut cache, Order(11)),
            Err(Error::InvalidOrder(11))
        );
        alloc.release_cache(&mut cache);
        alloc.validate().unwrap();
    }

    #[test]
    fn frees_beyond_the_limit_go_back_to_the_core() {
        let alloc = zone(1, 2);
        let mut cache = alloc.core_cache(CoreId(0));
        let frames: Vec<_> = (0..TREE_FRAMES)
            .map(|_| alloc.get_cached(&mut cache, Order(0)).unwrap())
            .collect();
        assert!(frames
            .iter()
            .all(|f| f.0 / TREE_FRAMES == frames[0].0 / TREE_FRAMES));
        for frame in frames {
            alloc.put_cached(&mut cache, frame, Order(0)).unwrap();
            assert!(cache.frames() <= LIMIT);
        }
        alloc.release_cache(&mut cache);
        alloc.validate().unwrap();
        assert_eq!(alloc.free_frames(), alloc.frames());
    }

    #[test]
    fn frees_into_a_tree_the_core_does_not_reserve_wait_in_the_cache_one_tree_at_a_time() {
        let alloc = zone(2, 4);
        // Another core allocates two trees' worth; this core (a device's) frees them.
        let taken: Vec<_> = (0..2 * TREE_FRAMES / CHILD_FRAMES)
            .map(|_| alloc.get(CoreId(1), Order::HUGE).unwrap())
            .collect();
        alloc.drain(CoreId(1));
        let first_tree = taken[0].0 / TREE_FRAMES;
        let mut cache = alloc.core_cache(CoreId(0));
        let (first, second) = taken.split_at(taken.len() / 2);
        assert!(first.iter().all(|f| f.0 / TREE_FRAMES == first_tree));
        for &frame in first {
            alloc.put_cached(&mut cache, frame, Order::HUGE).unwrap();
        }
        assert!(
            !alloc.reserves(CoreId(0), first[0]),
            "frees reserve nothing"
        );
        // Free in the lower level, owed by the tree's counter, recorded as the cache's.
        assert!(alloc.is_free(first[0], Order::HUGE));
        assert!(cache.frames() > 0 && cache.frames() <= LIMIT);
        assert_eq!(alloc.cached_frames(), cache.frames());
        assert_eq!(
            alloc.available_frames(),
            alloc.frames() - second.len() * CHILD_FRAMES
        );
        // A free into the next tree gives the first tree its frames back.
        alloc
            .put_cached(&mut cache, second[0], Order::HUGE)
            .unwrap();
        assert_eq!(cache.frames(), CHILD_FRAMES);
        assert_eq!(
            alloc.free_frames(),
            alloc.frames() - second.len() * CHILD_FRAMES,
            "the first tree counts all its frames again"
        );
        for &frame in &second[1..] {
            alloc.put_cached(&mut cache, frame, Order::HUGE).unwrap();
        }
        // The core's own get gives the frames back before it reserves a tree.
        let frame = alloc.get_cached(&mut cache, Order(0)).unwrap();
        alloc.put_cached(&mut cache, frame, Order(0)).unwrap();
        alloc.release_cache(&mut cache);
        (0..2).for_each(|core| alloc.drain(CoreId(core)));
        alloc.validate().unwrap();
        assert_eq!(alloc.free_frames(), alloc.frames());
    }

    #[test]
    fn a_frame_borrowed_from_one_cache_and_freed_into_another_is_counted_once() {
        // One tree, every frame taken: two devices' caches hand the same frames around, as
        // VMs on one zone do when each reports what it borrowed from the other's balloon.
        let alloc = LLFree::new(Config::new(3, 16 * CHILD_FRAMES)).unwrap();
        let mut held: Vec<_> = (0..16)
            .map(|_| alloc.get(CoreId(0), Order::HUGE).unwrap())
            .collect();
        alloc.drain(CoreId(0));
        let mut caches = [alloc.core_cache(CoreId(1)), alloc.core_cache(CoreId(2))];
        for round in 0..200 {
            // A device frees 4 frames, then a VM takes 4 (borrowing what caches count).
            let cache = &mut caches[round % 2];
            for frame in held.drain(..4) {
                alloc.put_cached(cache, frame, Order::HUGE).unwrap();
            }
            for _ in 0..4 {
                held.push(alloc.get(CoreId(0), Order::HUGE).expect("a frame is free"));
            }
            assert_eq!(alloc.available_frames(), 0, "round {round}");
            assert!(alloc.cached_frames() <= 16 * CHILD_FRAMES, "round {round}");
        }
        for frame in held {
            alloc.put(CoreId(0), frame, Order::HUGE).unwrap();
        }
        caches.iter_mut().for_each(|c| alloc.release_cache(c));
        (0..3).for_each(|core| alloc.drain(CoreId(core)));
        alloc.validate().unwrap();
        assert_eq!(alloc.free_frames(), alloc.frames());
    }

    #[test]
    fn a_drained_core_s_cache_returns_its_frames_to_the_tree() {
        let alloc = zone(2, 4);
        let mut cache = alloc.core_cache(CoreId(0));
        let kept = alloc.get_cached(&mut cache, Order(0)).unwrap();
        let frame = alloc.get_cached(&mut cache, Order(0)).unwrap();
        let tree = frame.0 / TREE_FRAMES;
        // Another core takes the reservation away: the cache's frames are out of every counter
        // until its next operation gives them back to the tree.
        alloc.drain(CoreId(0));
        assert_eq!(alloc.free_frames(), alloc.frames() - 2 - cache.frames());
        alloc.put_cached(&mut cache, frame, Order(0)).unwrap();
        let next = alloc.get_cached(&mut cache, Order(0)).unwrap();
        assert_eq!(next.0 / TREE_FRAMES, tree);
        alloc.put_cached(&mut cache, next, Order(0)).unwrap();
        alloc.put_cached(&mut cache, kept, Order(0)).unwrap();
        alloc.release_cache(&mut cache);
        alloc.drain(CoreId(0));
        alloc.validate().unwrap();
        assert_eq!(alloc.free_frames(), alloc.frames());
    }

    #[test]
    fn frames_a_cache_holds_are_borrowed_when_nothing_else_is_left() {
        let alloc = zone(2, 2);
        let mut cache = alloc.core_cache(CoreId(0));
        let first = alloc.get_cached(&mut cache, Order(0)).unwrap();
        let second = alloc.get_cached(&mut cache, Order(0)).unwrap();
        assert!(cache.frames() > 0);
        let mut others = Vec::new();
        while let Ok(frame) = alloc.get(CoreId(1), Order(0)) {
            others.push(frame);
        }
        assert_eq!(others.len(), alloc.frames() - 2);
        // Borrowed: the cache still records them and the trees owe them; none is left.
        assert_eq!(alloc.cached_frames(), cache.frames());
        assert_eq!(alloc.available_frames(), 0);
        // The frames the cache counted are gone: it gives its count back and fails.
        assert_eq!(
            alloc.get_cached(&mut cache, Order(0)),
            Err(Error::Memory { order: 0 })
        );
        assert_eq!(cache.frames(), 0);
        alloc.validate().unwrap();
        for frame in others.into_iter().chain([first, second]) {
            alloc.put_cached(&mut cache, frame, Order(0)).unwrap();
        }
        alloc.release_cache(&mut cache);
        (0..2).for_each(|core| alloc.drain(CoreId(core)));
        alloc.validate().unwrap();
        assert_eq!(alloc.free_frames(), alloc.frames());
        assert_eq!(alloc.available_frames(), alloc.frames());
    }

    #[test]
    fn caches_and_shared_callers_on_many_threads_lose_nothing() {
        let alloc = zone(2, 8);
        std::thread::scope(|s| {
            for thread in 0..4 {
                let alloc = &alloc;
                s.spawn(move || {
                    let core = CoreId(thread % 2);
                    let mut cache = alloc.core_cache(core);
                    let mut held = Vec::new();
                    for i in 0..20_000 {
                        let order = Order([0, 0, 3, 9][i % 4]);
                        let got = if thread < 2 {
                            alloc.get_cached(&mut cache, order)
                        } else {
                            alloc.get(core, order)
                        };
                        held.push((got.unwrap(), order));
                        if held.len() > 100 {
                            let (frame, order) = held.swap_remove(i * 7 % held.len());
                            alloc.put_cached(&mut cache, frame, order).unwrap();
                        }
                    }
                    for (frame, order) in held {
                        alloc.put(core, frame, order).unwrap();
                    }
                    alloc.release_cache(&mut cache);
                });
            }
        });
        (0..2).for_each(|core| alloc.drain(CoreId(core)));
        alloc.validate().unwrap();
        assert_eq!(alloc.free_frames(), alloc.frames());
    }
}
