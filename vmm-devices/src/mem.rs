//! The virtio-mem device (virtio 1.2 §5.15) over the VM's hot-pluggable memory: the guest plugs
//! and unplugs 2 MiB (or larger) blocks to reach the size the host requests (Firecracker's
//! `PATCH /hotplug/memory`). A plug takes a frame of the VM's pool or zone for each chunk with
//! the device's own LLFree core id, an unplug gives them back scrubbed at once, and unplugged
//! memory is inaccessible (guest-mem's hot-pluggable region): on a shared zone one VM's unplug
//! is another's plug, nothing copied.
//!
//! The request logic is the `virtio-mem` crate's; this module puts it on a virtio-mmio
//! transport. Everything the guest writes is checked: a request needs a readable descriptor of
//! 24 bytes and a writable one of 10; anything else is put in the used ring unanswered and
//! counted as a warning (rate-limited). The device offers VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE
//! and needs it: a driver that might touch unplugged memory (Linux before 5.16) is refused.

pub mod config;

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use guest_mem::{CoreFrames, GuestMemory, MemoryError, RegionError as MemoryRegionError};
use virtio_mem::spec::{
    REQUEST_SIZE, RESPONSE_SIZE, VIRTIO_ID_MEM, VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE,
};
use virtio_mem::{Blocks, MemBackend, MemRequest, PlugError, RegionLayout};
use virtio_queue::{DescriptorChain, QueueState};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};

use crate::virtio::request_queue::{read_config, request_and_answer, RequestQueue};
use crate::virtio::DeviceMemory;
use crate::virtio::{ActivateError, Activation, DeviceState, VirtioDevice};
use crate::{BusDevice, GuestWarnings};
use config::{HotplugConfig, HotplugConfigError};

/// The request's and the answer's lengths, as descriptor lengths.
const REQUEST_LEN: u32 = 24;
const RESPONSE_LEN: u32 = 10;
const _: () =
    assert!(REQUEST_LEN as usize == REQUEST_SIZE && RESPONSE_LEN as usize == RESPONSE_SIZE);
/// Size of the request queue (Linux sends one request at a time).
const QUEUE_SIZE: u16 = 128;
const QUEUE_SIZES: [u16; 1] = [QUEUE_SIZE];

/// Plugs and unplugs guest-mem's hot-pluggable memory with a core id of its own, through the
/// core's cache.
#[derive(Debug)]
pub struct HotplugBackend {
    memory: DeviceMemory,
    /// The device's requests come one at a time (the device is behind its lock).
    core: RefCell<CoreFrames>,
}

impl MemBackend for HotplugBackend {
    type Error = MemoryError;

    fn plug(&self, addr: u64, len: u64) -> Result<(), PlugError<MemoryError>> {
        let plugged = self
            .memory
            .plug(GuestAddress(addr), len, &mut self.core.borrow_mut());
        match plugged {
            Ok(()) => Ok(()),
            Err(MemoryError::Region(MemoryRegionError::Exhausted(_))) => Err(PlugError::NoMemory),
            Err(e) => Err(PlugError::Failed(e)),
        }
    }

    fn unplug(&self, addr: u64, len: u64) -> Result<(), MemoryError> {
        self.memory
            .unplug(GuestAddress(addr), len, &mut self.core.borrow_mut())
            .map(drop)
    }
}

/// Why a requested size was refused.
#[derive(Debug, thiserror::Error)]
pub enum MemControlError {
    /// Not whole blocks, or more than the region.
    #[error(transparent)]
    Size(#[from] HotplugConfigError),
    /// Telling the driver failed.
    #[error("cannot notify the driver: {0}")]
    Notify(#[source] std::io::Error),
}

/// Where the device is, as the control API shows it (`GET /hotplug/memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotplugStatus {
    /// The configuration.
    pub config: HotplugConfig,
    /// The region's guest address.
    pub addr: u64,
    /// Bytes plugged.
    pub plugged_size: u64,
    /// Bytes requested.
    pub requested_size: u64,
    /// Whether a driver drives the device.
    pub active: bool,
}

/// What the control API keeps of the device.
#[derive(Debug, Clone)]
pub struct MemHandle {
    config: HotplugConfig,
    device: Arc<Mutex<MemDevice>>,
}

impl MemHandle {
    fn lock(&self) -> MutexGuard<'_, MemDevice> {
        self.device.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The configuration.
    pub fn config(&self) -> HotplugConfig {
        self.config
    }

