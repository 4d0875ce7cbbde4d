//! Zone-bench groups with several processes on one zone (children of this binary in a hidden
//! worker mode, `ZONE_BENCH_WORKER`):
//!
//! * `processes`: 2 MiB population throughput (allocate, publish, map, fault in the first page;
//!   then discard) of 1, 2 and 4 processes at once, sharing one zone, against each process with
//!   a zone of its own, in the same run.
//! * `handover`: from one process discarding a chunk (its VM reporting memory free) until
//!   another process's fault, waiting on the exhausted zone, is served; and the time a survivor
//!   takes to recover a SIGKILLed process while one of its threads keeps allocating.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guest_mem::zone::{Zone, ZoneConfig, DEFAULT_MAX_VMS};
use guest_mem::{FrameSize, GuestMemory, Population};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::{layout, median, memory_config, Args, CHUNK};

/// The hidden mode of the worker processes.
pub const WORKER_ENV: &str = "ZONE_BENCH_WORKER";
/// Guest RAM of each process in `processes`.
const PER_PROCESS: u64 = 256 << 20;
/// Populate-and-discard rounds of each process in `processes`.
const ROUNDS: u32 = 20;
/// Hand-overs measured.
const HANDOVERS: usize = 50;

/// CLOCK_MONOTONIC in nanoseconds: comparable between processes (`Instant` is not).
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec into `now`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

fn create(path: &Path, size: u64) {
    let _ = std::fs::remove_file(path);
    let config = ZoneConfig {
        size,
        frame_size: FrameSize::Huge,
        max_vms: DEFAULT_MAX_VMS,
    };
    Zone::create(path, &config).expect("create");
}

/// A worker process and its pipes.
struct Worker {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(spec: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("exe"))
            .env(WORKER_ENV, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("worker");
        let to = child.stdin.take().expect("stdin");
        let from = BufReader::new(child.stdout.take().expect("stdout"));
        Worker { child, to, from }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.to, "{line}").expect("to worker");
        self.to.flush().expect("to worker");
    }

    fn expect(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.from.read_line(&mut line).expect("from worker") > 0,
                "worker ended"
            );
            if let Some(rest) = line.trim_end().strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
    }
}

/// Reads the parent's next command line.
fn command() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    line.trim().to_owned()
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().expect("stdout");
}

/// A worker: `throughput,ZONE,NAME` or `holder,ZONE`.
pub fn worker(spec: &str) {
    let parts: Vec<&str> = spec.split(',').collect();
    match parts[..] {
        ["throughput", zone, name] => throughput_worker(Path::new(zone), name),
        ["holder", zone] => holder_worker(Path::new(zone)),
        _ => panic!("bad worker spec {spec}"),
    }
}

/// Populates and discards its VM's RAM `ROUNDS` times once told to go; says how long it took.
fn throughput_worker(path: &Path, name: &str) {
    let zone = Zone::open(path, 2).expect("open");
    let vm = zone.attach(name, &layout(PER_PROCESS)).expect("attach");
    let memory = GuestMemory::new_in_zone(vm, memory_config(PER_PROCESS), &Population::default())
        .expect("memory");
    let mut core = memory.pool().core_frames(memory.vmm_core());
    say("ready");
    assert_eq!(command(), "go");
    let started = Instant::now();
    for _ in 0..ROUNDS {
        for chunk in 0..PER_PROCESS / CHUNK {
            memory
                .write_obj(1u8, GuestAddress(chunk * CHUNK))
                .expect("write");
        }
        memory
            .discard(GuestAddress(0), PER_PROCESS, &mut core)
            .expect("discard");
    }
    say(&format!("done {}", started.elapsed().as_nanos()));
}

/// Holds one populated chunk; on `give` discards it and says when, on `take` populates it again.
fn holder_worker(path: &Path) {
    let zone = Zone::open(path, 2).expect("open");
    let vm = zone.attach("holder", &layout(2 * CHUNK)).expect("attach");
    let memory = GuestMemory::new_in_zone(vm, memory_config(2 * CHUNK), &Population::default())
        .expect("memory");
    let mut core = memory.pool().core_frames(memory.vmm_core());
    memory.write_obj(1u8, GuestAddress(0)).expect("write");
    memory.write_obj(1u8, GuestAddress(CHUNK)).expect("write");
    say("ready");
    loop {
        match command().as_str() {
            "give" => {
                let at = monotonic_ns();
                memory
                    .discard(GuestAddress(CHUNK), CHUNK, &mut core)
                    .expect("discard");
                say(&format!("gave {at}"));
            }
            "take" => {
                memory.write_obj(1u8, GuestAddress(CHUNK)).expect("write");
                say("took");
            }
            _ => return,
        }
    }
}

