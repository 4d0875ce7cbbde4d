//! One vsock connection as the host sees it: a Unix stream socket, the credit both sides give,
//! and the control packets it owes the guest.
//!
//! Credit (virtio 1.2 §5.10.6.3): each side tells the other how large its receive buffer is
//! (`buf_alloc`) and how much it has taken out of it (`fwd_cnt`); a sender may have at most
//! `buf_alloc - (sent - fwd_cnt)` bytes in flight. The host side's buffer is [`BUF_ALLOC`]
//! bytes of what the guest sent and the Unix socket did not take yet; a guest that sends more
//! than its credit loses the connection.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::packet::{PacketHeader, HOST_CID, TYPE_STREAM};

/// The host side's receive buffer per connection.
pub const BUF_ALLOC: u32 = 256 << 10;
/// Longest `CONNECT <port>\n` line a host client may send.
pub const MAX_CONNECT_LINE: usize = 32;

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionState {
    /// A host client connected to the device's socket; its `CONNECT <port>` line is not
    /// complete yet.
    AwaitingConnect,
    /// The guest was asked to accept (a REQUEST is owed or sent).
    Requested,
    /// Data flows (each way until its sender shuts it down).
    Established,
}

/// Control packets the connection owes the guest, sent before any data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owed {
    /// OP_REQUEST (a host client's CONNECT).
    pub request: bool,
    /// OP_RESPONSE (the guest's request accepted).
    pub response: bool,
    /// OP_CREDIT_UPDATE.
    pub credit_update: bool,
    /// OP_RST: the connection is over once it is sent.
    pub rst: bool,
}

/// A connection.
#[derive(Debug)]
pub struct Connection {
    /// The host side.
    pub stream: UnixStream,
    /// Where it is.
    pub state: ConnectionState,
    /// The host side's port.
    pub local_port: u32,
    /// The guest side's port.
    pub peer_port: u32,
    /// What it owes the guest.
    pub owed: Owed,
    /// The stream has data (or its end) to read: no read has said it would block since it
    /// last said so.
    pub readable: bool,
    /// Queued for the receive queue's attention.
    pub queued: bool,
    /// The guest sends no more: the stream's write side closes once `pending` is out.
    pub guest_done_sending: bool,
    /// The host side sends no more (its stream read to the end; the guest was told).
    pub host_done_sending: bool,
    /// The stream's write side is closed (once: closing it wakes the socket's watchers).
    write_closed: bool,
    /// What the guest sent that the stream has not taken yet (at most [`BUF_ALLOC`]), after
    /// `own` bytes of the VMM's own (the `OK` line).
    pending: VecDeque<u8>,
    own: usize,
    /// Bytes taken out of the host side's buffer (written to the stream).
    fwd_cnt: u32,
    /// `fwd_cnt` as last told the guest.
    fwd_cnt_told: u32,
    /// Bytes sent to the guest.
    rx_cnt: u32,
    /// The guest's receive buffer.
    peer_buf_alloc: u32,
    /// Bytes the guest has taken out of it.
    peer_fwd_cnt: u32,
    /// A host client's `CONNECT` line so far.
    line: Vec<u8>,
    /// When the connection is given up: a host-initiated one not established by then, or one
    /// whose host side ended and that the guest has not closed by then.
    pub deadline: Option<Instant>,
}

/// Why a connection ends.
#[derive(Debug, PartialEq, Eq)]
pub enum Broken {
    /// The guest sent more than its credit.
    CreditExceeded,
    /// The host side failed.
    Host(io::ErrorKind),
    /// A host client's first line is not `CONNECT <port>`.
    BadConnectLine,
    /// A host client's `CONNECT` line, or the guest's answer to it, took too long.
    HandshakeTimeout,
    /// The guest did not close the connection in time after its host side ended.
    ShutdownTimeout,
    /// The guest sent a packet the connection's state does not allow.
    Protocol,
}

