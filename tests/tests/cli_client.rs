//! End-to-end: the `vmm` client subcommands (api, info, memory, pause, resume, shutdown,
//! balloon) as a real process against an API server with an in-test `VmmControl`.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod api_common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;

use api_common::{serve, socket_path, TestVmm};
use e2e_tests::Finished;
use serde_json::Value;
use vmm_api::model::VmState;

fn vmm(args: &[&str]) -> Finished {
    Command::new(e2e_tests::vmm_binary())
        .args(args)
        .output()
        .expect("run vmm")
        .into()
}

/// Runs `command` with `--socket` right after its first word (the subcommand owning it).
fn with_socket(command: &[&str], socket: &Path) -> Finished {
    let mut args = vec![command[0], "--socket", socket.to_str().unwrap()];
    args.extend(&command[1..]);
    vmm(&args)
}

fn stdout_json(output: &Finished) -> Value {
    serde_json::from_str(&output.stdout).expect("JSON on stdout")
}

#[test]
fn info_and_memory_print_short_views_or_json() {
    let (server, _vmm) = serve("cli-info", TestVmm::new());
    let info = with_socket(&["info"], server.path());
    assert_eq!(info.code, Some(0), "{}", info.stderr);
    assert!(info.stdout.starts_with("state "), "{info:#?}");
    assert!(info.stdout.contains("\nvcpus    2\n"), "{info:#?}");
    let info = with_socket(&["info", "--json"], server.path());
    assert_eq!(stdout_json(&info)["vcpu_count"], 2);
    let memory = with_socket(&["memory", "--json"], server.path());
    assert_eq!(memory.code, Some(0));
    assert_eq!(stdout_json(&memory)["pool"]["used_4k_frames"], 1536);
    let memory = with_socket(&["memory"], server.path());
    assert!(memory.stdout.contains("\npool "), "{memory:#?}");
}

#[test]
fn pause_resume_and_shutdown() {
    let (server, vmm_state) = serve("cli-state", TestVmm::new());
    let pause = with_socket(&["pause"], server.path());
    assert_eq!(pause.code, Some(0), "{}", pause.stderr);
    assert_eq!(pause.stdout, "paused: every vCPU is out of the guest\n");
    assert_eq!(vmm_state.state(), VmState::Paused);
    let resume = with_socket(&["resume"], server.path());
    assert_eq!(
        (resume.code, resume.stdout.as_str()),
        (Some(0), "resumed\n")
    );
    assert_eq!(vmm_state.state(), VmState::Running);
    let shutdown = with_socket(&["shutdown"], server.path());
    assert_eq!(shutdown.code, Some(0));
    assert!(
        shutdown.stdout.starts_with("shutdown requested"),
        "{shutdown:?}"
    );
    assert_eq!(vmm_state.shutdowns.load(Ordering::SeqCst), 1);
    with_socket(&["pause"], server.path()).assert_fails(5, "PATCH /vm: 400 the VM has stopped");
}

#[test]
fn raw_api_requests() {
    let (server, vmm_state) = serve("cli-api", TestVmm::new());
    let socket = server.path().to_str().unwrap();
    let machine = vmm(&["api", "--socket", socket, "GET", "/machine"]);
    assert_eq!(stdout_json(&machine)["state"], "Running");
    let paused = vmm(&["api", "-s", socket, "patch", "/vm", r#"{"state":"Paused"}"#]);
    assert_eq!(paused.code, Some(0), "{}", paused.stderr);
    assert_eq!(vmm_state.state(), VmState::Paused);
    vmm(&["api", "-s", socket, "GET", "/nothing"]).assert_fails(
        5,
        "GET /nothing: 400 Invalid request method and/or path: GET /nothing.",
    );
    vmm(&["api", "-s", socket, "PATCH", "/vm", "{state: Paused}"])
        .assert_fails(2, "the body is not valid JSON");
    vmm(&["api", "-s", socket, "GET", "machine"]).assert_fails(2, "bad resource path");
}

#[test]
fn balloon_commands() {
    let (server, _vmm) = serve("cli-balloon", TestVmm::with_balloon());
    let set = with_socket(&["balloon", "set", "128"], server.path());
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    assert_eq!(set.stdout, "balloon target set to 128 MiB\n");
    let get = with_socket(&["balloon", "get", "--json"], server.path());
    assert_eq!(stdout_json(&get)["amount_mib"], 128);
    // One size syntax everywhere: suffixes as for --memory.
    for (size, mib) in [("200M", 200), ("0G", 0), ("64MB", 64), ("128MiB", 128)] {
        let set = with_socket(&["balloon", "set", size], server.path());
        assert_eq!(set.code, Some(0), "{size}: {}", set.stderr);
        let get = with_socket(&["balloon", "get", "--json"], server.path());
        assert_eq!(stdout_json(&get)["amount_mib"], mib, "{size}");
    }
    // --socket after the action too, as every other subcommand takes it.
    let path = server.path().to_str().unwrap();
    let set = vmm(&["balloon", "set", "32M", "--socket", path]);
    assert_eq!(set.stdout, "balloon target set to 32 MiB\n", "{set:#?}");
    vmm(&["balloon", "get"]).assert_fails(2, "--socket <PATH>");
    with_socket(&["balloon", "set", "4K"], server.path())
        .assert_fails(2, "'4K' is not a whole number of MiB");
    let stats = with_socket(&["balloon", "stats", "--json"], server.path());
    assert_eq!(stdout_json(&stats)["target_pages"], 32 << 8);
    with_socket(&["balloon", "set", "-5"], server.path()).assert_fails(2, "-5");

    let (plain, _vmm) = serve("cli-no-balloon", TestVmm::new());
    with_socket(&["balloon", "set", "64"], plain.path())
        .assert_fails(5, "PATCH /balloon: 400 balloon not configured");
}

#[test]
fn an_unreachable_socket_is_a_runtime_error() {
    let missing = socket_path("cli-missing");
    with_socket(&["info"], &missing).assert_fails(
        4,
        &format!(
            "no VMM is listening on {} (No such file or directory",
            missing.display()
        ),
    );
    // A socket left by a VMM that is gone: refused, and told the same way.
    let stale = socket_path("cli-stale");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    with_socket(&["pause"], &stale).assert_fails(4, "no VMM is listening on");
    let _ = std::fs::remove_file(&stale);
    vmm(&["info"]).assert_fails(2, "--socket <PATH>");
}

#[test]
fn idle_and_slow_clients_do_not_hold_up_the_api() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    let (server, _vmm) = serve("cli-idle", TestVmm::new());
    let idle: Vec<UnixStream> = (0..100)
        .map(|_| UnixStream::connect(server.path()).unwrap())
        .collect();
    // A client that sends its request one byte at a time.
    let mut slow = UnixStream::connect(server.path()).unwrap();
    slow.write_all(b"GET /mach").unwrap();
    let started = Instant::now();
    let info = with_socket(&["info"], server.path());
    let took = started.elapsed();
    assert_eq!(info.code, Some(0), "{}", info.stderr);
    assert!(took < Duration::from_millis(100), "vmm info took {took:?}");
    eprintln!("vmm info with 100 idle connections open: {took:?}");

    // Past the limit a connection is told so at once; a freed slot serves again.
    let mut more: Vec<UnixStream> = (idle.len() + 1..vmm_api::server::MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(server.path()).unwrap())
        .collect();
    let mut refused = UnixStream::connect(server.path()).unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = String::new();
    refused.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(answer.contains("connections open; try again"), "{answer}");
    more.pop();
    drop(idle);
    let again = with_socket(&["info"], server.path());
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    drop(slow);
}
