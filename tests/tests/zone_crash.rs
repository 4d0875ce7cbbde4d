//! End-to-end: a VM's memory in a persistent zone survives SIGKILLs of its VMM at random
//! moments (during zone creation, population, free page reporting, free page hinting, balloon
//! inflation and deflation), with no frame lost or leaked, and the guest finds its RAM as it
//! was.
//!
//! `LLFREE_VMM_CRASHES=N` sets the number of kills (default 100); `LLFREE_VMM_CRASH_SEED=S`
//! repeats a run's random choices (its seed is printed).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::{env_value, kvm_available, progress, Rng};
use vmm_common::{client, vmm_binary, Scratch, VmmRun};

/// Guest RAM of the crashing VM.
const MEMORY: &str = "160M";
/// Written once, verified after every kill.
const STABLE: &str = "2M+16M";
const STABLE_PATTERN: &str = "0x57AB1E";
/// What the VM does while it is killed: population (first writes after discards), free page
/// reporting and hinting (discards), balloon inflation and deflation, over RAM outside the
/// stable part.
const CHAOS: &str = "write:18M+64M:0xC4A05,report:18M+64M,inflate:32M,write:18M+64M:0xC4A06,\
                     deflate:32M,hint:18M+64M,write:18M+64M:0xC4A08,report:18M+32M,\
                     write:18M+64M:0xC4A07";
const BALLOON: &str = "free_page_reporting=on,free_page_hinting=on";

fn vmm(args: &[&str]) -> vmm_common::Finished {
    client(args)
}

