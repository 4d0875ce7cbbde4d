//! End-to-end: how `vmm run` ends. SIGINT (Ctrl-C) and SIGTERM stop the guest cleanly, with exit
//! status 130 or 143 and a line saying so; a guest fault the frame pool cannot serve ends the
//! run with one error line.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::path::Path;
use std::time::Duration;

use e2e_tests::kvm_available;
use vmm_common::{get, wait_for_state, Scratch, VmmRun};

/// A workload that runs for many seconds: passes over 1 GiB.
const LONG_WORKLOAD: &str = "write:all,verify:all,write:all:7,verify:all:7,write:all:9";

#[test]
fn sigint_and_sigterm_stop_a_running_guest_cleanly() {
    if !kvm_available("sigint_and_sigterm_stop_a_running_guest_cleanly") {
        return;
    }
    for (signal, code) in [("INT", 130), ("TERM", 143)] {
        let scratch = Scratch::new(&format!("signal-{signal}"));
        let socket = scratch.path("api.sock");
        let mut vmm = VmmRun::start(&[
            "--memory",
            "1G",
            "--vcpus",
            "2",
            "--api-socket",
            &socket,
            "--workload",
            LONG_WORKLOAD,
        ]);
        let api = vmm.api(&socket);
        wait_for_state(&api, "Running");
        // Let it fault in some memory first.
        while get(&api, "/memory")["guest"]["faults"].as_u64().unwrap() < 4 {
            std::thread::sleep(Duration::from_millis(10));
        }
        vmm.signal(signal);
        let run = vmm.wait(Duration::from_secs(20));
        run.assert_stopped(code, &format!("SIG{signal}"));
        assert!(run.stdout.contains("llfree-vmm test guest:"), "{run:#?}");
        assert!(
            !run.stdout.contains("test guest: done"),
            "SIG{signal}: {run:#?}"
        );
        assert!(!Path::new(&socket).exists(), "the API socket is removed");
    }
}

#[test]
fn sigint_stops_a_guest_paused_at_a_checkpoint() {
    if !kvm_available("sigint_stops_a_guest_paused_at_a_checkpoint") {
        return;
    }
    let scratch = Scratch::new("signal-paused");
    let socket = scratch.path("api.sock");
    let (vmm, _api) = VmmRun::start_paused(
        &[
            "--memory",
            "64M",
            "--workload",
            "write:2M+2M,checkpoint:1,verify:2M+2M",
        ],
        &socket,
    );
    vmm.signal("INT");
    let run = vmm.wait(Duration::from_secs(20));
    run.assert_stopped(130, "SIGINT");
    // The pause was announced, with the way out.
    assert!(
        run.stderr.starts_with(&format!(
            "paused at checkpoint 1; resume with `vmm resume --socket {socket}`\n"
        )),
        "{run:#?}"
    );
}

/// Waits (at most 60 s) until the guest behind `api` waits for memory.
fn until_the_guest_waits(api: &vmm_cli::ApiClient) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while get(api, "/memory")["guest"]["waiting_vcpus"] != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the guest never waited"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A pool file of 64 MiB in `scratch` (its `--backing`) with 16 of its 32 frames held by a VMM
/// that was killed: the persistent pool keeps them allocated.
fn half_held_pool(scratch: &Scratch) -> String {
    let socket = scratch.path("holder.sock");
    let backing = format!("file:{}", scratch.path("pool"));
    let (killed, api) = VmmRun::start_paused(
        &[
            "--memory",
            "64M",
            "--backing",
            &backing,
            "--workload",
            "write:2M+30M,checkpoint:1",
        ],
        &socket,
    );
    assert_eq!(get(&api, "/memory")["pool"]["used_bytes"], 32 << 20);
    killed.kill();
    backing
}

