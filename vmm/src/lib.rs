//! llfree-vmm: a KVM microVM monitor whose guest memory is managed by LLFree.

pub mod arch;
pub mod boot;
pub mod build;
pub mod config;
pub mod host_file;
pub mod layout;
pub mod runner;
pub mod seccomp;
pub mod snapshot;
pub mod testguest;
pub mod vm;

pub use runner::run;
