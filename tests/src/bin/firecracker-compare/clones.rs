//! Many VMs loaded at once from one snapshot, as code sandboxes restore one warmed VM: each
//! VMM's guest writes every page of its RAM, is snapshotted (ours a copy snapshot into a
//! memory file, or a zone snapshot that bases clones; Firecracker a Full one), and `clones`
//! new processes load it at the same moment (`mem_backend` File, `resume_vm`; each of our zone
//! clones with a `clone_name`). Measured: each load's time, the time until all run, each
//! clone's proportional set size (PSS) idle, and again after its guest read all its memory
//! back and verified it.

use std::path::Path;
use std::time::{Duration, Instant};

use e2e_tests::api_process::{call, median, ms, summary, ApiProcess};

use super::{configured, spawn, Kind, Vmm, CHECKPOINT, MEMORY_TIMEOUT, TIMEOUT};

/// What one round of clones of one VMM measured.
pub struct Clones {
    /// Each load request, as its client saw it.
    pub loads: Vec<Duration>,
    /// From the first load request to the last answer.
    pub all_running: Duration,
    /// Each clone's PSS, idle after its load, in KiB.
    pub idle_pss_kib: Vec<u64>,
    /// Each clone's PSS after its guest read all its memory back, in KiB.
    pub read_back_pss_kib: Vec<u64>,
}

/// The proportional set size of process `pid`, in KiB.
fn pss_kib(pid: u32) -> Result<u64, String> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .map_err(|e| format!("/proc/{pid}/smaps_rollup: {e}"))?;
    rollup
        .lines()
        .find_map(|line| line.strip_prefix("Pss:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("no Pss line in /proc/{pid}/smaps_rollup"))
}

/// Creates a zone at `path` for a `mib` MiB base and `clones` clones of it, with `vmm zone
/// create` of our `binary`.
fn create_zone(binary: &Path, path: &Path, mib: u64, clones: usize) -> Result<(), String> {
    // The base's RAM in 2 MiB frames and a margin; the clones map its frames.
    let size = format!("{}M", mib.div_ceil(2) * 2 + 64);
    let created = std::process::Command::new(binary)
        .args(["zone", "create"])
        .arg(path)
        .args(["--size", &size, "--max-vms", &(clones + 1).to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    match created.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&created.stderr).into_owned()),
    }
}

