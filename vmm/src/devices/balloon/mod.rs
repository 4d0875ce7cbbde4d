//! The virtio-balloon device of the VMM: the transport-independent [`virtio_balloon`] crate
//! behind the virtio-mmio transport, over guest-mem memory.
//!
//! * [`GuestMemBackend`]: inflation goes to guest-mem's per-chunk piece bitmaps (a chunk given
//!   away entirely frees its frame), deflation takes the pieces back (repopulated on touch),
//!   reported free ranges are discarded (whole chunks free their frames at once). Frames go
//!   back to the pool under the balloon's own LLFree core id (reserve-on-free).
//! * [`BalloonDevice`]: the [`VirtioDevice`](crate::devices::virtio::VirtioDevice) the transport
//!   drives; interrupts go through the transport's
//!   [`Interrupt`](crate::devices::virtio::Interrupt).
//! * [`create`]: the device, its statistics timer ([`StatsTimer`], an event-loop subscriber)
//!   and the [`BalloonHandle`] (target, information, statistics interval) for the control API;
//!   [`device_config`] turns a `--balloon` option into device options.
//! * [`attach`]: [`create`], then the transport on the MMIO bus at a `layout` slot, with an
//!   irqfd and one ioeventfd per queue, plus the event-loop subscribers (queue notifications
//!   and the statistics timer).
//!
//! ```text
//! let (balloon, subscribers) = balloon::attach(vm.fd(), &mut buses.mmio, memory, config, 0)?;
//! for subscriber in subscribers { event_manager.add_subscriber(subscriber); }
//! // API thread:
//! balloon.set_target_mib(256)?;  balloon.info();  balloon.set_stats_interval(Some(2s))?;
//! ```

mod attach;
mod backend;
mod device;
mod stats_timer;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

use std::sync::{Mutex, MutexGuard};

pub use attach::{
    attach, create, device_config, AttachError, BalloonControlError, BalloonHandle,
    BalloonTransport, NewBalloon, Subscriber,
};
pub use backend::GuestMemBackend;
pub use device::{BalloonDevice, Memory};
pub use stats_timer::{StatsInterval, StatsTimer, StatsTimerError};

/// Locks a mutex, recovering the data if a previous holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
