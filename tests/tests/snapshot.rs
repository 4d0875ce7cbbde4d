//! End-to-end: snapshots of test guest VMs. A VM paused at a workload checkpoint is snapshotted
//! (its memory stays in its zone), its VMM is killed, and a new `vmm` process loads the
//! snapshot and finishes the workload, whose later steps verify what the earlier ones wrote;
//! with 2 vCPUs, with a balloon in the middle of an inflation, into a memory file instead of
//! the zone. Damaged, truncated, foreign and mismatched snapshot files are refused, and change
//! nothing: the right snapshot loads afterwards.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::{Duration, Instant};

use e2e_tests::{kvm_available, private_network};
use vmm_cli::ApiClient;
use vmm_common::{
    client, get, send, start_snapshot_load, wait_for_state, Finished, Scratch, VmmRun,
};

/// Writes all of RAM, stops at checkpoint 1, then verifies it.
const WORKLOAD: &str = "write:all:0x5ea1ed,checkpoint:1,verify:all:0x5ea1ed";
const TIMEOUT: Duration = Duration::from_secs(120);

/// A new zone of `size` in `scratch`.
fn zone(scratch: &Scratch, name: &str, size: &str) -> String {
    let path = scratch.path(name);
    let created = client(&["zone", "create", &path, "--size", size]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    path
}

/// `vmm run` of `vm` in `zone` with `args`, paused at its checkpoint.
fn paused_in_zone(zone: &str, vm: &str, socket: &str, args: &[&str]) -> (VmmRun, ApiClient) {
    let mut all = vec!["--zone", zone, "--vm", vm];
    all.extend_from_slice(args);
    VmmRun::start_paused(&all, socket)
}

/// `PUT /snapshot/create` with Firecracker's body.
fn create_snapshot(api: &ApiClient, snapshot: &str, memory: &str) {
    let body = format!(
        r#"{{"snapshot_type":"Full","snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#
    );
    send(api, "PUT", "/snapshot/create", &body);
}

/// The body of `PUT /snapshot/load` for `snapshot` with its memory in `memory`.
fn load_body(snapshot: &str, memory: &str, resume: bool) -> String {
    format!(
        r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{memory}"}},"resume_vm":{resume}}}"#
    )
}

/// A `vmm --api-sock SOCKET` process, waiting for a snapshot, and its API.
fn waiting_vmm(socket: &str) -> (VmmRun, ApiClient) {
    let mut vmm = VmmRun::start_command(&["--api-sock", socket]);
    let api = vmm.api(socket);
    (vmm, api)
}

/// `vmm snapshot load ... --resume` to its end.
fn load_and_run(snapshot: &str, memory: &str) -> Finished {
    start_snapshot_load(snapshot, memory, &[]).wait(TIMEOUT)
}

/// Asserts that the workload's steps after checkpoint 1 ran in this process and passed.
fn assert_finished_after_the_checkpoint(run: &Finished, steps: usize) {
    run.assert_success();
    assert!(
        run.stdout.contains(&format!("step {steps}: ok"))
            && run.stdout.contains("test guest: done"),
        "{run:#?}"
    );
    assert!(
        !run.stdout.contains("step 1: ok"),
        "step 1 ran before: {run:#?}"
    );
}

#[test]
fn a_vm_with_two_vcpus_finishes_its_workload_in_a_new_process_after_its_vmm_was_killed() {
    if !kvm_available("snapshot_two_vcpus") {
        return;
    }
    let scratch = Scratch::new("snapshot-two-vcpus");
    let zone = zone(&scratch, "zone", "256M");
    let (snapshot, socket) = (scratch.path("vm.snap"), scratch.path("api.sock"));
    let args = ["--memory", "96M", "--vcpus", "2", "--workload", WORKLOAD];
    let (vmm, api) = paused_in_zone(&zone, "twins", &socket, &args);
    // A running VM is refused.
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let running = api
        .request(
            "PUT",
            "/snapshot/create",
            Some(&format!(
                r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{zone}"}}"#
            )),
        )
        .unwrap();
    assert_eq!(running.status, 400, "{}", running.body);
    assert!(
        running.body.contains("not paused") || running.body.contains("stopped"),
        "{}",
        running.body
    );
    vmm.wait(TIMEOUT).assert_success();
    let _ = std::fs::remove_file(&socket);
    let (vmm, api) = paused_in_zone(&zone, "twins2", &socket, &args);
    // A VMM with a VM loads no snapshot; the resources take PUT only.
    let load = api
        .request(
            "PUT",
            "/snapshot/load",
            Some(&load_body(&snapshot, &zone, true)),
        )
        .unwrap();
    assert_eq!(load.status, 400, "{}", load.body);
    assert!(load.body.contains("without a VM"), "{}", load.body);
    let get_create = api.request("GET", "/snapshot/create", None).unwrap();
    assert_eq!(get_create.status, 400, "{}", get_create.body);
    create_snapshot(&api, &snapshot, &zone);
    let killed = vmm.kill();
    assert_eq!(killed.code, None, "SIGKILL: {killed:#?}");
    let _ = std::fs::remove_file(&socket);

    // Firecracker's way: a fresh VMM waits on its socket, a client loads and resumes.
    let (waiting, api) = waiting_vmm(&socket);
    let none = api.request("GET", "/machine", None).unwrap();
    assert_eq!(none.status, 400, "no VM yet: {}", none.body);
    // Firecracker's instance info and version.
    let instance = get(&api, "/");
    assert_eq!(
        (instance["state"].as_str(), instance["id"].as_str()),
        (Some("Not started"), Some("anonymous-instance")),
        "{instance:#}"
    );
    assert!(get(&api, "/version")["firecracker_version"].is_string());
    let started = Instant::now();
    send(
        &api,
        "PUT",
        "/snapshot/load",
        &load_body(&snapshot, &zone, true),
    );
    let loaded = started.elapsed();
    let run = waiting.wait(TIMEOUT);
    assert_finished_after_the_checkpoint(&run, 3);
    eprintln!("loaded and resumed in {loaded:?} (as the client saw it)");

    // The guest ran on: the memory is no longer the snapshot's.
    let again = load_and_run(&snapshot, &zone);
    again.assert_fails(2, "changed since the snapshot was taken");
}

#[test]
fn a_loaded_vm_waits_paused_for_its_resume_and_the_cli_takes_and_loads_snapshots() {
    if !kvm_available("snapshot_paused_load") {
        return;
    }
    let scratch = Scratch::new("snapshot-paused-load");
    let zone = zone(&scratch, "zone", "128M");
    let (snapshot, socket) = (scratch.path("vm.snap"), scratch.path("api.sock"));
    let args = ["--memory", "32M", "--workload", WORKLOAD];
    let (vmm, api) = paused_in_zone(&zone, "cli", &socket, &args);
    let machine = get(&api, "/machine");
    let created = client(&[
        "snapshot",
        "create",
        "--socket",
        &socket,
        "--snapshot-path",
        &snapshot,
        "--mem-file-path",
        &zone,
    ]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    // It says which kind of snapshot it made.
    assert!(
        created.stdout.contains(&format!(
            "zero-copy: the guest memory stays in zone {zone} (sealed until the VM runs again)"
        )),
        "{created:#?}"
    );
    drop(api);
    vmm.kill();
    let _ = std::fs::remove_file(&socket);

    let mut loaded = VmmRun::start_command(&[
        "snapshot",
        "load",
        "--snapshot-path",
        &snapshot,
        "--mem-file-path",
        &zone,
        "--api-socket",
        &socket,
    ]);
    let api = loaded.api(&socket);
    wait_for_state(&api, "Paused");
    let restored = get(&api, "/machine");
    assert_eq!(get(&api, "/")["state"], "Paused");
    assert_eq!(get(&api, "/")["id"], "cli", "a VM in a zone is its name");
    assert_eq!(restored["vcpu_count"], machine["vcpu_count"]);
    assert_eq!(restored["mem_size_mib"], machine["mem_size_mib"]);
    assert_eq!(restored["zone_vm"], "cli");
    // Loading twice into one VMM is refused.
    let twice = api
        .request(
            "PUT",
            "/snapshot/load",
            Some(&load_body(&snapshot, &zone, true)),
        )
        .unwrap();
    assert_eq!(twice.status, 400, "{}", twice.body);
    let resumed = client(&["resume", "--socket", &socket]);
    assert_eq!(resumed.code, Some(0), "{resumed:#?}");
    let run = loaded.wait(TIMEOUT);
    // It said that the VM waits paused, and how to resume it.
    let note = format!("paused after the load; resume with `vmm resume --socket {socket}`");
    assert!(run.stderr.contains(&note), "{run:#?}");
    assert_finished_after_the_checkpoint(&run, 3);
}

#[test]
fn a_balloon_in_the_middle_of_an_inflation_goes_on_after_the_restore() {
    if !kvm_available("snapshot_mid_inflation") {
        return;
    }
    let scratch = Scratch::new("snapshot-mid-inflation");
    let zone = zone(&scratch, "zone", "512M");
    let (snapshot, socket) = (scratch.path("vm.snap"), scratch.path("api.sock"));
    let workload = "write:all:0xba11,inflate:192M,verify:2M+32M:0xba11,deflate:96M";
    let args = [
        "--zone",
        &zone,
        "--vm",
        "ballooned",
        "--memory",
        "256M",
        "--balloon",
        "size=0",
        "--workload",
        workload,
        "--api-socket",
        &socket,
    ];
    // The inflation takes about half a second: pause while it is under way (a few tries, in
    // case the host is too slow to see it).
    let (vmm, api, inflated) = (0..5)
        .find_map(|_| {
            let _ = std::fs::remove_file(&socket);
            let mut vmm = VmmRun::start(&args);
            let api = vmm.api(&socket);
            let deadline = Instant::now() + TIMEOUT;
            while Instant::now() < deadline {
                let actual = get(&api, "/balloon")["actual_mib"].as_u64().unwrap();
                if actual >= 192 {
                    break;
                }
                if actual > 0 {
                    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
                    let actual = get(&api, "/balloon")["actual_mib"].as_u64().unwrap();
                    if actual < 192 {
                        return Some((vmm, api, actual));
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            vmm.kill();
            None
        })
        .expect("the inflation was never caught under way");
    eprintln!("paused with {inflated} MiB in the balloon");
    // The vCPUs are paused, but the balloon device may still be taking the pages of a request
    // the guest made just before: wait until what is given away stops changing.
    let mut memory = get(&api, "/memory");
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let again = get(&api, "/memory");
        if again["guest"]["given_away_4k_pages"] == memory["guest"]["given_away_4k_pages"] {
            break;
        }
        memory = again;
    }
    create_snapshot(&api, &snapshot, &zone);
    vmm.kill();
    let _ = std::fs::remove_file(&socket);

    let (waiting, api) = waiting_vmm(&socket);
    send(
        &api,
        "PUT",
        "/snapshot/load",
        &load_body(&snapshot, &zone, false),
    );
    let balloon = get(&api, "/balloon");
    assert_eq!(balloon["actual_mib"], inflated, "{balloon:#}");
    let restored = get(&api, "/memory");
    let given_away = memory["guest"]["given_away_4k_pages"].as_u64().unwrap();
    assert!(given_away > 0, "{memory:#}");
    assert_eq!(
        restored["guest"]["given_away_4k_pages"].as_u64(),
        Some(given_away),
        "the balloon's pages are still given away"
    );
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let run = waiting.wait(TIMEOUT);
    assert!(run.stdout.contains("step 4: ok"), "{run:#?}");
    run.assert_success();

    let info = client(&["zone", "inspect", "--json", &zone]);
    let info: serde_json::Value = serde_json::from_str(&info.stdout).unwrap();
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0))
    );
}

#[test]
fn a_snapshot_into_a_memory_file_copies_guest_memory_and_loads_many_times_at_once_by_mapping_it() {
    if !kvm_available("snapshot_memory_file") {
        return;
    }
    let scratch = Scratch::new("snapshot-memory-file");
    let (snapshot, memory, socket) = (
        scratch.path("vm.snap"),
        scratch.path("vm.mem"),
        scratch.path("api.sock"),
    );
    let args = ["--memory", "32M", "--vcpus", "2", "--workload", WORKLOAD];
    let (vmm, api) = VmmRun::start_paused(&args, &socket);
    // Guest memory is never copied over a zone (or a pool or snapshot file).
    let zone = zone(&scratch, "zone", "64M");
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{zone}"}}"#);
    let refused = api.request("PUT", "/snapshot/create", Some(&body)).unwrap();
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.body.contains("holds a zone"), "{}", refused.body);
    assert_eq!(
        client(&["zone", "inspect", &zone]).code,
        Some(0),
        "the zone is intact"
    );
    create_snapshot(&api, &snapshot, &memory);
    vmm.kill();
    // The memory, then a trailer of 4 KiB with the snapshot's identity.
    assert_eq!(std::fs::metadata(&memory).unwrap().len(), (32 << 20) + 4096);
    assert_finished_after_the_checkpoint(&load_and_run(&snapshot, &memory), 3);
    // The copy can be loaded again, by many VMMs at once: each maps the file privately, so
    // that their guests share its pages until they write, and the file never changes.
    let before = std::fs::read(&memory).unwrap();
    let clones: Vec<VmmRun> = (0..4)
        .map(|_| start_snapshot_load(&snapshot, &memory, &[]))
        .collect();
    for clone in clones {
        assert_finished_after_the_checkpoint(&clone.wait(TIMEOUT), 3);
    }
    assert!(
        std::fs::read(&memory).unwrap() == before,
        "a clone changed the memory file"
    );
    let short = scratch.path("short.mem");
    std::fs::write(&short, vec![0u8; 1 << 20]).unwrap();
    load_and_run(&snapshot, &short).assert_fails(2, "memory file of 1048576 bytes");
    // Another snapshot's memory file of the same size is refused: the guest would run on
    // memory that is not its own.
    let (other_snapshot, other_memory, other_socket) = (
        scratch.path("other.snap"),
        scratch.path("other.mem"),
        scratch.path("other.sock"),
    );
    let (other, api) = VmmRun::start_paused(&args, &other_socket);
    create_snapshot(&api, &other_snapshot, &other_memory);
    other.kill();
    load_and_run(&snapshot, &other_memory)
        .assert_fails(2, "this memory file belongs to another snapshot");
    // A memory file changed since is refused by its checksum, before the guest runs, where
    // the load is asked to verify it (a load maps the file and reads nothing otherwise, as
    // Firecracker's does).
    let mut bytes = std::fs::read(&memory).unwrap();
    bytes[5 << 20] ^= 0x40;
    std::fs::write(&memory, &bytes).unwrap();
    let damaged = start_snapshot_load(&snapshot, &memory, &["--verify-memory"]).wait(TIMEOUT);
    assert_eq!(damaged.code, Some(2), "{damaged:#?}");
    assert!(
        damaged.stderr.contains("the memory's checksum is"),
        "{damaged:#?}"
    );
    assert!(
        !damaged.stdout.contains("step"),
        "the guest ran: {damaged:#?}"
    );
}

