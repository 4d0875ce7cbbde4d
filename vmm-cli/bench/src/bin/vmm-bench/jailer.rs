//! `jailer`: what starting a VMM through `vmm-jailer` (beside the `vmm` command) costs: time
//! from spawning until `GET /` on the VMM's API socket answers 200, for `vmm --api-sock` and
//! for `vmm-jailer ... -- --api-sock /run/api.sock`, alternating, `--runs` times each. Each
//! jailed run checks that its VMM runs as the jailer's uid before the time counts.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmm_cli::ApiClient;

use crate::{summary, Args};

/// The uid and gid the jailed VMMs run as.
const JAILED_ID: &str = "4242";

/// Waits until `socket` answers `GET /` with 200; the time since `spawned`.
fn until_answered(socket: &Path, vmm: &mut Child, spawned: Instant) -> Result<Duration, String> {
    let api = ApiClient::new(socket);
    loop {
        if api.request("GET", "/", None).is_ok_and(|r| r.status == 200) {
            return Ok(spawned.elapsed());
        }
        if let Ok(Some(status)) = vmm.try_wait() {
            return Err(format!("the VMM ended ({status}) before its API answered"));
        }
        if spawned.elapsed() > Duration::from_secs(30) {
            return Err("no API answer after 30 s".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn spawn(program: &Path, args: &[&str]) -> Result<Child, String> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", program.display()))
}

fn stop(mut vmm: Child) {
    let _ = vmm.kill();
    let _ = vmm.wait();
}

/// Measures plain and jailed starts alternately.
pub fn jailer(args: &Args) -> Result<(), String> {
    let jailer = args.vmm.with_file_name("vmm-jailer");
    if !jailer.is_file() {
        return Err(format!(
            "no vmm-jailer beside {} (cargo build --release -p vmm-jailer)",
            args.vmm.display()
        ));
    }
    let scratch = std::env::temp_dir().join(format!("vmm-bench-jailer-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let base = scratch.join("jails");
    let vmm = args.vmm.to_string_lossy().into_owned();
    let base_arg = base.to_string_lossy().into_owned();
    println!(
        "jailer: spawn to the first answer of GET /, {} runs each, median (min–max):",
        args.runs
    );
    let (mut plain, mut jailed) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        let socket = scratch.join(format!("plain-{run}.sock"));
        let spawned = Instant::now();
        let mut child = spawn(&args.vmm, &["--api-sock", &socket.to_string_lossy()])?;
        let answered = until_answered(&socket, &mut child, spawned);
        stop(child);
        plain.push(answered?);

        let id = format!("bench-{run}");
        let jailer_args = [
            "--id",
            &id,
            "--exec-file",
            &vmm,
            "--uid",
            JAILED_ID,
            "--gid",
            JAILED_ID,
            "--chroot-base-dir",
            &base_arg,
            "--",
            "--api-sock",
            "/run/api.sock",
        ];
        let socket = base.join("vmm").join(&id).join("root/run/api.sock");
        let spawned = Instant::now();
        let mut child = spawn(&jailer, &jailer_args)?;
        let answered = until_answered(&socket, &mut child, spawned);
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
        stop(child);
        let answered = answered?;
        let uid_line = format!("Uid:\t{JAILED_ID}\t{JAILED_ID}\t{JAILED_ID}\t{JAILED_ID}\n");
        if !status.is_ok_and(|s| s.contains(&uid_line)) {
            return Err(format!(
                "the jailed VMM of run {run} did not run as uid {JAILED_ID}"
            ));
        }
        jailed.push(answered);
    }
    println!("  plain vmm --api-sock, ms: {}", summary(plain));
    println!("  through vmm-jailer, ms: {}", summary(jailed));
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
