//! End-to-end: one zone snapshot bases many clones. A VM in a zone is snapshotted into the zone
//! (nothing copied), and VMMs load it as clones, each under a name of its own (`clone_name` in
//! Firecracker's `PUT /snapshot/load`, `vmm snapshot load --clone`): every clone maps the base's
//! frames privately, takes frames of its own from the zone only for what the base had not
//! populated, and never changes the base. Twenty clones verify the base's memory and write
//! their own patterns, and none sees another's writes; the base can neither be loaded nor
//! deleted while clones run, and loads as itself afterwards; clones SIGKILLed at random while
//! others run leave no frame lost or leaked and no clone behind.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::{Duration, Instant};

use e2e_tests::{kvm_available, Scratch};
use vmm_common::{
    assert_clone_finished, client, get, load_all_at_once, run_in_two_halves, send,
    start_snapshot_load, zone_consistent, VmmRun,
};

/// The base writes the first 14 MiB of its workload area and is snapshotted at checkpoint 1;
/// a clone then verifies them, writes its own pattern over all of RAM (the chunks the base
/// never touched get frames of the clone's own from the zone) and verifies that.
const WORKLOAD: &str = "write:2M+14M:0x5ea1ed,checkpoint:1,verify:2M+14M:0x5ea1ed,\
                        write:all:0xc10e,verify:all:0xc10e";
/// As [`WORKLOAD`], but a clone writes its memory many times over: it runs for a while.
const LONG_WORKLOAD: &str = "write:2M+14M:0x5ea1ed,checkpoint:1,verify:2M+14M:0x5ea1ed,\
                             write:all:0xc10e*30,verify:all:0xc10e";
const CLONES: usize = 20;
const TIMEOUT: Duration = Duration::from_secs(300);

