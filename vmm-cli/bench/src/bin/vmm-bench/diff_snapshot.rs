//! `vmm-bench diff-snapshot`: a full snapshot of a VM against a diff of the same VM, for
//! `--snapshot-sizes` GiB of RAM and `--dirty-mib` MiB written between them.
//!
//! Per size and run: `vmm run --track-dirty-pages` with eager population writes every page of
//! its RAM and pauses at a checkpoint; a full snapshot copies its memory into a new file on
//! /dev/shm; resumed, the guest writes `--dirty-mib` MiB and pauses again; a diff snapshot
//! writes the pages dirtied since into a new file; `vmm snapshot rebase` merges it onto the
//! full one's; `vmm snapshot load --verify-memory` checks the merge against the diff's
//! checksum and lets the guest verify what it wrote last (a failure fails the run). Times are
//! the API client's (request sent to answer received) and the rebase's process; data is the
//! memory file's allocated bytes.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{api_json, summary, vmm_ok, Args, Paused};

/// One run's figures.
struct DiffRun {
    full: Duration,
    full_data: u64,
    diff: Duration,
    diff_data: u64,
    rebase: Duration,
}

/// `PUT /snapshot/create` of `kind` into `snapshot` and `memory`; the client's time.
fn create(paused: &Paused, kind: &str, snapshot: &Path, memory: &Path) -> Result<Duration, String> {
    let body = serde_json::json!({
        "snapshot_type": kind,
        "snapshot_path": snapshot,
        "mem_file_path": memory,
    })
    .to_string();
    let started = Instant::now();
    api_json(&paused.client, "PUT", "/snapshot/create", Some(&body))?;
    Ok(started.elapsed())
}

/// Allocated bytes of the file at `path`.
fn data(path: &Path) -> Result<u64, String> {
    Ok(std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .blocks()
        * 512)
}

/// One full snapshot, one diff, the merge and the verified load of a `gib` GiB VM.
fn run_once(args: &Args, gib: u64, dir: &Path) -> Result<DiffRun, String> {
    let vmm = args.vmm.as_path();
    let memory = format!("{gib}G");
    let workload = format!(
        "write:all:0xa,checkpoint:1,write:2M+{dirty}M:0xb,checkpoint:2,verify:2M+{dirty}M:0xb",
        dirty = args.dirty_mib
    );
    let run = [
        "run",
        "--memory",
        &memory,
        "--populate",
        "eager",
        "--track-dirty-pages",
        "--workload",
        &workload,
    ];
    let paused = Paused::start(vmm, &run, Duration::from_secs(600))?;
    let path = |name: &str| dir.join(name);
    let full = create(&paused, "Full", &path("full.snap"), &path("full.mem"))?;
    api_json(
        &paused.client,
        "PATCH",
        "/vm",
        Some(r#"{"state":"Resumed"}"#),
    )?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while api_json(&paused.client, "GET", "/machine", None)?["state"] != "Paused" {
        if Instant::now() > deadline {
            return Err("the guest never reached its second checkpoint".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let diff = create(&paused, "Diff", &path("diff.snap"), &path("diff.mem"))?;
    drop(paused);
    let (full_data, diff_data) = (data(&path("full.mem"))?, data(&path("diff.mem"))?);
    let [full_memory, diff_memory, diff_snapshot] =
        ["full.mem", "diff.mem", "diff.snap"].map(|name| path(name).display().to_string());
    let started = Instant::now();
    vmm_ok(
        vmm,
        &[
            "snapshot",
            "rebase",
            "--base-file",
            &full_memory,
            "--diff-file",
            &diff_memory,
        ],
    )?;
    let rebase = started.elapsed();
    let loaded = vmm_ok(
        vmm,
        &[
            "snapshot",
            "load",
            "--snapshot-path",
            &diff_snapshot,
            "--mem-file-path",
            &full_memory,
            "--resume",
            "--verify-memory",
        ],
    )?;
    if !loaded.contains("test guest: done") {
        return Err(format!("the merged diff's guest did not finish: {loaded}"));
    }
    for name in ["full.snap", "full.mem", "diff.snap", "diff.mem"] {
        let _ = std::fs::remove_file(path(name));
    }
    Ok(DiffRun {
        full,
        full_data,
        diff,
        diff_data,
        rebase,
    })
}

/// Prints the diff snapshot table.
pub(super) fn diff_snapshot(args: &Args) -> Result<(), String> {
    let runs = args.runs.min(5);
    println!(
        "## diff-snapshot: {runs} runs each, {} MiB written between the full snapshot and the \
         diff, memory files on /dev/shm",
        args.dirty_mib
    );
    println!(
        "| RAM | full: create, ms | full: data, MiB | diff: create, ms | diff: data, MiB | \
         rebase, ms | diff / full create |"
    );
    println!("|---|---|---|---|---|---|---|");
    let dir = Path::new("/dev/shm").join(format!("vmm-bench-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for &gib in &args.snapshot_sizes {
        let results = (0..runs)
            .map(|_| run_once(args, gib, &dir))
            .collect::<Result<Vec<_>, _>>();
        let results = match results {
            Ok(results) => results,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let median = |mut values: Vec<Duration>| {
            values.sort();
            values[values.len() / 2]
        };
        let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
        let full = median(results.iter().map(|r| r.full).collect());
        let diff = median(results.iter().map(|r| r.diff).collect());
        println!(
            "| {gib} GiB | {} | {:.1} | {} | {:.1} | {} | {:.3} |",
            summary(results.iter().map(|r| r.full).collect()),
            mib(results[0].full_data),
            summary(results.iter().map(|r| r.diff).collect()),
            mib(results[0].diff_data),
            summary(results.iter().map(|r| r.rebase).collect()),
            diff.as_secs_f64() / full.as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
