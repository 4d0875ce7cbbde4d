//! Frame pools: one LLFree allocator over one host memory zone, shared by guests.

mod backing;
mod cache;
mod header;
mod persistent;
mod stats;

pub use backing::{available_huge_pages, sysfs_visible, Backing, BackingError};
pub use cache::CoreFrames;
pub use header::HeaderError;
pub use stats::{PoolStats, TreeUsage};

use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use llfree::{Config, CoreId, FrameId, InitError, LLFree, Order, FRAME_SIZE, GIANT_ORDER};
use thiserror::Error;

use crate::sys::{self, mmap};
pub(crate) use backing::BackingFile;
use persistent::{open_file, Opened};

/// The size of a pool frame, which is also the size of the guest chunks mapped onto it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrameSize {
    /// 2 MiB (LLFree order 9).
    Huge,
    /// 1 GiB (LLFree order 18).
    Giant,
}

impl FrameSize {
    /// The LLFree order (in 4 KiB frames).
    pub fn order(self) -> Order {
        match self {
            FrameSize::Huge => Order::HUGE,
            FrameSize::Giant => Order::GIANT,
        }
    }

    /// How many 4 KiB frames a frame of this size spans.
    pub fn base_frames(self) -> u64 {
        1 << self.order().0
    }

    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        FRAME_SIZE as u64 * self.base_frames()
    }

    /// A human-readable name ("2 MiB", "1 GiB").
    pub fn name(self) -> &'static str {
        match self {
            FrameSize::Huge => "2 MiB",
            FrameSize::Giant => "1 GiB",
        }
    }
}

/// How a frame's old contents are destroyed before another guest gets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scrub {
    /// Punch a hole in the backing file when the frame is freed; the kernel zeroes the memory
    /// when it is next touched (and plain memory goes back to the host meanwhile).
    #[default]
    PunchHole,
    /// Write zeroes over the frame when it is freed (the memory stays allocated to the pool).
    ZeroOnFree,
}

/// Parameters of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The host memory to use.
    pub backing: Backing,
    /// Bytes of frame memory (a multiple of the frame size).
    pub size: u64,
    /// Per-core reservation slots of the allocator (vCPUs of all guests, plus device cores).
    pub cores: usize,
    /// How freed frames are cleaned.
    pub scrub: Scrub,
}

impl PoolConfig {
    /// A pool of `size` bytes of `backing` with 64 cores and hole punching.
    pub fn new(backing: Backing, size: u64) -> Self {
        Self {
            backing,
            size,
            cores: 64,
            scrub: Scrub::PunchHole,
        }
    }
}