impl Connection {
    /// A connection over `stream` in `state` between the host's `local_port` and the guest's
    /// `peer_port`.
    pub fn new(
        stream: UnixStream,
        state: ConnectionState,
        local_port: u32,
        peer_port: u32,
    ) -> Self {
        Connection {
            stream,
            state,
            local_port,
            peer_port,
            owed: Owed::default(),
            readable: false,
            queued: false,
            guest_done_sending: false,
            host_done_sending: false,
            write_closed: false,
            pending: VecDeque::new(),
            own: 0,
            fwd_cnt: 0,
            fwd_cnt_told: 0,
            rx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            line: Vec::new(),
            deadline: None,
        }
    }

    /// Takes the guest's credit from a packet it sent.
    pub fn take_credit(&mut self, header: &PacketHeader) {
        self.peer_buf_alloc = header.buf_alloc;
        self.peer_fwd_cnt = header.fwd_cnt;
    }

    /// Bytes the guest can take now.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Counts `bytes` sent to the guest.
    pub fn sent(&mut self, bytes: u32) {
        self.rx_cnt = self.rx_cnt.wrapping_add(bytes);
    }

    /// A header from the host side of this connection to `guest_cid`, with its credit.
    pub fn header(&mut self, guest_cid: u64, op: u16, len: u32, flags: u32) -> PacketHeader {
        self.fwd_cnt_told = self.fwd_cnt;
        PacketHeader {
            src_cid: HOST_CID,
            dst_cid: guest_cid,
            src_port: self.local_port,
            dst_port: self.peer_port,
            len,
            kind: TYPE_STREAM,
            op,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
        }
    }

    /// Whether the guest should hear of freed space: half the buffer was taken since it last
    /// heard.
    pub fn credit_is_stale(&self) -> bool {
        self.fwd_cnt.wrapping_sub(self.fwd_cnt_told) >= BUF_ALLOC / 2
    }

    /// Whether it has anything for the guest: a control packet, or data it may send.
    pub fn has_work(&self) -> bool {
        let owed = self.owed;
        owed.request || owed.response || owed.credit_update || owed.rst || self.can_send_data()
    }

    /// Whether data from the stream may go to the guest now: established, the stream not read
    /// to its end nor known empty, and credit left.
    pub fn can_send_data(&self) -> bool {
        self.state == ConnectionState::Established
            && self.readable
            && !self.host_done_sending
            && self.peer_credit() > 0
    }

