//! Firecracker's Uffd memory backend: a loaded VM's RAM is fresh anonymous memory whose page
//! faults a handler process serves. The VMM registers the regions with a new userfaultfd,
//! connects to the handler's Unix socket and sends, in one message, the regions as
//! Firecracker's `GuestRegionUffdMapping` list (JSON) with the userfaultfd attached
//! (`SCM_RIGHTS`), so that a handler written for Firecracker serves this VMM unchanged. The
//! handler finds each region's contents at its `offset` in the snapshot's memory file, where
//! the regions lie one after the other; it learns the VMM's pid from the socket
//! (`SO_PEERCRED`).

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use guest_mem::{GuestMemory, HandlerMemory, MemoryError};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Errors of handing guest memory to a page-fault handler.
#[derive(Debug, thiserror::Error)]
pub enum PageFaultHandlerError {
    /// Guest memory could not be registered for the handler.
    #[error("mem_backend Uffd: {0}")]
    Memory(#[from] MemoryError),
    /// The handler's socket did not take the connection.
    #[error("mem_backend Uffd: cannot connect to the page-fault handler at {}: {source}", .path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The regions and the userfaultfd could not be sent.
    #[error("mem_backend Uffd: cannot send the regions to the page-fault handler at {}: {source}", .path.display())]
    Send {
        /// The socket.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Guest memory in a handler's care: the userfaultfd (this VMM's copy) and the connection,
/// both kept open for as long as the VM runs (a closed connection may tell the handler that
/// the VMM is gone).
#[derive(Debug)]
pub struct HandlerLink {
    _memory: HandlerMemory,
    _connection: UnixStream,
}

/// Firecracker's `GuestRegionUffdMapping` list for `memory`, as JSON.
fn mappings(memory: &HandlerMemory) -> String {
    let regions: Vec<serde_json::Value> = memory
        .regions()
        .iter()
        .map(|region| {
            serde_json::json!({
                "base_host_virt_addr": region.host_addr,
                "size": region.size,
                "offset": region.offset,
                "page_size": region.page_size,
                // Firecracker's deprecated name of the same size in bytes.
                "page_size_kib": region.page_size,
            })
        })
        .collect();
    serde_json::Value::Array(regions).to_string()
}

/// Hands the RAM of `memory` (fresh, unpopulated) to the page-fault handler listening on
/// `socket`. As Firecracker does, the connection is made only once the regions are ready and
/// the message follows at once: handlers written for Firecracker give up on a connection whose
/// message takes long to come.
pub fn hand_over(
    memory: &GuestMemory,
    socket: &Path,
) -> Result<HandlerLink, PageFaultHandlerError> {
    let handed = memory.map_for_handler()?;
    let message = mappings(&handed);
    let connection =
        UnixStream::connect(socket).map_err(|source| PageFaultHandlerError::Connect {
            path: socket.to_owned(),
            source,
        })?;
    let sent = connection
        .send_with_fd(message.as_bytes(), handed.uffd())
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))
        .and_then(|sent| match sent == message.len() {
            true => Ok(()),
            false => Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("{sent} of {} bytes sent", message.len()),
            )),
        });
    sent.map_err(|source| PageFaultHandlerError::Send {
        path: socket.to_owned(),
        source,
    })?;
    log::info!(
        "guest memory: {} regions handed to the page-fault handler at {}",
        handed.regions().len(),
        socket.display()
    );
    Ok(HandlerLink {
        _memory: handed,
        _connection: connection,
    })
}
