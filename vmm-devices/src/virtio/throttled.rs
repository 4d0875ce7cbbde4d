//! The plumbing of a device with one request queue whose requests pass a rate limiter
//! (virtio-blk, virtio-pmem, virtio-rng), written once: [`ThrottledQueue`] holds the queue
//! between activation and reset beside the limiter, and a device that implements
//! [`ThrottledDevice`] (what it is, its config space, how it answers one request, its saved
//! state) is a [`VirtioDevice`]: activated, drained until the limiter says to wait, woken by the
//! limiter's timer, reset and restored the same way as every other such device. A device may
//! leave requests in flight (virtio-blk's asynchronous engine): it is woken when they finish,
//! and they are finished before a snapshot or a reset.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use guest_mem::GuestMemory;
use virtio_queue::{DescriptorChain, QueueState};
use vm_memory::GuestAddressSpace;

use super::request_queue::{RequestQueue, Served};
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

    /// Serves one request: answered, in flight, or left in the queue when the limiter says to
    /// wait (its timer wakes the device) or the device has no room (a finished request in
    /// flight wakes it).
    fn serve(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> Served;

    /// The descriptor that becomes readable when requests in flight finish, for a device that
    /// leaves requests in flight.
    fn completion_source(&self) -> Option<RawFd> {
        None
    }

    /// Answers the requests in flight that finished (all of them, waiting for each, when
    /// `wait`) in `queue`; returns whether a request left in the queue for want of room may be
    /// served now.
    fn complete_in_flight(
        &mut self,
        _mem: &GuestMemory,
        _queue: &mut RequestQueue,
        _wait: bool,
    ) -> bool {
        false
    }

    /// Its state for a snapshot (taken once nothing is in flight; a request that waits for the
    /// limiter is still in the queue).
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

/// Answers `device`'s requests in flight that finished (all of them when `wait`); returns
/// whether the queue may be looked at again.
fn finish_in_flight<D: ThrottledDevice>(device: &mut D, wait: bool) -> bool {
    let queue = device.queue_mut();
    let Some(mut active) = queue.active.take() else {
        return false;
    };
    let memory = Arc::clone(queue.memory());
    let mem = memory.memory();
    let more = device.complete_in_flight(&mem, &mut active, wait);
    device.queue_mut().active = Some(active);
    more
}

/// The index of the completion source among a device's wake sources (after the limiter's).
const COMPLETION_SOURCE: usize = 1;

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
        finish_in_flight(self, true);
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

    fn quiesce(&mut self) {
        finish_in_flight(self, true);
    }

    fn save_state(&self) -> DeviceState {
        self.saved_state()
    }

    fn wake_sources(&self) -> Vec<WakeSource> {
        let timer = WakeSource::level(self.queue().throttle.as_raw_fd());
        std::iter::once(timer)
            .chain(self.completion_source().map(WakeSource::level))
            .collect()
    }

    fn wake(&mut self, source: usize) {
        if source == COMPLETION_SOURCE {
            if finish_in_flight(self, false) {
                self.process_queue(0);
            }
            return;
        }
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
