//! Where the parts of a zone lie in its file, and the header that records it.
//!
//! ```text
//! 0            header (4 KiB): magic, version, the zone's parameters and offsets, the last
//!              recovery's results, a random identity; from 1 KiB the table of the processes
//!              that have the zone open (see `processes`)
//! 4 KiB        LLFree's persistent metadata (meta page, both levels, per-core slots)
//! dir          the VM directory: one 4 KiB slot per VM (name, RAM layout, owner, state)
//! owners       per frame, the VM chunk it backs (see `owners`): the frame tables' witness
//! tables       per slot: its persistent frame table (one u64 per chunk), then its balloon
//!              piece bitmaps (one bit per 4 KiB piece)
//! data         the frames, aligned to the frame size and the file system's page size
//! ```
//!
//! Every field is a little-endian `u64` read and written atomically through a shared mapping,
//! so that several processes may share a zone.

use std::sync::atomic::{AtomicU64, Ordering};

use llfree::{LLFree, FRAME_SIZE};

use crate::pool::FrameSize;

/// "LLFZONE1": the header of a complete zone.
pub const MAGIC: u64 = u64::from_le_bytes(*b"LLFZONE1");
/// "LLFZONE~": the header of a zone being created. Written (and synced) before anything else, it
/// is replaced by [`MAGIC`] as the last step: a zone whose creation was cut short is recognised
/// as such and never used.
pub const CREATING_MAGIC: u64 = u64::from_le_bytes(*b"LLFZONE~");
/// The layout version (2: the allocator's upper level and a process table are in the zone, so
/// that several VMM processes use it at once; 3: every frame records the VM chunk it backs, so
/// that recovery repairs a damaged frame-table entry or tells which memory it lost; 4: the
/// allocator's tree entries take a cache line each, which moves what follows them; 5: every
/// directory slot's words can be checked, so that damage to one is found).
pub const VERSION: u64 = 5;
/// Size of the header and of one directory slot.
pub const PAGE: u64 = 4096;
/// The most VMs one zone can hold.
pub const MAX_VMS: u64 = 1024;

/// The zone's header, at offset 0 of the file, seen through a shared mapping.
#[repr(C)]
#[derive(Debug)]
pub struct ZoneHeader {
    pub magic: AtomicU64,
    pub version: AtomicU64,
    /// LLFree order of the frames (9 or 18).
    pub frame_order: AtomicU64,
    /// 4 KiB frames in the data area.
    pub frames: AtomicU64,
    /// Directory slots.
    pub max_vms: AtomicU64,
    /// The page size the offsets were aligned to (the file system's).
    pub page_size: AtomicU64,
    pub meta_off: AtomicU64,
    pub meta_len: AtomicU64,
    pub dir_off: AtomicU64,
    pub tables_off: AtomicU64,
    /// Bytes of one slot's tables.
    pub slot_tables: AtomicU64,
    pub data_off: AtomicU64,
    /// Times the zone was opened.
    pub opens: AtomicU64,
    /// The last open's recovery: what it was ([`super::RecoveryKind`] as a number), frames it
    /// freed (leaked), frames it allocated again (lost), and how long it took.
    pub last_kind: AtomicU64,
    pub last_leaked: AtomicU64,
    pub last_lost: AtomicU64,
    pub last_nanos: AtomicU64,
    /// The zone's identity: random, set at creation (a snapshot names the zone it belongs to).
    pub id: [AtomicU64; 2],
    pub owners_off: AtomicU64,
    /// The last open's recovery, continued: table entries it repaired from their witness, VM
    /// chunks whose memory it could not tell (marked damaged), and frames with data nobody
    /// named.
    pub last_repaired: AtomicU64,
    pub last_damaged: AtomicU64,
    pub last_orphaned: AtomicU64,
}

/// The offsets of a zone's parts, computed from its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneLayout {
    pub frame_size: FrameSize,
    /// 4 KiB frames.
    pub frames: u64,
    pub max_vms: u64,
    pub page_size: u64,
    pub meta_off: u64,
    pub meta_len: u64,
    pub dir_off: u64,
    pub owners_off: u64,
    pub tables_off: u64,
    pub slot_tables: u64,
    pub data_off: u64,
}

