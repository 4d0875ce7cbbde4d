//! The measured side: a balloon behind the real virtio-mmio transport on eagerly populated
//! guest-mem memory (an anonymous pool of 2 MiB frames), driven by the host-side driver that
//! writes real split rings, as a guest would.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guest_mem::{Backing, GuestMemory, MemoryConfig, Pool, PoolConfig, Populate};
use virtio_balloon::spec::{VIRTIO_BALLOON_F_PAGE_REPORTING, VIRTIO_F_VERSION_1};
use virtio_balloon::BalloonConfig;
use vm_memory::{Bytes, GuestAddress};
use vmm_devices::balloon::testing::{EventLoopThread, MmioDriver};
use vmm_devices::balloon::{BalloonDevice, BalloonTransport};
use vmm_devices::event_loop::QueueSubscriber;
use vmm_devices::virtio::mmio::MmioTransport;
use vmm_devices::virtio::VirtioDevice;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::{PfnOrder, HUGE, MIB, PAGE};

const BASE: u64 = 0xc000_0000;
/// The driver's rings, below the page frame buffers; both in the first chunk.
const RINGS: u64 = 0x2_0000;
/// Page frame buffers: 1024 of 1 KiB (256 page frame numbers each).
const BUFFERS: u64 = 0x10_0000;
/// The measured memory starts after the first chunk.
pub const FIRST: u64 = HUGE;
const INFLATE: u16 = 0;
const REPORTING: u16 = 2;
const QUEUE_SIZE: u16 = 1024;
/// Page frame numbers per inflate buffer, as Linux sends them.
const PFNS_PER_BUFFER: u64 = 256;
/// Ranges per reporting chain, and the largest range, as Linux sends them.
const RANGES_PER_CHAIN: usize = 32;
const RANGE: u64 = 4 * MIB;

/// Bytes of pool a guest of `size` bytes of measured memory needs.
pub fn pool_size(size: u64) -> u64 {
    FIRST + size
}

/// A balloon on `size` bytes of measured memory.
pub struct MeasuredBalloon {
    memory: Arc<GuestMemory>,
    transport: Arc<BalloonTransport>,
    size: u64,
}

impl MeasuredBalloon {
    pub fn new(size: u64, backing: Backing) -> Result<Self, String> {
        let ram = pool_size(size);
        let pool = Pool::new(PoolConfig::new(backing, ram)).map_err(|e| e.to_string())?;
        let config = MemoryConfig {
            populate: Populate::Eager,
            ..MemoryConfig::new(vec![(GuestAddress(0), ram)], 1)
        };
        let memory = Arc::new(GuestMemory::new(pool, config).map_err(|e| e.to_string())?);
        let balloon = BalloonConfig {
            free_page_reporting: true,
            ..BalloonConfig::default()
        };
        let device = BalloonDevice::new(balloon, memory.clone()).map_err(|e| e.to_string())?;
        let irq = EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?;
        let transport = MmioTransport::new(memory.clone(), Arc::new(Mutex::new(device)), irq)
            .map_err(|e| e.to_string())?;
        Ok(Self {
            memory,
            transport: Arc::new(transport),
            size,
        })
    }

