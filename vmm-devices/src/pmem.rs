//! The virtio-pmem device (virtio 1.2 §5.19): a range of guest memory, outside RAM, that the
//! guest uses as persistent memory (Linux: /dev/pmem0, a file system on it with `-o dax`). Its
//! memory is guest memory like RAM, so in a zone it is made of zone frames and outlives the VMM.
//! A flush request writes the range back to its backing (msync) before it is answered.
//!
//! A rate limiter (Firecracker's, see [`crate::rate_limiter`]) may cap the requests:
//! each is an operation of no bytes (a flush moves no data through the device). One the buckets
//! cannot pay for stays in the queue until the limiter's timer says they can; the API may give
//! a running device another limiter ([`PmemHandle::update_rate_limiter`]).
//!
//! Everything the guest writes is checked: a request needs a readable descriptor of at least
//! 4 bytes (the type) and a writable one of at least 4 bytes (the answer); anything else is put
//! in the used ring unanswered and counted as a warning (rate-limited).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use guest_mem::GuestMemory;
use virtio_bindings::virtio_ids::VIRTIO_ID_PMEM;
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress};

use crate::rate_limiter::{RateLimiterConfig, Throttle};
use crate::virtio::request_queue::{read_config, request_and_answer, Served};
use crate::virtio::throttled::{ThrottledDevice, ThrottledQueue};
use crate::virtio::DeviceMemory;
use crate::virtio::{ActivateError, DeviceState};
use crate::GuestWarnings;

/// The only request type: make everything written so far durable.
pub const REQ_TYPE_FLUSH: u32 = 0;
/// Answer: done.
pub const RESP_OK: u32 = 0;
/// Answer: the flush failed.
pub const RESP_EIO: u32 = 1;

/// What the control API shows of a virtio-pmem device: where its memory is and how often the
/// guest flushed it; and its rate limiter.
#[derive(Debug, Clone)]
pub struct PmemHandle {
    /// Guest physical address of its memory.
    pub start: u64,
    /// Bytes of memory.
    pub size: u64,
    flushes: Arc<AtomicU64>,
    throttled: Arc<AtomicU64>,
    device: Arc<Mutex<PmemDevice>>,
}

impl PmemHandle {
    fn lock(&self) -> std::sync::MutexGuard<'_, PmemDevice> {
        self.device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Flush requests answered so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Times the rate limiter made a request wait.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Firecracker's `PATCH /pmem/{id}`: a new rate limiter, its buckets full.
    pub fn update_rate_limiter(&self, config: RateLimiterConfig) {
        self.lock().queue.throttle().set(config);
    }

    /// The rate limiter as the API last set it.
    pub fn rate_limiter(&self) -> RateLimiterConfig {
        self.lock().queue.throttle().config()
    }
}

/// A virtio-pmem device over `[start, start + size)` of guest memory.
#[derive(Debug)]
pub struct PmemDevice {
    start: u64,
    size: u64,
    queue: ThrottledQueue,
    warnings: GuestWarnings,
    flushes: Arc<AtomicU64>,
    throttled: Arc<AtomicU64>,
}

impl PmemDevice {
    /// A device whose memory is `[start, start + size)` of `memory` (which must hold it), its
    /// requests capped by `limiter`.
    pub fn new(
        memory: DeviceMemory,
        start: u64,
        size: u64,
        limiter: RateLimiterConfig,
    ) -> io::Result<Self> {
        Ok(Self {
            start,
            size,
            queue: ThrottledQueue::new(memory, Throttle::new(limiter, "virtio-pmem")?),
            warnings: GuestWarnings::default(),
            flushes: Arc::default(),
            throttled: Arc::default(),
        })
    }

    /// The device, shared with the event loop, and its handle for the control API.
    pub fn into_shared(self) -> (Arc<Mutex<Self>>, PmemHandle) {
        let (start, size) = (self.start, self.size);
        let flushes = Arc::clone(&self.flushes);
        let throttled = Arc::clone(&self.throttled);
        let device = Arc::new(Mutex::new(self));
        let handle = PmemHandle {
            start,
            size,
            flushes,
            throttled,
            device: Arc::clone(&device),
        };
        (device, handle)
    }

    /// The config space: `le64 start; le64 size`.
    fn config(&self) -> [u8; 16] {
        let mut config = [0u8; 16];
        config[..8].copy_from_slice(&self.start.to_le_bytes());
        config[8..].copy_from_slice(&self.size.to_le_bytes());
        config
    }

