//! The API server: a Unix socket, one request per connection.
//!
//! One thread accepts connections and hands each to a thread of its own, so that a slow,
//! silent or malicious client holds up nobody else. At most [`MAX_CONNECTIONS`] are served at
//! once; a connection beyond that is answered 503 at once and closed. A client gets
//! [`REQUEST_TIMEOUT`] to send its whole request (a deadline, not a per-read timeout: one byte
//! a second does not keep a connection open) and as long to take the response. The socket is
//! made owner-only (0600) and removed when the server stops.

use std::fs;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use guest_mem::{wait_readable, Readiness};
use vmm_sys_util::eventfd::EventFd;

use super::control::VmmControl;
use super::http::{read_request, Response};
use super::routes;
use crate::config::MAX_SOCKET_PATH;

/// Time a client has to send its request, and again to take the response.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Stack of a connection's thread: parsing and answering one small request.
const CONNECTION_STACK: usize = 256 << 10;
/// Time given to a client to stop sending after its response, before the connection closes.
const LINGER: Duration = Duration::from_millis(100);

/// Errors of starting the API server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another process serves the socket path.
    #[error("API socket {0}: another process is listening on it")]
    InUse(PathBuf),
    /// The path exists and is not a socket.
    #[error("API socket {0}: exists and is not a socket")]
    NotASocket(PathBuf),
    /// Binding, chmod or removing a stale socket failed.
    #[error("API socket {path}: {source}")]
    Socket {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The stop eventfd or the thread could not be created.
    #[error("cannot start the API server thread: {0}")]
    Thread(#[source] io::Error),
}

/// A running API server. Dropping it stops the thread and removes the socket.
#[derive(Debug)]
pub struct ApiServer {
    path: PathBuf,
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

/// Binds `path`, replacing a stale socket that nobody listens on.
fn bind(path: &Path) -> Result<UnixListener, ServerError> {
    let socket_err = |source| ServerError::Socket {
        path: path.to_owned(),
        source,
    };
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(ServerError::InUse(path.to_owned()));
            }
            fs::remove_file(path).map_err(socket_err)?;
        }
        Ok(_) => return Err(ServerError::NotASocket(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(socket_err(e)),
    }
    // Bound and listening under a temporary name, then renamed into place: a client that sees
    // the socket can connect (between bind and listen it would be refused).
    let temp = listening_name(path);
    let at = temp.as_deref().unwrap_or(path);
    if let Some(temp) = &temp {
        let _ = fs::remove_file(temp);
    }
    let listener = UnixListener::bind(at).map_err(socket_err)?;
    let placed =
        fs::set_permissions(at, fs::Permissions::from_mode(0o600)).and_then(|()| match &temp {
            Some(temp) => fs::rename(temp, path),
            None => Ok(()),
        });
    if let Err(e) = placed {
        let _ = fs::remove_file(at);
        return Err(socket_err(e));
    }
    listener.set_nonblocking(true).map_err(socket_err)?;
    Ok(listener)
}

/// A temporary name for the socket at `path` in its directory, unique in the process (several
/// VMs may serve their APIs), unless that would exceed the Unix socket path limit.
fn listening_name(path: &Path) -> Option<PathBuf> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let temp = path
        .parent()
        .unwrap_or(Path::new(""))
        .join(format!(".vmm-api-{}-{n}", std::process::id()));
    (temp.as_os_str().len() <= MAX_SOCKET_PATH).then_some(temp)
}

impl ApiServer {
    /// Serves the API for `control` on a Unix socket at `path`.
    pub fn start(
        path: impl AsRef<Path>,
        control: Arc<dyn VmmControl>,
    ) -> Result<Self, ServerError> {
        let path = path.as_ref().to_owned();
        let listener = bind(&path)?;
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(ServerError::Thread)?);
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || serve(listener, &thread_stop, control));
        match thread {
            Ok(thread) => Ok(ApiServer {
                path,
                stop,
                thread: Some(thread),
            }),
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(ServerError::Thread(e))
            }
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if self.stop.write(1).is_err() {
            log::error!("cannot signal the API server thread to stop");
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the API server thread panicked");
            }
        }
        let _ = fs::remove_file(&self.path);
    }
}

