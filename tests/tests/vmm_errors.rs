//! End-to-end: what `vmm run` says when it cannot run a VM: one `error:` line on stderr and a
//! documented exit status (2: usage or configuration, 4: runtime). Bad flags, missing files,
//! no /dev/kvm and too few huge pages are in cli_run.rs.

mod vmm_common;

use e2e_tests::kvm_available;
use vmm_common::{send, wait_for_state, Scratch, VmmRun};

/// Runs a 16 MiB VM that reads all its memory on the `file:` backing `backing`, which leaves a
/// pool file of 16 MiB of frames behind.
fn create_pool_file(backing: &str) {
    VmmRun::run(&[
        "--memory",
        "16M",
        "--backing",
        backing,
        "--workload",
        "read:all",
    ])
    .assert_success();
}

#[test]
fn an_api_socket_served_by_another_vmm_is_a_usage_error() {
    if !kvm_available("an_api_socket_served_by_another_vmm_is_a_usage_error") {
        return;
    }
    let scratch = Scratch::new("socket-in-use");
    let socket = scratch.path("api.sock");
    let (_first, api) =
        VmmRun::start_paused(&["--memory", "16M", "--workload", "checkpoint:1"], &socket);
    let second = VmmRun::run(&["--memory", "16M", "--api-socket", &socket]);
    second.assert_fails(2, "another process is listening on it");
    // The first VMM still serves its socket.
    wait_for_state(&api, "Paused");
}

#[test]
fn an_api_socket_that_cannot_be_created_is_a_usage_error() {
    if !kvm_available("an_api_socket_that_cannot_be_created_is_a_usage_error") {
        return;
    }
    // sysfs takes no sockets (read-only, or EPERM), like a read-only file system.
    VmmRun::run(&["--memory", "16M", "--api-socket", "/sys/api.sock"])
        .assert_fails(2, "API socket /sys/api.sock: ");
}

#[test]
fn a_kernel_file_that_is_no_kernel_is_a_usage_error() {
    if !kvm_available("a_kernel_file_that_is_no_kernel_is_a_usage_error") {
        return;
    }
    let scratch = Scratch::new("no-kernel");
    let kernel = scratch.path("vmlinux");
    std::fs::write(&kernel, vec![0x90; 4096]).unwrap();
    VmmRun::run(&["--memory", "64M", "--kernel", &kernel]).assert_fails(
        2,
        &format!("cannot boot {kernel}: kernel is neither an ELF vmlinux nor a bzImage"),
    );
    let empty = scratch.path("empty");
    std::fs::write(&empty, b"").unwrap();
    VmmRun::run(&["--memory", "64M", "--kernel", &empty])
        .assert_fails(2, &format!("--kernel {empty}: is empty"));
}

#[test]
fn a_pool_file_of_another_size_is_a_usage_error() {
    if !kvm_available("a_pool_file_of_another_size_is_a_usage_error") {
        return;
    }
    let scratch = Scratch::new("pool-size");
    let backing = format!("file:{}", scratch.path("pool"));
    create_pool_file(&backing);
    VmmRun::run(&["--memory", "32M", "--backing", &backing]).assert_fails(
        2,
        "holds 16777216 bytes of frames, but 33554432 were requested",
    );
    // A file that is not a pool is refused and left as it was.
    let foreign = scratch.path("foreign");
    std::fs::write(&foreign, vec![0x42; 1 << 20]).unwrap();
    let backing = format!("file:{foreign}");
    VmmRun::run(&["--memory", "16M", "--backing", &backing])
        .assert_fails(2, "cannot create the frame pool: pool file");
    let contents = std::fs::read(&foreign).unwrap();
    assert!(
        contents[..1 << 20].iter().all(|&b| b == 0x42),
        "overwritten"
    );
    assert_eq!(contents.len(), 1 << 20, "resized");
}

#[test]
fn a_truncated_pool_file_is_a_usage_error() {
    if !kvm_available("a_truncated_pool_file_is_a_usage_error") {
        return;
    }
    let scratch = Scratch::new("pool-truncated");
    let pool = scratch.path("pool");
    let backing = format!("file:{pool}");
    create_pool_file(&backing);
    let file = std::fs::OpenOptions::new().write(true).open(&pool).unwrap();
    let len = file.metadata().unwrap().len();
    file.set_len(len / 2).unwrap();
    VmmRun::run(&["--memory", "16M", "--backing", &backing]).assert_fails(2, "but its pool needs");
    assert_eq!(std::fs::metadata(&pool).unwrap().len(), len / 2, "resized");
}

#[test]
fn a_pool_file_another_vmm_uses_is_refused_at_once() {
    if !kvm_available("a_pool_file_another_vmm_uses_is_refused_at_once") {
        return;
    }
    let scratch = Scratch::new("pool-in-use");
    let socket = scratch.path("api.sock");
    let pool = scratch.path("pool");
    let backing = format!("file:{pool}");
    let (first, api) = VmmRun::start_paused(
        &[
            "--memory",
            "16M",
            "--backing",
            &backing,
            "--workload",
            "write:all,checkpoint:1,verify:all",
        ],
        &socket,
    );
    VmmRun::run(&["--memory", "16M", "--backing", &backing])
        .assert_fails(2, &format!("pool file {pool} is in use by another process"));
    // The first VMM goes on undisturbed, and once it is gone the pool file serves again.
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    first
        .wait(std::time::Duration::from_secs(30))
        .assert_success();
    VmmRun::run(&["--memory", "16M", "--backing", &backing]).assert_success();
}
