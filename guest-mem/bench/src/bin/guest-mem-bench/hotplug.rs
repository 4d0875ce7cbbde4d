//! Group `hotplug`: the host side of virtio-mem against the balloon's, per 2 MiB block, and
//! the hand-over of a block between two VMs on one zone.
//!
//! * `plug`: 1 GiB of hot-pluggable memory plugged one block at a time, then every 4 KiB page
//!   written (what the guest does next), then unplugged one block at a time (frames scrubbed
//!   and freed, the blocks made inaccessible).
//! * `plug-requests`: the same in requests of 64 blocks, the 128 MiB memory block that Linux's
//!   driver plugs and unplugs with one request.
//! * `balloon`: the same 1 GiB as RAM, written, given to a balloon 2 MiB at a time (inflation
//!   frees the frames), taken back 2 MiB at a time (deflation), then written again (which
//!   populates it through userfaultfd).
//! * `zone-handover`: two VMs on a zone with room for one of their blocks: the first unplugs a
//!   block, the second plugs it; the time from the start of the unplug to the plug's return.
//!
//! Each checks that it did what it says: the pool's used bytes after each phase, and the
//! written pages read back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use guest_mem::zone::{VmLayout, Zone, ZoneConfig, DEFAULT_MAX_VMS};
use guest_mem::{
    Backing, FrameSize, GuestMemory, MemoryConfig, Pool, PoolConfig, Populate, Population,
};
use vm_memory::GuestAddress;

use crate::report::{Key, Report};
use crate::subject::warm_pool;
use crate::subject::PoolKind;
use crate::{Args, GIB, MIB};

const GROUP: &str = "hotplug";
const BLOCK: u64 = 2 * MIB;
/// Where the hot-pluggable memory lies (after 2 MiB of RAM).
const REGION: u64 = GIB;

/// Writes one `u64` into every 4 KiB page of `[addr, addr + len)` of host memory.
fn write_pages(addr: usize, len: u64, value: u64) {
    for page in (0..len).step_by(4096) {
        // SAFETY: the caller passes a range of guest memory that is plugged or RAM (mapped
        // read/write, populated through userfaultfd where it is not).
        unsafe { std::ptr::write_volatile((addr + page as usize) as *mut u64, value) };
    }
}

fn check_pages(addr: usize, len: u64, value: u64) -> Result<(), String> {
    for page in (0..len).step_by(4096) {
        // SAFETY: as in write_pages.
        let found = unsafe { std::ptr::read_volatile((addr + page as usize) as *const u64) };
        if found != value {
            return Err(format!("page {page:#x} holds {found:#x}, not {value:#x}"));
        }
    }
    Ok(())
}

fn used(pool: &Pool) -> u64 {
    pool.stats().used_bytes
}

fn expect_used(pool: &Pool, bytes: u64, after: &str) -> Result<(), String> {
    match used(pool) {
        found if found == bytes => Ok(()),
        found => Err(format!(
            "{found} bytes of the pool in use after {after}, not {bytes}"
        )),
    }
}

/// Blocks per request of `plug-requests`: Linux's memory block of 128 MiB.
const REQUEST_BLOCKS: u64 = 64;

/// One run of `plug`: plug, write, unplug, `request` bytes a call.
fn plug_once(size: u64, request: u64) -> Result<[Duration; 3], String> {
    warm_pool(PoolKind::Anonymous, size + BLOCK)?;
    let pool =
        Pool::new(PoolConfig::new(Backing::Anonymous, size + BLOCK)).map_err(|e| e.to_string())?;
    let config = MemoryConfig {
        hotplug: Some((GuestAddress(REGION), size)),
        populate: Populate::Eager,
        ..MemoryConfig::new(vec![(GuestAddress(0), BLOCK)], 1)
    };
    let memory = GuestMemory::new(Arc::clone(&pool), config).map_err(|e| e.to_string())?;
    let mut core = pool.core_frames(pool.claim_cores(1));
    let requests = size / request;
    let started = Instant::now();
    for at in (0..requests).map(|i| GuestAddress(REGION + i * request)) {
        memory
            .plug(at, request, &mut core)
            .map_err(|e| e.to_string())?;
    }
    let plug = started.elapsed();
    expect_used(&pool, BLOCK + size, "plugging")?;
    let host = memory
        .hotplug_region()
        .expect("hot-pluggable memory")
        .host_addr();
    let started = Instant::now();
    write_pages(host, size, 0x77);
    let write = started.elapsed();
    check_pages(host, size, 0x77)?;
    let started = Instant::now();
    for at in (0..requests).map(|i| GuestAddress(REGION + i * request)) {
        memory
            .unplug(at, request, &mut core)
            .map_err(|e| e.to_string())?;
    }
    let unplug = started.elapsed();
    expect_used(&pool, BLOCK, "unplugging")?;
    Ok([plug, write, unplug])
}

