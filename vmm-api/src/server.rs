//! The API server: a Unix socket; a client may send request after request on one connection
//! (HTTP/1.1 keep-alive, as Firecracker's API allows and its clients do).
//!
//! One thread waits on every connection at once (epoll): it accepts them, reads what each
//! sends without blocking, and keeps no thread and no buffer for a connection that sends
//! nothing. A connection whose request is complete goes to a thread of its own, which answers
//! it, so a slow request (a snapshot) holds up nobody else (a thread that answered waits a
//! while for the next request, see `request_threads`); at most [`MAX_REQUESTS`] are
//! answered at once; then the connection comes back to wait for the client's next request,
//! unless the client closes it (`ClientConnection: close`, HTTP/1.0). A client gets
//! [`REQUEST_TIMEOUT`] to send a whole request, from its connection or from the first byte of a
//! later request (a deadline, not a per-read timeout: one byte a second does not keep a
//! connection open), and as long to take the response. A kept connection may wait idle for its
//! next request; at most [`MAX_CONNECTIONS`] are open at once: a new one beyond that makes the
//! longest idle kept connection close, or is answered 503 without waiting where none is idle,
//! so idle or slow clients cannot starve the others. The socket is made owner-only (0600) and
//! removed when the server stops.
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::http::{ParseProgress, Request, RequestError, RequestReader, Response, CONTINUE};
use super::request_threads::RequestThreads;
use super::routes;
use super::vmm_control::VmmControl;
use crate::metrics::METRICS;
use vmm_devices::socket_files::{SocketFile, MAX_SOCKET_PATH};

/// Time a client has to send its request, and again to take the response.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Most connections open at once (each costs a file descriptor and a few hundred bytes).
pub const MAX_CONNECTIONS: usize = 4096;
/// Most requests answered at once (each on a thread of its own).
pub const MAX_REQUESTS: usize = 64;
/// The epoll tokens of the listening socket, the stop event and the event of kept connections
/// coming back; connections count from 3.
const LISTENER: u64 = 0;
const STOP: u64 = 1;
const KEPT: u64 = 2;
/// Time given to a client to stop sending after its response, before the connection closes.
const LINGER: Duration = Duration::from_millis(100);
/// Time the requests being answered when the server stops get to finish (a `Shutdown` action
/// ends the VMM while its 204 is on the way).
const FINISH_GRACE: Duration = Duration::from_secs(1);

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
    /// The socket's file, removed once the server stops.
    socket_file: Option<SocketFile>,
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    /// Requests being answered, on threads of their own.
    answering: Arc<AtomicUsize>,
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

