//! End-to-end, real Linux (nested, see `linux_common`): a data drive gets another image while
//! the guest runs (`PATCH /drives/{id}`, Firecracker's media change): Linux's virtio-blk driver
//! is told the new capacity by a configuration change interrupt and reads the new image, under
//! the rate limiter the same request gave the drive (the metrics count its waits). The vCPUs
//! run with Firecracker's static CPU template for AMD hosts, T2A, whose CPUID the guest shows.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::time::Duration;

use linux_common::{cmdline, field, md5_of_file, pattern, LinuxGuest, BOOT_TIMEOUT};
use serde_json::{json, Value};
use vmm_common::{send, Scratch, VmmRun};

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