/// `vmm zone inspect --json PATH`, which must succeed.
fn inspect(zone: &str) -> serde_json::Value {
    let run = vmm(&["zone", "inspect", "--json", zone]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    serde_json::from_str(&run.stdout).unwrap()
}

/// Checks the zone's accounting: nothing leaked or lost, every used frame is some VM's, and no
/// crash looked like damage to recovery (nothing repaired, marked lost or found orphaned).
fn assert_consistent(info: &serde_json::Value, what: &str) {
    assert_eq!(info["leaked_frames"], 0, "{what}: {info:#}");
    assert_eq!(info["lost_frames"], 0, "{what}: {info:#}");
    for damage in ["repaired_entries", "damaged_chunks", "orphaned_frames"] {
        assert_eq!(info["recovery"][damage], 0, "{what}: {info:#}");
    }
    for damaged in ["damaged_vms", "damaged_slots"] {
        assert_eq!(info[damaged], serde_json::json!([]), "{what}: {info:#}");
    }
    let owned: u64 = info["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vm| vm["frames"].as_u64().unwrap())
        .sum();
    assert_eq!(
        info["used_frames"].as_u64().unwrap(),
        owned,
        "{what}: {info:#}"
    );
}

fn run_in_zone(zone: &str, workload: &str, balloon: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--zone",
        zone,
        "--vm",
        "crashy",
        "--memory",
        MEMORY,
        "--workload",
        workload,
    ]
    .map(String::from)
    .to_vec();
    if balloon {
        args.extend(["--balloon".into(), BALLOON.into()]);
    }
    args
}

/// What the kills found.
#[derive(Debug, Default)]
struct ZoneTally {
    creation_kills: u32,
    half_created: u32,
    run_kills: u32,
    recoveries_with_leaks: u32,
    leaked_frames: u64,
    lost_frames: u64,
}

/// Kills `vmm zone create` at a random moment; the file then holds the complete zone or none
/// (`inspect` refuses it and `create` lays it out again).
fn crash_creation(rng: &mut Rng, scratch: &Scratch, tally: &mut ZoneTally, window: Duration) {
    let zone = scratch.path("created");
    let _ = std::fs::remove_file(&zone);
    let mut child = Command::new(vmm_binary())
        .args(["zone", "create", &zone, "--size", "256M"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(rng.below(window));
    let _ = child.kill();
    child.wait().unwrap();
    tally.creation_kills += 1;
    let run = vmm(&["zone", "inspect", "--json", &zone]);
    if run.code != Some(0) {
        tally.half_created += 1;
        assert!(
            run.stderr.contains("creation never finished")
                || run.stderr.contains("holds no zone")
                || run.stderr.contains("does not exist"),
            "{run:#?}"
        );
        let again = vmm(&["zone", "create", &zone, "--size", "256M"]);
        assert_eq!(again.code, Some(0), "{again:#?}");
    }
    assert_consistent(&inspect(&zone), "after a creation kill");
}

#[test]
fn sigkill_at_random_moments_loses_and_leaks_no_frame() {
    if !kvm_available("sigkill_at_random_moments_loses_and_leaks_no_frame") {
        return;
    }
    let crashes: u32 = env_value("LLFREE_VMM_CRASHES").unwrap_or(100);
    let mut rng = Rng::from_env(
        "LLFREE_VMM_CRASH_SEED",
        &format!("crash injection: {crashes} kills"),
    );
    let scratch = Scratch::new("zone-crash");
    let zone = scratch.path("zone");
    let created = vmm(&["zone", "create", &zone, "--size", "256M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let setup = VmmRun::run(
        &run_in_zone(&zone, &format!("write:{STABLE}:{STABLE_PATTERN}"), false)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    setup.assert_success();
    // How long one undisturbed chaos run takes: the kills land anywhere in it.
    let chaos = run_in_zone(&zone, CHAOS, true);
    let chaos: Vec<&str> = chaos.iter().map(String::as_str).collect();
    let started = Instant::now();
    VmmRun::run(&chaos).assert_success();
    let window = started.elapsed();
    let creation_window = {
        let started = Instant::now();
        let path = scratch.path("timed");
        assert_eq!(
            vmm(&["zone", "create", &path, "--size", "256M"]).code,
            Some(0)
        );
        // Some kills land after the end.
        started.elapsed() * 3 / 2
    };
    eprintln!("a chaos run takes {window:?}, a zone creation {creation_window:?}");
    let verify = run_in_zone(&zone, &format!("verify:{STABLE}:{STABLE_PATTERN}"), false);
    let verify: Vec<&str> = verify.iter().map(String::as_str).collect();
    let mut tally = ZoneTally::default();
    for kill in 0..crashes {
        if kill % 10 == 9 {
            crash_creation(&mut rng, &scratch, &mut tally, creation_window);
            continue;
        }
        let run = VmmRun::start(&chaos);
        std::thread::sleep(rng.below(window));
        run.kill();
        tally.run_kills += 1;
        let info = inspect(&zone);
        let freed = info["recovery"]["freed_leaked_frames"].as_u64().unwrap();
        let took_back = info["recovery"]["took_back_lost_frames"].as_u64().unwrap();
        tally.recoveries_with_leaks += u32::from(freed + took_back > 0);
        tally.leaked_frames += freed;
        tally.lost_frames += took_back;
        assert_consistent(&info, &format!("kill {kill}"));
        VmmRun::run(&verify).assert_success();
        if kill % 10 == 8 {
            progress(
                "sigkill_at_random_moments_loses_and_leaks_no_frame",
                format_args!("{} of {crashes} kills, nothing lost so far", kill + 1),
            );
        }
    }
    eprintln!("crash injection: {tally:?}");
    assert_consistent(&inspect(&zone), "at the end");
}

#[test]
fn the_guest_finds_its_ram_as_it_was_at_the_kill() {
    if !kvm_available("the_guest_finds_its_ram_as_it_was_at_the_kill") {
        return;
    }
    let scratch = Scratch::new("zone-checkpoint");
    let zone = scratch.path("zone");
    let socket = scratch.path("api.sock");
    assert_eq!(
        vmm(&["zone", "create", &zone, "--size", "128M"]).code,
        Some(0)
    );
    let args = [
        "--zone", &zone, "--vm", "vm", "--memory", "64M", "--vcpus", "2",
    ];
    let mut paused = args.to_vec();
    paused.extend(["--workload", "write:all:0xFEED,checkpoint:1"]);
    let (vmm_run, _api) = VmmRun::start_paused(&paused, &socket);
    let killed = vmm_run.kill();
    assert_eq!(killed.code, None, "SIGKILL: {killed:#?}");
    let info = inspect(&zone);
    assert_eq!(info["recovery"]["kind"], "crash", "{info:#}");
    assert_consistent(&info, "after the kill");
    assert_eq!(info["id"].as_str().map(str::len), Some(32), "{info:#}");
    assert_eq!(
        info["vms"][0]["id"].as_str().map(str::len),
        Some(16),
        "{info:#}"
    );
    assert_eq!(info["vms"][0]["frames"], 32, "{info:#}");
    let mut verify = args.to_vec();
    verify.extend(["--workload", "verify:all:0xFEED"]);
    VmmRun::run(&verify).assert_success();
    // A wrong pattern fails: the check is real.
    let mut wrong = args.to_vec();
    wrong.extend(["--workload", "verify:all:0xFEEE"]);
    assert_eq!(VmmRun::run(&wrong).code, Some(1));
    // Deleting the VM gives every frame back; a VM of that name starts from zero.
    let deleted = vmm(&["zone", "delete-vm", &zone, "vm"]);
    assert_eq!(deleted.code, Some(0), "{deleted:#?}");
    assert_eq!(inspect(&zone)["used_frames"], 0);
    let mut zero = args.to_vec();
    zero.extend(["--workload", "verify-zero:all"]);
    VmmRun::run(&zero).assert_success();
    // gc gives the memory of the free frames back; the zone stays usable.
    let gc = vmm(&["zone", "gc", &zone]);
    assert_eq!(gc.code, Some(0), "{gc:#?}");
    assert!(gc.stdout.contains("released the memory of"), "{gc:#?}");
    assert_consistent(&inspect(&zone), "after gc");
    // Nonsense is refused with one line and the usage status.
    let missing = scratch.path("missing");
    let run = vmm(&["zone", "inspect", &missing]);
    run.assert_fails(2, "does not exist (create it with `vmm zone create`)");
    let run = vmm(&["zone", "create", &zone, "--size", "128M"]);
    run.assert_fails(2, "already holds a zone");
    let run = vmm(&["zone", "delete-vm", &zone, "nobody"]);
    run.assert_fails(2, "holds no VM named 'nobody'");
}
