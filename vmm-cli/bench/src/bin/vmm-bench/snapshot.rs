//! `vmm-bench snapshot`: snapshot create and load times of a VM whose every page the guest has
//! written, in a zone in a file on /dev/shm and in a zone on hugetlbfs (2 MiB pages), for
//! `--snapshot-sizes` GiB of RAM.
//!
//! Per case: `vmm run` with eager population (every frame held and faulted in) writes a pattern
//! into every 4 KiB page of its RAM and pauses at a checkpoint; `PUT /snapshot/create` into the
//! zone `--runs` times (each seals the memory anew); the VMM is killed; then `--runs` times a
//! fresh `vmm --api-sock` loads the snapshot without resuming it (so the seal holds) and is shut
//! down; a last load resumes the guest, which verifies every page it wrote (a page that does not
//! hold its pattern fails the run) and ends: the time from that load's request to the VMM's
//! successful end is the load plus reading all memory back. Times are the API client's (request sent to answer received; a load is
//! answered once the VM's vCPUs exist) and the VMM's own (`--log-level info`), with the phases
//! of the median load. A load is sent as soon as the new VMM's socket is there (which it makes
//! before its KVM VM, made on a thread meanwhile: the load may wait for it), and also, in as
//! many more processes, 100 ms later (a VMM that waits ready, as an orchestrator's pool keeps
//! them).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vmm::layout::{MMIO_GAP_END, MMIO_GAP_START};
use vmm_cli::ApiClient;

use super::{api_json, summary, vmm_ok, Args, Paused};

/// A hugetlbfs mount of 2 MiB pages with `pages` more of them reserved; unmounted and the old
/// reservation put back when dropped.
struct HugetlbMount {
    dir: std::path::PathBuf,
    old_pages: u64,
}

const NR_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

impl HugetlbMount {
    fn new(pages: u64) -> Result<Self, String> {
        let read = || -> Result<u64, String> {
            std::fs::read_to_string(NR_HUGEPAGES)
                .map_err(|e| e.to_string())?
                .trim()
                .parse()
                .map_err(|e| format!("{NR_HUGEPAGES}: {e}"))
        };
        let old_pages = read()?;
        let dir = std::env::temp_dir().join(format!("vmm-bench-hugetlbfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mount = HugetlbMount { dir, old_pages };
        std::fs::write(NR_HUGEPAGES, (old_pages + pages).to_string())
            .map_err(|e| format!("{NR_HUGEPAGES}: {e} (run as root)"))?;
        let reserved = read()?;
        if reserved < old_pages + pages {
            return Err(format!(
                "only {} of {pages} 2 MiB huge pages could be reserved",
                reserved.saturating_sub(old_pages)
            ));
        }
        let status = Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", "pagesize=2M", "none"])
            .arg(&mount.dir)
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("mount -t hugetlbfs: {status}"));
        }
        Ok(mount)
    }
}

impl Drop for HugetlbMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::write(NR_HUGEPAGES, self.old_pages.to_string());
    }
}

/// The `... in DURATION` of the last line of `log` starting at `prefix`, ms, and the line.
fn logged(log: &str, prefix: &str) -> Option<(f64, String)> {
    let line = log
        .lines()
        .rev()
        .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest))?;
    let (duration, _) = line.split_once(':')?;
    Some((parse_duration(duration.trim())?, line.to_owned()))
}

