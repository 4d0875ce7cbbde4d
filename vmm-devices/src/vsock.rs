//! The virtio-vsock device (virtio 1.2 §5.10), Firecracker's hybrid way
//! (`PUT /vsock`): the guest's stream sockets to the host's CID 2 end in Unix sockets.
//!
//! * Host to guest: a host program connects to the device's socket (`uds_path`) and writes
//!   `CONNECT <port>\n`; the device asks the guest's `port` to accept, and once it has,
//!   answers `OK <host_port>\n` and moves bytes both ways.
//! * Guest to host: a guest connection to CID 2 port P connects to the Unix socket
//!   `<uds_path>_P`; none there, and the guest is refused (RST).
//!
//! The device keeps an epoll of its own with its listener and its connections' sockets
//! (edge-triggered: a socket is read until it would block, or until the guest has no buffer
//! or credit left, and then marked readable for later); the event loop watches that epoll.
//! Credit flows as the spec says ([`connection`]): a guest that sends more than it may loses
//! its connection, and the device sends no more than the guest's credit.
//!
//! Everything the guest writes is checked: a packet is a 44-byte header and at most
//! [`MAX_PAYLOAD`] bytes in device-readable buffers inside guest memory, from the guest's own
//! CID to the host's, of the stream type; anything else is dropped or refused and counted as a
//! warning (rate-limited). At most [`MAX_CONNECTIONS`] connections live at once, and none holds
//! its place for ever: a host client that does not finish its `CONNECT` line, or whose port
//! the guest does not answer, within [`HANDSHAKE_TIMEOUT`] each, is dropped, as is one whose
//! host side closed before the guest answered, and one the guest does not close within
//! [`SHUTDOWN_TIMEOUT`] of its host side's end (Firecracker's 2 s). A connection that ends
//! closes its host socket at once, whether or not the guest is there to hear of it (its reset
//! waits for the guest among a bounded number of such).
//!
//! A snapshot keeps no connection (as Firecracker): after a restore the device sends the
//! guest the transport-reset event, and Linux drops its sockets' connections.

pub mod config;
pub mod connection;
pub mod packet;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::{Queue, QueueOwnedT, QueueState, QueueT};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use crate::socket_files::SocketFile;
use crate::virtio::buffers::Buffers;
use crate::virtio::request_queue::read_config;
use crate::virtio::DeviceMemory;
use crate::virtio::{ActivateError, Activation, DeviceState, Interrupt, VirtioDevice, WakeSource};
use crate::GuestWarnings;
use config::VsockConfig;
use connection::{Broken, Connection, ConnectionState};
use packet::{PacketHeader, HEADER_SIZE, HOST_CID, TYPE_STREAM};

/// Most payload bytes in one packet.
pub const MAX_PAYLOAD: usize = 64 << 10;
/// Most connections at once; more are refused.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long a host client may take to send its `CONNECT` line, and the guest to answer it.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the guest may take to close a connection whose host side ended (told by a
/// SHUTDOWN) before the device resets it.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the listener rests after an accept failed for want of descriptors or memory.
const LISTENER_PAUSE: Duration = Duration::from_millis(100);
/// Most refusals of packets that belong to no connection that wait for the guest.
const MAX_STRAY_RSTS: usize = 256;
/// Size of each queue.
const QUEUE_SIZES: [u16; 3] = [256, 256, 16];
/// The receive queue.
const RX: u16 = 0;
/// The transmit queue.
const TX: u16 = 1;
/// The event queue.
const EVENT: u16 = 2;
/// The event that tells the driver its connections are gone.
const TRANSPORT_RESET: u32 = 0;
/// Tokens of the device's epoll: the listener, the restore kick, the deadline timer, then
/// connections.
const LISTENER: u64 = 0;
const KICK: u64 = 1;
const DEADLINE_TIMER: u64 = 2;
const FIRST_CONNECTION: u64 = 3;
/// Rounds of the device's epoll taken per wake.
const MAX_EVENT_ROUNDS: usize = 8;
/// Where host-initiated connections' host ports start (below: ports guests connect to).
const FIRST_LOCAL_PORT: u32 = 1 << 30;

