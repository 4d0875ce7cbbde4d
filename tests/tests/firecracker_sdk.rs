//! End-to-end: the official Firecracker Go SDK (firecracker-go-sdk v1.0.0, resolved through the
//! Go module proxy) drives the VMM exactly as it drives Firecracker: the program in
//! `tests/firecracker-sdk` starts `vmm` through the SDK's Machine API with a kernel, initrd and
//! root drive, sets and reads the balloon and its statistics, pauses, snapshots, restores into a
//! new VMM process, resumes and shuts down with SendCtrlAltDel. The kernel is the minimal ELF
//! guest of the Firecracker API tests (`e2e_tests::CTRL_ALT_DEL_GUEST`).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::{
    cgroup_v1_hierarchy, ctrl_alt_del_guest_files, jail_can_run, jailer_binary, kvm_available,
    remove_cgroup, run_sdk_program, tool_available, vmm_binary, Scratch,
};

/// What the guest's initrd holds, and so prints.
const INITRD: &str = "initrd: driven by the Firecracker Go SDK\n";

/// What the SDK program boots, in a scratch directory: the program itself, the guest's
/// kernel, initrd and root drive, and a directory for its sockets and snapshots.
struct SdkGuest {
    program: String,
    kernel: String,
    initrd: String,
    rootfs: String,
    dir: String,
}

impl SdkGuest {
    fn new(scratch: &Scratch) -> Self {
        let program = build_program(scratch);
        let (kernel, initrd, rootfs) = ctrl_alt_del_guest_files(scratch, INITRD);
        let dir = scratch.path("run");
        std::fs::create_dir(&dir).unwrap();
        SdkGuest {
            program,
            kernel,
            initrd,
            rootfs,
            dir,
        }
    }

    /// The program's flags for this guest and the VMM.
    fn args(&self) -> Vec<&str> {
        vec![
            "-vmm",
            vmm_binary(),
            "-kernel",
            &self.kernel,
            "-initrd",
            &self.initrd,
            "-ready",
            INITRD.trim(),
            "-rootfs",
            &self.rootfs,
            "-dir",
            &self.dir,
        ]
    }
}

/// Builds the SDK program into `scratch` and returns its path.
fn build_program(scratch: &Scratch) -> String {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("firecracker-sdk");
    let program = scratch.path("firecracker-sdk");
    // The module's go.sum pins every dependency; the module proxy serves them.
    let build = Command::new("go")
        .args(["build", "-mod=readonly", "-o", &program, "."])
        .current_dir(&source)
        .output()
        .expect("run go build");
    assert!(
        build.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    program
}

#[test]
fn the_firecracker_go_sdk_boots_snapshots_restores_and_shuts_down_the_vm() {
    let test = "the_firecracker_go_sdk_drives_the_vm";
    if !kvm_available(test) || !tool_available(test, "go", "version") {
        return;
    }
    let scratch = Scratch::new("fc-sdk");
    let guest = SdkGuest::new(&scratch);
    let dir = &guest.dir;
    run_sdk_program(&guest.program, &guest.args(), &[]);
    // The first VMM logged to its file at the SDK's level.
    let log = std::fs::read_to_string(Path::new(dir).join("first.log")).unwrap();
    assert!(log.contains("DEBUG") || log.contains("INFO"), "{log}");
    // The SDK's HTTP client sent request after request on a connection the API kept.
    assert!(log.contains("(request 2 on its connection)"), "{log}");
}

#[test]
fn the_firecracker_go_sdk_starts_the_vmm_through_the_jailer_with_its_jailer_cfg() {
    let test = "the_firecracker_go_sdk_starts_the_vmm_through_the_jailer_with_its_jailer_cfg";
    if !jail_can_run(test) || !tool_available(test, "go", "version") {
        return;
    }
    let scratch = Scratch::new("fc-sdk-jailer");
    let guest = SdkGuest::new(&scratch);
    let (uid, gid) = (4244, 4245);
    // The jailed VMM opens its root drive read-write (as Firecracker's jailer docs ask).
    std::os::unix::fs::chown(&guest.rootfs, Some(uid), Some(gid)).unwrap();
    let dir = &guest.dir;
    // The SDK asks for the cpuset of NUMA node 0, in cgroup v1 unless told otherwise.
    let version = match cgroup_v1_hierarchy("cpuset") {
        Some(_) => "1",
        None => "2",
    };
    let (uid, gid) = (uid.to_string(), gid.to_string());
    let jailer = jailer_binary();
    let mut args = vec![
        "-jailer",
        &jailer,
        "-uid",
        &uid,
        "-gid",
        &gid,
        "-cgroup-version",
        version,
    ];
    args.extend(guest.args());
    let stdout = run_sdk_program(&guest.program, &args, &[]);
    assert!(
        stdout.contains("ok: the jailed VMM's NoNewPrivs"),
        "{stdout}"
    );
    // The jail the SDK expects, with what it linked in.
    let root = Path::new(dir).join("jail/vmm/sdk-jailed/root");
    for file in ["vmm", "vmlinux", "initrd", "rootfs.ext4", "dev/kvm"] {
        assert!(root.join(file).exists(), "{file} not in {}", root.display());
    }
    remove_cgroup("vmm", "sdk-jailed");
}

#[test]
fn the_sdk_program_stops_waiting_for_the_guest_once_its_vmm_ended() {
    let test = "the_sdk_program_stops_waiting_for_the_guest_once_its_vmm_ended";
    if !kvm_available(test) || !tool_available(test, "go", "version") {
        return;
    }
    let scratch = Scratch::new("fc-sdk-ended");
    let guest = SdkGuest::new(&scratch);
    // A line the guest never prints: the program waits for it until the VMM ends.
    let mut args = guest.args();
    let ready = args.iter().position(|arg| *arg == "-ready").unwrap() + 1;
    args[ready] = "a line the guest never prints";
    let started = Instant::now();
    let mut program = Command::new(&guest.program)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the SDK program");
    let mut stdout = BufReader::new(program.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("ok: Start") {
        assert_ne!(stdout.read_line(&mut seen).unwrap(), 0, "{seen}");
    }
    // The VM runs; its VMM is the one process whose command line names the program's socket.
    let socket = Path::new(&guest.dir).join("first.sock");
    let vmm = process_naming(&socket.to_string_lossy()).expect("the SDK's VMM process");
    // SAFETY: kill takes a pid and a signal.
    assert_eq!(unsafe { libc::kill(vmm, libc::SIGKILL) }, 0);
    let output = program.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("FAILED: the guest runs: the VMM ended"),
        "{seen}\n{stderr}"
    );
    // Not after the program's boot timeout of ten minutes.
    assert!(started.elapsed() < Duration::from_secs(120), "{stderr}");
}

/// The process whose command line holds `text`, other than this one.
fn process_naming(text: &str) -> Option<libc::pid_t> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: libc::pid_t = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            (u32::try_from(pid) != Ok(std::process::id())
                && String::from_utf8_lossy(&cmdline).contains(text))
            .then_some(pid)
        })
}
