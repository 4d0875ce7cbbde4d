//! The allocator: lower and upper level together, with the public API.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::flush::persist;
use crate::lower::bitfield::Bitfield;
use crate::lower::child::ChildPair;
use crate::lower::Lower;
use crate::meta::{Layout, Meta, PERSISTENT_SLOTS};
use crate::region::{HeapRegion, MetaRegion, REGION_ALIGN};
use crate::upper::local::Local;
use crate::upper::trees::{TreeEntry, Trees, ENTRY_SIZE, GIANT_TREES};
use crate::upper::{Locals, Search};
use crate::{
    Config, CoreId, Error, FrameId, Init, InitError, Order, Recovery, CHILD_FRAMES, GIANT_ORDER,
    HUGE_ORDER, MAX_ORDER, TREE_CHILDREN, TREE_FRAMES,
};

/// Why a reservation did not happen.
enum ReserveError {
    /// Another thread of the same core is in a slow path.
    Busy,
    /// No tree has enough free frames.
    Memory,
}

/// The LLFree page-frame allocator.
///
/// All operations are lock-free and may be called from any number of threads; `core` selects the
/// per-core reservation and may be shared by several threads.
pub struct LLFree {
    lower: Lower,
    trees: Trees,
    locals: Locals,
    /// Per slot: its owner, 0 for none (persistent regions shared by processes).
    owners: &'static [AtomicU64],
    config: Config,
    meta: Option<&'static Meta>,
    recovery: Recovery,
    /// Owns the memory that `lower` and `meta` point into; dropped last.
    _region: Box<dyn MetaRegion>,
}

impl std::fmt::Debug for LLFree {
    /// The size and state, not the metadata (megabytes of bitfields).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LLFree")
            .field("frames", &self.frames())
            .field("cores", &self.cores())
            .field("persistent", &self.meta.is_some())
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

impl LLFree {
    /// Creates an allocator with volatile metadata on the heap; all frames are free.
    pub fn new(config: Config) -> Result<Self, InitError> {
        config.validate()?;
        let trees = config.frames.div_ceil(TREE_FRAMES);
        let layout = Layout::new(config.frames, false, config.cores.min(trees));
        let region = HeapRegion::new(layout.size)
            .map_err(|_| InitError::Config("cannot allocate the metadata"))?;
        Self::with_region(config, Box::new(region), layout, None, Init::Fresh)
    }

    /// Bytes of persistent metadata for a zone of `frames` frames.
    pub fn metadata_size(frames: usize) -> usize {
        Layout::new(frames, true, PERSISTENT_SLOTS).size
    }

    /// Creates, recovers or attaches to an allocator whose metadata lives in `region` (at least
    /// [`LLFree::metadata_size`] bytes, 64-byte aligned), e.g. a shared file mapping.
    ///
    /// With [`Config::shared`], `config.cores` is ignored: the region's
    /// [`PERSISTENT_SLOTS`] slots are claimed by their users ([`LLFree::claim_slots`]).
    pub fn persistent(
        config: Config,
        region: Box<dyn MetaRegion>,
        init: Init,
    ) -> Result<Self, InitError> {
        config.validate()?;
        if !config.shared && config.cores > PERSISTENT_SLOTS {
            return Err(InitError::Config(
                "a persistent allocator has at most 256 cores",
            ));
        }
        let layout = Layout::new(config.frames, true, PERSISTENT_SLOTS);
        if region.len() < layout.size {
            return Err(InitError::RegionTooSmall {
                need: layout.size,
                have: region.len(),
            });
        }
        if !(region.as_ptr() as usize).is_multiple_of(REGION_ALIGN) {
            return Err(InitError::RegionMisaligned);
        }
        // SAFETY: the region is at least `layout.size` bytes, cache-line aligned, and outlives
        // the allocator, which keeps it in `_region`. `Meta` consists of atomics, valid for any
        // bit pattern.
        let meta: &'static Meta = unsafe { &*region.as_ptr().cast::<Meta>() };
        Self::with_region(config, region, layout, Some(meta), init)
    }

