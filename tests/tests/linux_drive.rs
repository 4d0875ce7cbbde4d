//! End-to-end, real Linux (nested, see `linux_common`): a data drive gets another image while
//! the guest runs (`PATCH /drives/{id}`, Firecracker's media change): Linux's virtio-blk driver
//! is told the new capacity by a configuration change interrupt and reads the new image, under
//! the rate limiter the same request gave the drive (the metrics count its waits). The vCPUs
//! run with Firecracker's static CPU template for AMD hosts, T2A, whose CPUID the guest shows.
//! And an ext4 file system on a drive of Firecracker's `Async` engine (io_uring), written while
//! the VM is snapshotted, loaded again and killed, is clean and holds every synced file.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::time::Duration;

use linux_common::{cmdline, field, md5_of_file, pattern, LinuxGuest, BOOT_TIMEOUT};
use serde_json::{json, Value};
use vmm_common::{get, send, wait_for_state, Scratch, VmmRun};

/// The first image's size, and the second's.
const FIRST_MIB: usize = 4;
const SECOND_MIB: usize = 6;
/// The second image's rate limiter: 1 MiB a second (reading it all must wait).
const LIMIT_BYTES_PER_S: usize = 1 << 20;

#[test]
fn linux_reads_a_drive_s_new_image_under_its_new_rate_limiter_on_t2a_vcpus() {
    let test = "linux_reads_a_drive_s_new_image_under_its_new_rate_limiter_on_t2a_vcpus";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new(test);
    let (first, second) = (scratch.path("first.img"), scratch.path("second.img"));
    std::fs::write(&first, pattern(FIRST_MIB << 20, 1)).unwrap();
    std::fs::write(&second, pattern(SECOND_MIB << 20, 2)).unwrap();
    let (socket, metrics) = (scratch.path("api.sock"), scratch.path("metrics.json"));
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let requests = [
        (
            "/machine-config",
            json!({"vcpu_count": 1, "mem_size_mib": 128, "cpu_template": "T2A"}),
        ),
        (
            "/boot-source",
            json!({"kernel_image_path": guest.kernel, "initrd_path": guest.initrd,
                   "boot_args": cmdline("llfree.test=drive")}),
        ),
        (
            "/drives/data",
            json!({"drive_id": "data", "path_on_host": first, "is_root_device": false,
                   "is_read_only": true}),
        ),
        ("/metrics", json!({ "metrics_path": metrics })),
        ("/actions", json!({"action_type": "InstanceStart"})),
    ];
    for (path, body) in requests {
        send(&api, "PUT", path, &body.to_string());
    }
    let before = vmm.wait_for_line("LLFREE-L2 drive-before", BOOT_TIMEOUT);
    eprintln!("{test}: {before}");
    let sectors = |mib: usize| ((mib << 20) / 512).to_string();
    assert_eq!(field(&before, "size"), Some(sectors(FIRST_MIB).as_str()));
    assert_eq!(
        field(&before, "md5"),
        Some(md5_of_file(&first).as_str()),
        "{before}"
    );
    // T2A's CPUID: the signature's model 0x3f, no 1 GiB pages, no AVX-512.
    assert_eq!(field(&before, "model"), Some("63"), "{before}");
    assert_eq!(field(&before, "pdpe1gb"), Some("0"), "{before}");
    assert_eq!(field(&before, "avx512f"), Some("0"), "{before}");
    vmm.wait_for_line("LLFREE-L2 drive-wait-go", BOOT_TIMEOUT);
    let limiter = json!({"bandwidth": {"size": LIMIT_BYTES_PER_S, "refill_time": 1000}});
    send(
        &api,
        "PATCH",
        "/drives/data",
        &json!({"drive_id": "data", "path_on_host": second, "rate_limiter": limiter}).to_string(),
    );
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    let after = vmm.wait_for_line("LLFREE-L2 drive-after", BOOT_TIMEOUT);
    eprintln!("{test}: {after}");
    assert_eq!(field(&after, "size"), Some(sectors(SECOND_MIB).as_str()));
    assert_eq!(
        field(&after, "md5"),
        Some(md5_of_file(&second).as_str()),
        "{after}"
    );
    // 6 MiB through a bucket of 1 MiB refilled each second: at least 5 s (a bound a loaded
    // host only makes longer; 4 s allows for the clock's granularity).
    let seconds: f64 = field(&after, "seconds").unwrap().parse().unwrap();
    let least = (SECOND_MIB << 20).saturating_sub(LIMIT_BYTES_PER_S) / LIMIT_BYTES_PER_S;
    assert!(seconds >= least as f64 - 1.0, "{after}");
    send(&api, "PUT", "/actions", r#"{"action_type":"FlushMetrics"}"#);
    // Each line counts since the one before: the waits are their sum.
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let waits: u64 = lines
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter_map(|line| line["block_data"]["rate_limiter_throttled_events"].as_u64())
        .sum();
    eprintln!("{test}: {waits} waits for the rate limiter");
    assert!(waits > 0, "{lines}");
    vmm.wait_for_line("LLFREE-L2 idle", BOOT_TIMEOUT);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    let done = vmm.wait(Duration::from_secs(120));
    assert_eq!(done.code, Some(0), "{done:#?}");
}

/// Files the guest writes and syncs before the snapshot, and after the load.
const SYNCED_BEFORE_SNAPSHOT: u64 = 6;
const SYNCED_AFTER_LOAD: u64 = 12;
/// The data drive's size.
const FS_MIB: u64 = 64;

/// The counters of drive `data` in the metrics file at `path`, summed over its lines.
fn drive_totals(path: &str) -> (u64, u64, u64) {
    let lines = std::fs::read_to_string(path).unwrap();
    let (mut writes, mut flushes, mut fails) = (0, 0, 0);
    for line in lines.lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        let count = |name: &str| line["block_data"][name].as_u64().unwrap_or(0);
        writes += count("write_count");
        flushes += count("flush_count");
        fails += count("execute_fails");
    }
    (writes, flushes, fails)
}

