//! The virtio-vsock device with rings in real guest memory and real Unix sockets on the host
//! side: connections both ways, credit, refusals and hostile packets, the reset event.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use guest_mem::GuestMemory;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::packet::*;
use super::*;
use crate::virtio::request_queue::testing::{self, add_chain, used_len};
use crate::virtio::ActiveQueue;

const MIB: u64 = 1 << 20;
const GUEST_CID: u64 = 3;
/// Where the guest's packets to send are built.
const TX_BUFFERS: u64 = 4 * MIB;
/// Where the receive buffers are.
const RX_BUFFERS: u64 = 8 * MIB;
const RX_BUFFER_SIZE: u32 = 4096 + HEADER_SIZE as u32;

/// A guest driving a device: its three rings and where the next chains go.
struct VsockDriver<'a> {
    memory: &'a DeviceMemory,
    rx: MockSplitQueue<'a, GuestMemory>,
    tx: MockSplitQueue<'a, GuestMemory>,
    event: MockSplitQueue<'a, GuestMemory>,
    device: VsockDevice,
    tx_next: u16,
    rx_next: u16,
    rx_read: u16,
    _dir: Scratch,
}

/// A directory removed at the end.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl<'a> VsockDriver<'a> {
    fn new(memory: &'a DeviceMemory, name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("vsock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = VsockConfig {
            guest_cid: GUEST_CID as u32,
            uds_path: dir.join("v.sock"),
        };
        let mut device = VsockDevice::new(memory.clone(), &config).unwrap();
        let rx = MockSplitQueue::create(&**memory, GuestAddress(MIB), 64);
        let tx = MockSplitQueue::create(&**memory, GuestAddress(2 * MIB), 64);
        let event = MockSplitQueue::create(&**memory, GuestAddress(3 * MIB), 16);
        let queue = |index, mock: &MockSplitQueue<'_, GuestMemory>| ActiveQueue {
            index,
            queue: mock.create_queue().unwrap(),
            notifier: EventFd::new(EFD_NONBLOCK).unwrap(),
        };
        device
            .activate(Activation {
                memory: memory.clone(),
                acked_features: 0,
                queues: vec![queue(RX, &rx), queue(TX, &tx), queue(EVENT, &event)],
                interrupt: Arc::new(Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap())),
            })
            .unwrap();
        VsockDriver {
            memory,
            rx,
            tx,
            event,
            device,
            tx_next: 0,
            rx_next: 0,
            rx_read: 0,
            _dir: Scratch(dir),
        }
    }

    fn uds(&self) -> PathBuf {
        self.device.uds_path.clone()
    }

    /// Makes `count` receive buffers available.
    fn give_rx_buffers(&mut self, count: u16) {
        for _ in 0..count {
            let slot = self.rx_next;
            let addr = RX_BUFFERS + u64::from(slot) * 0x2000;
            add_chain(&self.rx, slot, slot, &[(addr, RX_BUFFER_SIZE, true)]);
            self.rx_next += 1;
        }
        self.device.process_queue(RX);
    }

    /// Sends a packet with `header` (its len set) and `payload`.
    fn send(&mut self, mut header: PacketHeader, payload: &[u8]) {
        header.len = payload.len() as u32;
        let slot = self.tx_next;
        let addr = TX_BUFFERS + u64::from(slot) * 0x20000;
        self.memory
            .write_slice(&header.to_bytes(), GuestAddress(addr))
            .unwrap();
        self.memory
            .write_slice(payload, GuestAddress(addr + 0x1000))
            .unwrap();
        let mut chain = vec![(addr, HEADER_SIZE as u32, false)];
        if !payload.is_empty() {
            chain.push((addr + 0x1000, payload.len() as u32, false));
        }
        add_chain(&self.tx, slot * 2, slot, &chain);
        self.tx_next += 1;
        self.device.process_queue(TX);
    }

    /// The packets the device put in receive buffers since the last look.
    fn received(&mut self) -> Vec<(PacketHeader, Vec<u8>)> {
        let mut packets = Vec::new();
        while self.rx_read < self.rx.used().idx().load() {
            let slot = self.rx_read;
            let len = used_len(&self.rx, slot) as usize;
            let addr = RX_BUFFERS + u64::from(slot) * 0x2000;
            let mut bytes = vec![0u8; len];
            self.memory
                .read_slice(&mut bytes, GuestAddress(addr))
                .unwrap();
            let header = PacketHeader::parse(bytes[..HEADER_SIZE].try_into().unwrap());
            packets.push((header, bytes[HEADER_SIZE..].to_vec()));
            self.rx_read += 1;
        }
        packets
    }

    /// The device has no connection left and sent the guest one reset since the last look,
    /// from host port `src` to guest port `dst`.
    fn assert_reset_alone(&mut self, src: u32, dst: u32) {
        assert!(self.device.conns.is_empty());
        let packets = self.received();
        assert_eq!(packets.len(), 1, "{packets:?}");
        let header = packets[0].0;
        assert_eq!(
            (header.op, header.src_port, header.dst_port),
            (OP_RST, src, dst)
        );
    }

    /// Lets the device take what its sockets have, as the event loop would.
    fn host_side(&mut self) {
        std::thread::sleep(Duration::from_millis(20));
        self.device.wake(0);
    }
}

