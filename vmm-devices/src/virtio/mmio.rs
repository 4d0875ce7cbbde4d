//! The virtio-mmio transport, modern interface (version 2; virtio 1.2 §4.2.2).
//!
//! Every value the driver writes is validated: registers are only accepted as aligned 32-bit
//! accesses, in the device states where the spec allows them, queue sizes must be powers of two
//! no larger than the maximum, and rings must lie inside guest memory. Anything else is ignored
//! with a warning, rate-limited ([`GuestWarnings`]); nothing a guest writes can panic the VMM.

mod queue_config;
pub mod registers;
mod status;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::sync::{Arc, Mutex, MutexGuard};

use log::warn;
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::interrupt::Interrupt;
use super::state::{MmioSnapshot, QueueSnapshot};
use super::status::{DRIVER, DRIVER_OK, FAILED, FEATURES_OK};
use super::{Activation, ActiveQueue, VirtioDevice, VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX};
use crate::bus::BusDevice;
use crate::GuestWarnings;
use registers as reg;

/// Errors creating a transport.
#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    /// The device reports a queue maximum that is zero, too large or not a power of two.
    #[error("queue {index}: invalid maximum size {max_size}")]
    InvalidQueueMaxSize {
        /// Queue index.
        index: usize,
        /// Reported maximum.
        max_size: u16,
    },
    /// The device has more queues than the transport can address.
    #[error("too many queues: {0}")]
    TooManyQueues(usize),
    /// Creating an event fd failed.
    #[error("event fd: {0}")]
    EventFd(#[source] std::io::Error),
    /// A saved state does not fit the device or is inconsistent.
    #[error("cannot restore the device: {0}")]
    BadState(String),
}

/// A transport whose state a snapshot saves and restores, whatever its device and memory.
pub trait StatefulTransport: Send + Sync {
    /// See [`MmioTransport::save_state`].
    fn save_state(&self) -> MmioSnapshot;
    /// See [`MmioTransport::restore_state`].
    fn restore_state(&self, saved: &MmioSnapshot) -> Result<(), MmioError>;
}

impl<M, D> StatefulTransport for MmioTransport<M, D>
where
    M: GuestAddressSpace + Send + Sync,
    D: VirtioDevice<M>,
{
    fn save_state(&self) -> MmioSnapshot {
        MmioTransport::save_state(self)
    }

    fn restore_state(&self, saved: &MmioSnapshot) -> Result<(), MmioError> {
        MmioTransport::restore_state(self, saved)
    }
}

/// Driver-visible transport state, guarded by one lock.
#[derive(Debug)]
struct TransportState<M> {
    memory: M,
    device_status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    queues: Vec<Queue>,
    activated: bool,
}

/// A virtio device behind the virtio-mmio register interface.
#[derive(Debug)]
pub struct MmioTransport<M: GuestAddressSpace, D: VirtioDevice<M>> {
    state: Mutex<TransportState<M>>,
    device: Arc<Mutex<D>>,
    device_type: u32,
    device_features: u64,
    interrupt: Arc<Interrupt>,
    notifiers: Vec<EventFd>,
    /// Driver mistakes (or attacks) on the registers, rate-limited in the log.
    warnings: GuestWarnings,
}

