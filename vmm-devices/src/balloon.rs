//! The virtio-balloon device of the VMM: the transport-independent [`virtio_balloon`] crate
//! behind the virtio-mmio transport, over guest-mem memory.
//!
//! * [`GuestMemBackend`]: inflation goes to guest-mem's per-chunk piece bitmaps (a chunk given
//!   away entirely frees its frame), deflation takes the pieces back (repopulated on touch),
//!   reported free ranges are discarded (whole chunks free their frames at once). Frames go
//!   back to the pool under the balloon's own LLFree core id (reserve-on-free).
//! * [`BalloonDevice`]: the [`VirtioDevice`](crate::virtio::VirtioDevice) the transport
//!   drives; interrupts go through the transport's
//!   [`Interrupt`](crate::virtio::Interrupt).
//! * [`create`]: the device, its statistics timer ([`StatsTimer`], an event-loop subscriber)
//!   and the [`BalloonHandle`] (target, information, statistics interval) for the control API;
//!   [`device_config`] turns a `--balloon` option into device options. The runner puts the
//!   device behind a virtio-mmio transport like any virtio device
//!   (the VMM's `VirtioMmioDevices::add_balloon`: a
//!   slot, an irqfd, one ioeventfd per queue and the queue subscriber, plus the timer).
//!
//! ```text
//! let mut devices = VirtioMmioDevices::new();
//! let balloon = devices.add_balloon(memory.clone(), config)?;  // BalloonHandle
//! devices.attach(vm.fd(), &mut buses)?;
//! event_loop.add_all(devices.take_subscribers());
//! // API thread:
//! balloon.set_target_mib(256)?;  balloon.info();  balloon.set_stats_interval(Some(2s))?;
//! ```

mod backend;
pub mod config;
mod device;
mod handle;
mod stats_timer;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

use std::sync::{Mutex, MutexGuard};

pub use backend::GuestMemBackend;
pub use device::{BalloonDevice, BalloonTransport};
pub use handle::{
    create, device_config, BalloonControlError, BalloonCreateError, BalloonHandle, NewBalloon,
};
pub use stats_timer::{StatsInterval, StatsTimer, StatsTimerError};

/// Locks a mutex, recovering the data if a previous holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
