use std::time::Instant;

use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::rate_limiter::TokenBucketConfig;
use crate::virtio::request_queue::testing::{self, activation, add_chain, used_len, wait_readable};
use crate::virtio::VirtioDevice;

const MIB: u64 = 1 << 20;
const RING: u64 = MIB;
const BUFFER: u64 = 2 * MIB;

/// A device limited by `limiter`, activated with the queue of `mock`; returns it and its
/// interrupt's eventfd.
fn limited(
    memory: &DeviceMemory,
    mock: &MockSplitQueue<'_, GuestMemory>,
    limiter: RateLimiterConfig,
) -> (Entropy, EventFd) {
    let mut device = Entropy::new(memory.clone(), limiter).unwrap();
    let (activation, irq) = activation(memory, mock);
    device.activate(activation).unwrap();
    (device, irq)
}

/// An unlimited device activated with the queue of `mock`.
fn activated(memory: &DeviceMemory, mock: &MockSplitQueue<'_, GuestMemory>) -> (Entropy, EventFd) {
    limited(memory, mock, RateLimiterConfig::default())
}

#[test]
fn writable_buffers_are_filled_with_random_bytes() {
    let memory = testing::memory(16 * MIB);
    let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
    let (mut device, irq) = activated(&memory, &mock);
    assert_eq!(device.device_type(), 4);
    // Two buffers in one chain, 64 and 8192 bytes, zero before.
    add_chain(
        &mock,
        0,
        0,
        &[(BUFFER, 64, true), (BUFFER + 0x1000, 8192, true)],
    );
    device.process_queue(0);
    assert_eq!(used_len(&mock, 0), 64 + 8192);
    assert_eq!(irq.read().unwrap(), 1);
    let mut first = [0u8; 64];
    memory.read_slice(&mut first, GuestAddress(BUFFER)).unwrap();
    let mut second = vec![0u8; 8192];
    memory
        .read_slice(&mut second, GuestAddress(BUFFER + 0x1000))
        .unwrap();
    // Random: not all zero, and not the same twice.
    assert!(first.iter().any(|&b| b != 0) && second.iter().any(|&b| b != 0));
    assert_ne!(&first[..], &second[..64]);
    assert_eq!(device.handle().bytes(), 64 + 8192);
    assert_eq!(device.handle().requests(), 1);
}

#[test]
fn hostile_requests_get_at_most_the_cap_and_no_panic() {
    let memory = testing::memory(16 * MIB);
    let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
    let (mut device, _irq) = activated(&memory, &mock);
    // A 4 GiB buffer gets the cap (and the rest of guest memory is not written).
    add_chain(&mock, 0, 0, &[(BUFFER, u32::MAX, true)]);
    // A device-readable buffer, one outside guest memory, one that runs past its end.
    add_chain(&mock, 1, 1, &[(BUFFER, 64, false)]);
    add_chain(&mock, 2, 2, &[(1 << 40, 64, true)]);
    add_chain(&mock, 3, 3, &[(16 * MIB - 16, 64, true)]);
    device.process_queue(0);
    assert_eq!(mock.used().idx().load(), 4);
    assert_eq!(used_len(&mock, 0), MAX_BYTES_PER_REQUEST);
    assert_eq!(used_len(&mock, 1), 0);
    assert_eq!(used_len(&mock, 2), 0);
    assert_eq!(used_len(&mock, 3), 0);
    assert!(device.warnings.count() >= 3);
    // Config space: none, and writes to it are ignored; other queues and a reset device
    // ignore notifications.
    let mut config = [0xffu8; 4];
    device.read_config(0, &mut config);
    assert_eq!(config, [0; 4]);
    device.write_config(0, &[1, 2, 3]);
    device.process_queue(1);
    device.reset();
    device.process_queue(0);
    assert!(device.queue_states().is_empty());
}

#[test]
fn a_rate_limited_device_leaves_what_it_cannot_pay_for_until_its_timer_says_so() {
    let memory = testing::memory(16 * MIB);
    let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
    // 4 KiB per 100 ms.
    let limiter = RateLimiterConfig {
        bandwidth: Some(TokenBucketConfig {
            size: 4096,
            one_time_burst: None,
            refill_time: 100,
        }),
        ops: None,
    };
    let (mut device, _irq) = limited(&memory, &mock, limiter);
    for request in 0..3 {
        add_chain(&mock, request, request, &[(BUFFER, 4096, true)]);
    }
    device.process_queue(0);
    // One request paid for; the second waits in the queue, the timer armed.
    assert_eq!(mock.used().idx().load(), 1);
    assert_eq!(device.handle().throttled(), 1);
    let started = Instant::now();
    wait_readable(device.wake_sources()[0].fd);
    device.wake(0);
    let waited = started.elapsed();
    assert_eq!(
        mock.used().idx().load(),
        2,
        "the second came after {waited:?}"
    );
    assert!(waited >= std::time::Duration::from_millis(80), "{waited:?}");
    assert_eq!(device.handle().bytes(), 8192);
}
