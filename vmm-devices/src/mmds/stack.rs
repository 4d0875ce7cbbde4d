//! MMDS's network side: the frames a guest sends to the MMDS address (its ARP requests for
//! it, its TCP to port 80) go into a TCP/IP stack of their own (smoltcp) instead of the tap,
//! and the stack's answers come back as frames for the guest. No host socket is involved: the
//! traffic never leaves the VMM.
//!
//! Bounded: at most [`MAX_QUEUED`] frames wait each way (more are dropped, as a full link
//! would), [`SOCKETS`] connections are served at once, a request is at most
//! [`MAX_REQUEST_BYTES`] and each answer closes its connection.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{Checksum, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr};

use super::http::{self, MAX_REQUEST_BYTES};
use super::store::Store;
use super::Version;

/// The Ethernet address MMDS answers from.
pub const MMDS_MAC: [u8; 6] = [0x06, 0x01, 0x23, 0x45, 0x67, 0x01];
/// Connections served at once.
pub const SOCKETS: usize = 8;
/// Most frames waiting each way.
pub const MAX_QUEUED: usize = 256;
/// The largest Ethernet frame either way (a 1500-byte MTU).
const FRAME: usize = 1514;
/// MMDS's port.
const PORT: u16 = 80;
/// How long a connection may live: one older is reset, so that guest connections that say
/// nothing, or never close, cannot hold the slots (a request is answered in milliseconds).
const MAX_CONNECTION_AGE: std::time::Duration = std::time::Duration::from_secs(30);

/// What MMDS serves, shared by the API and every interface that reaches it.
#[derive(Debug, Clone)]
pub struct StackShared {
    /// The document and tokens.
    pub store: Arc<Mutex<Store>>,
    /// V1 or V2.
    pub version: Version,
    /// Answer in IMDS's text form always.
    pub imds_compat: bool,
}

/// The stack's link: frames in from the guest, frames out to it.
#[derive(Debug, Default)]
struct GuestLink {
    from_guest: VecDeque<Vec<u8>>,
    to_guest: VecDeque<Vec<u8>>,
}

/// A frame the stack takes in.
struct Incoming(Vec<u8>);
/// Room for a frame the stack sends.
struct Outgoing<'a>(&'a mut VecDeque<Vec<u8>>);

impl smoltcp::phy::RxToken for Incoming {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for Outgoing<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0u8; len];
        let result = f(&mut frame);
        if self.0.len() < MAX_QUEUED {
            self.0.push_back(frame);
        }
        result
    }
}

impl Device for GuestLink {
    type RxToken<'a> = Incoming;
    type TxToken<'a> = Outgoing<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(Incoming, Outgoing<'_>)> {
        let frame = self.from_guest.pop_front()?;
        Some((Incoming(frame), Outgoing(&mut self.to_guest)))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Outgoing<'_>> {
        Some(Outgoing(&mut self.to_guest))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = FRAME;
        // A guest with checksum offload leaves its checksums to the device: they are not
        // checked coming in (the guest's own memory), and computed going out.
        let mut checksums = ChecksumCapabilities::default();
        checksums.ipv4 = Checksum::Tx;
        checksums.tcp = Checksum::Tx;
        caps.checksum = checksums;
        caps
    }
}

/// One connection's slot.
#[derive(Debug)]
struct TcpSlot {
    handle: SocketHandle,
    request: Vec<u8>,
    answered: bool,
    /// When the connection was first seen (none while listening).
    since: Option<std::time::Instant>,
}

impl TcpSlot {
    /// Makes the slot's closed `socket` listen for the next connection.
    fn listen(&mut self, socket: &mut tcp::Socket<'_>) {
        self.request.clear();
        self.answered = false;
        self.since = None;
        // A guest that stops acknowledging gives up its connection after 10 s (the device's
        // timer runs the stack when the time comes: see `Stack::poll_delay`).
        socket.set_timeout(Some(smoltcp::time::Duration::from_secs(10)));
        let _ = socket.listen(PORT);
    }
}