/// A stream packet from the guest's `port` to the host's `host_port`, with room for
/// `buf_alloc` bytes.
fn from_guest(port: u32, host_port: u32, op: u16, buf_alloc: u32) -> PacketHeader {
    PacketHeader {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port: port,
        dst_port: host_port,
        len: 0,
        kind: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc,
        fwd_cnt: 0,
    }
}

#[test]
fn a_guest_connection_reaches_the_listener_at_the_port_s_socket_and_carries_data_both_ways() {
    let memory = testing::memory(16 * MIB);
    let mut guest = VsockDriver::new(&memory, "guest-initiated");
    assert_eq!(guest.device.device_type(), 19);
    let mut cid = [0u8; 8];
    guest.device.read_config(0, &mut cid);
    assert_eq!(u64::from_le_bytes(cid), GUEST_CID);
    let mut port_path = guest.uds().into_os_string();
    port_path.push("_52");
    let listener = UnixListener::bind(&port_path).unwrap();
    guest.give_rx_buffers(8);
    guest.send(from_guest(1234, 52, OP_REQUEST, 1 << 16), &[]);
    let answer = guest.received();
    assert_eq!(answer.len(), 1);
    let (response, _) = answer[0];
    assert_eq!(response.op, OP_RESPONSE);
    assert_eq!((response.src_port, response.dst_port), (52, 1234));
    assert_eq!((response.src_cid, response.dst_cid), (HOST_CID, GUEST_CID));
    let (mut host, _) = listener.accept().unwrap();
    host.set_read_timeout(Some(Duration::from_secs(1))).unwrap();

    guest.send(from_guest(1234, 52, OP_RW, 1 << 16), b"hello host");
    let mut got = [0u8; 10];
    host.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello host");

    host.write_all(b"hello guest").unwrap();
    guest.host_side();
    let packets = guest.received();
    assert_eq!(packets.len(), 1, "{packets:?}");
    assert_eq!(packets[0].0.op, OP_RW);
    assert_eq!(packets[0].1, b"hello guest");

    // The host sends no more: the guest hears SHUTDOWN (send), may still answer, and its
    // RST ends the connection.
    host.shutdown(std::net::Shutdown::Write).unwrap();
    guest.host_side();
    let packets = guest.received();
    let (shutdown, _) = packets.last().unwrap();
    assert_eq!(
        (shutdown.op, shutdown.flags),
        (OP_SHUTDOWN, SHUTDOWN_SEND),
        "{packets:?}"
    );
    guest.send(from_guest(1234, 52, OP_RW, 1 << 16), b"late");
    let mut late = [0u8; 4];
    host.read_exact(&mut late).unwrap();
    assert_eq!(&late, b"late");
    guest.send(from_guest(1234, 52, OP_RST, 1 << 16), &[]);
    assert!(guest.device.conns.is_empty());
    let counters = guest.device.counters();
    assert_eq!(counters.tx_bytes.load(Ordering::Relaxed), 14);
    assert_eq!(counters.rx_bytes.load(Ordering::Relaxed), 11);
}

