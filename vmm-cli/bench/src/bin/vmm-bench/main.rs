//! `vmm-bench`: how fast `vmm run` gets the built-in test guest going and how much memory the
//! VMM itself uses, measured from the outside on the real `vmm` command.
//!
//! ```text
//! vmm-bench [--vmm PATH] [--runs N] [--memory SIZE] [startup] [overhead] [restart]
//!           [snapshot] [diff-snapshot] [api] [seccomp] [jailer]
//! ```
//!
//! * startup: per backing and population, `--runs` runs of the test guest with a trivial
//!   workload (one page read). Time from spawning `vmm run` to the first byte of the guest's
//!   serial output on stdout (the guest prints after a few hundred instructions: an upper
//!   bound of the time to its first instruction), and to the process's exit. Medians, with
//!   the minimum and maximum.
//! * overhead: the VMM paused at a workload checkpoint (through the API). Guest memory is the
//!   resident part of the pool's mappings in /proc/PID/smaps (the `llfree-pool` memfd, or the
//!   pool file); hugetlb pages are outside VmRSS (HugetlbPages). The VMM's own memory is
//!   VmRSS minus guest memory: heap, stacks, the binary and libraries.
//!
//! * restart: a VM in a persistent zone (on /dev/shm) with all of its RAM touched (eager
//!   population: every frame held and faulted in) is killed with SIGKILL, then started again
//!   `--runs` times: spawn to the first guest output, against a VM of the same size on plain
//!   memory (no zone, lazy) in the same run, for `--restart-sizes` GiB of RAM. The first
//!   restart recovers the zone after the crash; `vmm zone inspect` tells its time.
//!
//! * snapshot: see [`snapshot`]: create and load times of a VM in a zone (/dev/shm, hugetlbfs)
//!   for `--snapshot-sizes` GiB of touched RAM.
//!
//! * diff-snapshot: see [`diff_snapshot`]: a full snapshot against a diff of the same VM, and
//!   the diff's merge (`--snapshot-sizes`, `--dirty-mib`).
//!
//! * seccomp: see [`seccomp`]: what the built-in filters add to one system call.
//!
//! * api: see [`api_requests`]: `--runs` rounds of API requests on one kept connection and
//!   with a connection each.
//!
//! * jailer: see [`jailer`]: spawn to the first API answer, plain and through `vmm-jailer`
//!   (as root).
//!
//! hugetlb-2m cases need free 2 MiB huge pages (memory / 2 MiB of them), e.g.
//! `echo 512 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`; they are skipped with
//! a note otherwise.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmm_cli::ApiClient;

mod api_requests;
mod diff_snapshot;
mod jailer;
mod seccomp;
mod snapshot;

const USAGE: &str = "usage: vmm-bench [--vmm PATH] [--runs N] [--memory SIZE] \
                     [--restart-sizes GIB,...] [--snapshot-sizes GIB,...] [--dirty-mib MIB] \
                     [startup] [overhead] [restart] [snapshot] [diff-snapshot] [api] [seccomp] \
                     [jailer]";

/// The command line.
struct Args {
    /// The `vmm` command measured.
    vmm: PathBuf,
    /// Runs of every startup case.
    runs: usize,
    /// `--memory` of the guests, as given ("512M").
    memory: String,
    /// The same in MiB.
    memory_mib: u64,
    /// Measure startup.
    startup: bool,
    /// Measure the VMM's own memory.
    overhead: bool,
    /// Measure restarts of a VM in a zone.
    restart: bool,
    /// Guest RAM of the restart cases, GiB.
    restart_sizes: Vec<u64>,
    /// Measure snapshot create and load.
    snapshot: bool,
    /// Guest RAM of the snapshot cases, GiB.
    snapshot_sizes: Vec<u64>,
    /// Measure a diff snapshot against a full one.
    diff_snapshot: bool,
    /// MiB the guest writes between the full snapshot and the diff.
    dirty_mib: u64,
    /// Measure API requests on kept and new connections.
    api: bool,
    /// Measure what the seccomp filters add to a system call.
    seccomp: bool,
    /// Measure starting a VMM through vmm-jailer.
    jailer: bool,
}