/// MMDS for one interface.
pub struct Stack {
    ip: Ipv4Addr,
    iface: Interface,
    link: GuestLink,
    sockets: SocketSet<'static>,
    slots: Vec<TcpSlot>,
    shared: StackShared,
    started: std::time::Instant,
    /// [`MAX_CONNECTION_AGE`].
    max_age: std::time::Duration,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("ip", &self.ip)
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// MMDS at `ip` serving `shared`.
    pub fn new(ip: Ipv4Addr, shared: StackShared) -> Self {
        let mut link = GuestLink::default();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(MMDS_MAC)));
        let mut seed = [0u8; 8];
        let _ = crate::entropy::host_random(&mut seed);
        config.random_seed = u64::from_le_bytes(seed);
        let started = std::time::Instant::now();
        let mut iface = Interface::new(config, &mut link, Instant::from_millis(0));
        // Every address on the link is a neighbour: the guest's may be in any network (it
        // routes MMDS's address to the interface, whatever its own).
        iface.update_ip_addrs(|addresses| {
            let _ = addresses.push(IpCidr::new(ip.into(), 0));
        });
        let mut sockets = SocketSet::new(Vec::new());
        let slots = (0..SOCKETS)
            .map(|_| {
                let socket = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0; MAX_REQUEST_BYTES]),
                    tcp::SocketBuffer::new(vec![0; 64 << 10]),
                );
                TcpSlot {
                    handle: sockets.add(socket),
                    request: Vec::new(),
                    answered: false,
                    since: None,
                }
            })
            .collect();
        Stack {
            ip,
            iface,
            link,
            sockets,
            slots,
            shared,
            started,
            max_age: MAX_CONNECTION_AGE,
        }
    }

    /// Whether the Ethernet frame whose start is `head` (at least 42 bytes, or all of it) is
    /// for MMDS: an ARP request for its address, or IPv4 to it.
    pub fn wants(&self, head: &[u8]) -> bool {
        let ip = self.ip.octets();
        match head.get(12..14) {
            Some([0x08, 0x06]) => head.get(38..42) == Some(&ip[..]),
            Some([0x08, 0x00]) => head.get(30..34) == Some(&ip[..]),
            _ => false,
        }
    }

    /// Takes a frame the guest sent to MMDS and runs the stack.
    pub fn take(&mut self, frame: Vec<u8>) {
        if self.link.from_guest.len() < MAX_QUEUED {
            self.link.from_guest.push_back(frame);
        }
        self.poll();
    }

    /// The next frame for the guest.
    pub fn next_frame(&mut self) -> Option<Vec<u8>> {
        self.link.to_guest.pop_front()
    }

    /// Whether frames wait for the guest.
    pub fn has_frames(&self) -> bool {
        !self.link.to_guest.is_empty()
    }

    /// The stack's clock.
    fn now(&self) -> Instant {
        Instant::from_millis(i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX))
    }

    /// How long until the stack must run again though no frame comes (a retransmission, a
    /// connection's timeout, one grown too old); none: not before the guest's next frame.
    pub fn poll_delay(&mut self) -> Option<std::time::Duration> {
        let now = self.now();
        let stack = self
            .iface
            .poll_delay(now, &self.sockets)
            .map(|delay| std::time::Duration::from_micros(delay.total_micros()));
        let oldest = self.slots.iter().filter_map(|slot| slot.since).min();
        let age_limit = oldest.map(|since| {
            (since + self.max_age).saturating_duration_since(std::time::Instant::now())
        });
        match (stack, age_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the stack: takes the guest's frames, answers complete requests, times connections
    /// out.
    pub fn poll(&mut self) {
        let now = self.now();
        let wall = std::time::Instant::now();
        // Closed slots (a connection over, or reset since the last poll) listen again before
        // the guest's frames come in.
        for slot in &mut self.slots {
            let socket = self.sockets.get_mut::<tcp::Socket>(slot.handle);
            if socket.state() == tcp::State::Closed {
                slot.listen(socket);
            }
        }
        self.iface.poll(now, &mut self.link, &mut self.sockets);
        for slot in &mut self.slots {
            let socket = self.sockets.get_mut::<tcp::Socket>(slot.handle);
            match socket.state() {
                tcp::State::Listen => {
                    slot.since = None;
                    continue;
                }
                tcp::State::Closed => {
                    slot.listen(socket);
                    continue;
                }
                // The guest's side is closed too: nothing more to send or wait for.
                tcp::State::TimeWait => {
                    socket.abort();
                    continue;
                }
                _ => {}
            }
            let since = *slot.since.get_or_insert(wall);
            if wall.saturating_duration_since(since) >= self.max_age {
                // A reset to the guest; the slot listens again at the next poll, which its
                // past deadline asks for at once (`poll_delay`).
                socket.abort();
                continue;
            }
            if socket.can_recv() {
                let room = MAX_REQUEST_BYTES - slot.request.len();
                let _ = socket.recv(|data| {
                    let take = data.len().min(room);
                    slot.request.extend_from_slice(&data[..take]);
                    (data.len(), ())
                });
            }
            let full = slot.request.len() == MAX_REQUEST_BYTES;
            if !slot.answered && socket.may_send() && (http::complete(&slot.request) || full) {
                let answer = {
                    let mut store = self
                        .shared
                        .store
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    http::answer(
                        &slot.request,
                        &mut store,
                        self.shared.version,
                        self.shared.imds_compat,
                        std::time::Instant::now(),
                    )
                };
                let _ = socket.send_slice(&answer);
                socket.close();
                slot.answered = true;
            }
        }
        self.iface.poll(now, &mut self.link, &mut self.sockets);
    }
}

#[cfg(test)]
mod tests;