/// Waits for connections until `stop` is signalled and serves each on a thread of its own.
fn serve(listener: UnixListener, stop: &EventFd, control: Arc<dyn VmmControl>) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        match wait_readable(&listener, stop, -1) {
            Ok(Readiness::Readable | Readiness::TimedOut) => {}
            Ok(Readiness::Stopped) => return,
            Err(error) => {
                log::error!("API server: poll failed, stopping: {error}");
                return;
            }
        }
        match listener.accept() {
            Ok((stream, _)) => spawn_connection(stream, &active, &control),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                log::warn!("API server: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Counts a connection as served until dropped.
struct ConnectionSlot(Arc<AtomicUsize>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `stream` on a thread of its own, or answers 503 when [`MAX_CONNECTIONS`] are
/// served already.
fn spawn_connection(stream: UnixStream, active: &Arc<AtomicUsize>, control: &Arc<dyn VmmControl>) {
    if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        active.fetch_sub(1, Ordering::AcqRel);
        refuse(stream);
        return;
    }
    let slot = ConnectionSlot(active.clone());
    let control = control.clone();
    let spawned = std::thread::Builder::new()
        .name("api-connection".into())
        .stack_size(CONNECTION_STACK)
        .spawn(move || {
            let _slot = slot;
            serve_connection(stream, control.as_ref());
        });
    if let Err(e) = spawned {
        // The closure, with the stream and the slot, was dropped: the client sees a close.
        log::warn!("API server: cannot start a connection thread: {e}");
    }
}

/// Answers 503 without reading the request, giving the client a moment to take it.
fn refuse(stream: UnixStream) {
    if let Some(stream) = DeadlineStream::new(stream, LINGER) {
        let response = Response::fault(
            503,
            format!("the API serves {MAX_CONNECTIONS} connections at once; try again"),
        );
        respond(stream, &response);
    }
}

/// A stream whose reads and writes fail with `TimedOut` once `deadline` has passed.
struct DeadlineStream {
    stream: UnixStream,
    deadline: Instant,
}

impl DeadlineStream {
    /// `stream`, blocking, with `timeout` from now; `None` if it cannot be made blocking.
    fn new(stream: UnixStream, timeout: Duration) -> Option<Self> {
        stream.set_nonblocking(false).ok()?;
        Some(DeadlineStream {
            stream,
            deadline: Instant::now() + timeout,
        })
    }

    fn time_left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(left)
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.time_left()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.time_left()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// Reads one request, answers it and closes the connection.
fn serve_connection(stream: UnixStream, control: &dyn VmmControl) {
    let Some(mut stream) = DeadlineStream::new(stream, REQUEST_TIMEOUT) else {
        return;
    };
    let response = match read_request(&mut stream) {
        Ok(request) => catch_unwind(AssertUnwindSafe(|| routes::handle(control, &request)))
            .unwrap_or_else(|_| {
                Response::fault(
                    500,
                    "internal error: the VMM failed while handling the request",
                )
            }),
        Err(error) => match error.status() {
            Some(status) => Response::fault(status, error.to_string()),
            None => return,
        },
    };
    stream.deadline = Instant::now() + REQUEST_TIMEOUT;
    respond(stream, &response);
}

/// Sends `response` before the stream's deadline and closes the connection.
fn respond(mut stream: DeadlineStream, response: &Response) {
    if let Err(e) = response.write_to(&mut stream) {
        log::debug!("API server: cannot send the response: {e}");
        return;
    }
    linger(stream.stream);
}

/// Closes our side, then reads what the client still sends for a moment, so that unread input
/// does not turn the close into a reset that could make the client lose the response.
fn linger(mut stream: UnixStream) {
    let _ = stream.shutdown(Shutdown::Write);
    if stream.set_read_timeout(Some(LINGER)).is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let deadline = Instant::now() + LINGER;
    while Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_name_is_beside_the_socket_unique_and_within_the_limit() {
        let first = listening_name(Path::new("/run/vmm/api.sock")).unwrap();
        let second = listening_name(Path::new("/run/vmm/api.sock")).unwrap();
        assert_eq!(first.parent(), Some(Path::new("/run/vmm")));
        assert_ne!(first, second, "two servers of one process");
        let dir = format!("/{}", "d".repeat(MAX_SOCKET_PATH - 10));
        assert_eq!(listening_name(&Path::new(&dir).join("s")), None);
    }
}
