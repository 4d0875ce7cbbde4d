//! Volatile accesses to the virtio drivers' own memory: their split rings and buffers in the
//! areas below the workload (see `protocol`), which the devices read and write too.

use core::ptr::{read_volatile, write_volatile};

pub fn read16(addr: u64) -> u16 {
    // SAFETY: the drivers pass addresses in their own areas below the workload, identity
    // mapped, aligned to the access and never part of a workload step's range.
    unsafe { read_volatile(addr as *const u16) }
}

pub fn write16(addr: u64, value: u16) {
    // SAFETY: as in read16.
    unsafe { write_volatile(addr as *mut u16, value) }
}

pub fn write32(addr: u64, value: u32) {
    // SAFETY: as in read16.
    unsafe { write_volatile(addr as *mut u32, value) }
}

pub fn write64(addr: u64, value: u64) {
    // SAFETY: as in read16.
    unsafe { write_volatile(addr as *mut u64, value) }
}
