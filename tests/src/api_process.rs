//! A VMM process driven through Firecracker's API from the outside, for the benchmarks that
//! time one (`firecracker-api-bench`, `firecracker-compare`): its console read on a thread,
//! requests that must succeed, and the figures' format.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use vmm_cli::ApiClient;

/// The `vmm` a benchmark binary drives: `LLFREE_VMM_BIN`, or the one beside the program.
pub fn vmm_beside_this_program() -> PathBuf {
    match std::env::var_os("LLFREE_VMM_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join("vmm")))
            .unwrap_or_else(|| PathBuf::from("vmm")),
    }
}

/// A VMM started with its API socket (`--api-sock` for our `vmm` and Firecracker), its console
/// (stdout) read on a thread and its stdin (the guest's console input) a pipe.
#[derive(Debug)]
pub struct ApiProcess {
    /// The process.
    pub child: Child,
    /// A client of its socket.
    pub api: ApiClient,
    /// When it was spawned.
    pub spawned: Instant,
    console: Receiver<u8>,
    input: ChildStdin,
}

impl ApiProcess {
    /// Spawns `binary --api-sock SOCKET` (SOCKET removed first) with `extra` arguments after
    /// it, stderr discarded.
    pub fn spawn(binary: &Path, socket: &Path, extra: &[&str]) -> Result<Self, String> {
        Self::spawn_with_flag(binary, "--api-sock", socket, extra)
    }

    /// [`ApiProcess::spawn`] for a VMM whose socket flag is `flag` (Cloud Hypervisor's is
    /// `--api-socket`).
    pub fn spawn_with_flag(
        binary: &Path,
        flag: &str,
        socket: &Path,
        extra: &[&str],
    ) -> Result<Self, String> {
        let _ = std::fs::remove_file(socket);
        let spawned = Instant::now();
        let mut child = Command::new(binary)
            .arg(flag)
            .arg(socket)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", binary.display()))?;
        let input = child.stdin.take().expect("piped stdin");
        let console = console_reader(&mut child);
        Ok(ApiProcess {
            child,
            api: ApiClient::new(socket),
            spawned,
            console,
            input,
        })
    }

    /// Waits until the socket answers `GET /` (at most `timeout`); returns the time since the
    /// spawn.
    pub fn wait_for_socket(&mut self, timeout: Duration) -> Result<Duration, String> {
        while self.api.request("GET", "/", None).is_err() {
            if self.spawned.elapsed() > timeout {
                let _ = self.child.kill();
                return Err("no API socket".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(self.spawned.elapsed())
    }

    /// Sends one request that must succeed.
    pub fn call(&self, method: &str, path: &str, body: &str) -> Result<(), String> {
        call(&self.api, method, path, Some(body))
    }

    /// Waits (at most `timeout`) until `text` has come on the console since the last wait.
    pub fn wait_for(&self, text: &str, timeout: Duration) -> Result<String, String> {
        wait_for(&self.console, text, timeout)
    }

    /// Writes `bytes` to the guest's console input.
    pub fn type_in(&mut self, bytes: &[u8]) -> Result<(), String> {
        std::io::Write::write_all(&mut self.input, bytes).map_err(|e| e.to_string())
    }
}

impl Drop for ApiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child's stdout, read on a thread of its own.
pub fn console_reader(child: &mut Child) -> Receiver<u8> {
    let mut stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while let Ok(1) = stdout.read(&mut byte) {
            if sender.send(byte[0]).is_err() {
                break;
            }
        }
    });
    receiver
}

/// Waits (at most `timeout`) until `text` has come on `console`; returns what came.
pub fn wait_for(console: &Receiver<u8>, text: &str, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    while !seen.ends_with(text.as_bytes()) {
        let left = deadline.saturating_duration_since(Instant::now());
        let byte = console.recv_timeout(left).map_err(|_| {
            format!(
                "no {text:?} on the console: {}",
                String::from_utf8_lossy(&seen)
            )
        })?;
        seen.push(byte);
    }
    Ok(String::from_utf8_lossy(&seen).into_owned())
}

/// Sends one request that must succeed.
pub fn call(api: &ApiClient, method: &str, path: &str, body: Option<&str>) -> Result<(), String> {
    let response = api
        .request(method, path, body)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    if !response.is_success() {
        return Err(format!(
            "{method} {path}: {} {}",
            response.status, response.body
        ));
    }
    Ok(())
}

/// `time` in ms.
pub fn ms(time: Duration) -> f64 {
    time.as_secs_f64() * 1e3
}

/// The median of `times` (not empty).
pub fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// `median (min–max)` of `times`, in ms.
pub fn summary(times: &[Duration]) -> String {
    let (min, max) = (times.iter().min(), times.iter().max());
    format!(
        "{:.1} ({:.1}–{:.1})",
        ms(median(times)),
        ms(*min.expect("no times")),
        ms(*max.expect("no times"))
    )
}
