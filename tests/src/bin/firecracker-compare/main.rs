//! Our VMM and Firecracker (and Cloud Hypervisor) side by side on this host, driven the same
//! way through their APIs and booting the same guest: the test guest's image (`vmm
//! guest-image`), which boots itself through the PVH boot protocol under each (the word
//! `self-boot` on its command line has our VMM boot it as the others do). See
//! `tests/firecracker-compare/run.sh`.
//!
//! ```text
//! firecracker-compare [--firecracker PATH] [--cloud-hypervisor PATH] [--runs N]
//!                     [--sizes GIB,...] [--dir DIR] [--populate lazy|eager]
//!                     [--clones N [--clone-mib MIB]]
//! ```
//!
//! `--populate` is our VM's population (`machine-config`'s extension; default lazy, as
//! Firecracker's memory): eager maps every frame before the guest starts, a snapshot's too
//! when it is loaded.
//!
//! Rows, each VMM in turn (the order alternating between runs):
//! * boot (`--runs` times, 128 MiB): spawn to the API socket answering, `InstanceStart`
//!   answered, and the guest's first console line, from the spawn;
//! * snapshots, per size in `--sizes` GiB (one run each): the guest writes a pattern into every
//!   page of its RAM and waits at a checkpoint; paused, `PUT /snapshot/create` (ours: into the
//!   VM's zone, nothing copied; Firecracker: a Full snapshot, its memory written to a file);
//!   the VMM is killed; a new process loads the snapshot (`resume_vm`; Firecracker's File
//!   backend maps the memory file MAP_PRIVATE, ours the zone) — "load to running" is the
//!   client's time of that request; the guest is then let go at its checkpoint, verifies every
//!   page and prints its result — "load and read back" is the time from the load request to
//!   that line, which must say the verification passed;
//! * clones (`--clones N`, with Firecracker): N VMs loaded at once from one snapshot of a
//!   `--clone-mib` guest, ours from a copy snapshot and from a zone snapshot (see `clones`).
//!
//! Cloud Hypervisor (through its own API: `vm.create`, then `vm.boot` in `InstanceStart`'s
//! place) takes the boot rows only: its snapshot fails on this host's PVM `/dev/kvm`
//! (`KVM_GET_NESTED_STATE` is refused with EINVAL).
//!
//! Prints a Markdown table per VMM compared: ours, theirs and the ratio (ours / theirs) per
//! row. The `vmm` is the one beside this program, or `LLFREE_VMM_BIN`.

mod clones;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use e2e_tests::api_process::{call, median, ms, summary, vmm_beside_this_program, ApiProcess};

/// How long a boot or a load may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long writing or verifying all memory may take (every instruction is emulated on a PVM
/// host: about 1.5 s per GiB).
const MEMORY_TIMEOUT: Duration = Duration::from_secs(600);
/// The guest's first console line.
const FIRST_LINE: &str = "llfree-vmm test guest: ";
/// What the guest prints at its snapshot's checkpoint.
const CHECKPOINT: &str = "checkpoint 1: waiting for a byte on the console\n";

/// How a VMM under test is driven.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Ours: the VM lives in a zone (zero-copy snapshots).
    Ours,
    /// Through Firecracker's API. `log_file`: Firecracker itself (its `--version` says so),
    /// whose log goes to a file; another binary in its place (our `vmm`, as the harness's own
    /// test runs it) takes Firecracker's requests.
    Firecracker { log_file: bool },
    /// Cloud Hypervisor, through its own API.
    CloudHypervisor,
}

/// One VMM under test.
struct Vmm {
    name: &'static str,
    binary: PathBuf,
    kind: Kind,
}

/// What one boot measured, from the spawn.
struct Boot {
    socket: Duration,
    started: Duration,
    first_line: Duration,
}

/// What one snapshot case measured.
struct SnapshotCase {
    create: Duration,
    load: Duration,
    load_and_read_back: Duration,
}

/// Spawns `vmm`'s API process on socket `name` in `dir`; Firecracker's log goes to a file
/// there (by default it shares stdout with the guest's console).
fn spawn(vmm: &Vmm, dir: &Path, name: &str) -> Result<ApiProcess, String> {
    let log = dir.join("firecracker.log");
    let log = log.to_string_lossy();
    let extra: &[&str] = if vmm.kind == (Kind::Firecracker { log_file: true }) {
        std::fs::write(&*log, "").map_err(|e| format!("{log}: {e}"))?;
        &["--log-path", &log]
    } else {
        &[]
    };
    let flag = if vmm.kind == Kind::CloudHypervisor {
        "--api-socket"
    } else {
        "--api-sock"
    };
    ApiProcess::spawn_with_flag(&vmm.binary, flag, &dir.join(name), extra)
}

