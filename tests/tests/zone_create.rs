//! End-to-end: `vmm zone create` never removes a zone it did not make. Two creators race for
//! one path: the first is held inside its open() (strace delays the system call) while the
//! second creates the zone and a VM writes into it; the first then fails ("already holds a
//! zone") and must leave the other's zone, and the VM's memory, as they were.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e_tests::{kvm_available, tool_available};
use vmm_common::{client, vmm_binary, Scratch, VmmRun};

#[test]
fn a_failed_zone_create_leaves_a_zone_another_process_created_meanwhile() {
    let test = "a_failed_zone_create_leaves_a_zone_another_process_created_meanwhile";
    if !kvm_available(test) || !tool_available(test, "strace", "-V") {
        return;
    }
    let scratch = Scratch::new("zone-create-race");
    let zone = scratch.path("zone");
    // The first creator: every open of the zone's path waits 3 s before it happens.
    let first = Command::new("strace")
        .args(["-f", "-o", "/dev/null", "-P", &zone, "-e", "trace=openat"])
        .args(["-e", "inject=openat:delay_enter=3000000"])
        .args([vmm_binary(), "zone", "create", &zone, "--size", "64M"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run strace");
    let first = std::thread::scope(|s| {
        let first = s.spawn(|| first.wait_with_output().expect("wait for strace"));
        std::thread::sleep(Duration::from_millis(500));
        // Meanwhile another process creates the zone, and a VM writes all its memory there.
        let created = client(&["zone", "create", &zone, "--size", "64M"]);
        assert_eq!(created.code, Some(0), "{created:#?}");
        VmmRun::run(&[
            "--zone",
            &zone,
            "--vm",
            "a",
            "--memory",
            "32M",
            "--workload",
            "write:all",
        ])
        .assert_success();
        first.join().unwrap()
    });
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("already holds a zone"), "{stderr}");
    assert!(
        Path::new(&zone).exists(),
        "the other process's zone is gone"
    );
    VmmRun::run(&[
        "--zone",
        &zone,
        "--vm",
        "a",
        "--memory",
        "32M",
        "--workload",
        "verify:all",
    ])
    .assert_success();
}

/// What `vmm zone` says of a healthy zone names what it found, nothing when there was nothing:
/// no "freed 0 leaked frames", and counts in the singular where they are one.
#[test]
fn a_healthy_zone_has_nothing_to_repair_and_counts_read_as_words() {
    if !kvm_available("a_healthy_zone_has_nothing_to_repair_and_counts_read_as_words") {
        return;
    }
    let scratch = Scratch::new("zone-words");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "64M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let gc = client(&["zone", "gc", &zone]);
    assert_eq!(
        gc.stdout,
        format!(
            "{zone}: clean recovery: nothing to repair; released the memory of 32 free frames\n"
        ),
        "{gc:#?}"
    );
    let inspect = client(&["zone", "inspect", &zone]);
    assert!(
        inspect.stdout.contains("opened after a clean shutdown in ")
            && inspect.stdout.contains(" µs: nothing to repair\n"),
        "{inspect:#?}"
    );
    // A VM of 4 MiB whose guest touched only its first chunk holds one frame.
    VmmRun::run(&[
        "--zone",
        &zone,
        "--vm",
        "small",
        "--memory",
        "4M",
        "--workload",
        "checkpoint:1",
    ])
    .assert_success();
    let deleted = client(&["zone", "delete-vm", &zone, "small"]);
    assert_eq!(
        deleted.stdout,
        format!("deleted VM 'small' from {zone}: 1 frame freed\n"),
        "{deleted:#?}"
    );
}