    /// Sizes and state.
    pub fn status(&self) -> HotplugStatus {
        let device = self.lock();
        HotplugStatus {
            config: self.config,
            addr: device.blocks.layout().addr,
            plugged_size: device.blocks.plugged_size(),
            requested_size: device.blocks.requested_size(),
            active: device.active.is_some(),
        }
    }

    /// The plugged blocks, one bit each from the region's start, 64 to a word (snapshots).
    pub fn plugged_blocks(&self) -> Vec<u64> {
        self.lock().blocks.plugged_bitmap().to_vec()
    }

    /// Firecracker's `PATCH /hotplug/memory`: the size the guest should plug, whole blocks up
    /// to the total; an active driver hears of it at once.
    pub fn set_requested_size(&self, bytes: u64) -> Result<(), MemControlError> {
        self.config.check_requested(bytes)?;
        let mut device = self.lock();
        device
            .blocks
            .set_requested_size(bytes)
            .map_err(|e| HotplugConfigError::Invalid(e.to_string()))?;
        match &device.active {
            Some(queue) => queue
                .signal_config_change()
                .map_err(MemControlError::Notify),
            None => Ok(()),
        }
    }
}

/// On the MMIO bus over the hot-pluggable region: where KVM leaves a guest's access to
/// unplugged memory to the VMM (its memory slot has no page there; PVM does so, hardware KVM
/// fails `KVM_RUN` instead), the guest gets no memory: reads return all ones, writes are
/// dropped, with a rate-limited warning.
#[derive(Debug, Default)]
pub struct UnpluggedMemory {
    warnings: GuestWarnings,
}

impl BusDevice for UnpluggedMemory {
    fn read(&self, base: u64, offset: u64, data: &mut [u8]) {
        self.warnings.warn(format_args!(
            "virtio-mem: the guest read unplugged memory at {:#x}: it reads as all ones",
            base.wrapping_add(offset)
        ));
        data.fill(0xff);
    }

    fn write(&self, base: u64, offset: u64, _data: &[u8]) {
        self.warnings.warn(format_args!(
            "virtio-mem: the guest wrote to unplugged memory at {:#x}: the write is dropped",
            base.wrapping_add(offset)
        ));
    }
}

/// A virtio-mem device over the hot-pluggable memory of a guest memory.
#[derive(Debug)]
pub struct MemDevice {
    blocks: Blocks<HotplugBackend>,
    memory: DeviceMemory,
    active: Option<RequestQueue>,
    warnings: GuestWarnings,
}

impl MemDevice {
    /// The device of `config` over `memory`'s hot-pluggable region, which must be there; the
    /// blocks plugged in it (a VM in a zone, plugged before this process) stay plugged and
    /// requested.
    pub fn new(memory: DeviceMemory, config: HotplugConfig) -> Result<Self, ActivateError> {
        let region = memory.hotplug_region().ok_or_else(|| {
            ActivateError::Device("the guest memory has no hot-pluggable region".into())
        })?;
        let layout = RegionLayout {
            addr: region.start().0,
            size: region.size(),
            block_size: config.block_size,
        };
        let plugged = |addr: u64| {
            memory
                .plugged_chunks(GuestAddress(addr), config.block_size)
                .is_ok_and(|chunks| chunks > 0)
        };
        let pool = memory.pool();
        let backend = HotplugBackend {
            memory: Arc::clone(&memory),
            core: RefCell::new(pool.core_frames(pool.claim_cores(1))),
        };
        let blocks = Blocks::new(layout, backend, plugged)
            .map_err(|e| ActivateError::Device(Box::new(e)))?;
        if blocks.plugged_size() > 0 {
            log::info!(
                "virtio-mem: {} MiB plugged at the start, as the VM left it",
                blocks.plugged_size() >> 20
            );
        }
        Ok(Self {
            blocks,
            memory,
            active: None,
            warnings: GuestWarnings::default(),
        })
    }