    fn with_region(
        config: Config,
        region: Box<dyn MetaRegion>,
        layout: Layout,
        meta: Option<&'static Meta>,
        init: Init,
    ) -> Result<Self, InitError> {
        let children = config.frames / CHILD_FRAMES;
        let tree_count = children.div_ceil(TREE_CHILDREN);
        let base = region.as_ptr();
        // SAFETY: the layout places the child pairs, bitfields, tree entries, slots and owner
        // words inside the region (its size was checked by the callers), at 64-byte aligned
        // offsets of a 64-byte aligned region, and none needs more alignment (`Local` is 128 bytes
        // aligned to 64). All are atomics or plain integers, valid for any bit pattern.
        // The region outlives every slice: the allocator keeps it in `_region`.
        let (pairs, fields, entries, locals, owners) = unsafe {
            (
                std::slice::from_raw_parts(
                    base.add(layout.pairs).cast::<ChildPair>(),
                    Lower::pairs_size(children) / 4,
                ),
                std::slice::from_raw_parts(base.add(layout.fields).cast::<Bitfield>(), children),
                std::slice::from_raw_parts(
                    base.add(layout.trees).cast::<TreeEntry>(),
                    (layout.locals - layout.trees) / ENTRY_SIZE,
                ),
                std::slice::from_raw_parts(base.add(layout.locals).cast::<Local>(), layout.slots),
                std::slice::from_raw_parts(
                    base.add(layout.owners).cast::<AtomicU64>(),
                    layout.slots,
                ),
            )
        };
        let lower = Lower::new(pairs, fields, config.flush && meta.is_some());
        let trees = Trees::new(
            entries,
            tree_count,
            config.almost_allocated,
            config.almost_free,
        );
        // Shared: every slot, claimed by its users; otherwise one per core, at most one per tree.
        let used_slots = if config.shared {
            layout.slots
        } else {
            config.cores.min(tree_count).min(layout.slots)
        };
        let locals = Locals::new(&locals[..used_slots]);
        let recovery = match (meta, init) {
            (Some(meta), Init::Attach) => {
                meta.check(config.frames)?;
                Recovery::Attached
            }
            (None, _) | (Some(_), Init::Fresh) => {
                if let Some(meta) = meta {
                    meta.invalidate();
                    persist_meta(meta, config.flush);
                }
                lower.init_fresh();
                if let Some(meta) = meta {
                    meta.format(config.frames);
                    persist_meta(meta, config.flush);
                }
                Recovery::Fresh
            }
            (Some(meta), Init::Recover | Init::RecoverDeep) => {
                let clean = meta.check(config.frames)?;
                let deep = !clean || init == Init::RecoverDeep;
                lower.recover(deep)?;
                meta.mark_running();
                persist_meta(meta, config.flush);
                if deep {
                    Recovery::Crash
                } else {
                    Recovery::Clean
                }
            }
        };
        if recovery != Recovery::Attached {
            let free: Vec<usize> = (0..tree_count).map(|t| lower.tree_free(t)).collect();
            trees.init(&free);
            locals.init();
            for owner in owners {
                owner.store(0, Ordering::Release);
            }
        }
        Ok(Self {
            lower,
            trees,
            locals,
            owners,
            config,
            meta,
            recovery,
            _region: region,
        })
    }

    /// Frames in the zone.
    pub fn frames(&self) -> usize {
        self.config.frames
    }

    /// Per-core reservation slots: the configured cores, but at most one per tree, so a zone of
    /// fewer trees (64 MiB each) than cores shares slots between cores (core ids are taken
    /// modulo this number).
    pub fn cores(&self) -> usize {
        self.locals.len()
    }

