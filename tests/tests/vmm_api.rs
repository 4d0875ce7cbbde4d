//! End-to-end: the control API of a running `vmm run`: per-vCPU LLFree reservations in
//! GET /memory, checkpoints that pause the VM, and the `vmm` client subcommands.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use e2e_tests::kvm_available;
use serde_json::Value;
use vmm_common::{client, get, send, Scratch, VmmRun};

/// 4 KiB frames in one 64 MiB tree of the allocator.
const TREE_FRAMES: u64 = 16384;
/// 4 KiB frames in one 2 MiB chunk.
const CHUNK_FRAMES: u64 = 512;

fn tree(memory: &Value, index: &Value) -> Value {
    let trees = memory["pool"]["trees"].as_array().unwrap();
    trees.iter().find(|t| t["index"] == *index).unwrap().clone()
}

/// Resumes the paused guest of `vmm` and waits until it has done its workload.
fn resume_to_the_end(api: &vmm_cli::ApiClient, vmm: VmmRun) {
    send(api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let run = vmm.wait(std::time::Duration::from_secs(60));
    run.assert_success();
    assert!(run.stdout.contains("test guest: done"), "{run:#?}");
}

#[test]
fn two_vcpus_fault_into_their_own_reservations() {
    if !kvm_available("two_vcpus_fault_into_their_own_reservations") {
        return;
    }
    let scratch = Scratch::new("reservations");
    let socket = scratch.path("api.sock");
    // 512 MiB: 8 trees of 64 MiB. Both vCPUs write half of 62 MiB (about 16 chunks each: less
    // than a tree), then the VM pauses at the checkpoint.
    let (vmm, api) = VmmRun::start_paused(
        &[
            "--memory",
            "512M",
            "--vcpus",
            "2",
            "--populate",
            "lazy",
            "--workload",
            "write:2M+62M,checkpoint:1,verify:2M+62M",
        ],
        &socket,
    );
    let memory = get(&api, "/memory");
    let vcpus = memory["vcpus"].as_array().unwrap();
    assert_eq!(vcpus.len(), 2);
    let faults: Vec<u64> = vcpus
        .iter()
        .map(|v| v["faults"].as_u64().unwrap())
        .collect();
    assert!(faults.iter().all(|&f| f >= 15), "{memory:#}");
    // Chunk 0 (the guest's code) was populated by the VMM; every other by a vCPU fault.
    let populated = memory["guest"]["populated_chunks"].as_u64().unwrap();
    assert_eq!(populated, 32, "{memory:#}");
    assert_eq!(faults.iter().sum::<u64>(), populated - 1);
    let trees: Vec<&Value> = vcpus.iter().map(|v| &v["reserved_tree"]).collect();
    assert!(trees.iter().all(|t| t.is_u64()), "{memory:#}");
    assert_ne!(trees[0], trees[1], "each vCPU reserved its own tree");
    for (vcpu, tree_index) in trees.iter().enumerate() {
        let core = &vcpus[vcpu]["core"];
        let reservations = memory["pool"]["reservations"].as_array().unwrap();
        assert!(reservations
            .iter()
            .any(|r| r["core"] == *core && r["tree"] == **tree_index));
        // Every frame of the vCPU's faults came out of its own reserved tree.
        let free = tree(&memory, tree_index)["free_4k_frames"]
            .as_u64()
            .unwrap();
        assert_eq!(
            free,
            TREE_FRAMES - faults[vcpu] * CHUNK_FRAMES,
            "{memory:#}"
        );
    }
    resume_to_the_end(&api, vmm);
}

#[test]
fn the_client_subcommands_drive_a_running_guest() {
    if !kvm_available("the_client_subcommands_drive_a_running_guest") {
        return;
    }
    let scratch = Scratch::new("client-commands");
    let socket = scratch.path("api.sock");
    // Stops at the checkpoint, so that every command meets a live VM; after it, passes over
    // all of RAM keep the guest busy long enough to be paused again by hand.
    let (vmm, api) = VmmRun::start_paused(
        &[
            "--memory",
            "128M",
            "--populate",
            "eager",
            "--workload",
            "write:2M+8M,checkpoint:7,verify:2M+8M,write:all:3,verify:all:3,write:all:5",
        ],
        &socket,
    );
    // Short views by default, a line each; the API's whole JSON with --json.
    let short = client(&["info", "--socket", &socket]);
    assert!(short.stdout.starts_with("state    Paused\n"), "{short:#?}");
    let short = client(&["memory", "--socket", &socket]);
    assert!(
        short
            .stdout
            .contains("guest    128 MiB in 64 chunks of 2 MiB: 64 populated (128 MiB)"),
        "{short:#?}"
    );
    assert!(short.stdout.lines().count() < 20, "{short:#?}");
    let info = client(&["info", "--socket", &socket, "--json"]);
    assert_eq!(info.code, Some(0), "{info:#?}");
    let info: Value = serde_json::from_str(&info.stdout).unwrap();
    assert_eq!(info["state"], "Paused");
    assert_eq!(info["populate"], "eager");
    assert_eq!(info["mem_size_mib"], 128);
    let memory = client(&["memory", "--socket", &socket, "--json"]);
    let memory: Value = serde_json::from_str(&memory.stdout).unwrap();
    assert_eq!(memory["guest"]["populated_chunks"], 64, "eager: all of it");
    assert_eq!(memory["guest"]["faults"], 0);
    // Resume, pause again by hand (pausing a paused VM is fine), then resume to the end.
    assert_eq!(client(&["resume", "--socket", &socket]).code, Some(0));
    let paused = client(&["pause", "--socket", &socket]);
    assert_eq!(paused.code, Some(0), "{paused:#?}");
    assert_eq!(get(&api, "/machine")["state"], "Paused");
    assert_eq!(client(&["resume", "-s", &socket]).code, Some(0));
    let run = vmm.wait(std::time::Duration::from_secs(60));
    run.assert_success();
    // The VM is gone: its API too.
    let gone = client(&["info", "--socket", &socket]);
    gone.assert_fails(4, "");
}

#[test]
fn shutdown_stops_a_paused_guest_and_requests_that_do_not_fit_are_refused() {
    if !kvm_available("shutdown_stops_a_paused_guest") {
        return;
    }
    let scratch = Scratch::new("shutdown-paused");
    let socket = scratch.path("api.sock");
    let (vmm, _api) = VmmRun::start_paused(
        &[
            "--memory",
            "64M",
            "--vcpus",
            "2",
            "--workload",
            "checkpoint:1,write:all",
        ],
        &socket,
    );
    let shutdown = client(&["shutdown", "--socket", &socket]);
    assert_eq!(shutdown.code, Some(0), "{shutdown:#?}");
    let run = vmm.wait(std::time::Duration::from_secs(30));
    run.assert_stopped(6, "an API shutdown request");
    assert!(!run.stdout.contains("test guest: done"), "stopped early");
    assert!(!std::path::Path::new(&socket).exists(), "socket removed");
}

/// `--smt`: the vCPUs are the two threads of a core (Firecracker's `smt`); the guest runs on
/// them and `GET /machine-config` says so.
#[test]
fn smt_vcpus_run_the_guest_and_the_machine_config_says_smt() {
    if !kvm_available("smt_vcpus_run_the_guest_and_the_machine_config_says_smt") {
        return;
    }
    let scratch = Scratch::new("smt");
    let socket = scratch.path("api.sock");
    let (vmm, api) = VmmRun::start_paused(
        &[
            "--memory",
            "64M",
            "--vcpus",
            "2",
            "--smt",
            "--workload",
            "checkpoint:1,write:all,verify:all",
        ],
        &socket,
    );
    let machine = get(&api, "/machine-config");
    assert_eq!(
        (machine["vcpu_count"].as_u64(), machine["smt"].as_bool()),
        (Some(2), Some(true))
    );
    resume_to_the_end(&api, vmm);
}

/// The VMM ends at once after a `Shutdown` action, but never before its 204 has reached the
/// client: a hundred VMMs in a row, each stopped by a raw request, each answered in full (the
/// VMM once ended with the answer half written on a loaded host).
#[test]
fn every_shutdown_request_is_answered_before_the_vmm_ends() {
    if !kvm_available("every_shutdown_request_is_answered_before_the_vmm_ends") {
        return;
    }
    let scratch = Scratch::new("shutdown-answered");
    for round in 0..100 {
        let socket = scratch.path(&format!("api-{round}.sock"));
        let (vmm, api) = VmmRun::start_paused(
            &["--memory", "16M", "--workload", "checkpoint:1,write:all"],
            &socket,
        );
        send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
        let run = vmm.wait(std::time::Duration::from_secs(30));
        run.assert_stopped(6, "an API shutdown request");
    }
}

/// Resident KiB of the process's mappings registered with userfaultfd (VmFlags `um`): the
/// placeholders of unpopulated guest memory, which must never hold pages of their own.
fn resident_kib_in_placeholders(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut total, mut rss) = (0, 0);
    for line in smaps.lines() {
        if let Some(kib) = line.strip_prefix("Rss:") {
            rss = kib.trim().trim_end_matches(" kB").parse().unwrap();
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            if flags.split_whitespace().any(|flag| flag == "um") {
                total += rss;
            }
        }
    }
    total
}

