//! balloon-bench: host-side cost of the virtio-balloon over guest-mem, against what QEMU and
//! Firecracker do with the same guest pages (`madvise(MADV_DONTNEED)` on private anonymous
//! memory).
//!
//! * Throughput of inflate processing: buffers of 256 page frame numbers, as Linux sends them,
//!   in ascending order and descending (the device sorts each buffer, then coalesces runs),
//!   against one `MADV_DONTNEED` per 4 KiB page (QEMU's inflate).
//! * Throughput of free page reporting: 4 MiB ranges, 32 per chain (merged by the device), and
//!   2 MiB ranges in descending order (not mergeable), against `MADV_DONTNEED` per range.
//! * Latency from a report of one 2 MiB chunk, notified through the QueueNotify register (as a
//!   KVM ioeventfd would) and processed by an event-loop thread, to its frame being free in the
//!   pool; and of the device's processing alone.
//!
//! Every measured page is resident before it is discarded. Medians of `--runs` runs.

mod baseline;
mod guest;

use std::time::Duration;

use clap::{Parser, ValueEnum};
use guest_mem::testing::{restore_huge_pages_now, HugePageReservation};
use guest_mem::Backing;

use baseline::Anonymous;
use guest::{pool_size, MeasuredBalloon};

/// 4 KiB.
pub const PAGE: u64 = 4096;
/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 2 MiB: the pool's frames.
pub const HUGE: u64 = 2 * MIB;

/// Order of the pages of a buffer or of the reported ranges.
#[derive(Debug, Clone, Copy)]
pub enum PfnOrder {
    /// Consecutive, ascending.
    Ascending,
    /// Descending: inflate buffers are sorted by the device; reported ranges cannot merge.
    Descending,
}

/// The pool memory of the measured guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PoolBacking {
    /// A memfd of 4 KiB pages (the tests' pool).
    Anonymous,
    /// A hugetlb memfd of 2 MiB pages (reserved through sysfs, the old setting restored).
    Hugetlb2m,
}

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "Host-side cost of the virtio-balloon against MADV_DONTNEED")]
struct Args {
    /// Measured memory in MiB (a multiple of 4).
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Runs of every throughput measurement (medians are reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Samples of every latency measurement.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Pool memories to measure the balloon on.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "anonymous,hugetlb2m"
    )]
    backings: Vec<PoolBacking>,
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn percentile(mut values: Vec<Duration>, percent: usize) -> Duration {
    values.sort();
    values[(values.len() * percent / 100).min(values.len() - 1)]
}

fn gib_per_s(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / time.as_secs_f64()
}

/// Prints one throughput line.
fn throughput(name: &str, bytes: u64, runs: Vec<(Duration, u64)>) {
    let freed = runs.iter().map(|r| r.1).min().unwrap_or(0);
    let time = median(runs.into_iter().map(|r| r.0).collect());
    let rate = gib_per_s(bytes, time);
    println!(
        "  {name:<58} {rate:>7.2} GiB/s  {:>9.1} ms  pool +{} MiB",
        time.as_secs_f64() * 1e3,
        freed / MIB
    );
}

fn baseline(name: &str, bytes: u64, times: Vec<Duration>) {
    let time = median(times);
    let rate = gib_per_s(bytes, time);
    println!(
        "  {name:<58} {rate:>7.2} GiB/s  {:>9.1} ms",
        time.as_secs_f64() * 1e3
    );
}

fn latency(name: &str, samples: Vec<Duration>) {
    let med = median(samples.clone());
    let p99 = percentile(samples, 99);
    println!(
        "  {name:<58} median {:>8.1} us  p99 {:>8.1} us",
        med.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
}

fn host() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = read("/proc/sys/kernel/osrelease");
    let thp = read("/sys/kernel/mm/transparent_hugepage/enabled");
    format!(
        "{cpu}, {cpus} CPUs, Linux {}, THP {}",
        kernel.trim(),
        thp.trim()
    )
}

/// The balloon's figures on one pool memory.
fn measure_balloon(args: &Args, backing: PoolBacking) -> Result<(), String> {
    let size = args.size_mib * MIB;
    let (pool, _huge_pages) = match backing {
        PoolBacking::Anonymous => (Backing::Anonymous, None),
        PoolBacking::Hugetlb2m => {
            let pages = HugePageReservation::reserve(2048, pool_size(size) / HUGE)?;
            (Backing::Hugetlb2M, Some(pages))
        }
    };
    println!("llfree-vmm balloon on a {backing:?} pool of 2 MiB frames:");
    let guest = MeasuredBalloon::new(size, pool)?;
    let runs = args.runs.max(1);
    let repeat = |f: &dyn Fn() -> (Duration, u64)| (0..runs).map(|_| f()).collect::<Vec<_>>();
    throughput(
        "inflate, 256-page buffers, ascending (runs coalesced)",
        size,
        repeat(&|| guest.inflate(PfnOrder::Ascending)),
    );
    throughput(
        "inflate, 256-page buffers, descending (sorted, coalesced)",
        size,
        repeat(&|| guest.inflate(PfnOrder::Descending)),
    );
    throughput(
        "report, 32 x 4 MiB ranges per chain, ascending (merged)",
        size,
        repeat(&|| guest.report(PfnOrder::Ascending)),
    );
    throughput(
        "report, 32 x 2 MiB ranges per chain, descending",
        size,
        repeat(&|| guest.report(PfnOrder::Descending)),
    );
    let (through_loop, direct) = guest.report_latency(args.samples)?;
    latency(
        "report 2 MiB: QueueNotify -> event loop -> frame free",
        through_loop,
    );
    latency("report 2 MiB: device processing alone", direct);
    Ok(())
}

/// What QEMU and Firecracker do with the same amount of private anonymous memory.
fn measure_baseline(args: &Args, thp: bool) -> Result<(), String> {
    let size = args.size_mib * MIB;
    let pages = if thp { "THP" } else { "4 KiB pages" };
    println!("MADV_DONTNEED on private anonymous memory, {pages}:");
    let memory = Anonymous::new(size, thp)?;
    let runs = args.runs.max(1);
    for (name, piece) in [
        ("per 4 KiB page (QEMU inflate)", PAGE),
        ("per 4 MiB range (reporting)", 4 * MIB),
    ] {
        let times = (0..runs)
            .map(|_| memory.discard(piece))
            .collect::<Result<_, _>>()?;
        baseline(name, size, times);
    }
    let chunk = Anonymous::new(HUGE, thp)?;
    latency(
        "2 MiB in one call",
        chunk.discard_latency(HUGE, args.samples)?,
    );
    latency(
        "2 MiB as 512 x 4 KiB",
        chunk.discard_latency(PAGE, args.samples)?,
    );
    Ok(())
}

fn run(args: &Args) -> Result<(), String> {
    if args.size_mib == 0 || !args.size_mib.is_multiple_of(4) {
        return Err(format!(
            "--size-mib {} is not a positive multiple of 4",
            args.size_mib
        ));
    }
    println!(
        "balloon-bench: {} MiB, medians of {} runs, {} latency samples; host: {}",
        args.size_mib,
        args.runs.max(1),
        args.samples,
        host()
    );
    for backing in &args.backings {
        measure_balloon(args, *backing)?;
    }
    measure_baseline(args, true)?;
    measure_baseline(args, false)
}

fn main() {
    let args = Args::parse();
    let result = run(&args);
    restore_huge_pages_now();
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
