//! End-to-end: many `vmm run` processes on one zone. Four VMMs whose RAM together is several
//! times the zone finish their workloads because each reports what it no longer uses (the
//! others' faults wait for it, `--wait-for-memory`), their `--ephemeral` VMs gone with them;
//! and, `LLFREE_VMM_SHARED_KILLS` times
//! (default 100), one of three running VMMs is SIGKILLed at a random moment: the other two
//! finish, a `vmm zone inspect` beside them recovers the dead one's part, and afterwards the zone
//! shows no leaked or lost frame and the killed VM restarts with its memory intact.
//! `LLFREE_VMM_SHARED_SEED=S` repeats a run's random choices (its seed is printed).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::{Duration, Instant};

use e2e_tests::{env_value, kvm_available, progress, Rng};
use vmm_common::{client, Finished, Scratch, VmmRun};

const TIMEOUT: Duration = Duration::from_secs(300);

/// `vmm zone inspect --json ZONE`, which must succeed.
fn inspect(zone: &str) -> serde_json::Value {
    let run = client(&["zone", "inspect", "--json", zone]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    serde_json::from_str(&run.stdout).unwrap()
}

fn create_zone(scratch: &Scratch, size: &str) -> String {
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", size]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    zone
}

#[test]
fn four_vmms_overcommit_one_zone_and_finish_because_they_report() {
    if !kvm_available("four_vmms_overcommit_one_zone") {
        return;
    }
    let scratch = Scratch::new("zone-shared-overcommit");
    // 26 frames of 2 MiB for 4 VMs of 32 MiB: 128 MiB of RAM on a 52 MiB zone. Each holds one
    // frame for itself (the test guest) and writes 12 MiB (6 frames) at a time before reporting
    // it free, touching 30 MiB over its run: they finish only because they report, and some
    // wait for the others' reports (at their peak they want 28 frames). 26 frames are enough
    // that they cannot all wait at once (4 + 4 x 5 < 26).
    let zone = create_zone(&scratch, "52M");
    let ranges = ["2M+12M", "14M+12M", "20M+12M"];
    let workload: Vec<String> = (0..12)
        .flat_map(|round| {
            let range = ranges[round % ranges.len()];
            [format!("write:{range}"), format!("report:{range}")]
        })
        .collect();
    let workload = workload.join(",");
    let workload = workload.as_str();
    let started = Instant::now();
    let vmms: Vec<VmmRun> = (0..4)
        .map(|i| {
            let name = format!("vm{i}");
            VmmRun::start(&[
                "--zone",
                &zone,
                "--vm",
                &name,
                "--memory",
                "32M",
                "--balloon",
                "free_page_reporting=on",
                "--wait-for-memory",
                "--ephemeral",
                "--workload",
                workload,
            ])
        })
        .collect();
    let runs: Vec<Finished> = vmms.into_iter().map(|vmm| vmm.wait(TIMEOUT)).collect();
    for run in &runs {
        assert_eq!(run.code, Some(0), "{run:#?}");
    }
    let waited = runs
        .iter()
        .filter(|run| run.stderr.contains("waits for a frame"))
        .count();
    eprintln!(
        "4 VMMs, 128 MiB of RAM on a 52 MiB zone: all finished in {:?}; {waited} of them waited \
         for frames the others reported",
        started.elapsed()
    );
    let info = inspect(&zone);
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(info["recovery"]["kind"], "clean", "{info:#}");
    // Ephemeral: the VMs went with their VMMs, their frames back in the zone.
    assert_eq!(info["vms"].as_array().map(Vec::len), Some(0), "{info:#}");
    assert_eq!(info["free_frames"], info["frames"], "{info:#}");
}

/// Written first by every VM, verified at its end and after a restart.
const STABLE: &str = "2M+8M";
/// After the stable part: churn that allocates and gives back (free page reporting and
/// hinting).
const CHURN: &str = "write:10M+16M:0xc4,report:10M+16M,write:10M+16M:0xc5,hint:10M+16M,\
                     write:10M+16M:0xc6,report:10M+16M,write:10M+16M:0xc7";

fn vm_args<'a>(zone: &'a str, name: &'a str, workload: &'a str) -> Vec<&'a str> {
    vec![
        "--zone",
        zone,
        "--vm",
        name,
        "--memory",
        "32M",
        "--balloon",
        "free_page_reporting=on,free_page_hinting=on",
        "--workload",
        workload,
    ]
}