#[test]
fn a_guest_writing_memory_while_it_reports_it_free_never_gets_memory_outside_the_pool() {
    if !kvm_available(
        "a_guest_writing_memory_while_it_reports_it_free_never_gets_memory_outside_the_pool",
    ) {
        return;
    }
    let scratch = Scratch::new("write-while-reporting");
    let socket = scratch.path("api.sock");
    // vCPU 1 writes one page of chunk 1 over and over while vCPU 0 reports the chunk free 1000
    // times: every report finds the chunk populated again and discards it under the writer.
    let (vmm, api) = VmmRun::start_paused(
        &[
            "--memory",
            "64M",
            "--vcpus",
            "2",
            "--balloon",
            "free_page_reporting=on",
            "--workload",
            "write@1:2M+4K*300000&report@0:2M+2M*1000,checkpoint:1",
        ],
        &socket,
    );
    let memory = get(&api, "/memory");
    let discarded = memory["guest"]["discarded_chunks"].as_u64().unwrap();
    // Most of the reports discard the chunk under the writer on an idle host; on a loaded
    // one the two vCPUs overlap less, and ten races are still the point made.
    assert!(discarded >= 10, "the reports raced the writer: {memory:#}");
    let populated = memory["guest"]["populated_chunks"].as_u64().unwrap();
    assert_eq!(
        memory["pool"]["used_bytes"].as_u64().unwrap(),
        populated * 2 * 1024 * 1024,
        "the guest's memory is exactly its pool frames: {memory:#}"
    );
    assert_eq!(
        resident_kib_in_placeholders(vmm.pid()),
        0,
        "no anonymous memory behind unpopulated chunks ({discarded} discards)"
    );
    resume_to_the_end(&api, vmm);
}