/// Spawns `vmm`'s API process in `dir` and configures a VM of `mib` MiB booting `image` with
/// `workload`; ours in the zone `zone` where given.
fn configured(
    vmm: &Vmm,
    dir: &Path,
    image: &Path,
    mib: u64,
    workload: &str,
    zone: Option<(&Path, &str)>,
) -> Result<(ApiProcess, Duration), String> {
    let mut process = spawn(vmm, dir, "api.sock")?;
    let socket = process.wait_for_socket(TIMEOUT)?;
    let cmdline = format!("console=ttyS0 reboot=k panic=1 self-boot workload={workload}");
    if vmm.kind == Kind::CloudHypervisor {
        let config = serde_json::json!({
            "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
            "memory": {"size": mib << 20},
            "payload": {"kernel": image, "cmdline": cmdline},
            "serial": {"mode": "Tty"},
            "console": {"mode": "Off"},
        });
        process.call("PUT", "/api/v1/vm.create", &config.to_string())?;
        return Ok((process, socket));
    }
    let mut machine = serde_json::json!({"vcpu_count": 1, "mem_size_mib": mib});
    if let Some((zone, populate)) = zone {
        machine["zone"] = serde_json::json!({"path": zone, "vm": "bench"});
        machine["populate"] = serde_json::json!(populate);
    }
    process.call("PUT", "/machine-config", &machine.to_string())?;
    let boot = serde_json::json!({
        "kernel_image_path": image,
        "boot_args": cmdline,
    });
    process.call("PUT", "/boot-source", &boot.to_string())?;
    Ok((process, socket))
}