/// Firecracker's `clock_realtime`: where the snapshot's host gave the real time with its
/// kvmclock, the load advances the clock by the time since and the guest runs on; where it gave
/// none (this project's PVM host), the load is refused with the reason, as Firecracker refuses
/// it, and a load without it runs.
#[test]
fn clock_realtime_advances_the_clock_or_is_refused_where_the_host_gives_no_real_time() {
    if !kvm_available("snapshot_clock_realtime") {
        return;
    }
    let scratch = Scratch::new("snapshot-clock-realtime");
    let (snapshot, memory, socket) = (
        scratch.path("vm.snap"),
        scratch.path("vm.mem"),
        scratch.path("api.sock"),
    );
    let (vmm, api) = VmmRun::start_paused(&["--memory", "32M", "--workload", WORKLOAD], &socket);
    create_snapshot(&api, &snapshot, &memory);
    vmm.kill();
    let (mut waiting, api) = waiting_vmm(&scratch.path("load.sock"));
    let body = format!(
        r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{memory}"}},"resume_vm":true,"clock_realtime":true}}"#
    );
    let answer = api.request("PUT", "/snapshot/load", Some(&body)).unwrap();
    match answer.status {
        204 => assert_finished_after_the_checkpoint(&waiting.wait(TIMEOUT), 3),
        400 => {
            assert!(
                answer
                    .body
                    .contains("clock_realtime: the snapshot's kvmclock holds no real time"),
                "{}",
                answer.body
            );
            assert!(waiting.running(), "a refused load ends nothing");
            assert_finished_after_the_checkpoint(&load_and_run(&snapshot, &memory), 3);
        }
        status => panic!("{status}: {}", answer.body),
    }
}

