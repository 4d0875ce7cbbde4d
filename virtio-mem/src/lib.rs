//! The virtio-mem device's logic (virtio 1.2 §5.15), independent of its transport and of how
//! memory is plugged.
//!
//! A virtio-mem device owns a region of guest physical memory cut into blocks. The host asks
//! for a size (`requested_size`); the driver plugs and unplugs blocks to reach it, one request
//! at a time on the device's single queue. This crate holds what the device decides:
//!
//! * [`spec`]: the feature bits, request and response types and the configuration space.
//! * [`MemRequest`] and [`MemResponse`]: the 24-byte request and 10-byte response on the wire, parsed
//!   and written in little endian.
//! * [`Blocks`]: the block states and the requested size. [`Blocks::handle`] answers one
//!   request as the specification says (ERROR for a range outside the usable region, not
//!   aligned, or with blocks in the wrong state; NACK for a plug beyond the requested size or
//!   one the host has no memory for) and applies it through a [`MemBackend`], which does
//!   what plugging means (here: frames of an LLFree pool or zone, `guest_mem::GuestMemory::plug`).
//!
//! Every request comes from the guest and may be hostile: nothing it sends can make the device
//! plug more than the requested size, plug or unplug outside its region, or panic.

// Every value here may come from a hostile guest: no silent truncation or sign change.
#![cfg_attr(
    not(test),
    warn(
        clippy::cast_lossless,
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss
    )
)]

mod blocks;
mod request;
pub mod spec;

pub use blocks::{BlockState, Blocks, LayoutError, MemBackend, PlugError, RegionLayout};
pub use request::{MemRequest, MemResponse};