fn boot(vmm: &Vmm, dir: &Path, image: &Path) -> Result<Boot, String> {
    let (process, socket) = configured(vmm, dir, image, 128, "write:all,verify:all", None)?;
    if vmm.kind == Kind::CloudHypervisor {
        call(&process.api, "PUT", "/api/v1/vm.boot", None)?;
    } else {
        process.call("PUT", "/actions", r#"{"action_type":"InstanceStart"}"#)?;
    }
    let started = process.spawned.elapsed();
    process.wait_for(FIRST_LINE, TIMEOUT)?;
    let first_line = process.spawned.elapsed();
    process.wait_for("test guest: done\n", MEMORY_TIMEOUT)?;
    Ok(Boot {
        socket,
        started,
        first_line,
    })
}

fn snapshot(
    vmm: &Vmm,
    dir: &Path,
    image: &Path,
    gib: u64,
    populate: &str,
) -> Result<SnapshotCase, String> {
    let zone = dir.join("zone");
    let memory = dir.join("memory");
    let state = dir.join("vm.snap");
    for file in [&zone, &memory, &state] {
        let _ = std::fs::remove_file(file);
    }
    let ours = vmm.kind == Kind::Ours;
    if ours {
        let size = format!("{gib}G");
        let created = Command::new(&vmm.binary)
            .args(["zone", "create"])
            .arg(&zone)
            .args(["--size", &size])
            .output()
            .map_err(|e| e.to_string())?;
        if !created.status.success() {
            return Err(String::from_utf8_lossy(&created.stderr).into_owned());
        }
    }
    let result = (|| {
        let workload = "write:all,checkpoint:1,verify:all";
        let zone_option = ours.then_some((zone.as_path(), populate));
        let (process, _) = configured(vmm, dir, image, gib << 10, workload, zone_option)?;
        process.call("PUT", "/actions", r#"{"action_type":"InstanceStart"}"#)?;
        process.wait_for(CHECKPOINT, MEMORY_TIMEOUT)?;
        process.call("PATCH", "/vm", r#"{"state":"Paused"}"#)?;
        let mut create = serde_json::json!({"snapshot_path": state});
        if ours {
            create["mem_file_path"] = serde_json::json!(zone);
        } else {
            create["snapshot_type"] = serde_json::json!("Full");
            create["mem_file_path"] = serde_json::json!(memory);
        }
        let asked = Instant::now();
        process.call("PUT", "/snapshot/create", &create.to_string())?;
        let create = asked.elapsed();
        drop(process);

        let mut loaded = spawn(vmm, dir, "load.sock")?;
        loaded.wait_for_socket(TIMEOUT)?;
        let backing = if ours { &zone } else { &memory };
        let load = serde_json::json!({
            "snapshot_path": state,
            "mem_backend": {"backend_type": "File", "backend_path": backing},
            "resume_vm": true,
        });
        let asked = Instant::now();
        loaded.call("PUT", "/snapshot/load", &load.to_string())?;
        let load = asked.elapsed();
        loaded.type_in(b"\n")?;
        let steps = loaded.wait_for("test guest: ", MEMORY_TIMEOUT)?;
        let load_and_read_back = asked.elapsed();
        if loaded.wait_for("\n", TIMEOUT)? != "done\n" {
            return Err(format!("the loaded guest's verification failed: {steps}"));
        }
        Ok(SnapshotCase {
            create,
            load,
            load_and_read_back,
        })
    })();
    for file in [&zone, &memory, &state] {
        let _ = std::fs::remove_file(file);
    }
    result
}

/// The command line.
struct Options {
    firecracker: Option<PathBuf>,
    cloud_hypervisor: Option<PathBuf>,
    runs: usize,
    sizes: Vec<u64>,
    dir: PathBuf,
    populate: String,
    /// Clones loaded at once from one snapshot (0: none), of a guest of `clone_mib`.
    clones: usize,
    clone_mib: u64,
}

/// Parses the command line.
fn options() -> Result<Options, String> {
    let (mut firecracker, mut cloud_hypervisor) = (None, None);
    let (mut runs, mut sizes, mut dir) = (5, vec![1, 8], std::env::temp_dir());
    let mut populate = "lazy".to_owned();
    let (mut clones, mut clone_mib) = (0, 128);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--firecracker" => firecracker = Some(PathBuf::from(value()?)),
            "--cloud-hypervisor" => cloud_hypervisor = Some(PathBuf::from(value()?)),
            "--runs" => runs = value()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--sizes" => {
                sizes = value()?
                    .split(',')
                    .map(|gib| gib.parse().map_err(|e| format!("--sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--dir" => dir = PathBuf::from(value()?),
            "--clones" => clones = value()?.parse().map_err(|e| format!("--clones: {e}"))?,
            "--clone-mib" => {
                clone_mib = value()?.parse().map_err(|e| format!("--clone-mib: {e}"))?
            }
            "--populate" => {
                populate = value()?;
                if populate != "lazy" && populate != "eager" {
                    return Err("--populate is lazy or eager".into());
                }
            }
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    if firecracker.is_none() && cloud_hypervisor.is_none() {
        return Err("--firecracker PATH or --cloud-hypervisor PATH (or both) is required".into());
    }
    if runs == 0 || sizes.contains(&0) {
        return Err("--runs and --sizes must be at least 1".into());
    }
    Ok(Options {
        firecracker,
        cloud_hypervisor,
        runs,
        sizes,
        dir,
        populate,
        clones,
        clone_mib,
    })
}

/// A table row: ours, theirs and the ratio of the medians.
fn row(name: &str, ours: Vec<Duration>, theirs: Vec<Duration>) {
    let ratio = ms(median(&ours)) / ms(median(&theirs));
    println!(
        "| {name} | {} | {} | {ratio:.3} |",
        summary(&ours),
        summary(&theirs)
    );
}

fn compare() -> Result<(), String> {
    let options = options()?;
    let dir = options
        .dir
        .join(format!("firecracker-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = measure_and_print(&options, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Measures our VMM and the others named with scratch files in `dir` and prints the tables.
fn measure_and_print(options: &Options, dir: &Path) -> Result<(), String> {
    let (runs, sizes) = (options.runs, &options.sizes);
    let image = dir.join("guest.elf");
    std::fs::write(&image, vmm::testguest::IMAGE).map_err(|e| e.to_string())?;
    let version = |binary: &Path| -> Result<String, String> {
        let output = Command::new(binary)
            .arg("--version")
            .output()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        Ok(stdout.lines().next().unwrap_or_default().trim().to_owned())
    };
    let ours = vmm_beside_this_program();
    println!("llfree-vmm: {} ({})", ours.display(), version(&ours)?);
    let mut vmms = vec![Vmm {
        name: "llfree-vmm",
        binary: ours,
        kind: Kind::Ours,
    }];
    if let Some(binary) = &options.firecracker {
        let theirs = version(binary)?;
        println!("firecracker: {} ({theirs})", binary.display());
        vmms.push(Vmm {
            name: "Firecracker",
            binary: binary.clone(),
            kind: Kind::Firecracker {
                log_file: theirs.starts_with("Firecracker"),
            },
        });
    }
    if let Some(binary) = &options.cloud_hypervisor {
        println!(
            "cloud-hypervisor: {} ({})",
            binary.display(),
            version(binary)?
        );
        vmms.push(Vmm {
            name: "Cloud Hypervisor",
            binary: binary.clone(),
            kind: Kind::CloudHypervisor,
        });
    }
    // Each run boots every VMM once, the order rotating between runs.
    let mut boots: Vec<Vec<Boot>> = vmms.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        for offset in 0..vmms.len() {
            let which = (run + offset) % vmms.len();
            let vmm = &vmms[which];
            let measured =
                boot(vmm, dir, &image).map_err(|e| format!("{}: boot: {e}", vmm.name))?;
            boots[which].push(measured);
        }
    }
    // Snapshots: ours and Firecracker (the second VMM), where Firecracker was given.
    let snapshotted = if options.firecracker.is_some() { 2 } else { 0 };
    let mut snapshots: Vec<Vec<(u64, SnapshotCase)>> = vec![Vec::new(), Vec::new()];
    for (index, &gib) in sizes.iter().enumerate() {
        for offset in 0..snapshotted {
            let which = (index + offset) % snapshotted;
            let vmm = &vmms[which];
            let measured = snapshot(vmm, dir, &image, gib, &options.populate)
                .map_err(|e| format!("{}: {gib} GiB snapshot: {e}", vmm.name))?;
            snapshots[which].push((gib, measured));
        }
    }
    // Clones: ours and Firecracker, Firecracker first (the page cache warm for neither: each
    // writes its own memory file).
    let cloned = match (options.clones, snapshotted) {
        (0, _) | (_, 0) => None,
        (count, _) => {
            let mib = options.clone_mib;
            let theirs = clones::measure(&vmms[1], dir, &image, mib, count, false)
                .map_err(|e| format!("{}: clones: {e}", vmms[1].name))?;
            let ours = clones::measure(&vmms[0], dir, &image, mib, count, false)
                .map_err(|e| format!("{}: clones: {e}", vmms[0].name))?;
            let zone = clones::measure(&vmms[0], dir, &image, mib, count, true)
                .map_err(|e| format!("{}: zone clones: {e}", vmms[0].name))?;
            Some((ours, zone, theirs))
        }
    };
    for (other, theirs) in vmms.iter().enumerate().skip(1) {
        let name = theirs.name;
        println!("\n| row, ms: median (min–max) | llfree-vmm | {name} | ratio (ours / {name}) |");
        println!("|---|---|---|---|");
        let phase = |f: fn(&Boot) -> Duration| -> [Vec<Duration>; 2] {
            [
                boots[0].iter().map(f).collect(),
                boots[other].iter().map(f).collect(),
            ]
        };
        let [ours, theirs_times] = phase(|b| b.socket);
        row(
            &format!("spawn to API socket ({runs} runs)"),
            ours,
            theirs_times,
        );
        let [ours, theirs_times] = phase(|b| b.started);
        let start = if theirs.kind == Kind::CloudHypervisor {
            "InstanceStart (vm.boot) answered"
        } else {
            "InstanceStart answered"
        };
        row(&format!("spawn to {start} (128 MiB)"), ours, theirs_times);
        let [ours, theirs_times] = phase(|b| b.first_line);
        row(
            "spawn to the guest's first console line",
            ours,
            theirs_times,
        );
        if other >= snapshotted {
            continue;
        }
        for (index, &gib) in sizes.iter().enumerate() {
            let pick = |f: fn(&SnapshotCase) -> Duration| -> [Vec<Duration>; 2] {
                [
                    vec![f(&snapshots[0][index].1)],
                    vec![f(&snapshots[other][index].1)],
                ]
            };
            let [ours, theirs_times] = pick(|s| s.create);
            row(
                &format!("{gib} GiB, every page written: snapshot create (paused)"),
                ours,
                theirs_times,
            );
            let [ours, theirs_times] = pick(|s| s.load);
            row(&format!("{gib} GiB: load to running"), ours, theirs_times);
            let [ours, theirs_times] = pick(|s| s.load_and_read_back);
            row(
                &format!("{gib} GiB: load and read every page back (verified)"),
                ours,
                theirs_times,
            );
        }
    }
    if let Some((ours, zone, theirs)) = &cloned {
        for (what, ours) in [("a copy snapshot", ours), ("a zone snapshot", zone)] {
            let (count, mib) = (options.clones, options.clone_mib);
            clones::print(vmms[1].name, what, count, mib, ours, theirs);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match compare() {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("error: {why}");
            ExitCode::FAILURE
        }
    }
}
