//! The virtio-blk device (virtio 1.2 §5.2) over a raw image: a regular file or a block device,
//! read-only or read-write. Requests are served synchronously on the event loop's thread,
//! straight between the image and guest memory (no bounce buffer, no allocation).
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
//! by a configuration change interrupt.

pub mod config;

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
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
use vm_memory::{Bytes, GuestAddress};

use crate::rate_limiter::{RateLimiterConfig, Throttle};
use crate::virtio::request_queue::read_config;
use crate::virtio::throttled::{ThrottledDevice, ThrottledQueue};
use crate::virtio::DeviceMemory;
use crate::GuestWarnings;
use config::{open_image, DriveConfig, DriveError};

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

/// Most data buffers of one request (Linux sends at most its `seg_max`, 126 here, plus header
/// and status; a longer chain is malformed).
const MAX_DATA_BUFFERS: usize = QUEUE_SIZE as usize;

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
}

impl BlockDevice {
    /// The drive `config` over `image` (opened read-only or read-write as the drive is) of
    /// `size` bytes, serving requests in `memory`.
    pub fn new(
        memory: DeviceMemory,
        config: DriveConfig,
        image: File,
        size: u64,
    ) -> io::Result<Self> {
        Ok(Self {
            queue: ThrottledQueue::new(memory, Throttle::new(config.rate_limiter, "virtio-blk")?),
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

    /// Serves one request chain; returns the bytes written into the guest's buffers, or
    /// `None` when the rate limiter says to wait (the chain stays in the queue).
    fn serve_request(
        &mut self,
        mem: &GuestMemory,
        chain: DescriptorChain<&GuestMemory>,
    ) -> Option<u32> {
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
            return Some(0);
        };
        // `le32 type; le32 reserved; le64 sector`.
        let mut bytes = [0u8; HEADER_SIZE as usize];
        let header = mem.read_slice(&mut bytes, header.addr()).map(|()| {
            let [t0, t1, t2, t3, _, _, _, _, s @ ..] = bytes;
            (u32::from_le_bytes([t0, t1, t2, t3]), u64::from_le_bytes(s))
        });
        if let Ok(&(kind, _)) = header.as_ref() {
            // Data moves for reads and writes only; every request is an operation.
            let buffers = &self.buffers[..data];
            let moved = || match kind {
                VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                    buffers.iter().map(|buffer| u64::from(buffer.len)).sum()
                }
                _ => 0,
            };
            if !self.queue.throttle().admit(moved) {
                self.counters
                    .rate_limiter_throttled
                    .fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        let result = header
            .map_err(|_| BlockRequestError::Malformed("the request header is not in guest memory"))
            .and_then(|(kind, sector)| self.execute(mem, kind, sector, data));
        let (result, written) = match result {
            Ok(written) => (VIRTIO_BLK_S_OK, written),
            Err(error) => {
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
                        return Some(self.answer(mem, status, VIRTIO_BLK_S_UNSUPP, 0));
                    }
                    BlockRequestError::Io(e) => {
                        log::error!(
                            "virtio-blk {}: I/O on the image failed: {e}",
                            self.config.id
                        );
                    }
                }
                (VIRTIO_BLK_S_IOERR, 0)
            }
        };
        Some(self.answer(mem, status, result, written))
    }

    /// Writes the status byte; returns the bytes written into the guest's buffers in all.
    fn answer(&self, mem: &GuestMemory, status: Descriptor, result: u32, data: u32) -> u32 {
        // The status constants are single bytes.
        let byte = u8::try_from(result).unwrap_or(u8::MAX);
        if mem.write_obj(byte, status.addr()).is_err() {
            self.warnings.warn(format_args!(
                "virtio-blk {}: the status byte is not in guest memory",
                self.config.id
            ));
            return data;
        }
        data.saturating_add(1)
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
        let buffers = &self.buffers[..data];
        match kind {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                let writing = kind == VIRTIO_BLK_T_OUT;
                if writing && self.config.read_only {
                    return Err(BlockRequestError::ReadOnly);
                }
                let mut total = 0u64;
                for buffer in buffers {
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
                self.image
                    .seek(SeekFrom::Start(sector * SECTOR_SIZE))
                    .map_err(BlockRequestError::Io)?;
                for buffer in buffers {
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
                let buffer = buffers.first().ok_or(BlockRequestError::Malformed(
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
        read_only | 1 << VIRTIO_BLK_F_FLUSH
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

    fn serve(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> Option<u32> {
        self.serve_request(mem, chain)
    }
}

#[cfg(test)]
mod tests;
