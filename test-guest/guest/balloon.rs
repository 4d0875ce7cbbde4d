//! A polling virtio-balloon driver over virtio-mmio (virtio 1.2 §3.1, §4.2.2, §5.5), shaped like
//! Linux's: inflate and deflate buffers of up to 256 page frame numbers with `actual` written
//! after each, free page reports of up to 32 ranges of up to 4 MiB, one statistics buffer that
//! the device holds until it wants new statistics. No interrupts: the driver polls the used
//! rings. Every instruction may be emulated, so it does as little as it can.

use core::ptr::{addr_of_mut, read_volatile, write_volatile};

use crate::driver_memory::{read16, write16, write32, write64};
use crate::failure::{Failure, Outcome};
use crate::virtio_mmio as reg;
use test_guest::protocol::*;

/// `num_pages` in the balloon's configuration space (virtio 1.2 §5.5.4).
const CONFIG_NUM_PAGES: u64 = reg::CONFIG;
/// `actual` in the balloon's configuration space.
const CONFIG_ACTUAL: u64 = reg::CONFIG + 4;
/// `free_page_hint_cmd_id` in the balloon's configuration space.
const CONFIG_HINT_CMD: u64 = reg::CONFIG + 8;
/// Free page hinting commands: the guest is through with a run; the host ended the run.
const HINT_STOP: u32 = 0;
const HINT_DONE: u32 = 1;

const BALLOON_DEVICE_ID: u32 = 5;
const ACKNOWLEDGE: u32 = 1;
const DRIVER: u32 = 2;
const DRIVER_OK: u32 = 4;
const FEATURES_OK: u32 = 8;
const DEVICE_NEEDS_RESET: u32 = 64;
const FAILED: u32 = 128;
const VERSION_1: u64 = 1 << 32;
const F_STATS_VQ: u64 = 1 << 1;
const F_FREE_PAGE_HINT: u64 = 1 << 3;
const F_PAGE_REPORTING: u64 = 1 << 5;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
/// Used-ring polls before the driver gives up on the device (several seconds when emulated).
const POLL_LIMIT: u64 = 1 << 24;
const INFLATE: usize = 0;
const DEFLATE: usize = 1;

#[derive(Clone, Copy)]
struct DriverRings {
    size: u16,
    avail_idx: u16,
    used_seen: u16,
}

struct BalloonDriver {
    base: u64,
    ready: bool,
    /// The features the last probe asked for, and those negotiated.
    wanted: u64,
    features: u64,
    queues: [DriverRings; 4],
    queue_count: usize,
    /// Top of the page area; the balloon holds `[top - pages * 4 KiB, top)`.
    top: u64,
    pages: u64,
}

static mut STATE: BalloonDriver = BalloonDriver {
    base: 0,
    ready: false,
    wanted: 0,
    features: 0,
    queues: [DriverRings {
        size: 0,
        avail_idx: 0,
        used_seen: 0,
    }; 4],
    queue_count: 0,
    top: 0,
    pages: 0,
};

fn ring(queue: usize) -> u64 {
    BALLOON_AREA_START + queue as u64 * BALLOON_QUEUE_STRIDE
}

impl BalloonDriver {
    fn read(&self, offset: u64) -> u32 {
        // SAFETY: the device's MMIO window; the access exits to the VMM.
        unsafe { read_volatile((self.base + offset) as *const u32) }
    }

    fn write(&self, offset: u64, value: u32) {
        // SAFETY: as in `read`.
        unsafe { write_volatile((self.base + offset) as *mut u32, value) }
    }

    fn write64(&self, offset: u64, value: u64) {
        self.write(offset, value as u32);
        self.write(offset + 4, (value >> 32) as u32);
    }

    fn has(&self, feature: u64) -> bool {
        self.features & feature != 0
    }

    /// Queue indices: inflate 0, deflate 1, then statistics, free page hinting and reporting
    /// as negotiated (virtio 1.2 §5.5.2).
    fn stats_queue(&self) -> Option<usize> {
        self.has(F_STATS_VQ).then_some(2)
    }