/// A duration as Rust's Debug prints it ("1.2ms", "950.3µs", "2.1s"), in ms.
fn parse_duration(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix("µs") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("ns") {
        (n, 1e-6)
    } else {
        (text.strip_suffix('s')?, 1e3)
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn ms_summary(values: &[f64]) -> String {
    summary(
        values
            .iter()
            .map(|ms| Duration::from_secs_f64(ms / 1000.0))
            .collect(),
    )
}

/// What one case measured, ms.
struct SnapshotTimes {
    create_client: Vec<f64>,
    create_vmm: Vec<f64>,
    load_client: Vec<f64>,
    load_vmm: Vec<(f64, String)>,
    /// Spawn of `vmm --api-sock` to its socket.
    ready: Vec<f64>,
    /// Spawn to the load's answer, the load sent as soon as the socket is there.
    spawn_to_loaded: Vec<f64>,
    /// The client's time of a load into a VMM that has waited [`SETTLE`] already.
    load_waiting: Vec<f64>,
    /// The resumed load: request to the VMM's end, its guest having verified every page.
    load_and_verify: f64,
}

/// How long a VMM waits before a load of the "waiting VMM" column: long enough for its KVM VM,
/// which it makes while it waits, to be ready (an orchestrator's pool of started VMMs).
const SETTLE: Duration = Duration::from_millis(100);

/// What one load measured, ms, and the loading VMM's log.
struct Loaded {
    /// Spawn of `vmm --api-sock` to its socket.
    ready: f64,
    /// The load request sent to its answer.
    answered: f64,
    /// The load request sent to the VMM's end (resumed: its guest verified its memory).
    ended: f64,
    log: String,
}

/// A `vmm --api-sock` that loads `snapshot` (memory in `zone`) `settle` after its socket
/// appeared, resuming it or not; returns what it measured after shutting it down (or, resumed,
/// after its guest finished).
fn load_once(
    vmm: &Path,
    dir: &Path,
    snapshot: &Path,
    zone: &Path,
    resume: bool,
    settle: Duration,
) -> Result<Loaded, String> {
    let socket = dir.join("load.sock");
    let log = dir.join("load.log");
    let _ = std::fs::remove_file(&socket);
    let spawned = Instant::now();
    let mut child = Command::new(vmm)
        .args(["--log-level", "info", "--api-sock"])
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("no API socket".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let ready = spawned.elapsed().as_secs_f64() * 1000.0;
    std::thread::sleep(settle);
    let client = ApiClient::new(&socket);
    let body = serde_json::json!({
        "snapshot_path": snapshot,
        "mem_backend": {"backend_type": "File", "backend_path": zone},
        "resume_vm": resume,
    })
    .to_string();
    let started = Instant::now();
    let answer = api_json(&client, "PUT", "/snapshot/load", Some(&body));
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    if !resume {
        let _ = api_json(
            &client,
            "PUT",
            "/actions",
            Some(r#"{"action_type":"Shutdown"}"#),
        );
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let ended = started.elapsed().as_secs_f64() * 1000.0;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    answer.map_err(|e| format!("load: {e}: {text}"))?;
    if resume && !status.success() {
        return Err(format!("the resumed guest failed: {status}: {text}"));
    }
    Ok(Loaded {
        ready,
        answered: elapsed,
        ended,
        log: text,
    })
}

/// The workload of a snapshot case of `gib` GiB: write a pattern into every page of RAM (the
/// low workload area and, above 3 GiB, the RAM above the MMIO gap), pause at checkpoint 1,
/// then verify every page.
fn every_page_workload(gib: u64) -> String {
    let low = (MMIO_GAP_START >> 30).min(gib);
    let ranges: Vec<String> = std::iter::once("all".to_owned())
        .chain((gib > low).then(|| format!("{}G+{}G", MMIO_GAP_END >> 30, gib - low)))
        .collect();
    let steps = |kind: &str| {
        ranges
            .iter()
            .map(|range| format!("{kind}:{range}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!("{},checkpoint:1,{}", steps("write"), steps("verify"))
}

/// Measures one zone of `gib` GiB in `directory`.
fn measure(args: &Args, directory: &Path, gib: u64) -> Result<SnapshotTimes, String> {
    let memory = format!("{gib}G");
    let zone = directory.join(format!("vmm-bench-snapshot-{}.zone", std::process::id()));
    let zone_text = zone.to_string_lossy().into_owned();
    let _ = std::fs::remove_file(&zone);
    vmm_ok(
        &args.vmm,
        &["zone", "create", &zone_text, "--size", &memory],
    )?;
    let workload = every_page_workload(gib);
    let result = (|| {
        let run = [
            "--log-level",
            "info",
            "run",
            "--zone",
            &zone_text,
            "--vm",
            "bench",
            "--memory",
            &memory,
            "--populate",
            "eager",
            "--workload",
            &workload,
        ];
        let mut paused = Paused::start(&args.vmm, &run, Duration::from_secs(900))?;
        let snapshot = paused.dir.join("vm.snap");
        let body = serde_json::json!({
            "snapshot_path": snapshot,
            "mem_file_path": zone,
        })
        .to_string();
        let mut create_client = Vec::new();
        for _ in 0..args.runs {
            let started = Instant::now();
            api_json(&paused.client, "PUT", "/snapshot/create", Some(&body))?;
            create_client.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        let create_vmm: Vec<f64> = paused
            .stderr()
            .lines()
            .filter_map(|line| logged(line, "snapshot created in ").map(|(ms, _)| ms))
            .collect();
        paused.child.kill().map_err(|e| e.to_string())?;
        paused.child.wait().map_err(|e| e.to_string())?;
        let dir = paused.dir.clone();
        let mut load_client = Vec::new();
        let mut load_vmm = Vec::new();
        let mut ready = Vec::new();
        let mut spawn_to_loaded = Vec::new();
        let mut load_waiting = Vec::new();
        for _ in 0..args.runs {
            let loaded = load_once(&args.vmm, &dir, &snapshot, &zone, false, Duration::ZERO)?;
            ready.push(loaded.ready);
            spawn_to_loaded.push(loaded.ready + loaded.answered);
            load_client.push(loaded.answered);
            load_vmm.extend(logged(&loaded.log, "snapshot loaded in "));
            let waited = load_once(&args.vmm, &dir, &snapshot, &zone, false, SETTLE)?;
            load_waiting.push(waited.answered);
        }
        // The guest verifies every page and finishes its workload in the last process.
        let verified = load_once(&args.vmm, &dir, &snapshot, &zone, true, Duration::ZERO)?;
        drop(paused);
        Ok(SnapshotTimes {
            create_client,
            create_vmm,
            load_client,
            load_vmm,
            ready,
            spawn_to_loaded,
            load_waiting,
            load_and_verify: verified.ended,
        })
    })();
    let _ = std::fs::remove_file(&zone);
    result
}

/// Measures and prints the cases of one kind of zone, in `directory`.
fn print_cases(args: &Args, kind: &str, directory: &Path) -> Result<(), String> {
    for &gib in &args.snapshot_sizes {
        let measured = measure(args, directory, gib)?;
        let load_vmm: Vec<f64> = measured.load_vmm.iter().map(|(ms, _)| *ms).collect();
        let middle = median(&load_vmm);
        let phases = measured
            .load_vmm
            .iter()
            .find(|(ms, _)| *ms == middle)
            .and_then(|(_, line)| line.split_once(": ").map(|(_, p)| p.to_owned()))
            .unwrap_or_default();
        println!(
            "| {kind} | {gib} GiB | {} | {} | {} | {} | {} | {} | {} | {:.0} | {phases} |",
            ms_summary(&measured.create_client),
            ms_summary(&measured.create_vmm),
            ms_summary(&measured.ready),
            ms_summary(&measured.load_client),
            ms_summary(&load_vmm),
            ms_summary(&measured.spawn_to_loaded),
            ms_summary(&measured.load_waiting),
            measured.load_and_verify,
        );
    }
    Ok(())
}

/// Prints the snapshot table.
pub(super) fn snapshot(args: &Args) -> Result<(), String> {
    println!(
        "## snapshot: a VM in a zone (eager), every page written by the guest, paused at a \
         checkpoint; {} creates into the zone, then {} loads in fresh `vmm --api-sock` \
         processes and one that resumes and verifies every page; ms, median (min-max)",
        args.runs, args.runs
    );
    println!(
        "| zone | guest RAM | create (client) | create (VMM) | `vmm --api-sock` ready \
         (spawn to socket) | load (client) | load (VMM) | spawn to loaded | load into a VMM \
         that waited 100 ms (client) | load, resume and verify every page (client, 1 run) | \
         phases of the median load (VMM) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    print_cases(args, "file on /dev/shm", Path::new("/dev/shm"))?;
    let largest = args.snapshot_sizes.iter().max().copied().unwrap_or(1);
    match HugetlbMount::new(largest * 512 + 16) {
        Ok(mount) => print_cases(args, "hugetlbfs, 2 MiB pages", &mount.dir),
        Err(e) => {
            println!("(hugetlbfs cases skipped: {e})");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vmm_s_log_lines_give_their_durations() {
        let log = "info: vmm::runner::restore: snapshot loaded in 5.292233ms: file 112.6µs, \
                   zone 126.9µs, start 4.768412ms";
        let (ms, line) = logged(log, "snapshot loaded in ").unwrap();
        assert!((ms - 5.292233).abs() < 1e-9);
        assert!(line.ends_with("start 4.768412ms"));
        assert!((parse_duration("950µs").unwrap() - 0.95).abs() < 1e-12);
        assert_eq!(parse_duration("1.5s"), Some(1500.0));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn the_workload_writes_and_verifies_all_ram_above_the_gap_too() {
        assert_eq!(every_page_workload(1), "write:all,checkpoint:1,verify:all");
        assert_eq!(
            every_page_workload(8),
            "write:all,write:4G+5G,checkpoint:1,verify:all,verify:4G+5G"
        );
        // What the test guest accepts, for a VM of that size.
        for gib in [1, 8, 16] {
            let spec: vmm::testguest::WorkloadSpec = every_page_workload(gib).parse().unwrap();
            spec.resolve(gib << 30, 1).unwrap();
        }
    }
}
