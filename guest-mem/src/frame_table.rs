//! The frame table: for every guest chunk, the pool frame backing it, one `AtomicU64` each.
//!
//! Every change is one atomic store or compare-and-swap of one entry. An entry is `EMPTY`
//! (unpopulated), `BUSY` (one thread is mapping or unmapping the chunk), `UNPLUGGED` (a chunk
//! of hot-pluggable memory the guest may not use: inaccessible), `FILE` (mapped privately from
//! a snapshot's memory file, or from a clone's base's frames: no frame of its own) or
//! `frame index + 1` (mapped onto that frame) in this process.
//!
//! The memory of a VM in a zone also has a **persistent** table in the zone file (see
//! `zone::vm_table`), changed only by the thread that holds the chunk `BUSY` here: a frame is
//! published there right after it was allocated and before it is mapped, and unpublished after
//! it was scrubbed and before it is freed. A new process maps the frames it records when their
//! chunks are first touched.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::zone::VmTable;

const EMPTY: u64 = 0;
const BUSY: u64 = u64::MAX;
const UNPLUGGED: u64 = u64::MAX - 1;
const FILE: u64 = u64::MAX - 2;

/// What a chunk is backed by now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Not backed; a touch faults.
    Empty,
    /// Being mapped or unmapped by some thread; wait for it.
    Busy,
    /// Mapped onto the pool frame with this first 4 KiB frame number.
    Mapped(u64),
    /// Hot-pluggable memory that is not plugged: inaccessible, never populated.
    Unplugged,
    /// Mapped privately from a snapshot's memory file (a copy snapshot loaded by mapping) or,
    /// in a clone, from its base's frame in the zone: the file's pages, shared with every VM
    /// that maps them, hold what the guest has not written; what it wrote is this process's
    /// own. No pool frame of its own.
    File,
}

/// Chunk-to-frame entries of one region.
#[derive(Debug)]
pub struct FrameTable {
    entries: Box<[AtomicU64]>,
    persistent: Option<VmTable>,
}

impl FrameTable {
    /// A table of `chunks` unpopulated chunks, with the persistent table `persistent` (as many
    /// chunks) of a VM in a zone. In hot-pluggable memory (`hotplug`) the chunks are unplugged,
    /// except those the zone records a frame for (plugged before this process).
    pub fn new(chunks: usize, persistent: Option<VmTable>, hotplug: bool) -> Self {
        debug_assert!(persistent.as_ref().is_none_or(|p| p.len() == chunks));
        let initial = |chunk| match persistent.as_ref().and_then(|p| p.frame(chunk)) {
            None if hotplug => UNPLUGGED,
            _ => EMPTY,
        };
        Self {
            entries: (0..chunks).map(|c| AtomicU64::new(initial(c))).collect(),
            persistent,
        }
    }

    /// Whether the table is persistent (its frames belong to a VM in a zone, not to this
    /// process).
    pub fn is_persistent(&self) -> bool {
        self.persistent.is_some()
    }

    /// The frame the persistent table records for `chunk` (held `BUSY` by the caller).
    pub fn persisted(&self, chunk: usize) -> Option<u64> {
        self.persistent.as_ref()?.frame(chunk)
    }

    /// Publishes `frame` for `chunk` (held `BUSY` by the caller) in the persistent table.
    pub fn persist(&self, chunk: usize, frame: u64) {
        if let Some(persistent) = &self.persistent {
            persistent.publish(chunk, frame);
        }
    }

    /// Unpublishes the frame of `chunk` (held `BUSY` by the caller) in the persistent table.
    pub fn unpersist(&self, chunk: usize) {
        if let Some(persistent) = &self.persistent {
            persistent.unpublish(chunk);
        }
    }

    /// The number of chunks.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The state of `chunk`.
    pub fn state(&self, chunk: usize) -> ChunkState {
        match self.entries[chunk].load(Ordering::Acquire) {
            EMPTY => ChunkState::Empty,
            BUSY => ChunkState::Busy,
            UNPLUGGED => ChunkState::Unplugged,
            FILE => ChunkState::File,
            entry => ChunkState::Mapped(entry - 1),
        }
    }

    /// Claims an unpopulated chunk for populating it.
    pub fn claim_empty(&self, chunk: usize) -> bool {
        self.entries[chunk]
            .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Claims an unplugged chunk for plugging it.
    pub fn claim_unplugged(&self, chunk: usize) -> bool {
        self.entries[chunk]
            .compare_exchange(UNPLUGGED, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Claims a chunk mapped from a memory file for unmapping it.
    pub fn claim_file(&self, chunk: usize) -> bool {
        self.entries[chunk]
            .compare_exchange(FILE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Claims a chunk mapped onto `frame` for changing or unmapping it.
    pub fn claim_mapped(&self, chunk: usize, frame: u64) -> bool {
        self.entries[chunk]
            .compare_exchange(frame + 1, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Publishes a claimed chunk as mapped onto `frame`.
    pub fn publish(&self, chunk: usize, frame: u64) {
        self.entries[chunk].store(frame + 1, Ordering::Release);
    }

    /// Publishes a claimed chunk as unpopulated.
    pub fn publish_empty(&self, chunk: usize) {
        self.entries[chunk].store(EMPTY, Ordering::Release);
    }

    /// Publishes a claimed chunk as mapped from a memory file.
    pub fn publish_file(&self, chunk: usize) {
        self.entries[chunk].store(FILE, Ordering::Release);
    }

    /// Publishes a claimed chunk as unplugged.
    pub fn publish_unplugged(&self, chunk: usize) {
        self.entries[chunk].store(UNPLUGGED, Ordering::Release);
    }

    /// Chunks backed by a frame: mapped now, or (a VM in a zone) recorded in the zone and mapped
    /// on first touch.
    pub fn populated(&self) -> usize {
        (0..self.len())
            .filter(|&c| {
                matches!(self.state(c), ChunkState::Mapped(_)) || self.persisted(c).is_some()
            })
            .count()
    }

    /// Chunks mapped from a memory file.
    pub fn file_backed(&self) -> usize {
        (0..self.len())
            .filter(|&c| self.state(c) == ChunkState::File)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_exclusive() {
        let table = FrameTable::new(2, None, false);
        assert!(table.claim_empty(1));
        assert!(!table.claim_empty(1));
        assert_eq!(table.state(1), ChunkState::Busy);
        table.publish(1, 0);
        assert_eq!(table.state(1), ChunkState::Mapped(0));
        assert!(!table.claim_mapped(1, 512));
        assert!(table.claim_mapped(1, 0));
        table.publish_empty(1);
        assert_eq!(table.populated(), 0);
    }

    #[test]
    fn hot_pluggable_chunks_start_unplugged_and_only_a_plug_claims_them() {
        let table = FrameTable::new(2, None, true);
        assert_eq!(table.state(0), ChunkState::Unplugged);
        assert!(!table.claim_empty(0));
        assert!(table.claim_unplugged(0));
        assert!(!table.claim_unplugged(0));
        table.publish(0, 512);
        assert_eq!(table.populated(), 1);
        assert!(table.claim_mapped(0, 512));
        table.publish_unplugged(0);
        assert_eq!(table.state(0), ChunkState::Unplugged);
        assert_eq!(table.populated(), 0);
    }
}
