//! `llfree-bench`: the command-line front end of the benchmarks (see the crate docs).

use clap::{Args, Parser, Subcommand};
use llfree_bench::alloc_kind::AllocKind;
use llfree_bench::frag::{self, FragParams};
use llfree_bench::harness::{self, Bench, RunParams};
use llfree_bench::recover::{self, RecoverParams};
use llfree_bench::report::{write_csv, RunKey, Summary, CSV_HEADER};
use llfree_bench::units::parse_zone;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Benchmarks LLFree against buddy and list-based page-frame allocators.
#[derive(Parser)]
#[command(version, about)]
struct BenchCli {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Every thread allocates its share of half the zone, then frees it; repeated.
    Bulk(BenchRunArgs),
    /// Every thread allocates its share of the zone; frees in random order are timed.
    Rand(BenchRunArgs),
    /// With half the zone allocated, every thread allocates and frees one frame in a loop
    /// (a get+put pair is timed).
    Repeat(BenchRunArgs),
    /// Huge-frame fragmentation and compaction cost over reallocation rounds (paper §5.6).
    Frag(FragArgs),
    /// Recovery time of a persistent LLFree after a clean shutdown and after a crash (§5.7).
    Recover(RecoverArgs),
}

/// Options of bulk, rand and repeat.
#[derive(Args)]
struct BenchRunArgs {
    /// Allocators to compare in this run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "llfree,llfree-shared,llfree-vm,buddy,list-locked,list-cas,list-local"
    )]
    alloc: Vec<AllocKind>,
    /// Allocation orders (log2 of 4 KiB frames).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    order: Vec<usize>,
    /// Thread counts; thread t is pinned to allowed CPU t % nproc and uses core id t.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Zone size (K, M, G, T suffixes; a multiple of 2 MiB).
    #[arg(long, default_value = "8G", value_parser = parse_zone)]
    zone: usize,
    /// Timed iterations per run.
    #[arg(long, default_value_t = 5)]
    iterations: usize,
    /// Seed of the random order of `rand`.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Options of frag.