/// Errors of creating or using a pool.
#[derive(Debug, Error)]
pub enum PoolError {
    /// The size is zero.
    #[error("pool size must not be zero")]
    ZeroSize,
    /// The size is not a multiple of the frame size.
    #[error("pool size {size:#x} is not a multiple of the frame size ({frame})")]
    Misaligned {
        /// The size given.
        size: u64,
        /// The frame size of the backing.
        frame: &'static str,
    },
    /// The number of cores is zero.
    #[error("a pool needs at least one core")]
    NoCores,
    /// The backing memory is not available.
    #[error(transparent)]
    Backing(#[from] BackingError),
    /// A persistent pool file has an unusable header.
    #[error("pool file {path}: {source}")]
    Header {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: HeaderError,
    },
    /// A persistent pool file holds a pool of another size.
    #[error("pool file {path} holds {found} bytes of frames, but {expected} were requested")]
    SizeMismatch {
        /// The path.
        path: PathBuf,
        /// Bytes of frames in the file.
        found: u64,
        /// Bytes requested.
        expected: u64,
    },
    /// Device DAX cannot punch holes.
    #[error("{0} cannot punch holes (device DAX); use Scrub::ZeroOnFree")]
    CannotPunch(PathBuf),
    /// Mapping the allocator metadata failed.
    #[error("cannot map the allocator metadata: {0}")]
    MapMetadata(#[source] io::Error),
    /// Cleaning the frames of a freshly formatted file failed.
    #[error("cannot clean the frames of the new pool file: {0}")]
    Format(#[source] io::Error),
    /// The allocator refused the configuration or the persistent metadata.
    #[error("allocator: {0}")]
    Allocator(#[from] InitError),
}

/// One frame handed out by a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The first 4 KiB frame number (LLFree numbering).
    pub index: u64,
    /// The frame's size.
    pub size: FrameSize,
}

/// A frame pool: an LLFree allocator over one host memory zone. Share it with `Arc`.
pub struct Pool {
    llfree: LLFree,
    file: BackingFile,
    data_offset: u64,
    size: u64,
    frame_size: FrameSize,
    scrub: Scrub,
    next_core: AtomicUsize,
    /// The allocator cores this process uses (a zone's: the slots it claimed).
    cores: Range<usize>,
    /// Per core of `cores`: a thread holds its cache ([`Pool::core_frames`]).
    cache_claims: Box<[AtomicBool]>,
    /// A zone's pool: this process's membership, ended when the pool goes.
    membership: Option<Box<dyn Member>>,
}

/// A process's membership in what shares a pool's allocator (a zone's other processes), ended
/// when the pool goes, after every user of the pool.
pub(crate) trait Member: Send + Sync + std::fmt::Debug {
    /// Leaves: gives back what this process holds of `llfree`, whose metadata lies in `file`.
    fn leave(&self, llfree: &LLFree, file: &std::fs::File);
}

/// A claim flag per core of `cores`, none taken.
fn unclaimed(cores: &Range<usize>) -> Box<[AtomicBool]> {
    cores.clone().map(|_| AtomicBool::new(false)).collect()
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(membership) = &self.membership {
            membership.leave(&self.llfree, self.file.as_file());
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("file", &self.file)
            .field("size", &self.size)
            .field("frame_size", &self.frame_size)
            .field("scrub", &self.scrub)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Creates a pool (or, for a file holding one already, recovers it).
    pub fn new(config: PoolConfig) -> Result<Arc<Self>, PoolError> {
        let frame_size = match config.backing {
            Backing::Hugetlb1G => FrameSize::Giant,
            _ => FrameSize::Huge,
        };
        if config.size == 0 {
            return Err(PoolError::ZeroSize);
        }
        if !config.size.is_multiple_of(frame_size.bytes()) {
            return Err(PoolError::Misaligned {
                size: config.size,
                frame: frame_size.name(),
            });
        }
        if config.cores == 0 {
            return Err(PoolError::NoCores);
        }
        let frames = (config.size / FRAME_SIZE as u64) as usize;
        let llfree_config = Config::new(config.cores, frames);
        let opened = match &config.backing {
            Backing::File { path, format } => open_file(path, *format, &config, llfree_config)?,
            backing => {
                let file = BackingFile::memfd(backing, config.size)?;
                Opened {
                    llfree: LLFree::new(llfree_config)?,
                    file,
                    data_offset: 0,
                    formatted: false,
                }
            }
        };
        let cores = 0..opened.llfree.cores();
        let pool = Self {
            llfree: opened.llfree,
            file: opened.file,
            data_offset: opened.data_offset,
            size: config.size,
            frame_size,
            scrub: config.scrub,
            next_core: AtomicUsize::new(0),
            cache_claims: unclaimed(&cores),
            cores,
            membership: None,
        };
        if opened.formatted {
            pool.scrub_all().map_err(PoolError::Format)?;
        }
        Ok(Arc::new(pool))
    }

    /// A pool over the frames of a zone file: `llfree` manages the frames at `data_offset` of
    /// `file`. Freed frames are punched out of the file, or zeroed where it cannot punch.
    ///
    /// The pool allocates with the allocator cores `cores`; a zone's pool ends the process's
    /// `membership` when it is dropped.
    pub(crate) fn assemble(
        llfree: LLFree,
        file: BackingFile,
        data_offset: u64,
        frame_size: FrameSize,
        cores: Range<usize>,
        membership: Option<Box<dyn Member>>,
    ) -> Arc<Self> {
        let scrub = match file.can_punch {
            true => Scrub::PunchHole,
            false => Scrub::ZeroOnFree,
        };
        Arc::new(Self {
            size: (llfree.frames() * FRAME_SIZE) as u64,
            llfree,
            file,
            data_offset,
            frame_size,
            scrub,
            next_core: AtomicUsize::new(0),
            cache_claims: unclaimed(&cores),
            cores,
            membership,
        })
    }

    /// The file or memfd the frames lie in.
    pub(crate) fn backing_file(&self) -> &BackingFile {
        &self.file
    }

    /// The smallest frame (and chunk) size this pool hands out.
    pub fn frame_size(&self) -> FrameSize {
        self.frame_size
    }

    /// Bytes of frame memory.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Free 4 KiB frames, those that threads' core caches hold included.
    pub fn free_frames(&self) -> u64 {
        self.llfree.available_frames() as u64
    }

    /// Whether the memory is hugetlb.
    pub fn is_hugetlb(&self) -> bool {
        self.file.hugetlb
    }

    /// Whether mappings use MAP_SYNC (the pool lives on DAX).
    pub fn uses_map_sync(&self) -> bool {
        self.file.map_sync
    }

    /// How freed frames are cleaned.
    pub fn scrub_policy(&self) -> Scrub {
        self.scrub
    }

    /// The allocator (read-only views such as `is_free` and `tree_stats`).
    pub fn allocator(&self) -> &LLFree {
        &self.llfree
    }

    /// Hands out `count` consecutive core ids (modulo the allocator's cores) for a guest's vCPUs
    /// and devices, so that guests sharing the pool use different reservations where possible.
    pub fn claim_cores(&self, count: usize) -> usize {
        let next = self.next_core.fetch_add(count, Ordering::Relaxed);
        self.cores.start + next % self.cores.len()
    }

    /// A core for the pool's owner's own work (recovery, deleting a VM).
    pub fn own_core(&self) -> usize {
        self.cores.start
    }

    /// Allocates a frame with `core`'s reservation; `None` when the pool is exhausted.
    pub fn alloc(&self, core: usize, size: FrameSize) -> Option<Frame> {
        let FrameId(index) = self.llfree.get(CoreId(core), size.order()).ok()?;
        Some(Frame {
            index: index as u64,
            size,
        })
    }

    /// Returns a frame to the pool. Its contents must have been scrubbed already.
    pub fn free(&self, core: usize, frame: Frame) -> Result<(), llfree::Error> {
        let index = FrameId(frame.index as usize);
        self.llfree.put(CoreId(core), index, frame.size.order())
    }

    /// Whether `frame` is currently allocated (used when restoring a frame table).
    pub fn is_allocated(&self, frame: Frame) -> bool {
        let end = frame.index + frame.size.base_frames();
        frame.index.is_multiple_of(frame.size.base_frames())
            && end <= (self.size / FRAME_SIZE as u64)
            && !self
                .llfree
                .is_free(FrameId(frame.index as usize), frame.size.order())
    }

    /// Where 4 KiB frame `index` lies in the backing file.
    pub(crate) fn file_offset(&self, index: u64) -> u64 {
        self.data_offset + index * FRAME_SIZE as u64
    }

    /// Maps all of `frame`, shared, over `[addr, addr + frame size)`.
    ///
    /// # Safety
    /// The caller owns the address range and nothing relies on what is mapped there now.
    pub(crate) unsafe fn map_frame(&self, frame: Frame, addr: usize) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.map_frames(frame, 1, addr) }
    }

    /// Maps `count` consecutive frames of `first`'s size, starting with `first`, shared, over
    /// `[addr, addr + count frames)` in one call.
    ///
    /// # Safety
    /// As for [`Pool::map_frame`].
    pub(crate) unsafe fn map_frames(
        &self,
        first: Frame,
        count: u64,
        addr: usize,
    ) -> io::Result<()> {
        let offset = self.file_offset(first.index);
        // SAFETY: forwarded from the caller.
        unsafe {
            mmap::map_shared_fixed(
                addr,
                (first.size.bytes() * count) as usize,
                self.file.raw_fd(),
                offset,
                self.file.map_sync,
            )
        }
    }

    /// Maps `count` consecutive frames from `first`, privately, over `[addr, addr + count
    /// frames)` in one call: reads share the frames, a write copies the page into memory of
    /// this process's own and the frames never change (a clone's view of its base). On
    /// hugetlbfs the copies' huge pages are reserved by the mapping.
    ///
    /// # Safety
    /// As for [`Pool::map_frame`].
    pub(crate) unsafe fn map_frames_private(
        &self,
        first: Frame,
        count: u64,
        addr: usize,
    ) -> io::Result<()> {
        let offset = self.file_offset(first.index);
        let len = (first.size.bytes() * count) as usize;
        // SAFETY: forwarded from the caller.
        unsafe { mmap::map_private_fixed(addr, len, self.file.raw_fd(), offset, self.is_hugetlb()) }
    }

    /// Releases the memory of 4 KiB frames `[first, first + count)` to the host (their
    /// contents read as zero afterwards).
    pub(crate) fn punch(&self, first: u64, count: u64) -> io::Result<()> {
        let offset = self.file_offset(first);
        sys::punch_hole(self.file.as_file(), offset, count * FRAME_SIZE as u64)
    }

    /// Scrubs `frame` by the pool's policy, then returns it to the pool with `core`. A frame that
    /// cannot be scrubbed is not freed.
    pub(crate) fn scrub_and_free(&self, core: usize, frame: Frame) -> io::Result<()> {
        self.scrub(frame)?;
        self.free(core, frame).map_err(io::Error::other)
    }

    /// Destroys the contents of `frame` by the pool's policy.
    pub(crate) fn scrub(&self, frame: Frame) -> io::Result<()> {
        self.scrub_frames(frame, 1)
    }

    /// Destroys the contents of `count` consecutive frames of `first`'s size, starting with
    /// `first`, by the pool's policy in one call.
    pub(crate) fn scrub_frames(&self, first: Frame, count: u64) -> io::Result<()> {
        let pages = first.size.base_frames() * count;
        match self.scrub {
            Scrub::PunchHole => self.punch(first.index, pages),
            Scrub::ZeroOnFree => self.zero(first.index, pages),
        }
    }

    /// Whether every byte of `frame` is zero, read through a temporary mapping. The caller makes
    /// sure that nobody writes the frame meanwhile.
    pub(crate) fn holds_only_zeroes(&self, frame: Frame) -> io::Result<bool> {
        let offset = self.file_offset(frame.index);
        let len = frame.size.bytes() as usize;
        let view = mmap::Mapping::shared_file(self.file.raw_fd(), offset, len)?;
        // SAFETY: `view` is a fresh mapping of `len` readable bytes, page-aligned; nobody writes
        // the frame meanwhile (see above), and a `u64` is valid for any bits.
        let words = unsafe { std::slice::from_raw_parts(view.addr() as *const u64, len / 8) };
        Ok(words.iter().all(|&word| word == 0))
    }

    /// Writes zeroes over 4 KiB frames `[first, first + count)` through a temporary mapping.
    /// Where the backing has 4 KiB pages, the mmap call populates the mapping: faulting it page
    /// by page took 6× the time of the zeroing itself. A hugetlb frame faults once.
    fn zero(&self, first: u64, count: u64) -> io::Result<()> {
        let offset = self.file_offset(first);
        let len = (count * FRAME_SIZE as u64) as usize;
        let fd = self.file.raw_fd();
        let view = match self.file.hugetlb {
            true => mmap::Mapping::shared_file(fd, offset, len)?,
            false => mmap::Mapping::shared_file_populated(fd, offset, len)?,
        };
        // SAFETY: `view` is a fresh read/write mapping of `len` bytes that only we use.
        unsafe { std::ptr::write_bytes(view.addr() as *mut u8, 0, len) };
        Ok(())
    }

    /// Cleans every frame of a freshly formatted file pool (a file may hold old data).
    fn scrub_all(&self) -> io::Result<()> {
        let frames = self.size / FRAME_SIZE as u64;
        if self.file.can_punch {
            return self.punch(0, frames);
        }
        let step = 1u64 << GIANT_ORDER;
        (0..frames)
            .step_by(step as usize)
            .try_for_each(|first| self.zero(first, step.min(frames - first)))
    }

    /// The pool's counters and the allocator's trees.
    pub fn stats(&self) -> PoolStats {
        PoolStats::collect(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_sizes_give_clear_errors() {
        let err = Pool::new(PoolConfig::new(Backing::Anonymous, 0)).unwrap_err();
        assert_eq!(err.to_string(), "pool size must not be zero");
        let err = Pool::new(PoolConfig::new(Backing::Anonymous, 3 << 20)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pool size 0x300000 is not a multiple of the frame size (2 MiB)"
        );
        let err = Pool::new(PoolConfig::new(Backing::Hugetlb1G, 2 << 20)).unwrap_err();
        assert!(err.to_string().contains("frame size (1 GiB)"), "{err}");
    }

    #[test]
    fn anonymous_pool_hands_out_and_takes_back_frames() {
        let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 64 << 20)).expect("pool");
        assert_eq!(pool.frame_size(), FrameSize::Huge);
        let frames: Vec<_> = (0..32)
            .map(|_| pool.alloc(0, FrameSize::Huge).expect("frame"))
            .collect();
        assert!(pool.alloc(0, FrameSize::Huge).is_none());
        assert!(frames.iter().all(|f| pool.is_allocated(*f)));
        for f in frames {
            pool.free(0, f).expect("free");
        }
        assert_eq!(pool.stats().free_bytes, 64 << 20);
    }

    #[test]
    fn zero_on_free_clears_a_frame_before_it_is_handed_out_again() {
        let mut config = PoolConfig::new(Backing::Anonymous, 2 << 20);
        config.scrub = Scrub::ZeroOnFree;
        let pool = Pool::new(config).expect("pool");
        let frame = pool.alloc(0, FrameSize::Huge).expect("frame");
        let len = frame.size.bytes() as usize;
        let map = mmap::Mapping::shared_file(pool.file.raw_fd(), 0, len).expect("mmap");
        let bytes = map.addr() as *mut u8;
        // SAFETY: both offsets lie in `map`, a read/write mapping of the frame.
        unsafe {
            bytes.write_volatile(0xAB);
            bytes.add(len - 1).write_volatile(0xCD);
        }
        pool.scrub_and_free(0, frame).expect("scrub");
        assert_eq!(
            pool.alloc(0, FrameSize::Huge),
            Some(frame),
            "the only frame"
        );
        // SAFETY: as above.
        let (first, last) = unsafe { (bytes.read_volatile(), bytes.add(len - 1).read_volatile()) };
        assert_eq!((first, last), (0, 0));
    }
}
