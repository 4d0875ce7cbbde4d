//! End-to-end: the built-in test guest drives the virtio-mem device of `vmm run --hotplug`
//! through the API's requested size (`vmm hotplug set`): plugged memory takes frames and holds
//! what the guest writes, unplugged memory gives them back and reaches nothing, a hostile
//! driver's requests get the specification's answers, and a VM in a zone keeps its plugged
//! memory across a restart and a SIGKILL.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::Duration;

use e2e_tests::kvm_available;
use vmm_cli::ApiClient;
use vmm_common::{client, get, send, wait_for_state, zone_consistent, Scratch, VmmRun};

const MIB: u64 = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(120);

/// Bytes of the pool (or zone) in use.
fn pool_used(api: &ApiClient) -> u64 {
    get(api, "/memory")["pool"]["used_bytes"].as_u64().unwrap()
}

fn plugged_mib(api: &ApiClient) -> u64 {
    get(api, "/hotplug/memory")["plugged_size_mib"]
        .as_u64()
        .unwrap()
}

fn request(socket: &str, size: &str) {
    let set = client(&["hotplug", "set", size, "-s", socket]);
    assert_eq!(set.code, Some(0), "{set:#?}");
}

fn resume(api: &ApiClient) {
    send(api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
}

/// Waits until the guest paused at its next checkpoint (a resume shows Running at once).
fn paused(api: &ApiClient) {
    wait_for_state(api, "Paused");
}

#[test]
fn the_guest_plugs_what_is_requested_uses_it_and_unplugging_gives_the_frames_back() {
    let test = "the_guest_plugs_what_is_requested_uses_it_and_unplugging_gives_the_frames_back";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("hotplug-guest");
    let socket = scratch.path("api.sock");
    // 64 MiB of RAM: the hot-pluggable memory lies at 4 GiB.
    let mut run = VmmRun::start(&[
        "--memory",
        "64M",
        "--hotplug",
        "total=256M",
        "--api-socket",
        &socket,
        "--workload",
        "checkpoint:1,hotplug-target,write:4G+64M,verify:4G+64M,checkpoint:2,\
         hotplug-target,verify:4G+32M,checkpoint:3",
    ]);
    let api = run.api(&socket);
    paused(&api);
    let before = pool_used(&api);
    request(&socket, "64M");
    resume(&api);
    paused(&api);
    assert_eq!(plugged_mib(&api), 64);
    let plugged = pool_used(&api);
    assert_eq!(plugged - before, 64 * MIB, "a frame per plugged block");
    request(&socket, "32M");
    resume(&api);
    paused(&api);
    assert_eq!(plugged_mib(&api), 32);
    assert_eq!(
        plugged - pool_used(&api),
        32 * MIB,
        "unplugged frames are back"
    );
    resume(&api);
    let done = run.wait(TIMEOUT);
    assert_eq!(done.code, Some(0), "{done:#?}");
    eprintln!("{test}: {}", done.stdout.lines().last().unwrap_or_default());
}

#[test]
fn a_hostile_driver_gets_the_answers_of_the_spec_and_no_frame_of_unplugged_memory() {
    let test = "a_hostile_driver_gets_the_answers_of_the_spec_and_no_frame_of_unplugged_memory";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("hotplug-hostile");
    let socket = scratch.path("api.sock");
    // Requested 4 MiB: two blocks at 4 GiB. Then: a plug past the requested size (NACK), of a
    // plugged block, unaligned, outside the region, of no block (ERROR); an unplug of an
    // unplugged block (ERROR); an unknown request (ERROR); a state (ACK). Writes to unplugged
    // memory are dropped.
    let mut run = VmmRun::start(&[
        "--memory",
        "64M",
        "--hotplug",
        "total=128M",
        "--api-socket",
        &socket,
        "--workload",
        "checkpoint:1,hotplug-target,\
         hotplug-request:plug:4100M:1:nack,hotplug-request:plug:4G:1:error,\
         hotplug-request:plug:4195328K:1:error,hotplug-request:plug:4G:0:error,\
         hotplug-request:plug:4224M:1:error,hotplug-request:plug:3G:1:error,\
         hotplug-request:unplug:4100M:1:error,hotplug-request:9:4G:1:error,\
         hotplug-request:state:4G:8:ack,write:4G+4M,write:4100M+4M,checkpoint:2,\
         verify:4G+4M",
    ]);
    let api = run.api(&socket);
    paused(&api);
    request(&socket, "4M");
    resume(&api);
    paused(&api);
    assert_eq!(plugged_mib(&api), 4);
    let used = pool_used(&api);
    resume(&api);
    let done = run.wait(TIMEOUT);
    assert_eq!(done.code, Some(0), "{done:#?}");
    assert!(
        done.stderr
            .contains("virtio-mem: the guest wrote to unplugged memory at 0x100400000"),
        "{done:#?}"
    );
    eprintln!("{test}: {} bytes of the pool in use at the end", used);
}

#[test]
fn a_vm_in_a_zone_keeps_its_plugged_memory_across_a_restart_and_a_sigkill() {
    let test = "a_vm_in_a_zone_keeps_its_plugged_memory_across_a_restart_and_a_sigkill";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("hotplug-zone");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "256M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let socket = scratch.path("api.sock");
    let vm = |workload: &str| {
        VmmRun::start(&[
            "--zone",
            &zone,
            "--vm",
            "plugger",
            "--memory",
            "64M",
            "--hotplug",
            "total=128M",
            "--api-socket",
            &socket,
            "--workload",
            workload,
        ])
    };
    // Plug 32 MiB and write it; the VMM ends.
    let mut run = vm("checkpoint:1,hotplug-target,write:4G+32M:7");
    let api = run.api(&socket);
    paused(&api);
    request(&socket, "32M");
    resume(&api);
    assert_eq!(run.wait(TIMEOUT).code, Some(0));
    // A restart finds it plugged (and requested) with what was written; it plugs 16 MiB more
    // and writes it, then is SIGKILLed.
    let mut run = vm(
        "hotplug-target,verify:4G+32M:7,checkpoint:1,hotplug-target,\
                      write:4128M+16M:9,checkpoint:2",
    );
    let api = run.api(&socket);
    paused(&api);
    assert_eq!(plugged_mib(&api), 32);
    request(&socket, "48M");
    resume(&api);
    paused(&api);
    assert_eq!(plugged_mib(&api), 48);
    let killed = run.kill();
    assert_eq!(killed.code, None, "SIGKILLed: {killed:#?}");
    zone_consistent(&zone);
    // After the crash: all 48 MiB are back, with their contents; then everything is
    // unplugged and the zone has the frames back.
    let mut run = vm(
        "hotplug-target,verify:4G+32M:7,verify:4128M+16M:9,checkpoint:1,\
                      hotplug-target,checkpoint:2",
    );
    let api = run.api(&socket);
    paused(&api);
    assert_eq!(plugged_mib(&api), 48);
    let free = zone_consistent(&zone)["free_frames"].as_u64().unwrap();
    request(&socket, "0");
    resume(&api);
    paused(&api);
    assert_eq!(plugged_mib(&api), 0);
    assert_eq!(
        zone_consistent(&zone)["free_frames"].as_u64().unwrap(),
        free + 24
    );
    resume(&api);
    let done = run.wait(TIMEOUT);
    assert_eq!(done.code, Some(0), "{done:#?}");
}

/// `vmm --api-sock SOCKET` waiting for a snapshot, loads `snapshot` with its memory in
/// `memory` (paused), and returns the process and its API.
fn loaded(socket: &str, snapshot: &str, memory: &str) -> (VmmRun, ApiClient) {
    let mut vmm = VmmRun::start_command(&["--api-sock", socket]);
    let api = vmm.api(socket);
    let body = format!(
        r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{memory}"}},"resume_vm":false}}"#
    );
    send(&api, "PUT", "/snapshot/load", &body);
    (vmm, api)
}

#[test]
fn a_snapshot_keeps_the_plugged_memory_copied_or_in_its_zone() {
    let test = "a_snapshot_keeps_the_plugged_memory_copied_or_in_its_zone";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("hotplug-snapshot");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "256M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    // Plug 32 MiB, write it, pause (snapshot); after the load: verify it, unplug half of it
    // as the loaded VM is asked, verify the rest.
    let workload = "checkpoint:1,hotplug-target,write:4G+32M:5,checkpoint:2,verify:4G+32M:5,\
                    hotplug-target,verify:4G+16M:5";
    for (case, place) in [("copied", None), ("in its zone", Some(zone.as_str()))] {
        let socket = scratch.path("api.sock");
        let mut args = vec!["--memory", "64M", "--hotplug", "total=128M"];
        if let Some(zone) = place {
            args.extend(["--zone", zone, "--vm", "snapped"]);
        }
        args.extend(["--api-socket", &socket, "--workload", workload]);
        let mut run = VmmRun::start(&args);
        let api = run.api(&socket);
        paused(&api);
        request(&socket, "32M");
        resume(&api);
        paused(&api);
        let snapshot = scratch.path("vm.snap");
        let memory = place.map_or_else(|| scratch.path("vm.mem"), str::to_owned);
        let body = format!(
            r#"{{"snapshot_type":"Full","snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#
        );
        send(&api, "PUT", "/snapshot/create", &body);
        run.kill();
        let socket = scratch.path("load.sock");
        let (vmm, api) = loaded(&socket, &snapshot, &memory);
        let status = get(&api, "/hotplug/memory");
        assert_eq!(
            (
                status["plugged_size_mib"].as_u64(),
                status["requested_size_mib"].as_u64()
            ),
            (Some(32), Some(32)),
            "{case}: {status:#}"
        );
        assert_eq!(
            get(&api, "/vm/config")["memory-hotplug"]["total_size_mib"],
            128
        );
        request(&socket, "16M");
        resume(&api);
        let done = vmm.wait(TIMEOUT);
        assert_eq!(done.code, Some(0), "{case}: {done:#?}");
        assert!(done.stdout.contains("step 7: ok"), "{case}: {done:#?}");
    }
    zone_consistent(&zone);
}
