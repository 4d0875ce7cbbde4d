//! The plumbing of a device with one request queue whose requests pass a rate limiter
//! (virtio-blk, virtio-pmem, virtio-rng), written once: [`ThrottledQueue`] holds the queue
//! between activation and reset beside the limiter, and a device that implements
//! [`ThrottledDevice`] (what it is, its config space, how it answers one request, its saved
//! state) is a [`VirtioDevice`]: activated, drained until the limiter says to wait, woken by the
//! limiter's timer, reset and restored the same way as every other such device.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use guest_mem::GuestMemory;
use virtio_queue::{DescriptorChain, QueueState};
use vm_memory::GuestAddressSpace;

use super::request_queue::RequestQueue;
use super::DeviceMemory;
use super::{ActivateError, Activation, DeviceState, VirtioDevice, WakeSource};
use crate::rate_limiter::Throttle;
use crate::GuestWarnings;

/// A device's request queue (once the driver made it ready), the guest memory it lives in,
/// and its rate limiter.
#[derive(Debug)]
pub struct ThrottledQueue {
    active: Option<RequestQueue>,
    memory: DeviceMemory,
    throttle: Throttle,
}

impl ThrottledQueue {
    /// A queue in `memory`, not ready yet, behind `throttle`.
    pub fn new(memory: DeviceMemory, throttle: Throttle) -> Self {
        Self {
            active: None,
            memory,
            throttle,
        }
    }

    /// The guest memory the queue and its requests' buffers live in.
    pub fn memory(&self) -> &DeviceMemory {
        &self.memory
    }

    /// The rate limiter, which a request is admitted by.
    pub fn throttle(&mut self) -> &mut Throttle {
        &mut self.throttle
    }

    /// The queue, while the driver has it ready.
    pub fn active(&self) -> Option<&RequestQueue> {
        self.active.as_ref()
    }
}

/// What a device with one request queue behind a rate limiter is besides its queue.
pub trait ThrottledDevice: Send {
    /// The device's name in the log, e.g. "virtio-blk".
    const NAME: &'static str;
    /// The virtio device type.
    const TYPE: u32;
    /// The size of its queue, as the one entry of a list.
    const QUEUE_SIZES: &'static [u16];

    /// The features it offers besides the transport's.
    fn offered_features(&self) -> u64 {
        0
    }

    /// Reads its config space at `offset` into `data`.
    fn config_read(&self, offset: u64, data: &mut [u8]);

    /// The driver wrote the config space, which such devices only read: a warning.
    fn config_write(&mut self, offset: u64) {
        self.warnings().warn(format_args!(
            "{}: write to the read-only config space at {offset}",
            Self::NAME
        ));
    }

    /// Its queue and limiter.
    fn queue(&self) -> &ThrottledQueue;

    /// Its queue and limiter, to change.
    fn queue_mut(&mut self) -> &mut ThrottledQueue;

    /// Its guest-triggered warnings.
    fn warnings(&self) -> &GuestWarnings;

    /// Answers one request: the bytes written into its buffers, or `None` when the limiter
    /// says to wait (the request stays in the queue, and the limiter's timer wakes the device).
    fn serve(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> Option<u32>;

    /// Its state for a snapshot (requests are answered to the end before the device yields:
    /// nothing is in flight; one that waits for the limiter is still in the queue).
    fn saved_state(&self) -> DeviceState {
        DeviceState::Plain
    }

    /// Takes its part of a saved state.
    fn restore_saved(&mut self, state: &DeviceState) -> Result<(), ActivateError> {
        match state {
            DeviceState::Plain => Ok(()),
            state => Err(ActivateError::Device(
                format!("a {} device cannot take the state {state:?}", Self::NAME).into(),
            )),
        }
    }
}

impl<D: ThrottledDevice> VirtioDevice<DeviceMemory> for D {
    fn device_type(&self) -> u32 {
        Self::TYPE
    }

    fn device_features(&self) -> u64 {
        self.offered_features()
    }

    fn queue_max_sizes(&self) -> &[u16] {
        Self::QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.config_read(offset, data);
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        self.config_write(offset);
    }

    fn activate(&mut self, activation: Activation<DeviceMemory>) -> Result<(), ActivateError> {
        self.queue_mut().active = Some(RequestQueue::take(activation)?);
        Ok(())
    }

    fn process_queue(&mut self, index: u16) {
        let queue = self.queue_mut();
        if index != 0 || queue.throttle.is_waiting() {
            return;
        }
        let Some(mut active) = queue.active.take() else {
            return;
        };
        let memory = Arc::clone(queue.memory());
        let mem = memory.memory();
        let drained = active.drain_until(&mem, Self::NAME, |chain| self.serve(&mem, chain));
        if let Err(e) = drained {
            self.warnings().warn(format_args!("{}: {e}", Self::NAME));
        }
        self.queue_mut().active = Some(active);
    }

    fn reset(&mut self) {
        let queue = self.queue_mut();
        queue.active = None;
        queue.throttle.reset();
    }

    fn queue_states(&self) -> Vec<(u16, QueueState)> {
        self.queue()
            .active
            .iter()
            .map(|active| (0, active.state()))
            .collect()
    }

    fn save_state(&self) -> DeviceState {
        self.saved_state()
    }

    fn wake_sources(&self) -> Vec<WakeSource> {
        vec![WakeSource::level(self.queue().throttle.as_raw_fd())]
    }

    fn wake(&mut self, _source: usize) {
        self.queue_mut().throttle.fired();
        self.process_queue(0);
    }

    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<DeviceMemory>>,
    ) -> Result<(), ActivateError> {
        self.restore_saved(state)?;
        if let Some(activation) = activation {
            self.activate(activation)?;
            // A request may have waited for the rate limiter when the state was saved: look
            // at the queue once the VM runs.
            self.queue_mut().throttle.wake_soon();
        }
        Ok(())
    }
}