    /// How this allocator was initialised.
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    #[inline]
    fn check(&self, frame: usize, order: usize) -> Result<(), Error> {
        check_order(order)?;
        if frame & ((1 << order) - 1) != 0 {
            return Err(Error::Misaligned { frame, order });
        }
        if frame >= self.frames() || self.frames() - frame < 1 << order {
            return Err(Error::OutOfRange {
                frame,
                order,
                frames: self.frames(),
            });
        }
        Ok(())
    }

    /// Allocates `2^order` contiguous, aligned frames with the reservation of `core`.
    /// Returns the first frame.
    #[inline]
    pub fn get(&self, core: CoreId, order: Order) -> Result<FrameId, Error> {
        self.get_frames(core.0, order.0).map(FrameId)
    }

    pub(crate) fn get_frames(&self, core: usize, order: usize) -> Result<usize, Error> {
        if order > MAX_ORDER {
            check_order(order)?;
            return self.get_giant();
        }
        let local = self.locals.get(core);
        let frames = 1 << order;
        if let Some(state) = local.take(frames) {
            if let Some(frame) = self.lower.get(state.hint(), order) {
                // Whole children move the hint as they are taken (see `Local::take`).
                if order < HUGE_ORDER && frame / CHILD_FRAMES != state.hint() / CHILD_FRAMES {
                    local.set_hint(frame);
                }
                return Ok(frame);
            }
            self.give_back(local, state.tree(), frames);
            return self.get_slow(core, local, order, true);
        }
        self.get_slow(core, local, order, false)
    }

    /// Returns frames taken from a tree that could not serve the order.
    fn give_back(&self, local: &Local, tree: usize, frames: usize) {
        if !local.give(tree, frames) {
            self.trees.add(tree, frames);
        }
    }

    /// The slow path of [`LLFree::get`]: sync or reserve trees until the order is served.
    /// `fragmented`: the reserved tree counted enough frames, but none in the right shape.
    #[cold]
    fn get_slow(
        &self,
        core: usize,
        local: &Local,
        order: usize,
        mut fragmented: bool,
    ) -> Result<usize, Error> {
        let frames = 1 << order;
        for _ in 0..=self.trees.len() * 2 {
            match self.reserve(core, local, frames, fragmented) {
                Ok(()) => {}
                Err(ReserveError::Busy) => {
                    if let Some(frame) = self.get_unreserved(order) {
                        return Ok(frame);
                    }
                    spin_loop();
                }
                Err(ReserveError::Memory) => break,
            }
            if let Some(state) = local.take(frames) {
                if let Some(frame) = self.lower.get(state.hint(), order) {
                    local.set_hint(frame);
                    return Ok(frame);
                }
                self.give_back(local, state.tree(), frames);
                fragmented = true;
            }
        }
        self.get_unreserved(order)
            .or_else(|| self.get_borrowed(order))
            .ok_or(Error::Memory { order })
    }

    /// Syncs the local counter with the tree, or reserves a new tree for `core`.
    fn reserve(
        &self,
        core: usize,
        local: &Local,
        frames: usize,
        fragmented: bool,
    ) -> Result<(), ReserveError> {
        let state = local.begin_slow_path().ok_or(ReserveError::Busy)?;
        if state.present() && !fragmented {
            let foreign = self.trees.take_foreign_frees(state.tree());
            if foreign > 0 {
                local.give(state.tree(), foreign);
                if local.load().free() >= frames {
                    local.end_slow_path();
                    return Ok(());
                }
            }
        }
        let search = Search {
            start: if state.present() {
                state.tree()
            } else {
                (core % self.locals.len()) * self.trees.len() / self.locals.len()
            },
            frames,
            prefer_free: fragmented || frames >= CHILD_FRAMES,
        };
        let found = self.trees.search(search).or_else(|| {
            self.drain_others(local);
            self.trees.search(search)
        });
        let Some((tree, free)) = found else {
            local.end_slow_path();
            return Err(ReserveError::Memory);
        };
        self.install(local, tree * TREE_FRAMES, free);
        Ok(())
    }