/// Snapshots a `mib` MiB guest of `vmm` whose every page was written, then loads `count`
/// clones of it at once, with scratch files in `dir`; ours from a zone snapshot with `zone`,
/// else from a copy snapshot.
pub fn measure(
    vmm: &Vmm,
    dir: &Path,
    image: &Path,
    mib: u64,
    count: usize,
    zone: bool,
) -> Result<Clones, String> {
    let memory = dir.join(if zone { "clones.zone" } else { "clones.mem" });
    let state = dir.join("clones.snap");
    for file in [&memory, &state] {
        let _ = std::fs::remove_file(file);
    }
    if zone {
        create_zone(&vmm.binary, &memory, mib, count)?;
    }
    // The second checkpoint holds each clone after its read-back, for its PSS.
    let workload = "write:all,checkpoint:1,verify:all,checkpoint:2";
    let in_zone = zone.then_some((memory.as_path(), "lazy"));
    let (process, _) = configured(vmm, dir, image, mib, workload, in_zone)?;
    process.call("PUT", "/actions", r#"{"action_type":"InstanceStart"}"#)?;
    process.wait_for(CHECKPOINT, MEMORY_TIMEOUT)?;
    process.call("PATCH", "/vm", r#"{"state":"Paused"}"#)?;
    let mut create = serde_json::json!({"snapshot_path": state, "mem_file_path": memory});
    if vmm.kind != Kind::Ours {
        create["snapshot_type"] = serde_json::json!("Full");
    }
    process.call("PUT", "/snapshot/create", &create.to_string())?;
    drop(process);

    // Each clone in a directory of its own (its socket, Firecracker's log file).
    let dirs: Vec<_> = (0..count)
        .map(|index| dir.join(format!("clone-{index}")))
        .collect();
    let mut clones = Vec::with_capacity(count);
    for clone_dir in &dirs {
        std::fs::create_dir_all(clone_dir).map_err(|e| format!("{}: {e}", clone_dir.display()))?;
        let mut clone = spawn(vmm, clone_dir, "api.sock")?;
        clone.wait_for_socket(TIMEOUT)?;
        clones.push(clone);
    }
    let loads: Vec<String> = (0..count)
        .map(|index| {
            let mut load = serde_json::json!({
                "snapshot_path": state,
                "mem_backend": {"backend_type": "File", "backend_path": memory},
                "resume_vm": true,
            });
            if zone {
                load["clone_name"] = serde_json::json!(format!("clone-{index}"));
            }
            load.to_string()
        })
        .collect();
    let sockets: Vec<_> = dirs
        .iter()
        .map(|clone_dir| clone_dir.join("api.sock"))
        .collect();
    let started = Instant::now();
    let loads: Vec<Result<Duration, String>> = std::thread::scope(|scope| {
        let threads: Vec<_> = sockets
            .iter()
            .zip(&loads)
            .map(|(socket, load)| {
                scope.spawn(move || {
                    let api = vmm_cli::ApiClient::new(socket);
                    let asked = Instant::now();
                    call(&api, "PUT", "/snapshot/load", Some(load)).map(|()| asked.elapsed())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err("a load thread panicked".into()))
            })
            .collect()
    });
    let all_running = started.elapsed();
    let loads = loads.into_iter().collect::<Result<Vec<_>, _>>()?;
    // Idle: the guests wait at their checkpoint.
    std::thread::sleep(Duration::from_millis(500));
    let idle_pss_kib = pss_of(&clones, &dirs)?;
    for clone in &mut clones {
        clone.type_in(b"\n")?;
    }
    for clone in &clones {
        let steps = clone.wait_for("checkpoint 2: ", MEMORY_TIMEOUT)?;
        if !steps.contains("step 2: ok") {
            return Err(format!("a clone's verification failed: {steps}"));
        }
    }
    let read_back_pss_kib = pss_of(&clones, &dirs)?;
    drop(clones);
    for file in [&memory, &state] {
        let _ = std::fs::remove_file(file);
    }
    for clone_dir in &dirs {
        let _ = std::fs::remove_dir_all(clone_dir);
    }
    Ok(Clones {
        loads,
        all_running,
        idle_pss_kib,
        read_back_pss_kib,
    })
}

/// Each clone's PSS; where one ended, the end of its log (Firecracker's) says why.
fn pss_of(clones: &[ApiProcess], dirs: &[std::path::PathBuf]) -> Result<Vec<u64>, String> {
    clones
        .iter()
        .zip(dirs)
        .map(|(clone, clone_dir)| {
            pss_kib(clone.child.id()).map_err(|e| {
                let log =
                    std::fs::read_to_string(clone_dir.join("firecracker.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                format!("{e}; the clone ended: {}", tail.join(" / "))
            })
        })
        .collect()
}

/// The median of `values` KiB, in MiB.
fn median_mib(values: &[u64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2] as f64 / 1024.0
}

/// Prints the clone rows of ours (loaded from `what`) beside `theirs` (named `name`).
pub fn print(name: &str, what: &str, count: usize, mib: u64, ours: &Clones, theirs: &Clones) {
    println!("\n| {count} clones of a {mib} MiB guest, every page written; ours from {what} | llfree-vmm | {name} | ratio (ours / {name}) |");
    println!("|---|---|---|---|");
    let ratio = ms(median(&ours.loads)) / ms(median(&theirs.loads));
    println!(
        "| each load to running, ms | {} | {} | {ratio:.3} |",
        summary(&ours.loads),
        summary(&theirs.loads)
    );
    println!(
        "| all {count} running, ms | {:.1} | {:.1} | {:.3} |",
        ms(ours.all_running),
        ms(theirs.all_running),
        ms(ours.all_running) / ms(theirs.all_running)
    );
    for (row, ours, theirs) in [
        (
            "PSS per idle clone, MiB (median)",
            &ours.idle_pss_kib,
            &theirs.idle_pss_kib,
        ),
        (
            "PSS per clone after reading all its memory back, MiB (median)",
            &ours.read_back_pss_kib,
            &theirs.read_back_pss_kib,
        ),
    ] {
        let (a, b) = (median_mib(ours), median_mib(theirs));
        println!("| {row} | {a:.1} | {b:.1} | {:.3} |", a / b);
    }
}
