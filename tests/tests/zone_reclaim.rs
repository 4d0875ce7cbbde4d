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

fn start_idle(zone: &str, socket: &str, reclaim: &str) -> (VmmRun, vmm_cli::ApiClient) {
    let mut idle = VmmRun::start(&[
        "--zone",
        zone,
        "--vm",
        "idle",
        "--memory",
        "64M",
        "--balloon",
        "size=0,stats_polling_interval_s=1",
        "--reclaim-below",
        reclaim,
        "--workload",
        IDLE,
        "--api-socket",
        socket,
    ]);
    let api = idle.api(socket);
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&api, "/memory")["pool"]["free_bytes"] != 32 << 20 {
        assert!(
            Instant::now() < deadline,
            "the idle guest never wrote its memory"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (idle, api)
}

fn hungry_args(zone: &str) -> [&str; 9] {
    [
        "--zone",
        zone,
        "--vm",
        "hungry",
        "--memory",
        "48M",
        "--wait-for-memory=5s",
        "--workload",
        "write:all:0x4E,verify:all:0x4E",
    ]
}

fn run_hungry(zone: &str) -> (vmm_common::Finished, Duration) {
    let started = Instant::now();
    let run = VmmRun::run(&hungry_args(zone));
    (run, started.elapsed())
}

fn balloon_mib(api: &vmm_cli::ApiClient) -> u64 {
    get(api, "/balloon")["actual_mib"].as_u64().unwrap()
}

#[test]
fn a_zone_running_low_inflates_the_balloons_of_vms_with_memory_to_spare() {
    if !kvm_available("a_zone_running_low_inflates_the_balloons_of_vms_with_memory_to_spare") {
        return;
    }
    let scratch = Scratch::new("zone-reclaim");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "96M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let socket = scratch.path("idle.sock");
    let (idle, api) = start_idle(&zone, &socket, "10");

    let (hungry, took) = run_hungry(&zone);
    eprintln!("hungry (48 MiB into a zone with 32 MiB free) finished in {took:?}");
    assert_eq!(hungry.code, Some(0), "{hungry:#?}");
    assert!(hungry.stdout.contains("test guest: done"), "{hungry:#?}");
    let inflated = balloon_mib(&api);
    assert!(inflated >= 16, "the policy inflated {inflated} MiB");

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
    let info: serde_json::Value =
        serde_json::from_str(&client(&["zone", "inspect", "--json", &zone]).stdout).unwrap();
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0)),
        "{info:#}"
    );
}

#[test]
fn with_the_policy_off_a_vm_that_waits_too_long_ends_with_status_8() {
    if !kvm_available("with_the_policy_off_a_vm_that_waits_too_long_ends_with_status_8") {
        return;
    }
    let scratch = Scratch::new("zone-no-reclaim");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "96M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let socket = scratch.path("idle.sock");
    let (idle, api) = start_idle(&zone, &socket, "0");
    let started = Instant::now();
    let hungry = VmmRun::start(&hungry_args(&zone));
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
