//! End-to-end: snapshot paths that name something other than a regular file. A FIFO, a
//! character device, a socket or a symbolic link named as `snapshot_path` or `mem_file_path`
//! is refused with 400 and left exactly as it was (never renamed over, truncated or waited
//! on), as is an empty path, a path in a directory that does not exist (before any memory is
//! copied, leaving no file) and one path for both; a VMM waiting for a snapshot to load stays responsive and ends
//! at once on SIGTERM.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::os::unix::fs::FileTypeExt;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e_tests::kvm_available;
use vmm_cli::ApiClient;
use vmm_common::{get, Scratch, VmmRun};

/// Things that are not regular files, in `scratch`: (path, what it is).
fn irregular_files(scratch: &Scratch) -> Vec<(String, &'static str)> {
    let fifo = scratch.path("fifo");
    let device = scratch.path("zero");
    let socket = scratch.path("socket");
    let link = scratch.path("link");
    let target = scratch.path("target");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    // The same device as /dev/zero.
    let made = Command::new("mknod")
        .args([&device, "c", "1", "5"])
        .status();
    assert!(made.unwrap().success());
    std::mem::forget(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    std::fs::write(&target, b"a regular file behind a link").unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    vec![
        (fifo, "a FIFO"),
        (device, "a character device"),
        (socket, "a socket"),
        (link, "a symbolic link"),
    ]
}

/// What `path` is now (without following a link).
fn kind(path: &str) -> &'static str {
    let file_type = std::fs::symlink_metadata(path).unwrap().file_type();
    if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else {
        "something else"
    }
}

/// Sends `body` to `path` and expects a prompt 400 whose fault message contains `expected`.
fn refused(api: &ApiClient, path: &str, body: &str, expected: &str) {
    let asked = Instant::now();
    let response = api.request("PUT", path, Some(body)).unwrap();
    assert_eq!(response.status, 400, "{body}: {}", response.body);
    assert!(
        response.body.contains(expected),
        "{body}: {}",
        response.body
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{body}: it waited"
    );
}

#[test]
fn snapshot_create_refuses_paths_that_are_not_regular_files_and_leaves_them_alone() {
    if !kvm_available("snapshot_create_refuses_paths_that_are_not_regular_files") {
        return;
    }
    let scratch = Scratch::new("snapshot-paths-create");
    let socket = scratch.path("api.sock");
    let (vmm, api) = VmmRun::start_paused(
        &[
            "--memory",
            "32M",
            "--workload",
            "write:all,checkpoint:1,verify:all",
        ],
        &socket,
    );
    let (snapshot, memory) = (scratch.path("vm.snap"), scratch.path("vm.mem"));
    for (path, what) in irregular_files(&scratch) {
        let body = format!(r#"{{"snapshot_path":"{path}","mem_file_path":"{memory}"}}"#);
        refused(&api, "/snapshot/create", &body, what);
        let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{path}"}}"#);
        refused(&api, "/snapshot/create", &body, what);
        assert_eq!(kind(&path), what, "{path} was replaced");
    }
    let body = format!(r#"{{"snapshot_path":"","mem_file_path":"{memory}"}}"#);
    refused(&api, "/snapshot/create", &body, "the path is empty");
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":""}}"#);
    refused(&api, "/snapshot/create", &body, "the path is empty");
    // The VM is as it was: a snapshot into regular files works.
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#);
    let response = api.request("PUT", "/snapshot/create", Some(&body)).unwrap();
    assert_eq!(response.status, 204, "{}", response.body);
    assert_eq!(get(&api, "/machine")["state"], "Paused");
    vmm.kill();
}

#[test]
fn snapshot_create_refuses_a_missing_directory_before_any_work_and_leaves_no_file() {
    if !kvm_available("snapshot_create_refuses_a_missing_directory_before_any_work") {
        return;
    }
    let scratch = Scratch::new("snapshot-paths-directory");
    let socket = scratch.path("api.sock");
    // 256 MiB written: copying it took a second before the state's file failed to be made.
    let (vmm, api) = VmmRun::start_paused(
        &["--memory", "256M", "--workload", "write:all,checkpoint:1"],
        &socket,
    );
    let (snapshot, memory) = (scratch.path("vm.snap"), scratch.path("vm.mem"));
    let missing = scratch.path("missing/vm.snap");
    let under_a_file = format!("{memory}.file/vm.mem");
    std::fs::write(format!("{memory}.file"), b"a file").unwrap();
    let cases = [
        (missing.clone(), memory.clone(), "does not exist"),
        (
            snapshot.clone(),
            scratch.path("missing/vm.mem"),
            "does not exist",
        ),
        (snapshot.clone(), under_a_file, "is not a directory"),
        (snapshot.clone(), snapshot.clone(), "is snapshot_path too"),
    ];
    for (snapshot_path, mem_file_path, expected) in cases {
        let body =
            format!(r#"{{"snapshot_path":"{snapshot_path}","mem_file_path":"{mem_file_path}"}}"#);
        let asked = Instant::now();
        refused(&api, "/snapshot/create", &body, expected);
        eprintln!("{expected}: refused in {:?}", asked.elapsed());
        // Refused before the copy: no memory file was ever made.
        assert!(
            !std::path::Path::new(&memory).exists(),
            "{body}: memory left"
        );
        assert!(
            !std::path::Path::new(&snapshot).exists(),
            "{body}: state left"
        );
    }
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#);
    let response = api.request("PUT", "/snapshot/create", Some(&body)).unwrap();
    assert_eq!(response.status, 204, "{}", response.body);
    vmm.kill();
}

#[test]
fn a_vmm_waiting_for_a_snapshot_refuses_irregular_paths_and_ends_at_once_on_sigterm() {
    if !kvm_available("a_vmm_waiting_for_a_snapshot_refuses_irregular_paths") {
        return;
    }
    let scratch = Scratch::new("snapshot-paths-load");
    let socket = scratch.path("api.sock");
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let regular = scratch.path("regular");
    std::fs::write(&regular, b"not a snapshot").unwrap();
    for (path, what) in irregular_files(&scratch) {
        let body = format!(
            r#"{{"snapshot_path":"{path}","mem_backend":{{"backend_type":"File","backend_path":"{regular}"}}}}"#
        );
        refused(&api, "/snapshot/load", &body, what);
        assert_eq!(kind(&path), what, "{path} was changed");
    }
    let body = r#"{"snapshot_path":"","mem_backend":{"backend_type":"File","backend_path":""}}"#;
    refused(&api, "/snapshot/load", body, "the path is empty");
    // Still waiting, and answering.
    assert_eq!(get(&api, "/")["state"], "Not started");
    let signalled = Instant::now();
    vmm.signal("TERM");
    let ended = vmm.wait(Duration::from_secs(20));
    let took = signalled.elapsed();
    eprintln!("a waiting VMM ended {took:?} after SIGTERM");
    assert!(took < Duration::from_secs(1), "took {took:?}: {ended:#?}");
}
