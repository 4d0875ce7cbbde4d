//! Group `faults`: per-fault latency of lazy population.
//!
//! * In the handler: guest-mem's own histograms (fault message read to UFFDIO_WAKE returned,
//!   the mmap of the frame, the wake ioctl).
//! * As the guest sees it: the stepped program exits to the VMM after every touch, which times
//!   each touch from one exit to the next. The same is measured for the first touch of a mapped
//!   memfd of the pool's kind outside guest-mem (kernel allocation and zeroing, but no
//!   userfaultfd) and for touching populated memory again (the cost of the exits themselves).

use std::time::{Duration, Instant};

use guest_mem::{GuestMemory, LatencySummary, Populate, Scrub};
use vm_memory::GuestAddress;

use crate::guest::{BenchGuest, Stride};
use crate::host;
use crate::report::{quantile, Key, Report};
use crate::subject::{memory, pool, reserve_or_skip, warm_pool, PoolKind, Ram};
use crate::{Args, GIB};

const GROUP: &str = "faults";
const MARKER: u32 = 0x5A5A_0002;

fn us(d: &[Duration]) -> Vec<f64> {
    d.iter().map(|d| d.as_secs_f64() * 1e6).collect()
}

/// Touch times of one run: first touches of lazy chunks and of mapped memfd memory, and touches
/// of populated chunks.
#[derive(Default)]
struct Touches {
    lazy: Vec<Duration>,
    mapped: Vec<Duration>,
    hot: Vec<Duration>,
}

/// Waits until the handler has recorded the latency of every fault (it does so after waking the
/// vCPU), then returns its summaries.
pub fn handler_latency(memory: &GuestMemory) -> guest_mem::FaultLatency {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let stats = memory.stats();
        if stats.fault_latency.handling.count >= stats.faults || Instant::now() > deadline {
            return stats.fault_latency;
        }
        std::thread::yield_now();
    }
}

/// Lazy memory on a fresh pool of `size` bytes of `kind`, then (the pool gone) a mapped memfd of
/// that kind, `cycles` times each.
fn once(
    kind: PoolKind,
    size: u64,
    cycles: usize,
) -> Result<(Touches, guest_mem::FaultLatency, u64), String> {
    let stride = Stride::parse(kind.frame_stride())?;
    let pool = pool(kind, size, Scrub::PunchHole)?;
    let mut core = pool.core_frames(pool.claim_cores(1));
    let mut touches = Touches::default();
    warm_pool(kind, size)?;
    let ram = Ram::Pool(memory(&pool, size, Populate::Lazy)?);
    let lazy = ram.memory().expect("pool memory");
    let mut guest = BenchGuest::new(&ram)?;
    for cycle in 0..cycles {
        if cycle > 0 {
            lazy.discard(GuestAddress(0), size, &mut core)
                .map_err(|e| e.to_string())?;
        }
        let (times, old) = guest.touch_each(stride, MARKER)?;
        if old != 0 {
            return Err(format!("a lazily populated chunk read {old:#x}"));
        }
        touches.lazy.extend(times);
    }
    touches.hot = guest.touch_each(stride, MARKER)?.0;
    let latency = handler_latency(lazy);
    let faults = lazy.stats().faults;
    drop(guest);
    drop(ram);
    // The memfd takes the pool's huge pages.
    drop(pool);
    for _ in 0..cycles {
        warm_pool(kind, size)?;
        let (_file, map) = host::mapped_memfd(kind.huge_page().map(|(_, shift)| shift), size)
            .map_err(|e| e.to_string())?;
        let ram = Ram::Plain(map);
        let mut guest = BenchGuest::new(&ram)?;
        touches.mapped.extend(guest.touch_each(stride, MARKER)?.0);
    }
    Ok((touches, latency, faults))
}

fn add_summary(
    report: &mut Report,
    key: &Key,
    run: usize,
    name: [&'static str; 2],
    s: LatencySummary,
) {
    report.add(key, run, name[0], "us", s.p50_ns as f64 / 1e3);
    report.add(key, run, name[1], "us", s.p99_ns as f64 / 1e3);
}

fn record(
    report: &mut Report,
    key: &Key,
    run: usize,
    touches: &Touches,
    latency: guest_mem::FaultLatency,
    faults: u64,
) {
    let (lazy, mapped, hot) = (us(&touches.lazy), us(&touches.mapped), us(&touches.hot));
    let p50 = |v: &[f64]| quantile(v, 0.5);
    report.add(key, run, "faults", "count", faults as f64);
    report.add(key, run, "guest_lazy_p50", "us", p50(&lazy));
    report.add(key, run, "guest_lazy_p99", "us", quantile(&lazy, 0.99));
    report.add(key, run, "guest_mapped_p50", "us", p50(&mapped));
    report.add(key, run, "guest_mapped_p99", "us", quantile(&mapped, 0.99));
    report.add(key, run, "guest_populated_p50", "us", p50(&hot));
    add_summary(
        report,
        key,
        run,
        ["handler_p50", "handler_p99"],
        latency.handling,
    );
    add_summary(
        report,
        key,
        run,
        ["handler_mmap_p50", "handler_mmap_p99"],
        latency.map,
    );
    add_summary(
        report,
        key,
        run,
        ["handler_wake_p50", "handler_wake_p99"],
        latency.wake,
    );
    // What lazy population adds to a first touch, and what a first touch adds to a touch.
    report.add(key, run, "uffd_added_p50", "us", p50(&lazy) - p50(&mapped));
    report.add(
        key,
        run,
        "first_touch_added_p50",
        "us",
        p50(&mapped) - p50(&hot),
    );
}

/// Runs the group.
pub fn run(args: &Args, report: &mut Report) {
    for kind in PoolKind::ALL {
        let (max, cycles) = match kind {
            PoolKind::Huge1G => (args.giant_pages * GIB, args.giant_cycles),
            _ => (GIB, 1),
        };
        let name = format!("{}/lazy-vs-mapped", kind.name());
        if !args.wants(&name) {
            continue;
        }
        let skipped = Key::new(GROUP, name.clone(), max, kind.frame_stride());
        let Some((_pages, size)) = reserve_or_skip(report, &skipped, kind, max) else {
            continue;
        };
        let key = Key::new(GROUP, name, size, kind.frame_stride());
        report.repeat(&key, args.repeats, |report, run| {
            let (touches, latency, faults) = once(kind, size, cycles)?;
            record(report, &key, run, &touches, latency, faults);
            Ok(())
        });
    }
}
