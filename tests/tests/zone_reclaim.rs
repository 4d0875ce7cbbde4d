//! End-to-end: a zone that runs low reclaims memory from its VMs by policy, before anyone waits
//! for long. VM "idle" (64 MiB, every page written, a balloon with statistics) and VM "hungry"
//! (48 MiB, writing all of it) share a zone of 96 MiB: together they need 112 MiB. When the
//! zone runs dry, idle's VMM inflates its balloon by its share of the deficit, its guest gives
//! the pages, and hungry finishes; once the zone has memory again (hungry deleted), the balloon
//! deflates. With the policy off (`--reclaim-below 0`), hungry's bounded wait ends it with
//! status 8 instead.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::{Duration, Instant};

use e2e_tests::kvm_available;
use vmm_common::{client, get, Scratch, VmmRun};

/// The idle guest writes all of its RAM, then follows its balloon's target, answering
/// statistics requests, until it is shut down.
const IDLE: &str = "write:all,balloon-target*50000000";

/// Starts VM `name` of `memory` (e.g. "64M") in `zone` with the idle workload, a balloon with
/// statistics and the reclaim flags `policy`, its API on `socket`; returns once its guest wrote
/// all its memory.
fn start_idle(
    zone: &str,
    socket: &str,
    name: &str,
    memory: &str,
    policy: &[&str],
) -> (VmmRun, vmm_cli::ApiClient) {
    let mut args = vec![
        "--zone",
        zone,
        "--vm",
        name,
        "--memory",
        memory,
        "--balloon",
        "size=0,stats_polling_interval_s=1",
        "--workload",
        IDLE,
        "--api-socket",
        socket,
    ];
    args.extend_from_slice(policy);
    let mut idle = VmmRun::start(&args);
    let api = idle.api(socket);
    let bytes = vmm::config::parse_size(memory).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&api, "/memory")["guest"]["populated_bytes"] != bytes {
        assert!(
            Instant::now() < deadline,
            "the idle guest {name} never wrote its memory"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (idle, api)
}

/// A zone of 96 MiB in a new scratch directory `name`, with VM idle running there
/// (`--reclaim-below reclaim`): the scratch (kept for as long as the test runs), the zone, idle's
/// VMM and its API.
fn zone_with_idle(name: &str, reclaim: &str) -> (Scratch, String, VmmRun, vmm_cli::ApiClient) {
    let scratch = Scratch::new(name);
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "96M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let socket = scratch.path("idle.sock");
    let (idle, api) = start_idle(&zone, &socket, "idle", "64M", &["--reclaim-below", reclaim]);
    (scratch, zone, idle, api)
}

/// VM hungry's arguments; its faults wait at most `limit` (`--wait-for-memory=`).
fn hungry_args<'a>(zone: &'a str, limit: &'a str) -> [&'a str; 9] {
    [
        "--zone",
        zone,
        "--vm",
        "hungry",
        "--memory",
        "48M",
        limit,
        "--workload",
        "write:all:0x4E,verify:all:0x4E",
    ]
}

fn run_hungry(zone: &str) -> (vmm_common::Finished, Duration) {
    let started = Instant::now();
    // Room for the policy to act on a slow host: the test asserts that it did, not how fast.
    let run = VmmRun::run(&hungry_args(zone, "--wait-for-memory=60s"));
    (run, started.elapsed())
}

/// `vmm zone inspect --json` of `zone`, which must show no frame leaked or lost.
fn inspect_consistent(zone: &str) -> serde_json::Value {
    let info: serde_json::Value =
        serde_json::from_str(&client(&["zone", "inspect", "--json", zone]).stdout).unwrap();
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0)),
        "{info:#}"
    );
    info
}

fn balloon_mib(api: &vmm_cli::ApiClient) -> u64 {
    get(api, "/balloon")["actual_mib"].as_u64().unwrap()
}

