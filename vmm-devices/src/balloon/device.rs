//! The balloon as a [`VirtioDevice`]: the transport-independent `virtio_balloon::VirtioBalloon` over a
//! [`GuestMemBackend`], with its interrupts raised through the transport's [`Interrupt`].

use std::io;
use std::sync::Arc;

use guest_mem::GuestMemory;
use log::warn;
use virtio_balloon::{BalloonConfig, BalloonError, GuestNotifier, Reactivation, VirtioBalloon};
use virtio_queue::QueueState;

use super::backend::GuestMemBackend;
use crate::virtio::mmio::MmioTransport;
use crate::virtio::DeviceMemory;
use crate::virtio::{ActivateError, Activation, DeviceState, Interrupt, VirtioDevice};

/// The balloon behind its virtio-mmio transport.
pub type BalloonTransport = MmioTransport<DeviceMemory, BalloonDevice>;

/// Raises the transport's interrupt for the balloon.
struct InterruptNotifier(Arc<Interrupt>);

impl GuestNotifier for InterruptNotifier {
    fn queue_used(&self, _index: u16) -> io::Result<()> {
        self.0.signal_used_queue()
    }

    fn config_changed(&self) -> io::Result<()> {
        self.0.signal_config_change()
    }

    fn needs_reset(&self) -> io::Result<()> {
        self.0.signal_needs_reset()
    }
}

/// A virtio-balloon device on guest-mem memory.
#[derive(Debug)]
pub struct BalloonDevice {
    balloon: VirtioBalloon<DeviceMemory, GuestMemBackend>,
}

impl BalloonDevice {
    /// A balloon with `config`'s options over `memory`; it frees frames with a core id of its
    /// own.
    pub fn new(config: BalloonConfig, memory: Arc<GuestMemory>) -> Result<Self, BalloonError> {
        let balloon = VirtioBalloon::new(config, GuestMemBackend::new(memory))?;
        Ok(Self { balloon })
    }

    /// The device logic: target, statistics requests, information.
    pub fn balloon(&self) -> &VirtioBalloon<DeviceMemory, GuestMemBackend> {
        &self.balloon
    }

    /// The device logic, mutably.
    pub fn balloon_mut(&mut self) -> &mut VirtioBalloon<DeviceMemory, GuestMemBackend> {
        &mut self.balloon
    }
}

impl VirtioDevice<DeviceMemory> for BalloonDevice {
    fn device_type(&self) -> u32 {
        self.balloon.device_type()
    }

    fn device_features(&self) -> u64 {
        self.balloon.device_features()
    }

    fn queue_max_sizes(&self) -> &[u16] {
        self.balloon.queue_max_sizes()
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.balloon.read_config(offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.balloon.write_config(offset, data);
    }

    fn activate(&mut self, activation: Activation<DeviceMemory>) -> Result<(), ActivateError> {
        let queues = activation.queues.into_iter().map(|q| (q.index, q.queue));
        let notifier = Arc::new(InterruptNotifier(activation.interrupt));
        self.balloon
            .activate(
                activation.memory,
                activation.acked_features,
                queues,
                notifier,
            )
            .map_err(|e| ActivateError::Device(Box::new(e)))
    }

    fn process_queue(&mut self, index: u16) {
        if let Err(e) = self.balloon.process_queue(index) {
            warn!("virtio-balloon: queue {index}: {e}");
        }
    }

    fn reset(&mut self) {
        self.balloon.reset();
    }

    fn queue_states(&self) -> Vec<(u16, QueueState)> {
        self.balloon.queue_states()
    }

    fn save_state(&self) -> DeviceState {
        DeviceState::Balloon(Box::new(self.balloon.save_state()))
    }

    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<DeviceMemory>>,
    ) -> Result<(), ActivateError> {
        let DeviceState::Balloon(state) = state else {
            return Err(ActivateError::Device(
                format!("a virtio-balloon cannot take the state {state:?}").into(),
            ));
        };
        let reactivation = activation.map(|activation| Reactivation {
            memory: activation.memory,
            queues: activation
                .queues
                .into_iter()
                .map(|q| (q.index, q.queue))
                .collect::<Vec<_>>(),
            notifier: Arc::new(InterruptNotifier(activation.interrupt)) as Arc<dyn GuestNotifier>,
        });
        self.balloon
            .restore(state, reactivation)
            .map_err(|e| ActivateError::Device(Box::new(e)))
    }
}