#[test]
fn ram_of_an_odd_number_of_mib_is_snapshotted_and_loads_from_a_copy_and_from_its_zone() {
    if !kvm_available("snapshot_odd_memory_size") {
        return;
    }
    let scratch = Scratch::new("snapshot-odd-memory");
    // 33 MiB: the guest writes all of it (its memory map says 33 MiB), the host backs 34.
    let args = ["--memory", "33M", "--workload", WORKLOAD];
    let mut backings = vec![("anon", None)];
    // On a 1 GiB frame the copy keeps 34 MiB too, and loads on 2 MiB frames.
    match guest_mem::testing::HugePageReservation::reserve(1_048_576, 1) {
        Ok(pages) => backings.push(("hugetlb-1g", Some(pages))),
        Err(why) => eprintln!("SKIP: snapshot_odd_memory_size on hugetlb-1g: {why}"),
    }
    for (backing, _pages) in &backings {
        let (snapshot, memory, socket) = (
            scratch.path(&format!("{backing}.snap")),
            scratch.path(&format!("{backing}.mem")),
            scratch.path(&format!("{backing}.sock")),
        );
        let (vmm, api) =
            VmmRun::start_paused(&[&args[..], &["--backing", backing]].concat(), &socket);
        assert_eq!(get(&api, "/machine-config")["mem_size_mib"], 33);
        create_snapshot(&api, &snapshot, &memory);
        vmm.kill();
        assert_eq!(
            std::fs::metadata(&memory).unwrap().len(),
            (34 << 20) + 4096,
            "{backing}: RAM rounded up to 2 MiB, then the trailer"
        );
        let loaded = start_snapshot_load(&snapshot, &memory, &["--verify-memory"]).wait(TIMEOUT);
        assert_finished_after_the_checkpoint(&loaded, 3);
    }
    let zone = zone(&scratch, "zone", "64M");
    let socket = scratch.path("zone.sock");
    let snapshot = scratch.path("zone.snap");
    let (vmm, api) = paused_in_zone(&zone, "odd", &socket, &args);
    create_snapshot(&api, &snapshot, &zone);
    vmm.kill();
    assert_finished_after_the_checkpoint(&load_and_run(&snapshot, &zone), 3);
}