    fn hint_queue(&self) -> Option<usize> {
        self.has(F_FREE_PAGE_HINT)
            .then_some(2 + usize::from(self.has(F_STATS_VQ)))
    }

    fn report_queue(&self) -> Option<usize> {
        self.has(F_PAGE_REPORTING).then_some(
            2 + usize::from(self.has(F_STATS_VQ)) + usize::from(self.has(F_FREE_PAGE_HINT)),
        )
    }

    /// Reset, feature negotiation, queues, DRIVER_OK (virtio 1.2 §3.1.1).
    fn probe(&mut self, base: u64, top: u64, wanted: u64) -> Outcome {
        self.base = base;
        self.ready = false;
        self.wanted = wanted;
        for (offset, expected) in [
            (reg::MAGIC_VALUE, reg::MAGIC),
            (reg::VERSION, reg::MODERN_VERSION),
            (reg::DEVICE_ID, BALLOON_DEVICE_ID),
        ] {
            let found = self.read(offset);
            if found != expected {
                return Err(Failure(balloon_error::NO_DEVICE, found.into()));
            }
        }
        self.write(reg::STATUS, 0);
        while self.read(reg::STATUS) != 0 {}
        self.write(reg::STATUS, ACKNOWLEDGE);
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER);
        self.write(reg::DEVICE_FEATURES_SEL, 1);
        let mut offered = u64::from(self.read(reg::DEVICE_FEATURES)) << 32;
        self.write(reg::DEVICE_FEATURES_SEL, 0);
        offered |= u64::from(self.read(reg::DEVICE_FEATURES));
        self.features = offered & wanted & BALLOON_DRIVER_FEATURES;
        self.write(reg::DRIVER_FEATURES_SEL, 0);
        self.write(reg::DRIVER_FEATURES, self.features as u32);
        self.write(reg::DRIVER_FEATURES_SEL, 1);
        self.write(reg::DRIVER_FEATURES, (self.features >> 32) as u32);
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        if !self.has(VERSION_1) || self.read(reg::STATUS) & FEATURES_OK == 0 {
            self.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FAILED);
            return Err(Failure(balloon_error::FEATURES_REJECTED, self.features));
        }
        self.queue_count = 2
            + usize::from(self.has(F_STATS_VQ))
            + usize::from(self.has(F_FREE_PAGE_HINT))
            + usize::from(self.has(F_PAGE_REPORTING));
        for index in 0..self.queue_count {
            self.setup_queue(index)?;
        }
        self.top = top;
        self.pages = 0;
        if let Some(stats) = self.stats_queue() {
            // The first statistics buffer goes in before DRIVER_OK, as Linux does.
            self.post_stats(stats);
        }
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        if let Some(stats) = self.stats_queue() {
            self.write(reg::QUEUE_NOTIFY, stats as u32);
        }
        self.write(CONFIG_ACTUAL, 0);
        self.ready = true;
        Ok(0)
    }

    fn setup_queue(&mut self, index: usize) -> Outcome {
        self.write(reg::QUEUE_SEL, index as u32);
        let max = self.read(reg::QUEUE_NUM_MAX);
        if max == 0 || self.read(reg::QUEUE_READY) != 0 {
            self.write(reg::STATUS, FAILED);
            return Err(Failure(balloon_error::BAD_QUEUE, index as u64));
        }
        let size = max.min(BALLOON_QUEUE_SIZE);
        let desc = ring(index);
        // Fresh rings: flags and indices zero (the used ring too, for a re-probe).
        write32(desc + BALLOON_AVAIL_OFFSET, 0);
        write32(desc + BALLOON_USED_OFFSET, 0);
        self.queues[index] = DriverRings {
            size: size as u16,
            avail_idx: 0,
            used_seen: 0,
        };
        self.write(reg::QUEUE_NUM, size);
        self.write64(reg::QUEUE_DESC_LOW, desc);
        self.write64(reg::QUEUE_AVAIL_LOW, desc + BALLOON_AVAIL_OFFSET);
        self.write64(reg::QUEUE_USED_LOW, desc + BALLOON_USED_OFFSET);
        self.write(reg::QUEUE_READY, 1);
        Ok(0)
    }

    /// Writes descriptor `at` of `queue`; `last` ends the chain.
    fn descriptor(&self, queue: usize, at: u64, addr: u64, len: u32, flags: u16, last: bool) {
        let entry = ring(queue) + at * 16;
        write64(entry, addr);
        write32(entry + 8, len);
        write16(entry + 12, flags | if last { 0 } else { DESC_F_NEXT });
        write16(entry + 14, (at + 1) as u16);
    }

    /// Makes the chain at descriptor 0 available (the driver has one chain out at a time).
    fn publish(&mut self, queue: usize) {
        let q = &mut self.queues[queue];
        let avail = ring(queue) + BALLOON_AVAIL_OFFSET;
        write16(avail + 4 + 2 * u64::from(q.avail_idx % q.size), 0);
        q.avail_idx = q.avail_idx.wrapping_add(1);
        // Volatile stores stay in program order, and x86 keeps them so for the device.
        write16(avail + 2, q.avail_idx);
    }

    /// Publishes the chain at descriptor 0, notifies and waits until the device used it.
    fn submit(&mut self, queue: usize) -> Outcome {
        self.publish(queue);
        self.write(reg::QUEUE_NOTIFY, queue as u32);
        self.wait_used(queue)
    }

    fn wait_used(&mut self, queue: usize) -> Outcome {
        let used = ring(queue) + BALLOON_USED_OFFSET;
        for _ in 0..POLL_LIMIT {
            if read16(used + 2) != self.queues[queue].used_seen {
                let q = &mut self.queues[queue];
                q.used_seen = q.used_seen.wrapping_add(1);
                return Ok(0);
            }
        }
        self.ready = false;
        Err(Failure(balloon_error::TIMEOUT, queue as u64))
    }

    /// Fills the statistics buffer (free and total memory) and makes it available.
    fn post_stats(&mut self, queue: usize) {
        let area = self.top - WORKLOAD_MIN_ADDR;
        let free = area - self.pages * PAGE_SIZE;
        let entries = [(5u16, self.top), (4, free), (6, free)];
        for (i, (tag, value)) in entries.iter().enumerate() {
            // Packed `le16 tag, le64 val`: unaligned, so written bytewise.
            let entry = BALLOON_STATS_BUFFER + i as u64 * 10;
            for (byte, at) in tag
                .to_le_bytes()
                .iter()
                .chain(&value.to_le_bytes())
                .zip(entry..)
            {
                // SAFETY: the statistics buffer in the balloon area.
                unsafe { write_volatile(at as *mut u8, *byte) };
            }
        }
        self.descriptor(queue, 0, BALLOON_STATS_BUFFER, 30, 0, true);
        self.publish(queue);
    }

    /// Answers a statistics request if the device returned the buffer; returns whether it did.
    fn answer_stats(&mut self, wait: bool) -> Result<bool, Failure> {
        let Some(queue) = self.stats_queue() else {
            return Err(Failure(balloon_error::NO_FEATURE, 1));
        };
        let used = ring(queue) + BALLOON_USED_OFFSET;
        if read16(used + 2) == self.queues[queue].used_seen {
            if !wait {
                return Ok(false);
            }
            self.wait_used(queue)?;
        } else {
            let q = &mut self.queues[queue];
            q.used_seen = q.used_seen.wrapping_add(1);
        }
        self.post_stats(queue);
        self.write(reg::QUEUE_NOTIFY, queue as u32);
        Ok(true)
    }

    /// Sends pages `[first, first + count)` (ascending page frame numbers) on `queue` in
    /// batches of 256, writing `actual` after each batch; `grow` tells inflation.
    fn send_pages(&mut self, queue: usize, first: u64, count: u64, grow: bool) -> Outcome {
        let mut done = 0;
        while done < count {
            let batch = (count - done).min(BALLOON_PFNS_PER_BATCH);
            let pfn = (first >> 12) + done;
            for i in 0..batch {
                write32(BALLOON_PFN_BUFFER + 4 * i, (pfn + i) as u32);
            }
            self.descriptor(queue, 0, BALLOON_PFN_BUFFER, (batch * 4) as u32, 0, true);
            self.submit(queue)?;
            done += batch;
            self.pages = if grow {
                self.pages + batch
            } else {
                self.pages - batch
            };
            self.write(CONFIG_ACTUAL, self.pages as u32);
        }
        Ok(count)
    }

    fn inflate(&mut self, pages: u64) -> Outcome {
        let room = (self.top - WORKLOAD_MIN_ADDR) / PAGE_SIZE - self.pages;
        if pages > room {
            return Err(Failure(balloon_error::NO_ROOM, self.pages));
        }
        // The new pages lie just below the balloon's lowest page, sent in ascending order
        // from the highest batch down so that the balloon stays one range.
        let mut left = pages;
        while left > 0 {
            let batch = left.min(BALLOON_PFNS_PER_BATCH);
            let bottom = self.top - (self.pages + batch) * PAGE_SIZE;
            self.send_pages(INFLATE, bottom, batch, true)?;
            left -= batch;
        }
        Ok(pages)
    }

    fn deflate(&mut self, pages: u64) -> Outcome {
        if pages > self.pages {
            return Err(Failure(balloon_error::NO_ROOM, self.pages));
        }
        let bottom = self.top - self.pages * PAGE_SIZE;
        self.send_pages(DEFLATE, bottom, pages, false)
    }

    fn to_target(&mut self) -> Outcome {
        let target = u64::from(self.read(CONFIG_NUM_PAGES));
        if target >= self.pages {
            self.inflate(target - self.pages)
        } else {
            self.deflate(self.pages - target)
        }
    }

    /// Reports `[addr, addr + size)` free: ranges that do not cross a 4 MiB boundary, up to
    /// 32 in a chain.
    fn report(&mut self, addr: u64, size: u64) -> Outcome {
        let Some(queue) = self.report_queue() else {
            return Err(Failure(balloon_error::NO_FEATURE, 5));
        };
        self.send_ranges(queue, addr, size)
    }

    /// Hints `[addr, addr + size)` free in the host's hinting run (the VMM was asked to start
    /// one): its id, the ranges as [`Self::report`] sends them, STOP; then waits until the
    /// host ends the run, after which the pages are the guest's again.
    fn hint(&mut self, addr: u64, size: u64) -> Outcome {
        let Some(queue) = self.hint_queue() else {
            return Err(Failure(balloon_error::NO_FEATURE, 3));
        };
        let mut run = self.read(CONFIG_HINT_CMD);
        for _ in 0..POLL_LIMIT {
            if run > HINT_DONE {
                break;
            }
            run = self.read(CONFIG_HINT_CMD);
        }
        if run <= HINT_DONE {
            return Err(Failure(balloon_error::NO_HINTING_RUN, run.into()));
        }
        self.hint_command(queue, run)?;
        self.send_ranges(queue, addr, size)?;
        self.hint_command(queue, HINT_STOP)?;
        for _ in 0..POLL_LIMIT {
            let now = self.read(CONFIG_HINT_CMD);
            if now != run {
                return Ok(size / PAGE_SIZE);
            }
        }
        Err(Failure(balloon_error::NO_HINTING_RUN, run.into()))
    }

    /// Sends free page hinting command `cmd` (a device-readable `le32`).
    fn hint_command(&mut self, queue: usize, cmd: u32) -> Outcome {
        write32(BALLOON_HINT_CMD_BUFFER, cmd);
        self.descriptor(queue, 0, BALLOON_HINT_CMD_BUFFER, 4, 0, true);
        self.submit(queue)
    }

    /// Sends `[addr, addr + size)` on `queue` as device-writable ranges that do not cross a
    /// 4 MiB boundary, up to 32 in a chain.
    fn send_ranges(&mut self, queue: usize, addr: u64, size: u64) -> Outcome {
        let end = addr + size;
        let mut at = addr;
        while at < end {
            let mut count = 0;
            while at < end && count < BALLOON_REPORT_BATCH {
                let len = (BALLOON_REPORT_MAX_RANGE - at % BALLOON_REPORT_MAX_RANGE).min(end - at);
                let last = at + len == end || count + 1 == BALLOON_REPORT_BATCH;
                self.descriptor(queue, count, at, len as u32, DESC_F_WRITE, last);
                at += len;
                count += 1;
            }
            self.submit(queue)?;
        }
        Ok(size / PAGE_SIZE)
    }

    /// A chain exactly as the step describes it (see `protocol::balloon_raw`).
    fn raw(&mut self, step: &Step) -> Outcome {
        let queue = (step.pattern & balloon_raw::QUEUE_MASK) as usize;
        if queue >= self.queue_count {
            return Err(Failure(balloon_error::BAD_QUEUE, queue as u64));
        }
        let count = balloon_raw::count(step.pattern).min(self.queues[queue].size.into());
        let flags = if step.pattern & balloon_raw::WRITABLE != 0 {
            DESC_F_WRITE
        } else {
            0
        };
        let pfn_buffer = step.pattern & balloon_raw::PFN_BUFFER != 0;
        let pfns = step.size / PAGE_SIZE;
        if pfn_buffer {
            for i in 0..pfns {
                write32(BALLOON_PFN_BUFFER + 4 * i, ((step.addr >> 12) + i) as u32);
            }
        }
        for i in 0..count {
            let (addr, len) = if pfn_buffer {
                (BALLOON_PFN_BUFFER, (pfns * 4) as u32)
            } else {
                (
                    step.addr.wrapping_add(i.wrapping_mul(step.size)),
                    step.size as u32,
                )
            };
            self.descriptor(queue, i, addr, len, flags, i + 1 == count);
        }
        self.submit(queue)?;
        Ok(count)
    }

    /// Breaks the inflate queue, waits for DEVICE_NEEDS_RESET and probes the device again.
    fn break_queue(&mut self) -> Outcome {
        let q = self.queues[INFLATE];
        let avail = ring(INFLATE) + BALLOON_AVAIL_OFFSET;
        write16(avail + 2, q.avail_idx.wrapping_add(q.size).wrapping_add(1));
        self.write(reg::QUEUE_NOTIFY, INFLATE as u32);
        for _ in 0..POLL_LIMIT {
            if self.read(reg::STATUS) & DEVICE_NEEDS_RESET != 0 {
                return self.probe(self.base, self.top, self.wanted).map(|_| 1);
            }
        }
        self.ready = false;
        Err(Failure(balloon_error::TIMEOUT, INFLATE as u64))
    }

    fn run(&mut self, step: &Step) -> Outcome {
        if step.kind == step_kind::BALLOON_PROBE {
            return self.probe(step.addr, step.size, step.pattern);
        }
        if !self.ready {
            return Err(Failure(balloon_error::NOT_PROBED, 0));
        }
        if step.kind == step_kind::BALLOON_STATS {
            for _ in 0..step.pattern {
                self.answer_stats(true)?;
            }
            return Ok(0);
        }
        if self.stats_queue().is_some() {
            self.answer_stats(false)?;
        }
        match step.kind {
            step_kind::BALLOON_INFLATE => self.inflate(step.size / PAGE_SIZE),
            step_kind::BALLOON_DEFLATE => self.deflate(step.size / PAGE_SIZE),
            step_kind::BALLOON_TO_TARGET => self.to_target(),
            step_kind::BALLOON_REPORT => self.report(step.addr, step.size),
            step_kind::BALLOON_HINT => self.hint(step.addr, step.size),
            step_kind::BALLOON_BREAK => self.break_queue(),
            _ => self.raw(step),
        }
    }
}

/// Whether `kind` is a balloon step.
pub fn is_balloon_step(kind: u32) -> bool {
    (step_kind::BALLOON_PROBE..=step_kind::BALLOON_BREAK).contains(&kind)
        || kind == step_kind::BALLOON_HINT
}

/// Runs a balloon step; returns the pages handled, or the failure.
pub fn run_step(step: &Step) -> Result<u64, Failure> {
    // SAFETY: only the vCPU running a balloon step touches the driver, and the barriers between
    // steps order its accesses with those of the vCPU running the next one.
    let driver = unsafe { &mut *addr_of_mut!(STATE) };
    driver.run(step)
}
