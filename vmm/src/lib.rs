//! vmm (in progress).

pub mod api;
pub mod boot;
pub mod cli;
pub mod devices;
pub mod layout;
pub mod runner;

pub use runner::run;
