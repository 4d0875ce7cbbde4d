//! MMDS's stack against a guest of smoltcp's own (its TCP/IP as a guest's): ARP, a TCP
//! connection, a request and its answer, all as Ethernet frames.

use std::net::Ipv4Addr;

use serde_json::json;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr};

use super::*;
use crate::mmds::DEFAULT_IPV4;

/// A guest: an interface at 169.254.0.2 and one TCP client socket that sends `request` to
/// MMDS; returns what it got back.
fn fetch(stack: &mut Stack, request: &[u8]) -> String {
    static PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(49152);
    let port = PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut link = GuestLink::default();
    let mac = EthernetAddress([6, 0, 0, 0, 0, 2]);
    let mut iface = Interface::new(
        Config::new(HardwareAddress::Ethernet(mac)),
        &mut link,
        Instant::from_millis(0),
    );
    iface.update_ip_addrs(|addresses| {
        let _ = addresses.push(IpCidr::new(Ipv4Addr::new(169, 254, 0, 2).into(), 16));
    });
    let mut sockets = SocketSet::new(Vec::new());
    let handle = sockets.add(tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; 4096]),
        tcp::SocketBuffer::new(vec![0; 4096]),
    ));
    sockets
        .get_mut::<tcp::Socket>(handle)
        .connect(iface.context(), (DEFAULT_IPV4, 80), port)
        .unwrap();
    let mut sent = false;
    let mut answer = Vec::new();
    let mut closing = None;
    for round in 0..200i64 {
        let now = Instant::from_millis(round * 10);
        iface.poll(now, &mut link, &mut sockets);
        let socket = sockets.get_mut::<tcp::Socket>(handle);
        if socket.may_send() && !sent {
            socket.send_slice(request).unwrap();
            sent = true;
        }
        if socket.can_recv() {
            socket
                .recv(|data| {
                    answer.extend_from_slice(data);
                    (data.len(), ())
                })
                .unwrap();
        }
        // Answered and closed by MMDS: close too, and let the last segments pass.
        if sent && !answer.is_empty() && !socket.may_recv() && closing.is_none() {
            socket.close();
            closing = Some(round);
        }
        if closing.is_some_and(|at| round > at + 10) {
            break;
        }
        iface.poll(now, &mut link, &mut sockets);
        while let Some(frame) = link.to_guest.pop_front() {
            if stack.wants(&frame) {
                stack.take(frame);
            }
        }
        while let Some(frame) = stack.next_frame() {
            link.from_guest.push_back(frame);
        }
    }
    String::from_utf8(answer).unwrap()
}

fn stack(version: Version) -> Stack {
    let mut store = Store::default();
    store
        .put(json!({"latest": {"meta-data": {"instance-id": "i-0123"}}}))
        .unwrap();
    Stack::new(
        DEFAULT_IPV4,
        StackShared {
            store: Arc::new(Mutex::new(store)),
            version,
            imds_compat: false,
        },
    )
}

#[test]
fn a_guest_s_tcp_request_is_answered_from_the_document() {
    let mut stack = stack(Version::V1);
    let answer = fetch(
        &mut stack,
        b"GET /latest/meta-data/instance-id HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
    assert!(answer.ends_with("i-0123"), "{answer:?}");
    // The connection closed; another one is served on a fresh socket.
    let again = fetch(&mut stack, b"GET /latest/ HTTP/1.0\r\n\r\n");
    assert!(again.ends_with("meta-data/"), "{again:?}");
}

#[test]
fn v2_refuses_a_get_without_a_token_and_serves_one_with_it() {
    let mut stack = stack(Version::V2);
    let refused = fetch(
        &mut stack,
        b"GET /latest/meta-data/instance-id HTTP/1.1\r\n\r\n",
    );
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused:?}");
    let issued = fetch(
        &mut stack,
        b"PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 30\r\n\r\n",
    );
    let token = issued.rsplit("\r\n\r\n").next().unwrap();
    let request =
        format!("GET /latest/meta-data/instance-id HTTP/1.1\r\nX-metadata-token: {token}\r\n\r\n");
    let answer = fetch(&mut stack, request.as_bytes());
    assert!(answer.ends_with("i-0123"), "{answer:?}");
}

