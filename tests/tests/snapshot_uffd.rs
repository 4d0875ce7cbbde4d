//! End-to-end: Firecracker's Uffd memory backend. A test guest's copy snapshot loads with
//! `mem_backend` `Uffd`: the VMM connects to a page-fault handler of the test's own
//! (`e2e_tests::page_fault_handler`, written as Firecracker's example handlers are) and the
//! guest verifies all of its memory, every page of which came through the handler. A handler that is not listening and
//! `verify_memory` are refused, and change nothing: the snapshot loads afterwards.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::Duration;

use e2e_tests::kvm_available;
use e2e_tests::page_fault_handler::PageFaultHandler;
use vmm_common::{send, wait_for_state, Scratch, VmmRun};

/// Writes all of RAM, stops at checkpoint 1, then verifies it.
const WORKLOAD: &str = "write:all:0x0ffd,checkpoint:1,verify:all:0x0ffd";
const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn a_copy_snapshot_loads_through_firecracker_s_uffd_backend_and_its_handler_serves_every_page() {
    if !kvm_available("snapshot_uffd") {
        return;
    }
    let scratch = Scratch::new("snapshot-uffd");
    let (snapshot, memory, socket) = (
        scratch.path("vm.snap"),
        scratch.path("vm.mem"),
        scratch.path("api.sock"),
    );
    let args = ["--memory", "32M", "--workload", WORKLOAD];
    let (vmm, api) = VmmRun::start_paused(&args, &socket);
    send(
        &api,
        "PUT",
        "/snapshot/create",
        &format!(
            r#"{{"snapshot_type":"Full","snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#
        ),
    );
    drop(vmm);

    let uffd_socket = scratch.path("uffd.sock");
    let body = |extra: &str| {
        format!(
            r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"Uffd","backend_path":"{uffd_socket}"}},"resume_vm":true{extra}}}"#
        )
    };
    let socket2 = scratch.path("api2.sock");
    let mut failed = VmmRun::start_command(&["--api-sock", &socket2]);
    let api = failed.api(&socket2);
    let load = |api: &vmm_cli::ApiClient, extra: &str| {
        api.request("PUT", "/snapshot/load", Some(&body(extra)))
            .unwrap()
    };
    // verify_memory cannot be had: refused before anything is done.
    let refused = load(&api, r#","verify_memory":true"#);
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.body.contains("verify_memory"), "{}", refused.body);
    // No handler listens: the load fails with the reason and, as Firecracker's failed restore,
    // ends the VMM.
    let refused = load(&api, "");
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused
            .body
            .contains("cannot connect to the page-fault handler"),
        "{}",
        refused.body
    );
    let ended = failed.wait(TIMEOUT);
    assert_ne!(ended.code, Some(0), "{ended:#?}");

    let _ = std::fs::remove_file(&socket2);
    let mut loaded = VmmRun::start_command(&["--api-sock", &socket2]);
    let api = loaded.api(&socket2);
    let handler = PageFaultHandler::listen(&uffd_socket, &memory);
    send(&api, "PUT", "/snapshot/load", &body(""));
    wait_for_state(&api, "Running");
    let run = loaded.wait(TIMEOUT);
    let served = handler.finish();
    eprintln!("the handler served {served:?}");
    run.assert_success();
    assert!(
        run.stdout.contains("step 3: ok") && !run.stdout.contains("step 1: ok"),
        "{run:#?}"
    );
    // 32 MiB verified by the guest: every one of its 4 KiB pages came from the handler.
    assert_eq!(served.page_size, 4096);
    assert!(served.regions >= 1);
    assert!(served.faults >= (32 << 20) / 4096 * 9 / 10, "{served:?}");
}
