//! The control API: HTTP/1.1 and JSON on a Unix socket, with Firecracker's resources and
//! errors, and this VMM's own views.
//!
//! * [`VmmControl`] is what the VMM implements; [`ApiServer`] serves it on a socket.
//! * [`routes`] lists the resources; [`model`] holds their JSON bodies (the VMM's builder turns
//!   the pre-boot ones into a VM's configuration); [`metrics`] the process's counters that
//!   Firecracker's metrics report. Besides
//!   Firecracker's actions, `PUT /actions {"action_type": "Shutdown"}` stops the VM from the host
//!   (not Firecracker's guest-cooperative SendCtrlAltDel).
//! * The `vmm` command (the vmm-cli crate) has the client: `vmm api`, `vmm info`, `vmm pause`.
//!
//! ```text
//! curl --unix-socket /tmp/vmm.sock http://localhost/memory
//! curl --unix-socket /tmp/vmm.sock -X PATCH -d '{"state":"Paused"}' http://localhost/vm
//! ```

pub mod http;
pub mod metrics;
pub mod model;
mod request_threads;
pub mod routes;
pub mod server;
pub mod vmm_control;

pub use server::{ApiServer, ServerError};
pub use vmm_control::{ControlError, LogControl, PreBoot, VmmControl};
