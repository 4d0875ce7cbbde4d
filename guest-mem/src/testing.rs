//! Real KVM vCPUs running a tiny guest that touches memory, huge page reservation, and the host
//! memory helpers guest-mem itself uses: what the end-to-end tests and `guest-mem-bench` share
//! (feature `testing`).

mod hugepages;
mod kvm;
mod program;

pub use hugepages::{restore_huge_pages_now, HugePageReservation};
pub use kvm::{KvmError, TouchError, TouchVcpu, TouchVm, CODE};
pub use program::{touch, Touch, PROGRAMS};

pub use crate::sys::mmap::{map_placeholder, map_shared_fixed, Mapping};
pub use crate::sys::{memfd, punch_hole};
