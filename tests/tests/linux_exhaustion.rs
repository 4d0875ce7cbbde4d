//! End-to-end: a real Linux guest that runs its zone dry. Linux touches most of its memory with
//! interrupts on, so KVM resolves those faults in its asynchronous page fault workers, kernel
//! threads that are no vCPU. With `--wait-for-memory` such a worker waits for a frame; every stop
//! (API Shutdown, SIGTERM, SIGKILL) must still end the VMM and detach its VM from the zone
//! (KVM waits for its workers before it destroys the VM: a worker left waiting once left the
//! VMM in uninterruptible sleep for ever). Without `--wait-for-memory` the run ends with exit
//! status 4, whichever thread faulted. (See linux_common for the guest and where this runs.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::time::{Duration, Instant};

use linux_common::{cmdline, LinuxGuest, BOOT_TIMEOUT};
use vmm_common::{client, get, send, Scratch, VmmRun};

/// The guest (192 MiB) writes 150 MiB into tmpfs: more than the zone has left.
const WRITER: &str = "llfree.test=rounds llfree.rounds=1 llfree.mib=150";
const WRITER_MEMORY: &str = "192M";

/// A zone of 192 MiB in `scratch`, half of it kept by a VM (of the test guest) that wrote all
/// its memory and ended.
fn small_zone(scratch: &Scratch) -> String {
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "192M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    VmmRun::run(&[
        "--zone",
        &zone,
        "--vm",
        "hog",
        "--memory",
        "96M",
        "--workload",
        "write:all",
    ])
    .assert_success();
    zone
}

/// The VM `name` of `zone` as `vmm zone inspect --json` shows it.
fn zone_vm(zone: &str, name: &str) -> serde_json::Value {
    let run = client(&["zone", "inspect", "--json", zone]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    info["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|vm| vm["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no VM {name} in {info:#}"))
}

#[test]
fn a_linux_vmm_whose_kernel_worker_waits_for_memory_ends_on_every_stop() {
    let test = "a_linux_vmm_whose_kernel_worker_waits_for_memory_ends_on_every_stop";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-exhaustion-stop");
    let zone = small_zone(&scratch);
    let writer = cmdline(WRITER);
    for (stop, code) in [("Shutdown", Some(6)), ("TERM", Some(143)), ("KILL", None)] {
        let name = format!("waiting-{stop}");
        let socket = scratch.path(&format!("{stop}.sock"));
        let mut vmm = VmmRun::start(&guest.args(&[
            "--zone",
            &zone,
            "--vm",
            &name,
            "--memory",
            WRITER_MEMORY,
            "--wait-for-memory",
            "--cmdline",
            &writer,
            "--api-socket",
            &socket,
        ]));
        let api = vmm.api(&socket);
        // A kernel worker waits for a frame (a vCPU may wait too).
        let deadline = Instant::now() + 2 * BOOT_TIMEOUT;
        let waiting = loop {
            let memory = get(&api, "/memory");
            if memory["guest"]["waiting_other_faults"].as_u64().unwrap() > 0 {
                break memory["guest"].clone();
            }
            assert!(vmm.running(), "{stop}: the VMM ended before it waited");
            assert!(
                Instant::now() < deadline,
                "{stop}: no kernel worker ever waited for a frame: {memory:#}"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let asked = Instant::now();
        match stop {
            "Shutdown" => send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#),
            signal => vmm.signal(signal),
        }
        // Whatever the host's speed: it ends (a hang fails here).
        let ended = vmm.wait(BOOT_TIMEOUT);
        eprintln!(
            "{test}: {stop} ended the VMM after {:.1?}; waiting then: {} vCPUs, {} faults of \
             kernel workers",
            asked.elapsed(),
            waiting["waiting_vcpus"],
            waiting["waiting_other_faults"]
        );
        assert_eq!(ended.code, code, "{stop}: {ended:#?}");
        // After SIGKILL the kernel tears the VM down once the process is gone: its KVM worker
        // and memory map (which hold the zone's lock) go a moment after it was reaped.
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            let vm = zone_vm(&zone, &name);
            if vm["owner_pid"].is_null() {
                break;
            }
            assert!(Instant::now() < deadline, "{stop}: still attached: {vm:#}");
            std::thread::sleep(Duration::from_millis(200));
        }
        let deleted = client(&["zone", "delete-vm", &zone, &name]);
        assert_eq!(deleted.code, Some(0), "{deleted:#?}");
    }
}

#[test]
fn a_linux_vm_that_runs_its_zone_dry_without_waiting_ends_with_status_4() {
    let test = "a_linux_vm_that_runs_its_zone_dry_without_waiting_ends_with_status_4";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-exhaustion-error");
    let zone = small_zone(&scratch);
    let writer = cmdline(WRITER);
    let vmm = VmmRun::start(&guest.args(&[
        "--zone",
        &zone,
        "--vm",
        "dry",
        "--memory",
        WRITER_MEMORY,
        "--cmdline",
        &writer,
    ]));
    let ended = vmm.wait(2 * BOOT_TIMEOUT);
    assert_eq!(ended.code, Some(4), "{ended:#?}");
    let error = ended
        .stderr
        .lines()
        .find(|line| line.contains("guest memory pool exhausted"))
        .unwrap_or_else(|| panic!("no exhaustion error: {ended:#?}"));
    assert!(error.contains("the VM was stopped"), "{ended:#?}");
    eprintln!("{test}: {error}");
    assert!(zone_vm(&zone, "dry")["owner_pid"].is_null());
}
