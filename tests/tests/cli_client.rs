//! End-to-end: the `vmm` client subcommands (api, info, memory, pause, resume, shutdown,
//! balloon) as a real process against an API server with an in-test `VmmControl`.

mod api_common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::Ordering;

use api_common::{serve, socket_path, TestVmm};
use serde_json::Value;
use vmm::api::model::VmState;

fn vmm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmm-cli"))
        .args(args)
        .output()
        .expect("run vmm")
}

/// Runs `command` with `--socket` right after its first word (the subcommand owning it).
fn with_socket(command: &[&str], socket: &Path) -> Output {
    let mut args = vec![command[0], "--socket", socket.to_str().unwrap()];
    args.extend(&command[1..]);
    vmm(&args)
}

fn stdout_json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
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

#[test]
fn info_and_memory_print_json() {
    let (server, _vmm) = serve("cli-info", TestVmm::new());
    let info = with_socket(&["info"], server.path());
    assert!(info.status.success(), "{}", stderr(&info));
    assert_eq!(stdout_json(&info)["vcpu_count"], 2);
    let memory = with_socket(&["memory"], server.path());
    assert!(memory.status.success());
    assert_eq!(stdout_json(&memory)["pool"]["used_frames"], 1536);
}

#[test]
fn pause_resume_and_shutdown() {
    let (server, vmm_state) = serve("cli-state", TestVmm::new());
    let pause = with_socket(&["pause"], server.path());
    assert!(pause.status.success(), "{}", stderr(&pause));
    assert!(pause.stdout.is_empty());
    assert_eq!(vmm_state.state(), VmState::Paused);
    assert!(with_socket(&["resume"], server.path()).status.success());
    assert_eq!(vmm_state.state(), VmState::Running);
    assert!(with_socket(&["shutdown"], server.path()).status.success());
    assert_eq!(vmm_state.shutdowns.load(Ordering::SeqCst), 1);
    assert_fails(
        &with_socket(&["pause"], server.path()),
        5,
        "PATCH /vm: 400 the VM has stopped",
    );
}

#[test]
fn raw_api_requests() {
    let (server, vmm_state) = serve("cli-api", TestVmm::new());
    let socket = server.path().to_str().unwrap();
    let machine = vmm(&["api", "--socket", socket, "GET", "/machine"]);
    assert_eq!(stdout_json(&machine)["state"], "Running");
    let paused = vmm(&["api", "-s", socket, "patch", "/vm", r#"{"state":"Paused"}"#]);
    assert!(paused.status.success(), "{}", stderr(&paused));
    assert_eq!(vmm_state.state(), VmState::Paused);
    assert_fails(
        &vmm(&["api", "-s", socket, "GET", "/nothing"]),
        5,
        "GET /nothing: 404 no resource at /nothing",
    );
    assert_fails(
        &vmm(&["api", "-s", socket, "PATCH", "/vm", "{state: Paused}"]),
        2,
        "the body is not valid JSON",
    );
    assert_fails(
        &vmm(&["api", "-s", socket, "GET", "machine"]),
        2,
        "bad resource path",
    );
}

#[test]
fn balloon_commands() {
    let (server, _vmm) = serve("cli-balloon", TestVmm::with_balloon());
    let set = with_socket(&["balloon", "set", "128"], server.path());
    assert!(set.status.success(), "{}", stderr(&set));
    let get = with_socket(&["balloon", "get"], server.path());
    assert_eq!(stdout_json(&get)["amount_mib"], 128);
    let stats = with_socket(&["balloon", "stats"], server.path());
    assert_eq!(stdout_json(&stats)["target_pages"], 128 << 8);
    assert_fails(
        &with_socket(&["balloon", "set", "-5"], server.path()),
        2,
        "-5",
    );

    let (plain, _vmm) = serve("cli-no-balloon", TestVmm::new());
    assert_fails(
        &with_socket(&["balloon", "set", "64"], plain.path()),
        5,
        "PATCH /balloon: 400 balloon not configured",
    );
}

#[test]
fn an_unreachable_socket_is_a_runtime_error() {
    let missing = socket_path("cli-missing");
    assert_fails(
        &with_socket(&["info"], &missing),
        4,
        "cannot connect to the API socket",
    );
    assert_fails(&vmm(&["info"]), 2, "--socket <PATH>");
}
