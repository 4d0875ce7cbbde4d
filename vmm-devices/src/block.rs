//! The virtio-blk device (virtio 1.2 §5.2) over a raw image: a regular file or a block device,
//! read-only or read-write. Requests go straight between the image and guest memory (no bounce
//! buffer, no allocation), by one of Firecracker's two engines: `Sync` serves each on the event
//! loop's thread before it looks at the next; `Async` hands reads, writes and flushes to an
//! io_uring ([`async_engine`]) and answers them when they finish, many in flight at once.
//!
//! Everything the guest writes is checked: a request needs a 16-byte header in device-readable
//! buffers and a device-writable status byte at its end; data must be whole 512-byte sectors
//! inside the disk, in guest memory. A malformed request is answered with an error status when
//! there is a status byte to write, or put in the used ring unanswered otherwise, and counted
//! as a warning (rate-limited). A write to a read-only drive is refused with an error status.
//!
//! A rate limiter (Firecracker's, see [`crate::rate_limiter`]) may cap the bytes read
//! and written and the requests: a request the buckets cannot pay for stays in the queue until
//! the limiter's timer says they can. Once the VM runs, the API may give the drive another
//! limiter or another image ([`BlockHandle::update`]); the guest is told the new image's size
//! by a configuration change interrupt. Requests in flight finish before the image changes,
//! before a snapshot saves the queue and before a reset.

pub mod async_engine;
pub mod config;

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use guest_mem::GuestMemory;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::rate_limiter::{RateLimiterConfig, Throttle};
use crate::virtio::request_queue::{read_config, RequestQueue, Served};
use crate::virtio::throttled::{ThrottledDevice, ThrottledQueue};
use crate::virtio::{DeviceMemory, VirtioDevice, VIRTIO_RING_F_EVENT_IDX};
use crate::GuestWarnings;
use async_engine::AsyncEngine;
use config::{open_image, DriveConfig, DriveError, IoEngine};

/// Bytes of a sector, the unit of the disk's capacity and of request offsets.
pub const SECTOR_SIZE: u64 = 512;
/// Bytes of a request header: `le32 type; le32 reserved; le64 sector`.
const HEADER_SIZE: u32 = 16;
/// Size of the request queue.
const QUEUE_SIZE: u16 = 256;

/// Requests served, for the control API and metrics.
#[derive(Debug, Default)]
pub struct BlockCounters {
    /// Read requests served.
    pub reads: AtomicU64,
    /// Write requests served.
    pub writes: AtomicU64,
    /// Bytes read for the guest.
    pub read_bytes: AtomicU64,
    /// Bytes written for the guest.
    pub written_bytes: AtomicU64,
    /// Flush requests served.
    pub flushes: AtomicU64,
    /// Requests answered with an error status or left unanswered.
    pub failed: AtomicU64,
    /// Times the rate limiter made a request wait.
    pub rate_limiter_throttled: AtomicU64,
    /// Times a request waited for room in the asynchronous engine.
    pub io_engine_throttled: AtomicU64,
}

/// What the control API and the metrics keep of a drive.
#[derive(Debug, Clone)]
pub struct BlockHandle {
    /// The drive's id.
    pub id: String,
    /// Its request counters.
    pub counters: Arc<BlockCounters>,
    device: Arc<Mutex<BlockDevice>>,
}

impl BlockHandle {
    fn lock(&self) -> std::sync::MutexGuard<'_, BlockDevice> {
        self.device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Firecracker's `PATCH /drives/{id}`: the image at `path` (opened as the drive was, and
    /// checked as at the start) replaces the drive's, and the guest is told its size; then
    /// `limiter` replaces the rate limiter, its buckets full. Nothing changes on an error.
    pub fn update(
        &self,
        path: Option<&Path>,
        limiter: Option<RateLimiterConfig>,
    ) -> Result<(), DriveError> {
        let image = match path {
            Some(path) => Some((open_image(path, self.lock().config.read_only)?, path)),
            None => None,
        };
        let mut device = self.lock();
        if let Some(((image, size), path)) = image {
            device.change_image(image, size, path);
        }
        if let Some(limiter) = limiter {
            device.set_rate_limiter(limiter);
        }
        Ok(())
    }

