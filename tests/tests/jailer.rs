//! End-to-end: `vmm-jailer` confines real VMM processes. A jailed VMM runs as the uid/gid it
//! was given with no capability in any set, no_new_privs and its seccomp filters, in a mount
//! namespace whose root is its chroot (nothing else of the host's files in it), with the
//! resource limits and in the cgroup asked for; through its API it cannot open a host file
//! outside its root, by an absolute path or by `..`, and boots a guest from files put into
//! it. The built-in guest runs jailed with lazy population (userfaultfd through the jail's
//! /dev/userfaultfd). With `--new-pid-ns --daemonize` the VMM is the first process of a PID
//! namespace of its own, its pid file says which, and SIGTERM from outside ends it. The VMM's
//! startup metrics count from the start a jailer passes. (That the process filter stops
//! network sockets and exec: vmm's seccomp unit tests.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod jail_common;
mod vmm_common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use e2e_tests::{
    cgroup_hierarchies, cgroup_v1_hierarchy, ctrl_alt_del_guest_files, jail_can_run, remove_cgroup,
};
use jail_common::{root_of, run_jailed_guest, start_jailed, GID, UID};
use vmm_cli::ApiClient;
use vmm_common::{get, send, Scratch};

/// The cgroup a test asks for where the host has it: a v1 memory limit (Firecracker's
/// default version), else a core file of the unified hierarchy (v2). The flags, and the file
/// and value to find in the VM's cgroup.
fn cgroup_flags() -> (Vec<String>, String, String) {
    match cgroup_v1_hierarchy("memory") {
        Some(_) => (
            vec!["--cgroup".into(), "memory.limit_in_bytes=536870912".into()],
            "memory.limit_in_bytes".into(),
            "536870912".into(),
        ),
        None => (
            vec![
                "--cgroup-version".into(),
                "2".into(),
                "--cgroup".into(),
                "cgroup.max.descendants=0".into(),
            ],
            "cgroup.max.descendants".into(),
            "0".into(),
        ),
    }
}

/// Waits for the API socket in the jail and returns a client of it; `child`, the jailed VMM
/// where the jailer became it, must not end first.
fn api(scratch: &Scratch, name: &str, mut child: Option<&mut Child>) -> ApiClient {
    let socket = root_of(scratch, name).join("run/api.sock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!(
                "the jailed VMM ended ({status}) before serving its API: {}",
                fs::read_to_string(scratch.path(&format!("{name}.err"))).unwrap()
            );
        }
        assert!(Instant::now() < deadline, "no API socket after 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    ApiClient::new(&socket)
}

/// The value of `key` in /proc/PID/status, its fields split.
fn status_field(pid: u32, key: &str) -> Vec<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The soft and hard limit of a line of /proc/PID/limits.
fn limit(pid: u32, name: &str) -> (String, String) {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with(name)).unwrap();
    let fields: Vec<&str> = line[name.len()..].split_whitespace().collect();
    (fields[0].to_owned(), fields[1].to_owned())
}

