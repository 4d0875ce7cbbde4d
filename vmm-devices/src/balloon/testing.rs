//! Test and benchmark helpers (feature `testing`): a host-side virtio-mmio driver that writes
//! real split rings into guest memory and pokes the transport's registers, and a thread that
//! runs an event loop with the balloon's subscribers.

// The driver plays the guest: it builds register values and descriptors with casts on purpose.
#![allow(clippy::cast_possible_truncation)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use event_manager::{EventManager, SubscriberOps};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::bus::BusDevice;
use crate::event_loop::Subscriber;
use crate::virtio::mmio::registers as reg;
use crate::virtio::status::{ACKNOWLEDGE, DEVICE_NEEDS_RESET, DRIVER, DRIVER_OK, FEATURES_OK};

/// Distance between the queues' rings in the driver's ring area.
pub const QUEUE_STRIDE: u64 = 0x8000;
const AVAIL_OFFSET: u64 = 0x4000;
const USED_OFFSET: u64 = 0x5000;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;

/// One buffer of a chain: address, length and whether the device may write it.
pub type Buffer = (u64, u32, bool);

#[derive(Debug)]
struct DriverQueue {
    size: u16,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

/// A virtio-mmio driver on the host side of a transport, as a guest would drive it.
pub struct MmioDriver<'a, M> {
    transport: &'a dyn BusDevice,
    base: u64,
    memory: &'a M,
    area: u64,
    queues: Vec<DriverQueue>,
}

impl<M> std::fmt::Debug for MmioDriver<'_, M> {
    /// Where the device and the rings are, and the queues.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioDriver")
            .field("base", &self.base)
            .field("area", &self.area)
            .field("queues", &self.queues)
            .finish_non_exhaustive()
    }
}

impl<'a, M: GuestMemoryBackend> MmioDriver<'a, M> {
    /// Resets the device behind `transport` (at bus address `base`), negotiates `features`,
    /// sets up `queues` queues of `size` entries with rings from `area` on ([`QUEUE_STRIDE`]
    /// apart) and sets DRIVER_OK. Panics if the device refuses.
    pub fn start(
        transport: &'a dyn BusDevice,
        base: u64,
        memory: &'a M,
        area: u64,
        features: u64,
        queues: u16,
        size: u16,
    ) -> Self {
        let mut driver = Self {
            transport,
            base,
            memory,
            area,
            queues: Vec::new(),
        };
        driver.write(reg::STATUS, 0);
        driver.write(reg::STATUS, ACKNOWLEDGE);
        driver.write(reg::STATUS, ACKNOWLEDGE | DRIVER);
        for (select, value) in [(0, features as u32), (1, (features >> 32) as u32)] {
            driver.write(reg::DRIVER_FEATURES_SEL, select);
            driver.write(reg::DRIVER_FEATURES, value);
        }
        driver.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_ne!(
            driver.read(reg::STATUS) & FEATURES_OK,
            0,
            "features refused"
        );
        for index in 0..queues {
            driver.setup_queue(index, size);
        }
        driver.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        assert_eq!(
            driver.read(reg::STATUS) & DEVICE_NEEDS_RESET,
            0,
            "activation failed"
        );
        driver
    }

    fn setup_queue(&mut self, index: u16, size: u16) {
        let desc = self.area + u64::from(index) * QUEUE_STRIDE;
        for offset in [AVAIL_OFFSET, USED_OFFSET] {
            self.store(desc + offset, 0u32);
        }
        self.write(reg::QUEUE_SEL, index.into());
        self.write(reg::QUEUE_NUM, size.into());
        for (register, addr) in [
            (reg::QUEUE_DESC_LOW, desc),
            (reg::QUEUE_AVAIL_LOW, desc + AVAIL_OFFSET),
            (reg::QUEUE_USED_LOW, desc + USED_OFFSET),
        ] {
            self.write(register, addr as u32);
            self.write(register + 4, (addr >> 32) as u32);
        }
        self.write(reg::QUEUE_READY, 1);
        self.queues.push(DriverQueue {
            size,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        });
    }

