//! End-to-end: Linux's own virtio-balloon driver against `vmm run --balloon`. The API sets the
//! target; the driver inflates in batches of 256 pages and writes `actual` after each, which
//! `GET /balloon` follows, and the frames of the chunks it gives away (or reports free) are back
//! in the pool (`GET /memory`). Deflating to 0 brings `actual` back to 0.
//!
//! It runs where the host has hardware virtualization (`vmx` or `svm` in /proc/cpuinfo) and a
//! guest is given:
//!
//! * `LLFREE_VMM_TEST_KERNEL`: a kernel with CONFIG_VIRTIO_MMIO, CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES
//!   and CONFIG_VIRTIO_BALLOON (built in, or modules the initrd loads) and
//!   CONFIG_SERIAL_8250_CONSOLE; Debian's stock kernels lack the command-line devices;
//! * `LLFREE_VMM_TEST_INITRD`: an initramfs whose init keeps the guest running (a shell, or
//!   `sleep`), so that the driver has time to work.
//!
//! Elsewhere (e.g. on PVM, which cannot run a stock kernel) it prints SKIP.

mod vmm_common;

use std::path::Path;
use std::time::{Duration, Instant};

use e2e_tests::{hardware_virtualization, kvm_available};
use serde_json::Value;
use vmm::api::ApiClient;
use vmm_common::{get, send, wait_for_state, Scratch, VmmRun};

const MIB: u64 = 1 << 20;
/// The target the test sets, in MiB.
const TARGET_MIB: u64 = 128;

/// The kernel and initrd to boot, or why there are none.
fn linux_guest() -> Result<(String, String), String> {
    hardware_virtualization()?;
    let var = |name: &str| {
        std::env::var(name).map_err(|_| {
            format!(
                "{name} is not set (a kernel with CONFIG_VIRTIO_BALLOON and \
                 CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES, and an initrd that keeps it running)"
            )
        })
    };
    let kernel = var("LLFREE_VMM_TEST_KERNEL")?;
    let initrd = var("LLFREE_VMM_TEST_INITRD")?;
    for path in [&kernel, &initrd] {
        if !Path::new(path).is_file() {
            return Err(format!("{path} is not a file"));
        }
    }
    Ok((kernel, initrd))
}

/// Polls `GET path` until `done` holds for it (at most `timeout`); returns the last answer.
fn wait_for(
    api: &ApiClient,
    path: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let value = get(api, path);
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "GET {path} after {timeout:?}: {value:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pool_free_bytes(api: &ApiClient) -> u64 {
    get(api, "/memory")["pool"]["free_bytes"].as_u64().unwrap()
}

#[test]
fn linux_inflates_to_the_api_target_and_frames_return_to_the_pool() {
    let test = "linux_inflates_to_the_api_target_and_frames_return_to_the_pool";
    if !kvm_available(test) {
        return;
    }
    let (kernel, initrd) = match linux_guest() {
        Ok(guest) => guest,
        Err(why) => {
            eprintln!("SKIP: {test}: {why}");
            return;
        }
    };
    let scratch = Scratch::new("linux-balloon");
    let socket = scratch.path("api.sock");
    // Eager: every chunk holds a frame, so each one the guest gives away entirely frees one.
    let mut vmm = VmmRun::start(&[
        "--kernel",
        &kernel,
        "--initrd",
        &initrd,
        "--memory",
        "512M",
        "--populate",
        "eager",
        "--balloon",
        "size=0,deflate_on_oom=on,free_page_reporting=on,stats_polling_interval_s=1",
        "--api-socket",
        &socket,
    ]);
    let api = vmm.api(&socket);
    wait_for_state(&api, "Running");
    // The driver is up once it has sent its first statistics (it does so at probe time).
    let boot = Duration::from_secs(120);
    wait_for(&api, "/balloon/statistics", boot, |s| {
        s["total_memory"].is_u64()
    });
    let free_before = pool_free_bytes(&api);

    send(
        &api,
        "PUT",
        "/balloon",
        &format!(r#"{{"amount_mib":{TARGET_MIB}}}"#),
    );
    let inflated = wait_for(&api, "/balloon", boot, |b| b["actual_mib"] == TARGET_MIB);
    assert_eq!(inflated["amount_mib"], TARGET_MIB);
    let memory = get(&api, "/memory");
    let given_away = memory["guest"]["given_away_4k_pages"].as_u64().unwrap();
    assert!(given_away >= TARGET_MIB * 256, "{memory:#}");
    // A fresh guest's free memory is mostly whole 2 MiB blocks: at least half of the balloon
    // comes back as whole frames (free page reporting adds what it reports).
    let freed = pool_free_bytes(&api) - free_before;
    eprintln!("{test}: the pool got {} MiB back", freed / MIB);
    assert!(freed >= TARGET_MIB / 2 * MIB, "{} MiB freed", freed / MIB);
    let stats = get(&api, "/balloon/statistics");
    assert_eq!(stats["actual_pages"], TARGET_MIB * 256, "{stats:#}");

    send(&api, "PATCH", "/balloon", r#"{"amount_mib":0}"#);
    wait_for(&api, "/balloon", boot, |b| b["actual_mib"] == 0);

    send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    let run = vmm.wait(Duration::from_secs(30));
    run.assert_stopped(6, "an API shutdown request");
    assert!(run.stdout.contains("Linux version"), "{run:#?}");
}
