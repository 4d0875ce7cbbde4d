//! Virtio devices and their transport.
//!
//! A device implements [`VirtioDevice`]: it describes itself (type, features, queues, config
//! space) and, once the driver has set everything up, receives its queues in an [`Activation`].
//! The transport ([`mmio::MmioTransport`]) owns all guest-visible registers, validates every
//! value the driver writes and drives the device through activation and reset.

pub mod buffers;
pub mod interrupt;
pub mod mmio;
pub mod request_queue;
pub mod state;
pub mod throttled;

use std::sync::Arc;

use guest_mem::GuestMemory;
use virtio_queue::{Queue, QueueState};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::EventFd;

pub use interrupt::Interrupt;
pub use state::DeviceState;

/// The guest memory the VMM's virtio devices work on: guest-mem's, shared with the vCPUs and
/// the fault handlers.
pub type DeviceMemory = Arc<GuestMemory>;

/// Device status bits (virtio 1.2 §2.1), from virtio-bindings.
pub mod status {
    pub use virtio_bindings::virtio_config::{
        VIRTIO_CONFIG_S_ACKNOWLEDGE as ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER as DRIVER,
        VIRTIO_CONFIG_S_DRIVER_OK as DRIVER_OK, VIRTIO_CONFIG_S_FAILED as FAILED,
        VIRTIO_CONFIG_S_FEATURES_OK as FEATURES_OK,
        VIRTIO_CONFIG_S_NEEDS_RESET as DEVICE_NEEDS_RESET,
    };
}

pub use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
pub use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// Errors a device reports when it cannot be activated.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The driver did not make a queue ready that the device needs.
    #[error("queue {0} is required but was not set up by the driver")]
    MissingQueue(u16),
    /// Cloning or creating an event file descriptor failed.
    #[error("event fd: {0}")]
    EventFd(#[source] std::io::Error),
    /// A device-specific failure.
    #[error("device failed to activate: {0}")]
    Device(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// A queue the driver made ready, handed to the device on activation.
#[derive(Debug)]
pub struct ActiveQueue {
    /// Queue index as numbered by the device type (e.g. balloon: 0 inflate, 1 deflate).
    pub index: u16,
    /// The validated queue: ready, with a legal size and rings inside guest memory.
    pub queue: Queue,
    /// Signalled when the driver notifies this queue (via ioeventfd or a trapped MMIO write).
    pub notifier: EventFd,
}

/// Everything a device needs to run, handed over when the driver sets DRIVER_OK.
#[derive(Debug)]
pub struct Activation<M> {
    /// Guest memory the queues live in.
    pub memory: M,
    /// Features both sides agreed on.
    pub acked_features: u64,
    /// The queues the driver made ready, in index order; unused queues are left out.
    pub queues: Vec<ActiveQueue>,
    /// Interrupt to raise for used buffers and configuration changes.
    pub interrupt: Arc<Interrupt>,
}

/// A file descriptor a device has the event loop watch for input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakeSource {
    /// The descriptor.
    pub fd: std::os::fd::RawFd,
    /// Reported once per arrival of input (epoll's EPOLLET), not for as long as input is
    /// there: the device reads until it would block, or remembers that it stopped early.
    pub edge_triggered: bool,
}

impl WakeSource {
    /// A level-triggered source (a timer the device reads when it fires).
    pub fn level(fd: std::os::fd::RawFd) -> Self {
        WakeSource {
            fd,
            edge_triggered: false,
        }
    }
}

/// A virtio device, independent of the transport it sits behind.
pub trait VirtioDevice<M: GuestAddressSpace>: Send {
    /// Virtio device ID (virtio 1.2 §5; e.g. 5 for the balloon).
    fn device_type(&self) -> u32;
    /// Features the device offers. The modern transport adds `VIRTIO_F_VERSION_1` itself.
    fn device_features(&self) -> u64;
    /// Maximum size of each queue (powers of two, at most 32768); one entry per queue.
    fn queue_max_sizes(&self) -> &[u16];
    /// Reads config space at `offset`. Bytes past the end of config space read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes config space at `offset`. Writes to read-only or missing fields are ignored.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Starts the device with the queues the driver set up.
    fn activate(&mut self, activation: Activation<M>) -> Result<(), ActivateError>;
    /// Handles a driver notification on queue `index`; called by the event loop. Must ignore
    /// notifications while inactive and for queues it does not hold.
    fn process_queue(&mut self, index: u16);
    /// Stops the device and drops its queues; it must be ready for a new activation.
    fn reset(&mut self);
    /// The positions of the queues an active device holds, by queue index (the transport's
    /// copies stop at the activation); empty while inactive.
    fn queue_states(&self) -> Vec<(u16, QueueState)>;
    /// Finishes what the device has in flight (requests an asynchronous engine still works
    /// on), answering it, before a snapshot saves the queues; called with the VM paused.
    fn quiesce(&mut self) {}
    /// The device's own state, for a snapshot.
    fn save_state(&self) -> DeviceState;
    /// File descriptors the device wants the event loop to watch besides its queues (a rate
    /// limiter's timer, a tap); [`Self::wake`] is called with the index of one that is ready.
    fn wake_sources(&self) -> Vec<WakeSource> {
        Vec::new()
    }
    /// Its [`Self::wake_sources`]`[source]` is ready.
    fn wake(&mut self, _source: usize) {}
    /// Restores a saved state into a device fresh from its constructor; a device that was
    /// active gets its queues in `activation`. Unlike [`Self::activate`] it processes nothing
    /// (buffers made available wait for the next notification). The state comes from a file:
    /// everything is checked, and a state of another device type is refused.
    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<M>>,
    ) -> Result<(), ActivateError>;
}