    /// Reads a transport register.
    pub fn read(&self, offset: u64) -> u32 {
        let mut data = [0; 4];
        self.transport.read(self.base, offset, &mut data);
        u32::from_le_bytes(data)
    }

    /// Writes a transport register (or, from `0x100` on, the configuration space).
    pub fn write(&self, offset: u64, value: u32) {
        self.transport
            .write(self.base, offset, &value.to_le_bytes());
    }

    fn store<T: vm_memory::ByteValued>(&self, addr: u64, value: T) {
        self.memory
            .write_obj(value, GuestAddress(addr))
            .expect("the driver's rings lie in guest memory");
    }

    /// Writes `pfns` as `le32` at `addr`; returns their length in bytes.
    pub fn write_pfns(&self, addr: u64, pfns: impl IntoIterator<Item = u32>) -> u32 {
        let bytes: Vec<u8> = pfns.into_iter().flat_map(u32::to_le_bytes).collect();
        self.memory
            .write_slice(&bytes, GuestAddress(addr))
            .expect("page frame buffers lie in guest memory");
        bytes.len() as u32
    }

    /// Makes a chain of `buffers` available on `queue` (without notifying); returns its head.
    pub fn add_chain(&mut self, queue: u16, buffers: &[Buffer]) -> u16 {
        let desc_table = self.area + u64::from(queue) * QUEUE_STRIDE;
        let q = &mut self.queues[usize::from(queue)];
        let head = q.next_desc;
        let mut entries = Vec::with_capacity(buffers.len());
        for (i, &(addr, len, writable)) in buffers.iter().enumerate() {
            let at = q.next_desc;
            q.next_desc = (q.next_desc + 1) % q.size;
            let next = if i + 1 < buffers.len() {
                DESC_F_NEXT
            } else {
                0
            };
            let flags = next | if writable { DESC_F_WRITE } else { 0 };
            entries.push((at, addr, len, flags, q.next_desc));
        }
        let slot = u64::from(q.avail_idx % q.size);
        q.avail_idx = q.avail_idx.wrapping_add(1);
        let avail_idx = q.avail_idx;
        for (at, addr, len, flags, next) in entries {
            let entry = desc_table + u64::from(at) * 16;
            self.store(entry, addr);
            self.store(entry + 8, len);
            self.store(entry + 12, flags);
            self.store(entry + 14, next);
        }
        let avail = desc_table + AVAIL_OFFSET;
        self.store(avail + 4 + 2 * slot, head);
        self.store(avail + 2, avail_idx);
        head
    }

    /// Notifies `queue` through the QueueNotify register.
    pub fn notify(&self, queue: u16) {
        self.write(reg::QUEUE_NOTIFY, queue.into());
    }

    /// How many chains the device returned on `queue` since the last call.
    pub fn take_used(&mut self, queue: u16) -> u16 {
        let used = self.area + u64::from(queue) * QUEUE_STRIDE + USED_OFFSET;
        let idx: u16 = self
            .memory
            .read_obj(GuestAddress(used + 2))
            .expect("the used ring lies in guest memory");
        let q = &mut self.queues[usize::from(queue)];
        let count = idx.wrapping_sub(q.used_seen);
        q.used_seen = idx;
        count
    }
}

/// An event loop with subscribers, run on its own thread until dropped.
#[derive(Debug)]
pub struct EventLoopThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EventLoopThread {
    /// Starts a thread that runs `subscribers`' events.
    pub fn start(subscribers: Vec<Subscriber>) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut manager = EventManager::<Subscriber>::new().map_err(std::io::Error::other)?;
        for subscriber in subscribers {
            manager.add_subscriber(subscriber);
        }
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("balloon-events".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::Acquire) {
                    if let Err(e) = manager.run_with_timeout(20) {
                        log::warn!("event loop: {e}");
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EventLoopThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
