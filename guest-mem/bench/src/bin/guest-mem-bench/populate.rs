//! Group `populate`: time until the guest has touched all of its RAM, split into the part before
//! the guest runs (building the memory: eager population, prefaulting) and the guest's run.

use std::time::Duration;

use crate::guest::{BenchGuest, Stride};
use crate::report::{Key, Report};
use guest_mem::testing::HugePageReservation;

use crate::subject::{reserve, PoolKind, PopulateMode, Ram, Subject};
use crate::{Args, GIB, MIB};

const GROUP: &str = "populate";
/// What the guest writes.
const MARKER: u32 = 0x5A5A_0001;

/// One measurement.
struct Sample {
    setup: Duration,
    guest: Duration,
    faults: Option<u64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Builds `size` bytes of `subject` and lets the guest touch all of it with `stride`.
fn once(subject: Subject, size: u64, stride: Stride) -> Result<Sample, String> {
    let (ram, setup) = Ram::build(subject, size)?;
    let mut guest = BenchGuest::new(&ram)?;
    let (guest_time, old) = guest.touch_all(stride, MARKER)?;
    if old != 0 {
        return Err(format!("fresh memory read {old:#x}"));
    }
    let faults = ram.memory().map(|m| m.stats().faults);
    Ok(Sample {
        setup,
        guest: guest_time,
        faults,
    })
}

fn record(report: &mut Report, key: &Key, run: usize, sample: &Sample) {
    report.add(key, run, "setup_ms", "ms", ms(sample.setup));
    report.add(key, run, "guest_ms", "ms", ms(sample.guest));
    report.add(key, run, "total_ms", "ms", ms(sample.setup + sample.guest));
    if let Some(faults) = sample.faults {
        report.add(key, run, "uffd_faults", "count", faults as f64);
    }
}

/// Every (size, subject, stride) of `sizes`, `subjects` and `strides`.
fn cases<'a>(
    sizes: &'a [u64],
    subjects: &'a [Subject],
    strides: &'a [Stride],
) -> impl Iterator<Item = (u64, Subject, Stride)> + 'a {
    sizes.iter().flat_map(move |&size| {
        subjects
            .iter()
            .flat_map(move |&subject| strides.iter().map(move |&stride| (size, subject, stride)))
    })
}

/// Measures every wanted (size, subject, stride) `args.repeats` times; a case that fails once
/// is skipped from then on.
fn measure(args: &Args, report: &mut Report, subjects: &[Subject], sizes: &[u64]) {
    let mut failed = Vec::new();
    for run in 0..args.repeats {
        for (size, subject, stride) in cases(sizes, subjects, &args.strides) {
            let key = Key::new(GROUP, subject.name(), size, stride.name());
            if failed.contains(&key) {
                continue;
            }
            match once(subject, size, stride) {
                Ok(sample) => record(report, &key, run, &sample),
                Err(why) => {
                    report.skip(&key, &why);
                    failed.push(key);
                }
            }
        }
    }
}

/// Pages reserved for the largest size that could be had, and that size.
type Reserved = Option<(Option<HugePageReservation>, u64)>;

/// Reserves the huge pages for the largest of `sizes` that can be had (for all runs of `kind`);
/// returns them (if any) and why the larger sizes could not be had.
fn reserve_largest(kind: PoolKind, sizes: &[u64]) -> (Reserved, String) {
    let mut failure = None;
    for &size in sizes.iter().rev() {
        match reserve(kind, size) {
            Ok(pages) => return (Some((pages, size)), failure.unwrap_or_default()),
            Err(why) => failure = failure.or(Some(why)),
        }
    }
    (None, failure.unwrap_or_else(|| "no huge pages".into()))
}

/// The modes measured for pools.
const MODES: [PopulateMode; 2] = [PopulateMode::Eager, PopulateMode::Lazy];

/// Runs the group.
pub fn run(args: &Args, report: &mut Report) {
    let sizes: Vec<u64> = args.sizes.iter().map(|s| s * MIB).collect();
    // Baselines for every size a 1 GiB pool may end up with.
    let giant_sizes = (1..=args.giant_pages).map(|n| n * GIB);
    let mut plain_sizes: Vec<u64> = sizes.iter().copied().chain(giant_sizes).collect();
    plain_sizes.sort_unstable();
    plain_sizes.dedup();
    let plain: Vec<Subject> = [(false, false), (true, false), (true, true)]
        .into_iter()
        .map(|(thp, prefault)| Subject::Plain { thp, prefault })
        .filter(|s| args.wants(&s.name()))
        .collect();
    measure(args, report, &plain, &plain_sizes);
    for kind in PoolKind::ALL {
        let subjects: Vec<Subject> = MODES
            .into_iter()
            .map(|mode| Subject::Pool(kind, mode))
            .filter(|s| args.wants(&s.name()))
            .collect();
        if subjects.is_empty() {
            continue;
        }
        let candidates: Vec<u64> = match kind {
            PoolKind::Huge1G => (1..=args.giant_pages).map(|n| n * GIB).collect(),
            _ => sizes.clone(),
        };
        let (reserved, failure) = reserve_largest(kind, &candidates);
        let largest = reserved.as_ref().map_or(0, |(_, size)| *size);
        let wanted = match kind {
            PoolKind::Huge1G => vec![GIB, args.giant_pages * GIB],
            _ => sizes.clone(),
        };
        let (fit, too_big): (Vec<u64>, Vec<u64>) = wanted.iter().partition(|&&s| s <= largest);
        for (size, subject, stride) in cases(&too_big, &subjects, &args.strides) {
            report.skip(
                &Key::new(GROUP, subject.name(), size, stride.name()),
                &failure,
            );
        }
        let mut fit: Vec<u64> = fit
            .into_iter()
            .chain((largest > 0).then_some(largest))
            .collect();
        fit.sort_unstable();
        fit.dedup();
        measure(args, report, &subjects, &fit);
    }
    add_ratios(args, report, &plain_sizes);
}

/// Total time relative to plain anonymous memory with THP of the same size and stride.
fn add_ratios(args: &Args, report: &mut Report, sizes: &[u64]) {
    let baseline = Subject::Plain {
        thp: true,
        prefault: false,
    }
    .name();
    for &size in sizes {
        for stride in &args.strides {
            let base_key = Key::new(GROUP, baseline.clone(), size, stride.name());
            let Some(base) = report.median(&base_key, "total_ms") else {
                continue;
            };
            for kind in PoolKind::ALL {
                for mode in MODES {
                    let key =
                        Key::new(GROUP, Subject::Pool(kind, mode).name(), size, stride.name());
                    if let Some(total) = report.median(&key, "total_ms") {
                        report.add_derived(&key, "total_vs_plain_thp", "ratio", total / base);
                    }
                }
            }
        }
    }
}
