//! Shared by the `vmm` end-to-end tests: the `vmm` command as a process with its output
//! captured, and its API (scratch directories and how a process ended are e2e_tests').

#![allow(dead_code, unused_imports)] // Each test file uses its own part.

use std::io::Read;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use e2e_tests::{vmm_binary, Finished, Scratch};
use vmm_cli::ApiClient;

/// The output collected so far, also after a test's panic (which does not stop the process
/// from writing).
fn lock(so_far: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    so_far.lock().unwrap_or_else(|e| e.into_inner())
}

/// What each thread of process `pid` is doing, as /proc tells it: its name, its state, the CPU
/// time it took in one second, the system call it is in (number and first arguments) and, as
/// root, its kernel stack. Where a VMM stopped making progress this tells a vCPU that runs or
/// waits in the guest (KVM_RUN) from one stuck in the VMM.
pub fn threads_report(pid: u32) -> String {
    let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("  (no /proc/{pid}/task)\n");
    };
    let mut tids: Vec<String> = tasks
        .flatten()
        .map(|task| task.file_name().to_string_lossy().into_owned())
        .collect();
    tids.sort_by_key(|tid| tid.parse::<u32>().unwrap_or(0));
    // The fields after the name: state, then (from the 12th on) user and system time in ticks.
    let stat = |tid: &str| {
        let stat = read(format!("/proc/{pid}/task/{tid}/stat"));
        let fields: Vec<String> = stat
            .rsplit(") ")
            .next()
            .unwrap_or_default()
            .split(' ')
            .map(str::to_owned)
            .collect();
        let ticks: u64 = fields
            .iter()
            .skip(11)
            .take(2)
            .filter_map(|t| t.parse::<u64>().ok())
            .sum();
        (fields.first().cloned().unwrap_or_default(), ticks)
    };
    let before: Vec<u64> = tids.iter().map(|tid| stat(tid).1).collect();
    std::thread::sleep(Duration::from_secs(1));
    let mut report = String::new();
    for (tid, before) in tids.iter().zip(before) {
        let task = format!("/proc/{pid}/task/{tid}");
        let (state, ticks) = stat(tid);
        let syscall: Vec<String> = read(format!("{task}/syscall"))
            .split_whitespace()
            .take(3)
            .map(str::to_owned)
            .collect();
        let stack: Vec<String> = read(format!("{task}/stack"))
            .lines()
            .filter_map(|frame| frame.split_whitespace().nth(1))
            .map(|frame| frame.split('+').next().unwrap_or(frame).to_owned())
            .take(8)
            .collect();
        report += &format!(
            "  {tid} {}: state {state}, {} ticks in 1 s, system call {}, kernel stack [{}]\n",
            read(format!("{task}/comm")).trim_end(),
            ticks.saturating_sub(before),
            syscall.join(" "),
            stack.join(" < ")
        );
    }
    report
}

/// Reads `pipe` to its end on a thread of its own, keeping what came so far in `so_far`.
fn collect(
    mut pipe: impl Read + Send + 'static,
    so_far: Arc<Mutex<Vec<u8>>>,
) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            lock(&so_far).extend_from_slice(&buf[..n]);
        }
        let text = lock(&so_far);
        String::from_utf8_lossy(&text).into_owned()
    })
}

