//! The virtio-blk device (virtio 1.2 §5.2) over a raw image: a regular file or a block device,
//! read-only or read-write. Requests are served synchronously on the event loop's thread,
//! straight between the image and guest memory (no bounce buffer, no allocation).
//!
//! Everything the guest writes is checked: a request needs a 16-byte header in device-readable
//! buffers and a device-writable status byte at its end; data must be whole 512-byte sectors
//! inside the disk, in guest memory. A malformed request is answered with an error status when
//! there is a status byte to write, or put in the used ring unanswered otherwise, and counted
//! as a warning (rate-limited). A write to a read-only drive is refused with an error status.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use guest_mem::GuestMemory;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, QueueState};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};

use crate::devices::virtio::request_queue::{read_config, RequestQueue};
use crate::devices::virtio::{ActivateError, Activation, DeviceState, VirtioDevice};
use crate::devices::GuestWarnings;

/// Bytes of a sector, the unit of the disk's capacity and of request offsets.
pub const SECTOR_SIZE: u64 = 512;
/// Bytes of a request header: `le32 type; le32 reserved; le64 sector`.
const HEADER_SIZE: u32 = 16;
/// Size of the request queue.
const QUEUE_SIZE: u16 = 256;
const QUEUE_SIZES: [u16; 1] = [QUEUE_SIZE];

/// The queues' guest memory.
pub type Memory = Arc<GuestMemory>;

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
}

/// Why a request fails; each is answered with [`VIRTIO_BLK_S_IOERR`] except
/// [`RequestError::Unsupported`].
#[derive(Debug)]
enum RequestError {
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
struct Buffer {
    addr: u64,
    len: u32,
}

/// Most data buffers of one request (Linux sends at most its `seg_max`, 126 here, plus header
/// and status; a longer chain is malformed).
const MAX_DATA_BUFFERS: usize = QUEUE_SIZE as usize;

/// A virtio-blk device over `image`.
#[derive(Debug)]
pub struct BlockDevice {
    id: String,
    image: File,
    read_only: bool,
    /// Capacity in sectors (a partial last sector is not part of the disk).
    sectors: u64,
    memory: Memory,
    active: Option<RequestQueue>,
    warnings: GuestWarnings,
    counters: Arc<BlockCounters>,
    /// Scratch space for one request's data buffers, reused.
    buffers: Box<[Buffer; MAX_DATA_BUFFERS]>,
}

impl BlockDevice {
    /// A drive `id` over `image` (opened read-only or read-write as `read_only` says) of
    /// `size` bytes, serving requests in `memory`.
    pub fn new(memory: Memory, id: &str, image: File, size: u64, read_only: bool) -> Self {
        Self {
            id: id.to_owned(),
            image,
            read_only,
            sectors: size / SECTOR_SIZE,
            memory,
            active: None,
            warnings: GuestWarnings::default(),
            counters: Arc::default(),
            buffers: Box::new([Buffer::default(); MAX_DATA_BUFFERS]),
        }
    }

    /// The device's request counters.
    pub fn counters(&self) -> Arc<BlockCounters> {
        Arc::clone(&self.counters)
    }

