//! End-to-end: one copy snapshot seeds many VMs, Firecracker's way (`vmm --api-sock`, then
//! `PUT /snapshot/load`). Twenty VMMs load it at once, paused; half of them resume, verify the
//! snapshotted memory, overwrite all of it and verify their own pattern; then the other half
//! resume and still find the snapshot's memory (no clone sees another's writes); the memory
//! file never changes, and the snapshot loads once more afterwards.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::Duration;

use e2e_tests::kvm_available;
use vmm_common::{
    assert_clone_finished, load_all_at_once, run_in_two_halves, send, Scratch, VmmRun,
};

/// The snapshot is taken at checkpoint 1: a clone then verifies the snapshot's pattern,
/// writes its own over all of RAM and verifies that.
const WORKLOAD: &str =
    "write:all:0x5ea1ed,checkpoint:1,verify:all:0x5ea1ed,write:all:0xc10e,verify:all:0xc10e";
const CLONES: usize = 20;
const TIMEOUT: Duration = Duration::from_secs(300);

#[test]
fn twenty_clones_of_one_copy_snapshot_each_keep_their_own_writes() {
    if !kvm_available("snapshot_clones") {
        return;
    }
    let scratch = Scratch::new("snapshot-clones");
    let (snapshot, memory, socket) = (
        scratch.path("base.snap"),
        scratch.path("base.mem"),
        scratch.path("base.sock"),
    );
    let args = ["--memory", "32M", "--workload", WORKLOAD];
    let (base, api) = VmmRun::start_paused(&args, &socket);
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#);
    send(&api, "PUT", "/snapshot/create", &body);
    base.kill();
    let file = std::fs::read(&memory).unwrap();
    let load = |resume: bool| {
        format!(
            r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{memory}"}},"resume_vm":{resume}}}"#
        )
    };

    // All loaded at once, each by its own client.
    let loads: Vec<(String, String)> = (0..CLONES)
        .map(|index| (scratch.path(&format!("clone-{index}.sock")), load(false)))
        .collect();
    // The first half runs to its end while the second waits, paused at the checkpoint.
    run_in_two_halves(load_all_at_once(&loads), TIMEOUT, assert_clone_finished);
    assert!(
        std::fs::read(&memory).unwrap() == file,
        "a clone changed the memory file"
    );

    // The base loads once more, as it was.
    let again = [(scratch.path("again.sock"), load(true))];
    let (vmm, _api) = load_all_at_once(&again).pop().unwrap();
    assert_clone_finished(&vmm.wait(TIMEOUT));
}