/// Runs `count` throughput workers at once on the zones `zones` (one each, or all the same);
/// returns the chunks per second of all together.
fn throughput(zones: &[PathBuf], count: usize) -> f64 {
    let mut workers: Vec<Worker> = (0..count)
        .map(|i| {
            let zone = &zones[i % zones.len()];
            Worker::spawn(&format!("throughput,{},w{i}", zone.display()))
        })
        .collect();
    for worker in &mut workers {
        worker.expect("ready");
    }
    for worker in &mut workers {
        worker.send("go");
    }
    let slowest = workers
        .iter_mut()
        .map(|w| w.expect("done").parse::<u64>().expect("nanos"))
        .max()
        .unwrap_or(1);
    for mut worker in workers {
        drop(worker.to);
        worker.child.wait().expect("wait");
    }
    let chunks = count as f64 * f64::from(ROUNDS) * (PER_PROCESS / CHUNK) as f64;
    chunks / (slowest as f64 / 1e9)
}

pub fn processes(args: &Args) {
    println!(
        "## processes: {} MiB per process populated and discarded {ROUNDS} times (2 MiB chunks), \
         all processes at once; chunks populated per second, median of {}",
        PER_PROCESS >> 20,
        args.repeats
    );
    println!("| processes | one shared zone | a zone each | shared / own |");
    println!("|---|---|---|---|");
    for count in [1usize, 2, 4] {
        let shared = args
            .dir
            .join(format!("zone-bench-shared-{}", std::process::id()));
        create(&shared, count as u64 * PER_PROCESS);
        let own: Vec<PathBuf> = (0..count)
            .map(|i| {
                let path = args
                    .dir
                    .join(format!("zone-bench-own{i}-{}", std::process::id()));
                create(&path, PER_PROCESS);
                path
            })
            .collect();
        let (mut together, mut apart) = (Vec::new(), Vec::new());
        for _ in 0..args.repeats {
            together.push(throughput(std::slice::from_ref(&shared), count));
            apart.push(throughput(&own, count));
        }
        let (together, apart) = (median(together), median(apart));
        println!(
            "| {count} | {together:.0} | {apart:.0} | {:.2} |",
            together / apart
        );
        let _ = std::fs::remove_file(&shared);
        for path in own {
            let _ = std::fs::remove_file(path);
        }
    }
}

pub fn handover(args: &Args) {
    println!(
        "## handover: a fault waiting on an exhausted zone, served by another process's discard; \
         and a dead process recovered while a thread allocates ({HANDOVERS} hand-overs)"
    );
    let path = args
        .dir
        .join(format!("zone-bench-handover-{}", std::process::id()));
    // Three frames: two the holder's, one for this process's VM's first chunk; its second waits.
    create(&path, 3 * CHUNK);
    let zone = Zone::open(&path, 2).expect("open");
    let mut holder = Worker::spawn(&format!("holder,{}", path.display()));
    holder.expect("ready");
    let vm = zone.attach("waiter", &layout(2 * CHUNK)).expect("attach");
    let memory = Arc::new(
        GuestMemory::new_in_zone(vm, memory_config(2 * CHUNK), &Population::default())
            .expect("memory"),
    );
    memory.write_obj(1u8, GuestAddress(0)).expect("write");
    let mut core = memory.pool().core_frames(memory.vmm_core());
    let mut waits = Vec::with_capacity(HANDOVERS);
    for _ in 0..HANDOVERS {
        // The zone is full: this store faults and the fault waits until the holder gives its
        // chunk back (the userfaultfd handler retries it; a guest's vCPU waits the same way).
        let host = memory
            .get_host_address(GuestAddress(CHUNK))
            .expect("host address") as usize;
        let waiter = std::thread::spawn(move || {
            // SAFETY: `host` is the start of the VM's second chunk, guest memory that this
            // process maps for as long as `memory` lives (past the join below).
            unsafe { (host as *mut u8).write_volatile(1) };
            monotonic_ns()
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "the zone had a free frame");
        holder.send("give");
        let gave: u64 = holder.expect("gave").parse().expect("time");
        let served = waiter.join().expect("waiter");
        waits.push((served.saturating_sub(gave)) as f64 / 1e3);
        memory
            .discard(GuestAddress(CHUNK), CHUNK, &mut core)
            .expect("discard");
        holder.send("take");
        holder.expect("took");
    }
    let mut sorted = waits.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "| discard to served fault, µs | median {:.0} | min {:.0} | max {:.0} |",
        median(waits),
        sorted[0],
        sorted[sorted.len() - 1]
    );
    // The holder dies with the zone open; a thread here keeps allocating and freeing.
    holder.child.kill().expect("SIGKILL");
    holder.child.wait().expect("wait");
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let (memory, stop) = (Arc::clone(&memory), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                memory
                    .discard(GuestAddress(0), CHUNK, &mut core)
                    .expect("discard");
                memory.write_obj(1u8, GuestAddress(0)).expect("write");
            }
        })
    };
    let started = Instant::now();
    let dead = zone.recover_dead_processes().expect("recover");
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    busy.join().expect("busy");
    assert_eq!(dead, 1);
    println!(
        "| recovery of the dead process beside a running one, µs | {:.0} | | |",
        took.as_secs_f64() * 1e6
    );
    drop(memory);
    drop(zone);
    let _ = std::fs::remove_file(&path);
}
