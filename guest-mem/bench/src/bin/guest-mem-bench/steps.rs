//! Group `steps`: where the time of populating a chunk goes, step by step, on the host (no vCPU,
//! so no emulation noise).
//!
//! On a memfd of the pool's kind (outside guest-mem), per frame:
//! * `populate`: MADV_POPULATE_WRITE of a fresh frame: the kernel allocates and zeroes it and
//!   maps it (what the first touch of a fresh frame costs);
//! * `fallocate`: allocating (and zeroing) a frame in the file without mapping it;
//! * `write_resident`: one u64 written to a frame whose pages are in the file but not mapped:
//!   a minor fault mapping one page (4 KiB, or the whole 2 MiB / 1 GiB hugetlb page), what the
//!   first touch of a frame recycled by `Scrub::ZeroOnFree` costs;
//! * `zero`: writing zeroes over a resident frame (`Scrub::ZeroOnFree`);
//! * `punch`: punching the frame out of the file (`Scrub::PunchHole`);
//! * `mmap_fixed`: mmap(MAP_FIXED | MAP_SHARED) of the frame over an anonymous placeholder.
//!
//! In guest-mem, the calling thread registered as vCPU 0 writes one u64 per chunk of lazy memory:
//! * `touch_fresh`: fresh frames (userfaultfd round trip, handler, kernel zeroing);
//! * `touch_resident`: frames zeroed on free and still resident (no kernel zeroing);
//! * `uffd_transport` = touch_resident − (handler − wake) − write_resident (medians): delivering
//!   the fault message to the handler, and the wake-up until the thread runs again.

use std::os::fd::AsRawFd;
use std::time::Instant;

use guest_mem::testing::{map_placeholder, map_shared_fixed, punch_hole};
use guest_mem::{FaultLatency, GuestMemory, Populate, Scrub};

use crate::faults::handler_latency;
use crate::host::{self, Mapping};
use crate::report::{quantile, Key, Report};
use crate::subject::{memory, pool, reserve_or_skip, warm_pool, PoolKind};
use crate::{Args, GIB, MIB};

const GROUP: &str = "steps";

/// Times `step(offset)` on each of `frames` frames of `frame` bytes, in microseconds.
fn per_frame(
    frames: u64,
    frame: u64,
    mut step: impl FnMut(u64) -> std::io::Result<()>,
) -> Result<Vec<f64>, String> {
    (0..frames)
        .map(|i| {
            let started = Instant::now();
            step(i * frame).map_err(|e| e.to_string())?;
            Ok(started.elapsed().as_secs_f64() * 1e6)
        })
        .collect()
}

/// The per-frame steps on a memfd of `size` bytes of `kind`.
fn direct(kind: PoolKind, size: u64) -> Result<Vec<(&'static str, Vec<f64>)>, String> {
    let frame = kind.frame();
    let frames = size / frame;
    warm_pool(kind, size)?;
    let (file, map) = host::mapped_memfd(kind.huge_page().map(|(_, shift)| shift), size)
        .map_err(|e| e.to_string())?;
    let (len, fd) = (frame as usize, file.as_raw_fd());
    let at = |offset: u64| map.addr() + offset as usize;
    let populate = per_frame(frames, frame, |off| host::populate_write(at(off), len))?;
    let zero = per_frame(frames, frame, |off| {
        // SAFETY: the frame lies inside `map`, a read/write mapping only this function uses.
        unsafe { std::ptr::write_bytes(at(off) as *mut u8, 0, len) };
        Ok(())
    })?;
    let punch = per_frame(frames, frame, |off| punch_hole(&file, off, frame))?;
    let fallocate = per_frame(frames, frame, |off| host::fallocate(fd, 0, off, frame))?;
    let resident = per_frame(frames, frame, |off| {
        // SAFETY: the frame lies inside `map`, a read/write mapping only this function uses.
        unsafe { std::ptr::write_volatile((at(off) + 8) as *mut u64, 1) };
        Ok(())
    })?;
    let placeholder = Mapping::placeholder(len, len).map_err(|e| e.to_string())?;
    let slot = placeholder.addr();
    let mmap_fixed = per_frame(frames, frame, |off| {
        // SAFETY: the slot is all of `placeholder`, which only this function uses and which
        // holds nothing anyone relies on.
        let mapped = unsafe { map_shared_fixed(slot, len, fd, off, false) };
        // SAFETY: as above.
        let _ = unsafe { map_placeholder(slot, len) };
        mapped
    })?;
    Ok(vec![
        ("populate_p50", populate),
        ("fallocate_p50", fallocate),
        ("write_resident_p50", resident),
        ("zero_p50", zero),
        ("punch_p50", punch),
        ("mmap_fixed_p50", mmap_fixed),
    ])
}

