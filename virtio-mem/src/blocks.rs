//! The device's blocks: which are plugged, the requested size, and the answer to each request.

use std::fmt::Display;

use thiserror::Error;

use crate::spec::{
    config, VIRTIO_MEM_STATE_MIXED, VIRTIO_MEM_STATE_PLUGGED, VIRTIO_MEM_STATE_UNPLUGGED,
};
use crate::{MemRequest, MemResponse};

/// `value` as an index (saturating: an index that large finds nothing).
fn index(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// What plugging means to the host: the backend maps and unmaps guest memory.
pub trait MemBackend {
    /// A failure of the host's side.
    type Error: Display;

    /// Makes `[addr, addr + len)` (whole blocks, all unplugged) usable by the guest.
    fn plug(&self, addr: u64, len: u64) -> Result<(), PlugError<Self::Error>>;

    /// Takes `[addr, addr + len)` (whole blocks, all plugged) away from the guest; its memory
    /// goes back to the host.
    fn unplug(&self, addr: u64, len: u64) -> Result<(), Self::Error>;
}

/// Why a plug failed.
#[derive(Debug, Error)]
pub enum PlugError<E: Display> {
    /// The host has no memory for it now (the driver is told NACK and retries later).
    #[error("no memory to plug")]
    NoMemory,
    /// Anything else.
    #[error("{0}")]
    Failed(E),
}

/// A region layout that cannot be served.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LayoutError {
    /// The block size is not a power of two of at least 4 KiB.
    #[error("block size {0:#x} is not a power of two of at least 4 KiB")]
    BlockSize(u64),
    /// The region is empty, not whole blocks, not block aligned, too large or wraps around.
    #[error("region {addr:#x}+{size:#x} is not a non-empty run of aligned blocks of {block:#x}")]
    Region {
        /// Its guest address.
        addr: u64,
        /// Its size.
        size: u64,
        /// The block size.
        block: u64,
    },
    /// A requested size that is not whole blocks or exceeds the region.
    #[error("requested size {requested:#x} is not whole blocks of {block:#x} up to {size:#x}")]
    RequestedSize {
        /// The size asked for.
        requested: u64,
        /// The block size.
        block: u64,
        /// The region's size.
        size: u64,
    },
}

/// Where the device's memory lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionLayout {
    /// The region's guest physical address.
    pub addr: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The block size in bytes.
    pub block_size: u64,
}

impl RegionLayout {
    /// Checks the layout: a power-of-two block size of at least 4 KiB, and a non-empty region
    /// of aligned whole blocks that does not wrap.
    pub fn check(&self) -> Result<(), LayoutError> {
        let block = self.block_size;
        if !block.is_power_of_two() || block < 4096 {
            return Err(LayoutError::BlockSize(block));
        }
        let bad = self.size == 0
            || !self.size.is_multiple_of(block)
            || !self.addr.is_multiple_of(block)
            || self.addr.checked_add(self.size).is_none();
        match bad {
            true => Err(LayoutError::Region {
                addr: self.addr,
                size: self.size,
                block,
            }),
            false => Ok(()),
        }
    }

    /// The number of blocks.
    pub fn blocks(&self) -> u64 {
        self.size / self.block_size
    }
}

/// The state of a range of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// All plugged.
    Plugged,
    /// None plugged.
    Unplugged,
    /// Some plugged.
    Mixed,
}

impl BlockState {
    /// Its value in a state response.
    pub fn wire(self) -> u16 {
        match self {
            Self::Plugged => VIRTIO_MEM_STATE_PLUGGED,
            Self::Unplugged => VIRTIO_MEM_STATE_UNPLUGGED,
            Self::Mixed => VIRTIO_MEM_STATE_MIXED,
        }
    }
}

/// What the device answered, counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestCounters {
    /// Plug requests acknowledged.
    pub plugs: u64,
    /// Unplug and unplug-all requests acknowledged.
    pub unplugs: u64,
    /// Requests answered NACK (beyond the requested size, or no host memory).
    pub nacks: u64,
    /// Requests answered ERROR (invalid).
    pub errors: u64,
    /// Requests answered BUSY (the host's side failed).
    pub busy: u64,
}