#[test]
fn linux_s_ext4_on_an_async_drive_survives_a_snapshot_a_load_and_a_kill_intact() {
    let test = "linux_s_ext4_on_an_async_drive_survives_a_snapshot_a_load_and_a_kill_intact";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new(test);
    let image = scratch.path("data.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(FS_MIB << 20)
        .unwrap();
    let (socket, metrics) = (scratch.path("api.sock"), scratch.path("metrics.json"));
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let write = cmdline("llfree.test=fs llfree.disk=vda llfree.phase=write llfree.format=1");
    let requests = [
        (
            "/machine-config",
            json!({"vcpu_count": 1, "mem_size_mib": 128}),
        ),
        (
            "/boot-source",
            json!({"kernel_image_path": guest.kernel, "initrd_path": guest.initrd,
                   "boot_args": write}),
        ),
        (
            "/drives/data",
            json!({"drive_id": "data", "path_on_host": image, "is_root_device": false,
                   "is_read_only": false, "io_engine": "Async"}),
        ),
        ("/actions", json!({"action_type": "InstanceStart"})),
    ];
    for (path, body) in requests {
        send(&api, "PUT", path, &body.to_string());
    }
    let mounted = vmm.wait_for_line("LLFREE-L2 mounted", BOOT_TIMEOUT);
    eprintln!("{test}: {mounted}");
    let config = get(&api, "/vm/config");
    assert_eq!(config["drives"][0]["io_engine"], "Async", "{config:#}");
    vmm.wait_for_line(
        &format!("LLFREE-L2 synced {SYNCED_BEFORE_SNAPSHOT}"),
        BOOT_TIMEOUT,
    );
    // A snapshot in the middle of the writes: what the engine had in flight is answered first.
    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    let (snapshot, memory) = (scratch.path("vm.snap"), scratch.path("vm.mem"));
    send(
        &api,
        "PUT",
        "/snapshot/create",
        &json!({"snapshot_type": "Full", "snapshot_path": snapshot, "mem_file_path": memory})
            .to_string(),
    );
    vmm.kill();

    // Loaded into a new VMM, the guest writes on through the drive's engine, which the
    // snapshot kept, until the VMM is killed.
    let socket2 = scratch.path("api2.sock");
    let mut loaded = VmmRun::start_command(&["--api-sock", &socket2]);
    let api = loaded.api(&socket2);
    send(
        &api,
        "PUT",
        "/metrics",
        &json!({ "metrics_path": metrics }).to_string(),
    );
    send(
        &api,
        "PUT",
        "/snapshot/load",
        &json!({"snapshot_path": snapshot,
                "mem_backend": {"backend_type": "File", "backend_path": memory},
                "resume_vm": true})
        .to_string(),
    );
    wait_for_state(&api, "Running");
    let config = get(&api, "/vm/config");
    assert_eq!(config["drives"][0]["io_engine"], "Async", "{config:#}");
    loaded.wait_for_line(
        &format!("LLFREE-L2 synced {SYNCED_AFTER_LOAD}"),
        BOOT_TIMEOUT,
    );
    send(&api, "PUT", "/actions", r#"{"action_type":"FlushMetrics"}"#);
    let (writes, flushes, fails) = drive_totals(&metrics);
    eprintln!("{test}: after the load: {writes} writes, {flushes} flushes, {fails} failed");
    assert!(
        writes > 0 && flushes > 0 && fails == 0,
        "{writes} {flushes} {fails}"
    );
    // Somewhere in the middle of the next file.
    std::thread::sleep(Duration::from_millis(150));
    let killed = loaded.kill();
    let synced = killed
        .stdout
        .lines()
        .filter_map(|line| e2e_tests::without_name(line).strip_prefix("LLFREE-L2 synced "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .max()
        .expect("synced lines");
    eprintln!("{test}: killed the loaded VMM after {synced} synced files");

    // `vmm run` with the drive on the Async engine: the journal replayed, e2fsck finds the
    // file system clean and every synced file intact.
    let drive = format!("id=data,path={image},io_engine=async");
    let check = cmdline(&format!(
        "llfree.test=fs llfree.disk=vda llfree.phase=check llfree.upto={synced}"
    ));
    let mut checker =
        VmmRun::start(&guest.args(&["--memory", "128M", "--drive", &drive, "--cmdline", &check]));
    let checked = checker.wait_for_line("LLFREE-L2 checked", BOOT_TIMEOUT);
    eprintln!("{test}: {checked}");
    assert_eq!(field(&checked, "fsck"), Some("0"), "{checked}");
    assert_eq!(field(&checked, "bad"), Some("0"), "{checked}");
    assert_eq!(
        field(&checked, "good"),
        Some(synced.to_string().as_str()),
        "{checked}"
    );
    let done = checker.wait(Duration::from_secs(120));
    // `vmm run` ends with status 7 when the guest reboots.
    assert_eq!(done.code, Some(7), "the guest rebooted: {done:#?}");
}
