//! The built-in test guest of llfree-vmm: a freestanding x86_64 program (`guest/`) that runs
//! memory workloads the VMM describes and reports the results, and the protocol between the two.
//!
//! * [`protocol`] is `no_std` plain data and constants, and both sides depend on it: `build.rs`
//!   compiles this library for the guest (with `--cfg test_guest_build`, `panic=abort`, no SSE)
//!   and the guest program against it, and the VMM links it as any crate.
//! * [`IMAGE`] is the guest program, an ELF executable that the VMM loads at
//!   [`protocol::IMAGE_START`].

#![no_std]

pub mod protocol;

// The VMM writes the descriptor into guest memory with vm-memory.
// SAFETY: `DescriptorHeader` is `repr(C)` with two u32 after a u64: no padding, and any bytes are valid.
#[cfg(not(test_guest_build))]
unsafe impl vm_memory::ByteValued for protocol::DescriptorHeader {}
// SAFETY: `Step` is `repr(C)`, two u32, three u64, two u32: no padding, and any bytes are valid.
#[cfg(not(test_guest_build))]
unsafe impl vm_memory::ByteValued for protocol::Step {}

/// The test guest's ELF image, built by `build.rs`.
#[cfg(not(test_guest_build))]
pub static IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/testguest.elf"));