    /// Answers one flush request; returns the bytes written to the guest.
    fn flush(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
        let Some((request, response)) = request_and_answer(chain, 4, 4) else {
            self.warnings.warn(format_args!(
                "virtio-pmem: a request lacks its 4-byte type or its 4-byte answer buffer"
            ));
            return 0;
        };
        let answer = match mem.read_obj::<u32>(request).map(u32::from_le) {
            Ok(REQ_TYPE_FLUSH) => match self
                .queue
                .memory()
                .sync(GuestAddress(self.start), self.size)
            {
                Ok(()) => {
                    self.flushes.fetch_add(1, Ordering::Relaxed);
                    RESP_OK
                }
                Err(e) => {
                    log::error!("virtio-pmem: flush failed: {e}");
                    RESP_EIO
                }
            },
            Ok(other) => {
                self.warnings
                    .warn(format_args!("virtio-pmem: unknown request type {other}"));
                RESP_EIO
            }
            Err(_) => {
                self.warnings.warn(format_args!(
                    "virtio-pmem: the request is not in guest memory"
                ));
                return 0;
            }
        };
        match mem.write_obj(answer.to_le(), response) {
            Ok(()) => 4,
            Err(_) => {
                self.warnings.warn(format_args!(
                    "virtio-pmem: the answer buffer is not in guest memory"
                ));
                0
            }
        }
    }
}

impl ThrottledDevice for PmemDevice {
    const NAME: &'static str = "virtio-pmem";
    const TYPE: u32 = VIRTIO_ID_PMEM;
    const QUEUE_SIZES: &'static [u16] = &[256];

    fn config_read(&self, offset: u64, data: &mut [u8]) {
        read_config(&self.config(), offset, data);
    }

    fn queue(&self) -> &ThrottledQueue {
        &self.queue
    }

    fn queue_mut(&mut self) -> &mut ThrottledQueue {
        &mut self.queue
    }

    fn warnings(&self) -> &GuestWarnings {
        &self.warnings
    }