#[test]
fn a_fault_the_pool_cannot_serve_ends_the_run_with_one_error_line() {
    if !kvm_available("a_fault_the_pool_cannot_serve_ends_the_run_with_one_error_line") {
        return;
    }
    let scratch = Scratch::new("exhausted");
    let backing = half_held_pool(&scratch);
    // The next guest on that pool runs out of frames when it touches its 17th chunk.
    let run = VmmRun::run(&["--memory", "64M", "--backing", &backing]);
    run.assert_fails(4, "guest memory pool exhausted");
    assert!(
        run.stderr.contains("vCPU 0: ")
            && run.stderr.contains("pool of 64 MiB, 0 bytes free")
            && run.stderr.contains("the VM was stopped"),
        "{run:#?}"
    );
    assert!(
        run.stdout.contains("llfree-vmm test guest:"),
        "it ran: {run:#?}"
    );
    // Eager population finds out before the guest runs.
    let eager = VmmRun::run(&[
        "--memory",
        "64M",
        "--backing",
        &backing,
        "--populate",
        "eager",
    ]);
    eager.assert_fails(4, "cannot create guest memory");
}

#[test]
fn sigint_during_eager_population_stops_at_once() {
    if !kvm_available("sigint_during_eager_population_stops_at_once") {
        return;
    }
    // 4 GiB of anonymous frames take seconds to prefault here.
    let vmm = VmmRun::start(&["--memory", "4G", "--populate", "eager"]);
    std::thread::sleep(Duration::from_millis(300));
    vmm.signal("INT");
    let signalled = std::time::Instant::now();
    let run = vmm.wait(Duration::from_secs(20));
    let took = signalled.elapsed();
    eprintln!("vmm run ended {took:?} after SIGINT during eager population");
    run.assert_stopped(130, "SIGINT");
    assert!(run.stdout.is_empty(), "the guest never ran: {run:#?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

/// A guest waiting for memory (`--wait-for-memory` on an exhausted pool) is stopped as promptly
/// as a running one, by each of API Shutdown, SIGINT and SIGTERM: the stop ends the wait of
/// every fault (a vCPU's, or a kernel worker's on hardware KVM), which no kick can interrupt.
#[test]
fn every_stop_ends_a_vmm_whose_guest_waits_for_memory() {
    if !kvm_available("every_stop_ends_a_vmm_whose_guest_waits_for_memory") {
        return;
    }
    let scratch = Scratch::new("waiting-stop");
    // The next guest on the pool waits at its 17th chunk.
    let backing = half_held_pool(&scratch);
    for (stop, code, cause) in [
        ("Shutdown", 6, "an API shutdown request"),
        ("INT", 130, "SIGINT"),
        ("TERM", 143, "SIGTERM"),
    ] {
        let socket = scratch.path(&format!("{stop}.sock"));
        let mut vmm = VmmRun::start(&[
            "--memory",
            "64M",
            "--backing",
            &backing,
            "--wait-for-memory",
            "--api-socket",
            &socket,
        ]);
        let api = vmm.api(&socket);
        until_the_guest_waits(&api);
        let asked = std::time::Instant::now();
        if stop == "Shutdown" {
            vmm_common::send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
        } else {
            vmm.signal(stop);
        }
        let run = vmm.wait(Duration::from_secs(20));
        let took = asked.elapsed();
        eprintln!("{stop}: a VMM whose guest waited for memory ended after {took:?}");
        assert_eq!(run.code, Some(code), "{stop}: {run:#?}");
        assert!(
            run.stderr.contains("waits for a frame")
                && run.stderr.ends_with(&format!(
                    "stopped: {cause} ended the VM before the guest finished\n"
                )),
            "{stop}: {run:#?}"
        );
    }
}

/// A pause of a VM whose vCPU waits for a frame is answered at once: the waiting vCPU, blocked
/// in the kernel where no kick reaches it, is held there and counts as paused. A frame that
/// comes free while the VM is paused does not let it run; after the resume it gets one and the
/// guest finishes. A snapshot meanwhile is refused at once with the reason.
#[test]
fn a_vm_whose_guest_waits_for_memory_pauses_at_once_and_resumes_its_wait() {
    let name = "a_vm_whose_guest_waits_for_memory_pauses_at_once_and_resumes_its_wait";
    if !kvm_available(name) {
        return;
    }
    let scratch = Scratch::new("waiting-pause");
    let zone = scratch.path("zone");
    let created = vmm_common::client(&["zone", "create", &zone, "--size", "64M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    // VM a holds 24 of the zone's 32 frames until it is shut down; it is ephemeral, so its
    // frames go back to the zone then.
    let holder_socket = scratch.path("holder.sock");
    let (holder, holder_api) = VmmRun::start_paused(
        &[
            "--zone",
            &zone,
            "--vm",
            "a",
            "--ephemeral",
            "--memory",
            "48M",
            "--workload",
            "write:2M+46M,checkpoint:1",
        ],
        &holder_socket,
    );
    let socket = scratch.path("waiter.sock");
    let mut waiter = VmmRun::start(&[
        "--zone",
        &zone,
        "--vm",
        "b",
        "--memory",
        "48M",
        "--wait-for-memory",
        "--workload",
        "write:all:0xB,verify:all:0xB",
        "--api-socket",
        &socket,
    ]);
    let api = waiter.api(&socket);
    until_the_guest_waits(&api);
    let asked = std::time::Instant::now();
    vmm_common::send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    let paused_after = asked.elapsed();
    wait_for_state(&api, "Paused");
    let asked = std::time::Instant::now();
    let snapshot = api
        .request(
            "PUT",
            "/snapshot/create",
            Some(&format!(
                r#"{{"snapshot_path":"{0}/vm.snap","mem_file_path":"{0}/vm.mem"}}"#,
                scratch.path("")
            )),
        )
        .unwrap();
    let refused_after = asked.elapsed();
    assert_eq!(snapshot.status, 400, "{}", snapshot.body);
    assert!(
        snapshot.body.contains("vCPU 0 waits for guest memory"),
        "{}",
        snapshot.body
    );
    // Who waits, and since when: the held vCPU waits on.
    let first = get(&api, "/memory")["vcpus"][0]["waiting_ms"].as_u64();
    std::thread::sleep(Duration::from_millis(200));
    let later = get(&api, "/memory")["vcpus"][0]["waiting_ms"].as_u64();
    assert!(
        first.is_some_and(|first| later > Some(first)),
        "{first:?}, {later:?}"
    );
    // The holder goes, its frames with it; the paused guest still waits.
    vmm_common::send(
        &holder_api,
        "PUT",
        "/actions",
        r#"{"action_type":"Shutdown"}"#,
    );
    holder.wait(Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        get(&api, "/memory")["guest"]["waiting_vcpus"],
        1,
        "a paused guest got memory"
    );
    assert_eq!(get(&api, "/machine")["state"], "Paused");
    vmm_common::send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let run = waiter.wait(Duration::from_secs(60));
    assert!(run.stdout.contains("test guest: done"), "{run:#?}");
    eprintln!(
        "paused {paused_after:?} after the request, snapshot refused after {refused_after:?}"
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stdout.contains("test guest: done"), "{run:#?}");
    assert!(paused_after < Duration::from_secs(1), "{paused_after:?}");
    assert!(refused_after < Duration::from_secs(1), "{refused_after:?}");
}

/// `--wait-for-memory=DURATION` bounds the wait: past it the VM stops with status 8 and a
/// message saying what it lacked, instead of hanging. The time the VM is paused does not count.
#[test]
fn a_wait_for_memory_past_its_limit_ends_the_run_with_status_8() {
    let name = "a_wait_for_memory_past_its_limit_ends_the_run_with_status_8";
    if !kvm_available(name) {
        return;
    }
    let scratch = Scratch::new("waiting-limit");
    let backing = half_held_pool(&scratch);
    let socket = scratch.path("api.sock");
    let mut vmm = VmmRun::start(&[
        "--memory",
        "64M",
        "--backing",
        &backing,
        "--wait-for-memory=2s",
        "--api-socket",
        &socket,
    ]);
    let api = vmm.api(&socket);
    until_the_guest_waits(&api);
    vmm_common::send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        get(&api, "/machine")["state"],
        "Paused",
        "paused time counted"
    );
    let resumed = std::time::Instant::now();
    vmm_common::send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let run = vmm.wait(Duration::from_secs(30));
    let took = resumed.elapsed();
    eprintln!("stopped {took:?} after the resume");
    assert_eq!(run.code, Some(8), "{run:#?}");
    // The wait's warning, then the error.
    let error = run.stderr.lines().last().unwrap_or_default();
    assert!(
        error.starts_with("error: vCPU 0: waited 2.")
            && error.contains("longer than --wait-for-memory allows")
            && error.contains("pool of 64 MiB, 0 bytes free, 2 MiB frames"),
        "{run:#?}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "{took:?}"
    );
}