#[test]
fn a_host_client_connects_with_a_connect_line_and_hears_ok_once_the_guest_accepts() {
    let memory = testing::memory(16 * MIB);
    let mut guest = VsockDriver::new(&memory, "host-initiated");
    guest.give_rx_buffers(8);
    let mut client = UnixStream::connect(guest.uds()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    client.write_all(b"CONNECT 80\n").unwrap();
    guest.host_side();
    let packets = guest.received();
    assert_eq!(packets.len(), 1, "{packets:?}");
    let request = packets[0].0;
    assert_eq!(request.op, OP_REQUEST);
    assert_eq!(request.dst_port, 80);
    assert!(request.src_port >= FIRST_LOCAL_PORT);
    guest.send(from_guest(80, request.src_port, OP_RESPONSE, 1 << 16), &[]);
    let mut line = [0u8; 64];
    let n = client.read(&mut line).unwrap();
    assert_eq!(
        std::str::from_utf8(&line[..n]).unwrap(),
        format!("OK {}\n", request.src_port)
    );
    client.write_all(b"ping").unwrap();
    guest.host_side();
    let packets = guest.received();
    assert_eq!(packets[0].1, b"ping");
    guest.send(from_guest(80, request.src_port, OP_RW, 1 << 16), b"pong");
    let mut pong = [0u8; 4];
    client.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"pong");
    // A second client with a bad line is dropped.
    let mut bad = UnixStream::connect(guest.uds()).unwrap();
    bad.write_all(b"GET / HTTP/1.0\n").unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    guest.host_side();
    assert_eq!(bad.read(&mut line).unwrap(), 0, "closed");
    assert_eq!(guest.device.conns.len(), 1);
}

#[test]
fn a_host_client_that_never_finishes_its_handshake_is_dropped() {
    let memory = testing::memory(16 * MIB);
    let mut guest = VsockDriver::new(&memory, "late-handshakes");
    guest.give_rx_buffers(8);
    // One says nothing; one asks for a port whose guest never answers.
    let mut silent = UnixStream::connect(guest.uds()).unwrap();
    let mut unanswered = UnixStream::connect(guest.uds()).unwrap();
    unanswered.write_all(b"CONNECT 81\n").unwrap();
    guest.host_side();
    let request = guest.received()[0].0;
    assert_eq!((request.op, request.dst_port), (OP_REQUEST, 81));
    assert_eq!(guest.device.conns.len(), 2);
    std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_millis(100));
    guest.host_side();
    // The guest is told the request is off, and both clients see their end.
    let packets = guest.received();
    assert_eq!(packets.len(), 1, "{packets:?}");
    assert_eq!(
        (packets[0].0.op, packets[0].0.src_port),
        (OP_RST, request.src_port)
    );
    for client in [&mut silent, &mut unanswered] {
        client
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        assert_eq!(client.read(&mut [0u8; 8]).unwrap(), 0, "closed");
    }
    assert!(guest.device.conns.is_empty());
    assert_eq!(
        guest.device.counters.conns_killed.load(Ordering::Relaxed),
        2
    );
}

/// Whether `client`'s connection was closed by the device (its read ends at once).
fn closed(client: &mut UnixStream) -> bool {
    client.set_nonblocking(true).unwrap();
    matches!(client.read(&mut [0u8; 8]), Ok(0))
}