    /// Answers the request if the rate limiter lets it through (each is an operation of no
    /// bytes).
    fn serve(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> Served {
        if !self.queue.throttle().admit(|| 0) {
            self.throttled.fetch_add(1, Ordering::Relaxed);
            return Served::Deferred;
        }
        Served::Answered(self.flush(mem, chain))
    }

    fn saved_state(&self) -> DeviceState {
        DeviceState::Pmem {
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }

    fn restore_saved(&mut self, state: &DeviceState) -> Result<(), ActivateError> {
        let DeviceState::Pmem { flushes } = state else {
            return Err(ActivateError::Device(
                format!("a virtio-pmem device cannot take the state {state:?}").into(),
            ));
        };
        self.flushes.store(*flushes, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use guest_mem::{Backing, MemoryConfig, Pool, PoolConfig, Populate};
    use virtio_queue::mock::MockSplitQueue;
    use vmm_sys_util::eventfd::EventFd;

    use super::*;
    use crate::virtio::request_queue::testing::{activation, add_chain, wait_readable};
    use crate::virtio::VirtioDevice;

    const MIB: u64 = 1 << 20;
    /// The pmem region: 4 MiB at 64 MiB, above 16 MiB of RAM.
    const PMEM: (u64, u64) = (64 * MIB, 4 * MIB);
    const RING: u64 = MIB;
    const REQUEST: u64 = 2 * MIB;
    const ANSWER: u64 = 2 * MIB + 0x100;

    fn memory() -> DeviceMemory {
        let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 32 * MIB)).unwrap();
        let ranges = vec![(GuestAddress(0), 16 * MIB), (GuestAddress(PMEM.0), PMEM.1)];
        let config = MemoryConfig {
            populate: Populate::Eager,
            ..MemoryConfig::new(ranges, 1)
        };
        Arc::new(GuestMemory::new(pool, config).unwrap())
    }

    /// A device with `limiter`, activated with the queue of `mock`; returns it and its
    /// interrupt's eventfd.
    fn limited(
        memory: &DeviceMemory,
        mock: &MockSplitQueue<'_, GuestMemory>,
        limiter: RateLimiterConfig,
    ) -> (PmemDevice, EventFd) {
        let mut device = PmemDevice::new(memory.clone(), PMEM.0, PMEM.1, limiter).unwrap();
        let (activation, irq) = activation(memory, mock);
        device.activate(activation).unwrap();
        (device, irq)
    }

    /// A device without a limiter, activated with the queue of `mock`.
    fn activated(
        memory: &DeviceMemory,
        mock: &MockSplitQueue<'_, GuestMemory>,
    ) -> (PmemDevice, EventFd) {
        limited(memory, mock, RateLimiterConfig::default())
    }

    #[test]
    fn config_space_tells_where_the_memory_is() {
        let device =
            PmemDevice::new(memory(), PMEM.0, PMEM.1, RateLimiterConfig::default()).unwrap();
        let mut config = [0u8; 16];
        device.read_config(0, &mut config);
        assert_eq!(&config[..8], &PMEM.0.to_le_bytes());
        assert_eq!(&config[8..], &PMEM.1.to_le_bytes());
        let mut high = [0xffu8; 4];
        device.read_config(12, &mut high);
        assert_eq!(high, [0; 4]);
        device.read_config(u64::MAX, &mut high);
        assert_eq!(high, [0; 4]);
        assert_eq!(device.device_type(), 27);
    }

    #[test]
    fn a_flush_is_answered_after_the_memory_is_written_back() {
        let memory = memory();
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let (mut device, irq) = activated(&memory, &mock);
        memory
            .write_obj(REQ_TYPE_FLUSH.to_le(), GuestAddress(REQUEST))
            .unwrap();
        memory.write_obj(0xdead_u32, GuestAddress(ANSWER)).unwrap();
        add_chain(&mock, 0, 0, &[(REQUEST, 4, false), (ANSWER, 4, true)]);
        device.process_queue(0);
        assert_eq!(
            memory.read_obj::<u32>(GuestAddress(ANSWER)).unwrap(),
            RESP_OK
        );
        assert_eq!(mock.used().idx().load(), 1);
        assert_eq!(mock.used().ring().ref_at(0).unwrap().load().len(), 4);
        assert_eq!(device.flushes.load(Ordering::Relaxed), 1);
        assert_eq!(irq.read().unwrap(), 1);
    }

    #[test]
    fn the_rate_limiter_holds_a_flush_in_the_queue_until_its_timer_or_a_new_limiter() {
        let memory = memory();
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let one_per_second = RateLimiterConfig {
            bandwidth: None,
            ops: Some(crate::rate_limiter::TokenBucketConfig {
                size: 1,
                one_time_burst: None,
                refill_time: 1000,
            }),
        };
        let (device, _irq) = limited(&memory, &mock, one_per_second);
        let (device, handle) = device.into_shared();
        let mut device = device.lock().unwrap();
        memory
            .write_obj(REQ_TYPE_FLUSH.to_le(), GuestAddress(REQUEST))
            .unwrap();
        for avail in 0..3 {
            add_chain(
                &mock,
                avail * 2,
                avail,
                &[
                    (REQUEST, 4, false),
                    (ANSWER + u64::from(avail) * 4, 4, true),
                ],
            );
        }
        device.process_queue(0);
        assert_eq!(mock.used().idx().load(), 1, "the second waits");
        assert_eq!(device.throttled.load(Ordering::Relaxed), 1);
        // A notification while it waits changes nothing.
        device.process_queue(0);
        assert_eq!(mock.used().idx().load(), 1);
        // A limiter of ten a second from the API: the waiting flush goes at once.
        drop(device);
        let ten_per_second = RateLimiterConfig {
            ops: Some(crate::rate_limiter::TokenBucketConfig {
                size: 1,
                one_time_burst: None,
                refill_time: 100,
            }),
            ..one_per_second
        };
        handle.update_rate_limiter(ten_per_second);
        assert_eq!(handle.rate_limiter(), ten_per_second);
        let mut device = handle.device.lock().unwrap();
        wait_readable(device.wake_sources()[0].fd);
        device.wake(0);
        assert_eq!(mock.used().idx().load(), 2);
        wait_readable(device.wake_sources()[0].fd);
        device.wake(0);
        assert_eq!(mock.used().idx().load(), 3);
        assert_eq!(handle.flushes(), 3);
        assert_eq!(handle.throttled(), 2);
    }

    #[test]
    fn hostile_requests_get_no_flush_and_no_panic() {
        let memory = memory();
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let (mut device, _irq) = activated(&memory, &mock);
        memory
            .write_obj(7u32.to_le(), GuestAddress(REQUEST))
            .unwrap();
        // An unknown type is answered with an error.
        add_chain(&mock, 0, 0, &[(REQUEST, 4, false), (ANSWER, 4, true)]);
        device.process_queue(0);
        assert_eq!(
            memory.read_obj::<u32>(GuestAddress(ANSWER)).unwrap(),
            RESP_EIO
        );
        // No answer buffer, a short request, buffers outside guest memory: used, unanswered.
        add_chain(&mock, 2, 1, &[(REQUEST, 4, false)]);
        add_chain(&mock, 3, 2, &[(REQUEST, 2, false), (ANSWER, 4, true)]);
        add_chain(&mock, 5, 3, &[(1 << 40, 4, false), (ANSWER, 4, true)]);
        add_chain(&mock, 7, 4, &[(REQUEST, 4, false), (1 << 40, 4, true)]);
        device.process_queue(0);
        assert_eq!(mock.used().idx().load(), 5);
        for slot in 1..5 {
            assert_eq!(mock.used().ring().ref_at(slot).unwrap().load().len(), 0);
        }
        assert_eq!(device.flushes.load(Ordering::Relaxed), 0);
        assert!(device.warnings.count() >= 5);
        // Notifications for other queues, and after a reset, are ignored.
        device.process_queue(3);
        device.reset();
        device.process_queue(0);
    }
}
