//! The control API: HTTP/1.1 and JSON on a Unix socket, with Firecracker-like resources.
//!
//! * [`VmmControl`] is what the VMM implements; [`ApiServer`] serves it on a socket.
//! * [`routes`] lists the resources. Pause and resume are `PATCH /vm {"state": ...}` as in
//!   Firecracker; stopping the VM is `PUT /actions {"action_type": "Shutdown"}` (a host-side
//!   stop, not Firecracker's guest-cooperative SendCtrlAltDel).
//! * [`ApiClient`] sends requests; `vmm api`, `vmm info`, `vmm pause`, ... use it.
//!
//! ```text
//! curl --unix-socket /tmp/vmm.sock http://localhost/memory
//! curl --unix-socket /tmp/vmm.sock -X PATCH -d '{"state":"Paused"}' http://localhost/vm
//! ```

pub mod client;
pub mod control;
pub mod http;
pub mod model;
pub mod routes;
pub mod server;

pub use client::{ApiClient, ApiResponse, ClientError};
pub use control::{ControlError, VmmControl};
pub use server::{ApiServer, ServerError};