#[derive(Args)]
struct FragArgs {
    /// Allocators to compare (llfree and buddy).
    #[arg(long, value_delimiter = ',', default_value = "llfree,buddy")]
    alloc: Vec<AllocKind>,
    /// Zone size (K, M, G, T suffixes; a multiple of 2 MiB).
    #[arg(long, default_value = "8G", value_parser = parse_zone)]
    zone: usize,
    /// Reallocation rounds.
    #[arg(long, default_value_t = 100)]
    rounds: usize,
    /// Threads (core ids) freeing and allocating in parallel.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Seed of the random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the plot (free huge frames and compaction cost per round) to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// Options of recover.
#[derive(Args)]
struct RecoverArgs {
    /// Zone sizes (K, M, G, T suffixes; multiples of 2 MiB).
    #[arg(long, value_delimiter = ',', default_value = "8G,16G", value_parser = parse_zone)]
    zone: Vec<usize>,
    /// Timed recoveries per zone and shutdown kind.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The crash child is killed a random time up to this many milliseconds after it started.
    #[arg(long, default_value_t = 50)]
    max_crash_delay_ms: u64,
    /// Directory of the metadata file (default: the temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seed of the random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> ExitCode {
    let result = match BenchCli::parse().command {
        BenchCommand::Bulk(args) => run_harness(Bench::Bulk, &args),
        BenchCommand::Rand(args) => run_harness(Bench::Rand, &args),
        BenchCommand::Repeat(args) => run_harness(Bench::Repeat, &args),
        BenchCommand::Frag(args) => run_frag(&args),
        BenchCommand::Recover(args) => run_recover(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llfree-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error>;

fn run_harness(bench: Bench, args: &BenchRunArgs) -> Result<(), BoxError> {
    let frames = args.zone / llfree_bench::units::FRAME_SIZE;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{CSV_HEADER}")?;
    let mut summary = Summary::default();
    for &order in &args.order {
        let (kinds, skipped): (Vec<AllocKind>, Vec<AllocKind>) = args
            .alloc
            .iter()
            .partition(|kind| kind.supports_order(order));
        if kinds.is_empty() {
            return Err(format!("no selected allocator supports order {order}").into());
        }
        if !skipped.is_empty() {
            let names: Vec<_> = skipped.iter().map(|k| k.name()).collect();
            eprintln!(
                "order {order}: skipping {} (unsupported order)",
                names.join(", ")
            );
        }
        for &threads in &args.threads {
            for &kind in &kinds {
                let alloc = kind.create(threads, frames)?;
                let params = RunParams {
                    bench,
                    order,
                    threads,
                    iterations: args.iterations,
                    seed: args.seed,
                };
                let samples = harness::run(alloc.as_ref(), params)?;
                let key = RunKey {
                    alloc: alloc.name(),
                    bench,
                    order,
                    threads,
                    zone_bytes: args.zone,
                };
                write_csv(&mut stdout, &key, &samples)?;
                stdout.flush()?;
                summary.add(key, &samples);
            }
        }
    }
    summary.write(&mut std::io::stderr().lock())?;
    Ok(())
}

fn run_frag(args: &FragArgs) -> Result<(), BoxError> {
    let frames = args.zone / llfree_bench::units::FRAME_SIZE;
    let huge_frames = args.zone / llfree_bench::units::HUGE_SIZE;
    let params = FragParams {
        rounds: args.rounds,
        threads: args.threads.max(1),
        seed: args.seed,
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", frag::CSV_HEADER)?;
    let mut results = Vec::new();
    for &kind in &args.alloc {
        let alloc = frag::create(kind, params.threads, frames)?;
        let rounds = frag::run(alloc.as_ref(), params)?;
        frag::write_csv(&mut stdout, kind.name(), &rounds)?;
        if let (Some(first), Some(last)) = (rounds.first(), rounds.last()) {
            let cost = |r: &frag::FragRound| r.compaction_cost as f64;
            eprintln!(
                "{kind}: free huge frames {} -> {} of {huge_frames} ({:.1} % of the initially polluted \
                 huge frames recovered); compaction cost {} -> {} ({:.1} %)",
                first.free_huge,
                last.free_huge,
                frag::recovered_percent(&rounds, huge_frames),
                first.compaction_cost,
                last.compaction_cost,
                100.0 * cost(last) / cost(first).max(1.0),
            );
        }
        results.push((kind.name(), rounds));
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, frag::plot(&results))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

fn run_recover(args: &RecoverArgs) -> Result<(), BoxError> {
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "zone_bytes,shutdown,run,recovery_us,us_per_gib,free_frames"
    )?;
    for &zone in &args.zone {
        let params = RecoverParams {
            frames: zone / llfree_bench::units::FRAME_SIZE,
            runs: args.runs,
            max_crash_delay: Duration::from_millis(args.max_crash_delay_ms),
            dir: args.dir.clone().unwrap_or_else(std::env::temp_dir),
            seed: args.seed,
        };
        let gib = zone as f64 / (1u64 << 30) as f64;
        let samples = recover::run(&params)?;
        for s in &samples {
            let micros = s.duration.as_secs_f64() * 1e6;
            writeln!(
                stdout,
                "{zone},{:?},{},{micros:.1},{:.2},{}",
                s.shutdown,
                s.run,
                micros / gib,
                s.free_frames
            )?;
        }
        for shutdown in [recover::Shutdown::Clean, recover::Shutdown::Crash] {
            let mut micros: Vec<f64> = samples
                .iter()
                .filter(|s| s.shutdown == shutdown)
                .map(|s| s.duration.as_secs_f64() * 1e6)
                .collect();
            micros.sort_by(f64::total_cmp);
            if let Some(median) = micros.get(micros.len() / 2) {
                eprintln!(
                    "recover {:.0} GiB after {shutdown:?} shutdown: median {median:.1} us ({:.2} us/GiB) over {} runs",
                    gib,
                    median / gib,
                    micros.len()
                );
            }
        }
    }
    Ok(())
}
