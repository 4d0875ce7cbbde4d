//! A polling virtio-mem driver over virtio-mmio (virtio 1.2 §5.15), shaped like Linux's: one
//! request at a time on the device's queue, a readable 24-byte request and a writable 10-byte
//! answer. It plugs the lowest blocks upwards and unplugs them downwards, so that what it has
//! plugged is one range from the region's start. No interrupts: it polls the used ring.

use core::ptr::{addr_of_mut, read_volatile, write_volatile};

use crate::driver_memory::{read16, write16, write32, write64};
use crate::failure::{Failure, Outcome};
use crate::virtio_mmio as reg;
use test_guest::protocol::*;

const MEM_DEVICE_ID: u32 = 24;
const ACKNOWLEDGE: u32 = 1;
const DRIVER: u32 = 2;
const DRIVER_OK: u32 = 4;
const FEATURES_OK: u32 = 8;
const FAILED: u32 = 128;
const VERSION_1: u64 = 1 << 32;
const F_UNPLUGGED_INACCESSIBLE: u64 = 1 << 1;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const REQ_PLUG: u64 = 0;
const REQ_UNPLUG: u64 = 1;
const RESP_ACK: u64 = 0;
/// Used-ring polls before the driver gives up on the device.
const POLL_LIMIT: u64 = 1 << 24;
/// Configuration space offsets (virtio 1.2 §5.15.4).
const CONFIG_BLOCK_SIZE: u64 = reg::CONFIG;
const CONFIG_ADDR: u64 = reg::CONFIG + 16;
const CONFIG_PLUGGED_SIZE: u64 = reg::CONFIG + 40;
const CONFIG_REQUESTED_SIZE: u64 = reg::CONFIG + 48;

struct MemDriver {
    base: u64,
    ready: bool,
    size: u16,
    avail_idx: u16,
    used_seen: u16,
    /// The region's guest address and block size, from the configuration space.
    addr: u64,
    block: u64,
    /// Bytes plugged, from the region's start.
    plugged: u64,
}

static mut STATE: MemDriver = MemDriver {
    base: 0,
    ready: false,
    size: 0,
    avail_idx: 0,
    used_seen: 0,
    addr: 0,
    block: 0,
    plugged: 0,
};

impl MemDriver {
    fn read_at(base: u64, offset: u64) -> u32 {
        // SAFETY: a virtio-mmio window (or nothing there, which reads as the VMM says); the
        // access exits to the VMM.
        unsafe { read_volatile((base + offset) as *const u32) }
    }

    fn read(&self, offset: u64) -> u32 {
        Self::read_at(self.base, offset)
    }

    fn read64(&self, offset: u64) -> u64 {
        u64::from(self.read(offset)) | u64::from(self.read(offset + 4)) << 32
    }

    fn write(&self, offset: u64, value: u32) {
        // SAFETY: the device's MMIO window; the access exits to the VMM.
        unsafe { write_volatile((self.base + offset) as *mut u32, value) }
    }

    fn write64(&self, offset: u64, value: u64) {
        self.write(offset, value as u32);
        self.write(offset + 4, (value >> 32) as u32);
    }

