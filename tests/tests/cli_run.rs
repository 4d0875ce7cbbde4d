//! End-to-end: `vmm run` as a real process. Help, usage and host errors (one line on stderr,
//! documented exit statuses), and runs of the built-in test guest with the API in use.
//!
//! Runs need KVM; without it they print SKIP.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use vmm::api::ApiClient;

const VMM: &str = env!("CARGO_BIN_EXE_vmm-cli");

fn vmm(args: &[&str]) -> Output {
    Command::new(VMM).args(args).output().expect("run vmm")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts exit status `code` and exactly one `error:` line on stderr containing `text`.
fn assert_fails(output: &Output, code: i32, text: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: ") && err.contains(text), "{err}");
}

fn kvm_available(test: &str) -> bool {
    let available = Path::new("/dev/kvm").exists();
    if !available {
        eprintln!("SKIP: {test}: /dev/kvm is absent");
    }
    available
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let path = std::env::temp_dir().join(format!("vmm-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn help_explains_every_flag_and_the_exit_statuses() {
    let help = vmm(&["run", "--help"]);
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    for flag in [
        "--memory",
        "--backing",
        "--populate",
        "--vcpus",
        "--kernel",
        "--initrd",
        "--cmdline",
        "--api-socket",
        "--workload",
        "--balloon",
        "hugetlb-1g",
        "dax:PATH",
        "deflate_on_oom",
    ] {
        assert!(text.contains(flag), "{flag} missing from vmm run --help");
    }
    for status in [
        "  0  success",
        "  2  usage",
        "  3  host unsupported",
        "  4  runtime",
    ] {
        assert!(text.contains(status), "{status} missing");
    }
    let top = String::from_utf8(vmm(&["--help"]).stdout).unwrap();
    for command in [
        "run", "api", "info", "memory", "pause", "resume", "shutdown", "balloon",
    ] {
        assert!(
            top.contains(&format!("\n  {command} ")),
            "{command} missing from vmm --help"
        );
    }
}

#[test]
fn usage_errors_are_one_line_with_status_2() {
    let cases: [(&[&str], &str); 12] = [
        (&[], "requires a subcommand"),
        (&["run", "--memory", "lots"], "'lots' is not a size"),
        (&["run", "--memory", "5M"], "must be a multiple of 2 MiB"),
        (
            &["run", "--memory", "1536M", "--backing", "hugetlb-1g"],
            "multiple of 1 GiB",
        ),
        (&["run", "--backing", "tmpfs"], "unknown backing 'tmpfs'"),
        (&["run", "--populate", "later"], "invalid value 'later'"),
        (
            &["run", "--vcpus", "255"],
            "--vcpus 255: must be between 1 and 254",
        ),
        (&["run", "--vcpus", "65"], "at most 64 vCPUs"),
        (&["run", "--initrd", "/boot/initrd"], "--kernel <PATH>"),
        (
            &["run", "--balloon", "size=64M,inflate=on"],
            "unknown balloon option 'inflate'",
        ),
        (&["run", "--workload", "write:all,"], "empty workload step"),
        (
            &["run", "--frobnicate"],
            "unexpected argument '--frobnicate'",
        ),
    ];
    for (args, text) in cases {
        assert_fails(&vmm(args), 2, text);
    }
}

#[test]
fn missing_files_are_usage_errors() {
    let scratch = Scratch::new("missing-files");
    let kernel = scratch.path("vmlinux");
    assert_fails(
        &vmm(&["run", "--kernel", &kernel]),
        2,
        "No such file or directory",
    );
    std::fs::write(&kernel, b"not really a kernel").unwrap();
    let initrd = scratch.path("initrd");
    assert_fails(
        &vmm(&["run", "--kernel", &kernel, "--initrd", &initrd]),
        2,
        "--initrd",
    );
    let dax = format!("dax:{}", scratch.path("dax0.0"));
    assert_fails(&vmm(&["run", "--backing", &dax]), 2, "--backing dax:");
    let pool = format!("file:{}", scratch.path("no/dir/pool"));
    assert_fails(
        &vmm(&["run", "--backing", &pool]),
        2,
        "its directory does not exist",
    );
    let socket = scratch.path("no/dir/api.sock");
    assert_fails(&vmm(&["run", "--api-socket", &socket]), 2, "--api-socket");
}

fn nr_hugepages(kib: u64) -> Option<u64> {
    let path = format!("/sys/kernel/mm/hugepages/hugepages-{kib}kB/nr_hugepages");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn too_few_huge_pages_is_host_unsupported() {
    if !kvm_available("too_few_huge_pages_is_host_unsupported") {
        return;
    }
    for (backing, kib, unit) in [
        ("hugetlb-2m", 2048, 2u64 << 20),
        ("hugetlb-1g", 1_048_576, 1 << 30),
    ] {
        // One page more than the host has at all, and at least the 4 MiB minimum of RAM.
        let pages = (nr_hugepages(kib).unwrap_or(0) + 1).max((4 << 20) / unit);
        let memory = format!("{}M", (pages * unit) >> 20);
        let output = vmm(&["run", "--backing", backing, "--memory", &memory]);
        assert_fails(&output, 3, "huge pages");
        assert!(stderr(&output).starts_with("error: host unsupported: "));
    }
}

#[test]
fn no_kvm_is_host_unsupported() {
    // Hide /dev/kvm from one vmm process: a private mount namespace with an empty /dev.
    let script = r#"mount -t tmpfs none /dev && exec "$0" run --memory 64M"#;
    let output = Command::new("unshare")
        .args(["--mount", "sh", "-c", script, VMM])
        .output();
    let output = match output {
        Ok(output)
            if !stderr(&output).contains("unshare:") && !stderr(&output).contains("mount:") =>
        {
            output
        }
        Ok(output) => {
            eprintln!(
                "SKIP: no_kvm_is_host_unsupported: cannot hide /dev: {}",
                stderr(&output).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("SKIP: no_kvm_is_host_unsupported: no unshare: {e}");
            return;
        }
    };
    assert_fails(&output, 3, "host unsupported: cannot open /dev/kvm");
}

/// A `vmm run` process, killed if the test ends before it does.
struct VmmProcess(Child);

impl Drop for VmmProcess {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl VmmProcess {
    fn start(args: &[&str]) -> Self {
        let child = Command::new(VMM)
            .arg("run")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vmm run");
        VmmProcess(child)
    }

    /// Waits for the exit; returns the status code and stderr.
    fn wait(mut self, timeout: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "vmm run did not end within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        self.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status.code(), err)
    }
}

/// Runs the test guest to its end and returns the exit status and stderr.
fn run_guest(args: &[&str]) -> (Option<i32>, String) {
    VmmProcess::start(args).wait(Duration::from_secs(120))
}

#[test]
fn the_test_guest_runs_its_workload_on_two_vcpus() {
    let test = "the_test_guest_runs_its_workload_on_two_vcpus";
    if !kvm_available(test) {
        return;
    }
    for populate in ["lazy", "eager"] {
        let (code, err) = run_guest(&["--memory", "64M", "--vcpus", "2", "--populate", populate]);
        assert_eq!(code, Some(0), "--populate {populate}: {err}");
    }
}

#[test]
fn a_file_backed_guest_runs() {
    let test = "a_file_backed_guest_runs";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("file-backing");
    let backing = format!("file:{}", scratch.path("pool"));
    let (code, err) = run_guest(&["--memory", "32M", "--backing", &backing]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_failed_verification_exits_with_1() {
    let test = "a_failed_verification_exits_with_1";
    if !kvm_available(test) {
        return;
    }
    let workload = "write:2M+1M:0x1111,verify:2M+1M:0x2222";
    let (code, err) = run_guest(&["--memory", "16M", "--workload", workload]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn the_api_pauses_inspects_and_shuts_down_a_running_guest() {
    let test = "the_api_pauses_inspects_and_shuts_down_a_running_guest";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("api-run");
    let socket = scratch.path("api.sock");
    // Long enough to be caught running: four passes over 1 GiB.
    let workload = "write:all,verify:all,write:all:7,verify:all:7";
    let mut process = VmmProcess::start(&[
        "--memory",
        "1G",
        "--vcpus",
        "2",
        "--api-socket",
        &socket,
        "--workload",
        workload,
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !Path::new(&socket).exists() {
        if let Some(status) = process.0.try_wait().unwrap() {
            let (code, err) = (status.code(), process.wait(Duration::ZERO).1);
            panic!("vmm run ended before serving its API: {code:?} {err}");
        }
        assert!(Instant::now() < deadline, "no API socket after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = ApiClient::new(&socket);
    let get = |path: &str| -> serde_json::Value {
        let response = client.request("GET", path, None).unwrap();
        assert_eq!(response.status, 200, "{path}: {}", response.body);
        serde_json::from_str(&response.body).unwrap()
    };
    let info = get("/machine");
    assert_eq!(
        (info["vcpu_count"].as_u64(), info["mem_size_mib"].as_u64()),
        (Some(2), Some(1024))
    );
    assert_eq!(info["guest"], "test-guest");
    let paused = client
        .request("PATCH", "/vm", Some(r#"{"state":"Paused"}"#))
        .unwrap();
    assert_eq!(paused.status, 204, "{}", paused.body);
    assert_eq!(get("/machine")["state"], "Paused");
    let memory = get("/memory");
    assert_eq!(memory["guest"]["chunks"], 512);
    assert_eq!(memory["vcpus"].as_array().unwrap().len(), 2);
    let populated = memory["guest"]["populated_bytes"].as_u64().unwrap();
    assert!(populated <= memory["pool"]["used_bytes"].as_u64().unwrap());
    let resumed = client
        .request("PATCH", "/vm", Some(r#"{"state":"Resumed"}"#))
        .unwrap();
    assert_eq!(resumed.status, 204, "{}", resumed.body);
    let balloon = client.request("GET", "/balloon", None).unwrap();
    assert_eq!(
        balloon.fault_message().as_deref(),
        Some("balloon not configured")
    );
    let shutdown = client
        .request("PUT", "/actions", Some(r#"{"action_type":"Shutdown"}"#))
        .unwrap();
    assert_eq!(shutdown.status, 204, "{}", shutdown.body);
    // A requested shutdown is a clean end.
    let (code, err) = process.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !Path::new(&socket).exists(),
        "the API socket is removed at exit"
    );
}