/// Parses the command line; with neither `startup` nor `overhead`, both are measured.
fn parse_args() -> Result<Args, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut args = Args {
        vmm: exe.with_file_name("vmm"),
        runs: 20,
        memory: "512M".into(),
        memory_mib: 512,
        startup: false,
        overhead: false,
        restart: false,
        restart_sizes: vec![1, 4, 8, 16],
        snapshot: false,
        snapshot_sizes: vec![1, 4, 8, 16],
        diff_snapshot: false,
        dirty_mib: 64,
        api: false,
        seccomp: false,
        jailer: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        let mut value = || given.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--vmm" => args.vmm = value()?.into(),
            "--runs" => args.runs = value()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--memory" => {
                args.memory = value()?;
                args.memory_mib = mib(&args.memory)?;
            }
            "startup" => args.startup = true,
            "overhead" => args.overhead = true,
            "restart" => args.restart = true,
            "snapshot" => args.snapshot = true,
            "diff-snapshot" => args.diff_snapshot = true,
            "--dirty-mib" => {
                args.dirty_mib = value()?.parse().map_err(|e| format!("--dirty-mib: {e}"))?
            }
            "api" => args.api = true,
            "seccomp" => args.seccomp = true,
            "jailer" => args.jailer = true,
            "--restart-sizes" => args.restart_sizes = gib_list(&arg, &value()?)?,
            "--snapshot-sizes" => args.snapshot_sizes = gib_list(&arg, &value()?)?,
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    if args.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    if !args.startup
        && !args.overhead
        && !args.restart
        && !args.snapshot
        && !args.diff_snapshot
        && !args.api
        && !args.seccomp
        && !args.jailer
    {
        (args.startup, args.overhead) = (true, true);
    }
    Ok(args)
}

/// A comma-separated list of GiB, for `flag`.
fn gib_list(flag: &str, text: &str) -> Result<Vec<u64>, String> {
    text.split(',')
        .map(|n| n.parse().map_err(|e| format!("{flag}: {e}")))
        .collect()
}

/// Free, unreserved 2 MiB huge pages.
fn free_huge_pages() -> u64 {
    let read = |name: &str| {
        std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{name}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    read("free_hugepages").saturating_sub(read("resv_hugepages"))
}

/// MiB in a size with unit M or G ("512M", "1G").
fn mib(text: &str) -> Result<u64, String> {
    let bad = || format!("--memory {text:?}: a number of MiB or GiB such as 512M or 1G");
    let (digits, shift) = match text.strip_suffix('G') {
        Some(digits) => (digits, 10),
        None => (text.strip_suffix('M').ok_or_else(bad)?, 0),
    };
    let value: u64 = digits.parse().map_err(|_| bad())?;
    value
        .checked_shl(shift)
        .filter(|v| v >> shift == value)
        .ok_or_else(bad)
}

/// Whether `backing` needs more free 2 MiB huge pages than there are for `memory_mib` MiB.
fn too_few_huge_pages(backing: &str, memory_mib: u64) -> bool {
    backing == "hugetlb-2m" && free_huge_pages() < memory_mib / 2
}

/// One timed run of `vmm ARGS`: time to the first stdout byte and to the exit.
fn timed_run(vmm: &Path, args: &[&str]) -> Result<(Duration, Duration), String> {
    let start = Instant::now();
    let mut child = Command::new(vmm)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", vmm.display()))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut byte = [0u8];
        let first = match stdout.read(&mut byte) {
            Ok(1) => Some(start.elapsed()),
            _ => None,
        };
        let _ = stdout.read_to_end(&mut Vec::new());
        first
    });
    let status = child.wait().map_err(|e| e.to_string())?;
    let exit = start.elapsed();
    let first = reader.join().map_err(|_| "reader panicked")?;
    if !status.success() {
        let mut err = String::new();
        let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
        return Err(format!("vmm {args:?}: {status}: {}", err.trim()));
    }
    Ok((first.ok_or("nothing was printed")?, exit))
}

/// The arguments of `vmm run` with these options.
fn run_args<'a>(
    memory: &'a str,
    backing: &'a str,
    populate: &'a str,
    vcpus: &'a str,
    workload: &'a str,
) -> [&'a str; 11] {
    [
        "run",
        "--memory",
        memory,
        "--backing",
        backing,
        "--populate",
        populate,
        "--vcpus",
        vcpus,
        "--workload",
        workload,
    ]
}