/// A `vmm run` process, killed if the test ends before it does.
pub struct VmmRun {
    child: Child,
    /// What the process wrote on stdout and stderr so far.
    stdout_so_far: Arc<Mutex<Vec<u8>>>,
    stderr_so_far: Arc<Mutex<Vec<u8>>>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl VmmRun {
    /// Starts `vmm run ARGS` with stdin from /dev/null and stdout and stderr captured.
    pub fn start(args: &[&str]) -> Self {
        let mut command = vec!["run"];
        command.extend_from_slice(args);
        Self::start_command(&command)
    }

    /// Starts `vmm ARGS` (e.g. `--api-sock PATH` or `snapshot load ...`) as [`Self::start`]
    /// does.
    pub fn start_command(args: &[&str]) -> Self {
        Self::spawn(args, Stdio::null())
    }

    /// Starts `vmm run ARGS` as [`Self::start`] does, but with a pipe for stdin (the guest's
    /// console input), whose writing end it returns.
    pub fn start_with_console(args: &[&str]) -> (Self, ChildStdin) {
        let mut command = vec!["run"];
        command.extend_from_slice(args);
        let mut run = Self::spawn(&command, Stdio::piped());
        let console = run.child.stdin.take().unwrap();
        (run, console)
    }

    fn spawn(args: &[&str], stdin: Stdio) -> Self {
        let mut child = Command::new(vmm_binary())
            .args(args)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vmm run");
        let (stdout_so_far, stderr_so_far) = (Arc::default(), Arc::default());
        let stdout = collect(child.stdout.take().unwrap(), Arc::clone(&stdout_so_far));
        let stderr = collect(child.stderr.take().unwrap(), Arc::clone(&stderr_so_far));
        VmmRun {
            child,
            stdout_so_far,
            stderr_so_far,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// Runs `vmm run ARGS` to its end (at most 120 s).
    pub fn run(args: &[&str]) -> Finished {
        Self::start(args).wait(Duration::from_secs(120))
    }

    /// Waits until a whole line of stdout contains `text` (at most `timeout`) and returns it.
    /// Panics with what came so far when the process ends or the time is up first.
    pub fn wait_for_line(&mut self, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        // Whole lines only: the last one may still be on its way.
        let find = |so_far: &Mutex<Vec<u8>>| {
            String::from_utf8_lossy(&lock(so_far))
                .split_inclusive('\n')
                .find(|line| line.ends_with('\n') && line.contains(text))
                .map(|line| line.trim_end().to_owned())
        };
        loop {
            let ended = !self.running();
            if ended || Instant::now() >= deadline {
                // What the process wrote last may still be on its way through the pipe.
                std::thread::sleep(Duration::from_millis(300));
                if let Some(line) = find(&self.stdout_so_far) {
                    return line;
                }
                let state = match ended {
                    true => "ended".to_owned(),
                    false => format!("runs; its threads:\n{}", threads_report(self.pid())),
                };
                panic!(
                    "no line with {text:?} after {timeout:?} (the VMM {state}; stderr: {}): {}",
                    self.stderr_so_far(),
                    self.stdout_so_far()
                );
            }
            if let Some(line) = find(&self.stdout_so_far) {
                return line;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the VMM wrote on stdout so far.
    pub fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&lock(&self.stdout_so_far)).into_owned()
    }

    /// What the VMM wrote on stderr so far.
    pub fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&lock(&self.stderr_so_far)).into_owned()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// How the process ended, or `None` while it runs.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
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
            if Instant::now() >= deadline {
                let stdout = self.stdout_so_far();
                let tail: Vec<&str> = stdout.lines().rev().take(20).collect();
                let threads = threads_report(self.pid());
                let _ = self.child.kill();
                panic!(
                    "vmm run did not end within {timeout:?}; its threads:\n{threads}stderr: {}; \
                     the last lines of stdout: {:#?}",
                    self.stderr_so_far(),
                    tail.iter().rev().collect::<Vec<_>>()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Finished {
            code: status.code(),
            stdout: self.stdout.take().unwrap().join().unwrap(),
            stderr: self.stderr.take().unwrap().join().unwrap(),
        }
    }

    /// Starts `vmm run ARGS --api-socket SOCKET` and waits until its VM is paused (at a
    /// workload checkpoint); returns the run and a client of its API.
    pub fn start_paused(args: &[&str], socket: &str) -> (Self, ApiClient) {
        let mut args = args.to_vec();
        args.extend(["--api-socket", socket]);
        let mut vmm = Self::start(&args);
        let api = vmm.api(socket);
        wait_for_state(&api, "Paused");
        (vmm, api)
    }

    /// Waits until the API socket at `socket` takes connections and returns a client for it
    /// (a socket file an earlier VMM left there does not count).
    pub fn api(&mut self, socket: &str) -> ApiClient {
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(
                self.running(),
                "vmm ended before serving its API: {}",
                self.stderr_so_far()
            );
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

/// Starts `vmm snapshot load --snapshot-path SNAPSHOT --mem-file-path MEMORY --resume` with
/// `extra` arguments.
pub fn start_snapshot_load(snapshot: &str, memory: &str, extra: &[&str]) -> VmmRun {
    let mut args = vec![
        "snapshot",
        "load",
        "--snapshot-path",
        snapshot,
        "--mem-file-path",
        memory,
        "--resume",
    ];
    args.extend_from_slice(extra);
    VmmRun::start_command(&args)
}

/// Starts one `vmm --api-sock SOCKET` per (socket, load body) and has each load its snapshot
/// (`PUT /snapshot/load` with that body, which must answer 204), all at once, each from a
/// thread of its own; returns the VMMs and their clients, in order.
pub fn load_all_at_once(loads: &[(String, String)]) -> Vec<(VmmRun, ApiClient)> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = loads
            .iter()
            .map(|(socket, body)| {
                scope.spawn(move || {
                    let mut vmm = VmmRun::start_command(&["--api-sock", socket]);
                    let api = vmm.api(socket);
                    send(&api, "PUT", "/snapshot/load", body);
                    (vmm, api)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// Asserts that a clone of a snapshot taken at checkpoint 1 of a five-step workload ran the
/// steps after it (3 and 5 among them) in its own process, and they passed.
pub fn assert_clone_finished(run: &Finished) {
    run.assert_success();
    assert!(
        run.stdout.contains("step 3: ok")
            && run.stdout.contains("step 5: ok")
            && run.stdout.contains("test guest: done"),
        "{run:#?}"
    );
    assert!(!run.stdout.contains("step 1: ok"), "step 1 ran: {run:#?}");
}

/// Resumes the first half of `clones` (loaded paused) and has each run to its end while the
/// second half waits, then resumes the second half: each end is checked with `check`. What a
/// clone of the first half writes must not reach one of the second.
pub fn run_in_two_halves(
    clones: Vec<(VmmRun, ApiClient)>,
    timeout: Duration,
    check: fn(&Finished),
) {
    let half = clones.len() / 2;
    for (_, api) in &clones[..half] {
        send(api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    }
    let mut clones = clones.into_iter();
    for (vmm, _) in clones.by_ref().take(half) {
        check(&vmm.wait(timeout));
    }
    for (vmm, api) in clones {
        send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
        check(&vmm.wait(timeout));
    }
}

/// `vmm snapshot rebase`: merges the diff memory file `diff` onto `base`, which must succeed.
pub fn rebase_snapshot(base: &str, diff: &str) {
    let merged = client(&[
        "snapshot",
        "rebase",
        "--base-file",
        base,
        "--diff-file",
        diff,
    ]);
    assert_eq!(merged.code, Some(0), "{merged:#?}");
    assert!(merged.stdout.contains("merged"), "{merged:#?}");
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
    Command::new(vmm_binary())
        .args(args)
        .output()
        .expect("run vmm")
        .into()
}

/// `vmm zone inspect --json ZONE`, which must show no frame leaked or lost.
pub fn zone_consistent(zone: &str) -> serde_json::Value {
    let run = client(&["zone", "inspect", "--json", zone]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    let info: serde_json::Value = serde_json::from_str(&run.stdout).expect("inspect JSON");
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0)),
        "{info:#}"
    );
    info
}