    /// Serves one request chain; returns the bytes written into the guest's buffers.
    fn serve(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
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
                self.buffers[data] = Buffer {
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
                self.id,
                malformed.unwrap_or("a request without a device-writable status byte at its end")
            ));
            return 0;
        };
        let (result, written) = match self.execute(mem, header.addr(), data) {
            Ok(written) => (VIRTIO_BLK_S_OK, written),
            Err(error) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                match error {
                    RequestError::Malformed(why) => {
                        self.warnings
                            .warn(format_args!("virtio-blk {}: {why}", self.id));
                    }
                    RequestError::ReadOnly => {
                        self.warnings.warn(format_args!(
                            "virtio-blk {}: a write to a read-only drive",
                            self.id
                        ));
                    }
                    RequestError::Unsupported(kind) => {
                        self.warnings.warn(format_args!(
                            "virtio-blk {}: unsupported request type {kind}",
                            self.id
                        ));
                        return self.answer(mem, status, VIRTIO_BLK_S_UNSUPP, 0);
                    }
                    RequestError::Io(e) => {
                        log::error!("virtio-blk {}: I/O on the image failed: {e}", self.id);
                    }
                }
                (VIRTIO_BLK_S_IOERR, 0)
            }
        };
        self.answer(mem, status, result, written)
    }

    /// Writes the status byte; returns the bytes written into the guest's buffers in all.
    fn answer(&self, mem: &GuestMemory, status: Descriptor, result: u32, data: u32) -> u32 {
        // The status constants are single bytes.
        let byte = u8::try_from(result).unwrap_or(u8::MAX);
        if mem.write_obj(byte, status.addr()).is_err() {
            self.warnings.warn(format_args!(
                "virtio-blk {}: the status byte is not in guest memory",
                self.id
            ));
            return data;
        }
        data.saturating_add(1)
    }

    /// Carries out the request whose header is at `header` with the first `data` buffers of
    /// `self.buffers`; returns the bytes written into guest memory.
    fn execute(
        &mut self,
        mem: &GuestMemory,
        header: GuestAddress,
        data: usize,
    ) -> Result<u32, RequestError> {
        // `le32 type; le32 reserved; le64 sector`.
        let mut bytes = [0u8; HEADER_SIZE as usize];
        mem.read_slice(&mut bytes, header)
            .map_err(|_| RequestError::Malformed("the request header is not in guest memory"))?;
        let [t0, t1, t2, t3, _, _, _, _, s @ ..] = bytes;
        let kind = u32::from_le_bytes([t0, t1, t2, t3]);
        let sector = u64::from_le_bytes(s);
        let buffers = &self.buffers[..data];
        match kind {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                let writing = kind == VIRTIO_BLK_T_OUT;
                if writing && self.read_only {
                    return Err(RequestError::ReadOnly);
                }
                let mut total = 0u64;
                for buffer in buffers {
                    let len = u64::from(buffer.len);
                    if len % SECTOR_SIZE != 0 {
                        return Err(RequestError::Malformed(
                            "a data buffer is not a whole number of 512-byte sectors",
                        ));
                    }
                    total += len;
                }
                sector
                    .checked_add(total / SECTOR_SIZE)
                    .filter(|&end| end <= self.sectors)
                    .ok_or(RequestError::Malformed(
                        "a request beyond the end of the disk",
                    ))?;
                self.image
                    .seek(SeekFrom::Start(sector * SECTOR_SIZE))
                    .map_err(RequestError::Io)?;
                for buffer in buffers {
                    let addr = GuestAddress(buffer.addr);
                    let len = buffer.len as usize;
                    let moved = if writing {
                        mem.write_all_volatile_to(addr, &mut self.image, len)
                    } else {
                        mem.read_exact_volatile_from(addr, &mut self.image, len)
                    };
                    moved.map_err(|e| match e {
                        vm_memory::GuestMemoryError::IOError(e) => RequestError::Io(e),
                        _ => RequestError::Malformed("a data buffer is not in guest memory"),
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
                if !self.read_only {
                    self.image.flush().map_err(RequestError::Io)?;
                    self.image.sync_data().map_err(RequestError::Io)?;
                }
                self.counters.flushes.fetch_add(1, Ordering::Relaxed);
                Ok(0)
            }
            VIRTIO_BLK_T_GET_ID => {
                let buffer = buffers.first().ok_or(RequestError::Malformed(
                    "a GET_ID request without a buffer for the id",
                ))?;
                let mut serial = [0u8; VIRTIO_BLK_ID_BYTES as usize];
                let id = self.id.as_bytes();
                let len = id.len().min(serial.len());
                serial[..len].copy_from_slice(&id[..len]);
                let len = serial.len().min(buffer.len as usize);
                mem.write_slice(&serial[..len], GuestAddress(buffer.addr))
                    .map_err(|_| RequestError::Malformed("the id buffer is not in guest memory"))?;
                Ok(u32::try_from(len).unwrap_or(0))
            }
            other => Err(RequestError::Unsupported(other)),
        }
    }
}

impl VirtioDevice<Memory> for BlockDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn device_features(&self) -> u64 {
        let read_only = if self.read_only {
            1 << VIRTIO_BLK_F_RO
        } else {
            0
        };
        read_only | 1 << VIRTIO_BLK_F_FLUSH
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // `le64 capacity`; the other fields belong to features the device does not offer.
        read_config(&self.sectors.to_le_bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        self.warnings.warn(format_args!(
            "virtio-blk {}: write to the read-only config space at {offset}",
            self.id
        ));
    }

    fn activate(&mut self, activation: Activation<Memory>) -> Result<(), ActivateError> {
        self.active = Some(RequestQueue::take(activation)?);
        Ok(())
    }

    fn process_queue(&mut self, index: u16) {
        let Some(mut active) = self.active.take() else {
            return;
        };
        if index == 0 {
            let memory = Arc::clone(&self.memory);
            let mem = memory.memory();
            if let Err(e) = active.drain(&mem, "virtio-blk", |chain| self.serve(&mem, chain)) {
                self.warnings.warn(format_args!("virtio-blk: {e}"));
            }
        }
        self.active = Some(active);
    }

    fn reset(&mut self) {
        self.active = None;
    }

    fn queue_states(&self) -> Vec<(u16, QueueState)> {
        self.active
            .iter()
            .map(|active| (0, active.state()))
            .collect()
    }

    fn save_state(&self) -> DeviceState {
        // Requests are served to the end before the device yields: nothing is in flight.
        DeviceState::Plain
    }

    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<Memory>>,
    ) -> Result<(), ActivateError> {
        if *state != DeviceState::Plain {
            return Err(ActivateError::Device(
                format!("a virtio-blk device cannot take the state {state:?}").into(),
            ));
        }
        if let Some(activation) = activation {
            self.activate(activation)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