/// `runs` timed runs of `vmm ARGS`: the times to the first stdout byte and to the exit.
fn timed_runs(
    vmm: &Path,
    args: &[&str],
    runs: usize,
) -> Result<(Vec<Duration>, Vec<Duration>), String> {
    (0..runs).map(|_| timed_run(vmm, args)).collect()
}

/// "median (min–max)" in milliseconds.
fn summary(mut values: Vec<Duration>) -> String {
    values.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{:.1} ({:.1}–{:.1})",
        ms(values[values.len() / 2]),
        ms(values[0]),
        ms(values[values.len() - 1])
    )
}

/// Prints the startup table.
fn startup(args: &Args) -> Result<(), String> {
    println!(
        "## startup: {} runs each, --memory {}, 1 vCPU, --workload read:2M+4K",
        args.runs, args.memory
    );
    println!("| backing | populate | spawn to first guest output, ms | spawn to exit, ms |");
    println!("|---|---|---|---|");
    // Baseline: the same process start without a VM (`vmm --version` prints at once).
    let (first, exit) = timed_runs(&args.vmm, &["--version"], args.runs)?;
    println!(
        "| baseline: vmm --version | - | {} (first output) | {} |",
        summary(first),
        summary(exit)
    );
    for backing in ["anon", "hugetlb-2m"] {
        if too_few_huge_pages(backing, args.memory_mib) {
            println!("| {backing} | - | skipped: too few free 2 MiB huge pages | |");
            continue;
        }
        for populate in ["lazy", "eager"] {
            let run_args = run_args(&args.memory, backing, populate, "1", "read:2M+4K");
            let (first, exit) = timed_runs(&args.vmm, &run_args, args.runs)?;
            println!(
                "| {backing} | {populate} | {} | {} |",
                summary(first),
                summary(exit)
            );
        }
    }
    Ok(())
}

/// The `kB` fields of /proc/PID/status that tell where the memory is, in KiB.
fn memory_status(pid: u32) -> Result<Vec<(&'static str, u64)>, String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let fields = ["VmRSS", "RssAnon", "RssFile", "RssShmem", "HugetlbPages"];
    Ok(fields
        .iter()
        .map(|&field| {
            let kib = status
                .lines()
                .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            (field, kib)
        })
        .collect())
}