    /// Finds the device among `slots` slots from `first`, negotiates, sets up the queue and
    /// takes over what is plugged.
    fn probe(&mut self, first: u64, slots: u64) -> Outcome {
        let found = (0..slots).map(|slot| first + slot * 0x1000).find(|&base| {
            Self::read_at(base, reg::MAGIC_VALUE) == reg::MAGIC
                && Self::read_at(base, reg::VERSION) == reg::MODERN_VERSION
                && Self::read_at(base, reg::DEVICE_ID) == MEM_DEVICE_ID
        });
        let Some(base) = found else {
            return Err(Failure(hotplug_error::NO_DEVICE, slots));
        };
        self.base = base;
        self.write(reg::STATUS, 0);
        while self.read(reg::STATUS) != 0 {}
        self.write(reg::STATUS, ACKNOWLEDGE);
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER);
        self.write(reg::DEVICE_FEATURES_SEL, 1);
        let mut offered = u64::from(self.read(reg::DEVICE_FEATURES)) << 32;
        self.write(reg::DEVICE_FEATURES_SEL, 0);
        offered |= u64::from(self.read(reg::DEVICE_FEATURES));
        let features = offered & (VERSION_1 | F_UNPLUGGED_INACCESSIBLE);
        self.write(reg::DRIVER_FEATURES_SEL, 0);
        self.write(reg::DRIVER_FEATURES, features as u32);
        self.write(reg::DRIVER_FEATURES_SEL, 1);
        self.write(reg::DRIVER_FEATURES, (features >> 32) as u32);
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        if features & VERSION_1 == 0 || self.read(reg::STATUS) & FEATURES_OK == 0 {
            self.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FAILED);
            return Err(Failure(hotplug_error::FEATURES_REJECTED, features));
        }
        self.write(reg::QUEUE_SEL, 0);
        let max = self.read(reg::QUEUE_NUM_MAX);
        if max == 0 || self.read(reg::QUEUE_READY) != 0 {
            self.write(reg::STATUS, FAILED);
            return Err(Failure(hotplug_error::BAD_QUEUE, 0));
        }
        let size = max.min(HOTPLUG_QUEUE_SIZE);
        let desc = HOTPLUG_AREA_START;
        write32(desc + HOTPLUG_AVAIL_OFFSET, 0);
        write32(desc + HOTPLUG_USED_OFFSET, 0);
        self.size = size as u16;
        self.avail_idx = 0;
        self.used_seen = 0;
        self.write(reg::QUEUE_NUM, size);
        self.write64(reg::QUEUE_DESC_LOW, desc);
        self.write64(reg::QUEUE_AVAIL_LOW, desc + HOTPLUG_AVAIL_OFFSET);
        self.write64(reg::QUEUE_USED_LOW, desc + HOTPLUG_USED_OFFSET);
        self.write(reg::QUEUE_READY, 1);
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        self.block = self.read64(CONFIG_BLOCK_SIZE);
        self.addr = self.read64(CONFIG_ADDR);
        self.plugged = self.read64(CONFIG_PLUGGED_SIZE);
        self.ready = true;
        Ok(0)
    }

    /// Sends one request and returns the answer's type.
    fn request(&mut self, kind: u64, addr: u64, blocks: u64) -> Outcome {
        write64(HOTPLUG_REQUEST, kind & 0xffff);
        write64(HOTPLUG_REQUEST + 8, addr);
        write64(HOTPLUG_REQUEST + 16, blocks & 0xffff);
        write16(HOTPLUG_RESPONSE, 0xffff);
        let desc = HOTPLUG_AREA_START;
        write64(desc, HOTPLUG_REQUEST);
        write32(desc + 8, 24);
        write16(desc + 12, DESC_F_NEXT);
        write16(desc + 14, 1);
        write64(desc + 16, HOTPLUG_RESPONSE);
        write32(desc + 24, 10);
        write16(desc + 28, DESC_F_WRITE);
        write16(desc + 30, 0);
        let avail = desc + HOTPLUG_AVAIL_OFFSET;
        write16(avail + 4 + 2 * u64::from(self.avail_idx % self.size), 0);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // Volatile stores stay in program order, and x86 keeps them so for the device.
        write16(avail + 2, self.avail_idx);
        self.write(reg::QUEUE_NOTIFY, 0);
        let used = desc + HOTPLUG_USED_OFFSET;
        for _ in 0..POLL_LIMIT {
            if read16(used + 2) != self.used_seen {
                self.used_seen = self.used_seen.wrapping_add(1);
                return Ok(read16(HOTPLUG_RESPONSE).into());
            }
        }
        self.ready = false;
        Err(Failure(hotplug_error::TIMEOUT, kind))
    }

    /// Plugs or unplugs to the requested size; returns the 4 KiB pages that changed.
    fn to_requested(&mut self) -> Outcome {
        let requested = self.read64(CONFIG_REQUESTED_SIZE);
        let mut pages = 0;
        while self.plugged != requested {
            let plug = self.plugged < requested;
            let gap = if plug {
                requested - self.plugged
            } else {
                self.plugged - requested
            };
            let blocks = (gap / self.block).min(HOTPLUG_BLOCKS_PER_REQUEST);
            let bytes = blocks * self.block;
            let (kind, addr) = if plug {
                (REQ_PLUG, self.addr + self.plugged)
            } else {
                (REQ_UNPLUG, self.addr + self.plugged - bytes)
            };
            let answer = self.request(kind, addr, blocks)?;
            if answer != RESP_ACK {
                return Err(Failure(hotplug_error::ANSWER, answer));
            }
            self.plugged = if plug {
                self.plugged + bytes
            } else {
                self.plugged - bytes
            };
            pages += bytes / PAGE_SIZE;
        }
        Ok(pages)
    }

    fn run(&mut self, step: &Step) -> Outcome {
        if step.kind == step_kind::HOTPLUG_RAW {
            if !self.ready {
                return Err(Failure(hotplug_error::NOT_PROBED, 0));
            }
            let answer = self.request(step.pattern, step.addr, step.pattern >> 16)?;
            return match answer == (step.pattern >> 32) & 0xffff {
                true => Ok(1),
                false => Err(Failure(hotplug_error::ANSWER, answer)),
            };
        }
        if !self.ready {
            self.probe(step.addr, step.size / PAGE_SIZE)?;
        }
        self.to_requested()
    }
}

/// Whether `kind` is a virtio-mem step.
pub fn is_hotplug_step(kind: u32) -> bool {
    kind == step_kind::HOTPLUG_TO_REQUESTED || kind == step_kind::HOTPLUG_RAW
}

/// Runs a virtio-mem step; returns the pages handled, or the failure.
pub fn run_step(step: &Step) -> Result<u64, Failure> {
    // SAFETY: only the vCPU running a virtio-mem step touches the driver, and the barriers
    // between steps order its accesses with those of the vCPU running the next one.
    let driver = unsafe { &mut *addr_of_mut!(STATE) };
    driver.run(step)
}
