//! `vmm-bench api`: `GET /version` answered by a waiting `vmm --api-sock` and by the API of a
//! started VM (`vmm run --api-socket`, paused at a checkpoint), on one kept
//! connection (HTTP/1.1 keep-alive, as curl and the Firecracker Go SDK use it) and with a
//! connection per request (`Connection: close`), per request; every answer is read by its
//! Content-Length and checked to be the version.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Args;

/// Requests per measurement.
const REQUESTS: u32 = 2000;

/// Reads one response from `stream`: checks that it is a 200 with the version.
fn read_version(stream: &mut BufReader<UnixStream>) -> Result<(), String> {
    let mut length = None;
    let mut status = String::new();
    stream.read_line(&mut status).map_err(|e| e.to_string())?;
    if !status.starts_with("HTTP/1.1 200 ") {
        return Err(format!("answer {status:?}"));
    }
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).map_err(|e| e.to_string())?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(value) = line.strip_prefix("Content-Length: ") {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let mut body = vec![0; length.ok_or("no Content-Length")?];
    stream.read_exact(&mut body).map_err(|e| e.to_string())?;
    match String::from_utf8_lossy(&body).contains("firecracker_version") {
        true => Ok(()),
        false => Err(format!(
            "not the version: {}",
            String::from_utf8_lossy(&body)
        )),
    }
}

/// `REQUESTS` on one connection; the time per request.
fn kept(socket: &str) -> Result<Duration, String> {
    let stream = UnixStream::connect(socket).map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let started = Instant::now();
    for _ in 0..REQUESTS {
        writer
            .write_all(b"GET /version HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .map_err(|e| e.to_string())?;
        read_version(&mut reader)?;
    }
    Ok(started.elapsed() / REQUESTS)
}

/// `REQUESTS`, each on a connection of its own; the time per request.
fn fresh(socket: &str) -> Result<Duration, String> {
    let started = Instant::now();
    for _ in 0..REQUESTS {
        let mut stream = UnixStream::connect(socket).map_err(|e| e.to_string())?;
        stream
            .write_all(b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .map_err(|e| e.to_string())?;
        read_version(&mut BufReader::new(stream))?;
    }
    Ok(started.elapsed() / REQUESTS)
}

/// Measures `--runs` rounds of both against a VMM that waits for a VM (`vmm --api-sock`) and
/// against one whose test guest has started and waits at a checkpoint (its API runs under its
/// seccomp filters, where they are on).
pub fn api_requests(args: &Args) -> Result<(), String> {
    let socket = std::env::temp_dir().join(format!("vmm-bench-api-{}.sock", std::process::id()));
    let socket = socket.to_string_lossy().into_owned();
    let waiting = ["--api-sock", &socket];
    let started = [
        "run",
        "--memory",
        "32M",
        "--workload",
        "checkpoint:1",
        "--api-socket",
        &socket,
    ];
    for (vmm_args, what) in [
        (&waiting[..], "a VMM waiting for its VM"),
        (&started[..], "a VM started and paused"),
    ] {
        println!("api, {what}: {REQUESTS} GET /version per measurement, per request:");
        measure(args, vmm_args, &socket)?;
    }
    Ok(())
}

/// Starts `vmm VMM_ARGS`, waits for its API on `socket` and measures `--runs` rounds.
fn measure(args: &Args, vmm_args: &[&str], socket: &str) -> Result<(), String> {
    let mut vmm = Command::new(&args.vmm)
        .args(vmm_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", args.vmm.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(socket).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let measured = (0..args.runs).try_for_each(|run| {
        let (kept, fresh) = (kept(socket)?, fresh(socket)?);
        println!(
            "  round {}: one kept connection {:.0} µs, a connection each {:.0} µs",
            run + 1,
            kept.as_secs_f64() * 1e6,
            fresh.as_secs_f64() * 1e6
        );
        Ok(())
    });
    let _ = vmm.kill();
    let _ = vmm.wait();
    let _ = std::fs::remove_file(socket);
    measured
}
