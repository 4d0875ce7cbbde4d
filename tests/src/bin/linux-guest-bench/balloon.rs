//! `balloon` mode: how long a guest takes to give 1 GiB to its balloon and take it back,
//! asked through Firecracker's API (`PATCH /balloon`), which ours and Firecracker serve alike.
//!
//! The guest runs `llfree.test=hotplug`, which reports its MemTotal whenever it changes.
//! Each time is from the request until the balloon's `actual_mib` (what the guest's driver
//! says it holds; from then on the memory is free on the host) reaches the target, and until
//! the guest's line saying its MemTotal changed by 1 GiB. Firecracker tells `actual_mib` only
//! in its balloon statistics: give its balloon a statistics interval.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use vmm_cli::ApiClient;

use crate::{Measured, Vmm, TIMEOUT};

pub const GIB_KIB: u64 = 1 << 20;
pub const GIB_MIB: u64 = 1 << 10;

/// The mode's options: `--api SOCKET`.
pub struct Options {
    socket: PathBuf,
}

impl Options {
    /// Parses the options between the run count and `--`.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        match args {
            [flag, socket] if flag == "--api" => Ok(Options {
                socket: socket.into(),
            }),
            _ => Err("balloon needs --api SOCKET".into()),
        }
    }
}

/// Sends a request to the API; returns the response's JSON (null when it has no body).
pub fn api_call(
    api: &ApiClient,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<Value, String> {
    let response = api
        .request(method, path, body)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    if !response.is_success() {
        return Err(format!("{method} {path}: {}", response.body));
    }
    Ok(serde_json::from_str(&response.body).unwrap_or(Value::Null))
}

/// How often [`poll`] asks. Each question is an API request on a new connection, which the
/// VMM answers with CPU time the guest's vCPU then lacks in L1 (whose CPUs are emulated on the
/// host's two; ours starts a thread per request): every 10 ms costs at most that much
/// resolution, and made ours 5-15 % faster than every millisecond did.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `done` every [`POLL_INTERVAL`] until it holds; returns when it first did.
pub fn poll(mut done: impl FnMut() -> Result<bool, String>, what: &str) -> Result<Instant, String> {
    let since = Instant::now();
    while !done()? {
        if since.elapsed() > TIMEOUT {
            return Err(format!("{what}: not after {TIMEOUT:?}"));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    Ok(Instant::now())
}

/// Inflates the balloon of the guest whose MemTotal is `full_kib` by 1 GiB and deflates it
/// again; the times of both.
pub fn cycle(api: &ApiClient, vmm: &Vmm, full_kib: u64) -> Result<Measured, String> {
    let set = |mib: u64| {
        let body = format!(r#"{{"amount_mib":{mib}}}"#);
        api_call(api, "PATCH", "/balloon", Some(&body)).map(drop)
    };
    // Ours says it in GET /balloon; Firecracker only in its statistics (which it serves
    // with a statistics interval set).
    let actual = || {
        if let Some(mib) = api_call(api, "GET", "/balloon", None)?["actual_mib"].as_u64() {
            return Ok(mib);
        }
        api_call(api, "GET", "/balloon/statistics", None)?["actual_mib"]
            .as_u64()
            .ok_or_else(|| "no actual_mib".to_string())
    };
    let faults = || guest_faults(api);
    let mut times = Vec::new();
    let before = faults();
    let asked = Instant::now();
    set(GIB_MIB)?;
    let inflated = poll(|| Ok(actual()? >= GIB_MIB), "inflate")?;
    let (shrunk, _) = vmm.wait_memtotal(|kib| kib + GIB_KIB <= full_kib)?;
    times.push(("balloon inflate", inflated - asked));
    times.push(("balloon inflate-memtotal", shrunk - asked));

    let inflated_faults = faults();
    let asked = Instant::now();
    set(0)?;
    let deflated = poll(|| Ok(actual()? == 0), "deflate")?;
    let (grown, _) = vmm.wait_memtotal(|kib| kib >= full_kib)?;
    times.push(("balloon deflate", deflated - asked));
    times.push(("balloon deflate-memtotal", grown - asked));
    if let (Some(before), Some(inflated), Some(after)) = (before, inflated_faults, faults()) {
        println!(
            "balloon faults: {} while inflating, {} while deflating",
            inflated - before,
            after - inflated
        );
    }
    Ok(times)
}

/// How many of the guest's page faults our VMM resolved (GET /memory); `None` where the VMM
/// has no such resource (Firecracker).
pub fn guest_faults(api: &ApiClient) -> Option<u64> {
    api_call(api, "GET", "/memory", None)
        .ok()
        .and_then(|memory| memory["guest"]["faults"].as_u64())
}

/// One run: the guest boots with its RAM, gives 1 GiB to its balloon and takes it back.
pub fn measure(command: &[String], options: &Options) -> Result<Measured, String> {
    // The socket a killed VMM of the run before left (Firecracker will not bind over it).
    remove_socket(&options.socket);
    let vmm = Vmm::start(command)?;
    let booted = vmm.wait_memtotal(|_| true)?.1;
    let api = ApiClient::new(&options.socket);
    cycle(&api, &vmm, booted)
}

fn remove_socket(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}
