//! The virtio-net device against a real tap in a network namespace of the test's own (the
//! test thread's: nothing leaves it), with rings in real guest memory; hostile chains
//! included.

use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::rate_limiter::TokenBucketConfig;
use crate::virtio::request_queue::testing::{self, add_chain, used_len, wait_readable};
use crate::virtio::ActiveQueue;

const MIB: u64 = 1 << 20;
const RX_RING: u64 = MIB;
const TX_RING: u64 = 2 * MIB;
const BUFFERS: u64 = 4 * MIB;
const TAP: &str = "tap0";
const TAP_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GUEST_MAC: [u8; 6] = [6, 0, 0, 0, 0, 2];
const HOST_IP: [u8; 4] = [10, 0, 0, 1];
const GUEST_IP: [u8; 4] = [10, 0, 0, 2];

/// Runs `ip` with `args` in the calling thread's network namespace.
fn ip(args: &str) {
    let status = Command::new("ip")
        .args(args.split(' '))
        .status()
        .expect("ip");
    assert!(status.success(), "ip {args}");
}

/// Moves the calling test thread into a network namespace of its own with a tap `tap0`
/// (10.0.0.1/24, IPv4 only, up, the guest's address known); false (and SKIP) where it may not.
fn private_tap() -> bool {
    // SAFETY: unshare(CLONE_NEWNET) moves only the calling thread into a new namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!(
            "SKIP: no network namespace of the test's own (needs CAP_SYS_ADMIN): {}",
            io::Error::last_os_error()
        );
        return false;
    }
    ip(&format!("tuntap add dev {TAP} mode tap"));
    // No IPv6 on the tap: the kernel's router solicitations and MLD reports, sent soon after
    // the device opens it, would otherwise race the test's own frames to the guest.
    let ipv6 = format!("/proc/sys/net/ipv6/conf/{TAP}/disable_ipv6");
    if std::path::Path::new(&ipv6).exists() {
        std::fs::write(&ipv6, "1").expect("disable IPv6 on the tap");
    }
    ip(&format!("link set {TAP} address 02:00:00:00:00:01 up"));
    ip(&format!("addr add 10.0.0.1/24 dev {TAP}"));
    ip(&format!(
        "neigh add 10.0.0.2 lladdr 06:00:00:00:00:02 dev {TAP}"
    ));
    true
}

/// A device on `tap0` with `config`'s limiters, activated with the rings of `rx` and `tx` and
/// the features `features`; returns it and its interrupt's eventfd.
fn activated(
    memory: &DeviceMemory,
    rx: &MockSplitQueue<'_, GuestMemory>,
    tx: &MockSplitQueue<'_, GuestMemory>,
    features: u64,
    config: NetConfig,
) -> (NetDevice, EventFd) {
    let mut device = NetDevice::new(memory.clone(), &config, None).unwrap();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let queue = |index, mock: &MockSplitQueue<'_, GuestMemory>| ActiveQueue {
        index,
        queue: mock.create_queue().unwrap(),
        notifier: EventFd::new(EFD_NONBLOCK).unwrap(),
    };
    device
        .activate(Activation {
            memory: memory.clone(),
            acked_features: features,
            queues: vec![queue(RX, rx), queue(TX, tx)],
            interrupt: Arc::new(Interrupt::new(irq.try_clone().unwrap())),
        })
        .unwrap();
    wait_for_carrier();
    (device, irq)
}

