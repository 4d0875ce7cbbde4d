//! zone-bench: what persistence costs guest memory in a zone.
//!
//! * `recovery`: time to open a zone (LLFree's recovery plus the frame-table cross-check) after
//!   a clean shutdown and after a SIGKILL, for zones whose every frame a VM holds, in µs and
//!   µs per GiB. The crash is real: a child process opens the zone and kills itself.
//! * `faults`: VMM-side population of every chunk of a VM (one write each: the pool allocation,
//!   the frame mapped over the chunk, the first page faulted in) and the discard of every chunk
//!   (scrub, free), with the persistent frame table of a VM in a zone against the volatile one
//!   of guest memory on the same zone's pool, interleaved runs, medians and their ratio.
//!
//! * `processes` and `handover`: several processes on one zone (see [`processes`]).
//!
//! Zone files go to `--dir` (default /dev/shm: tmpfs) and are removed afterwards.

mod processes;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use guest_mem::zone::{VmLayout, Zone, ZoneConfig, DEFAULT_MAX_VMS};
use guest_mem::{FrameSize, GuestMemory, MemoryConfig, Population};
use vm_memory::{Bytes, GuestAddress};

const GIB: u64 = 1 << 30;
const CHUNK: u64 = 2 << 20;
/// The hidden mode of the child process that crashes on a zone.
const CRASH_ENV: &str = "ZONE_BENCH_CRASH";

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "What persistent zones cost: recovery time and the fault path")]
struct Args {
    /// Where the zone files go.
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Zone sizes in GiB (every frame held by one VM).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    sizes: Vec<u64>,
    /// Measurements per case (medians are reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// What to measure: recovery, faults, processes, handover.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "recovery,faults,processes,handover"
    )]
    groups: Vec<String>,
}

fn layout(size: u64) -> VmLayout {
    VmLayout {
        chunk_size: FrameSize::Huge,
        regions: vec![(0, size)],
    }
}

