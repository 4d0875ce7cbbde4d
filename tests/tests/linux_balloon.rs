//! End-to-end: Linux's own virtio-balloon driver against `vmm run --balloon` (the guest of
//! `linux_common`; SKIP where it cannot boot, run for real by tests/linux-nested/run.sh).
//!
//! * The API sets the target; the driver inflates in batches of 256 pages and writes `actual`
//!   after each, which `GET /balloon` follows; the frames of the chunks it gives away are back in
//!   the pool (`GET /memory`); statistics arrive; deflating to 0 brings `actual` back to 0.
//! * Deflate-on-OOM: a guest squeezed by the balloon that allocates more than it has left gets
//!   pages back from the balloon instead of an OOM kill.
//! * Free page reporting: memory the guest frees goes back to the pool as whole frames.
//! * Free page hinting: in a run the API starts, the free memory Linux hints goes back to the
//!   pool, and the run ends by itself once Linux is through (Firecracker's
//!   `acknowledge_on_stop`); a copy snapshot taken after it is smaller on disk (the hinted
//!   chunks are holes).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::time::{Duration, Instant};

use linux_common::{cmdline, LinuxGuest, BOOT_TIMEOUT};
use serde_json::Value;
use vmm_cli::ApiClient;
use vmm_common::{get, send, Scratch, VmmRun};

const MIB: u64 = 1 << 20;
/// The target the test sets, in MiB.
const TARGET_MIB: u64 = 128;

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

/// Boots the guest with a balloon (`balloon` options), an API on a socket in `scratch` and
/// `llfree.test=...` options `test`, and waits for its init; returns the run and its API.
fn boot(
    guest: &LinuxGuest,
    scratch: &Scratch,
    args: &[&str],
    balloon: &str,
    test: &str,
) -> (VmmRun, ApiClient) {
    let socket = scratch.path("api.sock");
    let cmdline = cmdline(test);
    let mut all = args.to_vec();
    all.extend([
        "--balloon",
        balloon,
        "--cmdline",
        &cmdline,
        "--api-socket",
        &socket,
    ]);
    let mut vmm = VmmRun::start(&guest.args(&all));
    let api = vmm.api(&socket);
    vmm.wait_for_line("LLFREE-L2 ready", BOOT_TIMEOUT);
    (vmm, api)
}