/// KiB resident in the mappings of guest memory: the pool memfd, or the pool file `pool`.
fn guest_rss(pid: u32, pool: &Path) -> Result<u64, String> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).map_err(|e| e.to_string())?;
    let pool = pool.to_string_lossy();
    let mut guest = false;
    let mut total = 0;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.contains('-') && first.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            let path = line.split_whitespace().nth(5).unwrap_or_default();
            guest = path.starts_with("/memfd:llfree-pool") || path == pool;
        } else if guest && first == "Rss:" {
            total += fields
                .next()
                .and_then(|kib| kib.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

/// Sends an API request that must succeed; its JSON answer (`Null` for none).
fn api_json(
    client: &ApiClient,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<serde_json::Value, String> {
    let response = client
        .request(method, path, body)
        .map_err(|e| e.to_string())?;
    if !response.is_success() {
        return Err(format!(
            "{method} {path}: {} {}",
            response.status, response.body
        ));
    }
    if response.body.is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(&response.body).map_err(|e| e.to_string())
}

/// What [`paused_memory`] found, in KiB.
struct PausedMemory {
    status: Vec<(&'static str, u64)>,
    guest_rss: u64,
    populated: u64,
}

/// Measures the paused VMM `pid` whose pool is the memfd or the file `pool`.
fn measure_paused(client: &ApiClient, pid: u32, pool: &Path) -> Result<PausedMemory, String> {
    let memory = api_json(client, "GET", "/memory", None)?;
    Ok(PausedMemory {
        status: memory_status(pid)?,
        guest_rss: guest_rss(pid, pool)?,
        populated: memory["guest"]["populated_bytes"].as_u64().unwrap_or(0) >> 10,
    })
}

/// A `vmm run` paused at a workload checkpoint, with a client of its API; the scratch
/// directory of its socket goes with it.
struct Paused {
    child: Child,
    client: ApiClient,
    dir: PathBuf,
}

impl Paused {
    /// Starts `vmm ARGS --api-socket ...` and waits (at most `timeout`) until its VM is paused
    /// at a checkpoint.
    fn start(vmm: &Path, args: &[&str], timeout: Duration) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("vmm-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let socket = dir.join("api.sock");
        let stderr = std::fs::File::create(dir.join("stderr.log")).map_err(|e| e.to_string())?;
        let child = Command::new(vmm)
            .args(args)
            .arg("--api-socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut paused = Paused {
            child,
            client: ApiClient::new(&socket),
            dir,
        };
        let deadline = Instant::now() + timeout;
        loop {
            if Instant::now() > deadline {
                return Err(format!(
                    "the VM did not reach its checkpoint in {timeout:?}"
                ));
            }
            if let Ok(Some(status)) = paused.child.try_wait() {
                return Err(format!(
                    "vmm run ended early: {status}: {}",
                    paused.stderr().trim()
                ));
            }
            if socket.exists()
                && api_json(&paused.client, "GET", "/machine", None)
                    .is_ok_and(|m| m["state"] == "Paused")
            {
                return Ok(paused);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Paused {
    /// What the VMM wrote on stderr so far.
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for Paused {
    /// Shuts the VMM down through its API (if it still listens); kills it if it has not ended
    /// 10 s later.
    fn drop(&mut self) {
        let shutdown = Some(r#"{"action_type":"Shutdown"}"#);
        let _ = api_json(&self.client, "PUT", "/actions", shutdown);
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `vmm ARGS --api-socket ...` (ARGS from [`run_args`]) to its checkpoint, measures, and
/// shuts it down.
fn paused_memory(vmm: &Path, run_args: &[&str], pool: &Path) -> Result<PausedMemory, String> {
    let paused = Paused::start(vmm, run_args, Duration::from_secs(120))?;
    measure_paused(&paused.client, paused.child.id(), pool)
}

/// Prints the memory overhead table.
fn overhead(args: &Args) -> Result<(), String> {
    println!(
        "## overhead: at a checkpoint, --memory {}, KiB",
        args.memory
    );
    println!(
        "| case | VmRSS | RssAnon | RssFile | RssShmem | HugetlbPages | guest populated | \
         guest resident | VMM's own (VmRSS - guest resident) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let pool = std::env::temp_dir().join(format!("vmm-bench-pool-{}", std::process::id()));
    let file = format!("file:{}", pool.display());
    // (backing, populate, vCPUs, whether the guest writes all of its memory first)
    let cases = [
        ("anon", "lazy", "1", false),
        ("anon", "lazy", "1", true),
        ("anon", "eager", "1", true),
        ("anon", "lazy", "2", true),
        ("hugetlb-2m", "lazy", "1", true),
        (file.as_str(), "lazy", "1", true),
    ];
    for (backing, populate, vcpus, written) in cases {
        let label = if backing == file {
            "pool file"
        } else {
            backing
        };
        let vcpu_word = if vcpus == "1" { "vCPU" } else { "vCPUs" };
        let state = if written { "all written" } else { "idle" };
        let name = format!("{label} {populate}, {vcpus} {vcpu_word}, {state}");
        if too_few_huge_pages(backing, args.memory_mib) {
            println!("| {name} | skipped: too few free 2 MiB huge pages |");
            continue;
        }
        let workload = match written {
            true => "write:all,checkpoint:1",
            false => "checkpoint:1",
        };
        let run_args = run_args(&args.memory, backing, populate, vcpus, workload);
        let measured = paused_memory(&args.vmm, &run_args, &pool)?;
        let rss = measured.status.first().map_or(0, |(_, v)| *v);
        let cells: Vec<String> = measured.status.iter().map(|(_, v)| v.to_string()).collect();
        println!(
            "| {name} | {} | {} | {} | {} |",
            cells.join(" | "),
            measured.populated,
            measured.guest_rss,
            rss.saturating_sub(measured.guest_rss)
        );
    }
    let _ = std::fs::remove_file(&pool);
    Ok(())
}

/// Runs `vmm ARGS` to its end; it must succeed. Returns its stdout.
fn vmm_ok(vmm: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new(vmm)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!(
            "vmm {args:?}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Populates all of a zone VM's RAM, kills its VMM at a checkpoint, and returns the recovery
/// time the next open reports, µs.
fn touch_and_crash(vmm: &Path, run: &[&str], zone: &str) -> Result<u64, String> {
    let mut args = run.to_vec();
    args.extend([
        "--populate",
        "eager",
        "--workload",
        "read:2M+4K,checkpoint:1",
    ]);
    let mut paused = Paused::start(vmm, &args, Duration::from_secs(600))?;
    paused.child.kill().map_err(|e| e.to_string())?;
    paused.child.wait().map_err(|e| e.to_string())?;
    drop(paused);
    let info = vmm_ok(vmm, &["zone", "inspect", "--json", zone])?;
    let info: serde_json::Value = serde_json::from_str(&info).map_err(|e| e.to_string())?;
    if info["recovery"]["kind"] != "crash" || info["free_frames"] != 0 {
        return Err(format!("unexpected zone state after the kill: {info}"));
    }
    info["recovery"]["micros"]
        .as_u64()
        .ok_or_else(|| "no recovery time".to_owned())
}

/// Prints the restart table.
fn restart(args: &Args) -> Result<(), String> {
    println!(
        "## restart: a VM in a zone on /dev/shm, all RAM touched, killed, started again; {} \
         runs each, 1 vCPU, --workload read:2M+4K",
        args.runs
    );
    println!(
        "| guest RAM | recovery after the kill, µs | zone restart: spawn to first guest output, \
         ms | no zone (anon, lazy), ms | difference of the medians, ms |"
    );
    println!("|---|---|---|---|---|");
    let zone = format!("/dev/shm/vmm-bench-zone-{}", std::process::id());
    for &gib in &args.restart_sizes {
        let memory = format!("{gib}G");
        let _ = std::fs::remove_file(&zone);
        vmm_ok(&args.vmm, &["zone", "create", &zone, "--size", &memory])?;
        let run = ["run", "--zone", &zone, "--vm", "bench", "--memory", &memory];
        let measured = touch_and_crash(&args.vmm, &run, &zone).and_then(|recovery| {
            let mut zone_run = run.to_vec();
            zone_run.extend(["--workload", "read:2M+4K"]);
            let plain = ["run", "--memory", &memory, "--workload", "read:2M+4K"];
            let (mut zoned, mut anon) = (Vec::new(), Vec::new());
            for _ in 0..args.runs {
                zoned.push(timed_run(&args.vmm, &zone_run)?.0);
                anon.push(timed_run(&args.vmm, &plain)?.0);
            }
            Ok((recovery, zoned, anon))
        });
        let _ = std::fs::remove_file(&zone);
        let (recovery, zoned, anon) = measured?;
        let median = |v: &[Duration]| {
            let mut v = v.to_vec();
            v.sort();
            v[v.len() / 2].as_secs_f64() * 1000.0
        };
        let difference = median(&zoned) - median(&anon);
        println!(
            "| {gib} GiB | {recovery} | {} | {} | {difference:+.1} |",
            summary(zoned),
            summary(anon)
        );
    }
    Ok(())
}

fn main() {
    let result = parse_args().and_then(|args| {
        if !args.vmm.is_file() {
            return Err(format!(
                "{} is not the vmm command (use --vmm PATH)\n{USAGE}",
                args.vmm.display()
            ));
        }
        println!("vmm: {}", args.vmm.display());
        if args.startup {
            startup(&args)?;
        }
        if args.overhead {
            overhead(&args)?;
        }
        if args.restart {
            restart(&args)?;
        }
        if args.snapshot {
            snapshot::snapshot(&args)?;
        }
        if args.diff_snapshot {
            diff_snapshot::diff_snapshot(&args)?;
        }
        if args.api {
            api_requests::api_requests(&args)?;
        }
        if args.seccomp {
            seccomp::seccomp(&args)?;
        }
        if args.jailer {
            jailer::jailer(&args)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