fn memory_config(size: u64) -> MemoryConfig {
    MemoryConfig::new(vec![(GuestAddress(0), size)], 1)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Writes one byte into every chunk of `memory` (`size` bytes); returns the time per chunk.
fn populate(memory: &GuestMemory, size: u64) -> Duration {
    let started = Instant::now();
    for chunk in 0..size / CHUNK {
        memory
            .write_obj(1u8, GuestAddress(chunk * CHUNK))
            .expect("write");
    }
    started.elapsed() / (size / CHUNK) as u32
}

/// Discards every chunk; returns the time per chunk.
fn discard(memory: &GuestMemory, size: u64) -> Duration {
    let mut core = memory.pool().core_frames(memory.vmm_core());
    let started = Instant::now();
    for chunk in 0..size / CHUNK {
        memory
            .discard(GuestAddress(chunk * CHUNK), CHUNK, &mut core)
            .expect("discard");
    }
    started.elapsed() / (size / CHUNK) as u32
}

/// A new zone of `size` bytes of 2 MiB frames, file `name` in `dir`, opened.
fn new_zone(dir: &Path, name: &str, size: u64) -> (PathBuf, Arc<Zone>) {
    let path = dir.join(format!("zone-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let config = ZoneConfig {
        size,
        frame_size: FrameSize::Huge,
        max_vms: DEFAULT_MAX_VMS,
    };
    Zone::create(&path, &config).expect("create");
    let zone = Zone::open(&path, 2).expect("open");
    (path, zone)
}

/// A zone of `size` bytes in `dir` whose VM "bench" holds every frame.
fn full_zone(dir: &Path, size: u64) -> PathBuf {
    let (path, zone) = new_zone(dir, &(size / GIB).to_string(), size);
    let vm = zone.attach("bench", &layout(size)).expect("attach");
    let memory =
        GuestMemory::new_in_zone(vm, memory_config(size), &Population::default()).expect("memory");
    populate(&memory, size);
    path
}

/// Opens the zone in a child process that then kills itself with SIGKILL.
fn crash_on(path: &Path) {
    let status = Command::new(std::env::current_exe().expect("exe"))
        .env(CRASH_ENV, path)
        .status()
        .expect("child");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
}

fn recovery(args: &Args) {
    println!("## recovery: open after a clean shutdown and after SIGKILL, every frame held");
    println!("| zone | clean, µs | crash, µs | crash, µs/GiB | leaked, lost |");
    println!("|---|---|---|---|---|");
    for &gib in &args.sizes {
        let path = full_zone(&args.dir, gib * GIB);
        let mut clean = Vec::new();
        let mut crash = Vec::new();
        let mut found = (0, 0);
        for _ in 0..args.repeats {
            let zone = Zone::open(&path, 2).expect("open");
            clean.push(zone.recovery().nanos as f64 / 1e3);
            drop(zone);
            crash_on(&path);
            let zone = Zone::open(&path, 2).expect("open after the crash");
            let report = zone.recovery();
            assert_eq!(report.kind, guest_mem::zone::RecoveryKind::Crash);
            crash.push(report.nanos as f64 / 1e3);
            found.0 += report.leaked_frames;
            found.1 += report.lost_frames;
            let info = zone.info().expect("info");
            assert_eq!(info.free_frames, 0, "the VM holds every frame");
        }
        let crash = median(crash);
        println!(
            "| {gib} GiB | {:.0} | {crash:.0} | {:.1} | {}, {} |",
            median(clean),
            crash / gib as f64,
            found.0,
            found.1
        );
        let _ = std::fs::remove_file(&path);
    }
}

fn faults(args: &Args) {
    let size = args.sizes.first().copied().unwrap_or(1) * GIB;
    println!(
        "## faults: VMM-side population and discard of {} chunks of 2 MiB, {} runs each",
        size / CHUNK,
        args.repeats
    );
    let (path, zone) = new_zone(&args.dir, "faults", size);
    let mut times: [[Vec<f64>; 2]; 2] = Default::default();
    for _ in 0..args.repeats {
        for persistent in [false, true] {
            let memory = if persistent {
                let vm = zone.attach("bench", &layout(size)).expect("attach");
                GuestMemory::new_in_zone(vm, memory_config(size), &Population::default())
            } else {
                GuestMemory::new(Arc::clone(zone.pool()), memory_config(size))
            }
            .expect("memory");
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            times[0][usize::from(persistent)].push(us(populate(&memory, size)));
            times[1][usize::from(persistent)].push(us(discard(&memory, size)));
        }
    }
    println!("| per chunk | volatile table, µs | persistent table, µs | ratio |");
    println!("|---|---|---|---|");
    for (name, [volatile, persistent]) in ["populate", "discard"].iter().zip(times) {
        let (v, p) = (median(volatile), median(persistent));
        println!("| {name} | {v:.2} | {p:.2} | {:.3} |", p / v);
    }
    drop(zone);
    let _ = std::fs::remove_file(&path);
}

fn main() {
    if let Ok(spec) = std::env::var(processes::WORKER_ENV) {
        return processes::worker(&spec);
    }
    if let Some(path) = std::env::var_os(CRASH_ENV) {
        let _zone = Zone::open(Path::new(&path), 2).expect("open");
        // SAFETY: kill only sends a signal; this process ends at once, as a crash would.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!("SIGKILL");
    }
    let args = Args::parse();
    if args.sizes.is_empty() || args.sizes.contains(&0) || args.repeats == 0 {
        eprintln!("error: sizes and repeats must be at least 1");
        std::process::exit(2);
    }
    for group in &args.groups {
        match group.as_str() {
            "recovery" => recovery(&args),
            "faults" => faults(&args),
            "processes" => processes::processes(&args),
            "handover" => processes::handover(&args),
            other => {
                eprintln!("error: unknown group {other} (recovery, faults, processes, handover)");
                std::process::exit(2);
            }
        }
    }
}