    /// Resets the device (which takes every inflated page back) and starts a driver.
    fn driver(&self) -> MmioDriver<'_, GuestMemory> {
        let features = 1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_BALLOON_F_PAGE_REPORTING;
        let transport: &BalloonTransport = &self.transport;
        MmioDriver::start(
            transport,
            BASE,
            &*self.memory,
            RINGS,
            features,
            3,
            QUEUE_SIZE,
        )
    }

    /// Populates every chunk and makes every 4 KiB page resident (as a guest that used it).
    fn touch(&self) {
        for addr in (FIRST..FIRST + self.size).step_by(PAGE as usize) {
            self.memory
                .write_obj(1u8, GuestAddress(addr))
                .expect("measured memory is RAM");
        }
    }

    fn free_bytes(&self) -> u64 {
        self.memory.pool().stats().free_bytes
    }

    fn process(&self, queue: u16) -> Duration {
        let started = Instant::now();
        self.transport
            .device()
            .lock()
            .expect("device lock")
            .process_queue(queue);
        started.elapsed()
    }

    /// Inflates all measured memory in buffers of 256 page frame numbers (up to 1024 buffers
    /// at once, a queue's worth); returns the time the device spent and the bytes the pool got
    /// back.
    pub fn inflate(&self, order: PfnOrder) -> (Duration, u64) {
        self.touch();
        let mut driver = self.driver();
        let free = self.free_bytes();
        let pages = self.size / PAGE;
        let per_round = PFNS_PER_BUFFER * u64::from(QUEUE_SIZE);
        let mut spent = Duration::ZERO;
        for round in (0..pages).step_by(per_round as usize) {
            let mut posted = 0;
            for (slot, first) in (round..pages.min(round + per_round))
                .step_by(PFNS_PER_BUFFER as usize)
                .enumerate()
            {
                let count = PFNS_PER_BUFFER.min(pages - first);
                let pfns = (first..first + count).map(|p| ((FIRST / PAGE) + p) as u32);
                let buffer = BUFFERS + slot as u64 * PFNS_PER_BUFFER * 4;
                let len = match order {
                    PfnOrder::Ascending => driver.write_pfns(buffer, pfns),
                    PfnOrder::Descending => driver.write_pfns(buffer, pfns.rev()),
                };
                driver.add_chain(INFLATE, &[(buffer, len, false)]);
                posted += 1;
            }
            spent += self.process(INFLATE);
            assert_eq!(driver.take_used(INFLATE), posted, "every buffer used");
        }
        (spent, self.free_bytes() - free)
    }

    /// Reports all measured memory free, 32 ranges per chain: ascending 4 MiB ranges (adjacent,
    /// which the device merges) or descending 2 MiB ones (which it cannot merge);
    /// returns the time the device spent and the bytes the pool got back.
    pub fn report(&self, order: PfnOrder) -> (Duration, u64) {
        self.touch();
        let mut driver = self.driver();
        let free = self.free_bytes();
        let ranges: Vec<(u64, u32, bool)> = match order {
            PfnOrder::Ascending => (FIRST..FIRST + self.size)
                .step_by(RANGE as usize)
                .map(|a| (a, RANGE.min(FIRST + self.size - a) as u32, true))
                .collect(),
            PfnOrder::Descending => (0..self.size / HUGE)
                .rev()
                .map(|chunk| (FIRST + chunk * HUGE, HUGE as u32, true))
                .collect(),
        };
        let mut spent = Duration::ZERO;
        // A queue holds 1024 descriptors: 32 chains of 32 ranges at a time.
        for round in ranges.chunks(usize::from(QUEUE_SIZE)) {
            let mut posted = 0;
            for chain in round.chunks(RANGES_PER_CHAIN) {
                driver.add_chain(REPORTING, chain);
                posted += 1;
            }
            spent += self.process(REPORTING);
            assert_eq!(driver.take_used(REPORTING), posted, "every chain used");
        }
        (spent, self.free_bytes() - free)
    }

    /// Latency from a report of one 2 MiB chunk, notified through the QueueNotify register, to
    /// its frame being free in the pool, with the device run by an event-loop thread. Also
    /// returns the device's own processing time of the same report, called directly.
    pub fn report_latency(&self, samples: usize) -> Result<(Vec<Duration>, Vec<Duration>), String> {
        let mut driver = self.driver();
        let subscriber = QueueSubscriber::new(
            self.transport.device().clone(),
            self.transport.queue_notifiers(),
        )
        .map_err(|e| e.to_string())?;
        let events =
            EventLoopThread::start(vec![Box::new(subscriber)]).map_err(|e| e.to_string())?;
        let pool = self.memory.pool().clone();
        let chunk = FIRST;
        let mut through_loop = Vec::with_capacity(samples);
        let mut direct = Vec::with_capacity(samples);
        for sample in 0..2 * samples {
            for page in (chunk..chunk + HUGE).step_by(PAGE as usize) {
                self.memory
                    .write_obj(1u8, GuestAddress(page))
                    .map_err(|e| e.to_string())?;
            }
            let frame = self
                .memory
                .frame_at(GuestAddress(chunk))
                .ok_or("not populated")?;
            let (index, order) = (llfree::FrameId(frame.index as usize), frame.size.order());
            driver.add_chain(REPORTING, &[(chunk, HUGE as u32, true)]);
            let started = Instant::now();
            if sample % 2 == 0 {
                driver.notify(REPORTING);
                while !pool.allocator().is_free(index, order) {
                    std::hint::spin_loop();
                }
                through_loop.push(started.elapsed());
                // The event loop may still be finishing the used ring.
                while driver.take_used(REPORTING) == 0 {
                    std::hint::spin_loop();
                }
            } else {
                direct.push(self.process(REPORTING));
                driver.take_used(REPORTING);
            }
        }
        drop(events);
        Ok((through_loop, direct))
    }
}
