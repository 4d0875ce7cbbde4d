//! A virtio-balloon device (virtio 1.2 §5.5), independent of its transport.
//!
//! The device works on virtio-queue [`Queue`](virtio_queue::Queue)s in any vm-memory guest
//! memory ([`GuestAddressSpace`](vm_memory::GuestAddressSpace)). What it does to memory goes
//! through a [`BalloonBackend`] ("give these guest pages away", "take them back", "discard this
//! reported range", "is this RAM"), and interrupts through a [`GuestNotifier`]. The same device
//! can therefore sit behind virtio-mmio in this VMM, or behind a vhost-user backend.
//!
//! * Queues: inflate 0, deflate 1, then statistics, free page hinting and free page reporting
//!   when negotiated, numbered consecutively as Linux and QEMU do ([`QueueLayout`]).
//! * Features: VERSION_1, MUST_TELL_HOST, STATS_VQ, DEFLATE_ON_OOM, FREE_PAGE_HINT,
//!   PAGE_REPORTING, as the [`BalloonConfig`] selects. Deflate buffers are applied before they are returned, so with
//!   MUST_TELL_HOST the guest only reuses pages the backend has taken back.
//! * Inflate and deflate buffers carry 4 KiB page frame numbers; each piece of up to 256 is
//!   sorted in place and consecutive ones are coalesced into runs (in whatever order the driver
//!   lists them), each checked against guest RAM and applied to the backend, which keeps the
//!   record of given-away pages (bounded by guest RAM, e.g. per-chunk bitmaps).
//! * Every descriptor of a reporting buffer is a free range that the backend discards; so is
//!   every device-writable descriptor of a hinting buffer in the run the host started
//!   ([`VirtioBalloon::start_hinting`]) and the guest joined (its command id buffer).
//! * The statistics buffer is parsed, kept ([`GuestStats`]) and held until the VMM's timer
//!   calls [`VirtioBalloon::request_stats`].
//! * Hostile drivers: bad page numbers, ranges and descriptors are ignored and counted
//!   ([`Violations`]) with rate-limited warnings; chains are bounded
//!   ([`MAX_CHAIN_DESCRIPTORS`], [`MAX_PFNS_PER_CHAIN`], [`MAX_STATS_BUFFER_BYTES`]); broken
//!   rings stop the device until reset. Nothing a guest writes can panic the device, and the
//!   backend only ever sees 4 KiB aligned ranges that it called RAM.
//!
//! # Wiring it into the VMM (adapter)
//!
//! The vmm crate wraps the device in its `VirtioDevice` trait and gives it a backend made of
//! guest-mem's discard API:
//!
//! ```text
//! struct BalloonDevice<M>(virtio_balloon::VirtioBalloon<M, GuestMemBackend>);
//!
//! impl<M: GuestAddressSpace + Send> VirtioDevice<M> for BalloonDevice<M> {
//!     fn device_type(&self) -> u32 { self.0.device_type() }
//!     fn device_features(&self) -> u64 { self.0.device_features() }
//!     fn queue_max_sizes(&self) -> &[u16] { self.0.queue_max_sizes() }
//!     fn read_config(&self, offset: u64, data: &mut [u8]) { self.0.read_config(offset, data) }
//!     fn write_config(&mut self, offset: u64, data: &[u8]) { self.0.write_config(offset, data) }
//!     fn activate(&mut self, a: Activation<M>) -> Result<(), ActivateError> {
//!         let queues = a.queues.into_iter().map(|q| (q.index, q.queue));
//!         let notifier = Arc::new(InterruptNotifier(a.interrupt)); // signal_used_queue /
//!                                                                   // signal_config_change
//!         self.0.activate(a.memory, a.acked_features, queues, notifier)
//!             .map_err(|e| ActivateError::Device(Box::new(e)))
//!     }
//!     fn process_queue(&mut self, index: u16) {
//!         if let Err(e) = self.0.process_queue(index) { warn!("balloon: {e}") }
//!     }
//!     fn reset(&mut self) { self.0.reset() }
//! }
//!
//! struct GuestMemBackend { memory: Arc<guest_mem::GuestMemory>, core: RefCell<CoreFrames> }
//! // core = pool.core_frames(pool.claim_cores(1)): the balloon's own LLFree core and its cache,
//! // so that the frames it frees go back one tree at a time and not into a vCPU's reservation.
//! impl BalloonBackend for GuestMemBackend {
//!     type Error = guest_mem::MemoryError;
//!     fn is_ram(&self, r: GuestRange) -> bool   // r lies inside one of memory.regions()
//!     fn inflate(&self, r) -> memory.release_pieces(r.addr, r.len, &mut core.borrow_mut())
//!                              -> Inflated { new_pages: s.pieces, freed_frames: s.freed_chunks }
//!     fn deflate(&self, r) -> memory.reclaim_pieces(r.addr, r.len, &mut core.borrow_mut()).pieces
//!     fn discard(&self, r) -> memory.discard(r.addr, r.len, &mut core.borrow_mut()).freed_chunks
//!     fn deflate_all(&self) -> reclaim_pieces over every region
//! }
//! ```
//!
//! The event loop calls `process_queue` on queue notifications and [`VirtioBalloon::request_stats`]
//! on a timer of [`VirtioBalloon::stats_interval`]; the API thread calls [`VirtioBalloon::set_target_mib`]
//! and [`VirtioBalloon::info`] through the same mutex the transport holds the device in.

// Every value here may come from a hostile guest: no silent truncation or sign change (the
// tests build their inputs with casts on purpose).
#![cfg_attr(
    not(test),
    warn(
        clippy::cast_lossless,
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss
    )
)]

mod backend;
mod config;
mod device;
mod page_report;
mod pfn_list;
mod queues;
pub mod spec;
mod stats;
#[cfg(test)]
mod testing;
mod violations;

pub use backend::{BalloonBackend, GuestNotifier, GuestRange, Inflated};
pub use config::{
    pages_from_bytes, pages_from_mib, BalloonConfig, ConfigSpace, OptionsError, DEFAULT_QUEUE_SIZE,
    MAX_TARGET_BYTES,
};
pub use device::{
    ActiveState, BalloonCounters, BalloonError, BalloonReading, BalloonState, HintingStatus,
    Reactivation, VirtioBalloon,
};
pub use pfn_list::MAX_PFNS_PER_CHAIN;
pub use queues::{QueueLayout, QueueRole};
pub use stats::{GuestStats, MAX_STATS_BUFFER_BYTES};
pub use violations::{Violation, Violations};

/// The most descriptors the device follows in one chain (Linux uses one for inflate, deflate
/// and statistics, and up to 32 for free page reporting).
pub const MAX_CHAIN_DESCRIPTORS: usize = 64;