/// Stops the VM through the API and checks that `vmm run` says so.
fn shut_down(vmm: VmmRun, api: &ApiClient) {
    send(api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    let run = vmm.wait(Duration::from_secs(60));
    run.assert_stopped(6, "an API shutdown request");
    assert!(!run.stdout.contains("Out of memory"), "{run:#?}");
}

#[test]
fn linux_inflates_to_the_api_target_and_frames_return_to_the_pool() {
    let test = "linux_inflates_to_the_api_target_and_frames_return_to_the_pool";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-balloon");
    // Eager: every chunk holds a frame, so each one the guest gives away entirely frees one.
    // No free page reporting: it would give the guest's free chunks back on its own (before
    // the balloon takes them, on a slow host), and the frames freed would not be the balloon's.
    let (vmm, api) = boot(
        &guest,
        &scratch,
        &["--memory", "512M", "--populate", "eager"],
        "size=0,stats_polling_interval_s=1",
        "llfree.test=idle",
    );
    // The driver is up once it has sent its first statistics (it does so at probe time).
    wait_for(&api, "/balloon/statistics", BOOT_TIMEOUT, |s| {
        s["total_memory"].is_u64()
    });
    let free_before = pool_free_bytes(&api);

    let started = Instant::now();
    send(
        &api,
        "PATCH",
        "/balloon",
        &format!(r#"{{"amount_mib":{TARGET_MIB}}}"#),
    );
    let inflated = wait_for(&api, "/balloon", BOOT_TIMEOUT, |b| {
        b["actual_mib"] == TARGET_MIB
    });
    let inflate_time = started.elapsed();
    assert_eq!(inflated["amount_mib"], TARGET_MIB);
    let memory = get(&api, "/memory");
    let given_away = memory["guest"]["given_away_4k_pages"].as_u64().unwrap();
    assert!(given_away >= TARGET_MIB * 256, "{memory:#}");
    // A fresh guest's free memory is mostly whole 2 MiB blocks: at least half of the balloon
    // comes back as whole frames.
    let freed = pool_free_bytes(&api) - free_before;
    assert!(freed >= TARGET_MIB / 2 * MIB, "{} MiB freed", freed / MIB);
    let stats = wait_for(&api, "/balloon/statistics", BOOT_TIMEOUT, |s| {
        s["actual_pages"] == TARGET_MIB * 256
    });
    assert!(stats["free_memory"].as_u64().unwrap() > 0, "{stats:#}");
    assert!(
        stats["total_memory"].as_u64().unwrap() > 256 * MIB,
        "{stats:#}"
    );

    let started = Instant::now();
    send(&api, "PATCH", "/balloon", r#"{"amount_mib":0}"#);
    wait_for(&api, "/balloon", BOOT_TIMEOUT, |b| b["actual_mib"] == 0);
    eprintln!(
        "{test}: inflate by {TARGET_MIB} MiB in {inflate_time:.2?} ({} MiB back in the pool), \
         deflate in {:.2?}",
        freed / MIB,
        started.elapsed()
    );
    shut_down(vmm, &api);
}

#[test]
fn deflate_on_oom_gives_a_squeezed_guest_pages_back_instead_of_an_oom_kill() {
    let test = "deflate_on_oom_gives_a_squeezed_guest_pages_back_instead_of_an_oom_kill";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-oom");
    // 256 MiB of RAM, 160 MiB of it in the balloon: about 60 MiB stay free. The guest then
    // writes 100 MiB into tmpfs (which cannot be swapped or dropped).
    let (mut vmm, api) = boot(
        &guest,
        &scratch,
        &["--memory", "256M"],
        "size=160M,deflate_on_oom=on",
        "llfree.test=squeeze llfree.mib=100",
    );
    wait_for(&api, "/balloon", BOOT_TIMEOUT, |b| b["actual_mib"] == 160);
    vmm.wait_for_line("LLFREE-L2 squeezed", BOOT_TIMEOUT);
    let survived = vmm.wait_for_line("LLFREE-L2 survived", BOOT_TIMEOUT);
    let balloon = get(&api, "/balloon");
    let actual = balloon["actual_mib"].as_u64().unwrap();
    assert!(actual < 160, "the balloon gave pages back: {balloon:#}");
    eprintln!("{test}: the balloon deflated to {actual} MiB on OOM; {survived}");
    shut_down(vmm, &api);
}

#[test]
fn free_page_reporting_returns_what_linux_frees_to_the_pool() {
    let test = "free_page_reporting_returns_what_linux_frees_to_the_pool";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-reporting");
    let (mut vmm, api) = boot(
        &guest,
        &scratch,
        &["--memory", "512M"],
        "size=0,free_page_reporting=on",
        "llfree.test=fill llfree.mib=128",
    );
    vmm.wait_for_line("LLFREE-L2 filled", BOOT_TIMEOUT);
    let memory = get(&api, "/memory");
    let filled = memory["pool"]["free_bytes"].as_u64().unwrap();
    let discarded = memory["guest"]["discarded_chunks"].as_u64().unwrap();
    vmm.wait_for_line("LLFREE-L2 freed", BOOT_TIMEOUT);
    let freed_at = Instant::now();
    // Linux reports free blocks of 2 MiB (pageblock order) 2 s after they are freed; some
    // blocks of the file share their 2 MiB with pages the kernel still uses.
    let back = wait_for(&api, "/memory", BOOT_TIMEOUT, |m| {
        m["pool"]["free_bytes"].as_u64().unwrap() >= filled + 96 * MIB
    });
    let took = freed_at.elapsed();
    let gained = back["pool"]["free_bytes"].as_u64().unwrap() - filled;
    eprintln!(
        "{test}: {} MiB back in the pool {took:.2?} after Linux freed 128 MiB",
        gained / MIB
    );
    // Whole chunks went back: reported, discarded, their frames freed.
    let chunks = back["guest"]["discarded_chunks"].as_u64().unwrap() - discarded;
    assert!(
        chunks >= 48,
        "{chunks} chunks discarded: {back:#}; stderr: {}",
        vmm.stderr_so_far()
    );
    shut_down(vmm, &api);
}

#[test]
fn free_page_hinting_returns_what_linux_hints_free_to_the_pool() {
    let test = "free_page_hinting_returns_what_linux_hints_free_to_the_pool";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-hinting");
    // Lazy population: the 128 MiB Linux writes and frees hold frames until hinting.
    let (mut vmm, api) = boot(
        &guest,
        &scratch,
        &["--memory", "512M"],
        "size=0,free_page_hinting=on,stats_polling_interval_s=1",
        "llfree.test=fill llfree.mib=128 llfree.hold=1",
    );
    vmm.wait_for_line("LLFREE-L2 idle", BOOT_TIMEOUT);
    assert_eq!(get(&api, "/balloon")["free_page_hinting"], true);
    let status = get(&api, "/balloon/hinting/status");
    assert_eq!(status["host_cmd"], 0, "{status}");
    // A copy snapshot before the run and one after: the hinted chunks are holes in the second.
    let copy_snapshot = |name: &str| {
        let (snapshot, memory) = (scratch.path(&format!("{name}.snap")), scratch.path(name));
        send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
        let body = format!(
            r#"{{"snapshot_type":"Full","snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#
        );
        send(&api, "PUT", "/snapshot/create", &body);
        send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
        // Bytes the file holds on disk (holes take none).
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&memory).unwrap()) * 512
    };
    let unhinted = copy_snapshot("before.mem");
    let before = pool_free_bytes(&api);
    let started = Instant::now();
    send(&api, "PATCH", "/balloon/hinting/start", "{}");
    // Linux hints its free blocks and says it is through; the run then ends (DONE, 1).
    let done = wait_for(&api, "/balloon/hinting/status", BOOT_TIMEOUT, |s| {
        s["host_cmd"] == 1
    });
    let took = started.elapsed();
    assert_eq!(done["guest_cmd"], 0, "Linux is through: {done}");
    let gained = pool_free_bytes(&api).saturating_sub(before);
    eprintln!(
        "{test}: {} MiB back in the pool {took:.2?} after the run started",
        gained / MIB
    );
    assert!(gained >= 64 * MIB, "{} MiB back", gained / MIB);
    let hinted = copy_snapshot("after.mem");
    eprintln!(
        "{test}: copy snapshot's memory file {} MiB on disk before the run, {} MiB after",
        unhinted / MIB,
        hinted / MIB
    );
    assert!(
        hinted + 64 * MIB <= unhinted,
        "{hinted} against {unhinted} bytes"
    );
    // Stopping an ended run keeps it ended.
    // As curl sends it: no body.
    let stopped = api.request("PATCH", "/balloon/hinting/stop", None).unwrap();
    assert_eq!(stopped.status, 204, "{}", stopped.body);
    assert_eq!(get(&api, "/balloon/hinting/status")["host_cmd"], 1);
    shut_down(vmm, &api);
}
