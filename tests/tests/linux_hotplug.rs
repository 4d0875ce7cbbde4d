//! End-to-end: a real Linux (its virtio_mem driver) plugs 1 GiB of hot-pluggable memory from a
//! zone when the host asks (`PATCH /hotplug/memory`), its MemTotal grows by it, it fills more
//! than its boot memory could hold, frees it, and gives all of it back when asked: the frames
//! are free in the zone again. And two Linux VMs in two VMM processes on one zone smaller than
//! their memory together hand 512 MiB back and forth. (See linux_common for the guest and where
//! this runs.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::time::{Duration, Instant};

use linux_common::{cmdline, field, LinuxGuest, BOOT_TIMEOUT};
use vmm_common::{client, get, send, zone_consistent, Scratch, VmmRun};

const GIB_KIB: u64 = 1 << 20;

fn free_frames(zone: &str) -> u64 {
    zone_consistent(zone)["free_frames"].as_u64().unwrap()
}

/// Waits until `zone` has `frames` free frames (a plug's frames are populated while the guest
/// onlines its memory, and may still be on their way when its MemTotal shows the plug).
fn wait_free_frames(zone: &str, frames: u64, what: &str) {
    let since = Instant::now();
    while free_frames(zone) != frames {
        assert!(
            since.elapsed() < BOOT_TIMEOUT,
            "{what}: {} free frames, not {frames}",
            free_frames(zone)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last MemTotal the guest reported.
fn memtotal_kib(run: &VmmRun) -> u64 {
    let out = run.stdout_so_far();
    let line = out
        .lines()
        .rfind(|l| l.contains("LLFREE-L2 memtotal"))
        .unwrap_or_default();
    field(line, "kib").and_then(|k| k.parse().ok()).unwrap_or(0)
}

fn ctrl_alt_del(api: &vmm_cli::ApiClient) {
    send(
        api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
}

/// Asks the guest to have `mib` MiB plugged (`PATCH /hotplug/memory`).
fn request_plugged(api: &vmm_cli::ApiClient, mib: u64) {
    let body = format!(r#"{{"requested_size_mib":{mib}}}"#);
    send(api, "PATCH", "/hotplug/memory", &body);
}

/// Waits until the device has nothing plugged; returns how long it took from `since`.
fn wait_unplugged(api: &vmm_cli::ApiClient, since: Instant) -> Duration {
    while get(api, "/hotplug/memory")["plugged_size_mib"] != 0 {
        assert!(
            since.elapsed() < BOOT_TIMEOUT,
            "the guest kept {:#}",
            get(api, "/hotplug/memory")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    since.elapsed()
}

/// A new zone of `size` in `scratch`; returns its path.
fn new_zone(scratch: &Scratch, size: &str) -> String {
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", size]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    zone
}

/// Waits until the guest of `run` reports a MemTotal of `kib` (what it booted with plus what
/// it plugged), and returns how long it took from `since`.
fn wait_memtotal(run: &VmmRun, kib: u64, since: Instant) -> Duration {
    while memtotal_kib(run) != kib {
        assert!(
            since.elapsed() < BOOT_TIMEOUT,
            "MemTotal stayed at {} KiB, not {kib}",
            memtotal_kib(run)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    since.elapsed()
}

#[test]
fn two_linux_vms_on_one_zone_hand_512_mib_back_and_forth() {
    let test = "two_linux_vms_on_one_zone_hand_512_mib_back_and_forth";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-hotplug-trade");
    // Both VMs' RAM (2 x 256 MiB, taken at the start) and 512 MiB more: one VM's plug at a
    // time; their memory together is 1.5 GiB.
    let zone = new_zone(&scratch, "1040M");
    let line = cmdline("memhp_default_state=online_movable llfree.test=hotplug llfree.mib=0");
    let start = |name: &'static str| {
        let socket = scratch.path(&format!("{name}.sock"));
        let args = [
            "--zone",
            &zone,
            "--vm",
            name,
            "--ephemeral",
            "--memory",
            "256M",
            "--populate",
            "eager",
            "--hotplug",
            "total=512M",
            "--cmdline",
            &line,
            "--api-socket",
            &socket,
        ];
        let mut run = VmmRun::start(&guest.args(&args));
        let api = run.api(&socket);
        (run, api)
    };
    // One boot after the other: two Linux guests calibrating their APIC timers at once on the
    // nested route's emulated CPUs once made one of them give its timer up and hang.
    let (mut a, a_api) = start("a");
    a.wait_for_line("LLFREE-L2 memtotal", BOOT_TIMEOUT);
    let (mut b, b_api) = start("b");
    b.wait_for_line("LLFREE-L2 memtotal", BOOT_TIMEOUT);
    let (a_booted, b_booted) = (memtotal_kib(&a), memtotal_kib(&b));
    let free = free_frames(&zone);
    assert!(
        (256..512).contains(&free),
        "the zone has room for one plug of 256 frames, not two: {free} frames free"
    );
    let half = GIB_KIB / 2;
    let mut times = Vec::new();
    for round in 0..2 {
        // a plugs 512 MiB, then gives it back; b plugs the same frames, then gives them back.
        for (run, api, booted) in [(&a, &a_api, a_booted), (&b, &b_api, b_booted)] {
            let asked = Instant::now();
            request_plugged(api, 512);
            let plugged = wait_memtotal(run, booted + half, asked);
            wait_free_frames(&zone, free - 256, &format!("round {round}, plugged"));
            let asked = Instant::now();
            request_plugged(api, 0);
            let unplugged = wait_unplugged(api, asked);
            wait_free_frames(&zone, free, &format!("round {round}, unplugged"));
            times.push((plugged, unplugged));
        }
    }
    eprintln!("{test}: (plug 512 MiB, unplug it) of a, b, a, b: {times:.2?}");
    for (mut run, api) in [(a, a_api), (b, b_api)] {
        // Fill and free nothing, then reboot.
        for step in ["LLFREE-L2 filled", "LLFREE-L2 freed"] {
            ctrl_alt_del(&api);
            run.wait_for_line(step, BOOT_TIMEOUT);
        }
        ctrl_alt_del(&api);
        assert_eq!(run.wait(Duration::from_secs(60)).code, Some(7));
    }
}

#[test]
fn linux_plugs_a_gib_from_the_zone_uses_it_and_gives_it_back() {
    let test = "linux_plugs_a_gib_from_the_zone_uses_it_and_gives_it_back";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-hotplug");
    let zone = new_zone(&scratch, "1536M");
    let socket = scratch.path("api.sock");
    // More than the 256 MiB of boot memory holds: the guest needs what it plugged.
    let line = cmdline("memhp_default_state=online_movable llfree.test=hotplug llfree.mib=384");
    let args = [
        "--zone",
        &zone,
        "--vm",
        "linux",
        "--ephemeral",
        "--memory",
        "256M",
        // RAM's frames all taken at the start: the zone's free frames change by hotplug alone.
        "--populate",
        "eager",
        "--hotplug",
        "total=1G",
        "--cmdline",
        &line,
        "--api-socket",
        &socket,
    ];
    let mut run = VmmRun::start(&guest.args(&args));
    let api = run.api(&socket);
    run.wait_for_line("LLFREE-L2 memtotal", BOOT_TIMEOUT);
    let booted = memtotal_kib(&run);
    let free_before = free_frames(&zone);

    // Plug 1 GiB: Linux onlines it, MemTotal grows by it, the zone gives 512 frames.
    let asked = Instant::now();
    request_plugged(&api, 1024);
    let plugged_after = wait_memtotal(&run, booted + GIB_KIB, asked);
    assert_eq!(get(&api, "/hotplug/memory")["plugged_size_mib"], 1024);
    assert_eq!(free_frames(&zone), free_before - 512);

    // Use it: 384 MiB in tmpfs, more than the boot memory could hold; then free it.
    ctrl_alt_del(&api);
    let filled = run.wait_for_line("LLFREE-L2 filled", BOOT_TIMEOUT);
    assert!(!run.stdout_so_far().contains("fill-failed"), "{filled}");
    ctrl_alt_del(&api);
    run.wait_for_line("LLFREE-L2 freed", BOOT_TIMEOUT);

    // Unplug all of it: Linux offlines and unplugs its blocks, the zone has the frames back.
    let asked = Instant::now();
    request_plugged(&api, 0);
    let unplugged_after = wait_unplugged(&api, asked);
    assert_eq!(free_frames(&zone), free_before);
    wait_memtotal(&run, booted, asked);
    eprintln!(
        "{test}: MemTotal {booted} KiB at boot; +1 GiB {plugged_after:.2?} after the PATCH; \
         the frames back in the zone {unplugged_after:.2?} after the PATCH to 0"
    );
    ctrl_alt_del(&api);
    let done = run.wait(Duration::from_secs(60));
    assert_eq!(done.code, Some(7), "the guest rebooted: {done:#?}");
}

/// The MD5 a "filled" or "freed" line reports of the guest's file.
fn md5(line: &str) -> &str {
    field(line, "md5").unwrap_or_else(|| panic!("no md5 in {line:?}"))
}

/// A booted Linux VM in a new zone of 1 GiB, with 256 MiB of RAM (all its frames taken at the
/// start) and 512 MiB of hot-pluggable memory, whose guest fills 320 MiB (more than its RAM) at
/// the first Ctrl-Alt-Del.
struct HotplugZoneVm {
    scratch: Scratch,
    zone: String,
    socket: String,
    /// The arguments of `vmm run`, to start it again.
    args: Vec<String>,
    run: VmmRun,
    api: vmm_cli::ApiClient,
    /// MemTotal at boot, KiB.
    booted: u64,
    /// The zone's free frames once the VM booted.
    free_booted: u64,
}

impl HotplugZoneVm {
    fn boot(guest: &LinuxGuest, vm: &str) -> Self {
        let scratch = Scratch::new(&format!("linux-hotplug-{vm}"));
        let zone = new_zone(&scratch, "1024M");
        let socket = scratch.path("api.sock");
        let line = cmdline("memhp_default_state=online_movable llfree.test=hotplug llfree.mib=320");
        let args = [
            "--zone",
            &zone,
            "--vm",
            vm,
            "--memory",
            "256M",
            "--populate",
            "eager",
            "--hotplug",
            "total=512M",
            "--log-level",
            "info",
            "--cmdline",
            &line,
            "--api-socket",
            &socket,
        ];
        let mut run = VmmRun::start(&guest.args(&args));
        let args = guest.args(&args).into_iter().map(str::to_owned).collect();
        let api = run.api(&socket);
        run.wait_for_line("LLFREE-L2 memtotal", BOOT_TIMEOUT);
        let booted = memtotal_kib(&run);
        let free_booted = free_frames(&zone);
        HotplugZoneVm {
            scratch,
            zone,
            socket,
            args,
            run,
            api,
            booted,
            free_booted,
        }
    }
}

/// Plugs 512 MiB into the guest of `run` (booted with `booted` KiB) and has it fill 320 MiB;
/// returns the MD5 of what it wrote.
fn plug_and_fill(run: &mut VmmRun, api: &vmm_cli::ApiClient, booted: u64) -> String {
    request_plugged(api, 512);
    wait_memtotal(run, booted + GIB_KIB / 2, Instant::now());
    ctrl_alt_del(api);
    let filled = run.wait_for_line("LLFREE-L2 filled", BOOT_TIMEOUT);
    assert!(!run.stdout_so_far().contains("fill-failed"), "{filled}");
    md5(&filled).to_owned()
}

#[test]
fn a_sigkilled_linux_vmm_leaves_its_plugged_frames_in_the_zone_and_its_restart_finds_them() {
    let test =
        "a_sigkilled_linux_vmm_leaves_its_plugged_frames_in_the_zone_and_its_restart_finds_them";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let HotplugZoneVm {
        scratch: _scratch,
        zone,
        socket,
        args,
        mut run,
        api,
        booted,
        free_booted,
    } = HotplugZoneVm::boot(&guest, "restarted");
    plug_and_fill(&mut run, &api, booted);
    let plugged = free_booted - 256;
    assert_eq!(free_frames(&zone), plugged);

    // SIGKILL: the zone keeps the VM's RAM and its 512 MiB of plugged frames, none lost or
    // leaked (zone_consistent checks).
    let killed = run.kill();
    assert_eq!(killed.code, None, "SIGKILLed: {killed:#?}");
    assert_eq!(free_frames(&zone), plugged);
    let _ = std::fs::remove_file(&socket);

    // The restart finds the 512 MiB plugged and requested. A Linux that boots unplugs all it
    // finds plugged (it cannot know the memory) and plugs what is requested again: the
    // frames it gave back.
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut run = VmmRun::start(&args);
    let api = run.api(&socket);
    run.wait_for_line("LLFREE-L2 memtotal", BOOT_TIMEOUT);
    assert!(
        run.stderr_so_far()
            .contains("virtio-mem: 512 MiB plugged at the start, as the VM left it"),
        "{}",
        run.stderr_so_far()
    );
    wait_memtotal(&run, booted + GIB_KIB / 2, Instant::now());
    assert_eq!(get(&api, "/hotplug/memory")["plugged_size_mib"], 512);
    assert_eq!(free_frames(&zone), plugged);

    // It uses and gives back that memory as before the crash.
    ctrl_alt_del(&api);
    let filled = run.wait_for_line("LLFREE-L2 filled", BOOT_TIMEOUT);
    ctrl_alt_del(&api);
    let freed = run.wait_for_line("LLFREE-L2 freed", BOOT_TIMEOUT);
    assert_eq!(md5(&freed), md5(&filled));
    request_plugged(&api, 0);
    wait_memtotal(&run, booted, Instant::now());
    wait_unplugged(&api, Instant::now());
    assert_eq!(free_frames(&zone), free_booted);
    ctrl_alt_del(&api);
    assert_eq!(run.wait(Duration::from_secs(60)).code, Some(7));
}

#[test]
fn a_linux_snapshot_in_its_zone_keeps_the_plugged_memory_and_what_is_in_it() {
    let test = "a_linux_snapshot_in_its_zone_keeps_the_plugged_memory_and_what_is_in_it";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let HotplugZoneVm {
        scratch,
        zone,
        socket,
        mut run,
        api,
        booted,
        free_booted,
        ..
    } = HotplugZoneVm::boot(&guest, "snapped");
    let snapshot = scratch.path("vm.snap");
    let written = plug_and_fill(&mut run, &api, booted);

    // Paused, snapshotted into its zone, its VMM killed.
    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{zone}"}}"#);
    send(&api, "PUT", "/snapshot/create", &body);
    run.kill();
    let _ = std::fs::remove_file(&socket);

    // Loaded in a new process and resumed: 512 MiB plugged, the guest reads back what it
    // wrote in them, and gives them back when asked.
    let mut loaded = VmmRun::start_command(&["--api-sock", &socket]);
    let api = loaded.api(&socket);
    let load = format!(
        r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{zone}"}},"resume_vm":true}}"#
    );
    send(&api, "PUT", "/snapshot/load", &load);
    let status = get(&api, "/hotplug/memory");
    assert_eq!(
        (
            status["plugged_size_mib"].as_u64(),
            status["requested_size_mib"].as_u64()
        ),
        (Some(512), Some(512)),
        "{status:#}"
    );
    assert_eq!(free_frames(&zone), free_booted - 256);
    ctrl_alt_del(&api);
    let freed = loaded.wait_for_line("LLFREE-L2 freed", BOOT_TIMEOUT);
    assert_eq!(
        md5(&freed),
        written,
        "what the guest wrote before the snapshot"
    );
    request_plugged(&api, 0);
    wait_unplugged(&api, Instant::now());
    assert_eq!(free_frames(&zone), free_booted);
    // `vmm --api-sock`, as Firecracker, ends normally when its guest reboots.
    ctrl_alt_del(&api);
    let done = loaded.wait(Duration::from_secs(60));
    assert_eq!(done.code, Some(0), "{done:#?}");
}