impl ZoneLayout {
    /// The layout of a zone of `frames` 4 KiB frames of `frame_size` frames with `max_vms` slots,
    /// in a file whose pages are `page_size` bytes.
    pub fn new(frame_size: FrameSize, frames: u64, max_vms: u64, page_size: u64) -> Self {
        let meta_off = PAGE;
        let meta_len = LLFree::metadata_size(frames as usize) as u64;
        let dir_off = (meta_off + meta_len).next_multiple_of(PAGE);
        let owners_off = dir_off + max_vms * PAGE;
        let chunks = frames / frame_size.base_frames();
        let tables_off = owners_off + (chunks * 8).next_multiple_of(PAGE);
        let pieces_bytes = chunks * frame_size.base_frames() / 8;
        let slot_tables = (chunks * 8 + pieces_bytes).next_multiple_of(PAGE);
        let align = frame_size.bytes().max(page_size).max(2 << 20);
        let data_off = (tables_off + max_vms * slot_tables).next_multiple_of(align);
        Self {
            frame_size,
            frames,
            max_vms,
            page_size,
            meta_off,
            meta_len,
            dir_off,
            owners_off,
            tables_off,
            slot_tables,
            data_off,
        }
    }

    /// Chunks (frames of the zone's frame size) a VM's RAM may have: as many as the zone has.
    pub fn vm_chunks(&self) -> u64 {
        self.frames / self.frame_size.base_frames()
    }

    /// Bytes of frames.
    pub fn data_len(&self) -> u64 {
        self.frames * FRAME_SIZE as u64
    }

    /// Bytes of the whole zone.
    pub fn total_len(&self) -> u64 {
        self.data_off + self.data_len()
    }

    /// Writes every field but the magic into `header`.
    pub fn write(&self, header: &ZoneHeader) {
        let set = |field: &AtomicU64, value: u64| field.store(value, Ordering::Relaxed);
        set(&header.version, VERSION);
        set(&header.frame_order, self.frame_size.order().0 as u64);
        set(&header.frames, self.frames);
        set(&header.max_vms, self.max_vms);
        set(&header.page_size, self.page_size);
        set(&header.meta_off, self.meta_off);
        set(&header.meta_len, self.meta_len);
        set(&header.dir_off, self.dir_off);
        set(&header.owners_off, self.owners_off);
        set(&header.tables_off, self.tables_off);
        set(&header.slot_tables, self.slot_tables);
        set(&header.data_off, self.data_off);
        for field in [
            &header.opens,
            &header.last_kind,
            &header.last_leaked,
            &header.last_lost,
            &header.last_nanos,
            &header.last_repaired,
            &header.last_damaged,
            &header.last_orphaned,
        ] {
            set(field, 0);
        }
    }

    /// Reads the layout `header` records, checking that it is the one its parameters give.
    pub fn read(header: &ZoneHeader) -> Result<Self, &'static str> {
        let get = |field: &AtomicU64| field.load(Ordering::Relaxed);
        let frame_size = match get(&header.frame_order) {
            9 => FrameSize::Huge,
            18 => FrameSize::Giant,
            _ => return Err("frame order is neither 9 (2 MiB) nor 18 (1 GiB)"),
        };
        let (frames, max_vms, page_size) = (
            get(&header.frames),
            get(&header.max_vms),
            get(&header.page_size),
        );
        if frames == 0
            || !frames.is_multiple_of(frame_size.base_frames())
            || frames >= llfree::MAX_FRAMES as u64
        {
            return Err("frame count is zero, too large or not a multiple of the frame size");
        }
        if max_vms == 0 || max_vms > MAX_VMS {
            return Err("VM slot count is out of range");
        }
        if !page_size.is_power_of_two() || page_size > 1 << 30 {
            return Err("page size is not a power of two up to 1 GiB");
        }
        let layout = Self::new(frame_size, frames, max_vms, page_size);
        let recorded = [
            get(&header.meta_off),
            get(&header.meta_len),
            get(&header.dir_off),
            get(&header.owners_off),
            get(&header.tables_off),
            get(&header.slot_tables),
            get(&header.data_off),
        ];
        let computed = [
            layout.meta_off,
            layout.meta_len,
            layout.dir_off,
            layout.owners_off,
            layout.tables_off,
            layout.slot_tables,
            layout.data_off,
        ];
        if recorded != computed {
            return Err("recorded offsets differ from the layout its parameters give");
        }
        Ok(layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_do_not_overlap_and_frames_are_aligned() {
        for (size, frames, page) in [
            (FrameSize::Huge, 512 * 8, 4096),
            (FrameSize::Huge, 1 << 22, 2 << 20),
            (FrameSize::Giant, 1 << 19, 1 << 30),
        ] {
            let l = ZoneLayout::new(size, frames, 16, page);
            assert!(l.meta_off + l.meta_len <= l.dir_off);
            assert!(l.dir_off + 16 * PAGE <= l.owners_off);
            assert!(l.owners_off + l.vm_chunks() * 8 <= l.tables_off);
            assert!(l.tables_off + 16 * l.slot_tables <= l.data_off);
            assert!(l.data_off.is_multiple_of(size.bytes().max(page)));
            let chunks = frames / size.base_frames();
            assert!(l.slot_tables >= chunks * 8 + chunks * size.base_frames() / 8);
        }
    }
}
