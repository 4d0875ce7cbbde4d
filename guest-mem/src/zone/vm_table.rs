//! A VM's persistent frame table and the zone's owner map, which witness each other.
//!
//! A VM's frame table has one word per chunk: [`EMPTY`], `frame + 1` (the chunk's memory is that
//! frame, a first 4 KiB frame number), or [`DAMAGED`] (recovery could not tell which frame held
//! the chunk's memory: see `recovery`). The zone's owner map has one word per frame: 0, or the
//! VM chunk the frame backs as `(slot + 1) << 32 | chunk`.
//!
//! A frame's owner is written before its entry, and cleared after it: a frame is allocated,
//! owned, published, mapped; and unmapped, scrubbed, unpublished, disowned, freed. Every crash
//! thus leaves an entry with its owner, or an owner without entry whose frame holds zeroes;
//! anything else is damage, which recovery repairs from the other word where one is intact.

use std::sync::atomic::{AtomicU64, Ordering};

use super::ZoneWords;

/// A chunk without a frame.
pub const EMPTY: u64 = 0;
/// A chunk whose memory recovery lost: the VM is refused until the loss is accepted.
pub const DAMAGED: u64 = 1 << 63;

/// The VM chunk a frame backs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    /// The VM's directory slot.
    pub slot: u64,
    /// The chunk in the VM's frame table (all regions, in order).
    pub chunk: u64,
}

impl Owner {
    /// The owner word of this chunk.
    pub fn word(self) -> u64 {
        (self.slot + 1) << 32 | self.chunk
    }

    /// The chunk an owner word names, `None` for 0.
    pub fn from_word(word: u64) -> Option<Self> {
        let slot = (word >> 32).checked_sub(1)?;
        Some(Self {
            slot,
            chunk: word & u64::from(u32::MAX),
        })
    }
}

/// The frame an entry names: `None` for [`EMPTY`], [`DAMAGED`] or a value that is no frame of
/// the zone (aligned to `base_frames`, below `frames`).
pub fn entry_frame(entry: u64, base_frames: u64, frames: u64) -> Option<u64> {
    let frame = entry.checked_sub(1)?;
    (entry != DAMAGED && frame.is_multiple_of(base_frames) && frame < frames).then_some(frame)
}

/// One region's part of a VM's persistent frame table, with the owner map, as a VM's guest
/// memory changes them: only the thread that holds a chunk (in the process's own table) does.
#[derive(Debug)]
pub struct VmTable {
    entries: ZoneWords,
    owners: ZoneWords,
    /// The owner of the region's first chunk.
    first: Owner,
    /// 4 KiB frames per frame of the zone.
    base_frames: u64,
}

impl VmTable {
    /// The table `entries` of a region whose first chunk is `first`, with the zone's `owners`.
    pub(super) fn new(
        entries: ZoneWords,
        owners: ZoneWords,
        first: Owner,
        base_frames: u64,
    ) -> Self {
        Self {
            entries,
            owners,
            first,
            base_frames,
        }
    }

    /// Chunks of the region.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The frame recorded for `chunk`.
    pub fn frame(&self, chunk: usize) -> Option<u64> {
        let frames = self.owners.len() as u64 * self.base_frames;
        entry_frame(
            self.entries[chunk].load(Ordering::Acquire),
            self.base_frames,
            frames,
        )
    }

    fn owner(&self, frame: u64) -> &AtomicU64 {
        &self.owners[(frame / self.base_frames) as usize]
    }

    /// Records `frame` (just allocated) as `chunk`'s: its owner first, then the entry.
    pub fn publish(&self, chunk: usize, frame: u64) {
        let owner = Owner {
            chunk: self.first.chunk + chunk as u64,
            ..self.first
        };
        self.owner(frame).store(owner.word(), Ordering::Release);
        self.entries[chunk].store(frame + 1, Ordering::Release);
    }

    /// Removes `chunk`'s frame (scrubbed, about to be freed): the entry first, then its owner.
    pub fn unpublish(&self, chunk: usize) {
        let entry = self.entries[chunk].swap(EMPTY, Ordering::AcqRel);
        let frames = self.owners.len() as u64 * self.base_frames;
        if let Some(frame) = entry_frame(entry, self.base_frames, frames) {
            self.owner(frame).store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_words_round_trip_and_zero_is_nobody() {
        let owner = Owner {
            slot: 1023,
            chunk: u64::from(u32::MAX),
        };
        assert_eq!(Owner::from_word(owner.word()), Some(owner));
        let first = Owner { slot: 0, chunk: 0 };
        assert_ne!(first.word(), 0);
        assert_eq!(Owner::from_word(0), None);
    }

    #[test]
    fn only_aligned_frames_inside_the_zone_are_entries() {
        assert_eq!(entry_frame(EMPTY, 512, 4096), None);
        assert_eq!(entry_frame(DAMAGED, 512, 4096), None);
        assert_eq!(entry_frame(513, 512, 4096), Some(512));
        assert_eq!(entry_frame(514, 512, 4096), None);
        assert_eq!(entry_frame(4097, 512, 4096), None);
    }
}
