//! Emulated devices: the I/O and MMIO bus, the 16550 serial console, the i8042 keyboard
//! controller, virtio over MMIO and the virtio-balloon.

pub mod balloon;
pub mod bus;
pub mod event_loop;
pub mod guest_warnings;
pub mod i8042;
pub mod serial;
pub mod virtio;

pub use bus::{Bus, BusDevice, BusError, BusRange};
pub use guest_warnings::GuestWarnings;