#[test]
fn only_arp_for_its_address_and_ipv4_to_it_are_mmds_s() {
    let stack = stack(Version::V1);
    let mut arp = vec![0u8; 42];
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    arp[38..42].copy_from_slice(&DEFAULT_IPV4.octets());
    assert!(stack.wants(&arp));
    arp[41] = 1;
    assert!(!stack.wants(&arp));
    let mut ipv4 = vec![0u8; 42];
    ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
    ipv4[30..34].copy_from_slice(&DEFAULT_IPV4.octets());
    assert!(stack.wants(&ipv4));
    assert!(!stack.wants(&ipv4[..20]), "too short to tell");
}

#[test]
fn a_request_longer_than_mmds_reads_is_answered_from_what_it_read() {
    let mut stack = stack(Version::V1);
    // Headers without end: MMDS answers once it has read its 4 KiB, not later.
    let mut request = b"GET /latest/meta-data/instance-id HTTP/1.1\r\nX-Pad: ".to_vec();
    request.extend(std::iter::repeat_n(b'x', 3000));
    let answer = fetch(&mut stack, &request[..3500.min(request.len())]);
    assert!(
        answer.is_empty(),
        "incomplete and short: no answer yet ({answer:?})"
    );
    request.extend(std::iter::repeat_n(b'x', 3000));
    let answer = fetch(&mut stack, &request);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
    assert!(answer.ends_with("i-0123"), "{answer:?}");
}

#[test]
fn connections_that_say_nothing_are_reset_once_too_old_and_their_slots_listen_again() {
    let mut stack = stack(Version::V1);
    stack.max_age = std::time::Duration::from_millis(300);
    assert_eq!(stack.poll_delay(), None, "nothing to wait for");
    // A guest opens every slot's connection and says nothing.
    let mut link = GuestLink::default();
    let mut iface = Interface::new(
        Config::new(HardwareAddress::Ethernet(EthernetAddress([
            6, 0, 0, 0, 0, 2,
        ]))),
        &mut link,
        Instant::from_millis(0),
    );
    iface.update_ip_addrs(|addresses| {
        let _ = addresses.push(IpCidr::new(Ipv4Addr::new(169, 254, 0, 2).into(), 16));
    });
    let mut sockets = SocketSet::new(Vec::new());
    let handles: Vec<_> = (0..SOCKETS as u16)
        .map(|i| {
            let handle = sockets.add(tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0; 1024]),
                tcp::SocketBuffer::new(vec![0; 1024]),
            ));
            sockets
                .get_mut::<tcp::Socket>(handle)
                .connect(iface.context(), (DEFAULT_IPV4, 80), 50000 + i)
                .unwrap();
            handle
        })
        .collect();
    let mut exchange = |round: i64, stack: &mut Stack, sockets: &mut SocketSet<'_>| {
        let now = Instant::from_millis(round * 10);
        iface.poll(now, &mut link, sockets);
        while let Some(frame) = link.to_guest.pop_front() {
            stack.take(frame);
        }
        while let Some(frame) = stack.next_frame() {
            link.from_guest.push_back(frame);
        }
        iface.poll(now, &mut link, sockets);
    };
    for round in 0..20 {
        exchange(round, &mut stack, &mut sockets);
    }
    let state = |sockets: &SocketSet<'_>, handle| sockets.get::<tcp::Socket>(handle).state();
    for &handle in &handles {
        assert_eq!(state(&sockets, handle), tcp::State::Established);
    }
    // The device's timer is asked for no later than the connections' end.
    let delay = stack.poll_delay().expect("a deadline");
    assert!(delay <= stack.max_age, "{delay:?}");
    std::thread::sleep(stack.max_age + std::time::Duration::from_millis(50));
    // The timer fires: the stack runs, resets each connection, and its slots listen again.
    stack.poll();
    for round in 20..30 {
        exchange(round, &mut stack, &mut sockets);
    }
    for &handle in &handles {
        assert_eq!(state(&sockets, handle), tcp::State::Closed, "reset");
    }
    // The timer comes back at once, and the slots listen again.
    assert_eq!(stack.poll_delay(), Some(std::time::Duration::ZERO));
    stack.poll();
    assert_eq!(stack.poll_delay(), None);
    assert!(stack.slots.iter().all(|slot| {
        stack.sockets.get::<tcp::Socket>(slot.handle).state() == tcp::State::Listen
    }));
    // And they serve again.
    assert!(fetch(
        &mut stack,
        b"GET /latest/meta-data/instance-id HTTP/1.1\r\n\r\n"
    )
    .contains("i-0123"));
}