    /// Takes `data` the guest sent: writes what the stream takes and keeps the rest.
    pub fn receive(&mut self, data: &[u8]) -> Result<(), Broken> {
        let room = BUF_ALLOC as usize - (self.pending.len() - self.own);
        if data.len() > room {
            return Err(Broken::CreditExceeded);
        }
        let mut written = 0;
        if self.pending.is_empty() {
            written = match self.stream.write(data) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(Broken::Host(e.kind())),
            };
            self.forwarded(written);
        }
        self.pending.extend(&data[written..]);
        Ok(())
    }

    /// Queues `bytes` for the stream ahead of anything the guest sends (the `OK` line).
    pub fn say(&mut self, bytes: &[u8]) -> Result<(), Broken> {
        let guests = self.pending.split_off(self.own);
        self.pending.extend(bytes);
        self.pending.extend(guests);
        self.own += bytes.len();
        self.flush()
    }

    /// Counts `bytes` written to the stream, the VMM's own first.
    fn forwarded(&mut self, bytes: usize) {
        let own = bytes.min(self.own);
        self.own -= own;
        let guests = u32::try_from(bytes - own).unwrap_or(u32::MAX);
        self.fwd_cnt = self.fwd_cnt.wrapping_add(guests);
    }

    /// Writes what waits for the stream; closes its write side once the guest is done and
    /// nothing waits.
    pub fn flush(&mut self) -> Result<(), Broken> {
        while !self.pending.is_empty() {
            let (front, _) = self.pending.as_slices();
            match self.stream.write(front) {
                Ok(0) => return Err(Broken::Host(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    self.pending.drain(..n);
                    self.forwarded(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(Broken::Host(e.kind())),
            }
        }
        if self.guest_done_sending && !self.write_closed {
            self.write_closed = true;
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        Ok(())
    }

    /// Reads a host client's `CONNECT <port>\n` line; the port once it is complete.
    pub fn read_connect_line(&mut self) -> Result<Option<u32>, Broken> {
        use std::io::Read;
        let mut byte = [0u8; 1];
        loop {
            match self.stream.read(&mut byte) {
                Ok(0) => return Err(Broken::Host(io::ErrorKind::UnexpectedEof)),
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) => {
                    if self.line.len() == MAX_CONNECT_LINE {
                        return Err(Broken::BadConnectLine);
                    }
                    self.line.push(byte[0]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(Broken::Host(e.kind())),
            }
        }
        let line = std::str::from_utf8(&self.line).map_err(|_| Broken::BadConnectLine)?;
        let port = line
            .trim_end_matches('\r')
            .strip_prefix("CONNECT ")
            .and_then(|port| port.parse().ok())
            .ok_or(Broken::BadConnectLine)?;
        self.line = Vec::new();
        Ok(Some(port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vsock::packet::OP_RW;

    fn pair() -> (Connection, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        (
            Connection::new(ours, ConnectionState::Established, 1024, 2048),
            theirs,
        )
    }

    #[test]
    fn credit_is_what_the_guest_gave_less_what_is_in_flight() {
        let (mut conn, _peer) = pair();
        assert_eq!(conn.peer_credit(), 0);
        conn.take_credit(&PacketHeader {
            buf_alloc: 1000,
            fwd_cnt: 0,
            ..PacketHeader::default()
        });
        conn.sent(600);
        assert_eq!(conn.peer_credit(), 400);
        // Counters wrap: a guest far into its stream.
        conn.take_credit(&PacketHeader {
            buf_alloc: 1000,
            fwd_cnt: u32::MAX - 10,
            ..PacketHeader::default()
        });
        conn.rx_cnt = 89;
        assert_eq!(conn.peer_credit(), 900);
        // A guest that claims to have taken more than it got gives no more than its buffer.
        for rx_cnt in [0, 5, u32::MAX / 2] {
            conn.rx_cnt = rx_cnt;
            assert!(conn.peer_credit() <= 1000);
        }
        let header = conn.header(3, OP_RW, 5, 0);
        assert_eq!((header.src_port, header.dst_port), (1024, 2048));
        assert_eq!(header.buf_alloc, BUF_ALLOC);
    }

    #[test]
    fn data_the_socket_cannot_take_waits_and_more_than_the_credit_breaks_the_connection() {
        let (mut conn, peer) = pair();
        // Fill the socket until it would block, then more waits in the buffer.
        let chunk = vec![7u8; 64 << 10];
        let mut given = 0usize;
        while conn.pending.is_empty() {
            conn.receive(&chunk).unwrap();
            given += chunk.len();
            assert!(given < 64 << 20, "the socket never filled");
        }
        let waiting = conn.pending.len();
        assert!(waiting > 0);
        let room = BUF_ALLOC as usize - waiting;
        assert_eq!(
            conn.receive(&vec![1u8; room + 1]),
            Err(Broken::CreditExceeded)
        );
        conn.receive(&vec![1u8; room]).unwrap();
        // The peer reads: the buffer drains, and the guest's credit comes back.
        drop(peer);
        assert!(matches!(conn.flush(), Err(Broken::Host(_))));
    }

    #[test]
    fn a_host_client_names_its_port_in_one_line() {
        let (mut conn, mut peer) = pair();
        assert_eq!(conn.read_connect_line(), Ok(None));
        peer.write_all(b"CONNECT 52").unwrap();
        assert_eq!(conn.read_connect_line(), Ok(None));
        peer.write_all(b"\n").unwrap();
        assert_eq!(conn.read_connect_line(), Ok(Some(52)));
        let (mut conn, mut peer) = pair();
        peer.write_all(b"HELLO 52\n").unwrap();
        assert_eq!(conn.read_connect_line(), Err(Broken::BadConnectLine));
        let (mut conn, mut peer) = pair();
        peer.write_all(&[b'C'; 100]).unwrap();
        assert_eq!(conn.read_connect_line(), Err(Broken::BadConnectLine));
    }
}
