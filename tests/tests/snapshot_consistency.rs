//! End-to-end: a snapshot is one moment of the VM. While `PUT /snapshot/create` copies guest
//! memory into a file, `PATCH /vm {"state":"Resumed"}` is refused (400): a resume accepted then
//! gave a snapshot with the vCPU state from before it and memory written after it, which failed
//! its verification once loaded. The snapshot taken meanwhile loads and the guest verifies all
//! its memory.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::Duration;

use e2e_tests::kvm_available;
use vmm_common::{Scratch, VmmRun};

#[test]
fn a_resume_during_a_snapshot_is_refused_and_the_snapshot_loads_whole() {
    if !kvm_available("a_resume_during_a_snapshot_is_refused_and_the_snapshot_loads_whole") {
        return;
    }
    let scratch = Scratch::new("snapshot-resume-race");
    let socket = scratch.path("api.sock");
    // After the checkpoint the guest writes all its memory again with another pattern.
    let (vmm, api) = VmmRun::start_paused(
        &[
            "--memory",
            "1G",
            "--workload",
            "write:all:0x11,checkpoint:1,write:all:0x22,verify:all:0x22",
        ],
        &socket,
    );
    let (snapshot, memory) = (scratch.path("vm.snap"), scratch.path("vm.mem"));
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#);
    let resume = r#"{"state":"Resumed"}"#;
    let (created, refused, accepted) = std::thread::scope(|s| {
        let creating = s.spawn(|| api.request("PUT", "/snapshot/create", Some(&body)).unwrap());
        let (mut refused, mut accepted) = (0, 0);
        // Once the memory is being copied (its file exists), resumes are refused.
        while !creating.is_finished() && !std::path::Path::new(&memory).exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
        while !creating.is_finished() {
            let response = api.request("PATCH", "/vm", Some(resume)).unwrap();
            match response.status {
                400 => {
                    assert!(
                        response
                            .body
                            .contains("a snapshot of the VM is being taken"),
                        "{}",
                        response.body
                    );
                    refused += 1;
                }
                // The snapshot's file is written after its memory: a resume accepted before
                // it exists came in the middle of the copy. One accepted after it (the
                // snapshot done, its answer not read yet) resumes the VM, which is right.
                _ if std::path::Path::new(&snapshot).exists() => break,
                _ => accepted += 1,
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        (creating.join().unwrap(), refused, accepted)
    });
    eprintln!("{refused} resumes refused while the snapshot was taken");
    assert_eq!(created.status, 204, "{}", created.body);
    assert_eq!(accepted, 0, "a resume was accepted during the snapshot");
    assert!(
        refused > 0,
        "the snapshot ended before any resume was tried"
    );
    vmm.kill();
    // The snapshot is one moment: the loaded guest writes and verifies from the checkpoint on.
    let loaded = VmmRun::start_command(&[
        "snapshot",
        "load",
        "--snapshot-path",
        &snapshot,
        "--mem-file-path",
        &memory,
        "--resume",
    ])
    .wait(Duration::from_secs(300));
    loaded.assert_success();
    assert!(loaded.stdout.contains("step 4: ok"), "{loaded:#?}");
}