/// The calling thread, as vCPU 0 of `memory`, writes one u64 per chunk; the time of each write.
fn touch_chunks(memory: &GuestMemory, frame: u64) -> Result<(Vec<f64>, FaultLatency), String> {
    memory.register_vcpu(0).map_err(|e| e.to_string())?;
    crate::pinning::pin_threads()?;
    let region = &memory.regions()[0];
    let times = per_frame(region.size() / frame, frame, |off| {
        let addr = region.host_addr() + off as usize + 8;
        // SAFETY: the address lies in the region's mapping; an unpopulated chunk is populated by
        // the fault handler before the write completes.
        unsafe { std::ptr::write_volatile(addr as *mut u64, 1) };
        Ok(())
    })?;
    Ok((times, handler_latency(memory)))
}

/// Lazy memory on fresh frames, and on frames zeroed on free but still resident.
fn in_guest_mem(kind: PoolKind, size: u64) -> Result<[(Vec<f64>, FaultLatency); 2], String> {
    warm_pool(kind, size)?;
    let fresh_pool = pool(kind, size, Scrub::PunchHole)?;
    let fresh = touch_chunks(&memory(&fresh_pool, size, Populate::Lazy)?, kind.frame())?;
    drop(fresh_pool);
    let resident_pool = pool(kind, size, Scrub::ZeroOnFree)?;
    // Eager memory faults every page in; its frames go back zeroed but resident.
    drop(memory(&resident_pool, size, Populate::Eager)?);
    let resident = touch_chunks(&memory(&resident_pool, size, Populate::Lazy)?, kind.frame())?;
    Ok([fresh, resident])
}

fn p50(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

fn once(
    report: &mut Report,
    key: &Key,
    run: usize,
    kind: PoolKind,
    size: u64,
) -> Result<(), String> {
    let steps = direct(kind, size)?;
    let [(fresh, fresh_handler), (resident, resident_handler)] = in_guest_mem(kind, size)?;
    let median_of = |name: &str| steps.iter().find(|(n, _)| *n == name).map(|(_, v)| p50(v));
    for (name, values) in &steps {
        report.add(key, run, name, "us", p50(values));
    }
    let populate = median_of("populate_p50").unwrap_or(f64::NAN);
    let gib_s = kind.frame() as f64 / GIB as f64 / (populate / 1e6);
    report.add(key, run, "populate_gib_s", "GiB/s", gib_s);
    report.add(key, run, "touch_fresh_p50", "us", p50(&fresh));
    report.add(key, run, "touch_fresh_p99", "us", quantile(&fresh, 0.99));
    report.add(
        key,
        run,
        "handler_fresh_p50",
        "us",
        fresh_handler.handling.p50_ns as f64 / 1e3,
    );
    report.add(key, run, "touch_resident_p50", "us", p50(&resident));
    report.add(
        key,
        run,
        "touch_resident_p99",
        "us",
        quantile(&resident, 0.99),
    );
    let handler = resident_handler.handling.p50_ns as f64 / 1e3;
    report.add(key, run, "handler_resident_p50", "us", handler);
    report.add(
        key,
        run,
        "handler_mmap_p50",
        "us",
        resident_handler.map.p50_ns as f64 / 1e3,
    );
    let wake = resident_handler.wake.p50_ns as f64 / 1e3;
    report.add(key, run, "handler_wake_p50", "us", wake);
    let write_resident = median_of("write_resident_p50").unwrap_or(f64::NAN);
    let transport = p50(&resident) - (handler - wake) - write_resident;
    report.add(key, run, "uffd_transport_p50", "us", transport);
    Ok(())
}

/// Runs the group.
pub fn run(args: &Args, report: &mut Report) {
    for kind in PoolKind::ALL {
        let max = match kind {
            PoolKind::Huge1G => args.giant_pages * GIB,
            _ => 256 * MIB,
        };
        let name = format!("{}/per-frame", kind.name());
        if !args.wants(&name) {
            continue;
        }
        // The memfd and the pool exist one after the other; each needs the pages.
        let skipped = Key::new(GROUP, name.clone(), max, "-");
        let Some((_pages, size)) = reserve_or_skip(report, &skipped, kind, max) else {
            continue;
        };
        let key = Key::new(GROUP, name, size, kind.frame_stride());
        report.repeat(&key, args.repeats, |report, run| {
            once(report, &key, run, kind, size)
        });
    }
}