/// Waits until the kernel has the tap up now that the device opened it (its carrier is
/// taken up later, by the kernel's link watch, and until then frames to it are dropped).
fn wait_for_carrier() {
    for _ in 0..500 {
        let link = Command::new("ip")
            .args(["-o", "link", "show", "dev", TAP])
            .output()
            .expect("ip");
        if String::from_utf8_lossy(&link.stdout).contains("state UP") {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{TAP} never came up");
}

fn config() -> NetConfig {
    NetConfig {
        id: "eth0".into(),
        host_dev_name: TAP.into(),
        guest_mac: Some(MacAddr(GUEST_MAC)),
        mtu: None,
        rx_rate_limiter: RateLimiterConfig::default(),
        tx_rate_limiter: RateLimiterConfig::default(),
    }
}

/// The IPv4 header checksum of `header`.
fn ip_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], pair[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A virtio-net header (no offload) and an Ethernet frame with a UDP datagram from the guest
/// (10.0.0.2:4000) to the host (10.0.0.1:`port`).
fn udp_frame(port: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8; HEADER_SIZE];
    frame.extend_from_slice(&TAP_MAC);
    frame.extend_from_slice(&GUEST_MAC);
    frame.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    let mut ipv4 = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ipv4[2..4].copy_from_slice(&total.to_be_bytes());
    ipv4.extend_from_slice(&GUEST_IP);
    ipv4.extend_from_slice(&HOST_IP);
    let checksum = ip_checksum(&ipv4);
    ipv4[10..12].copy_from_slice(&checksum.to_be_bytes());
    frame.extend_from_slice(&ipv4);
    frame.extend_from_slice(&4000u16.to_be_bytes());
    frame.extend_from_slice(&port.to_be_bytes());
    frame.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    // No UDP checksum (IPv4 allows it).
    frame.extend_from_slice(&[0, 0]);
    frame.extend_from_slice(payload);
    frame
}

/// A host socket on 10.0.0.1 that waits at most a second for a datagram.
fn host_socket() -> UdpSocket {
    let socket = UdpSocket::bind("10.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    socket
}

/// Waits until the tap has a frame for the device (at most a second).
fn wait_for_frame(device: &NetDevice) {
    wait_readable(device.tap.as_raw_fd());
}

#[test]
fn a_frame_the_guest_sends_reaches_a_host_socket() {
    if !private_tap() {
        return;
    }
    let memory = testing::memory(16 * MIB);
    let rx = MockSplitQueue::create(&*memory, GuestAddress(RX_RING), 16);
    let tx = MockSplitQueue::create(&*memory, GuestAddress(TX_RING), 16);
    let (mut device, irq) = activated(&memory, &rx, &tx, 0, config());
    assert_eq!(device.device_type(), 1);
    let mut mac = [0u8; 6];
    device.read_config(0, &mut mac);
    assert_eq!(mac, GUEST_MAC);
    let socket = host_socket();
    let port = socket.local_addr().unwrap().port();
    let frame = udp_frame(port, b"hello from the guest");
    // The header in one buffer, the frame in another, as Linux sends.
    memory
        .write_slice(&frame[..HEADER_SIZE], GuestAddress(BUFFERS))
        .unwrap();
    memory
        .write_slice(&frame[HEADER_SIZE..], GuestAddress(BUFFERS + 0x1000))
        .unwrap();
    add_chain(
        &tx,
        0,
        0,
        &[
            (BUFFERS, HEADER_SIZE as u32, false),
            (BUFFERS + 0x1000, (frame.len() - HEADER_SIZE) as u32, false),
        ],
    );
    device.process_queue(TX);
    assert_eq!(tx.used().idx().load(), 1);
    assert_eq!(irq.read().unwrap(), 1);
    let mut got = [0u8; 64];
    let (len, from) = socket.recv_from(&mut got).unwrap();
    assert_eq!(&got[..len], b"hello from the guest");
    assert_eq!(from.to_string(), "10.0.0.2:4000");
    let counters = &device.counters;
    assert_eq!(counters.tx_packets.load(Ordering::Relaxed), 1);
    assert_eq!(
        counters.tx_bytes.load(Ordering::Relaxed),
        (frame.len() - HEADER_SIZE) as u64
    );
}

#[test]
fn a_datagram_for_the_guest_lands_in_its_receive_buffer() {
    if !private_tap() {
        return;
    }
    let memory = testing::memory(16 * MIB);
    let rx = MockSplitQueue::create(&*memory, GuestAddress(RX_RING), 16);
    let tx = MockSplitQueue::create(&*memory, GuestAddress(TX_RING), 16);
    let (mut device, irq) = activated(&memory, &rx, &tx, 0, config());
    // Garbage where num_buffers goes: the device must write 1 there.
    memory
        .write_slice(&[0xff; 16], GuestAddress(BUFFERS))
        .unwrap();
    let socket = host_socket();
    socket
        .send_to(b"hello from the host", "10.0.0.2:5000")
        .unwrap();
    wait_for_frame(&device);
    // No buffer yet: the frame waits in the tap, and the edge is gone.
    device.wake(WAKE_TAP);
    assert_eq!(rx.used().idx().load(), 0);
    add_chain(&rx, 0, 0, &[(BUFFERS, 1526, true)]);
    device.process_queue(RX);
    assert_eq!(rx.used().idx().load(), 1);
    assert_eq!(irq.read().unwrap(), 1);
    let len = used_len(&rx, 0) as usize;
    let expected = HEADER_SIZE + 14 + 20 + 8 + b"hello from the host".len();
    assert_eq!(len, expected);
    let mut frame = vec![0u8; len];
    memory
        .read_slice(&mut frame, GuestAddress(BUFFERS))
        .unwrap();
    assert_eq!(&frame[NUM_BUFFERS_AT..HEADER_SIZE], &[1, 0]);
    let ethernet = &frame[HEADER_SIZE..];
    assert_eq!(&ethernet[..6], &GUEST_MAC);
    assert_eq!(&ethernet[6..12], &TAP_MAC);
    assert_eq!(&ethernet[12..14], &[0x08, 0x00]);
    assert_eq!(&ethernet[14 + 16..14 + 20], &GUEST_IP);
    assert!(ethernet.ends_with(b"hello from the host"));
    assert_eq!(device.counters.rx_packets.load(Ordering::Relaxed), 1);
}

#[test]
fn hostile_frames_are_returned_unsent_and_counted() {
    if !private_tap() {
        return;
    }
    let memory = testing::memory(16 * MIB);
    let rx = MockSplitQueue::create(&*memory, GuestAddress(RX_RING), 16);
    let tx = MockSplitQueue::create(&*memory, GuestAddress(TX_RING), 128);
    let (mut device, _irq) = activated(&memory, &rx, &tx, 0, config());
    let socket = host_socket();
    let port = socket.local_addr().unwrap().port();
    let frame = udp_frame(port, b"good");
    memory.write_slice(&frame, GuestAddress(BUFFERS)).unwrap();
    let whole = (BUFFERS, frame.len() as u32, false);
    let hostile: Vec<Vec<(u64, u32, bool)>> = vec![
        // A device-writable buffer in a frame to send.
        vec![whole, (BUFFERS + 0x1000, 64, true)],
        // Shorter than the header.
        vec![(BUFFERS, 11, false)],
        // Outside guest memory.
        vec![(BUFFERS, HEADER_SIZE as u32, false), (64 * MIB, 100, false)],
        // Longer than 64 KiB.
        vec![(BUFFERS, MAX_FRAME as u32 + 1, false)],
        // In more than 64 pieces.
        (0..65).map(|i| (BUFFERS + i * 16, 16, false)).collect(),
    ];
    let mut next = 0u16;
    for (avail, chain) in hostile.iter().enumerate() {
        add_chain(&tx, next, avail as u16, chain);
        next += chain.len() as u16;
    }
    // Then a good one: the device goes on after the hostile ones.
    add_chain(&tx, next, hostile.len() as u16, &[whole]);
    device.process_queue(TX);
    assert_eq!(tx.used().idx().load(), hostile.len() as u16 + 1);
    let counters = &device.counters;
    assert_eq!(
        counters.tx_malformed_frames.load(Ordering::Relaxed),
        hostile.len() as u64
    );
    assert_eq!(counters.tx_packets.load(Ordering::Relaxed), 1);
    let mut got = [0u8; 16];
    let (len, _) = socket.recv_from(&mut got).unwrap();
    assert_eq!(&got[..len], b"good");
    socket.set_nonblocking(true).unwrap();
    assert!(socket.recv_from(&mut got).is_err(), "only one datagram");
}

#[test]
fn a_header_the_host_kernel_refuses_fails_the_frame_not_the_device() {
    if !private_tap() {
        return;
    }
    let memory = testing::memory(16 * MIB);
    let rx = MockSplitQueue::create(&*memory, GuestAddress(RX_RING), 16);
    let tx = MockSplitQueue::create(&*memory, GuestAddress(TX_RING), 16);
    let (mut device, _irq) = activated(&memory, &rx, &tx, 0, config());
    let mut frame = udp_frame(9, b"x");
    // NEEDS_CSUM with a checksum offset far past the frame.
    frame[0] = 1;
    frame[6..8].copy_from_slice(&0xfff0u16.to_le_bytes());
    frame[8..10].copy_from_slice(&0xfff0u16.to_le_bytes());
    memory.write_slice(&frame, GuestAddress(BUFFERS)).unwrap();
    add_chain(&tx, 0, 0, &[(BUFFERS, frame.len() as u32, false)]);
    device.process_queue(TX);
    assert_eq!(tx.used().idx().load(), 1);
    assert_eq!(device.counters.tx_fails.load(Ordering::Relaxed), 1);
    assert_eq!(device.counters.tx_packets.load(Ordering::Relaxed), 0);
}

#[test]
fn a_receive_buffer_the_device_cannot_write_is_returned_empty() {
    if !private_tap() {
        return;
    }
    let memory = testing::memory(16 * MIB);
    let rx = MockSplitQueue::create(&*memory, GuestAddress(RX_RING), 16);
    let tx = MockSplitQueue::create(&*memory, GuestAddress(TX_RING), 16);
    let (mut device, _irq) = activated(&memory, &rx, &tx, 0, config());
    add_chain(&rx, 0, 0, &[(BUFFERS, 1526, false)]);
    add_chain(&rx, 1, 1, &[(BUFFERS, 8, true)]);
    add_chain(&rx, 2, 2, &[(64 * MIB, 1526, true)]);
    add_chain(&rx, 3, 3, &[(BUFFERS, 1526, true)]);
    host_socket()
        .send_to(b"for the good buffer", "10.0.0.2:5000")
        .unwrap();
    wait_for_frame(&device);
    device.wake(WAKE_TAP);
    assert_eq!(rx.used().idx().load(), 4);
    for slot in 0..3 {
        assert_eq!(used_len(&rx, slot), 0, "slot {slot}");
    }
    assert!(used_len(&rx, 3) > 40);
    assert_eq!(
        device.counters.rx_malformed_buffers.load(Ordering::Relaxed),
        3
    );
}

#[test]
fn the_transmit_rate_limiter_holds_frames_in_the_queue_until_its_timer() {
    if !private_tap() {
        return;
    }
    let memory = testing::memory(16 * MIB);
    let rx = MockSplitQueue::create(&*memory, GuestAddress(RX_RING), 16);
    let tx = MockSplitQueue::create(&*memory, GuestAddress(TX_RING), 16);
    let limited = NetConfig {
        tx_rate_limiter: RateLimiterConfig {
            bandwidth: None,
            ops: Some(TokenBucketConfig {
                size: 1,
                one_time_burst: None,
                refill_time: 100,
            }),
        },
        ..config()
    };
    let (mut device, _irq) = activated(&memory, &rx, &tx, 0, limited);
    let socket = host_socket();
    let port = socket.local_addr().unwrap().port();
    let frame = udp_frame(port, b"limited");
    memory.write_slice(&frame, GuestAddress(BUFFERS)).unwrap();
    for avail in 0..3 {
        add_chain(&tx, avail, avail, &[(BUFFERS, frame.len() as u32, false)]);
    }
    let started = Instant::now();
    device.process_queue(TX);
    assert_eq!(tx.used().idx().load(), 1, "one frame paid for");
    assert_eq!(
        device
            .counters
            .tx_rate_limiter_throttled
            .load(Ordering::Relaxed),
        1
    );
    // A notification while throttled sends nothing.
    device.process_queue(TX);
    assert_eq!(tx.used().idx().load(), 1);
    wait_readable(device.wake_sources()[WAKE_TX_TIMER].fd);
    device.wake(WAKE_TX_TIMER);
    assert_eq!(tx.used().idx().load(), 2);
    assert!(started.elapsed() >= Duration::from_millis(80));
    // Lifted after the start: the last one goes at once.
    device.set_rate_limiters(None, Some(RateLimiterConfig::default()));
    assert_eq!(tx.used().idx().load(), 3);
    assert_eq!(device.counters.tx_packets.load(Ordering::Relaxed), 3);
}

#[test]
fn the_receive_rate_limiter_holds_a_frame_in_the_guest_buffer_until_its_timer() {
    if !private_tap() {
        return;
    }
    let memory = testing::memory(16 * MIB);
    let rx = MockSplitQueue::create(&*memory, GuestAddress(RX_RING), 16);
    let tx = MockSplitQueue::create(&*memory, GuestAddress(TX_RING), 16);
    let limited = NetConfig {
        rx_rate_limiter: RateLimiterConfig {
            bandwidth: None,
            ops: Some(TokenBucketConfig {
                size: 1,
                one_time_burst: None,
                refill_time: 100,
            }),
        },
        ..config()
    };
    let (mut device, _irq) = activated(&memory, &rx, &tx, 0, limited);
    for avail in 0..2 {
        add_chain(
            &rx,
            avail,
            avail,
            &[(BUFFERS + u64::from(avail) * 0x1000, 1526, true)],
        );
    }
    let socket = host_socket();
    socket.send_to(b"one", "10.0.0.2:5000").unwrap();
    socket.send_to(b"two", "10.0.0.2:5000").unwrap();
    wait_for_frame(&device);
    device.wake(WAKE_TAP);
    assert_eq!(rx.used().idx().load(), 1, "the second waits");
    assert_eq!(
        device.save_state(),
        DeviceState::Net {
            deferred_rx: Some((1, used_len(&rx, 0)))
        }
    );
    wait_readable(device.wake_sources()[WAKE_RX_TIMER].fd);
    device.wake(WAKE_RX_TIMER);
    assert_eq!(rx.used().idx().load(), 2);
    assert_eq!(
        device
            .counters
            .rx_rate_limiter_throttled
            .load(Ordering::Relaxed),
        1
    );
}

#[test]
fn offloads_follow_the_features_the_driver_took() {
    assert_eq!(NetDevice::tap_offloads(0), 0);
    // TSO without GUEST_CSUM is nothing: the tap would hand over unchecksummed frames.
    assert_eq!(NetDevice::tap_offloads(1 << VIRTIO_NET_F_GUEST_TSO4), 0);
    let all = [
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_NET_F_GUEST_UFO,
    ]
    .iter()
    .fold(0u64, |f, bit| f | 1 << bit);
    assert_eq!(
        NetDevice::tap_offloads(all),
        tap::TUN_F_CSUM | tap::TUN_F_TSO4 | tap::TUN_F_TSO6 | tap::TUN_F_UFO
    );
}
