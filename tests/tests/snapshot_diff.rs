//! End-to-end: diff snapshots, as Firecracker takes them. A test guest VM that tracks dirty
//! pages is snapshotted in full at its first checkpoint (the base), writes 4 MiB more and is
//! snapshotted again as a diff at its second: the diff's memory file holds those pages alone,
//! and once merged onto the base (`vmm snapshot rebase`, Firecracker's rebase-snap) or written
//! over it in place, the diff snapshot loads with it, its memory verified against the
//! checksum, and the guest verifies every page. Diffs without dirty page tracking get
//! Firecracker's refusal.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use e2e_tests::kvm_available;
use vmm_cli::ApiClient;
use vmm_common::{
    client, get, rebase_snapshot, send, start_snapshot_load, wait_for_state, Scratch, VmmRun,
};

/// All of RAM, a checkpoint (the base), 4 MiB more, a checkpoint (the diff), then every page
/// verified.
const WORKLOAD: &str = "write:all:0xa,checkpoint:1,write:8M+4M:0xb,checkpoint:2,\
                        verify:2M+6M:0xa,verify:8M+4M:0xb,verify:12M+20M:0xa";
const TIMEOUT: Duration = Duration::from_secs(120);

fn take_snapshot(api: &ApiClient, kind: &str, snapshot: &str, memory: &str) {
    let body = format!(
        r#"{{"snapshot_type":"{kind}","snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#
    );
    send(api, "PUT", "/snapshot/create", &body);
}

/// Runs the workload to its second checkpoint with a full snapshot at the first into
/// `base_memory` and a diff at the second into `diff_memory`.
fn base_and_diff(scratch: &Scratch, name: &str, base_memory: &str, diff_memory: &str) -> String {
    let socket = scratch.path(&format!("{name}.sock"));
    let (base, diff) = (
        scratch.path(&format!("{name}-base.snap")),
        scratch.path(&format!("{name}-diff.snap")),
    );
    let args = [
        "--memory",
        "32M",
        "--track-dirty-pages",
        "--workload",
        WORKLOAD,
    ];
    let (vmm, api) = VmmRun::start_paused(&args, &socket);
    assert_eq!(get(&api, "/machine-config")["track_dirty_pages"], true);
    take_snapshot(&api, "Full", &base, base_memory);
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    wait_for_state(&api, "Paused");
    take_snapshot(&api, "Diff", &diff, diff_memory);
    vmm.kill();
    diff
}

/// Loads `snapshot` with `memory`, verified, and checks that the guest finished after its
/// second checkpoint.
fn load_and_finish(snapshot: &str, memory: &str) {
    let run = start_snapshot_load(snapshot, memory, &["--verify-memory"]).wait(TIMEOUT);
    run.assert_success();
    assert!(
        run.stdout.contains("step 7: ok") && !run.stdout.contains("step 3: ok"),
        "{run:#?}"
    );
}

#[test]
fn a_diff_holds_the_pages_written_since_the_base_and_loads_merged_onto_it() {
    if !kvm_available("snapshot_diff_merged") {
        return;
    }
    let scratch = Scratch::new("snapshot-diff");
    let (base_memory, diff_memory) = (scratch.path("base.mem"), scratch.path("diff.mem"));
    let diff = base_and_diff(&scratch, "merged", &base_memory, &diff_memory);
    // The diff: as long as the base, 4 MiB of it data (and the trailer, and what the VMM and
    // the guest's own stack wrote), the rest holes.
    let (base_meta, diff_meta) = (
        std::fs::metadata(&base_memory).unwrap(),
        std::fs::metadata(&diff_memory).unwrap(),
    );
    assert_eq!(diff_meta.len(), base_meta.len());
    let data = diff_meta.blocks() * 512;
    assert!(
        (4 << 20..6 << 20).contains(&data),
        "the diff holds {data} bytes of data"
    );
    eprintln!(
        "snapshot_diff: base {} KiB of data, diff {} KiB",
        base_meta.blocks() / 2,
        data >> 10
    );
    rebase_snapshot(&base_memory, &diff_memory);
    load_and_finish(&diff, &base_memory);
    // A diff onto a file that is not a snapshot's memory is refused, and changes nothing.
    let other = scratch.path("other.mem");
    std::fs::write(&other, vec![0u8; 8192]).unwrap();
    let refused = client(&[
        "snapshot",
        "rebase",
        "--base-file",
        &other,
        "--diff-file",
        &diff_memory,
    ]);
    assert_eq!(refused.code, Some(2), "{refused:#?}");
    assert_eq!(std::fs::read(&other).unwrap(), vec![0u8; 8192]);
}

#[test]
fn a_diff_written_over_its_base_in_place_loads_with_it() {
    if !kvm_available("snapshot_diff_in_place") {
        return;
    }
    let scratch = Scratch::new("snapshot-diff-in-place");
    let memory = scratch.path("vm.mem");
    let diff = base_and_diff(&scratch, "in-place", &memory, &memory);
    load_and_finish(&diff, &memory);
}

#[test]
fn a_diff_needs_dirty_page_tracking_and_a_loaded_vm_tracks_on_request() {
    if !kvm_available("snapshot_diff_refused") {
        return;
    }
    let scratch = Scratch::new("snapshot-diff-refused");
    let (socket, snapshot, memory) = (
        scratch.path("api.sock"),
        scratch.path("vm.snap"),
        scratch.path("vm.mem"),
    );
    let (vmm, api) = VmmRun::start_paused(&["--memory", "32M", "--workload", WORKLOAD], &socket);
    let body = format!(
        r#"{{"snapshot_type":"Diff","snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#
    );
    let refused = api.request("PUT", "/snapshot/create", Some(&body)).unwrap();
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused
            .body
            .contains("Diff snapshots are not allowed on uVMs with dirty page tracking disabled."),
        "{}",
        refused.body
    );
    // A full one, loaded through Firecracker's API with its deprecated field for tracking:
    // the loaded VM takes diffs.
    take_snapshot(&api, "Full", &snapshot, &memory);
    vmm.kill();
    let _ = std::fs::remove_file(&socket);
    let mut loading = VmmRun::start_command(&["--api-sock", &socket]);
    let api = loading.api(&socket);
    let load = format!(
        r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{memory}","enable_diff_snapshots":true}}"#
    );
    let loaded = api.request("PUT", "/snapshot/load", Some(&load)).unwrap();
    assert_eq!(loaded.status, 204, "{}", loaded.body);
    let diff_memory = scratch.path("diff.mem");
    let diff_snapshot = scratch.path("diff.snap");
    take_snapshot(&api, "Diff", &diff_snapshot, &diff_memory);
    let data = std::fs::metadata(&diff_memory).unwrap().blocks() * 512;
    assert!(data < 1 << 20, "nothing ran since the load: {data} bytes");
    loading.kill();
}
