//! A virtio device for tests of transports and of what holds devices: two queues, 8 bytes of
//! config space, and a record of what happened to it (feature `testing`, and the crate's own
//! tests).

use std::sync::Arc;

use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{QueueState, QueueT};
use vm_memory::GuestMemoryMmap;

use crate::virtio::{ActivateError, Activation, DeviceState, VirtioDevice};

/// The memory the test device's queues live in.
pub type MmapMemory = Arc<GuestMemoryMmap<()>>;

/// The test device's virtio device type (none of the spec's).
pub const TEST_DEVICE_TYPE: u32 = 42;
/// The features the test device offers.
pub const TEST_FEATURES: u64 = (1 << 3) | (1 << VIRTIO_RING_F_EVENT_IDX);

/// Queue index, size, descriptor table address and event-idx flag of an activated queue.
pub(crate) type QueueRecord = (u16, u16, u64, bool);
/// Acked features and queues of one activation.
pub(crate) type ActivationRecord = (u64, Vec<QueueRecord>);

/// A device with two queues and 8 bytes of config space that records what happens to it.
#[derive(Debug, Default)]
pub struct TestDevice {
    pub(crate) config: [u8; 8],
    pub(crate) activations: Vec<ActivationRecord>,
    pub(crate) resets: usize,
    pub(crate) processed: Vec<u16>,
    pub(crate) fail_activation: bool,
}

impl VirtioDevice<MmapMemory> for TestDevice {
    fn device_type(&self) -> u32 {
        TEST_DEVICE_TYPE
    }
    fn device_features(&self) -> u64 {
        TEST_FEATURES
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[16, 256]
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i as u64)
                .and_then(|o| self.config.get(usize::try_from(o).ok()?).copied())
                .unwrap_or(0);
        }
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        for (i, byte) in data.iter().enumerate() {
            if let Some(slot) = offset
                .checked_add(i as u64)
                .and_then(|o| self.config.get_mut(usize::try_from(o).ok()?))
            {
                *slot = *byte;
            }
        }
    }
    fn activate(&mut self, activation: Activation<MmapMemory>) -> Result<(), ActivateError> {
        if self.fail_activation {
            return Err(ActivateError::MissingQueue(1));
        }
        let queues = activation
            .queues
            .iter()
            .map(|q| {
                (
                    q.index,
                    q.queue.size(),
                    q.queue.desc_table(),
                    q.queue.event_idx_enabled(),
                )
            })
            .collect();
        self.activations.push((activation.acked_features, queues));
        Ok(())
    }
    fn process_queue(&mut self, index: u16) {
        self.processed.push(index);
    }
    fn reset(&mut self) {
        self.resets += 1;
    }
    fn queue_states(&self) -> Vec<(u16, QueueState)> {
        Vec::new()
    }
    fn save_state(&self) -> DeviceState {
        DeviceState::Plain
    }
    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<MmapMemory>>,
    ) -> Result<(), ActivateError> {
        assert_eq!(state, &DeviceState::Plain);
        activation.map_or(Ok(()), |activation| self.activate(activation))
    }
}
