//! Real KVM vCPUs running a tiny guest that touches memory, and huge page reservation: what the
//! end-to-end tests and `guest-mem-bench` share (feature `testing`).

mod hugepages;
mod kvm;
mod program;

pub use hugepages::{restore_huge_pages_now, HugePages};
pub use kvm::{KvmError, RunError, TouchVcpu, Vm, CODE};
pub use program::{touch, Touch, PROGRAMS};