#[test]
fn one_of_three_vmms_killed_at_random_is_recovered_and_restarts_intact() {
    if !kvm_available("one_of_three_vmms_killed") {
        return;
    }
    let kills: u32 = env_value("LLFREE_VMM_SHARED_KILLS").unwrap_or(100);
    let mut rng = Rng::from_env("LLFREE_VMM_SHARED_SEED", &format!("{kills} kills"));
    let scratch = Scratch::new("zone-shared-kills");
    let zone = create_zone(&scratch, "128M");
    let started = Instant::now();
    let (mut recovered_beside, mut counter_drift) = (0, 0i64);
    for round in 0..kills {
        let pattern = format!("{:#x}", 0x5000 + round);
        let workload = format!("write:{STABLE}:{pattern},{CHURN},verify:{STABLE}:{pattern}");
        let victim = (rng.next_u64() % 3) as usize;
        let mut vmms: Vec<VmmRun> = (0..3)
            .map(|i| VmmRun::start(&vm_args(&zone, &format!("vm{i}"), &workload)))
            .collect();
        // After its stable part is written: somewhere in the churn (about 300 ms here).
        vmms[victim].wait_for_line("step 1: ok", TIMEOUT);
        std::thread::sleep(Duration::from_micros(rng.next_u64() % 300_000));
        let killed_vmm = vmms.remove(victim);
        let killed = killed_vmm.kill();
        // Beside the survivors (if they still run): the dead one's part is recovered.
        let beside = inspect(&zone);
        let dead = beside["recovery"]["dead_processes"].as_u64().unwrap_or(0);
        if dead == 1 && beside["recovery"]["kind"] == "attached" {
            recovered_beside += 1;
        }
        for survivor in vmms {
            let run = survivor.wait(TIMEOUT);
            assert_eq!(
                run.code,
                Some(0),
                "round {round}: a survivor failed: {run:#?}"
            );
        }
        // Alone now: the whole zone is recovered and cross-checked; the kill looked like no
        // damage.
        let info = inspect(&zone);
        assert_eq!(
            (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
            (Some(0), Some(0)),
            "round {round}: {info:#}"
        );
        for damage in ["repaired_entries", "damaged_chunks", "orphaned_frames"] {
            assert_eq!(info["recovery"][damage], 0, "round {round}: {info:#}");
        }
        counter_drift += info["recovery"]["freed_leaked_frames"]
            .as_i64()
            .unwrap_or(0);
        let owned: u64 = info["vms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|vm| vm["frames"].as_u64().unwrap())
            .sum();
        assert_eq!(
            info["used_frames"].as_u64(),
            Some(owned),
            "round {round}: {info:#}"
        );
        // The killed VM restarts with what it wrote before the kill.
        let name = format!("vm{victim}");
        let verify = format!("verify:{STABLE}:{pattern}");
        let restarted = VmmRun::run(&vm_args(&zone, &name, &verify));
        assert_eq!(
            restarted.code,
            Some(0),
            "round {round}: the killed VM (killed: {killed:?}) lost its memory: {restarted:#?}"
        );
        if round % 5 == 4 {
            progress(
                "one_of_three_vmms_killed_at_random_is_recovered_and_restarts_intact",
                format_args!(
                    "{} of {kills} rounds, every killed VM restarted intact",
                    round + 1
                ),
            );
        }
    }
    eprintln!(
        "{kills} kills in {:?}: the killed VMM was recovered beside the survivors {recovered_beside} \
         times (else they had finished); frames the full recoveries freed: {counter_drift}; no \
         frame lost or leaked, every killed VM restarted intact",
        started.elapsed()
    );
}
