//! Shared by the `vmm run` end-to-end tests: the `vmm` command as a process with its output
//! captured, scratch directories, and its API.

#![allow(dead_code)] // Each test file uses its own part.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm::api::ApiClient;

/// The `vmm` command.
pub const VMM: &str = env!("CARGO_BIN_EXE_vmm-cli");

/// A scratch directory, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(test: &str) -> Self {
        let path = std::env::temp_dir().join(format!("vmm-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    pub fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How a `vmm` process ended.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Asserts exit status `code` and exactly one `error:` line on stderr containing `text`.
    pub fn assert_fails(&self, code: i32, text: &str) {
        assert_eq!(self.code, Some(code), "{self:#?}");
        assert_eq!(self.stderr.lines().count(), 1, "one line: {self:#?}");
        assert!(
            self.stderr.starts_with("error: ") && self.stderr.contains(text),
            "{self:#?}"
        );
    }

    /// Asserts a clean exit (status 0, nothing on stderr).
    pub fn assert_success(&self) {
        assert_eq!(self.code, Some(0), "{self:#?}");
        assert!(self.stderr.is_empty(), "{self:#?}");
    }
}

fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = pipe.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    })
}

/// A `vmm run` process, killed if the test ends before it does.
pub struct VmmRun {
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl VmmRun {
    /// Starts `vmm run ARGS` with stdin from /dev/null and stdout and stderr captured.
    pub fn start(args: &[&str]) -> Self {
        let mut child = Command::new(VMM)
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vmm run");
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        VmmRun {
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// Runs `vmm run ARGS` to its end (at most 120 s).
    pub fn run(args: &[&str]) -> Finished {
        Self::start(args).wait(Duration::from_secs(120))
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (a name such as "INT") to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(mut self) -> Finished {
        let _ = self.child.kill();
        self.wait(Duration::from_secs(10))
    }

    /// Waits for the exit.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "vmm run did not end within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        Finished {
            code: status.code(),
            stdout: self.stdout.take().unwrap().join().unwrap(),
            stderr: self.stderr.take().unwrap().join().unwrap(),
        }
    }

    /// Waits until the API socket at `socket` exists and returns a client for it.
    pub fn api(&mut self, socket: &str) -> ApiClient {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !Path::new(socket).exists() {
            assert!(self.running(), "vmm run ended before serving its API");
            assert!(Instant::now() < deadline, "no API socket after 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        ApiClient::new(socket)
    }
}

impl Drop for VmmRun {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `GET path`, which must answer 200 with JSON.
pub fn get(client: &ApiClient, path: &str) -> serde_json::Value {
    let response = client.request("GET", path, None).unwrap();
    assert_eq!(response.status, 200, "{path}: {}", response.body);
    serde_json::from_str(&response.body).unwrap()
}

/// Sends a request that must answer 204.
pub fn send(client: &ApiClient, method: &str, path: &str, body: &str) {
    let response = client.request(method, path, Some(body)).unwrap();
    assert_eq!(response.status, 204, "{method} {path}: {}", response.body);
}

/// Waits until the VM is in `state` (as GET /machine tells).
pub fn wait_for_state(client: &ApiClient, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(client, "/machine")["state"] != state {
        assert!(
            Instant::now() < deadline,
            "the VM is not {state} after 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `vmm ARGS` (a client subcommand) to its end.
pub fn client(args: &[&str]) -> Finished {
    let output = Command::new(VMM).args(args).output().expect("run vmm");
    Finished {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