/// Errors of creating a device.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The device's socket could not be made.
    #[error("cannot listen on {}: {source}", .path.display())]
    Listen {
        /// The socket.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Its epoll or kick could not be made.
    #[error("vsock epoll: {0}")]
    Epoll(#[source] io::Error),
}

/// Firecracker's `vsock` metrics.
#[derive(Debug, Default)]
pub struct VsockCounters {
    /// Packets to the guest.
    pub rx_packets: AtomicU64,
    /// Payload bytes to the guest.
    pub rx_bytes: AtomicU64,
    /// Packets from the guest.
    pub tx_packets: AtomicU64,
    /// Payload bytes from the guest.
    pub tx_bytes: AtomicU64,
    /// Connections made.
    pub conns_added: AtomicU64,
    /// Connections ended by a failure or a rule broken.
    pub conns_killed: AtomicU64,
    /// Connections gone.
    pub conns_removed: AtomicU64,
    /// Packets or buffers that broke the rules.
    pub malformed: AtomicU64,
}

/// The queues of an active device.
#[derive(Debug)]
struct VsockQueues {
    rx: Queue,
    tx: Queue,
    event: Queue,
    interrupt: Arc<Interrupt>,
}

/// A virtio-vsock device.
#[derive(Debug)]
pub struct VsockDevice {
    memory: DeviceMemory,
    cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    /// The listener's socket file, removed at the end.
    _socket_file: SocketFile,
    epoll: Epoll,
    kick: EventFd,
    /// Expires when the earliest connection's deadline passes (armed while one is set).
    deadline_timer: TimerFd,
    /// When it expires, while armed.
    timer_expires: Option<Instant>,
    /// Until when the listener is not watched (an accept failed for want of descriptors).
    listener_paused_until: Option<Instant>,
    conns: HashMap<u64, Connection>,
    by_ports: HashMap<(u32, u32), u64>,
    next_token: u64,
    next_local_port: u32,
    /// Connections with something for the guest, in turn.
    ready: VecDeque<u64>,
    /// Refusals of packets of no connection.
    stray: VecDeque<PacketHeader>,
    active: Option<VsockQueues>,
    /// The transport-reset event waits to be sent.
    reset_owed: bool,
    /// A packet's payload on its way from the guest to a socket.
    scratch: Vec<u8>,
    counters: Arc<VsockCounters>,
    warnings: GuestWarnings,
    /// Warnings host clients trigger (connections past the limit).
    client_warnings: GuestWarnings,
}

/// Connects to the Unix socket at `path` without waiting (a full backlog is a refusal).
fn connect_now(path: &Path) -> io::Result<UnixStream> {
    // SAFETY: a plain socket(2) call; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family =
        libc::sa_family_t::try_from(libc::AF_UNIX).map_err(|_| io::ErrorKind::InvalidInput)?;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= address.sun_path.len() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    for (to, &from) in address.sun_path.iter_mut().zip(bytes) {
        *to = from.cast_signed();
    }
    let length = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_un>())
        .map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `address` is a valid sockaddr_un of `length` bytes that outlives the call.
    let done = unsafe {
        libc::connect(
            socket.as_raw_fd(),
            std::ptr::from_ref(&address).cast(),
            length,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(socket))
}

impl VsockDevice {
    /// A device of `config`, listening on its `uds_path` (which must not exist), its queues in
    /// `memory`.
    pub fn new(memory: DeviceMemory, config: &VsockConfig) -> Result<Self, VsockError> {
        let listen_error = |source| VsockError::Listen {
            path: config.uds_path.clone(),
            source,
        };
        let listener = UnixListener::bind(&config.uds_path).map_err(listen_error)?;
        listener.set_nonblocking(true).map_err(listen_error)?;
        let socket_file = SocketFile::adopt(&config.uds_path);
        let epoll = Epoll::new().map_err(VsockError::Epoll)?;
        let kick = EventFd::new(EFD_NONBLOCK).map_err(VsockError::Epoll)?;
        let deadline_timer = TimerFd::new().map_err(|e| VsockError::Epoll(e.into()))?;
        for (fd, token) in [
            (listener.as_raw_fd(), LISTENER),
            (kick.as_raw_fd(), KICK),
            (deadline_timer.as_raw_fd(), DEADLINE_TIMER),
        ] {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(VsockError::Epoll)?;
        }
        Ok(VsockDevice {
            memory,
            cid: u64::from(config.guest_cid),
            uds_path: config.uds_path.clone(),
            listener,
            _socket_file: socket_file,
            epoll,
            kick,
            deadline_timer,
            timer_expires: None,
            listener_paused_until: None,
            conns: HashMap::new(),
            by_ports: HashMap::new(),
            next_token: FIRST_CONNECTION,
            next_local_port: FIRST_LOCAL_PORT,
            ready: VecDeque::new(),
            stray: VecDeque::new(),
            active: None,
            reset_owed: false,
            scratch: vec![0; MAX_PAYLOAD],
            counters: Arc::default(),
            warnings: GuestWarnings::default(),
            client_warnings: GuestWarnings::default(),
        })
    }

    /// The device's counters, for the metrics.
    pub fn counters(&self) -> Arc<VsockCounters> {
        self.counters.clone()
    }

    /// Adds `conn` to the device: its socket in the epoll. Returns its token.
    fn add(&mut self, conn: Connection) -> Option<u64> {
        let token = self.next_token;
        let events =
            EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED;
        if let Err(e) = self.epoll.ctl(
            ControlOperation::Add,
            conn.stream.as_raw_fd(),
            EpollEvent::new(events, token),
        ) {
            log::error!("vsock: cannot watch a connection's socket: {e}");
            return None;
        }
        self.next_token += 1;
        if conn.state != ConnectionState::AwaitingConnect {
            self.by_ports
                .insert((conn.local_port, conn.peer_port), token);
        }
        self.conns.insert(token, conn);
        self.counters.conns_added.fetch_add(1, Ordering::Relaxed);
        Some(token)
    }

    /// Removes connection `token` (its socket closes).
    fn remove(&mut self, token: u64) {
        if let Some(conn) = self.conns.remove(&token) {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                conn.stream.as_raw_fd(),
                EpollEvent::default(),
            );
            self.by_ports.remove(&(conn.local_port, conn.peer_port));
            self.counters.conns_removed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ends connection `token` for `why`: its host socket closes now, and the guest is told
    /// (RST) unless it never heard of it.
    fn kill(&mut self, token: u64, why: &Broken) {
        self.counters.conns_killed.fetch_add(1, Ordering::Relaxed);
        let cid = self.cid;
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        log::debug!(
            "vsock: connection {}:{} ended: {why:?}",
            conn.local_port,
            conn.peer_port
        );
        let guest_heard = match conn.state {
            ConnectionState::AwaitingConnect => false,
            ConnectionState::Requested => !conn.owed.request,
            ConnectionState::Established => true,
        };
        let reset = conn.header(cid, packet::OP_RST, 0, 0);
        self.remove(token);
        if guest_heard {
            self.owe_guest(reset);
        }
    }

    /// Keeps `header` (a reset) for the guest's next receive buffer, among at most
    /// [`MAX_STRAY_RSTS`]; past that it is dropped (the guest's next packet on that
    /// connection is refused with another).
    fn owe_guest(&mut self, header: PacketHeader) {
        if self.stray.len() == MAX_STRAY_RSTS {
            self.warnings.warn(format_args!(
                "vsock: too many refusals waiting for the guest"
            ));
            return;
        }
        self.stray.push_back(header);
    }

    /// Puts connection `token` in line for the receive queue.
    fn queue(&mut self, token: u64) {
        if let Some(conn) = self.conns.get_mut(&token) {
            if !conn.queued && conn.has_work() {
                conn.queued = true;
                self.ready.push_back(token);
            }
        }
    }

    /// Refuses a packet of no connection: an RST back, unless it was one.
    fn refuse(&mut self, header: &PacketHeader) {
        if header.op == packet::OP_RST {
            return;
        }
        self.owe_guest(PacketHeader {
            src_cid: HOST_CID,
            dst_cid: self.cid,
            src_port: header.dst_port,
            dst_port: header.src_port,
            len: 0,
            kind: TYPE_STREAM,
            op: packet::OP_RST,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        });
    }

    /// A free host port for a host-initiated connection.
    fn local_port(&mut self, peer_port: u32) -> u32 {
        loop {
            let port = self.next_local_port;
            self.next_local_port = self.next_local_port.wrapping_add(1).max(FIRST_LOCAL_PORT);
            if !self.by_ports.contains_key(&(port, peer_port)) {
                return port;
            }
        }
    }

    /// The guest asks to connect to the host's port `header.dst_port`.
    fn connect_to_host(&mut self, header: &PacketHeader) {
        if self.conns.len() >= MAX_CONNECTIONS {
            self.warnings.warn(format_args!(
                "vsock: {MAX_CONNECTIONS} connections: refused"
            ));
            self.refuse(header);
            return;
        }
        let mut path = self.uds_path.clone().into_os_string();
        path.push(format!("_{}", header.dst_port));
        let stream = match connect_now(Path::new(&path)) {
            Ok(stream) => stream,
            Err(e) => {
                log::debug!("vsock: the guest's connection to {path:?}: {e}");
                self.refuse(header);
                return;
            }
        };
        let mut conn = Connection::new(
            stream,
            ConnectionState::Established,
            header.dst_port,
            header.src_port,
        );
        conn.take_credit(header);
        conn.owed.response = true;
        if let Some(token) = self.add(conn) {
            self.queue(token);
        } else {
            self.refuse(header);
        }
    }

    /// Takes one packet the guest sent, its payload in `payload`.
    fn take_packet(&mut self, header: &PacketHeader, payload: &Buffers) {
        if header.src_cid != self.cid || header.dst_cid != HOST_CID {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            self.warnings.warn(format_args!(
                "vsock: a packet from CID {} to CID {} (the guest is {}, the host {HOST_CID})",
                header.src_cid, header.dst_cid, self.cid
            ));
            return;
        }
        if header.kind != TYPE_STREAM {
            self.refuse(header);
            return;
        }
        let Some(&token) = self.by_ports.get(&(header.dst_port, header.src_port)) else {
            if header.op == packet::OP_REQUEST {
                self.connect_to_host(header);
            } else {
                self.refuse(header);
            }
            return;
        };
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.take_credit(header);
        let result = match header.op {
            packet::OP_RESPONSE if conn.state == ConnectionState::Requested => {
                conn.state = ConnectionState::Established;
                conn.deadline = None;
                let line = format!("OK {}\n", conn.local_port);
                conn.say(line.as_bytes())
            }
            packet::OP_RW if conn.state == ConnectionState::Established => {
                let len = header.len as usize;
                let scratch = &mut self.scratch[..len];
                payload.read_at(0, scratch);
                self.counters
                    .tx_bytes
                    .fetch_add(len as u64, Ordering::Relaxed);
                let result = conn.receive(scratch);
                if conn.credit_is_stale() {
                    conn.owed.credit_update = true;
                }
                result
            }
            packet::OP_SHUTDOWN => {
                if header.flags & packet::SHUTDOWN_SEND != 0 {
                    conn.guest_done_sending = true;
                }
                let both = packet::SHUTDOWN_SEND | packet::SHUTDOWN_RCV;
                if header.flags & both == both {
                    // As Firecracker: the guest is done both ways; the RST closes it.
                    conn.owed.rst = true;
                }
                conn.flush()
            }
            packet::OP_RST => {
                self.remove(token);
                return;
            }
            packet::OP_CREDIT_UPDATE => Ok(()),
            packet::OP_CREDIT_REQUEST => {
                conn.owed.credit_update = true;
                Ok(())
            }
            _ => Err(Broken::Protocol),
        };
        match result {
            Ok(()) => self.queue(token),
            Err(why) => {
                if why == Broken::CreditExceeded || why == Broken::Protocol {
                    self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                    self.warnings.warn(format_args!(
                        "vsock: connection {}:{}: {why:?}",
                        header.dst_port, header.src_port
                    ));
                }
                self.kill(token, &why);
            }
        }
    }

    /// Takes every packet the guest sent.
    fn transmit(&mut self) {
        let Some(mut queues) = self.active.take() else {
            return;
        };
        let memory = Arc::clone(&self.memory);
        let mem = memory.memory();
        let mut used = false;
        while let Some(chain) = queues.tx.pop_descriptor_chain(&*mem) {
            let head = chain.head_index();
            match Buffers::gather(&mem, chain, false, HEADER_SIZE + MAX_PAYLOAD) {
                Ok(buffers) if buffers.len() >= HEADER_SIZE => {
                    let mut bytes = [0u8; HEADER_SIZE];
                    buffers.read_at(0, &mut bytes);
                    let header = PacketHeader::parse(&bytes);
                    if header.len as usize > buffers.len() - HEADER_SIZE {
                        self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                        self.warnings.warn(format_args!(
                            "vsock: a packet says it has {} bytes and has {}",
                            header.len,
                            buffers.len() - HEADER_SIZE
                        ));
                    } else {
                        self.counters.tx_packets.fetch_add(1, Ordering::Relaxed);
                        self.take_packet(&header, &buffers.from(HEADER_SIZE));
                    }
                }
                Ok(_) => {
                    self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                    self.warnings
                        .warn(format_args!("vsock: a packet shorter than its header"));
                }
                Err(e) => {
                    self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                    self.warnings.warn(format_args!("vsock: a packet: {e}"));
                }
            }
            if queues.tx.add_used(&*mem, head, 0).is_err() {
                self.warnings.warn(format_args!(
                    "vsock: the transmit used ring is not in guest memory"
                ));
                break;
            }
            used = true;
        }
        if used && queues.interrupt.signal_used_queue().is_err() {
            log::error!("vsock: cannot raise the used-buffer interrupt");
        }
        self.active = Some(queues);
    }

    /// Fills one receive buffer for connection `token`: the header and payload written, or
    /// `None` when it has nothing to send now.
    fn packet_for(&mut self, token: u64, buffers: &Buffers) -> Option<(PacketHeader, usize)> {
        let cid = self.cid;
        let conn = self.conns.get_mut(&token)?;
        let (op, flags) = if conn.owed.rst {
            (packet::OP_RST, 0)
        } else if conn.owed.request {
            conn.owed.request = false;
            (packet::OP_REQUEST, 0)
        } else if conn.owed.response {
            conn.owed.response = false;
            (packet::OP_RESPONSE, 0)
        } else if conn.can_send_data() {
            let room = (buffers.len() - HEADER_SIZE)
                .min(MAX_PAYLOAD)
                .min(conn.peer_credit() as usize);
            let payload = buffers.from(HEADER_SIZE).first(room);
            let count = libc::c_int::try_from(payload.iovecs().len()).unwrap_or(0);
            // SAFETY: the iovecs are device-writable guest buffers `gather` checked, which
            // the caller holds mapped; readv writes only into them.
            let read =
                unsafe { libc::readv(conn.stream.as_raw_fd(), payload.iovecs().as_ptr(), count) };
            match usize::try_from(read) {
                Ok(0) => {
                    // The host side sends no more: the guest hears it and may still answer
                    // (its SHUTDOWN or RST ends the connection), in time.
                    conn.readable = false;
                    conn.host_done_sending = true;
                    let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
                    conn.deadline = Some(deadline);
                    let header = conn.header(cid, packet::OP_SHUTDOWN, 0, packet::SHUTDOWN_SEND);
                    buffers.write_at(0, &header.to_bytes());
                    self.arm_deadline_timer(deadline);
                    return Some((header, 0));
                }
                Ok(read) => {
                    let len = u32::try_from(read).unwrap_or(u32::MAX);
                    conn.sent(len);
                    let header = conn.header(cid, packet::OP_RW, len, 0);
                    buffers.write_at(0, &header.to_bytes());
                    self.counters
                        .rx_bytes
                        .fetch_add(read as u64, Ordering::Relaxed);
                    return Some((header, read));
                }
                Err(_) => {
                    let error = io::Error::last_os_error();
                    conn.readable = false;
                    if error.kind() == io::ErrorKind::WouldBlock {
                        return None;
                    }
                    conn.owed.rst = true;
                    (packet::OP_RST, 0)
                }
            }
        } else if conn.owed.credit_update {
            conn.owed.credit_update = false;
            (packet::OP_CREDIT_UPDATE, 0)
        } else {
            return None;
        };
        let header = conn.header(cid, op, 0, flags);
        buffers.write_at(0, &header.to_bytes());
        Some((header, 0))
    }

    /// Fills the guest's receive buffers with what the host side has for it.
    fn receive(&mut self) {
        let Some(mut queues) = self.active.take() else {
            return;
        };
        let memory = Arc::clone(&self.memory);
        let mem = memory.memory();
        let mut used = false;
        loop {
            let stray = self.stray.front().copied();
            let token = match stray {
                Some(_) => None,
                None => match self.ready.pop_front() {
                    Some(token) => Some(token),
                    None => break,
                },
            };
            let Some(chain) = queues.rx.pop_descriptor_chain(&*mem) else {
                if let Some(token) = token {
                    self.ready.push_front(token);
                }
                break;
            };
            let head = chain.head_index();
            let buffers = match Buffers::gather(&mem, chain, true, HEADER_SIZE + MAX_PAYLOAD) {
                Ok(buffers) if buffers.len() >= HEADER_SIZE => buffers,
                result => {
                    self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                    self.warnings.warn(format_args!(
                        "vsock: a receive buffer: {}",
                        result.map_or_else(|e| e.to_string(), |_| "shorter than a header".into())
                    ));
                    if let Some(token) = token {
                        self.ready.push_front(token);
                    }
                    if queues.rx.add_used(&*mem, head, 0).is_err() {
                        break;
                    }
                    used = true;
                    continue;
                }
            };
            let written = match token {
                None => {
                    let header = self.stray.pop_front().unwrap_or_default();
                    buffers.write_at(0, &header.to_bytes());
                    Some(0)
                }
                Some(token) => {
                    let sent = self.packet_for(token, &buffers);
                    let done = sent.is_some_and(|(header, _)| header.op == packet::OP_RST);
                    if done {
                        self.remove(token);
                    } else if let Some(conn) = self.conns.get_mut(&token) {
                        conn.queued = false;
                        self.queue(token);
                    }
                    sent.map(|(_, payload)| payload)
                }
            };
            let Some(payload) = written else {
                queues.rx.go_to_previous_position();
                continue;
            };
            self.counters.rx_packets.fetch_add(1, Ordering::Relaxed);
            let len = u32::try_from(HEADER_SIZE + payload).unwrap_or(u32::MAX);
            if queues.rx.add_used(&*mem, head, len).is_err() {
                self.warnings.warn(format_args!(
                    "vsock: the receive used ring is not in guest memory"
                ));
                break;
            }
            used = true;
        }
        if used && queues.interrupt.signal_used_queue().is_err() {
            log::error!("vsock: cannot raise the used-buffer interrupt");
        }
        self.active = Some(queues);
    }

    /// Sends the transport-reset event if it is owed and the driver gave a buffer for it.
    fn send_reset_event(&mut self) {
        if !self.reset_owed {
            return;
        }
        let Some(queues) = self.active.as_mut() else {
            return;
        };
        let memory = Arc::clone(&self.memory);
        let mem = memory.memory();
        let Some(chain) = queues.event.pop_descriptor_chain(&*mem) else {
            return;
        };
        let head = chain.head_index();
        let len = match Buffers::gather(&mem, chain, true, 4) {
            Ok(buffers) if buffers.len() == 4 => {
                buffers.write_at(0, &TRANSPORT_RESET.to_le_bytes());
                4
            }
            _ => {
                self.warnings
                    .warn(format_args!("vsock: an event buffer shorter than an event"));
                0
            }
        };
        self.reset_owed = false;
        if queues.event.add_used(&*mem, head, len).is_ok() {
            let _ = queues.interrupt.signal_used_queue();
        }
    }

    /// Takes what the device's epoll reports: at most [`MAX_EVENT_ROUNDS`] rounds of events, so
    /// that sockets that keep signalling cannot hold the event loop (what is left wakes it
    /// again).
    fn host_events(&mut self) {
        let mut events = [EpollEvent::default(); 32];
        for _ in 0..MAX_EVENT_ROUNDS {
            let count = match self.epoll.wait(0, &mut events) {
                Ok(count) => count,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("vsock: epoll: {e}");
                    return;
                }
            };
            if count == 0 {
                return;
            }
            for event in &events[..count] {
                let set = event.event_set();
                match event.data() {
                    LISTENER => self.accept(),
                    KICK => {
                        let _ = self.kick.read();
                        self.send_reset_event();
                    }
                    DEADLINE_TIMER => self.end_overdue_connections(),
                    token => self.socket_event(token, set),
                }
            }
        }
    }

    /// Takes the host clients waiting on the device's socket.
    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.conns.len() >= MAX_CONNECTIONS {
                        self.client_warnings.warn_of(
                            "host client",
                            format_args!(
                                "vsock: {MAX_CONNECTIONS} connections: a host client refused"
                            ),
                        );
                        continue;
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let mut conn = Connection::new(stream, ConnectionState::AwaitingConnect, 0, 0);
                    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
                    conn.deadline = Some(deadline);
                    self.arm_deadline_timer(deadline);
                    if let Some(token) = self.add(conn) {
                        // Its line may be there already.
                        self.socket_event(token, EventSet::IN);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.client_warnings.warn_of(
                        "host client",
                        format_args!(
                            "vsock: accept on {}: {e}; new clients wait {} ms",
                            self.uds_path.display(),
                            LISTENER_PAUSE.as_millis()
                        ),
                    );
                    // Out of descriptors or memory: the client stays in the backlog, and the
                    // listener would wake the loop at once again. It rests a while.
                    self.pause_listener();
                    return;
                }
            }
        }
    }

    /// Stops watching the listener for [`LISTENER_PAUSE`].
    fn pause_listener(&mut self) {
        let unwatched = self.epoll.ctl(
            ControlOperation::Delete,
            self.listener.as_raw_fd(),
            EpollEvent::default(),
        );
        if let Err(e) = unwatched {
            log::error!("vsock: cannot stop watching the listener: {e}");
            return;
        }
        self.rest_listener(Instant::now());
    }

    /// Leaves the listener unwatched until [`LISTENER_PAUSE`] after `now`.
    fn rest_listener(&mut self, now: Instant) {
        let until = now + LISTENER_PAUSE;
        self.listener_paused_until = Some(until);
        self.arm_deadline_timer(until);
    }

    /// Watches the listener again once its pause is over.
    fn resume_listener(&mut self, now: Instant) {
        match self.listener_paused_until {
            Some(until) if until <= now => {}
            Some(until) => return self.arm_deadline_timer(until),
            None => return,
        }
        let watched = self.epoll.ctl(
            ControlOperation::Add,
            self.listener.as_raw_fd(),
            EpollEvent::new(EventSet::IN, LISTENER),
        );
        match watched {
            Ok(()) => self.listener_paused_until = None,
            Err(e) => {
                log::error!("vsock: cannot watch the listener again: {e}");
                self.rest_listener(now);
            }
        }
    }

    /// Makes the deadline timer fire at `deadline`, unless it is armed already for an earlier
    /// one.
    fn arm_deadline_timer(&mut self, deadline: Instant) {
        if self.timer_expires.is_some_and(|armed| armed <= deadline) {
            return;
        }
        // At least a millisecond: a zero would disarm the timer.
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match self.deadline_timer.reset(wait, None) {
            Ok(()) => self.timer_expires = Some(deadline),
            Err(e) => log::error!("vsock: cannot arm the deadline timer: {e}"),
        }
    }

    /// Ends the connections past their deadline (a handshake not done in time, a guest that did
    /// not close after the host side's end), and arms the timer for the next deadline.
    fn end_overdue_connections(&mut self) {
        let _ = self.deadline_timer.wait();
        self.timer_expires = None;
        let now = Instant::now();
        self.resume_listener(now);
        let mut overdue = Vec::new();
        let mut next: Option<Instant> = None;
        for (&token, conn) in &self.conns {
            match conn.deadline {
                Some(deadline) if deadline <= now => overdue.push((token, conn.state)),
                Some(deadline) => next = Some(next.map_or(deadline, |n| n.min(deadline))),
                None => {}
            }
        }
        for (token, state) in overdue {
            let why = match state {
                ConnectionState::Established => Broken::ShutdownTimeout,
                ConnectionState::AwaitingConnect | ConnectionState::Requested => {
                    Broken::HandshakeTimeout
                }
            };
            self.kill(token, &why);
        }
        if let Some(next) = next {
            self.arm_deadline_timer(next);
        }
    }

    /// Connection `token`'s socket is readable, writable or gone.
    fn socket_event(&mut self, token: u64, set: EventSet) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if conn.state == ConnectionState::AwaitingConnect {
            match conn.read_connect_line() {
                Ok(None) => {}
                Ok(Some(port)) => {
                    let local = self.local_port(port);
                    let conn = self.conns.get_mut(&token).expect("the connection");
                    conn.local_port = local;
                    conn.peer_port = port;
                    conn.state = ConnectionState::Requested;
                    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
                    conn.deadline = Some(deadline);
                    conn.owed.request = true;
                    self.by_ports.insert((local, port), token);
                    self.arm_deadline_timer(deadline);
                    self.queue(token);
                }
                Err(why) => self.kill(token, &why),
            }
            return;
        }
        if conn.state == ConnectionState::Requested
            && set.intersects(EventSet::HANG_UP | EventSet::ERROR)
        {
            // The client closed (both ways, not only its sending side) before the guest
            // answered.
            self.kill(token, &Broken::Host(io::ErrorKind::UnexpectedEof));
            return;
        }
        if set.intersects(EventSet::OUT | EventSet::ERROR | EventSet::HANG_UP) {
            if let Err(why) = conn.flush() {
                self.kill(token, &why);
                return;
            }
            if conn.credit_is_stale() {
                conn.owed.credit_update = true;
            }
        }
        if set.intersects(EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP) {
            conn.readable = true;
        }
        self.queue(token);
    }

    fn start(&mut self, activation: Activation<DeviceMemory>) -> Result<(), ActivateError> {
        let mut queues: [Option<Queue>; 3] = [None, None, None];
        for queue in activation.queues {
            if let Some(slot) = queues.get_mut(usize::from(queue.index)) {
                *slot = Some(queue.queue);
            }
        }
        let [rx, tx, event] = queues;
        self.active = Some(VsockQueues {
            rx: rx.ok_or(ActivateError::MissingQueue(RX))?,
            tx: tx.ok_or(ActivateError::MissingQueue(TX))?,
            event: event.ok_or(ActivateError::MissingQueue(EVENT))?,
            interrupt: activation.interrupt,
        });
        Ok(())
    }

    /// Drops every connection.
    fn drop_connections(&mut self) {
        let tokens: Vec<u64> = self.conns.keys().copied().collect();
        for token in tokens {
            self.remove(token);
        }
        self.ready.clear();
        self.stray.clear();
    }
}