/// Locks a mutex, recovering the data if a previous holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<M: GuestAddressSpace, D: VirtioDevice<M>> MmioTransport<M, D> {
    /// Wraps `device`; its interrupt raises `irq` and its queues read and write `memory`.
    pub fn new(memory: M, device: Arc<Mutex<D>>, irq: EventFd) -> Result<Self, MmioError> {
        let (device_type, device_features, max_sizes) = {
            let dev = lock(&device);
            let max_sizes = dev.queue_max_sizes().to_vec();
            (
                dev.device_type(),
                dev.device_features() | (1 << VIRTIO_F_VERSION_1),
                max_sizes,
            )
        };
        if max_sizes.len() > usize::from(u16::MAX) {
            return Err(MmioError::TooManyQueues(max_sizes.len()));
        }
        let queues = max_sizes
            .iter()
            .enumerate()
            .map(|(index, &max_size)| {
                Queue::new(max_size).map_err(|_| MmioError::InvalidQueueMaxSize { index, max_size })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let notifiers = (0..queues.len())
            .map(|_| EventFd::new(EFD_NONBLOCK).map_err(MmioError::EventFd))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MmioTransport {
            state: Mutex::new(TransportState {
                memory,
                device_status: 0,
                device_features_sel: 0,
                driver_features_sel: 0,
                driver_features: 0,
                queue_sel: 0,
                queues,
                activated: false,
            }),
            device,
            device_type,
            device_features,
            interrupt: Arc::new(Interrupt::new(irq)),
            notifiers,
            warnings: GuestWarnings::default(),
        })
    }

    /// The device, shared with whoever processes its queues.
    pub fn device(&self) -> &Arc<Mutex<D>> {
        &self.device
    }

    /// The interrupt; its event fd is the device's irqfd.
    pub fn interrupt(&self) -> &Arc<Interrupt> {
        &self.interrupt
    }

    /// One event fd per queue, signalled on a queue notification. Register each with
    /// `KVM_IOEVENTFD` at `base + QUEUE_NOTIFY_OFFSET` with its queue index as datamatch.
    pub fn queue_notifiers(&self) -> &[EventFd] {
        &self.notifiers
    }

    /// Offset of the QueueNotify register, for ioeventfd registration.
    pub const QUEUE_NOTIFY_OFFSET: u64 = reg::QUEUE_NOTIFY;

    /// Current device status as the driver sees it.
    pub fn device_status(&self) -> u32 {
        self.status_of(&lock(&self.state))
    }

    /// The status register: the driver's progress, and DEVICE_NEEDS_RESET once the device
    /// stopped on a broken queue.
    fn status_of(&self, state: &TransportState<M>) -> u32 {
        if self.interrupt.needs_reset() {
            state.device_status | super::status::DEVICE_NEEDS_RESET
        } else {
            state.device_status
        }
    }

    /// Whether the device has been activated (DRIVER_OK accepted).
    pub fn is_activated(&self) -> bool {
        lock(&self.state).activated
    }

    fn read_register(&self, state: &TransportState<M>, offset: u64) -> Option<u32> {
        let queue = state.queues.get(state.queue_sel as usize);
        let value = match offset {
            reg::MAGIC_VALUE => reg::MAGIC,
            reg::VERSION => reg::MODERN_VERSION,
            reg::DEVICE_ID => self.device_type,
            reg::VENDOR_ID => reg::VENDOR,
            reg::DEVICE_FEATURES => match state.device_features_sel {
                0 => low_half(self.device_features),
                1 => low_half(self.device_features >> 32),
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => queue.map_or(0, |q| u32::from(q.max_size())),
            reg::QUEUE_READY => queue.map_or(0, |q| u32::from(q.ready())),
            reg::INTERRUPT_STATUS => self.interrupt.status(),
            reg::STATUS => self.status_of(state),
            reg::SHM_LEN_LOW | reg::SHM_LEN_HIGH => reg::SHM_NOT_PRESENT,
            reg::SHM_BASE_LOW | reg::SHM_BASE_HIGH => reg::SHM_NOT_PRESENT,
            reg::CONFIG_GENERATION => self.interrupt.config_generation(),
            _ => return None,
        };
        Some(value)
    }

    fn write_register(&self, state: &mut TransportState<M>, base: u64, offset: u64, value: u32) {
        match offset {
            reg::DEVICE_FEATURES_SEL => state.device_features_sel = value,
            reg::DRIVER_FEATURES_SEL => state.driver_features_sel = value,
            reg::DRIVER_FEATURES => self.write_driver_features(state, base, value),
            reg::QUEUE_SEL => state.queue_sel = value,
            reg::QUEUE_NUM
            | reg::QUEUE_READY
            | reg::QUEUE_DESC_LOW
            | reg::QUEUE_DESC_HIGH
            | reg::QUEUE_AVAIL_LOW
            | reg::QUEUE_AVAIL_HIGH
            | reg::QUEUE_USED_LOW
            | reg::QUEUE_USED_HIGH => self.write_queue_register(state, base, offset, value),
            reg::QUEUE_NOTIFY => self.notify_queue(state, base, value),
            reg::INTERRUPT_ACK => self.interrupt.acknowledge(value),
            reg::STATUS => self.write_status(state, base, value),
            reg::SHM_SEL => {}
            _ => {
                self.warnings.warn(format_args!(
                    "virtio-mmio@{base:#x}: write to read-only or unknown register {offset:#x}"
                ));
            }
        }
    }

    fn write_driver_features(&self, state: &mut TransportState<M>, base: u64, value: u32) {
        let s = state.device_status;
        if s & DRIVER == 0 || s & (FEATURES_OK | FAILED) != 0 {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: driver features written in status {s:#x}; ignored"
            ));
            return;
        }
        let shift = match state.driver_features_sel {
            0 => 0,
            1 => 32,
            sel => {
                self.warnings.warn(format_args!(
                    "virtio-mmio@{base:#x}: driver features select {sel} out of range"
                ));
                return;
            }
        };
        state.driver_features =
            (state.driver_features & !(0xffff_ffff << shift)) | (u64::from(value) << shift);
    }

    fn notify_queue(&self, state: &TransportState<M>, base: u64, value: u32) {
        let ready = state.queues.get(value as usize).is_some_and(|q| q.ready());
        if !state.activated || !ready {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: notification for inactive queue {value}; ignored"
            ));
            return;
        }
        if let Err(e) = self.notifiers[value as usize].write(1) {
            warn!("virtio-mmio@{base:#x}: cannot signal queue {value}: {e}");
        }
    }

    fn write_status(&self, state: &mut TransportState<M>, base: u64, value: u32) {
        if value == 0 {
            self.reset(state);
            return;
        }
        let current = self.status_of(state);
        let Some(next) = status::transition(current, value) else {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: illegal status change {current:#x} -> {value:#x}"
            ));
            return;
        };
        // DEVICE_NEEDS_RESET lives in the interrupt (see `status_of`), not in the driver's bits.
        let next = next & !super::status::DEVICE_NEEDS_RESET;
        if next & FEATURES_OK != 0 && current & FEATURES_OK == 0 {
            let unknown = state.driver_features & !self.device_features;
            if unknown != 0 || state.driver_features & (1 << VIRTIO_F_VERSION_1) == 0 {
                self.warnings.warn(format_args!(
                    "virtio-mmio@{base:#x}: features {:#x} rejected (unoffered {unknown:#x} or no VERSION_1)",
                    state.driver_features
                ));
                state.device_status = next & !FEATURES_OK;
                return;
            }
        }
        state.device_status = next;
        if next & DRIVER_OK != 0 && current & DRIVER_OK == 0 {
            self.activate(state, base);
        }
    }

    /// The queues the driver made ready, checked against guest memory, for the device.
    fn active_queues(&self, state: &TransportState<M>) -> Result<Vec<ActiveQueue>, String> {
        let memory = state.memory.memory();
        let event_idx = state.driver_features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let mut queues = Vec::new();
        // Queue indices are u16 in virtio; the device has fewer queues.
        for (index, queue) in (0u16..).zip(&state.queues) {
            if !queue.ready() {
                continue;
            }
            if !queue.is_valid(&*memory) {
                return Err(format!("queue {index} became invalid"));
            }
            let notifier = self.notifiers[usize::from(index)]
                .try_clone()
                .map_err(|e| format!("cannot clone the notifier of queue {index}: {e}"))?;
            let mut queue = Queue::try_from(queue.state())
                .map_err(|_| format!("queue {index} state is inconsistent"))?;
            queue.set_event_idx(event_idx);
            queues.push(ActiveQueue {
                index,
                queue,
                notifier,
            });
        }
        Ok(queues)
    }

    fn activate(&self, state: &mut TransportState<M>, base: u64) {
        let queues = match self.active_queues(state) {
            Ok(queues) => queues,
            Err(e) => {
                self.warnings
                    .warn(format_args!("virtio-mmio@{base:#x}: {e}; not activating"));
                return self.fail_activation();
            }
        };
        let activation = Activation {
            memory: state.memory.clone(),
            acked_features: state.driver_features,
            queues,
            interrupt: self.interrupt.clone(),
        };
        let features = state.driver_features;
        let mut device = lock(&self.device);
        let device_type = device.device_type();
        match device.activate(activation) {
            Ok(()) => {
                state.activated = true;
                log::debug!(
                    "virtio-mmio@{base:#x}: device type {device_type} activated by its driver \
                     (features {features:#x})"
                );
            }
            Err(e) => {
                self.warnings.warn(format_args!(
                    "virtio-mmio@{base:#x}: activation failed: {e}"
                ));
                self.fail_activation();
            }
        }
    }

    /// The transport's and the device's state, for a snapshot of a paused VM.
    pub fn save_state(&self) -> MmioSnapshot {
        let state = lock(&self.state);
        let mut device = lock(&self.device);
        device.quiesce();
        let mut queues: Vec<QueueSnapshot> =
            state.queues.iter().map(|q| q.state().into()).collect();
        for (index, queue) in device.queue_states() {
            if let Some(slot) = queues.get_mut(usize::from(index)) {
                *slot = queue.into();
            }
        }
        MmioSnapshot {
            device_type: self.device_type,
            device_status: state.device_status,
            device_features_sel: state.device_features_sel,
            driver_features_sel: state.driver_features_sel,
            driver_features: state.driver_features,
            queue_sel: state.queue_sel,
            queues,
            activated: state.activated,
            interrupt: self.interrupt.save_state(),
            device: device.save_state(),
        }
    }

    /// Restores a saved state into a transport fresh from [`Self::new`], and its device; a
    /// device that was active is handed its queues again. Everything is checked as if a driver
    /// had written it; on error the transport is reset.
    pub fn restore_state(&self, saved: &MmioSnapshot) -> Result<(), MmioError> {
        let mut state = lock(&self.state);
        let result = self.restore_locked(&mut state, saved);
        if result.is_err() {
            self.reset(&mut state);
        }
        result
    }

    fn restore_locked(
        &self,
        state: &mut TransportState<M>,
        saved: &MmioSnapshot,
    ) -> Result<(), MmioError> {
        let bad = |why: String| MmioError::BadState(why);
        if saved.device_type != self.device_type {
            return Err(bad(format!(
                "a device of type {} cannot take the state of type {}",
                self.device_type, saved.device_type
            )));
        }
        if saved.queues.len() != state.queues.len() {
            return Err(bad(format!(
                "{} queues saved, the device has {}",
                saved.queues.len(),
                state.queues.len()
            )));
        }
        if saved.driver_features & !self.device_features != 0 {
            return Err(bad(format!(
                "the saved features {:#x} were not offered",
                saved.driver_features
            )));
        }
        for (index, (queue, snapshot)) in state.queues.iter_mut().zip(&saved.queues).enumerate() {
            if snapshot.max_size != queue.max_size() {
                return Err(bad(format!(
                    "queue {index}: saved maximum size {} differs from {}",
                    snapshot.max_size,
                    queue.max_size()
                )));
            }
            *queue = Queue::try_from(QueueState::from(*snapshot))
                .map_err(|e| bad(format!("queue {index}: {e}")))?;
        }
        state.device_status = saved.device_status;
        state.device_features_sel = saved.device_features_sel;
        state.driver_features_sel = saved.driver_features_sel;
        state.driver_features = saved.driver_features;
        state.queue_sel = saved.queue_sel;
        self.interrupt.restore_state(&saved.interrupt);
        let activation = if saved.activated {
            Some(Activation {
                memory: state.memory.clone(),
                acked_features: state.driver_features,
                queues: self.active_queues(state).map_err(bad)?,
                interrupt: self.interrupt.clone(),
            })
        } else {
            None
        };
        lock(&self.device)
            .restore_state(&saved.device, activation)
            .map_err(|e| bad(e.to_string()))?;
        state.activated = saved.activated;
        if state.activated {
            // A notification the driver sent just before the snapshot may not have been
            // processed: the device looks at each queue once (a spurious notification is
            // harmless).
            for (queue, notifier) in state.queues.iter().zip(&self.notifiers) {
                if queue.ready() {
                    notifier
                        .write(1)
                        .map_err(|e| bad(format!("cannot notify the device: {e}")))?;
                }
            }
        }
        Ok(())
    }

    /// Sets DEVICE_NEEDS_RESET and tells the driver (virtio 1.2 §2.1.2).
    fn fail_activation(&self) {
        if let Err(e) = self.interrupt.signal_needs_reset() {
            warn!("virtio-mmio: cannot raise the config interrupt: {e}");
        }
    }

    fn reset(&self, state: &mut TransportState<M>) {
        lock(&self.device).reset();
        for queue in &mut state.queues {
            queue.reset();
        }
        state.device_status = 0;
        state.device_features_sel = 0;
        state.driver_features_sel = 0;
        state.driver_features = 0;
        state.queue_sel = 0;
        state.activated = false;
        self.interrupt.reset();
        for notifier in &self.notifiers {
            // Drain stale notifications; EAGAIN just means there were none.
            let _ = notifier.read();
        }
    }
}