#[test]
fn a_device_without_a_driver_drops_every_client_in_time_and_at_once_when_it_leaves() {
    let memory = testing::memory(16 * MIB);
    let dir = Scratch(std::env::temp_dir().join(format!("vsock-no-driver-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let config = VsockConfig {
        guest_cid: GUEST_CID as u32,
        uds_path: dir.0.join("v.sock"),
    };
    // The guest never activates the device.
    let mut device = VsockDevice::new(memory.clone(), &config).unwrap();
    let mut clients: Vec<UnixStream> = (0..50)
        .map(|_| {
            let mut client = UnixStream::connect(&config.uds_path).unwrap();
            client.write_all(b"CONNECT 52\n").unwrap();
            client
        })
        .collect();
    let mut leaving = UnixStream::connect(&config.uds_path).unwrap();
    leaving.write_all(b"CONNECT 53\n").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    device.wake(0);
    assert_eq!(device.conns.len(), 51);
    // A client that closes is released at once, not at its deadline.
    drop(leaving);
    std::thread::sleep(Duration::from_millis(20));
    device.wake(0);
    assert_eq!(device.conns.len(), 50);
    // The rest are closed at their deadline, though nobody is there to hear the reset.
    std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_millis(100));
    device.wake(0);
    assert!(device.conns.is_empty());
    assert!(clients.iter_mut().all(closed));
    // Their places are free: a new client is taken.
    let _again = UnixStream::connect(&config.uds_path).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    device.wake(0);
    assert_eq!(device.conns.len(), 1);
}

#[test]
fn a_client_that_leaves_before_the_guest_answers_is_released_and_the_guest_reset() {
    let memory = testing::memory(16 * MIB);
    let mut guest = VsockDriver::new(&memory, "leaves");
    guest.give_rx_buffers(8);
    let mut client = UnixStream::connect(guest.uds()).unwrap();
    client.write_all(b"CONNECT 81\n").unwrap();
    guest.host_side();
    let request = guest.received()[0].0;
    assert_eq!(request.op, OP_REQUEST);
    drop(client);
    guest.host_side();
    guest.assert_reset_alone(request.src_port, 81);
}

#[test]
fn a_guest_that_does_not_close_after_the_host_side_ended_is_reset_in_time() {
    let memory = testing::memory(16 * MIB);
    let mut guest = VsockDriver::new(&memory, "shutdown-timeout");
    let mut port_path = guest.uds().into_os_string();
    port_path.push("_52");
    let listener = UnixListener::bind(&port_path).unwrap();
    guest.give_rx_buffers(8);
    guest.send(from_guest(1234, 52, OP_REQUEST, 1 << 16), &[]);
    assert_eq!(guest.received()[0].0.op, OP_RESPONSE);
    let (host, _) = listener.accept().unwrap();
    drop(host);
    guest.host_side();
    let packets = guest.received();
    assert_eq!(packets.last().unwrap().0.op, OP_SHUTDOWN, "{packets:?}");
    assert_eq!(guest.device.conns.len(), 1);
    // The guest says nothing.
    std::thread::sleep(SHUTDOWN_TIMEOUT + Duration::from_millis(100));
    guest.host_side();
    guest.assert_reset_alone(52, 1234);
}

#[test]
fn the_device_sends_no_more_than_the_guest_s_credit() {
    let memory = testing::memory(16 * MIB);
    let mut guest = VsockDriver::new(&memory, "credit");
    let mut port_path = guest.uds().into_os_string();
    port_path.push("_7");
    let listener = UnixListener::bind(&port_path).unwrap();
    guest.give_rx_buffers(16);
    // The guest has room for 100 bytes.
    guest.send(from_guest(9, 7, OP_REQUEST, 100), &[]);
    let (mut host, _) = listener.accept().unwrap();
    host.write_all(&[1u8; 1000]).unwrap();
    guest.host_side();
    let data: usize = guest
        .received()
        .iter()
        .filter(|(h, _)| h.op == OP_RW)
        .map(|(_, payload)| payload.len())
        .sum();
    assert_eq!(data, 100);
    // It took them: 100 more.
    let mut update = from_guest(9, 7, OP_CREDIT_UPDATE, 100);
    update.fwd_cnt = 100;
    guest.send(update, &[]);
    let more: usize = guest
        .received()
        .iter()
        .map(|(_, payload)| payload.len())
        .sum();
    assert_eq!(more, 100);
    // A credit request is answered with the host side's credit.
    guest.send(from_guest(9, 7, OP_CREDIT_REQUEST, 100), &[]);
    let packets = guest.received();
    assert!(
        packets
            .iter()
            .any(|(h, _)| h.op == OP_CREDIT_UPDATE && h.buf_alloc == connection::BUF_ALLOC),
        "{packets:?}"
    );
}

#[test]
fn hostile_packets_are_refused_dropped_or_end_their_connection_and_never_the_device() {
    let memory = testing::memory(16 * MIB);
    let mut guest = VsockDriver::new(&memory, "hostile");
    guest.give_rx_buffers(32);
    // No listener for the port: refused.
    guest.send(from_guest(1, 99, OP_REQUEST, 1 << 16), &[]);
    // Data for no connection: refused.
    guest.send(from_guest(2, 99, OP_RW, 1 << 16), b"x");
    let packets = guest.received();
    assert_eq!(packets.len(), 2);
    assert!(packets
        .iter()
        .all(|(h, _)| h.op == OP_RST && h.dst_cid == GUEST_CID && h.src_cid == HOST_CID));
    // Another CID's packet, and a packet for another host: dropped silently.
    let mut spoofed = from_guest(3, 99, OP_REQUEST, 1 << 16);
    spoofed.src_cid = 42;
    guest.send(spoofed, &[]);
    let mut elsewhere = from_guest(3, 99, OP_REQUEST, 1 << 16);
    elsewhere.dst_cid = 7;
    guest.send(elsewhere, &[]);
    // A header that claims more payload than the chain has.
    let slot = guest.tx_next;
    let mut lying = from_guest(4, 99, OP_RW, 0);
    lying.len = 1 << 20;
    memory
        .write_slice(&lying.to_bytes(), GuestAddress(TX_BUFFERS))
        .unwrap();
    add_chain(
        &guest.tx,
        slot * 2,
        slot,
        &[(TX_BUFFERS, HEADER_SIZE as u32, false)],
    );
    guest.tx_next += 1;
    guest.device.process_queue(TX);
    assert!(guest.received().is_empty());
    assert_eq!(guest.device.counters().malformed.load(Ordering::Relaxed), 3);

    // More than the credit: the connection ends with an RST.
    let mut port_path = guest.uds().into_os_string();
    port_path.push("_5");
    let listener = UnixListener::bind(&port_path).unwrap();
    guest.send(from_guest(6, 5, OP_REQUEST, 1 << 16), &[]);
    let (host, _) = listener.accept().unwrap();
    // Nobody reads `host`: the socket fills, then the host side's buffer.
    let chunk = vec![0u8; MAX_PAYLOAD];
    for _ in 0..64 {
        guest.send(from_guest(6, 5, OP_RW, 1 << 16), &chunk);
        if guest
            .device
            .conns
            .get(&FIRST_CONNECTION)
            .is_none_or(|c| c.owed.rst)
        {
            break;
        }
    }
    let packets = guest.received();
    assert!(
        packets
            .iter()
            .any(|(h, _)| h.op == OP_RST && h.dst_port == 6),
        "{:?}",
        packets.iter().map(|(h, _)| h.op).collect::<Vec<_>>()
    );
    assert!(guest.device.conns.is_empty());
    drop(host);
}

#[test]
fn a_restored_device_tells_the_guest_its_connections_are_gone() {
    let memory = testing::memory(16 * MIB);
    let mut guest = VsockDriver::new(&memory, "reset");
    assert_eq!(guest.device.save_state(), DeviceState::Vsock);
    add_chain(&guest.event, 0, 0, &[(RX_BUFFERS, 8, true)]);
    let queue = |index, mock: &MockSplitQueue<'_, GuestMemory>| ActiveQueue {
        index,
        queue: mock.create_queue().unwrap(),
        notifier: EventFd::new(EFD_NONBLOCK).unwrap(),
    };
    let activation = Activation {
        memory: memory.clone(),
        acked_features: 0,
        queues: vec![
            queue(RX, &guest.rx),
            queue(TX, &guest.tx),
            queue(EVENT, &guest.event),
        ],
        interrupt: Arc::new(Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap())),
    };
    memory
        .write_slice(&[0xff; 4], GuestAddress(RX_BUFFERS))
        .unwrap();
    guest
        .device
        .restore_state(&DeviceState::Vsock, Some(activation))
        .unwrap();
    // Nothing until the event loop runs the device.
    assert_eq!(guest.event.used().idx().load(), 0);
    guest.host_side();
    assert_eq!(guest.event.used().idx().load(), 1);
    let mut event = [0u8; 4];
    memory
        .read_slice(&mut event, GuestAddress(RX_BUFFERS))
        .unwrap();
    assert_eq!(u32::from_le_bytes(event), TRANSPORT_RESET);
    assert!(guest
        .device
        .restore_state(&DeviceState::Plain, None)
        .is_err());
}