    /// Makes the reserved tree of `local` the one of `hint` (reserved by the caller, with `free`
    /// frames) and gives back the previous one.
    fn install(&self, local: &Local, hint: usize, free: usize) {
        let old = local.install(hint, free);
        if old.present() {
            self.trees.unreserve(old.tree(), old.free());
        }
    }

    /// Allocates from any unreserved tree without reserving it (when the core's slow path is
    /// busy, or as the last resort).
    fn get_unreserved(&self, order: usize) -> Option<usize> {
        self.get_without_reservation(order, |tree, frames| self.trees.take(tree, frames))
    }

    /// Allocates frames that the lower level has free although no counter shows them, because a
    /// [`CoreCache`] counts them (or an operation is between its two levels): the tree owes them
    /// until the cache gives its frames back. The last resort before [`Error::Memory`].
    fn get_borrowed(&self, order: usize) -> Option<usize> {
        self.get_without_reservation(order, |tree, frames| {
            self.lower.tree_free(tree) >= frames && self.trees.borrow(tree, frames)
        })
    }

    /// Allocates from the first tree whose counter `take` lowers by the frames of `order` and
    /// whose lower level then has them; gives them back where it had not.
    fn get_without_reservation(
        &self,
        order: usize,
        take: impl Fn(usize, usize) -> bool,
    ) -> Option<usize> {
        let frames = 1 << order;
        (0..self.trees.len()).find_map(|tree| {
            if !take(tree, frames) {
                return None;
            }
            let frame = self.lower.get(tree * TREE_FRAMES, order);
            if frame.is_none() {
                self.trees.add(tree, frames);
            }
            frame
        })
    }

    /// Drains the reservations of all other cores whose slow path is idle.
    fn drain_others(&self, own: &Local) {
        for local in self.locals.iter() {
            if !std::ptr::eq(local, own) && local.begin_slow_path().is_some() {
                self.uninstall(local);
            }
        }
    }

    fn uninstall(&self, local: &Local) {
        let old = local.uninstall();
        if old.present() {
            self.trees.unreserve(old.tree(), old.free());
        }
    }

    fn get_giant(&self) -> Result<usize, Error> {
        let whole_trees = self.frames() / TREE_FRAMES;
        let tree = self.trees.claim_giant(whole_trees).or_else(|| {
            for local in self.locals.iter() {
                if local.begin_slow_path().is_some() {
                    self.uninstall(local);
                }
            }
            self.trees.claim_giant(whole_trees)
        });
        let Some(tree) = tree else {
            return Err(Error::Memory { order: GIANT_ORDER });
        };
        let frame = tree * TREE_FRAMES;
        if self.lower.get_giant(frame) {
            Ok(frame)
        } else {
            self.add_giant_trees(frame);
            Err(Error::Memory { order: GIANT_ORDER })
        }
    }

    fn add_giant_trees(&self, frame: usize) {
        let first = frame / TREE_FRAMES;
        for tree in first..first + GIANT_TREES {
            self.trees.add(tree, TREE_FRAMES);
        }
    }

    /// Allocates the specific huge or giant frame at `frame`, which must be free: for a persistent
    /// owner that records the frame while the allocator lost it (a zone's crash recovery).
    ///
    /// Every core's reservation is given up first, so that the tree's free frames are counted
    /// globally; fails with [`Error::NotFree`] if a frame of the range is taken, or if a core
    /// reserved the tree again meanwhile, and with [`Error::InvalidOrder`] for other orders.
    pub fn get_at(&self, frame: FrameId, order: Order) -> Result<(), Error> {
        let (frame, order) = (frame.0, order.0);
        self.check(frame, order)?;
        let not_free = Error::NotFree { frame, order };
        for local in self.locals.iter() {
            if local.begin_slow_path().is_some() {
                self.uninstall(local);
            }
        }
        match order {
            HUGE_ORDER => {
                let tree = frame / TREE_FRAMES;
                if !self.trees.take(tree, CHILD_FRAMES) {
                    return Err(not_free);
                }
                if !self.lower.get_huge_at(frame / CHILD_FRAMES) {
                    self.trees.add(tree, CHILD_FRAMES);
                    return Err(not_free);
                }
                Ok(())
            }
            GIANT_ORDER => {
                if !self.trees.claim_giant_at(frame / TREE_FRAMES) {
                    return Err(not_free);
                }
                if !self.lower.get_giant(frame) {
                    self.add_giant_trees(frame);
                    return Err(not_free);
                }
                Ok(())
            }
            _ => Err(Error::InvalidOrder(order)),
        }
    }

