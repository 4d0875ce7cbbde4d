//! End-to-end: every kind of VMM thread survives its heaviest work under the built-in seccomp
//! filters, whatever the C library's allocator does meanwhile. One `vmm run` with a vsock
//! device (no guest driver), a balloon and hot-pluggable memory takes, while its guest writes
//! lazily populated memory (fault handler) and floods its balloon queue (event loop): thousands
//! of vsock clients opened and dropped, idle or with a `CONNECT` nobody answers (event loop),
//! thousands of API connections opened and dropped, idle or with a request (API threads), a
//! snapshot's creation (API thread) and a hotplug, free page reporting and hinting (vCPU, event
//! loop); another VMM loads the snapshot and runs it to its end. Neither ends other than with
//! status 0 nor names a denied call.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use e2e_tests::kvm_available;
use vmm_cli::ApiClient;
use vmm_common::{get, send, wait_for_state, Scratch, VmmRun};

const TIMEOUT: Duration = Duration::from_secs(300);

/// Opens `count` connections to the Unix socket at `path` at once, writes `first` on each (if
/// any), holds them a moment and drops them all.
fn churn(path: &str, count: usize, first: Option<&[u8]>) {
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        let mut stream = UnixStream::connect(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        if let Some(first) = first {
            // A full socket buffer would make a write wait: the VMM reads every line.
            stream.write_all(first).unwrap();
        }
        held.push(stream);
    }
    std::thread::sleep(Duration::from_millis(200));
    drop(held);
}

/// The VMM answers (its API thread and the main thread live) and has not ended.
fn assert_alive(vmm: &mut VmmRun, api: &ApiClient, what: &str) {
    assert!(
        vmm.running(),
        "{what}: the VMM ended: {}",
        vmm.stderr_so_far()
    );
    assert_eq!(get(api, "/")["state"], "Paused", "{what}");
}

#[test]
fn every_thread_kind_survives_its_heaviest_work_under_the_built_in_filters() {
    if !kvm_available("every_thread_kind_survives_its_heaviest_work_under_the_built_in_filters") {
        return;
    }
    let scratch = Scratch::new("seccomp-heavy");
    let (socket, vsock) = (scratch.path("api.sock"), scratch.path("v.sock"));
    let vsock_flag = format!("cid=3,uds={vsock}");
    let workload = "write:2M+16M,checkpoint:1,hotplug-target,write:4G+32M:3,break-balloon*2000,\
                    report:2M+8M,hint:10M+8M,checkpoint:2,verify:4G+32M:3";
    let args = [
        "--memory",
        "64M",
        "--hotplug",
        "total=128M",
        "--balloon",
        "free_page_reporting=on,free_page_hinting=on",
        "--vsock",
        &vsock_flag,
        "--workload",
        workload,
    ];
    let (mut vmm, api) = VmmRun::start_paused(&args, &socket);
    let started = Instant::now();
    // The event loop: rounds of a thousand vsock clients (past the device's 1024, which
    // refuses the rest), dropped at once; then clients whose CONNECT no driver answers.
    for _ in 0..3 {
        churn(&vsock, 1000, None);
    }
    churn(&vsock, 500, Some(b"CONNECT 52\n"));
    assert_alive(&mut vmm, &api, "after 3,500 vsock clients");
    // The API threads: idle connections, and connections with a request.
    for _ in 0..3 {
        churn(&socket, 1000, None);
    }
    churn(&socket, 500, Some(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    assert_alive(&mut vmm, &api, "after 3,500 API connections");
    // The API thread copies the memory out; the hotplug's size is in the snapshot.
    send(
        &api,
        "PATCH",
        "/hotplug/memory",
        r#"{"requested_size_mib": 32}"#,
    );
    let (snapshot, memory) = (scratch.path("vm.snap"), scratch.path("vm.mem"));
    send(
        &api,
        "PUT",
        "/snapshot/create",
        &format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#),
    );
    // The guest plugs, writes plugged memory, breaks its balloon queue 2,000 times, reports
    // and hints; meanwhile more vsock clients come and go.
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    churn(&vsock, 1000, None);
    wait_for_state(&api, "Paused");
    churn(&vsock, 1000, Some(b"CONNECT 52\n"));
    assert_alive(&mut vmm, &api, "at checkpoint 2");
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let run = vmm.wait(TIMEOUT);
    // It warned of the broken queues, rate-limited, and of nothing else.
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stdout.contains("test guest: done"), "{run:#?}");
    assert!(!run.stderr.contains("which its filter denies"), "{run:#?}");
    eprintln!(
        "9,500 vsock clients, 3,500 API connections, a snapshot, a hotplug and 2,000 broken \
         queues in {:?}: the VMM lived",
        started.elapsed()
    );
    assert!(
        !std::path::Path::new(&vsock).exists(),
        "the vsock socket left"
    );

    // The snapshot loads in another VMM (the event loop and API threads under their filters
    // again), which runs the guest from checkpoint 1 to its end.
    let load_socket = scratch.path("load.sock");
    let mut loaded = VmmRun::start_command(&["--api-sock", &load_socket]);
    let load_api = loaded.api(&load_socket);
    send(
        &load_api,
        "PUT",
        "/snapshot/load",
        &format!(
            r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File",
                "backend_path":"{memory}"}},"resume_vm":true}}"#
        ),
    );
    churn(&vsock, 1000, None);
    wait_for_state(&load_api, "Paused");
    send(&load_api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let run = loaded.wait(TIMEOUT);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stdout.contains("test guest: done"), "{run:#?}");
    assert!(!run.stderr.contains("which its filter denies"), "{run:#?}");
}