#[test]
fn the_socket_is_removed_at_the_end_and_a_taken_path_is_refused() {
    let memory = testing::memory(16 * MIB);
    let guest = VsockDriver::new(&memory, "socket");
    let path = guest.uds();
    assert!(path.exists());
    let again = VsockDevice::new(
        memory.clone(),
        &VsockConfig {
            guest_cid: 3,
            uds_path: path.clone(),
        },
    );
    assert!(matches!(again, Err(VsockError::Listen { .. })));
    drop(guest);
    assert!(!path.exists());
}

/// Makes `buffers` the `count`-th chain (counting from 0, wrapping the ring of `size`) of
/// `mock`, its descriptors from `first`.
fn post(
    mock: &MockSplitQueue<'_, GuestMemory>,
    size: u16,
    first: u16,
    count: u16,
    buffers: &[(u64, u32, bool)],
) {
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    for (i, &(addr, len, writable)) in buffers.iter().enumerate() {
        let at = (first + i as u16) % size;
        let last = i + 1 == buffers.len();
        let flags = if last { 0 } else { VRING_DESC_F_NEXT }
            | if writable { VRING_DESC_F_WRITE } else { 0 };
        let desc = Descriptor::new(addr, len, flags as u16, (at + 1) % size);
        mock.desc_table()
            .store(at, RawDescriptor::from(desc))
            .unwrap();
    }
    mock.avail()
        .ring()
        .ref_at(usize::from(count % size))
        .unwrap()
        .store(first % size);
    mock.avail().idx().store(count.wrapping_add(1));
}

