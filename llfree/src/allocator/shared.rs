//! Persistent metadata shared by several processes ([`crate::Config::shared`]): per-core slots
//! claimed by owners (any non-zero word the users agree on, e.g. a process's entry in a table of
//! their own), given back when an owner leaves, and recovered when it dies.
//!
//! A slot's reservation and local counter live in the region, so an owner that died leaves them
//! behind: [`LLFree::recover_slots`] gives its reserved trees back with counters rebuilt from the
//! lower level, while the other owners go on allocating. What the dead owner was doing at that
//! instant (a frame taken but not yet handed out, a reservation half made, a giant frame half
//! claimed) stays lost until the next recovery of the whole region, when nobody uses it.

use std::sync::atomic::Ordering;

use super::LLFree;
use crate::CoreId;

/// What [`LLFree::recover_slots`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotRecovery {
    /// Slots the owner held, now free.
    pub slots: usize,
    /// Trees the owner had reserved, now unreserved with recounted free frames.
    pub trees: usize,
    /// Free frames those trees counted before (in the owner's local counters and the trees'
    /// entries) minus what the lower level holds: the owner's operations that were in flight.
    pub counter_drift: isize,
    /// Frames the owner's core caches held of trees it no longer reserved, given back to them.
    pub cached_frames: usize,
}

impl LLFree {
    /// The owner of each slot, 0 for a free one.
    pub fn slot_owners(&self) -> Vec<u64> {
        self.owners
            .iter()
            .map(|owner| owner.load(Ordering::Acquire))
            .collect()
    }

    /// Claims `count` consecutive free slots for `owner` (non-zero); returns the first, whose
    /// core id and the next `count - 1` are then the owner's. `None` if no such run is free.
    pub fn claim_slots(&self, owner: u64, count: usize) -> Option<CoreId> {
        assert_ne!(owner, 0, "owner 0 means free");
        if count == 0 || count > self.owners.len() {
            return None;
        }
        let mut first = 0;
        while first + count <= self.owners.len() {
            let taken = (first..first + count).find(|&slot| {
                self.owners[slot]
                    .compare_exchange(0, owner, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            });
            match taken {
                None => {
                    for slot in first..first + count {
                        self.locals.get(slot).reset();
                    }
                    return Some(CoreId(first));
                }
                Some(busy) => {
                    for slot in first..busy {
                        self.owners[slot].store(0, Ordering::Release);
                    }
                    first = busy + 1;
                }
            }
        }
        None
    }

    /// Gives back the slots of `owner`, which is leaving: their reservations are drained (their
    /// counters are exact) and the slots freed. Returns how many it held.
    pub fn release_slots(&self, owner: u64) -> usize {
        self.owned_slots(owner)
            .map(|slot| {
                // The owner's threads are gone: its slow path is idle (or was left busy by a
                // thread that ended in it, which `uninstall` overrides).
                let old = self.locals.get(slot).uninstall();
                if old.present() {
                    self.trees.unreserve(old.tree(), old.free());
                }
                self.free_slot(slot);
            })
            .count()
    }

    /// The slots `owner` holds.
    fn owned_slots(&self, owner: u64) -> impl Iterator<Item = usize> + '_ {
        (0..self.owners.len())
            .filter(move |&slot| self.owners[slot].load(Ordering::Acquire) == owner)
    }

    /// Empties and frees `slot`.
    fn free_slot(&self, slot: usize) {
        self.locals.get(slot).reset();
        self.owners[slot].store(0, Ordering::Release);
    }

    /// Recovers the slots of `owner`, which died: each reserved tree is unreserved with its free
    /// frames counted again from the lower level, and the slots are freed. Other owners may go on
    /// allocating and freeing meanwhile; a free of theirs into such a tree at that very moment may
    /// be counted twice (the next recovery of the whole region counts exactly).
    pub fn recover_slots(&self, owner: u64) -> SlotRecovery {
        let mut report = SlotRecovery::default();
        let slots: Vec<usize> = self.owned_slots(owner).collect();
        for slot in slots {
            let cached = self.locals.get(slot).cached();
            let old = self.locals.get(slot).uninstall();
            // Frames of the reserved tree are counted again below from the lower level; those
            // of another tree (survivors drained the reservation) go back to it now.
            if let Some((tree, frames)) = cached.filter(|&(tree, _)| !old.owns(tree)) {
                self.trees.add(tree, frames);
                report.cached_frames += frames;
            }
            if old.present() {
                let tree = old.tree();
                // The tree stays reserved (nobody else allocates from it) while it is counted:
                // first the frees others made into it, then the lower level.
                let foreign = self.trees.take_foreign_frees(tree);
                let counted = self.lower.tree_free(tree);
                self.trees.unreserve(tree, counted);
                report.trees += 1;
                report.counter_drift += (old.free() + foreign) as isize - counted as isize;
            }
            self.free_slot(slot);
            report.slots += 1;
        }
        report
    }

    /// Marks a shared persistent allocator shut down cleanly: for the last of its users, when
    /// nobody else uses the region (a later open then validates instead of rebuilding).
    pub fn mark_clean(&self) {
        if let Some(meta) = self.meta {
            meta.mark_clean();
            super::persist_meta(meta, self.config.flush);
        }
    }
}