#[test]
fn a_zone_running_low_inflates_the_balloons_of_vms_with_memory_to_spare() {
    if !kvm_available("a_zone_running_low_inflates_the_balloons_of_vms_with_memory_to_spare") {
        return;
    }
    let (_scratch, zone, idle, api) = zone_with_idle("zone-reclaim", "10");

    let (hungry, took) = run_hungry(&zone);
    eprintln!("hungry (48 MiB into a zone with 32 MiB free) finished in {took:?}");
    assert_eq!(hungry.code, Some(0), "{hungry:#?}");
    assert!(hungry.stdout.contains("test guest: done"), "{hungry:#?}");
    let inflated = balloon_mib(&api);
    assert!(inflated >= 16, "the policy inflated {inflated} MiB");
    // GET /memory shows the zone as a sampler needs it, every VM's share included: hungry
    // keeps its frames in the zone after its run, idle runs in this VMM.
    let memory = get(&api, "/memory");
    let shares = &memory["zone"];
    assert_eq!(shares["frames"], 48, "{memory:#}");
    assert!(shares["free_frames"].as_u64().unwrap() < 48, "{memory:#}");
    let vm = |name: &str| {
        shares["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|vm| vm["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no VM {name}: {memory:#}"))
    };
    assert_eq!(vm("idle")["pid"], idle.pid(), "{memory:#}");
    assert!(vm("hungry")["pid"].is_null(), "{memory:#}");
    assert!(vm("hungry")["frames"].as_u64().unwrap() > 0, "{memory:#}");

    // The zone has memory again: the policy gives it back.
    let deleted = client(&["zone", "delete-vm", &zone, "hungry"]);
    assert_eq!(deleted.code, Some(0), "{deleted:#?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while balloon_mib(&api) != 0 {
        assert!(Instant::now() < deadline, "the balloon never deflated");
        std::thread::sleep(Duration::from_millis(50));
    }
    vmm_common::send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    idle.wait(Duration::from_secs(30));
    let info = inspect_consistent(&zone);
    // The policy's thread ended with the run: the VMM left the zone cleanly.
    assert_eq!(info["recovery"]["kind"], "clean", "{info:#}");
}

#[test]
fn with_the_policy_off_a_vm_that_waits_too_long_ends_with_status_8() {
    if !kvm_available("with_the_policy_off_a_vm_that_waits_too_long_ends_with_status_8") {
        return;
    }
    let (_scratch, zone, idle, api) = zone_with_idle("zone-no-reclaim", "0");
    let started = Instant::now();
    let hungry = VmmRun::start(&hungry_args(&zone, "--wait-for-memory=5s"));
    // The zone tells who waits, since when and for how much.
    let waiting = loop {
        let run = client(&["zone", "inspect", "--json", &zone]);
        let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        let vms = info["vms"].as_array().unwrap().clone();
        if let Some(waiting) = vms
            .iter()
            .find(|vm| vm["name"] == "hungry" && !vm["waiting"].is_null())
        {
            break waiting["waiting"].clone();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{info:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(waiting["bytes"], 2 << 20, "{waiting:#}");
    assert!(
        waiting["for_seconds"].as_f64().unwrap() < 5.0,
        "{waiting:#}"
    );
    let hungry = hungry.wait(Duration::from_secs(60));
    let took = started.elapsed();
    assert_eq!(hungry.code, Some(8), "{hungry:#?}");
    assert!(
        hungry
            .stderr
            .contains(&format!("zone {zone} of 96 MiB, 0 bytes free")),
        "{hungry:#?}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert_eq!(balloon_mib(&api), 0, "a VM that opted out was left alone");
    vmm_common::send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    idle.wait(Duration::from_secs(30));
}

/// Three idle 48 MiB VMs and a hungry one on a 160 MiB zone: "heavy" (weight 300) gives more
/// of the deficit than "plain" (weight 100), and "floored" (weight 1000, but a floor of 44
/// MiB) never more than its 4 MiB above its floor; the hungry VM finishes.
#[test]
fn weights_share_the_deficit_and_a_floor_bounds_what_a_vm_gives() {
    if !kvm_available("weights_share_the_deficit_and_a_floor_bounds_what_a_vm_gives") {
        return;
    }
    let scratch = Scratch::new("zone-reclaim-weights");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "160M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let idle: Vec<(VmmRun, vmm_cli::ApiClient)> = [
        ("heavy", &["--reclaim-weight", "300"][..]),
        ("plain", &[][..]),
        (
            "floored",
            &["--reclaim-weight", "1000", "--reclaim-floor", "44M"][..],
        ),
    ]
    .into_iter()
    .map(|(name, policy)| {
        let socket = scratch.path(&format!("{name}.sock"));
        start_idle(&zone, &socket, name, "48M", policy)
    })
    .collect();

    let (hungry, took) = run_hungry(&zone);
    eprintln!("hungry (48 MiB into a zone with 16 MiB free) finished in {took:?}");
    assert_eq!(hungry.code, Some(0), "{hungry:#?}");
    let [heavy, plain, floored] = [0, 1, 2].map(|i| balloon_mib(&idle[i].1));
    eprintln!("balloons: heavy {heavy} MiB, plain {plain} MiB, floored {floored} MiB");
    assert!(heavy > plain, "heavy {heavy} MiB, plain {plain} MiB");
    assert!(floored <= 4, "floored gave {floored} MiB");
    for (vmm, api) in idle {
        vmm_common::send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
        vmm.wait(Duration::from_secs(30));
    }
    inspect_consistent(&zone);
}

#[test]
fn a_floor_above_the_vm_s_memory_is_refused() {
    let run = VmmRun::run(&["--memory", "32M", "--reclaim-floor", "64M"]);
    run.assert_fails(
        2,
        "--reclaim-floor 64 MiB: more than the VM's memory (32 MiB)",
    );
}

/// Chunks of 2 MiB in a test VM's workload area (2 MiB to 64 MiB).
const CHUNKS: u64 = 31;

/// A random workload of phases that write and free (report) chunk ranges of a 64 MiB guest,
/// ending with the verification of every chunk: its last pattern, or zeroes where it was
/// reported free last (or never written).
fn random_workload(rng: &mut e2e_tests::Rng, vm: u64) -> String {
    let mut state = [None; CHUNKS as usize];
    let mut steps = Vec::new();
    for phase in 0..6 {
        let first = rng.next_u64() % CHUNKS;
        let count = 1 + rng.next_u64() % (CHUNKS - first);
        let range = format!("{}M+{}M", 2 + 2 * first, 2 * count);
        let chunks = first as usize..(first + count) as usize;
        if rng.next_u64().is_multiple_of(3) {
            steps.push(format!("report:{range}"));
            state[chunks].iter_mut().for_each(|s| *s = None);
        } else {
            let pattern = 0x5EED_0000 + vm * 16 + phase;
            steps.push(format!("write:{range}:{pattern:#x}"));
            state[chunks].iter_mut().for_each(|s| *s = Some(pattern));
        }
    }
    for (chunk, last) in state.iter().enumerate() {
        let range = format!("{}M+2M", 2 + 2 * chunk);
        steps.push(match last {
            Some(pattern) => format!("verify:{range}:{pattern:#x}"),
            None => format!("verify-zero:{range}"),
        });
    }
    steps.join(",")
}

/// Four VMs of 64 MiB in a zone of 128 MiB, each in random phases of writing and freeing (free
/// page reporting), all at once: every VM finishes with its memory verified, or ends cleanly
/// with status 8 after waiting too long (its frames go back: it is ephemeral; the limits are
/// staggered, so the last VM always fits), and the zone has lost and leaked nothing. `LLFREE_VMM_RECLAIM_SEED` repeats a run.
#[test]
fn vms_writing_and_freeing_at_random_on_an_undersized_zone_finish_or_fail_cleanly() {
    if !kvm_available(
        "vms_writing_and_freeing_at_random_on_an_undersized_zone_finish_or_fail_cleanly",
    ) {
        return;
    }
    let mut rng = e2e_tests::Rng::from_env("LLFREE_VMM_RECLAIM_SEED", "4 VMs on a 128 MiB zone");
    let scratch = Scratch::new("zone-random");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "128M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let vms: Vec<(String, VmmRun)> = (0..4)
        .map(|vm| {
            let workload = random_workload(&mut rng, vm);
            let name = format!("vm{vm}");
            // Staggered: when all wait at once, the first to give up frees its frames for the
            // others, and the last one always fits.
            let limit = format!("--wait-for-memory={}s", 3 + 4 * vm);
            let run = VmmRun::start(&[
                "--zone",
                &zone,
                "--vm",
                &name,
                "--ephemeral",
                "--memory",
                "64M",
                "--balloon",
                "free_page_reporting=on",
                &limit,
                "--workload",
                &workload,
            ]);
            (workload, run)
        })
        .collect();
    let mut finished = 0;
    for (workload, run) in vms {
        let run = run.wait(Duration::from_secs(120));
        match run.code {
            Some(0) => {
                assert!(
                    run.stdout.contains("test guest: done"),
                    "{workload}: {run:#?}"
                );
                finished += 1;
            }
            Some(8) => assert!(
                run.stderr.contains("longer than --wait-for-memory allows"),
                "{workload}: {run:#?}"
            ),
            _ => panic!("{workload}: {run:#?}"),
        }
    }
    eprintln!("{finished} of 4 VMs finished, the others waited too long");
    assert!(finished >= 1, "the last VM always fits");
    let info = inspect_consistent(&zone);
    assert_eq!(
        info["free_frames"], info["frames"],
        "ephemeral VMs left frames: {info:#}"
    );
}