/// The blocks of a virtio-mem device and the requested size, over a backend.
#[derive(Debug)]
pub struct Blocks<B> {
    layout: RegionLayout,
    backend: B,
    /// One bit per block: plugged.
    plugged: Vec<u64>,
    plugged_blocks: u64,
    requested_size: u64,
    counters: RequestCounters,
}

impl<B: MemBackend> Blocks<B> {
    /// The blocks of `layout` over `backend`, plugged where `plugged` says (a VM whose memory
    /// outlived its VMM), with a requested size of what is plugged.
    pub fn new(
        layout: RegionLayout,
        backend: B,
        plugged: impl Fn(u64) -> bool,
    ) -> Result<Self, LayoutError> {
        layout.check()?;
        let count = layout.blocks();
        let mut bits = vec![0u64; index(count.div_ceil(64))];
        let mut plugged_blocks = 0;
        for block in 0..count {
            if plugged(layout.addr + block * layout.block_size) {
                bits[index(block / 64)] |= 1 << (block % 64);
                plugged_blocks += 1;
            }
        }
        Ok(Self {
            layout,
            backend,
            plugged: bits,
            plugged_blocks,
            requested_size: plugged_blocks * layout.block_size,
            counters: RequestCounters::default(),
        })
    }

    /// The region.
    pub fn layout(&self) -> RegionLayout {
        self.layout
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Bytes plugged.
    pub fn plugged_size(&self) -> u64 {
        self.plugged_blocks * self.layout.block_size
    }

    /// Bytes the host asks the driver to have plugged.
    pub fn requested_size(&self) -> u64 {
        self.requested_size
    }

    /// What the device answered so far.
    pub fn counters(&self) -> RequestCounters {
        self.counters
    }

    /// Sets the size the driver should plug: whole blocks, at most the region. (The caller
    /// tells the driver with a configuration change notification.)
    pub fn set_requested_size(&mut self, bytes: u64) -> Result<(), LayoutError> {
        let block = self.layout.block_size;
        if !bytes.is_multiple_of(block) || bytes > self.layout.size {
            return Err(LayoutError::RequestedSize {
                requested: bytes,
                block,
                size: self.layout.size,
            });
        }
        self.requested_size = bytes;
        Ok(())
    }

    /// The configuration space (node 0; the whole region usable).
    pub fn config_space(&self) -> [u8; config::SIZE] {
        let mut space = [0u8; config::SIZE];
        let mut put = |offset: u64, value: u64| {
            let at = index(offset);
            space[at..at + 8].copy_from_slice(&value.to_le_bytes());
        };
        put(config::BLOCK_SIZE, self.layout.block_size);
        put(config::ADDR, self.layout.addr);
        put(config::REGION_SIZE, self.layout.size);
        put(config::USABLE_REGION_SIZE, self.layout.size);
        put(config::PLUGGED_SIZE, self.plugged_size());
        put(config::REQUESTED_SIZE, self.requested_size);
        space
    }

    /// The plugged blocks, one bit each from the region's start, 64 to a word.
    pub fn plugged_bitmap(&self) -> &[u64] {
        &self.plugged
    }

    /// Whether block `block` is plugged.
    pub fn is_plugged(&self, block: u64) -> bool {
        self.plugged
            .get(index(block / 64))
            .is_some_and(|word| word & (1 << (block % 64)) != 0)
    }

    fn set(&mut self, blocks: std::ops::Range<u64>, plugged: bool) {
        for block in blocks {
            let word = &mut self.plugged[index(block / 64)];
            let bit = 1 << (block % 64);
            match (plugged, *word & bit != 0) {
                (true, false) => self.plugged_blocks += 1,
                (false, true) => self.plugged_blocks -= 1,
                _ => {}
            }
            match plugged {
                true => *word |= bit,
                false => *word &= !bit,
            }
        }
    }

    /// The blocks `count` blocks from guest address `addr` name: inside the usable region and
    /// aligned, else `None`.
    fn range(&self, addr: u64, count: u16) -> Option<std::ops::Range<u64>> {
        let offset = addr.checked_sub(self.layout.addr)?;
        let block = self.layout.block_size;
        if count == 0 || !offset.is_multiple_of(block) {
            return None;
        }
        let first = offset / block;
        let end = first.checked_add(u64::from(count))?;
        (end <= self.layout.blocks()).then_some(first..end)
    }

    fn state(&self, blocks: std::ops::Range<u64>) -> BlockState {
        let plugged = blocks.clone().filter(|&b| self.is_plugged(b)).count();
        match plugged {
            0 => BlockState::Unplugged,
            n if n == blocks.count() => BlockState::Plugged,
            _ => BlockState::Mixed,
        }
    }

    fn span(&self, blocks: &std::ops::Range<u64>) -> (u64, u64) {
        let block = self.layout.block_size;
        (
            self.layout.addr + blocks.start * block,
            (blocks.end - blocks.start) * block,
        )
    }

    /// Answers one request, applying it to the backend (see the crate docs).
    pub fn handle(&mut self, request: MemRequest) -> MemResponse {
        let response = match request {
            MemRequest::Plug { addr, blocks } => self.plug(addr, blocks),
            MemRequest::Unplug { addr, blocks } => self.unplug(addr, blocks),
            MemRequest::UnplugAll => self.unplug_all(),
            MemRequest::State { addr, blocks } => match self.range(addr, blocks) {
                Some(range) => MemResponse::Ack(Some(self.state(range))),
                None => MemResponse::Error,
            },
            MemRequest::Unknown(_) => MemResponse::Error,
        };
        let counters = &mut self.counters;
        match (response, request) {
            (MemResponse::Ack(_), MemRequest::Plug { .. }) => counters.plugs += 1,
            (MemResponse::Ack(_), MemRequest::Unplug { .. } | MemRequest::UnplugAll) => {
                counters.unplugs += 1
            }
            (MemResponse::Ack(_), _) => {}
            (MemResponse::Nack, _) => counters.nacks += 1,
            (MemResponse::Busy, _) => counters.busy += 1,
            (MemResponse::Error, _) => counters.errors += 1,
        }
        response
    }

    fn plug(&mut self, addr: u64, count: u16) -> MemResponse {
        let Some(range) = self.range(addr, count) else {
            return MemResponse::Error;
        };
        if self.state(range.clone()) != BlockState::Unplugged {
            return MemResponse::Error;
        }
        let (start, len) = self.span(&range);
        if self.plugged_size() + len > self.requested_size {
            return MemResponse::Nack;
        }
        match self.backend.plug(start, len) {
            Ok(()) => {
                self.set(range, true);
                MemResponse::Ack(None)
            }
            Err(PlugError::NoMemory) => MemResponse::Nack,
            Err(PlugError::Failed(_)) => MemResponse::Busy,
        }
    }

    fn unplug(&mut self, addr: u64, count: u16) -> MemResponse {
        let Some(range) = self.range(addr, count) else {
            return MemResponse::Error;
        };
        if self.state(range.clone()) != BlockState::Plugged {
            return MemResponse::Error;
        }
        let (start, len) = self.span(&range);
        match self.backend.unplug(start, len) {
            Ok(()) => {
                self.set(range, false);
                MemResponse::Ack(None)
            }
            Err(_) => MemResponse::Busy,
        }
    }

    fn unplug_all(&mut self) -> MemResponse {
        for block in 0..self.layout.blocks() {
            if !self.is_plugged(block) {
                continue;
            }
            let (start, len) = self.span(&(block..block + 1));
            if self.backend.unplug(start, len).is_err() {
                return MemResponse::Busy;
            }
            self.set(block..block + 1, false);
        }
        MemResponse::Ack(None)
    }
}

#[cfg(test)]
mod tests;
