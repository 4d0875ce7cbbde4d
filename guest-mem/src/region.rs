//! One guest RAM region: a contiguous host virtual range made of chunks, each unpopulated (an
//! anonymous placeholder registered with userfaultfd), mapped onto exactly one pool frame, or
//! mapped privately from a copy snapshot's memory file (loaded by mapping).
//! In hot-pluggable memory (virtio-mem) a chunk may also be unplugged: an inaccessible
//! (PROT_NONE) reservation that nothing populates until it is plugged.

use std::io;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use llfree::FRAME_SIZE;
use thiserror::Error;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::GuestAddress;

use crate::frame_table::{ChunkState, FrameTable};
use crate::pieces::PieceMap;
use crate::pool::{CoreFrames, Frame, FrameSize};
use crate::shared::SharedState;
use crate::sys::mmap::{self, Mapping};
use crate::sys::uffd::{Uffd, UffdError};
use crate::zone::{VmTable, ZoneWords};

mod ahead;
mod clone_base;
mod hotplug;
mod recorded;
mod repopulate;
mod run;

pub(crate) use repopulate::Repopulation;
use run::FrameRun;

/// Errors of populating and discarding chunks.
#[derive(Debug, Error)]
pub enum RegionError {
    /// Reserving the host address range failed.
    #[error("cannot reserve {len:#x} bytes of host address space: {source}")]
    Reserve {
        /// Bytes requested.
        len: u64,
        /// The mmap error.
        #[source]
        source: io::Error,
    },
    /// The pool has no free frame.
    #[error("guest memory pool exhausted: no free {0} frame")]
    Exhausted(&'static str),
    /// Mapping a frame over a chunk failed.
    #[error("cannot map a pool frame over guest chunk {chunk}: {source}")]
    MapFrame {
        /// The chunk.
        chunk: usize,
        /// The mmap error.
        #[source]
        source: io::Error,
    },
    /// Mapping the placeholder over a chunk failed.
    #[error("cannot unmap guest chunk {chunk}: {source}")]
    Placeholder {
        /// The chunk.
        chunk: usize,
        /// The mmap error.
        #[source]
        source: io::Error,
    },
    /// Faulting in the pages of a chunk mapped eagerly failed.
    #[error("cannot prefault guest chunk {chunk}: {source}")]
    Prefault {
        /// The chunk.
        chunk: usize,
        /// The madvise error.
        #[source]
        source: io::Error,
    },
    /// Registering a placeholder with userfaultfd failed.
    #[error(transparent)]
    Register(#[from] UffdError),
    /// Releasing pieces of a chunk to the host failed.
    #[error("cannot punch pieces of guest chunk {chunk}: {source}")]
    Punch {
        /// The chunk.
        chunk: usize,
        /// The fallocate error.
        #[source]
        source: io::Error,
    },
    /// The chunk is hot-pluggable memory that is not plugged.
    #[error("guest chunk {chunk} is not plugged")]
    Unplugged {
        /// The chunk.
        chunk: usize,
    },
    /// Plugging a chunk that is plugged already.
    #[error("guest chunk {chunk} is plugged already")]
    Plugged {
        /// The chunk.
        chunk: usize,
    },
    /// Making an unplugged chunk inaccessible failed.
    #[error("cannot make guest chunk {chunk} inaccessible: {source}")]
    Protect {
        /// The chunk.
        chunk: usize,
        /// The mmap error.
        #[source]
        source: io::Error,
    },
    /// A chunk to be mapped from a memory file was populated already.
    #[error("guest chunk {chunk} is populated: a memory file maps only over unpopulated memory")]
    NotEmpty {
        /// The chunk.
        chunk: usize,
    },
    /// Mapping a memory file over a region failed.
    #[error("cannot map the memory file over guest memory: {source}")]
    MapFile {
        /// The mmap error.
        #[source]
        source: io::Error,
    },
    /// Mapping guest memory for a page-fault handler of another process failed.
    #[error("cannot map guest memory for the page-fault handler: {source}")]
    MapForHandler {
        /// The mmap, register or check error.
        #[source]
        source: io::Error,
    },
    /// Writing a range back to its backing failed.
    #[error("cannot write guest memory back to its backing: {0}")]
    Sync(#[source] io::Error),
    /// Scrubbing or freeing a frame failed; the frame is kept out of the pool.
    #[error("cannot scrub frame {frame}: {source}")]
    Scrub {
        /// The first 4 KiB frame number.
        frame: u64,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// A guest RAM region backed by pool frames.
#[derive(Debug)]
pub struct GuestRegion {
    start: GuestAddress,
    host: Mapping,
    chunk: FrameSize,
    table: FrameTable,
    pieces: PieceMap,
    /// Hot-pluggable memory: its chunks are plugged and unplugged one by one.
    hotplug: bool,
    /// The 4 KiB pages the VMM wrote or gave back since the last look, when dirty pages are
    /// tracked (see [`crate::dirty`]).
    pub(crate) dirty: Option<AtomicBitmap>,
    pub(crate) shared: Arc<SharedState>,
}

impl GuestRegion {
    /// Reserves the host range (aligned to the chunk size, like the guest address), maps the
    /// placeholder over it and registers it with userfaultfd.
    /// A VM in a zone passes its persistent frame table and piece bitmaps for the region.
    /// Hot-pluggable memory (`hotplug`) starts unplugged, but for the chunks a zone records
    /// frames for.
    pub(crate) fn new(
        start: GuestAddress,
        len: u64,
        chunk: FrameSize,
        shared: Arc<SharedState>,
        persistent: Option<(VmTable, ZoneWords)>,
        hotplug: bool,
        track_dirty_pages: bool,
    ) -> Result<Self, RegionError> {
        let reserve_err = |source| RegionError::Reserve { len, source };
        let host =
            Mapping::placeholder(len as usize, chunk.bytes() as usize).map_err(reserve_err)?;
        shared.uffd.register(host.addr(), host.len())?;
        let chunks = (len / chunk.bytes()) as usize;
        let pieces = (chunk.bytes() / FRAME_SIZE as u64) as usize;
        let (table, piece_words) = persistent.unzip();
        let region = Self {
            start,
            host,
            chunk,
            table: FrameTable::new(chunks, table, hotplug),
            pieces: PieceMap::new(chunks, pieces, piece_words),
            hotplug,
            dirty: track_dirty_pages.then(|| {
                AtomicBitmap::new(len as usize, NonZeroUsize::new(FRAME_SIZE).expect("4 KiB"))
            }),
            shared,
        };
        let unplugged = |chunk| region.table.state(chunk) == ChunkState::Unplugged;
        let mut chunk = 0;
        while chunk < chunks {
            let end = (chunk..chunks).find(|&c| !unplugged(c)).unwrap_or(chunks);
            if end > chunk {
                region.make_inaccessible(chunk..end)?;
            }
            chunk = end + 1;
        }
        Ok(region)
    }

    /// Whether this is hot-pluggable memory.
    pub fn is_hotplug(&self) -> bool {
        self.hotplug
    }

    /// Whether `chunk` is plugged: always outside hot-pluggable memory.
    pub fn is_plugged(&self, chunk: usize) -> bool {
        self.table.state(chunk) != ChunkState::Unplugged
    }

    /// Scrubs the frames of claimed `run`, which the guest cannot reach any more (one call),
    /// unpublishes each, frees it with `core` (a crash in between leaves a clean frame
    /// referenced by no VM, which recovery frees) and publishes its chunk with `publish`;
    /// returns how many were freed. Frames that cannot be scrubbed are kept, and their chunks
    /// put back with `keep`.
    fn give_back_frames(
        &self,
        run: FrameRun,
        core: &mut CoreFrames,
        publish: impl Fn(usize),
        keep: impl Fn(usize),
    ) -> Result<usize, RegionError> {
        let pool = &self.shared.pool;
        if let Err(source) = pool.scrub_frames(run.first, run.len as u64) {
            run.chunks().for_each(keep);
            return Err(RegionError::Scrub {
                frame: run.first.index,
                source,
            });
        }
        let (mut freed, mut failed) = (0, None);
        for (chunk, frame) in run.frames() {
            self.table.unpersist(chunk);
            match core.free(frame) {
                Ok(()) => freed += 1,
                Err(e) => {
                    failed.get_or_insert(RegionError::Scrub {
                        frame: frame.index,
                        source: io::Error::other(e),
                    });
                }
            }
            publish(chunk);
        }
        failed.map_or(Ok(freed), Err)
    }

    /// The guest physical address of the first byte.
    pub fn start(&self) -> GuestAddress {
        self.start
    }

    /// The size in bytes.
    pub fn size(&self) -> u64 {
        self.host.len() as u64
    }

    /// The host virtual address of the first byte (for a KVM memslot).
    pub fn host_addr(&self) -> usize {
        self.host.addr()
    }

    /// The chunk (and frame) size.
    pub fn chunk_size(&self) -> FrameSize {
        self.chunk
    }

    /// The chunk-to-frame table.
    pub(crate) fn table(&self) -> &FrameTable {
        &self.table
    }

    /// The given-away piece bitmaps.
    pub(crate) fn pieces(&self) -> &PieceMap {
        &self.pieces
    }

    /// The pool frame behind byte `offset` of the region, if populated.
    pub fn frame_at(&self, offset: u64) -> Option<Frame> {
        if offset >= self.size() {
            return None;
        }
        let chunk = (offset / self.chunk.bytes()) as usize;
        let index = match self.table.state(chunk) {
            ChunkState::Mapped(index) => index,
            // A VM in a zone: its frame, not mapped in this process yet (see `recorded`).
            ChunkState::Empty => self.table.persisted(chunk)?,
            ChunkState::Busy | ChunkState::Unplugged | ChunkState::File => return None,
        };
        Some(Frame {
            index,
            size: self.chunk,
        })
    }

    /// Whether byte `offset` of the region lies in a chunk mapped from a memory file.
    pub fn is_file_backed(&self, offset: u64) -> bool {
        offset < self.size()
            && self.table.state((offset / self.chunk.bytes()) as usize) == ChunkState::File
    }

    /// The chunk holding host address `addr`.
    pub(crate) fn chunk_of_host(&self, addr: usize) -> Option<usize> {
        let offset = addr.checked_sub(self.host.addr())?;
        (offset < self.host.len()).then(|| offset / self.chunk.bytes() as usize)
    }

    /// The host address of `chunk` and its length.
    pub(crate) fn chunk_range(&self, chunk: usize) -> (usize, usize) {
        let len = self.chunk.bytes() as usize;
        (self.host.addr() + chunk * len, len)
    }

    /// Waits until `chunk` is not busy and claims it with `claim`; returns the state seen.
    fn claim(&self, chunk: usize, want_mapped: bool) -> ChunkState {
        loop {
            let state = self.table.state(chunk);
            let claimed = match state {
                ChunkState::Busy => {
                    std::thread::yield_now();
                    continue;
                }
                ChunkState::Empty if !want_mapped => self.table.claim_empty(chunk),
                ChunkState::Mapped(f) if want_mapped => self.table.claim_mapped(chunk, f),
                other => return other,
            };
            if claimed {
                return state;
            }
        }
    }

    /// Makes sure `chunk` is backed by a frame, allocating it with the calling thread's `core`.
    /// Returns `true` when this call mapped a new frame, `false` when the chunk was populated
    /// already.
    pub(crate) fn populate(
        &self,
        chunk: usize,
        core: &mut CoreFrames,
    ) -> Result<bool, RegionError> {
        match self.claim(chunk, false) {
            ChunkState::Mapped(_) | ChunkState::File => return Ok(false),
            ChunkState::Unplugged => return Err(RegionError::Unplugged { chunk }),
            _ => {}
        }
        if let Some(index) = self.table.persisted(chunk) {
            // A VM in a zone: the frame it had before this process.
            let frame = Frame {
                index,
                size: self.chunk,
            };
            return self.map_claimed(chunk, frame).map(|()| true);
        }
        let Some(frame) = core.alloc(self.chunk) else {
            self.table.publish_empty(chunk);
            return Err(RegionError::Exhausted(self.chunk.name()));
        };
        // Allocate, then publish: a crash in between leaves a frame that the zone's recovery
        // finds referenced by no VM, and frees.
        self.table.persist(chunk, frame.index);
        if let Err(e) = self.map_claimed(chunk, frame) {
            // The frame never held guest data; unpublish it and give it back as it is.
            self.table.unpersist(chunk);
            let _ = core.free(frame);
            return Err(e);
        }
        Ok(true)
    }

    /// Makes sure `chunk` is backed by a frame, allocating it as [`GuestRegion::populate`] does,
    /// and faults all its pages in, so that neither the guest nor KVM waits for the host when
    /// they first touch it (eager population: the kernel allocates and zeroes the pages now).
    pub(crate) fn populate_and_prefault(
        &self,
        chunk: usize,
        core: &mut CoreFrames,
    ) -> Result<(), RegionError> {
        self.populate(chunk, core)?;
        let (addr, len) = self.chunk_range(chunk);
        // SAFETY: the chunk is mapped read/write onto a pool frame, whose pages the pool provides
        // (reserved hugetlb pages, a memfd, a file of the pool's size; only a sparse pool file on
        // a full file system could fail, and then MADV_POPULATE_WRITE returns an error). Eager
        // population runs while the memory is being built: nobody else can write to it yet.
        unsafe { mmap::prefault(addr, len) }
            .map_err(|source| RegionError::Prefault { chunk, source })
    }

    /// Maps a frame that a snapshot names over an unpopulated chunk (restore); an unplugged
    /// one is plugged with it.
    pub(crate) fn adopt(&self, chunk: usize, frame: Frame) -> Result<(), RegionError> {
        if self.table.claim_unplugged(chunk) {
            return self.map_claimed(chunk, frame);
        }
        match self.claim(chunk, false) {
            ChunkState::Empty => self.map_claimed(chunk, frame),
            _ => Ok(()),
        }
    }

    /// Maps the whole region privately from `fd` at `offset` (a copy snapshot's memory file,
    /// loaded by mapping): nothing is copied, and the page cache of the file holds the guest's
    /// memory, shared with every VM loaded from it, until the guest writes a page. Every chunk
    /// must be unpopulated; they are then file-backed ([`ChunkState::File`]).
    pub(crate) fn map_file(&self, fd: std::os::fd::RawFd, offset: u64) -> Result<(), RegionError> {
        self.claim_all_empty()?;
        // SAFETY: the range is this region's, every chunk claimed by us and unpopulated: the
        // placeholder holds nothing anyone relies on. The new mapping is not registered with
        // userfaultfd: the kernel serves its faults from the file.
        let mapped = unsafe {
            mmap::map_private_fixed(self.host.addr(), self.host.len(), fd, offset, false)
        };
        self.publish_kernel_served(mapped.map_err(|source| RegionError::MapFile { source }))
    }

    /// Maps the whole region as fresh private anonymous memory (of 2 MiB huge pages on a
    /// hugetlbfs pool) registered with `uffd`, whose faults a handler of another process serves
    /// (Firecracker's Uffd backend); returns the page size the handler copies in. Every chunk
    /// must be unpopulated; they are then the kernel's and the handler's
    /// ([`ChunkState::File`]), never a pool frame.
    pub(crate) fn map_for_handler(&self, uffd: &Uffd) -> Result<u64, RegionError> {
        let huge = self.shared.pool.is_hugetlb();
        let page_size = if huge { 2 << 20 } else { 4096 };
        if huge && self.chunk_size().bytes() != page_size {
            return Err(RegionError::MapForHandler {
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a page-fault handler serves 4 KiB pages or 2 MiB huge pages only",
                ),
            });
        }
        self.claim_all_empty()?;
        let (addr, len) = (self.host.addr(), self.host.len());
        // SAFETY: as in `map_file`; the new mapping is registered with the handler's
        // userfaultfd only, not with this process's.
        let mapped = unsafe { mmap::map_anonymous_fixed(addr, len, huge) }
            .and_then(|()| uffd.register(addr, len).map_err(io::Error::other));
        self.publish_kernel_served(mapped.map_err(|source| RegionError::MapForHandler { source }))?;
        Ok(page_size)
    }

    /// Claims every chunk, which must all be unpopulated (none is claimed otherwise).
    fn claim_all_empty(&self) -> Result<(), RegionError> {
        for chunk in 0..self.table.len() {
            if !self.table.claim_empty(chunk) {
                for claimed in 0..chunk {
                    self.table.publish_empty(claimed);
                }
                return Err(RegionError::NotEmpty { chunk });
            }
        }
        Ok(())
    }

    /// Publishes every chunk, all claimed, as the kernel's ([`ChunkState::File`]) once
    /// `mapped` says the region's new mapping is in place, or unpopulated again if not.
    fn publish_kernel_served(&self, mapped: Result<(), RegionError>) -> Result<(), RegionError> {
        let chunks = self.table.len();
        match mapped {
            Ok(()) => {
                (0..chunks).for_each(|chunk| self.table.publish_file(chunk));
                Ok(())
            }
            Err(error) => {
                (0..chunks).for_each(|chunk| self.publish_empty_behind_placeholder(chunk));
                Err(error)
            }
        }
    }

    /// Maps `frame` over claimed `chunk` and publishes it; on failure the chunk is put back to a
    /// registered placeholder and published unpopulated.
    fn map_claimed(&self, chunk: usize, frame: Frame) -> Result<(), RegionError> {
        let (addr, _) = self.chunk_range(chunk);
        let started = Instant::now();
        // SAFETY: the chunk belongs to this region and is claimed by us; it holds a placeholder.
        match unsafe { self.shared.pool.map_frame(frame, addr) } {
            Ok(()) => {
                self.shared.counters.frame_map.record(started.elapsed());
                self.table.publish(chunk, frame.index);
                Ok(())
            }
            Err(source) => {
                self.publish_empty_behind_placeholder(chunk);
                Err(RegionError::MapFrame { chunk, source })
            }
        }
    }

    /// Publishes claimed `chunk` unpopulated behind a fresh placeholder, after a MAP_FIXED
    /// over it failed (which may have removed the old one).
    fn publish_empty_behind_placeholder(&self, chunk: usize) {
        let restored = self.restore_placeholder(chunk);
        debug_assert!(
            restored.is_ok(),
            "cannot restore chunk {chunk}: {restored:?}"
        );
        self.table.publish_empty(chunk);
    }

    /// Maps the frames of `run`, whose chunks the caller has claimed and which hold no frame
    /// (a placeholder or the inaccessible reservation), over its chunks with one call and
    /// publishes them. On failure nothing is published: the caller gives the frames back.
    fn map_run(&self, run: FrameRun) -> Result<(), RegionError> {
        let (addr, _) = self.chunk_range(run.chunk);
        // SAFETY: the chunks belong to this region and are claimed by the caller; nothing the
        // guest keeps lives in them.
        unsafe { self.shared.pool.map_frames(run.first, run.len as u64, addr) }.map_err(
            |source| RegionError::MapFrame {
                chunk: run.chunk,
                source,
            },
        )?;
        for (chunk, frame) in run.frames() {
            self.table.publish(chunk, frame.index);
        }
        Ok(())
    }

    /// Frees the frames of claimed `run`, fresh ones that never held data, with `core`, and
    /// removes them from the zone's record of the VM; its chunks stay claimed.
    fn free_fresh_frames(&self, run: FrameRun, core: &mut CoreFrames) {
        for (chunk, frame) in run.frames() {
            self.table.unpersist(chunk);
            let _ = core.free(frame);
        }
    }

    /// Puts a fresh placeholder registered with userfaultfd over claimed `chunk`.
    ///
    /// The placeholder can only be registered once it is mapped, and a vCPU or VMM thread that
    /// touches the chunk in between gets an anonymous page outside the pool (a guest writing
    /// memory it reports free does so at once: its fault waits for the mmap lock and takes it
    /// before the registration). Pages that appeared before the registration are therefore
    /// dropped after it: from then on every touch faults to the pool. The guest loses what it
    /// wrote there, as it would have with the frame being discarded.
    fn restore_placeholder(&self, chunk: usize) -> Result<(), RegionError> {
        let (addr, len) = self.chunk_range(chunk);
        let placeholder_err = |source| RegionError::Placeholder { chunk, source };
        // SAFETY: the chunk belongs to this region and is claimed by us; it holds no frame the
        // guest may keep (the caller discards it, or mapping one failed).
        unsafe { mmap::map_placeholder(addr, len) }.map_err(placeholder_err)?;
        self.shared.uffd.register(addr, len)?;
        // SAFETY: as above; the range is a placeholder.
        unsafe { mmap::drop_pages(addr, len) }.map_err(placeholder_err)
    }

    /// Claims the frame of `chunk`: mapped here, or (a VM in a zone) recorded in the zone but
    /// not mapped in this process yet. Returns it and whether it is mapped; `None` (nothing
    /// claimed) when the chunk has no frame.
    fn claim_frame(&self, chunk: usize) -> Option<(Frame, bool)> {
        let frame = |index| Frame {
            index,
            size: self.chunk,
        };
        loop {
            match self.claim(chunk, true) {
                ChunkState::Mapped(index) => return Some((frame(index), true)),
                ChunkState::Empty if self.table.is_persistent() => {
                    if !self.table.claim_empty(chunk) {
                        continue;
                    }
                    match self.table.persisted(chunk) {
                        Some(index) => return Some((frame(index), false)),
                        None => {
                            self.table.publish_empty(chunk);
                            return None;
                        }
                    }
                }
                _ => return None,
            }
        }
    }

    /// Unmaps `chunk` (back to a registered placeholder) and returns its frame to the pool,
    /// scrubbed, using `core`. Returns whether a frame was freed.
    pub(crate) fn discard_chunk(
        &self,
        chunk: usize,
        core: &mut CoreFrames,
    ) -> Result<bool, RegionError> {
        if self.table.claim_file(chunk) {
            // No pool frame: the chunk becomes an unpopulated one, whose next touch takes a
            // frame from the pool; what the guest wrote in it goes back to the host.
            if let Err(e) = self.restore_placeholder(chunk) {
                self.table.publish_file(chunk);
                return Err(e);
            }
            self.table.publish_empty(chunk);
            return Ok(false);
        }
        let Some((frame, mapped)) = self.claim_frame(chunk) else {
            return Ok(false);
        };
        // Puts the chunk back as it was claimed.
        let keep = || match mapped {
            true => {
                let _ = self.map_claimed(chunk, frame);
            }
            false => self.table.publish_empty(chunk),
        };
        if mapped {
            if let Err(e) = self.restore_placeholder(chunk) {
                keep();
                return Err(e);
            }
        }
        // A frame that cannot be scrubbed is kept: the guest gets it back as it is.
        let publish = |chunk| self.table.publish_empty(chunk);
        self.give_back_frames(FrameRun::single(chunk, frame), core, publish, |_| keep())
            .map(|freed| freed == 1)
    }

    /// Releases the host memory of pieces `[first, first + count)` of a populated chunk, where
    /// the pool can do so at 4 KiB granularity (plain memory with hole punching).
    pub(crate) fn punch_pieces(
        &self,
        chunk: usize,
        first: usize,
        count: usize,
    ) -> Result<(), RegionError> {
        if !self.shared.pool.is_hugetlb() && self.table.claim_file(chunk) {
            // The guest gave these pages away: their private copies go back to the host (they
            // read as the file again, which is as good as any content for a free page). A
            // huge page's private copy goes only with the whole chunk.
            let (addr, _) = self.chunk_range(chunk);
            let piece = FRAME_SIZE;
            // SAFETY: the pieces lie in this claimed file-backed chunk, and the guest gave
            // them away: nobody relies on what was written there.
            let dropped = unsafe { mmap::drop_private_copies(addr + first * piece, count * piece) };
            self.table.publish_file(chunk);
            return dropped.map_err(|source| RegionError::Punch { chunk, source });
        }
        let pool = &self.shared.pool;
        if pool.is_hugetlb() || pool.scrub_policy() != crate::pool::Scrub::PunchHole {
            return Ok(());
        }
        let Some((frame, mapped)) = self.claim_frame(chunk) else {
            return Ok(());
        };
        let result = pool.punch(frame.index + first as u64, count as u64);
        match mapped {
            true => self.table.publish(chunk, frame.index),
            false => self.table.publish_empty(chunk),
        }
        result.map_err(|source| RegionError::Punch { chunk, source })
    }

    /// Makes the stores to `[offset, offset + len)` of the region (inside it) durable in its
    /// backing (msync; on a device DAX, a flush of the CPU caches).
    pub(crate) fn sync(&self, offset: u64, len: u64) -> io::Result<()> {
        let how = self.shared.pool.backing_file().durability;
        mmap::sync(self.host.addr() + offset as usize, len as usize, how)
    }

    /// Unmaps every chunk without freeing its frame and returns the frames (detach).
    pub(crate) fn take_frames(&self) -> Vec<Option<u64>> {
        (0..self.table.len())
            .map(|chunk| match self.claim(chunk, true) {
                ChunkState::Mapped(index) => {
                    self.table.publish_empty(chunk);
                    Some(index)
                }
                _ => None,
            })
            .collect()
    }
}

impl Drop for GuestRegion {
    fn drop(&mut self) {
        // Cut every frame off the guest first, then scrub and free them; the frames of a VM in
        // a zone stay its own.
        // SAFETY: the whole range belongs to this region, which nobody can use any more.
        let _ = unsafe { mmap::map_placeholder(self.host.addr(), self.host.len()) };
        if self.table.is_persistent() {
            return;
        }
        for chunk in 0..self.table.len() {
            if let ChunkState::Mapped(index) = self.table.state(chunk) {
                let frame = Frame {
                    index,
                    size: self.chunk,
                };
                // A frame that cannot be scrubbed stays allocated: better lost than leaked.
                let _ = self.shared.pool.scrub_and_free(self.shared.vmm_core, frame);
                self.table.publish_empty(chunk);
            }
        }
    }
}

/// The regions, kept alive by the memory and its fault handlers.
#[derive(Debug)]
pub(crate) struct Inner {
    pub regions: Vec<GuestRegion>,
    pub shared: Arc<SharedState>,
}

impl Inner {
    /// The region and chunk of host address `addr`.
    pub fn locate(&self, addr: usize) -> Option<(&GuestRegion, usize)> {
        self.regions
            .iter()
            .find_map(|r| r.chunk_of_host(addr).map(|chunk| (r, chunk)))
    }
}
