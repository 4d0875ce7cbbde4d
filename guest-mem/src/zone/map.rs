//! The shared mapping of a zone's metadata (everything before its frames), and typed views into
//! it: the header, LLFree's region, directory slots and per-VM word arrays.

use std::io;
use std::ops::Deref;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use llfree::MetaRegion;

use super::layout::{ZoneHeader, ZoneLayout};
use crate::pool::BackingFile;
use crate::sys::mmap::{self, Mapping};

/// A `MAP_SHARED` mapping of the metadata part of a zone file.
#[derive(Debug)]
pub struct ZoneMap {
    map: Mapping,
    durability: mmap::Durability,
}

impl ZoneMap {
    /// Maps the first `len` bytes (a multiple of the file's page size) of the file `fd`; with
    /// `map_sync` (a file on DAX) with MAP_SYNC, so that metadata stores need no msync; its
    /// stores are made durable `durability`'s way.
    pub fn new(
        fd: RawFd,
        len: u64,
        map_sync: bool,
        durability: mmap::Durability,
    ) -> io::Result<Self> {
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        let map = match map_sync {
            true => Mapping::shared_file_sync(fd, 0, len)?,
            false => Mapping::shared_file(fd, 0, len)?,
        };
        Ok(Self { map, durability })
    }

    /// Maps the first `len` bytes of the zone file `file`, as [`Self::new`] does with its
    /// MAP_SYNC support and durability.
    pub fn of_file(file: &BackingFile, len: u64) -> io::Result<Self> {
        Self::new(file.raw_fd(), len, file.map_sync, file.durability)
    }

    /// The header at offset 0.
    pub fn header(&self) -> &ZoneHeader {
        // SAFETY: the mapping is at least one page long and page-aligned; `ZoneHeader` consists of
        // atomics (valid for any bits) and is smaller than a page.
        unsafe { &*(self.map.addr() as *const ZoneHeader) }
    }

    /// `count` words at byte offset `offset` (8-byte aligned, inside the mapping).
    pub fn words(&self, offset: u64, count: u64) -> &[AtomicU64] {
        let end = offset + count * 8;
        assert!(
            offset.is_multiple_of(8) && end <= self.map.len() as u64,
            "zone words {offset}+{count} outside the metadata mapping"
        );
        // SAFETY: checked to lie inside the mapping, aligned; atomics are valid for any bits.
        unsafe { std::slice::from_raw_parts((self.map.addr() + offset as usize) as _, count as _) }
    }

    /// Writes the range `[offset, offset + len)` back to the file (msync; on a device DAX, a
    /// flush of the CPU caches), so that it survives a crash of the host, not only of the
    /// process.
    pub fn sync(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = (offset + len).min(self.map.len() as u64);
        let (addr, len) = (self.map.addr() + offset as usize, (end - offset) as usize);
        mmap::sync(addr, len, self.durability)
    }

    /// Zeroes the byte range `[offset, offset + len)` (8-byte aligned) through the mapping.
    pub fn zero(&self, offset: u64, len: u64) {
        for word in self.words(offset, len / 8) {
            word.store(0, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// LLFree's metadata region inside a zone mapping.
#[derive(Debug)]
pub struct ZoneMetaRegion {
    map: Arc<ZoneMap>,
    layout: ZoneLayout,
}

impl ZoneMetaRegion {
    /// The region of `layout` in `map`.
    pub fn new(map: Arc<ZoneMap>, layout: ZoneLayout) -> Self {
        Self { map, layout }
    }
}

// SAFETY: the region lies inside the mapping (the layout was checked against the file and the
// mapping covers everything before the data), which the region keeps alive; only the allocator
// accesses it.
unsafe impl MetaRegion for ZoneMetaRegion {
    fn as_ptr(&self) -> *mut u8 {
        (self.map.map.addr() + self.layout.meta_off as usize) as *mut u8
    }
    fn len(&self) -> usize {
        self.layout.meta_len as usize
    }
}

/// Words of a zone's metadata that outlive the borrow of the zone: a VM's frame table or piece
/// bitmaps, keeping the mapping alive.
#[derive(Debug)]
pub struct ZoneWords {
    words: *const AtomicU64,
    count: usize,
    _map: Arc<ZoneMap>,
}

// SAFETY: the words are atomics in a shared mapping that `_map` keeps alive.
unsafe impl Send for ZoneWords {}
// SAFETY: as above.
unsafe impl Sync for ZoneWords {}

impl ZoneWords {
    /// `count` words at `offset` of `map` (checked to lie inside it).
    pub fn new(map: Arc<ZoneMap>, offset: u64, count: u64) -> Self {
        let slice = map.words(offset, count);
        let (words, count) = (slice.as_ptr(), slice.len());
        Self {
            words,
            count,
            _map: map,
        }
    }
}

impl Deref for ZoneWords {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: `new` checked the range against the mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.words, self.count) }
    }
}