    /// The hot-pluggable region: guest address and size.
    pub fn region(&self) -> (u64, u64) {
        let layout = self.blocks.layout();
        (layout.addr, layout.size)
    }

    /// The device, shared with the event loop, and its handle for the control API.
    pub fn into_shared(self, config: HotplugConfig) -> (Arc<Mutex<Self>>, MemHandle) {
        let device = Arc::new(Mutex::new(self));
        let handle = MemHandle {
            config,
            device: Arc::clone(&device),
        };
        (device, handle)
    }

    /// Answers one request; returns the bytes written to the guest.
    fn answer(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
        let Some((request, response)) = request_and_answer(chain, REQUEST_LEN, RESPONSE_LEN) else {
            self.warnings.warn(format_args!(
                "virtio-mem: a request lacks its {REQUEST_SIZE}-byte request or its \
                 {RESPONSE_SIZE}-byte answer buffer"
            ));
            return 0;
        };
        let mut bytes = [0u8; REQUEST_SIZE];
        if mem.read_slice(&mut bytes, request).is_err() {
            self.warnings.warn(format_args!(
                "virtio-mem: the request is not in guest memory"
            ));
            return 0;
        }
        let request = MemRequest::parse(&bytes);
        // Timed only when it is logged: no clock read on the request path otherwise.
        let started = log::log_enabled!(log::Level::Debug).then(std::time::Instant::now);
        let answer = self.blocks.handle(request);
        if let Some(started) = started {
            log::debug!(
                "virtio-mem: {request:?}: {answer:?} in {:?}",
                started.elapsed()
            );
        }
        match mem.write_slice(&answer.to_bytes(), response) {
            Ok(()) => RESPONSE_LEN,
            Err(_) => {
                self.warnings.warn(format_args!(
                    "virtio-mem: the answer buffer is not in guest memory"
                ));
                0
            }
        }
    }
}

impl VirtioDevice<DeviceMemory> for MemDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_MEM
    }

    fn device_features(&self) -> u64 {
        1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config(&self.blocks.config_space(), offset, data);
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        self.warnings.warn(format_args!(
            "virtio-mem: write to the read-only config space at {offset}"
        ));
    }

    fn activate(&mut self, activation: Activation<DeviceMemory>) -> Result<(), ActivateError> {
        if activation.acked_features & (1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE) == 0 {
            return Err(ActivateError::Device(
                "the driver does not take VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE (Linux 5.16 or \
                 later does): unplugged memory is inaccessible here"
                    .into(),
            ));
        }
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
            if let Err(e) = active.drain(&mem, "virtio-mem", |chain| self.answer(&mem, chain)) {
                self.warnings.warn(format_args!("virtio-mem: {e}"));
            }
        }
        self.active = Some(active);
    }

    fn reset(&mut self) {
        // The blocks keep their state (virtio 1.2 §5.15.6.3); Linux unplugs all on probe.
        self.active = None;
    }

    fn queue_states(&self) -> Vec<(u16, QueueState)> {
        self.active
            .iter()
            .map(|active| (0, active.state()))
            .collect()
    }

    fn save_state(&self) -> DeviceState {
        DeviceState::Mem {
            requested_size: self.blocks.requested_size(),
        }
    }

    /// The plugged blocks came back with the memory (see `runner::restore`); the requested
    /// size comes from the state.
    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<DeviceMemory>>,
    ) -> Result<(), ActivateError> {
        let DeviceState::Mem { requested_size } = state else {
            return Err(ActivateError::Device(
                format!("a virtio-mem device cannot take the state {state:?}").into(),
            ));
        };
        self.blocks
            .set_requested_size(*requested_size)
            .map_err(|e| ActivateError::Device(Box::new(e)))?;
        if let Some(activation) = activation {
            self.activate(activation)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
