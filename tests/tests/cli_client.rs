//! End-to-end: the `vmm` client subcommands (api, info, memory, pause, resume, shutdown,
//! balloon) as a real process against an API server with an in-test `VmmControl`.

mod api_common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;

use api_common::{serve, socket_path, TestVmm};
use e2e_tests::Finished;
use serde_json::Value;
use vmm::api::model::VmState;

fn vmm(args: &[&str]) -> Finished {
    Command::new(env!("CARGO_BIN_EXE_vmm-cli"))
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
fn info_and_memory_print_json() {
    let (server, _vmm) = serve("cli-info", TestVmm::new());
    let info = with_socket(&["info"], server.path());
    assert_eq!(info.code, Some(0), "{}", info.stderr);
    assert_eq!(stdout_json(&info)["vcpu_count"], 2);
    let memory = with_socket(&["memory"], server.path());
    assert_eq!(memory.code, Some(0));
    assert_eq!(stdout_json(&memory)["pool"]["used_frames"], 1536);
}

#[test]
fn pause_resume_and_shutdown() {
    let (server, vmm_state) = serve("cli-state", TestVmm::new());
    let pause = with_socket(&["pause"], server.path());
    assert_eq!(pause.code, Some(0), "{}", pause.stderr);
    assert!(pause.stdout.is_empty());
    assert_eq!(vmm_state.state(), VmState::Paused);
    assert_eq!(with_socket(&["resume"], server.path()).code, Some(0));
    assert_eq!(vmm_state.state(), VmState::Running);
    assert_eq!(with_socket(&["shutdown"], server.path()).code, Some(0));
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
    vmm(&["api", "-s", socket, "GET", "/nothing"])
        .assert_fails(5, "GET /nothing: 404 no resource at /nothing");
    vmm(&["api", "-s", socket, "PATCH", "/vm", "{state: Paused}"])
        .assert_fails(2, "the body is not valid JSON");
    vmm(&["api", "-s", socket, "GET", "machine"]).assert_fails(2, "bad resource path");
}

#[test]
fn balloon_commands() {
    let (server, _vmm) = serve("cli-balloon", TestVmm::with_balloon());
    let set = with_socket(&["balloon", "set", "128"], server.path());
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    let get = with_socket(&["balloon", "get"], server.path());
    assert_eq!(stdout_json(&get)["amount_mib"], 128);
    let stats = with_socket(&["balloon", "stats"], server.path());
    assert_eq!(stdout_json(&stats)["target_pages"], 128 << 8);
    with_socket(&["balloon", "set", "-5"], server.path()).assert_fails(2, "-5");

    let (plain, _vmm) = serve("cli-no-balloon", TestVmm::new());
    with_socket(&["balloon", "set", "64"], plain.path())
        .assert_fails(5, "PATCH /balloon: 400 balloon not configured");
}

#[test]
fn an_unreachable_socket_is_a_runtime_error() {
    let missing = socket_path("cli-missing");
    with_socket(&["info"], &missing).assert_fails(4, "cannot connect to the API socket");
    vmm(&["info"]).assert_fails(2, "--socket <PATH>");
}
