//! The virtio interrupt: status bits the driver reads and acknowledges, plus the event fd
//! that raises the device's IRQ line (registered as a KVM irqfd).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use vmm_sys_util::eventfd::EventFd;

/// Interrupt status bit: a used buffer notification (virtio 1.2 §4.2.2, InterruptStatus).
pub const INT_USED_RING: u32 = 1;
/// Interrupt status bit: the device configuration changed.
pub const INT_CONFIG: u32 = 2;

/// Interrupt state shared by a device and its transport; lock-free.
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    config_generation: AtomicU32,
    /// The device stopped and waits for a reset; the transport shows DEVICE_NEEDS_RESET.
    needs_reset: AtomicBool,
    irq: EventFd,
}

impl Interrupt {
    /// Creates an interrupt that signals `irq` (typically registered with `KVM_IRQFD`).
    pub fn new(irq: EventFd) -> Self {
        Interrupt {
            status: AtomicU32::new(0),
            config_generation: AtomicU32::new(0),
            needs_reset: AtomicBool::new(false),
            irq,
        }
    }

    /// The event fd to register as the device's irqfd.
    pub fn irq_evt(&self) -> &EventFd {
        &self.irq
    }

    /// Tells the driver that buffers were put into a used ring.
    pub fn signal_used_queue(&self) -> io::Result<()> {
        self.status.fetch_or(INT_USED_RING, Ordering::AcqRel);
        self.irq.write(1)
    }

    /// Tells the driver that the device configuration changed; bumps the config generation.
    pub fn signal_config_change(&self) -> io::Result<()> {
        self.config_generation.fetch_add(1, Ordering::AcqRel);
        self.status.fetch_or(INT_CONFIG, Ordering::AcqRel);
        self.irq.write(1)
    }

    /// Tells the driver that the device stopped and needs a reset (virtio 1.2 §2.1.2): the
    /// transport's status shows DEVICE_NEEDS_RESET from now until the reset, and a
    /// configuration change interrupt goes out.
    pub fn signal_needs_reset(&self) -> io::Result<()> {
        self.needs_reset.store(true, Ordering::Release);
        self.signal_config_change()
    }

    /// Whether the device waits for a reset.
    pub fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::Acquire)
    }

    /// Pending interrupt status bits.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::Acquire)
    }

    /// Clears the status bits the driver acknowledged; unknown bits are ignored.
    pub fn acknowledge(&self, bits: u32) {
        self.status
            .fetch_and(!(bits & (INT_USED_RING | INT_CONFIG)), Ordering::AcqRel);
    }

    /// Current configuration generation.
    pub fn config_generation(&self) -> u32 {
        self.config_generation.load(Ordering::Acquire)
    }

    /// The state to save in a snapshot.
    pub fn save_state(&self) -> super::state::InterruptSnapshot {
        super::state::InterruptSnapshot {
            status: self.status(),
            config_generation: self.config_generation(),
            needs_reset: self.needs_reset(),
        }
    }

    /// Restores a saved state (raising nothing: the interrupt controller's state has the line).
    pub fn restore_state(&self, state: &super::state::InterruptSnapshot) {
        self.status.store(
            state.status & (INT_USED_RING | INT_CONFIG),
            Ordering::Release,
        );
        self.config_generation
            .store(state.config_generation, Ordering::Release);
        self.needs_reset.store(state.needs_reset, Ordering::Release);
    }

    /// Clears all pending status (device reset).
    pub(crate) fn reset(&self) {
        self.needs_reset.store(false, Ordering::Release);
        self.status.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn signals_set_status_and_raise_the_irq() {
        let interrupt = Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap());
        assert!(interrupt.irq_evt().read().is_err(), "no interrupt yet");
        interrupt.signal_used_queue().unwrap();
        assert_eq!(interrupt.status(), INT_USED_RING);
        assert_eq!(interrupt.irq_evt().read().unwrap(), 1);

        interrupt.signal_config_change().unwrap();
        assert_eq!(interrupt.status(), INT_USED_RING | INT_CONFIG);
        assert_eq!(interrupt.config_generation(), 1);

        interrupt.acknowledge(INT_USED_RING | 0xf0);
        assert_eq!(interrupt.status(), INT_CONFIG);
        interrupt.reset();
        assert_eq!(interrupt.status(), 0);
        assert_eq!(interrupt.config_generation(), 1);
    }
}
