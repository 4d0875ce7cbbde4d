//! The persistent meta page and the layout of a metadata region.
//!
//! A persistent region starts with one 4 KiB meta page (magic, layout version, frame count and a
//! running/clean marker), followed by the lower level (the child entries, one cache line per tree,
//! and the bitfields, one cache line per child) and the upper level (the tree entries, one cache
//! line each; per-core slots of two cache lines each; and one owner word per slot). A volatile
//! region has the same layout without the meta page.
//!
//! A persistent region always has [`PERSISTENT_SLOTS`] slots, so that its size does not depend on
//! the cores of whoever opens it; processes that share it claim slots of their own.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lower::Lower;
use crate::upper::trees::ENTRY_SIZE;
use crate::{InitError, CHILD_FRAMES, TREE_CHILDREN};

/// Size of the meta page.
pub const META_SIZE: usize = 4096;
/// "LLFREE" followed by two zero bytes, little endian.
const MAGIC: u64 = u64::from_le_bytes(*b"LLFREE\0\0");
/// Version of the persistent layout (2: the upper level is part of the region; 3: tree counters
/// are biased, so that they can be negative; 4: one tree entry per cache line).
pub const VERSION: u32 = 4;
/// Per-core slots of a persistent region.
pub const PERSISTENT_SLOTS: usize = 256;
/// Bytes of one per-core slot.
const SLOT_SIZE: usize = 128;
const _: () = assert!(
    std::mem::size_of::<crate::upper::local::Local>() == SLOT_SIZE
        && std::mem::align_of::<crate::upper::local::Local>() <= crate::region::REGION_ALIGN
);
/// Marker: the allocator was shut down cleanly.
const CLEAN: u64 = 0xC1EA_C1EA_C1EA_C1EA;
/// Marker: the allocator is (or was, at a crash) running.
const RUNNING: u64 = 0x5151_5151_5151_5151;

/// Offsets of the metadata inside a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Offset of the child entries.
    pub pairs: usize,
    /// Offset of the bitfields.
    pub fields: usize,
    /// Offset of the tree entries.
    pub trees: usize,
    /// Offset of the per-core slots.
    pub locals: usize,
    /// Offset of the slots' owner words.
    pub owners: usize,
    /// Number of per-core slots.
    pub slots: usize,
    /// Total size of the region.
    pub size: usize,
}

impl Layout {
    /// The layout for `frames` frames and `slots` per-core slots, with or without a meta page.
    pub fn new(frames: usize, with_meta: bool, slots: usize) -> Self {
        let children = frames.div_ceil(CHILD_FRAMES);
        let pairs = if with_meta { META_SIZE } else { 0 };
        let fields = pairs + Lower::pairs_size(children);
        let trees = fields + Lower::fields_size(children);
        let locals = trees + children.div_ceil(TREE_CHILDREN) * ENTRY_SIZE;
        let owners = locals + slots * SLOT_SIZE;
        Self {
            pairs,
            fields,
            trees,
            locals,
            owners,
            slots,
            size: owners + (slots * 8).div_ceil(64) * 64,
        }
    }
}

/// The meta page at the start of a persistent region.
#[repr(C)]
#[derive(Debug)]
pub struct Meta {
    magic: AtomicU64,
    version: AtomicU64,
    frames: AtomicU64,
    state: AtomicU64,
}

impl Meta {
    /// Invalidates the page before a fresh initialisation, so that a crash during it is detected.
    pub fn invalidate(&self) {
        self.magic.store(0, Ordering::Release);
    }

    /// Writes a valid page for `frames` frames; the magic is written last.
    pub fn format(&self, frames: usize) {
        self.version.store(VERSION.into(), Ordering::Relaxed);
        self.frames.store(frames as u64, Ordering::Relaxed);
        self.state.store(RUNNING, Ordering::Relaxed);
        self.magic.store(MAGIC, Ordering::Release);
    }

    /// Checks the page against `frames`; returns whether the last shutdown was clean.
    pub fn check(&self, frames: usize) -> Result<bool, InitError> {
        let magic = self.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(InitError::BadMagic { found: magic });
        }
        let version = self.version.load(Ordering::Relaxed);
        if version != u64::from(VERSION) {
            return Err(InitError::Version {
                found: u32::try_from(version).unwrap_or(u32::MAX),
                expected: VERSION,
            });
        }
        let found = self.frames.load(Ordering::Relaxed);
        if found != frames as u64 {
            return Err(InitError::Size {
                found,
                expected: frames as u64,
            });
        }
        match self.state.load(Ordering::Relaxed) {
            CLEAN => Ok(true),
            RUNNING => Ok(false),
            _ => Err(InitError::Corrupted {
                what: "shutdown marker",
                index: 0,
            }),
        }
    }

    /// Marks the allocator as running (a crash from now on needs a deep recovery).
    pub fn mark_running(&self) {
        self.state.store(RUNNING, Ordering::Release);
    }

    /// Marks a clean shutdown.
    pub fn mark_clean(&self) {
        self.state.store(CLEAN, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Meta {
        Meta {
            magic: AtomicU64::new(0),
            version: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            state: AtomicU64::new(0),
        }
    }

    #[test]
    fn layout_has_a_cache_line_per_tree_and_child() {
        let layout = Layout::new(1 << 20, true, PERSISTENT_SLOTS);
        assert_eq!(layout.pairs, META_SIZE);
        assert_eq!(layout.fields, META_SIZE + 64 * 64);
        assert_eq!(layout.trees, layout.fields + 2048 * 64);
        assert_eq!(
            layout.locals,
            layout.trees + 64 * 64,
            "64 trees: a line each"
        );
        assert_eq!(layout.owners, layout.locals + 256 * 128);
        assert_eq!(layout.size, layout.owners + 256 * 8);
        let small = Layout::new(512, false, 1);
        assert_eq!(small.size, 64 + 64 + 64 + 128 + 64);
    }

    #[test]
    fn format_then_check() {
        let meta = page();
        assert_eq!(meta.check(512), Err(InitError::BadMagic { found: 0 }));
        meta.format(512);
        assert_eq!(meta.check(512), Ok(false));
        meta.mark_clean();
        assert_eq!(meta.check(512), Ok(true));
        assert_eq!(
            meta.check(1024),
            Err(InitError::Size {
                found: 512,
                expected: 1024
            })
        );
        meta.version.store(7, Ordering::Relaxed);
        assert!(matches!(
            meta.check(512),
            Err(InitError::Version { found: 7, .. })
        ));
        meta.version.store(VERSION.into(), Ordering::Relaxed);
        meta.state.store(3, Ordering::Relaxed);
        assert!(matches!(meta.check(512), Err(InitError::Corrupted { .. })));
        meta.invalidate();
        assert!(matches!(meta.check(512), Err(InitError::BadMagic { .. })));
    }
}
