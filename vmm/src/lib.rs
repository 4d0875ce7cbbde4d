//! vmm (in progress).

pub mod devices;
pub mod layout;