/// One run of `balloon`: write, inflate, deflate, write again.
fn balloon_once(size: u64) -> Result<[Duration; 3], String> {
    warm_pool(PoolKind::Anonymous, size)?;
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, size)).map_err(|e| e.to_string())?;
    let config = MemoryConfig {
        populate: Populate::Eager,
        ..MemoryConfig::new(vec![(GuestAddress(0), size)], 1)
    };
    let memory = GuestMemory::new(Arc::clone(&pool), config).map_err(|e| e.to_string())?;
    let mut core = pool.core_frames(pool.claim_cores(1));
    let host = memory.regions()[0].host_addr();
    write_pages(host, size, 0x77);
    let blocks = size / BLOCK;
    let started = Instant::now();
    for block in 0..blocks {
        memory
            .release_pieces(GuestAddress(block * BLOCK), BLOCK, &mut core)
            .map_err(|e| e.to_string())?;
    }
    let inflate = started.elapsed();
    expect_used(&pool, 0, "inflating")?;
    let started = Instant::now();
    for block in 0..blocks {
        memory
            .reclaim_pieces(GuestAddress(block * BLOCK), BLOCK, &mut core)
            .map_err(|e| e.to_string())?;
    }
    let deflate = started.elapsed();
    let started = Instant::now();
    write_pages(host, size, 0x78);
    let write = started.elapsed();
    check_pages(host, size, 0x78)?;
    expect_used(&pool, size, "deflating and writing")?;
    Ok([inflate, deflate, write])
}

/// `handovers` hand-overs of one block from one VM to another on a zone with no other room.
fn handover_once(handovers: u64) -> Result<Vec<Duration>, String> {
    let dir = std::env::temp_dir().join(format!("guest-mem-bench-zone-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let region = handovers * BLOCK;
    // Each VM: 2 MiB of RAM, `region` of hot-pluggable memory; the zone holds both VMs' RAM
    // and one region.
    let config = ZoneConfig {
        size: 2 * BLOCK + region,
        frame_size: FrameSize::Huge,
        max_vms: DEFAULT_MAX_VMS,
    };
    let result = (|| {
        Zone::create(&dir, &config).map_err(|e| e.to_string())?;
        let zone = Zone::open(&dir, 4).map_err(|e| e.to_string())?;
        let layout = VmLayout {
            chunk_size: FrameSize::Huge,
            regions: vec![(0, BLOCK), (REGION, region)],
        };
        let open = |name: &str| -> Result<GuestMemory, String> {
            let vm = zone.attach(name, &layout).map_err(|e| e.to_string())?;
            let config = MemoryConfig {
                hotplug: Some((GuestAddress(REGION), region)),
                populate: Populate::Eager,
                ..MemoryConfig::new(vec![(GuestAddress(0), BLOCK)], 1)
            };
            GuestMemory::new_in_zone(vm, config, &Population::default()).map_err(|e| e.to_string())
        };
        let (giver, taker) = (open("giver")?, open("taker")?);
        let mut core = zone.pool().core_frames(zone.pool().claim_cores(1));
        giver
            .plug(GuestAddress(REGION), region, &mut core)
            .map_err(|e| e.to_string())?;
        if taker.plug(GuestAddress(REGION), BLOCK, &mut core).is_ok() {
            return Err("the zone had room for the taker before the hand-over".into());
        }
        let mut times = Vec::new();
        for block in 0..handovers {
            let at = GuestAddress(REGION + block * BLOCK);
            let started = Instant::now();
            giver
                .unplug(at, BLOCK, &mut core)
                .map_err(|e| e.to_string())?;
            taker
                .plug(at, BLOCK, &mut core)
                .map_err(|e| e.to_string())?;
            times.push(started.elapsed());
        }
        let plugged = taker
            .plugged_chunks(GuestAddress(REGION), region)
            .map_err(|e| e.to_string())?;
        match plugged as u64 == handovers {
            true => Ok(times),
            false => Err(format!("the taker holds {plugged} blocks, not {handovers}")),
        }
    })();
    let _ = std::fs::remove_file(&dir);
    result
}

fn ms(time: Duration) -> f64 {
    time.as_secs_f64() * 1e3
}

/// Runs the group.
pub fn run(args: &Args, report: &mut Report) {
    let size = GIB;
    let per_block = |time: Duration| time.as_secs_f64() * 1e6 / (size / BLOCK) as f64;
    for (case, request) in [("plug", BLOCK), ("plug-requests", REQUEST_BLOCKS * BLOCK)] {
        if !args.wants(case) {
            continue;
        }
        let key = Key::new(GROUP, case, size, "-");
        report.repeat(&key, args.repeats, |report, run| {
            let [plug, write, unplug] = plug_once(size, request)?;
            report.add(&key, run, "plug_ms", "ms", ms(plug));
            report.add(&key, run, "plug_us_per_block", "us", per_block(plug));
            report.add(&key, run, "write_after_plug_ms", "ms", ms(write));
            report.add(&key, run, "unplug_ms", "ms", ms(unplug));
            report.add(&key, run, "unplug_us_per_block", "us", per_block(unplug));
            Ok(())
        });
    }
    if args.wants("balloon") {
        let key = Key::new(GROUP, "balloon", size, "-");
        report.repeat(&key, args.repeats, |report, run| {
            let [inflate, deflate, write] = balloon_once(size)?;
            report.add(&key, run, "inflate_ms", "ms", ms(inflate));
            report.add(&key, run, "inflate_us_per_block", "us", per_block(inflate));
            report.add(&key, run, "deflate_ms", "ms", ms(deflate));
            report.add(&key, run, "write_after_deflate_ms", "ms", ms(write));
            Ok(())
        });
    }
    if args.wants("zone-handover") {
        let handovers = 64;
        let key = Key::new(GROUP, "zone-handover", handovers * BLOCK, "-");
        report.repeat(&key, args.repeats, |report, run| {
            let mut times = handover_once(handovers)?;
            times.sort();
            let us = |time: Duration| time.as_secs_f64() * 1e6;
            report.add(
                &key,
                run,
                "handover_median_us",
                "us",
                us(times[times.len() / 2]),
            );
            report.add(
                &key,
                run,
                "handover_max_us",
                "us",
                us(times[times.len() - 1]),
            );
            Ok(())
        });
    }
}
