//! Times the VMM started as Firecracker is (`vmm --api-sock`), driven the way Firecracker's
//! clients drive it, against `vmm run` booting the same guest, all from the outside:
//!
//! ```text
//! firecracker-api-bench RUNS [DIR]
//! ```
//!
//! Each run of the API path: spawn `vmm --api-sock` → its socket answers (`GET /`) → the
//! configuration (`PUT /machine-config`, `/boot-source` with an initrd, `/drives/rootfs`,
//! `/balloon`) → `PUT /actions InstanceStart` answered → the guest's first output (the minimal
//! ELF kernel of the tests prints its command line and initrd) → `SendCtrlAltDel` → the VMM's
//! exit. The `vmm run` path: spawn `vmm run --kernel ... --drive ... --balloon ...` → the
//! guest's first output. Prints every run and each phase's median (min–max) in ms; scratch files go to DIR
//! (default: the temp directory). The `vmm` is the one beside this program, or
//! `LLFREE_VMM_BIN`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::api_process::{
    call, console_reader, ms, summary, vmm_beside_this_program, wait_for,
};
use e2e_tests::{elf_kernel, CTRL_ALT_DEL_GUEST};
use vmm_cli::ApiClient;

/// How long any one wait may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// What the guest's initrd holds, and so prints last.
const INITRD: &str = "bench-initrd-end";

/// The phases of one API run, as durations from the spawn.
struct ApiRun {
    socket_ready: Duration,
    configured: Duration,
    started: Duration,
    first_output: Duration,
    exited: Duration,
}

fn api_run(dir: &Path, kernel: &str, initrd: &str, rootfs: &str) -> Result<ApiRun, String> {
    let socket = dir.join("bench.sock");
    let _ = std::fs::remove_file(&socket);
    let spawned = Instant::now();
    let mut child = Command::new(vmm_beside_this_program())
        .arg("--api-sock")
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn vmm: {e}"))?;
    let output = console_reader(&mut child);
    let api = ApiClient::new(&socket);
    while api.request("GET", "/", None).is_err() {
        if spawned.elapsed() > TIMEOUT {
            let _ = child.kill();
            return Err("no API socket".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let socket_ready = spawned.elapsed();
    call(
        &api,
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count":1,"mem_size_mib":64}"#),
    )?;
    let boot = format!(r#"{{"kernel_image_path":"{kernel}","initrd_path":"{initrd}"}}"#);
    call(&api, "PUT", "/boot-source", Some(&boot))?;
    let drive = format!(
        r#"{{"drive_id":"rootfs","path_on_host":"{rootfs}","is_root_device":true,"is_read_only":false}}"#
    );
    call(&api, "PUT", "/drives/rootfs", Some(&drive))?;
    call(
        &api,
        "PUT",
        "/balloon",
        Some(r#"{"amount_mib":0,"deflate_on_oom":true}"#),
    )?;
    let configured = spawned.elapsed();
    call(
        &api,
        "PUT",
        "/actions",
        Some(r#"{"action_type":"InstanceStart"}"#),
    )?;
    let started = spawned.elapsed();
    wait_for(&output, INITRD, TIMEOUT)?;
    let first_output = spawned.elapsed();
    call(
        &api,
        "PUT",
        "/actions",
        Some(r#"{"action_type":"SendCtrlAltDel"}"#),
    )?;
    let status = child.wait().map_err(|e| e.to_string())?;
    let exited = spawned.elapsed();
    if !status.success() {
        return Err(format!("vmm --api-sock ended with {status}"));
    }
    Ok(ApiRun {
        socket_ready,
        configured,
        started,
        first_output,
        exited,
    })
}

fn run_run(kernel: &str, initrd: &str, rootfs: &str) -> Result<Duration, String> {
    let spawned = Instant::now();
    let drive = format!("id=rootfs,path={rootfs},root=on");
    let mut child = Command::new(vmm_beside_this_program())
        .args([
            "run", "--memory", "64M", "--kernel", kernel, "--initrd", initrd,
        ])
        .args(["--drive", &drive, "--balloon", "size=0,deflate_on_oom=on"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn vmm run: {e}"))?;
    let output = console_reader(&mut child);
    wait_for(&output, INITRD, TIMEOUT)?;
    let first_output = spawned.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    Ok(first_output)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (runs, dir) = match args.as_slice() {
        [runs] => (runs.parse::<usize>().ok(), std::env::temp_dir()),
        [runs, dir] => (runs.parse::<usize>().ok(), PathBuf::from(dir)),
        _ => (None, PathBuf::new()),
    };
    let Some(runs) = runs.filter(|&runs| runs > 0) else {
        eprintln!("usage: firecracker-api-bench RUNS [DIR]");
        return ExitCode::from(2);
    };
    let dir = dir.join(format!("firecracker-api-bench-{}", std::process::id()));
    let files = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::write(dir.join("vmlinux"), elf_kernel(CTRL_ALT_DEL_GUEST))?;
        std::fs::write(dir.join("initrd"), INITRD)?;
        std::fs::write(dir.join("rootfs"), vec![0u8; 1 << 20])
    });
    if let Err(e) = files {
        eprintln!("error: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let (kernel, initrd, rootfs) = (path("vmlinux"), path("initrd"), path("rootfs"));
    let mut api = Vec::with_capacity(runs);
    let mut run = Vec::with_capacity(runs);
    for i in 1..=runs {
        let measured = api_run(&dir, &kernel, &initrd, &rootfs)
            .and_then(|a| run_run(&kernel, &initrd, &rootfs).map(|r| (a, r)));
        match measured {
            Ok((a, r)) => {
                println!(
                    "run {i}: api socket {:.1} configured {:.1} InstanceStart answered {:.1} \
                     first output {:.1} exit after Ctrl-Alt-Del {:.1}; vmm run first output {:.1} (ms)",
                    ms(a.socket_ready),
                    ms(a.configured),
                    ms(a.started),
                    ms(a.first_output),
                    ms(a.exited),
                    ms(r)
                );
                api.push(a);
                run.push(r);
            }
            Err(why) => {
                eprintln!("error: run {i}: {why}");
                let _ = std::fs::remove_dir_all(&dir);
                return ExitCode::FAILURE;
            }
        }
    }
    let phase = |f: fn(&ApiRun) -> Duration| summary(&api.iter().map(f).collect::<Vec<_>>());
    println!(
        "median (min–max) over {runs} runs, ms from the spawn: api socket {}, configured \
         (4 PUTs) {}, InstanceStart answered {}, first output {}, exit after Ctrl-Alt-Del {}; \
         vmm run to first output {}",
        phase(|a| a.socket_ready),
        phase(|a| a.configured),
        phase(|a| a.started),
        phase(|a| a.first_output),
        phase(|a| a.exited),
        summary(&run)
    );
    let _ = std::fs::remove_dir_all(&dir);
    ExitCode::SUCCESS
}