#[test]
fn devices_come_back_as_the_api_last_set_them_on_the_tap_network_overrides_name() {
    let test = "devices_come_back_as_the_api_last_set_them_on_the_tap_network_overrides_name";
    if !kvm_available(test) || !private_network(test, &["tap0", "tap1"]) {
        return;
    }
    let scratch = Scratch::new("snapshot-net");
    let zone = zone(&scratch, "zone", "128M");
    let (snapshot, socket) = (scratch.path("vm.snap"), scratch.path("api.sock"));
    let (first, second) = (scratch.path("first.img"), scratch.path("second.img"));
    std::fs::write(&first, vec![1u8; 1 << 20]).unwrap();
    std::fs::write(&second, vec![2u8; 2 << 20]).unwrap();
    let drive = format!("id=data,path={first},ro=on");
    let args = [
        "--memory",
        "32M",
        "--workload",
        WORKLOAD,
        "--net",
        "tap=tap0,mac=06:00:00:00:00:09",
        "--drive",
        &drive,
        "--pmem",
        "4M",
    ];
    let (vmm, api) = paused_in_zone(&zone, "net", &socket, &args);
    // The API gives the drive another image and the devices rate limiters: the snapshot keeps
    // what it set last.
    let limiter = serde_json::json!({"bandwidth": null,
        "ops": {"size": 100, "one_time_burst": null, "refill_time": 1000}});
    let patch = serde_json::json!({"drive_id": "data", "path_on_host": second,
                                   "rate_limiter": limiter});
    send(&api, "PATCH", "/drives/data", &patch.to_string());
    let patch = serde_json::json!({"iface_id": "eth0", "tx_rate_limiter": limiter});
    send(
        &api,
        "PATCH",
        "/network-interfaces/eth0",
        &patch.to_string(),
    );
    let patch = serde_json::json!({"id": "pmem0", "rate_limiter": limiter});
    send(&api, "PATCH", "/pmem/pmem0", &patch.to_string());
    create_snapshot(&api, &snapshot, &zone);
    vmm.kill();
    let _ = std::fs::remove_file(&socket);
    let (waiting, api) = waiting_vmm(&socket);
    let load = |overrides: &str| {
        format!(
            r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{zone}"}},"network_overrides":{overrides}}}"#
        )
    };
    // An interface the VM does not have is refused, and the snapshot stays loadable.
    let unknown = api
        .request(
            "PUT",
            "/snapshot/load",
            Some(&load(r#"[{"iface_id":"eth9","host_dev_name":"tap1"}]"#)),
        )
        .unwrap();
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    assert!(
        unknown.body.contains("no interface eth9"),
        "{}",
        unknown.body
    );
    send(
        &api,
        "PUT",
        "/snapshot/load",
        &load(r#"[{"iface_id":"eth0","host_dev_name":"tap1"}]"#),
    );
    let config = get(&api, "/vm/config");
    assert_eq!(
        config["network-interfaces"],
        serde_json::json!([{"iface_id": "eth0", "host_dev_name": "tap1",
                            "guest_mac": "06:00:00:00:00:09", "tx_rate_limiter": limiter}])
    );
    assert_eq!(
        config["drives"][0]["path_on_host"],
        serde_json::json!(second)
    );
    assert_eq!(config["drives"][0]["rate_limiter"], limiter);
    assert_eq!(config["pmem"][0]["rate_limiter"], limiter, "{config:#}");
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    assert_finished_after_the_checkpoint(&waiting.wait(TIMEOUT), 3);
}

#[test]
fn bad_snapshot_files_are_refused_and_change_nothing() {
    if !kvm_available("snapshot_bad_files") {
        return;
    }
    let scratch = Scratch::new("snapshot-bad-files");
    let zone = zone(&scratch, "zone", "128M");
    let other_zone = zone_named(&scratch, "other-zone");
    let (snapshot, socket) = (scratch.path("vm.snap"), scratch.path("api.sock"));
    let args = ["--memory", "32M", "--workload", WORKLOAD];
    let (vmm, api) = paused_in_zone(&zone, "victim", &socket, &args);
    create_snapshot(&api, &snapshot, &zone);
    vmm.kill();
    let _ = std::fs::remove_file(&socket);
    let good = std::fs::read(&snapshot).unwrap();

    // Another VM of the same zone, snapshotted, then deleted and created again: another VM.
    let other = scratch.path("other.snap");
    let (vmm, api) = paused_in_zone(&zone, "other", &socket, &args);
    create_snapshot(&api, &other, &zone);
    vmm.kill();
    let _ = std::fs::remove_file(&socket);
    assert_eq!(client(&["zone", "delete-vm", &zone, "other"]).code, Some(0));
    let (vmm, _api) = paused_in_zone(&zone, "other", &socket, &args);
    vmm.kill();
    load_and_run(&other, &zone).assert_fails(2, "another VM than the snapshot's");

    // The right snapshot against another zone.
    load_and_run(&snapshot, &other_zone).assert_fails(2, "the snapshot's memory is in zone");

    let bad = scratch.path("bad.snap");
    let mut refused = 0;
    let mut try_bad = |bytes: &[u8], expected: &str| {
        std::fs::write(&bad, bytes).unwrap();
        load_and_run(&bad, &zone).assert_fails(2, expected);
        refused += 1;
    };
    try_bad(b"", "is not an llfree-vmm snapshot");
    try_bad(
        b"#!/bin/sh\necho not a snapshot\n",
        "is not an llfree-vmm snapshot",
    );
    for len in [8, 31, 32, 100, good.len() / 2, good.len() - 1] {
        try_bad(&good[..len], "is damaged");
    }
    // Every header byte, and payload bytes throughout.
    let payload_bytes = (32..good.len()).step_by(good.len() / 24);
    for at in (0..32).chain(payload_bytes) {
        let mut flipped = good.clone();
        flipped[at] ^= 0x41;
        let expected = if at < 8 {
            "is not an llfree-vmm snapshot"
        } else {
            "is damaged"
        };
        try_bad(&flipped, expected);
    }
    eprintln!("{refused} bad files refused");

    // None of it touched the VM: the right snapshot loads and the guest finishes.
    assert_finished_after_the_checkpoint(&load_and_run(&snapshot, &zone), 3);
}

/// A small zone named `name` (for the snapshot of a VM in another zone).
fn zone_named(scratch: &Scratch, name: &str) -> String {
    zone(scratch, name, "64M")
}
