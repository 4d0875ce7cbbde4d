//! End-to-end: the official Firecracker Go SDK (firecracker-go-sdk v1.0.0, resolved through the
//! Go module proxy) drives the VMM exactly as it drives Firecracker: the program in
//! `tests/firecracker-sdk` starts `vmm` through the SDK's Machine API with a kernel, initrd and
//! root drive, sets and reads the balloon and its statistics, pauses, snapshots, restores into a
//! new VMM process, resumes and shuts down with SendCtrlAltDel. The kernel is the minimal ELF
//! guest of the Firecracker API tests (`e2e_tests::CTRL_ALT_DEL_GUEST`).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::Command;

use e2e_tests::{
    ctrl_alt_del_guest_files, kvm_available, run_sdk_program, tool_available, vmm_binary, Scratch,
};

/// What the guest's initrd holds, and so prints.
const INITRD: &str = "initrd: driven by the Firecracker Go SDK\n";

#[test]
fn the_firecracker_go_sdk_boots_snapshots_restores_and_shuts_down_the_vm() {
    let test = "the_firecracker_go_sdk_drives_the_vm";
    if !kvm_available(test) || !tool_available(test, "go", "version") {
        return;
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("firecracker-sdk");
    let scratch = Scratch::new("fc-sdk");
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
    let (kernel, initrd, rootfs) = ctrl_alt_del_guest_files(&scratch, INITRD);
    let dir = scratch.path("run");
    std::fs::create_dir(&dir).unwrap();
    let args = [
        "-vmm",
        vmm_binary(),
        "-kernel",
        &kernel,
        "-initrd",
        &initrd,
        "-ready",
        INITRD.trim(),
        "-rootfs",
        &rootfs,
        "-dir",
        &dir,
    ];
    run_sdk_program(&program, &args, &[]);
    // The first VMM logged to its file at the SDK's level.
    let log = std::fs::read_to_string(Path::new(&dir).join("first.log")).unwrap();
    assert!(log.contains("DEBUG") || log.contains("INFO"), "{log}");
    // The SDK's HTTP client sent request after request on a connection the API kept.
    assert!(log.contains("(request 2 on its connection)"), "{log}");
}