    /// The drive's configuration as it is now: the API may have changed its image and limiter
    /// since the start.
    pub fn config(&self) -> DriveConfig {
        self.lock().config.clone()
    }
}

/// Why a drive's device cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The rate limiter's timer could not be made.
    #[error("a rate limiter's timer: {0}")]
    Timer(#[source] io::Error),
    /// The `Async` engine could not be set up.
    #[error("io_engine Async: {0}")]
    Engine(#[from] async_engine::AsyncEngineError),
}

/// Why a request fails; each is answered with [`VIRTIO_BLK_S_IOERR`] except
/// [`BlockRequestError::Unsupported`].
#[derive(Debug)]
enum BlockRequestError {
    /// A rule of the virtio spec is broken (logged as a guest warning).
    Malformed(&'static str),
    /// Writing to a read-only drive.
    ReadOnly,
    /// The request type is not one the device offers.
    Unsupported(u32),
    /// The image could not be read or written (logged as an error).
    Io(io::Error),
}

/// A request's data buffers: where they are and how long, read from the chain.
#[derive(Clone, Copy, Debug, Default)]
struct DataBuffer {
    addr: u64,
    len: u32,
}

/// Most data buffers of one request (the descriptor table's size; a longer chain is malformed).
const MAX_DATA_BUFFERS: usize = QUEUE_SIZE as usize;

/// Most operations in the asynchronous engine at once: one per descriptor, and room for
/// buffers that cross a boundary between memory regions.
const ENGINE_OPERATIONS: u16 = 2 * QUEUE_SIZE;

/// A request in the asynchronous engine, by its descriptor head.
#[derive(Clone, Copy, Debug, Default)]
struct InFlight {
    /// Its operations not finished yet (0: no request at this head).
    operations: u16,
    /// Its type.
    kind: u32,
    /// Its data bytes.
    bytes: u64,
    /// Where its status byte goes.
    status: GuestAddress,
    /// One of its operations failed.
    failed: bool,
}

/// A piece of a request's data in the VMM's mapping of guest memory.
#[derive(Clone, Copy, Debug, Default)]
struct HostPiece {
    addr: usize,
    len: u32,
}

/// The asynchronous engine and what it holds of the requests in flight.
#[derive(Debug)]
struct AsyncRequests {
    engine: AsyncEngine,
    /// The requests in flight, by descriptor head.
    in_flight: Box<[InFlight]>,
    /// Scratch space for one request's pieces, reused.
    pieces: Box<[HostPiece]>,
    /// A request waits in the queue for room in the engine.
    stalled: bool,
}

/// A virtio-blk device over `image`.
#[derive(Debug)]
pub struct BlockDevice {
    /// The drive as configured (its path and limiter as the API last set them).
    config: DriveConfig,
    image: File,
    /// Capacity in sectors (a partial last sector is not part of the disk).
    sectors: u64,
    queue: ThrottledQueue,
    warnings: GuestWarnings,
    counters: Arc<BlockCounters>,
    /// Scratch space for one request's data buffers, reused.
    buffers: Box<[DataBuffer; MAX_DATA_BUFFERS]>,
    /// The asynchronous engine, for a drive whose `io_engine` is `Async`.
    engine: Option<AsyncRequests>,
}

impl BlockDevice {
    /// The drive `config` over `image` (opened read-only or read-write as the drive is) of
    /// `size` bytes, serving requests in `memory`.
    pub fn new(
        memory: DeviceMemory,
        config: DriveConfig,
        image: File,
        size: u64,
    ) -> Result<Self, BlockError> {
        let engine = match config.io_engine {
            IoEngine::Sync => None,
            IoEngine::Async => Some(AsyncRequests {
                engine: AsyncEngine::new(ENGINE_OPERATIONS)?,
                in_flight: vec![InFlight::default(); usize::from(QUEUE_SIZE)].into_boxed_slice(),
                pieces: vec![HostPiece::default(); usize::from(ENGINE_OPERATIONS)]
                    .into_boxed_slice(),
                stalled: false,
            }),
        };
        Ok(Self {
            engine,
            queue: ThrottledQueue::new(
                memory,
                Throttle::new(config.rate_limiter, "virtio-blk").map_err(BlockError::Timer)?,
            ),
            config,
            image,
            sectors: size / SECTOR_SIZE,
            warnings: GuestWarnings::default(),
            counters: Arc::default(),
            buffers: Box::new([DataBuffer::default(); MAX_DATA_BUFFERS]),
        })
    }

    /// The device, shared with the event loop, and its handle for the control API.
    pub fn into_shared(self) -> (Arc<Mutex<Self>>, BlockHandle) {
        let id = self.config.id.clone();
        let counters = Arc::clone(&self.counters);
        let device = Arc::new(Mutex::new(self));
        let handle = BlockHandle {
            id,
            counters,
            device: Arc::clone(&device),
        };
        (device, handle)
    }

    /// Serves the requests from `image` of `size` bytes at `path` from now on, and tells the
    /// driver the disk's new capacity.
    fn change_image(&mut self, image: File, size: u64, path: &Path) {
        // The requests in flight read and write the old image: they finish first.
        self.quiesce();
        self.image = image;
        self.sectors = size / SECTOR_SIZE;
        self.config.path = path.to_owned();
        log::info!(
            "virtio-blk {}: image changed to {} ({} sectors)",
            self.config.id,
            path.display(),
            self.sectors
        );
        if let Some(active) = self.queue.active() {
            if let Err(e) = active.signal_config_change() {
                log::error!("virtio-blk {}: cannot tell the guest: {e}", self.config.id);
            }
        }
    }

    /// Replaces the rate limiter; the new buckets start full, and a request that waited for
    /// the old one is tried again at once.
    fn set_rate_limiter(&mut self, config: RateLimiterConfig) {
        self.config.rate_limiter = config;
        self.queue.throttle().set(config);
    }

    /// Serves one request chain: answered, in the asynchronous engine, or left in the queue
    /// when the rate limiter or the engine's room says to wait.
    fn serve_request(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> Served {
        let head_index = chain.head_index();
        let mut header: Option<Descriptor> = None;
        let mut status: Option<Descriptor> = None;
        let mut data = 0usize;
        let mut malformed = None;
        for desc in chain {
            if header.is_none() {
                if desc.is_write_only() || desc.len() < HEADER_SIZE {
                    malformed = Some("the first buffer is not a 16-byte device-readable header");
                    break;
                }
                header = Some(desc);
                continue;
            }
            // The last buffer is the status: every earlier one is data.
            if let Some(previous) = status.replace(desc) {
                if data == MAX_DATA_BUFFERS {
                    malformed = Some("a request of more than 256 data buffers");
                    break;
                }
                self.buffers[data] = DataBuffer {
                    addr: previous.addr().0,
                    len: previous.len(),
                };
                data += 1;
            }
        }
        let status = status.filter(|s| s.is_write_only() && s.len() >= 1);
        let (Some(header), Some(status), None) = (header, status, malformed) else {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            self.warnings.warn(format_args!(
                "virtio-blk {}: {}; request dropped",
                self.config.id,
                malformed.unwrap_or("a request without a device-writable status byte at its end")
            ));
            return Served::Answered(0);
        };
        let status = status.addr();
        // `le32 type; le32 reserved; le64 sector`.
        let mut bytes = [0u8; HEADER_SIZE as usize];
        let Ok((kind, sector)) = mem.read_slice(&mut bytes, header.addr()).map(|()| {
            let [t0, t1, t2, t3, _, _, _, _, s @ ..] = bytes;
            (u32::from_le_bytes([t0, t1, t2, t3]), u64::from_le_bytes(s))
        }) else {
            let error = BlockRequestError::Malformed("the request header is not in guest memory");
            return Served::Answered(self.fail(mem, status, error));
        };
        let transfer = matches!(
            kind,
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT | VIRTIO_BLK_T_FLUSH
        );
        if transfer && self.engine.is_some() {
            return self.submit(mem, head_index, status, kind, sector, data);
        }
        if !self.admit(kind, data) {
            return Served::Deferred;
        }
        Served::Answered(match self.execute(mem, kind, sector, data) {
            Ok(written) => self.answer(mem, status, VIRTIO_BLK_S_OK, written),
            Err(error) => self.fail(mem, status, error),
        })
    }

    /// Whether the rate limiter lets a request of type `kind` with the first `data` buffers
    /// through (data moves for reads and writes only; every request is an operation); counts
    /// a wait.
    fn admit(&mut self, kind: u32, data: usize) -> bool {
        let buffers = &self.buffers[..data];
        let moved = || match kind {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                buffers.iter().map(|buffer| u64::from(buffer.len)).sum()
            }
            _ => 0,
        };
        if self.queue.throttle().admit(moved) {
            return true;
        }
        self.counters
            .rate_limiter_throttled
            .fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Hands a read, write or flush with the first `data` buffers to the asynchronous engine;
    /// a request that cannot be carried out is answered at once.
    fn submit(
        &mut self,
        mem: &GuestMemory,
        head: u16,
        status: GuestAddress,
        kind: u32,
        sector: u64,
        data: usize,
    ) -> Served {
        let (pieces, bytes) = match self.translate(mem, head, kind, sector, data) {
            Ok(Some(translated)) => translated,
            // Nothing to hand over: a flush of a read-only drive, a transfer of no bytes.
            Ok(None) => {
                if !self.admit(kind, data) {
                    return Served::Deferred;
                }
                return Served::Answered(match self.execute(mem, kind, sector, data) {
                    Ok(written) => self.answer(mem, status, VIRTIO_BLK_S_OK, written),
                    Err(error) => self.fail(mem, status, error),
                });
            }
            Err(error) => return Served::Answered(self.fail(mem, status, error)),
        };
        let operations = pieces.max(1);
        if self
            .engine
            .as_ref()
            .is_none_or(|requests| requests.engine.room() < operations)
        {
            if let Some(requests) = self.engine.as_mut() {
                requests.stalled = true;
            }
            self.counters
                .io_engine_throttled
                .fetch_add(1, Ordering::Relaxed);
            return Served::Deferred;
        }
        if !self.admit(kind, data) {
            return Served::Deferred;
        }
        let fd = self.image.as_raw_fd();
        let Some(requests) = self.engine.as_mut() else {
            return Served::Deferred;
        };
        if kind == VIRTIO_BLK_T_FLUSH {
            requests.engine.sync(head, fd);
        } else {
            let mut offset = sector * SECTOR_SIZE;
            for piece in &requests.pieces[..pieces] {
                if kind == VIRTIO_BLK_T_IN {
                    requests
                        .engine
                        .read(head, fd, piece.addr, piece.len, offset);
                } else {
                    requests
                        .engine
                        .write(head, fd, piece.addr, piece.len, offset);
                }
                offset += u64::from(piece.len);
            }
        }
        requests.in_flight[usize::from(head)] = InFlight {
            operations: u16::try_from(operations).unwrap_or(u16::MAX),
            kind,
            bytes,
            status,
            failed: false,
        };
        // A failed submission leaves the operations queued: the next one hands them over.
        if let Err(e) = requests.engine.submit() {
            log::error!(
                "virtio-blk {}: cannot submit to the io_uring: {e}",
                self.config.id
            );
        }
        Served::InFlight
    }

    /// Checks a request for the asynchronous engine and finds its data in the VMM's mapping of
    /// guest memory (marked dirty when the engine writes it): the number of pieces and bytes,
    /// or `None` when there is nothing to hand over.
    fn translate(
        &mut self,
        mem: &GuestMemory,
        head: u16,
        kind: u32,
        sector: u64,
        data: usize,
    ) -> Result<Option<(usize, u64)>, BlockRequestError> {
        let free = self
            .engine
            .as_ref()
            .and_then(|requests| requests.in_flight.get(usize::from(head)))
            .is_some_and(|request| request.operations == 0);
        if !free {
            return Err(BlockRequestError::Malformed(
                "a request at a descriptor that is still in flight",
            ));
        }
        if kind == VIRTIO_BLK_T_FLUSH {
            return Ok((!self.config.read_only).then_some((0, 0)));
        }
        let bytes = self.check_transfer(kind, sector, data)?;
        if bytes == 0 {
            return Ok(None);
        }
        let Some(requests) = self.engine.as_mut() else {
            return Ok(None);
        };
        let mut count = 0;
        for buffer in &self.buffers[..data] {
            for slice in mem.get_slices(GuestAddress(buffer.addr), buffer.len as usize) {
                let slice = slice.map_err(|_| {
                    BlockRequestError::Malformed("a data buffer is not in guest memory")
                })?;
                let piece = requests
                    .pieces
                    .get_mut(count)
                    .ok_or(BlockRequestError::Malformed(
                        "a request whose buffers cross too many memory regions",
                    ))?;
                if kind == VIRTIO_BLK_T_IN {
                    slice.bitmap().mark_dirty(0, slice.len());
                }
                *piece = HostPiece {
                    addr: slice.ptr_guard_mut().as_ptr() as usize,
                    len: u32::try_from(slice.len()).unwrap_or(u32::MAX),
                };
                count += 1;
            }
        }
        Ok(Some((count, bytes)))
    }

    /// Answers a request that failed with `error`, reported as its kind says; returns the
    /// bytes written into the guest's buffers.
    fn fail(&self, mem: &GuestMemory, status: GuestAddress, error: BlockRequestError) -> u32 {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        match error {
            BlockRequestError::Malformed(why) => {
                self.warnings
                    .warn(format_args!("virtio-blk {}: {why}", self.config.id));
            }
            BlockRequestError::ReadOnly => {
                self.warnings.warn(format_args!(
                    "virtio-blk {}: a write to a read-only drive",
                    self.config.id
                ));
            }
            BlockRequestError::Unsupported(kind) => {
                self.warnings.warn(format_args!(
                    "virtio-blk {}: unsupported request type {kind}",
                    self.config.id
                ));
                return self.answer(mem, status, VIRTIO_BLK_S_UNSUPP, 0);
            }
            BlockRequestError::Io(e) => {
                log::error!(
                    "virtio-blk {}: I/O on the image failed: {e}",
                    self.config.id
                );
            }
        }
        self.answer(mem, status, VIRTIO_BLK_S_IOERR, 0)
    }

    /// Writes the status byte; returns the bytes written into the guest's buffers in all.
    fn answer(&self, mem: &GuestMemory, status: GuestAddress, result: u32, data: u32) -> u32 {
        write_status(&self.warnings, &self.config.id, mem, status, result, data)
    }

    /// Checks a read or write at `sector` with the first `data` buffers: whole sectors, inside
    /// the disk, and no write to a read-only drive; returns its bytes.
    fn check_transfer(
        &self,
        kind: u32,
        sector: u64,
        data: usize,
    ) -> Result<u64, BlockRequestError> {
        if kind == VIRTIO_BLK_T_OUT && self.config.read_only {
            return Err(BlockRequestError::ReadOnly);
        }
        let mut total = 0u64;
        for buffer in &self.buffers[..data] {
            let len = u64::from(buffer.len);
            if len % SECTOR_SIZE != 0 {
                return Err(BlockRequestError::Malformed(
                    "a data buffer is not a whole number of 512-byte sectors",
                ));
            }
            total += len;
        }
        sector
            .checked_add(total / SECTOR_SIZE)
            .filter(|&end| end <= self.sectors)
            .ok_or(BlockRequestError::Malformed(
                "a request beyond the end of the disk",
            ))?;
        Ok(total)
    }

    /// Carries out a request of type `kind` at `sector` with the first `data` buffers of
    /// `self.buffers`; returns the bytes written into guest memory.
    fn execute(
        &mut self,
        mem: &GuestMemory,
        kind: u32,
        sector: u64,
        data: usize,
    ) -> Result<u32, BlockRequestError> {
        match kind {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                let writing = kind == VIRTIO_BLK_T_OUT;
                let total = self.check_transfer(kind, sector, data)?;
                self.image
                    .seek(SeekFrom::Start(sector * SECTOR_SIZE))
                    .map_err(BlockRequestError::Io)?;
                for buffer in &self.buffers[..data] {
                    let addr = GuestAddress(buffer.addr);
                    let len = buffer.len as usize;
                    let moved = if writing {
                        mem.write_all_volatile_to(addr, &mut self.image, len)
                    } else {
                        mem.read_exact_volatile_from(addr, &mut self.image, len)
                    };
                    moved.map_err(|e| match e {
                        vm_memory::GuestMemoryError::IOError(e) => BlockRequestError::Io(e),
                        _ => BlockRequestError::Malformed("a data buffer is not in guest memory"),
                    })?;
                }
                let (requests, bytes) = if writing {
                    (&self.counters.writes, &self.counters.written_bytes)
                } else {
                    (&self.counters.reads, &self.counters.read_bytes)
                };
                requests.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(total, Ordering::Relaxed);
                Ok(if writing {
                    0
                } else {
                    u32::try_from(total).unwrap_or(u32::MAX)
                })
            }
            VIRTIO_BLK_T_FLUSH => {
                if !self.config.read_only {
                    self.image.flush().map_err(BlockRequestError::Io)?;
                    self.image.sync_data().map_err(BlockRequestError::Io)?;
                }
                self.counters.flushes.fetch_add(1, Ordering::Relaxed);
                Ok(0)
            }
            VIRTIO_BLK_T_GET_ID => {
                let buffer = self.buffers[..data]
                    .first()
                    .ok_or(BlockRequestError::Malformed(
                        "a GET_ID request without a buffer for the id",
                    ))?;
                let mut serial = [0u8; VIRTIO_BLK_ID_BYTES as usize];
                let id = self.config.id.as_bytes();
                let len = id.len().min(serial.len());
                serial[..len].copy_from_slice(&id[..len]);
                let len = serial.len().min(buffer.len as usize);
                mem.write_slice(&serial[..len], GuestAddress(buffer.addr))
                    .map_err(|_| {
                        BlockRequestError::Malformed("the id buffer is not in guest memory")
                    })?;
                Ok(u32::try_from(len).unwrap_or(0))
            }
            other => Err(BlockRequestError::Unsupported(other)),
        }
    }
}

impl ThrottledDevice for BlockDevice {
    const NAME: &'static str = "virtio-blk";
    const TYPE: u32 = VIRTIO_ID_BLOCK;
    const QUEUE_SIZES: &'static [u16] = &[QUEUE_SIZE];

    fn offered_features(&self) -> u64 {
        let read_only = if self.config.read_only {
            1 << VIRTIO_BLK_F_RO
        } else {
            0
        };
        // EVENT_IDX as Firecracker's: the driver notifies once the device has caught up, and
        // wants an interrupt once the requests it waits for are answered.
        read_only | 1 << VIRTIO_BLK_F_FLUSH | 1 << VIRTIO_RING_F_EVENT_IDX
    }

    fn config_read(&self, offset: u64, data: &mut [u8]) {
        // `le64 capacity`; the other fields belong to features the device does not offer.
        read_config(&self.sectors.to_le_bytes(), offset, data);
    }

    fn config_write(&mut self, offset: u64) {
        self.warnings.warn(format_args!(
            "virtio-blk {}: write to the read-only config space at {offset}",
            self.config.id
        ));
    }

    fn queue(&self) -> &ThrottledQueue {
        &self.queue
    }

    fn queue_mut(&mut self) -> &mut ThrottledQueue {
        &mut self.queue
    }

    fn warnings(&self) -> &GuestWarnings {
        &self.warnings
    }

    fn serve(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> Served {
        self.serve_request(mem, chain)
    }

    fn completion_source(&self) -> Option<RawFd> {
        self.engine
            .as_ref()
            .map(|requests| requests.engine.completion_fd())
    }

    fn complete_in_flight(
        &mut self,
        mem: &GuestMemory,
        queue: &mut RequestQueue,
        wait: bool,
    ) -> bool {
        let Self {
            engine,
            counters,
            warnings,
            config,
            ..
        } = self;
        let Some(AsyncRequests {
            engine,
            in_flight,
            stalled,
            ..
        }) = engine.as_mut()
        else {
            return false;
        };
        let mut answered = false;
        let collected = engine.collect(wait, |(head, result)| {
            let Some(request) = in_flight.get_mut(usize::from(head)) else {
                return;
            };
            if let Err(e) = result {
                if !request.failed {
                    log::error!("virtio-blk {}: I/O on the image failed: {e}", config.id);
                }
                request.failed = true;
            }
            request.operations = request.operations.saturating_sub(1);
            if request.operations > 0 {
                return;
            }
            let written = finish_request(counters, warnings, &config.id, mem, request);
            if queue.complete(mem, head, written).is_err() {
                warnings.warn(format_args!(
                    "virtio-blk {}: the used ring is not in guest memory",
                    config.id
                ));
            }
            answered = true;
        });
        if let Err(e) = collected {
            log::error!("virtio-blk {}: the io_uring failed: {e}", config.id);
        }
        if answered {
            queue.signal_used(mem, Self::NAME);
        }
        std::mem::take(stalled)
    }
}

/// Counts and answers `request`, whose last operation finished; returns the bytes written
/// into the guest's buffers.
fn finish_request(
    counters: &BlockCounters,
    warnings: &GuestWarnings,
    id: &str,
    mem: &GuestMemory,
    request: &InFlight,
) -> u32 {
    if request.failed {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return write_status(warnings, id, mem, request.status, VIRTIO_BLK_S_IOERR, 0);
    }
    let (requests, bytes, data) = match request.kind {
        VIRTIO_BLK_T_IN => (&counters.reads, Some(&counters.read_bytes), request.bytes),
        VIRTIO_BLK_T_OUT => (&counters.writes, Some(&counters.written_bytes), 0),
        _ => (&counters.flushes, None, 0),
    };
    requests.fetch_add(1, Ordering::Relaxed);
    if let Some(bytes) = bytes {
        bytes.fetch_add(request.bytes, Ordering::Relaxed);
    }
    let data = u32::try_from(data).unwrap_or(u32::MAX);
    write_status(warnings, id, mem, request.status, VIRTIO_BLK_S_OK, data)
}

/// Writes a request's status byte `result` at `status`; returns the bytes written into the
/// guest's buffers in all (`data` and the status byte), warning of drive `id` if the byte is
/// not in guest memory.
fn write_status(
    warnings: &GuestWarnings,
    id: &str,
    mem: &GuestMemory,
    status: GuestAddress,
    result: u32,
    data: u32,
) -> u32 {
    // The status constants are single bytes.
    let byte = u8::try_from(result).unwrap_or(u8::MAX);
    if mem.write_obj(byte, status).is_err() {
        warnings.warn(format_args!(
            "virtio-blk {id}: the status byte is not in guest memory"
        ));
        return data;
    }
    data.saturating_add(1)
}

#[cfg(test)]
mod tests;