/// Checks the confinement of process `pid`: identity, capabilities, no_new_privs, seccomp,
/// its own mount namespace with only its root's files.
fn assert_confined(pid: u32) {
    let (uid, gid) = (UID.to_string(), GID.to_string());
    let (uid, gid) = (uid.as_str(), gid.as_str());
    assert_eq!(status_field(pid, "Uid:"), [uid, uid, uid, uid]);
    assert_eq!(status_field(pid, "Gid:"), [gid, gid, gid, gid]);
    assert_eq!(status_field(pid, "Groups:"), [gid]);
    for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(status_field(pid, set), ["0000000000000000"], "{set}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs:"), ["1"]);
    assert_eq!(status_field(pid, "Seccomp:"), ["2"]);
    let namespace = |p: &str| fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
    assert_ne!(namespace(&pid.to_string()), namespace("self"));
    let mut names: Vec<String> = fs::read_dir(format!("/proc/{pid}/root"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in ["dev", "run", "vmm"] {
        assert!(names.iter().any(|n| n == name), "{names:?}");
    }
    for host in ["etc", "proc", "sys", "home", "tmp", "root"] {
        assert!(
            !names.iter().any(|n| n == host),
            "{host} in the root: {names:?}"
        );
    }
}

#[test]
fn a_jailed_vmm_is_confined_and_reaches_only_what_is_put_in_its_root() {
    let test = "a_jailed_vmm_is_confined_and_reaches_only_what_is_put_in_its_root";
    if !jail_can_run(test) {
        return;
    }
    let scratch = Scratch::new("jailer-confined");
    let name = "jail-api";
    let (cgroup, file, value) = cgroup_flags();
    let mut args: Vec<&str> = cgroup.iter().map(String::as_str).collect();
    args.extend([
        "--parent-cgroup",
        "vmm-jailer-test",
        "--resource-limit",
        "no-file=1024",
        "--resource-limit",
        "fsize=104857600",
    ]);
    let mut child = start_jailed(&scratch, name, &args, &["--api-sock", "/run/api.sock"]);
    let client = api(&scratch, name, Some(&mut child));
    let pid = child.id();
    // Its first answer comes under its filters.
    assert_eq!(client.request("GET", "/", None).unwrap().status, 200);
    assert_confined(pid);
    assert_eq!(limit(pid, "Max open files"), ("1024".into(), "1024".into()));
    assert_eq!(
        limit(pid, "Max file size"),
        ("104857600".into(), "104857600".into())
    );
    let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let line = cgroups
        .lines()
        .find(|l| l.ends_with(&format!(":/vmm-jailer-test/{name}")))
        .unwrap_or_else(|| panic!("not in its cgroup: {cgroups}"));
    let hierarchy = match line.starts_with("0::") {
        true => {
            cgroup_hierarchies()
                .into_iter()
                .find(|h| h.unified)
                .unwrap()
                .dir
        }
        false => cgroup_v1_hierarchy(file.split('.').next().unwrap()).unwrap(),
    };
    let written = hierarchy.join("vmm-jailer-test").join(name).join(&file);
    assert_eq!(fs::read_to_string(&written).unwrap().trim(), value);

    // Host files outside the root cannot be named, absolutely or with `..`.
    let (kernel, initrd, _) = ctrl_alt_del_guest_files(&scratch, "initrd: jailed\n");
    let depth = "../".repeat(16);
    for path in [kernel.clone(), format!("{depth}{}", &kernel[1..])] {
        let body = format!(r#"{{"kernel_image_path":"{path}"}}"#);
        let answer = client.request("PUT", "/boot-source", Some(&body)).unwrap();
        assert_eq!(answer.status, 400, "{path}: {}", answer.body);
        assert!(
            answer.body.contains("No such file"),
            "{path}: {}",
            answer.body
        );
    }
    // Put into the root (as the SDK links them), they boot.
    let root = root_of(&scratch, name);
    fs::hard_link(&kernel, root.join("vmlinux")).unwrap();
    fs::hard_link(&initrd, root.join("initrd")).unwrap();
    send(
        &client,
        "PUT",
        "/boot-source",
        r#"{"kernel_image_path":"/vmlinux","initrd_path":"initrd"}"#,
    );
    send(
        &client,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count":1,"mem_size_mib":32}"#,
    );
    send(
        &client,
        "PUT",
        "/actions",
        r#"{"action_type":"InstanceStart"}"#,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = scratch.path(&format!("{name}.out"));
    while !fs::read_to_string(&out).unwrap().contains("initrd: jailed") {
        assert!(Instant::now() < deadline, "the guest printed nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(&client, "/")["state"], "Running");
    // Still confined with the guest running: the vCPU and API threads stacked filters.
    assert_confined(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    remove_cgroup("vmm-jailer-test", name);
}

#[test]
fn a_planted_link_to_another_root_is_refused_and_its_target_left_as_it_was() {
    let test = "a_planted_link_to_another_root_is_refused_and_its_target_left_as_it_was";
    if !jail_can_run(test) {
        return;
    }
    let scratch = Scratch::new("jailer-planted");
    let name = "jail-planted";
    let target = Path::new(&scratch.path("elsewhere")).to_owned();
    fs::create_dir_all(&target).unwrap();
    let root = root_of(&scratch, name);
    fs::create_dir_all(root.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, &root).unwrap();
    let before = fs::metadata(&target).unwrap();
    let status = start_jailed(&scratch, name, &[], &["--version"])
        .wait()
        .unwrap();
    let err = fs::read_to_string(scratch.path(&format!("{name}.err"))).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("is a symbolic link: refused") && err.contains("root"),
        "{err}"
    );
    let after = fs::metadata(&target).unwrap();
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    assert_eq!(
        fs::read_dir(&target).unwrap().count(),
        0,
        "the jail was built there"
    );
}

#[test]
fn the_built_in_guest_runs_jailed_with_lazy_population() {
    let test = "the_built_in_guest_runs_jailed_with_lazy_population";
    if !jail_can_run(test) {
        return;
    }
    let scratch = Scratch::new("jailer-guest");
    let name = "jail-run";
    run_jailed_guest(&scratch, name, &["--memory", "64M", "--populate", "lazy"]);
    // The root holds the VMM, what it needs to start and the devices, owned as documented.
    let root = root_of(&scratch, name);
    assert_eq!(fs::metadata(&root).unwrap().uid(), UID);
    assert_eq!(fs::metadata(root.join("vmm")).unwrap().uid(), 0);
    for device in ["dev/kvm", "dev/userfaultfd"] {
        let node = fs::metadata(root.join(device)).unwrap();
        assert_eq!((node.uid(), node.gid()), (UID, GID), "{device}");
        assert_eq!(
            node.rdev(),
            fs::metadata(format!("/{device}")).unwrap().rdev()
        );
    }
}

#[test]
fn with_a_new_pid_namespace_the_vmm_is_its_first_process_and_the_pid_file_names_it() {
    let test = "with_a_new_pid_namespace_the_vmm_is_its_first_process_and_the_pid_file_names_it";
    if !jail_can_run(test) {
        return;
    }
    let scratch = Scratch::new("jailer-pid-ns");
    let name = "jail-pidns";
    let mut jailer = start_jailed(
        &scratch,
        name,
        &["--new-pid-ns", "--daemonize"],
        &["--api-sock", "/run/api.sock"],
    );
    // The jailer ends once the VMM is started; the VMM lives on.
    assert!(jailer.wait().unwrap().success());
    let client = api(&scratch, name, None);
    let pid_file = root_of(&scratch, name).join("vmm.pid");
    let pid: u32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(pid, jailer.id());
    assert_eq!(status_field(pid, "NSpid:"), [pid.to_string(), "1".into()]);
    // Its first answer comes under its filters (the socket takes connections before).
    assert_eq!(get(&client, "/")["id"], name);
    assert_confined(pid);
    // Daemonized: its stdin, stdout and stderr are /dev/null.
    for fd in 0..3 {
        let target = fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
        assert_eq!(target, Path::new("/dev/null"), "fd {fd}");
    }
    // The jailer passed on when it started (Firecracker's flags).
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    for flag in [
        "--start-time-us ",
        "--start-time-cpu-us ",
        "--parent-cpu-time-us ",
    ] {
        assert!(cmdline.contains(flag), "{cmdline}");
    }
    // SIGTERM from outside the namespace ends it (the kernel drops signals a namespace's first
    // process leaves at their default; the VMM reads SIGTERM from a signalfd).
    // SAFETY: kill takes a pid and a signal.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Ended: gone, or a zombie its new parent has not reaped yet.
        match fs::read_to_string(format!("/proc/{pid}/status")) {
            Err(_) => break,
            Ok(status) if status.contains("State:\tZ") => break,
            Ok(_) => {}
        }
        assert!(Instant::now() < deadline, "SIGTERM did not end the VMM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_zone_put_into_the_root_backs_the_jailed_vm_and_gets_its_frames_back() {
    let test = "a_zone_put_into_the_root_backs_the_jailed_vm_and_gets_its_frames_back";
    if !jail_can_run(test) {
        return;
    }
    let scratch = Scratch::new("jailer-zone");
    let name = "jail-zone";
    let zone = scratch.path("zone");
    let created = vmm_common::client(&["zone", "create", &zone, "--size", "64M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    // As docs/security.md says: the root made beforehand, the zone linked into it
    // and given to the VMM's user.
    let root = root_of(&scratch, name);
    fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::chown(&zone, Some(UID), Some(GID)).unwrap();
    fs::hard_link(&zone, root.join("zone")).unwrap();
    let memory = ["--zone", "/zone", "--vm", "web", "--memory", "32M"];
    run_jailed_guest(&scratch, name, &memory);
    let inspected = vmm_common::zone_consistent(&zone);
    assert_eq!(inspected["vms"].as_array().unwrap().len(), 1, "{inspected}");
}

#[test]
fn the_startup_metrics_count_from_the_start_a_jailer_passes() {
    let scratch = Scratch::new("jailer-start-time");
    let socket = scratch.path("api.sock");
    let metrics = scratch.path("metrics.json");
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into `now`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let now_us = now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000;
    // As if a jailer had started 5 s ago and used 1 s of CPU.
    let start = (now_us - 5_000_000).to_string();
    let args = [
        "--api-sock",
        &socket,
        "--start-time-us",
        &start,
        "--start-time-cpu-us",
        "1000000",
    ];
    let mut vmm = vmm_common::VmmRun::start_command(&args);
    let client = vmm.api(&socket);
    send(
        &client,
        "PUT",
        "/metrics",
        &format!(r#"{{"metrics_path":"{metrics}"}}"#),
    );
    send(
        &client,
        "PUT",
        "/actions",
        r#"{"action_type":"FlushMetrics"}"#,
    );
    let text = fs::read_to_string(&metrics).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let startup = &line["api_server"];
    let wall = startup["process_startup_time_us"].as_u64().unwrap();
    let cpu = startup["process_startup_time_cpu_us"].as_u64().unwrap();
    assert!((5_000_000..65_000_000).contains(&wall), "{startup}");
    assert!(cpu >= 1_000_000, "{startup}");
    vmm.kill();
}

#[test]
fn the_vmm_joins_the_network_namespace_it_is_given_and_a_fifo_is_refused_at_once() {
    let test = "the_vmm_joins_the_network_namespace_it_is_given_and_a_fifo_is_refused_at_once";
    if !jail_can_run(test) {
        return;
    }
    let scratch = Scratch::new("jailer-netns");
    // A process in a network namespace of its own: its namespace's file is the --netns.
    let mut holder = Command::new("unshare")
        .args(["--net", "sleep", "600"])
        .spawn()
        .expect("start unshare --net sleep");
    let holder_ns = format!("/proc/{}/ns/net", holder.id());
    let namespace = |path: &str| fs::read_link(path).ok();
    let deadline = Instant::now() + Duration::from_secs(10);
    while namespace(&holder_ns) == namespace("/proc/self/ns/net") {
        assert!(
            Instant::now() < deadline,
            "unshare made no network namespace"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let name = "jail-netns";
    let mut child = start_jailed(
        &scratch,
        name,
        &["--netns", &holder_ns],
        &["--api-sock", "/run/api.sock"],
    );
    api(&scratch, name, Some(&mut child));
    let vmm_ns = format!("/proc/{}/ns/net", child.id());
    assert_eq!(namespace(&vmm_ns), namespace(&holder_ns));
    child.kill().unwrap();
    child.wait().unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();

    // A FIFO where a namespace should be: refused, not waited on for a writer.
    let fifo = scratch.path("not-a-namespace");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let started = Instant::now();
    let status = start_jailed(&scratch, "jail-fifo", &["--netns", &fifo], &[])
        .wait()
        .unwrap();
    let err = fs::read_to_string(scratch.path("jail-fifo.err")).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("cannot join the network namespace"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "it waited on the FIFO"
    );
}