impl VirtioDevice<DeviceMemory> for VsockDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn device_features(&self) -> u64 {
        0
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // `le64 guest_cid`.
        read_config(&self.cid.to_le_bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        self.warnings.warn(format_args!(
            "vsock: write to the read-only config space at {offset}"
        ));
    }

    fn activate(&mut self, activation: Activation<DeviceMemory>) -> Result<(), ActivateError> {
        self.start(activation)?;
        self.receive();
        Ok(())
    }

    fn process_queue(&mut self, index: u16) {
        match index {
            TX => {
                self.transmit();
                self.receive();
            }
            RX => self.receive(),
            EVENT => self.send_reset_event(),
            _ => {}
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.drop_connections();
    }

    fn queue_states(&self) -> Vec<(u16, QueueState)> {
        self.active
            .iter()
            .flat_map(|q| {
                [
                    (RX, q.rx.state()),
                    (TX, q.tx.state()),
                    (EVENT, q.event.state()),
                ]
            })
            .collect()
    }

    fn save_state(&self) -> DeviceState {
        DeviceState::Vsock
    }

    fn wake_sources(&self) -> Vec<WakeSource> {
        vec![WakeSource::level(self.epoll.as_raw_fd())]
    }

    fn wake(&mut self, _source: usize) {
        self.host_events();
        self.receive();
    }

    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<DeviceMemory>>,
    ) -> Result<(), ActivateError> {
        if *state != DeviceState::Vsock {
            return Err(ActivateError::Device(
                format!("a virtio-vsock device cannot take the state {state:?}").into(),
            ));
        }
        if let Some(activation) = activation {
            self.start(activation)?;
            // The guest's connections did not survive: it hears so once the VM runs.
            self.reset_owed = true;
            self.kick.write(1).map_err(ActivateError::EventFd)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