impl<M, D> BusDevice for MmioTransport<M, D>
where
    M: GuestAddressSpace + Send,
    D: VirtioDevice<M>,
{
    fn read(&self, base: u64, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= reg::CONFIG {
            let state = lock(&self.state);
            if state.device_status & DRIVER == 0 {
                self.warnings.warn(format_args!(
                    "virtio-mmio@{base:#x}: config read before DRIVER status"
                ));
            }
            lock(&self.device).read_config(offset - reg::CONFIG, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: {}-byte register read at {offset:#x}",
                data.len()
            ));
            return;
        }
        let state = lock(&self.state);
        match self.read_register(&state, offset) {
            Some(value) => data.copy_from_slice(&value.to_le_bytes()),
            None => {
                self.warnings.warn(format_args!(
                    "virtio-mmio@{base:#x}: read of write-only/unknown register {offset:#x}"
                ));
            }
        }
    }

    fn write(&self, base: u64, offset: u64, data: &[u8]) {
        let mut state = lock(&self.state);
        if offset >= reg::CONFIG {
            let s = state.device_status;
            if s & DRIVER == 0 || s & FAILED != 0 {
                self.warnings.warn(format_args!(
                    "virtio-mmio@{base:#x}: config write in status {s:#x}; ignored"
                ));
                return;
            }
            lock(&self.device).write_config(offset - reg::CONFIG, data);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: {}-byte register write at {offset:#x}",
                data.len()
            ));
            return;
        };
        if !offset.is_multiple_of(4) {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: unaligned register write at {offset:#x}"
            ));
            return;
        }
        self.write_register(&mut state, base, offset, u32::from_le_bytes(bytes));
    }
}

/// The low 32 bits of `value` (one half of a 64-bit register pair).
#[allow(clippy::cast_possible_truncation)] // Dropping the high half is the point.
fn low_half(value: u64) -> u32 {
    value as u32
}

#[cfg(test)]
pub(crate) mod tests;