    /// Frees `2^order` frames starting at `frame`, from `core`.
    ///
    /// Fails without changing anything if the frames are out of range, misaligned, not
    /// allocated, or were allocated with another order (as far as the metadata records orders:
    /// huge, order-10 and giant frames are recorded, base-frame runs are not).
    #[inline]
    pub fn put(&self, core: CoreId, frame: FrameId, order: Order) -> Result<(), Error> {
        self.put_frames(core.0, frame.0, order.0)
    }

    pub(crate) fn put_frames(&self, core: usize, frame: usize, order: usize) -> Result<(), Error> {
        self.check(frame, order)?;
        if order == GIANT_ORDER {
            self.lower.put_giant(frame)?;
            self.add_giant_trees(frame);
            return Ok(());
        }
        self.lower.put(frame, order)?;
        let tree = frame / TREE_FRAMES;
        let frames = 1 << order;
        let local = self.locals.get(core);
        if local.give(tree, frames) {
            return Ok(());
        }
        self.trees.add(tree, frames);
        let threshold = self.config.reserve_on_free as usize;
        if threshold > 0 && local.count_free(tree) >= threshold {
            self.reserve_on_free(local, tree, frame);
        }
        Ok(())
    }

    /// Reserves `tree` for `local` after consecutive frees into it, if it is partial or free.
    fn reserve_on_free(&self, local: &Local, tree: usize, frame: usize) {
        // The tree's counter first (a plain load): most frees go into trees that are reserved
        // or not free enough, and need no slow path.
        let (free, reserved) = self.trees.load(tree);
        if reserved
            || free < self.config.almost_allocated as isize
            || local.begin_slow_path().is_none()
        {
            return;
        }
        match self
            .trees
            .reserve(tree, |free| free >= self.config.almost_allocated)
        {
            Some(free) => {
                self.install(local, frame, free);
                local.reset_frees();
            }
            None => local.end_slow_path(),
        }
    }

    /// Gives up the reserved tree of `core`, returning its frames to the global counters.
    /// Best effort: skipped if another thread of the core is reserving a tree at this moment.
    pub fn drain(&self, core: CoreId) {
        let local = self.locals.get(core.0);
        if local.begin_slow_path().is_some() {
            self.uninstall(local);
        }
    }
}

impl Drop for LLFree {
    /// Marks a persistent allocator shut down cleanly, unless it is shared: then the last of
    /// its users says so ([`LLFree::mark_clean`]).
    fn drop(&mut self) {
        if !self.config.shared {
            self.mark_clean();
        }
    }
}

/// Writes the meta page's cache line back where the platform needs it (ADR).
fn persist_meta(meta: &Meta, flush: bool) {
    if flush {
        persist((meta as *const Meta).cast());
    }
}

/// Checks that `order` is supported.
#[inline]
fn check_order(order: usize) -> Result<(), Error> {
    if order <= MAX_ORDER || order == GIANT_ORDER {
        Ok(())
    } else {
        Err(Error::InvalidOrder(order))
    }
}

mod cache;
pub use cache::CoreCache;
mod shared;
pub use shared::SlotRecovery;
mod stats;
#[cfg(test)]
mod tests;
