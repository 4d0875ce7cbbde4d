//! vmm (in progress).

pub mod boot;
pub mod devices;
pub mod layout;