/// A zone, and a snapshot in it of VM `base` (32 MiB) paused at the workload's checkpoint;
/// the base's VMM is gone. Returns the zone, the snapshot and the base's frames.
fn zone_snapshot(scratch: &Scratch, workload: &str) -> (String, String, u64) {
    let (zone, snapshot, socket) = (
        scratch.path("zone"),
        scratch.path("base.snap"),
        scratch.path("base.sock"),
    );
    let created = client(&["zone", "create", &zone, "--size", "1G", "--max-vms", "32"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let args = [
        "--zone",
        &zone,
        "--vm",
        "base",
        "--memory",
        "32M",
        "--workload",
        workload,
    ];
    let (base, api) = VmmRun::start_paused(&args, &socket);
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{zone}"}}"#);
    send(&api, "PUT", "/snapshot/create", &body);
    base.kill();
    let frames = vm_frames(&zone_consistent(&zone), "base").expect("the base is in the zone");
    (zone, snapshot, frames)
}

/// The frames of VM `name` in `vmm zone inspect --json`'s answer, if the zone has it.
fn vm_frames(info: &serde_json::Value, name: &str) -> Option<u64> {
    info["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|vm| vm["name"] == name)
        .map(|vm| vm["frames"].as_u64().unwrap())
}

/// The body of `PUT /snapshot/load` for a clone called `clone` (none: the base itself).
fn load_body(snapshot: &str, zone: &str, clone: Option<&str>, resume: bool) -> String {
    let clone = clone.map_or(String::new(), |name| format!(r#","clone_name":"{name}""#));
    format!(
        r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{zone}"}},"resume_vm":{resume}{clone}}}"#
    )
}

/// Asserts that `PUT /snapshot/load` with `body` in a fresh VMM is answered 400 with `text`.
fn assert_load_refused(socket: &str, body: &str, text: &str) {
    let mut vmm = VmmRun::start_command(&["--api-sock", socket]);
    let api = vmm.api(socket);
    let response = api.request("PUT", "/snapshot/load", Some(body)).unwrap();
    assert_eq!(response.status, 400, "{}", response.body);
    assert!(response.body.contains(text), "{}", response.body);
}

/// Asserts that `zone` holds the base alone, with its `base_frames` and nothing lost or
/// leaked, and that the base loads as itself from `snapshot` and verifies its memory.
fn assert_the_base_alone_as_it_was(zone: &str, snapshot: &str, base_frames: u64) {
    let info = zone_consistent(zone);
    assert_eq!(info["vms"].as_array().unwrap().len(), 1, "{info:#}");
    assert_eq!(vm_frames(&info, "base"), Some(base_frames), "{info:#}");
    assert_eq!(info["used_frames"].as_u64(), Some(base_frames), "{info:#}");
    let run = start_snapshot_load(snapshot, zone, &[]).wait(TIMEOUT);
    assert_clone_finished(&run);
}

#[test]
fn twenty_clones_of_a_zone_snapshot_share_its_frames_and_keep_their_own_writes() {
    if !kvm_available("zone_clones") {
        return;
    }
    let scratch = Scratch::new("zone-clones");
    let (zone, snapshot, base_frames) = zone_snapshot(&scratch, WORKLOAD);

    let loads: Vec<(String, String)> = (0..CLONES)
        .map(|index| {
            let clone = format!("clone-{index}");
            let body = load_body(&snapshot, &zone, Some(&clone), false);
            (scratch.path(&format!("{clone}.sock")), body)
        })
        .collect();
    let clones = load_all_at_once(&loads);

    // Each clone maps the base's frames and has none of its own yet.
    let memory = get(&clones[0].1, "/memory");
    assert_eq!(memory["guest"]["clone_of"], "base", "{memory:#}");
    assert_eq!(
        memory["guest"]["file_backed_chunks"].as_u64(),
        Some(base_frames),
        "{memory:#}"
    );
    let info = zone_consistent(&zone);
    assert_eq!(
        info["vms"].as_array().unwrap().len(),
        CLONES + 1,
        "{info:#}"
    );
    assert_eq!(vm_frames(&info, "clone-0"), Some(0), "{info:#}");
    assert_eq!(info["used_frames"].as_u64(), Some(base_frames), "{info:#}");

    // While clones run, the base is neither loaded as itself nor deleted, and a clone's name
    // is its own.
    let base_load = load_body(&snapshot, &zone, None, true);
    assert_load_refused(
        &scratch.path("b.sock"),
        &base_load,
        "base of running clones",
    );
    let taken = load_body(&snapshot, &zone, Some("clone-3"), true);
    assert_load_refused(&scratch.path("t.sock"), &taken, "a name of its own");
    let deleted = client(&["zone", "delete-vm", &zone, "base"]);
    deleted.assert_fails(2, "base of running clones");

    // The first half overwrites all its memory while the second waits, paused; the second
    // half still finds the base's memory.
    run_in_two_halves(clones, TIMEOUT, assert_clone_finished);

    // The clones went with their frames; the base is as it was, and loads as itself.
    assert_the_base_alone_as_it_was(&zone, &snapshot, base_frames);
}

#[test]
fn clones_killed_at_random_leave_no_frame_lost_or_leaked_and_the_base_intact() {
    if !kvm_available("zone_clones") {
        return;
    }
    let scratch = Scratch::new("zone-clones-killed");
    let (zone, snapshot, base_frames) = zone_snapshot(&scratch, LONG_WORKLOAD);
    const RUNNING: usize = 8;
    let mut clones: Vec<Option<VmmRun>> = (0..RUNNING)
        .map(|index| {
            let name = format!("clone-{index}");
            Some(start_snapshot_load(&snapshot, &zone, &["--clone", &name]))
        })
        .collect();
    // Every other clone is killed, each at its own moment in the first seconds of its run
    // (while it loads, maps the base, takes frames of its own or writes them).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let seed = u64::from(std::process::id()) ^ u64::from(now.unwrap().subsec_nanos());
    let mut moments: Vec<(Duration, usize)> = (0..RUNNING)
        .step_by(2)
        .map(|index| {
            let spread = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15 ^ index as u64) % 3000;
            (Duration::from_millis(spread), index)
        })
        .collect();
    moments.sort();
    let started = Instant::now();
    for (moment, index) in moments {
        std::thread::sleep(moment.saturating_sub(started.elapsed()));
        let killed = clones[index].take().unwrap().kill();
        assert_eq!(
            killed.code, None,
            "clone-{index} was not killed: {killed:#?}"
        );
    }
    for clone in clones.into_iter().flatten() {
        assert_clone_finished(&clone.wait(TIMEOUT));
    }

    // Opening the zone deletes the killed clones with their own frames; the base keeps all.
    assert_the_base_alone_as_it_was(&zone, &snapshot, base_frames);
}

#[test]
fn a_kept_clone_is_a_vm_of_its_own_that_survives_a_crash_of_its_vmm() {
    if !kvm_available("zone_clones") {
        return;
    }
    let scratch = Scratch::new("zone-clones-kept");
    let (zone, snapshot, base_frames) = zone_snapshot(&scratch, WORKLOAD);
    let kept = start_snapshot_load(&snapshot, &zone, &["--clone", "kept", "--keep-clone"]);
    assert_clone_finished(&kept.wait(TIMEOUT));
    let info = zone_consistent(&zone);
    let vm = info["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|vm| vm["name"] == "kept")
        .cloned()
        .unwrap_or_else(|| panic!("the kept clone went: {info:#}"));
    assert!(vm["clone_of"].is_null(), "{info:#}");
    // The base's frames copied, and the rest of RAM written by the clone.
    assert_eq!(vm["frames"].as_u64(), Some(16), "{info:#}");
    assert_eq!(vm_frames(&info, "base"), Some(base_frames), "{info:#}");

    // Its VMM SIGKILLed while the guest runs, the kept clone stays with its memory.
    let args = [
        "--zone",
        &zone,
        "--vm",
        "kept",
        "--memory",
        "32M",
        "--workload",
        "verify:all:0xc10e,write:all:0x77*30",
    ];
    let mut again = VmmRun::start(&args);
    again.wait_for_line("step 1: ok", TIMEOUT);
    assert_eq!(again.kill().code, None);
    let info = zone_consistent(&zone);
    assert_eq!(vm_frames(&info, "kept"), Some(16), "{info:#}");
    let run = start_snapshot_load(&snapshot, &zone, &[]).wait(TIMEOUT);
    assert_clone_finished(&run);
}