#[test]
fn a_guest_sends_megabytes_as_its_credit_allows_and_hears_the_answer() {
    // Guest's rings: 64 entries.
    const SIZE: u16 = 64;
    let memory = testing::memory(32 * MIB);
    let mut guest = VsockDriver::new(&memory, "bulk");
    let (rx, tx) = (&guest.rx, &guest.tx);
    let device = &mut guest.device;
    // The host side: reads everything, answers with the count, closes.
    let mut port_path = device.uds_path.clone().into_os_string();
    port_path.push("_9");
    let listener = UnixListener::bind(&port_path).unwrap();
    let host = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).unwrap();
        write!(stream, "got {}", all.len()).unwrap();
    });
    // Four times the host side's buffer; few enough chains that the test rings (whose avail
    // and used rings overlap past 32 entries in virtio-queue's mock) do not wrap.
    const TOTAL: usize = 1 << 20;
    const CHUNK: usize = 64 << 10;
    let (mut tx_count, mut rx_posted, mut rx_read) = (0u16, 0u16, 0u16);
    let (mut sent, mut peer_alloc, mut peer_fwd) = (0usize, 0u32, 0u32);
    let mut answer = Vec::new();
    let mut shut = false;
    let send =
        |device: &mut VsockDevice, header: PacketHeader, payload: &[u8], tx_count: &mut u16| {
            let slot = u64::from(*tx_count % 8);
            let addr = 8 * MIB + slot * 0x20000;
            let mut header = header;
            header.len = payload.len() as u32;
            memory
                .write_slice(&header.to_bytes(), GuestAddress(addr))
                .unwrap();
            memory
                .write_slice(payload, GuestAddress(addr + 0x1000))
                .unwrap();
            let mut chain = vec![(addr, HEADER_SIZE as u32, false)];
            if !payload.is_empty() {
                chain.push((addr + 0x1000, payload.len() as u32, false));
            }
            post(tx, SIZE, (*tx_count % (SIZE / 2)) * 2, *tx_count, &chain);
            *tx_count += 1;
            device.process_queue(TX);
        };
    let chunk = vec![0x5au8; CHUNK];
    send(
        &mut *device,
        from_guest(1000, 9, OP_REQUEST, 1 << 18),
        &[],
        &mut tx_count,
    );
    let mut done = false;
    for _ in 0..10_000 {
        // Keep 4 receive buffers available.
        while rx_posted.wrapping_sub(rx_read) < 4 {
            let slot = u64::from(rx_posted % SIZE);
            post(
                rx,
                SIZE,
                (rx_posted % (SIZE / 2)) * 2,
                rx_posted,
                &[(RX_BUFFERS + slot * 0x2000, RX_BUFFER_SIZE, true)],
            );
            rx_posted += 1;
            device.process_queue(RX);
        }
        // Read what the device sent.
        while rx_read != rx.used().idx().load() {
            let slot = rx_read % SIZE;
            let len = used_len(rx, slot) as usize;
            assert!(len >= HEADER_SIZE, "a used buffer of {len} bytes");
            let mut bytes = vec![0u8; len];
            memory
                .read_slice(
                    &mut bytes,
                    GuestAddress(RX_BUFFERS + u64::from(slot) * 0x2000),
                )
                .unwrap();
            let header = PacketHeader::parse(bytes[..HEADER_SIZE].try_into().unwrap());
            peer_alloc = header.buf_alloc;
            peer_fwd = header.fwd_cnt;
            match header.op {
                OP_RW => answer.extend_from_slice(&bytes[HEADER_SIZE..]),
                OP_SHUTDOWN => done = true,
                OP_RST => panic!("reset: {header:?}"),
                _ => {}
            }
            rx_read += 1;
        }
        if done {
            break;
        }
        let in_flight = (sent as u32).wrapping_sub(peer_fwd);
        if sent < TOTAL && peer_alloc.saturating_sub(in_flight) as usize >= CHUNK {
            send(
                &mut *device,
                from_guest(1000, 9, OP_RW, 1 << 18),
                &chunk,
                &mut tx_count,
            );
            sent += CHUNK;
            continue;
        }
        if sent == TOTAL && !shut {
            let mut shutdown = from_guest(1000, 9, OP_SHUTDOWN, 1 << 18);
            shutdown.flags = SHUTDOWN_SEND;
            send(&mut *device, shutdown, &[], &mut tx_count);
            shut = true;
        }
        std::thread::sleep(Duration::from_millis(1));
        device.wake(0);
    }
    assert!(
        done,
        "no end: sent {sent}, answer {:?}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(String::from_utf8(answer).unwrap(), format!("got {TOTAL}"));
    host.join().unwrap();
}
