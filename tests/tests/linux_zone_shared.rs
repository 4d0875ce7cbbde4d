//! End-to-end: two real Linux guests in two `vmm run` processes overcommit one zone. The
//! holder fills 160 MiB of tmpfs and holds it; the writer, started then, writes 160 MiB too:
//! the two need more than the zone, which runs dry, and the writer's faults wait
//! (`--wait-for-memory`). Only then is the holder told to free its file (Ctrl-Alt-Del through
//! the API), and free page reporting gives it back: the writer finishes because of that, by
//! construction and whatever the host's speed. (See linux_common for the guest and where this
//! runs.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::time::{Duration, Instant};

use linux_common::{cmdline, LinuxGuest, BOOT_TIMEOUT};
use vmm_common::{client, get, send, Scratch, VmmRun};

/// Free frames of the zone, as `vmm zone inspect` counts them.
fn free_frames(zone: &str) -> u64 {
    let run = client(&["zone", "inspect", "--json", zone]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    info["free_frames"].as_u64().unwrap()
}

#[test]
fn two_linux_vmms_overcommit_one_zone_and_finish_because_one_reports() {
    let test = "two_linux_vmms_overcommit_one_zone_and_finish_because_one_reports";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-zone-shared");
    let zone = scratch.path("zone");
    // 512 MiB of RAM on 344 MiB of frames: room for all of the writer's 256 MiB beside what
    // the holder keeps once it has reported its file (its kernel, initramfs and caches: 74 MiB
    // in 2 MiB frames, measured nested), not beside the holder's file as well.
    let created = client(&["zone", "create", &zone, "--size", "344M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let socket = scratch.path("holder.sock");
    let holder_cmdline = cmdline("llfree.test=fill llfree.mib=160 llfree.hold=cad");
    let mut holder = VmmRun::start(&guest.args(&[
        "--zone",
        &zone,
        "--vm",
        "holder",
        "--memory",
        "256M",
        "--balloon",
        "free_page_reporting=on",
        "--cmdline",
        &holder_cmdline,
        "--api-socket",
        &socket,
    ]));
    holder.wait_for_line("LLFREE-L2 filled", BOOT_TIMEOUT);
    let writer_cmdline = cmdline("llfree.test=rounds llfree.rounds=1 llfree.mib=160");
    let started = Instant::now();
    let mut writer = VmmRun::start(&guest.args(&[
        "--zone",
        &zone,
        "--vm",
        "writer",
        "--memory",
        "256M",
        "--wait-for-memory",
        "--cmdline",
        &writer_cmdline,
    ]));
    // The writer must run the zone dry and wait; then the holder frees its file, and the
    // writer goes on once that memory is back in the zone.
    let deadline = Instant::now() + 2 * BOOT_TIMEOUT;
    while free_frames(&zone) > 0 {
        assert!(writer.running(), "the writer ended before the zone ran dry");
        assert!(Instant::now() < deadline, "the zone never ran dry");
        std::thread::sleep(Duration::from_millis(200));
    }
    let dry_after = started.elapsed();
    let api = holder.api(&socket);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    holder.wait_for_line("LLFREE-L2 freed", BOOT_TIMEOUT);
    while writer.running() {
        assert!(
            Instant::now() < deadline,
            "the writer never finished ({} free frames, the holder reported {} chunks; {}): {}\n{}",
            free_frames(&zone),
            get(&api, "/memory")["guest"]["discarded_chunks"],
            client(&["zone", "inspect", &zone]).stdout,
            writer.stdout_so_far(),
            writer.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let written = writer.wait(Duration::from_secs(10));
    assert!(
        written.stdout.contains("LLFREE-L2 rounds-done"),
        "{written:#?}"
    );
    assert_eq!(
        written.code,
        Some(7),
        "the writer rebooted when done: {written:#?}"
    );
    let reported = get(&api, "/memory")["guest"]["discarded_chunks"]
        .as_u64()
        .unwrap();
    assert!(reported > 0, "the holder reported chunks free");
    eprintln!(
        "{test}: the zone ran dry {dry_after:.1?} after the writer's start, the writer finished \
         after {:.1?}; the holder reported {reported} chunks free",
        started.elapsed()
    );
    send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    let held = holder.wait(Duration::from_secs(60));
    assert_eq!(held.code, Some(6), "stopped through the API: {held:#?}");
}
