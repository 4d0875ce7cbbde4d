//! The VMM's emulated devices: the I/O and MMIO bus, the 16550 serial console, the i8042
//! keyboard controller, virtio over MMIO, the virtio-balloon, virtio-blk, virtio-net,
//! virtio-pmem, virtio-rng and virtio-vsock, MMDS (the metadata service behind a virtio-net
//! interface) and the VM generation id. Each device's configuration lives beside it
//! (`<device>::config`, with its own error), for the VMM's `VmConfig` to gather; the devices
//! know nothing of the VM, its runner or its API. Their counters for Firecracker's metrics are
//! in [`metrics`].

// Devices take values from a hostile guest: no silent truncation or sign change (the tests
// build their inputs with casts on purpose).
#![cfg_attr(
    not(test),
    warn(
        clippy::cast_lossless,
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss
    )
)]

pub mod balloon;
pub mod block;
pub mod bus;
pub mod entropy;
pub mod event_loop;
pub mod guest_warnings;
pub mod i8042;
pub mod mem;
pub mod metrics;
pub mod mmds;
pub mod net;
pub mod pmem;
pub mod rate_limiter;
pub mod serial;
pub mod size;
pub mod socket_files;
pub mod virtio;
pub mod vmgenid;
pub mod vsock;

pub use bus::{Bus, BusDevice, BusError, BusRange};

/// What a device that can reset the machine (the i8042's CPU reset) asks of the VM. The VM
/// implements it, so that devices need not know the VM.
pub trait ResetLine: Send + Sync + std::fmt::Debug {
    /// The guest asked for a reset: a microVM stops.
    fn reset(&self);
}
pub use guest_warnings::GuestWarnings;