/// Raises the soft limit of open files to the hard one (often 1024 to 524288): each open
/// connection holds a descriptor, and [`MAX_CONNECTIONS`] must fit beside the VM's own.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a `struct rlimit`, which `limit` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads a `struct rlimit`, which `limit` is; raising the soft limit
        // up to the hard one needs no privilege, and a failure leaves the old limit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    }
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
        raise_open_file_limit();
        let listener = bind(&path)?;
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(ServerError::Thread)?);
        let thread_stop = stop.clone();
        let answering = Arc::new(AtomicUsize::new(0));
        let thread_answering = answering.clone();
        let kept = Arc::new(KeptConnections {
            streams: Mutex::new(Vec::new()),
            event: EventFd::new(libc::EFD_NONBLOCK).map_err(ServerError::Thread)?,
        });
        // Noted before the thread starts: its first answer (the metrics flushed) may come
        // before this thread runs again.
        METRICS.api_ready();
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || serve(listener, &thread_stop, control, thread_answering, kept));
        match thread {
            Ok(thread) => Ok(ApiServer {
                socket_file: Some(SocketFile::adopt(&path)),
                path,
                stop,
                thread: Some(thread),
                answering,
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
        drop(self.socket_file.take());
        // The answers on their way get a moment to reach their clients before the VMM ends.
        let deadline = Instant::now() + FINISH_GRACE;
        while self.answering.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                log::warn!(
                    "API server: stopping with {} request(s) unanswered",
                    self.answering.load(Ordering::Acquire)
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A connection whose next request is awaited or coming.
struct ClientConnection {
    stream: UnixStream,
    reader: RequestReader,
    /// When its request must be complete: set when it is accepted (a new connection must send
    /// its request) and when the first byte of a later request comes; none while a kept
    /// connection waits for its client's next request.
    deadline: Option<Instant>,
    /// Requests answered on it before.
    answered: u32,
}

/// Connections whose answer went out and that their clients keep, handed back to the server
/// thread by the request threads, and the event that tells it.
struct KeptConnections {
    /// Each with the requests answered on it so far.
    streams: Mutex<Vec<(UnixStream, u32)>>,
    event: EventFd,
}

impl KeptConnections {
    fn hand_back(&self, stream: UnixStream, answered: u32) {
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((stream, answered));
        if let Err(e) = self.event.write(1) {
            log::warn!("API server: cannot hand back a kept connection: {e}");
        }
    }

    fn take(&self) -> Vec<(UnixStream, u32)> {
        // How many came does not matter: all are taken.
        let _ = self.event.read();
        std::mem::take(&mut *self.streams.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The open connections, by epoll token (tokens grow with each accept or return).
struct Connections {
    epoll: Epoll,
    open: BTreeMap<u64, ClientConnection>,
    next_token: u64,
    /// The deadlines of the connections that have one, earliest first.
    deadlines: BTreeSet<(Instant, u64)>,
    /// Kept connections waiting for their next request, the longest waiting first.
    idle: BTreeSet<u64>,
    /// Requests being answered, on threads of their own.
    answering: Arc<AtomicUsize>,
    kept: Arc<KeptConnections>,
    /// The threads that answer requests, kept between them.
    threads: RequestThreads,
}

/// Waits for connections and their requests until `stop` is signalled; a complete request is
/// answered on a thread of its own.
fn serve(
    listener: UnixListener,
    stop: &EventFd,
    control: Arc<dyn VmmControl>,
    answering: Arc<AtomicUsize>,
    kept: Arc<KeptConnections>,
) {
    let Ok(epoll) = Epoll::new() else {
        log::error!("API server: cannot create an epoll instance");
        return;
    };
    let watched = [
        (listener.as_raw_fd(), LISTENER),
        (stop.as_raw_fd(), STOP),
        (kept.event.as_raw_fd(), KEPT),
    ]
    .into_iter()
    .try_for_each(|(fd, token)| {
        epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, token),
        )
    });
    if let Err(e) = watched {
        log::error!("API server: cannot watch the socket: {e}");
        return;
    }
    let mut connections = Connections {
        epoll,
        open: BTreeMap::new(),
        next_token: KEPT + 1,
        deadlines: BTreeSet::new(),
        idle: BTreeSet::new(),
        answering,
        kept,
        threads: RequestThreads::new(),
    };
    // Before the first answer, while no request waits yet: the VMM confines this thread (its
    // seccomp filters, which the request threads started from here inherit). Stacked on the
    // first request instead, it cost that request (a snapshot load into a waiting VMM)
    // 0.1-0.2 ms.
    control.confine_api_thread();
    let mut events = vec![EpollEvent::default(); 64];
    let mut chunk = [0u8; 4096];
    loop {
        let timeout = connections.next_deadline().map_or(-1, |deadline| {
            let left = deadline.saturating_duration_since(Instant::now());
            // Rounded up: waking before the deadline would only wait again.
            i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
        });
        let ready = match connections.epoll.wait(timeout, &mut events) {
            Ok(ready) => ready,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => {
                log::error!("API server: epoll failed, stopping: {e}");
                return;
            }
        };
        for event in &events[..ready] {
            match event.data() {
                STOP => return,
                LISTENER => connections.accept(&listener, &mut chunk, &control),
                token => connections.handle(token, &mut chunk, &control),
            }
        }
        connections.expire(Instant::now());
    }
}

impl Connections {
    /// The earliest deadline of an open connection.
    fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(deadline, _)| *deadline)
    }

    /// Whether there is room for one more connection, made by closing the longest idle kept
    /// connection if need be.
    fn make_room(&mut self) -> bool {
        if self.open.len() < MAX_CONNECTIONS {
            return true;
        }
        match self.idle.first().copied() {
            Some(token) => {
                log::debug!(
                    "API server: {MAX_CONNECTIONS} connections open: the longest idle one closes"
                );
                self.close(token);
                true
            }
            None => false,
        }
    }

    /// Watches `stream`, with `answered` requests answered on it, as a connection that must
    /// send its request by `deadline` (none: a kept connection, idle until its next request
    /// starts).
    fn watch(&mut self, stream: UnixStream, answered: u32, deadline: Option<Instant>) {
        let token = self.next_token;
        self.next_token += 1;
        let watched = stream.set_nonblocking(true).and_then(|()| {
            self.epoll.ctl(
                ControlOperation::Add,
                stream.as_raw_fd(),
                EpollEvent::new(EventSet::IN | EventSet::READ_HANG_UP, token),
            )
        });
        if let Err(e) = watched {
            log::warn!("API server: cannot watch a connection: {e}");
            return;
        }
        match deadline {
            Some(deadline) => self.deadlines.insert((deadline, token)),
            None => self.idle.insert(token),
        };
        let connection = ClientConnection {
            stream,
            reader: RequestReader::default(),
            deadline,
            answered,
        };
        self.open.insert(token, connection);
    }

    /// Accepts every pending connection; one beyond [`MAX_CONNECTIONS`] gets a 503 unless a
    /// connection its client closed or an idle kept connection makes room.
    fn accept(&mut self, listener: &UnixListener, chunk: &mut [u8], control: &Arc<dyn VmmControl>) {
        loop {
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. out of file descriptors: the connection waits in the backlog until
                    // one closes (a deadline runs out within REQUEST_TIMEOUT).
                    log::warn!("API server: accept failed: {e}");
                    return;
                }
            };
            // Clients may have closed connections whose hang-ups epoll reports after the
            // listener's event: those are taken in before anyone is refused.
            if !self.make_room() && !self.handle_ready_connections(chunk, control) {
                refuse_now(
                    stream,
                    503,
                    &format!("the API has {MAX_CONNECTIONS} connections open; try again"),
                );
                continue;
            }
            self.watch(stream, 0, Some(Instant::now() + REQUEST_TIMEOUT));
        }
    }

    /// Handles what the open connections have ready (requests, hang-ups) without waiting, and
    /// tells whether that made room for one more connection.
    fn handle_ready_connections(
        &mut self,
        chunk: &mut [u8],
        control: &Arc<dyn VmmControl>,
    ) -> bool {
        let mut events = [EpollEvent::default(); 64];
        // Each round drains or closes what it reads; a client that sends without end is
        // not followed further than one round per 64 connections.
        for _ in 0..=MAX_CONNECTIONS / events.len() {
            let Ok(ready) = self.epoll.wait(0, &mut events) else {
                break;
            };
            let mut handled = false;
            for event in &events[..ready] {
                match event.data() {
                    // Reported again at the next wait (level-triggered).
                    LISTENER | STOP => continue,
                    token => self.handle(token, chunk, control),
                }
                handled = true;
            }
            if !handled {
                break;
            }
        }
        self.make_room()
    }

    /// Handles the event of `token`: connections coming back, or what a connection sent.
    fn handle(&mut self, token: u64, chunk: &mut [u8], control: &Arc<dyn VmmControl>) {
        match token {
            KEPT => self.take_back(),
            token => self.read(token, chunk, control),
        }
    }

    /// Watches again the connections whose answers went out and whose clients keep them.
    fn take_back(&mut self) {
        for (stream, answered) in self.kept.take() {
            // Where there is no room, the connection closes: its client connects again.
            if self.make_room() {
                self.watch(stream, answered, None);
            }
        }
    }

    /// Reads what connection `token` sent; a complete request is answered on a thread of its
    /// own, a bad one answered with its error.
    fn read(&mut self, token: u64, chunk: &mut [u8], control: &Arc<dyn VmmControl>) {
        let Some(connection) = self.open.get_mut(&token) else {
            return;
        };
        let mut started = false;
        let progress = loop {
            match connection.stream.read(chunk) {
                Ok(n) => {
                    // The first byte of a kept connection's next request starts its clock.
                    if n > 0 && connection.deadline.is_none() {
                        let deadline = Instant::now() + REQUEST_TIMEOUT;
                        connection.deadline = Some(deadline);
                        self.deadlines.insert((deadline, token));
                        started = true;
                    }
                    match connection.reader.feed(&chunk[..n]) {
                        Ok(ParseProgress::NeedMore) if n == chunk.len() => {}
                        Ok(ParseProgress::SendContinue) => {
                            // Its 25 bytes fit in any socket buffer; a peer that cannot take
                            // them times out.
                            let _ = connection.stream.write_all(CONTINUE);
                        }
                        other => break other,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    break Ok(ParseProgress::NeedMore)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Err(RequestError::Closed),
            }
        };
        if started {
            self.idle.remove(&token);
        }
        match progress {
            Ok(ParseProgress::NeedMore | ParseProgress::SendContinue) => {}
            Ok(ParseProgress::Complete(request)) => {
                let connection = self.close(token).expect("open");
                self.answer(connection, request, control);
            }
            Err(error) => {
                let connection = self.close(token).expect("open");
                if let Some(status) = error.status() {
                    refuse_now(connection.stream, status, &error.to_string());
                }
            }
        }
    }

    /// Stops watching connection `token` and hands it over.
    fn close(&mut self, token: u64) -> Option<ClientConnection> {
        let connection = self.open.remove(&token)?;
        if let Some(deadline) = connection.deadline {
            self.deadlines.remove(&(deadline, token));
        }
        self.idle.remove(&token);
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            connection.stream.as_raw_fd(),
            EpollEvent::default(),
        );
        Some(connection)
    }

    /// Answers `request` of `stream` on a thread of its own, or with 503 when
    /// [`MAX_REQUESTS`] are being answered already.
    fn answer(
        &self,
        connection: ClientConnection,
        request: Request,
        control: &Arc<dyn VmmControl>,
    ) {
        if self.answering.fetch_add(1, Ordering::AcqRel) >= MAX_REQUESTS {
            self.answering.fetch_sub(1, Ordering::AcqRel);
            refuse_now(
                connection.stream,
                503,
                &format!("the API answers {MAX_REQUESTS} requests at once; try again"),
            );
            return;
        }
        let slot = RequestSlot(self.answering.clone());
        let control = control.clone();
        let kept = self.kept.clone();
        let started = self.threads.run(Box::new(move || {
            let _slot = slot;
            let answered = connection.answered + 1;
            let kept_stream =
                answer_request(connection.stream, answered, &request, control.as_ref());
            if let Some(stream) = kept_stream {
                kept.hand_back(stream, answered);
            }
        }));
        if let Err(e) = started {
            // The closure, with the stream and the slot, was dropped: the client sees a close.
            log::warn!("API server: cannot start a request thread: {e}");
        }
    }

    /// Answers 408 to, and closes, every connection whose deadline passed by `now` (one that
    /// sent nothing closes without an answer).
    fn expire(&mut self, now: Instant) {
        while let Some(&(_, token)) = self.deadlines.first().filter(|(d, _)| *d <= now) {
            let connection = self.close(token).expect("open");
            if !connection.reader.is_empty() {
                let timeout = RequestError::Timeout;
                refuse_now(connection.stream, 408, &timeout.to_string());
            }
        }
    }
}

/// Counts a request as being answered until dropped.
struct RequestSlot(Arc<AtomicUsize>);

impl Drop for RequestSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answers `status` with the fault `message` without waiting for the client: what the socket
/// buffer takes now, then the close.
fn refuse_now(mut stream: UnixStream, status: u16, message: &str) {
    let response = Response::fault(status, message.to_owned());
    let _ = stream.set_nonblocking(true);
    let mut bytes = Vec::with_capacity(256);
    if response.write_to(&mut bytes, false).is_ok() {
        let _ = stream.write_all(&bytes);
    }
    let _ = stream.shutdown(Shutdown::Write);
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

/// Answers `request` (read already, the `nth` on its connection) on `stream`; returns the
/// connection where its client keeps it for its next request, and closes it otherwise.
fn answer_request(
    stream: UnixStream,
    nth: u32,
    request: &Request,
    control: &dyn VmmControl,
) -> Option<UnixStream> {
    let started = Instant::now();
    log::trace!(
        "API: {} {} with {} body bytes: {}",
        request.method.as_str(),
        request.target.escape_debug(),
        request.body.len(),
        String::from_utf8_lossy(&request.body).escape_debug()
    );
    let response = catch_unwind(AssertUnwindSafe(|| routes::handle(control, request)))
        .unwrap_or_else(|_| {
            METRICS.panic_count.inc();
            Response::fault(
                500,
                "internal error: the VMM failed while handling the request",
            )
        });
    // Counted before the answer goes out: a client may ask for the metrics right after it.
    METRICS
        .api
        .count(request.method.as_str(), &request.target, response.status);
    log::info!(
        "API: {} {}: {} in {:.1} ms{}",
        request.method.as_str(),
        request.target.escape_debug(),
        response.status,
        started.elapsed().as_secs_f64() * 1e3,
        match nth {
            1 => String::new(),
            nth => format!(" (request {nth} on its connection)"),
        }
    );
    // The client's time to take the answer starts once it is ready (a snapshot takes seconds).
    let stream = DeadlineStream::new(stream, REQUEST_TIMEOUT)?;
    respond(stream, &response, request.keep_alive)
}

/// Sends `response` before the stream's deadline; returns the connection if `keep_alive`, and
/// closes it otherwise.
fn respond(
    mut stream: DeadlineStream,
    response: &Response,
    keep_alive: bool,
) -> Option<UnixStream> {
    if let Err(e) = response.write_to(&mut stream, keep_alive) {
        log::debug!("API server: cannot send the response: {e}");
        return None;
    }
    if keep_alive {
        return Some(stream.stream);
    }
    linger(stream.stream);
    None
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
