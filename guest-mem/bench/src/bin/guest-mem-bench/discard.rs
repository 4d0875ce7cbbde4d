//! Group `discard`: discarding fully resident guest memory (whole chunks back to the pool) with
//! both scrub policies, then the guest touching it all again (lazy re-population); against
//! plain anonymous memory discarded with MADV_DONTNEED.

use std::time::{Duration, Instant};

use guest_mem::{Populate, Scrub};
use vm_memory::GuestAddress;

use crate::guest::{BenchGuest, Stride};
use crate::host;
use crate::report::{Key, Report};
use crate::subject::{memory, pool, reserve_or_skip, warm_pool, PoolKind, Ram, Subject};
use crate::{Args, GIB};

const GROUP: &str = "discard";
const MARKER: u32 = 0x5A5A_0003;

/// One run: the discard, and the re-population with each stride.
struct Sample {
    discard: Duration,
    repopulate: Vec<(Stride, Duration)>,
}

/// Discards all of `ram` (made fully resident first) with `discard`, then lets the guest touch
/// it again with each stride (discarding again in between).
fn cycle(
    ram: &Ram,
    strides: &[Stride],
    discard: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Sample, String> {
    let mut guest = BenchGuest::new(ram)?;
    let mut sample = Sample {
        discard: Duration::ZERO,
        repopulate: Vec::new(),
    };
    for (i, &stride) in strides.iter().enumerate() {
        host::populate_write(ram.host_addr(), ram.size() as usize).map_err(|e| e.to_string())?;
        let started = Instant::now();
        discard()?;
        if i == 0 {
            sample.discard = started.elapsed();
        }
        let (time, old) = guest.touch_all(stride, MARKER)?;
        if old != 0 {
            return Err(format!("discarded memory read {old:#x}"));
        }
        sample.repopulate.push((stride, time));
    }
    Ok(sample)
}

fn pool_once(
    kind: PoolKind,
    scrub: Scrub,
    size: u64,
    strides: &[Stride],
) -> Result<Sample, String> {
    warm_pool(kind, size)?;
    let pool = pool(kind, size, scrub)?;
    let mut core = pool.core_frames(pool.claim_cores(1));
    let ram = Ram::Pool(memory(&pool, size, Populate::Eager)?);
    let memory = ram.memory().expect("pool memory");
    cycle(&ram, strides, &mut || {
        let stats = memory
            .discard(GuestAddress(0), size, &mut core)
            .map_err(|e| e.to_string())?;
        let chunks = (size / kind.frame()) as usize;
        match stats.freed_chunks == chunks {
            true => Ok(()),
            false => Err(format!("{} of {chunks} chunks freed", stats.freed_chunks)),
        }
    })
}

fn plain_once(thp: bool, size: u64, strides: &[Stride]) -> Result<Sample, String> {
    let subject = Subject::Plain {
        thp,
        prefault: false,
    };
    let (ram, _) = Ram::build(subject, size)?;
    let (addr, len) = (ram.host_addr(), size as usize);
    cycle(&ram, strides, &mut || {
        host::madvise(addr, len, libc::MADV_DONTNEED).map_err(|e| e.to_string())
    })
}

fn record(report: &mut Report, key: &Key, run: usize, size: u64, sample: &Sample) {
    let secs = sample.discard.as_secs_f64();
    report.add(key, run, "discard_ms", "ms", secs * 1e3);
    report.add(
        key,
        run,
        "discard_gib_s",
        "GiB/s",
        size as f64 / GIB as f64 / secs,
    );
    for &(stride, time) in &sample.repopulate {
        let metric = match stride {
            Stride::Page => "repopulate_4k_ms",
            Stride::Huge => "repopulate_2m_ms",
            Stride::Giant => "repopulate_1g_ms",
        };
        report.add(key, run, metric, "ms", time.as_secs_f64() * 1e3);
    }
}

/// Runs the group.
pub fn run(args: &Args, report: &mut Report) {
    let strides = &args.strides;
    for thp in [false, true] {
        let name = format!(
            "plain-anon-{}/madv-dontneed",
            if thp { "thp" } else { "4k" }
        );
        if !args.wants(&name) {
            continue;
        }
        let key = Key::new(GROUP, name, GIB, "-");
        report.repeat(&key, args.repeats, |report, run| {
            let sample = plain_once(thp, GIB, strides)?;
            record(report, &key, run, GIB, &sample);
            Ok(())
        });
    }
    for kind in PoolKind::ALL {
        let max = match kind {
            PoolKind::Huge1G => args.giant_pages * GIB,
            _ => GIB,
        };
        for scrub in [Scrub::PunchHole, Scrub::ZeroOnFree] {
            let policy = match scrub {
                Scrub::PunchHole => "punch-hole",
                Scrub::ZeroOnFree => "zero-on-free",
            };
            let name = format!("{}/{policy}", kind.name());
            if !args.wants(&name) {
                continue;
            }
            let skipped = Key::new(GROUP, name.clone(), max, "-");
            let Some((_pages, size)) = reserve_or_skip(report, &skipped, kind, max) else {
                continue;
            };
            let key = Key::new(GROUP, name, size, "-");
            report.repeat(&key, args.repeats, |report, run| {
                let sample = pool_once(kind, scrub, size, strides)?;
                record(report, &key, run, size, &sample);
                Ok(())
            });
        }
    }
}
