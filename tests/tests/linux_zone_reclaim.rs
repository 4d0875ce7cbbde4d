//! End-to-end: three real Linux guests in three `vmm run` processes on a zone too small for
//! what they touch, and the zone's reclaim policy (see linux_common for the guest and where
//! this runs).
//!
//! Each guest (192 MiB, ephemeral: its frames go back when its VMM ends; a balloon with
//! statistics and free page hinting, no free page reporting) first writes and deletes 64 MiB
//! in tmpfs ("warm": memory it touched and now holds free, as a guest that ran a job does),
//! one after the other; then, once the zone has room for them again, on one signal all three
//! write 16 MiB at the same moment. The zone has 288 MiB: the third guest's warm-up needs
//! memory that the first two hold free, and the bursts memory that the third holds free. With
//! the policy (the default) their VMMs ask their guests to hint free pages when the zone runs
//! low, the memory comes back, and all three finish; with the policy off the third
//! VMM waits until its bounded wait ends it with status 8, and the other two finish. Never a
//! hang, nothing lost or leaked.
//!
//! Three guests holding all they write at once cannot fit a zone smaller than that, whatever
//! a policy does (only guest memory that is touched and free can be taken back): the bursts
//! here fit the zone once what the guests hold free is back.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::time::{Duration, Instant};

use linux_common::{cmdline, LinuxGuest, BOOT_TIMEOUT};
use vmm_common::{client, get, zone_consistent, Scratch, VmmRun};

const VMS: [&str; 3] = ["a", "b", "c"];
/// A guest touches about 44 MiB booting (the L2 kernel with its network stack) and 64 MiB
/// warming up: three need more than the zone, and two leave the third too little unless they
/// give back what they hold free.
///
/// `no-kvmapf`: the guests do not take KVM's async page faults (KVM then halts a vCPU whose
/// fault waits, instead of telling the guest to schedule around it). With them, this scenario
/// met crashes of the nested environment below the VMM (L1's KVM under QEMU's emulated SVM):
/// idle guests triple-faulted without a message while another ran the zone low, and once L1's
/// own kernel overflowed its stack in a vCPU thread after a VM whose fault KVM's worker
/// resolved was stopped. What the test asserts does not depend on how KVM waits.
const GUEST: &str = "llfree.test=burst llfree.warm=64 llfree.mib=16 no-kvmapf";
/// What the three bursts need of the zone, with a margin of a quarter.
const BURSTS_MIB: u64 = 3 * 16 * 5 / 4;

/// One guest of the three and its API.
struct ZoneGuestVm {
    name: &'static str,
    run: VmmRun,
    api: vmm_cli::ApiClient,
}

fn free_mib(zone: &str) -> u64 {
    zone_consistent(zone)["free_frames"].as_u64().unwrap() * 2
}

/// Starts VM `name` of the guest on `zone` with `extra` arguments.
fn start(
    guest: &LinuxGuest,
    scratch: &Scratch,
    zone: &str,
    name: &'static str,
    extra: &[&str],
) -> ZoneGuestVm {
    let socket = scratch.path(&format!("{name}.sock"));
    let guest_cmdline = cmdline(GUEST);
    let mut args = vec![
        "--zone",
        zone,
        "--vm",
        name,
        // Its frames go back to the zone when its VMM ends.
        "--ephemeral",
        "--memory",
        "192M",
        "--balloon",
        "stats_polling_interval_s=1,free_page_hinting=on",
        // The policy's steps, for `policy_steps`.
        "--log-level",
        "info",
        "--cmdline",
        &guest_cmdline,
        "--api-socket",
        &socket,
    ];
    args.extend_from_slice(extra);
    let mut run = VmmRun::start(&guest.args(&args));
    let api = run.api(&socket);
    ZoneGuestVm { name, run, api }
}

/// How the VMM of `run` stands, on one line (the first of a failure, all CI shows): its exit
/// status once it ended, else its threads in short; then its last warnings and log line and
/// the guest's last console line. The full thread report follows on later lines.
fn process_state(run: &mut VmmRun) -> String {
    let stderr = run.stderr_so_far();
    let warnings = stderr
        .lines()
        .filter(|line| line.contains("warn") || line.contains("error"));
    let last_warnings = last_lines(warnings, 3, " | ");
    let last_log = last_lines(stderr.lines(), 3, " | ");
    let stdout = run.stdout_so_far();
    let console = stdout.lines().last().unwrap_or_default();
    let said = format!(
        "last warnings [{last_warnings}]; last log lines [{last_log}]; the guest's last line \
         [{console}]"
    );
    match run.exit_status() {
        Some(status) => format!("its VMM ended, {status}; {said}"),
        None => {
            let threads = vmm_common::threads_report(run.pid());
            let short: Vec<String> = threads
                .lines()
                .map(|line| {
                    line.split(", kernel stack")
                        .next()
                        .unwrap_or(line)
                        .trim()
                        .to_owned()
                })
                .collect();
            format!(
                "its VMM runs, threads [{}]; {said}\n{threads}",
                short.join(" | ")
            )
        }
    }
}

/// The last `n` of `lines`, joined by `separator`.
fn last_lines<'a>(lines: impl Iterator<Item = &'a str>, n: usize, separator: &str) -> String {
    let lines: Vec<&str> = lines.collect();
    lines[lines.len().saturating_sub(n)..].join(separator)
}

/// The policy's hinting runs in `vm` so far (its VMM logs each), and the frames they gave
/// back.
fn hinting_runs(vm: &ZoneGuestVm) -> (usize, u64) {
    let log = vm.run.stderr_so_far();
    let freed: Vec<u64> = log
        .lines()
        .filter_map(|line| {
            let (_, after) = line.split_once("zone reclaim: free page hinting run ")?;
            let (_, after) = after.split_once(" gave ")?;
            after.split_once(" frames back")?.0.parse().ok()
        })
        .collect();
    (freed.len(), freed.iter().sum())
}

/// Waits until `vm`'s guest has warmed up, or its VMM ended; meanwhile the largest balloon of
/// `others` (MiB) is recorded in `peak`, and every 15 s the zone and the others' balloons are
/// shown (a slow host shows as progress, a stuck policy as none).
fn wait_warmed(
    vm: &mut ZoneGuestVm,
    others: &mut [ZoneGuestVm],
    zone: &str,
    peak: &mut u64,
) -> bool {
    let deadline = Instant::now() + 2 * BOOT_TIMEOUT;
    let mut shown = Instant::now();
    loop {
        if shown.elapsed() >= Duration::from_secs(15) {
            shown = Instant::now();
            eprintln!("  {} warming; zone: {} MiB free", vm.name, free_mib(zone));
            for other in others.iter() {
                // A VMM that ended (its bounded wait over) shows nothing.
                let answer = |path| {
                    let body = other.api.request("GET", path, None).ok()?.body;
                    serde_json::from_str::<serde_json::Value>(&body).ok()
                };
                let (Some(balloon), Some(stats)) =
                    (answer("/balloon"), answer("/balloon/statistics"))
                else {
                    continue;
                };
                eprintln!(
                    "  {}: balloon target {} actual {} MiB; guest free {} available {} bytes",
                    other.name,
                    balloon["amount_mib"],
                    balloon["actual_mib"],
                    stats["free_memory"],
                    stats["available_memory"]
                );
            }
        }
        if vm.run.stdout_so_far().contains("LLFREE-L2 warmed") {
            return true;
        }
        if !vm.run.running() {
            return false;
        }
        for other in others.iter_mut() {
            let answer = match other.api.request("GET", "/balloon", None) {
                Ok(answer) => answer,
                Err(e) => panic!(
                    "{} did not answer GET /balloon while {} warmed up ({e}; {})\n{}\n{}",
                    other.name,
                    vm.name,
                    process_state(&mut other.run),
                    last_lines(other.run.stdout_so_far().lines(), 40, "\n"),
                    last_lines(other.run.stderr_so_far().lines(), 40, "\n")
                ),
            };
            let balloon: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
            *peak = (*peak).max(balloon["actual_mib"].as_u64().unwrap_or(0));
        }
        assert!(
            Instant::now() < deadline,
            "{} never warmed up: {}",
            vm.name,
            vm.run.stdout_so_far()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// How long a VM may show no sign of a Ctrl-Alt-Del before it is sent again: a key press
/// can be lost on its way into a nested guest (once in CI, a VM never saw its go), and a
/// second one is harmless at every step of the guest's script.
const SIGNAL_AGAIN_AFTER: Duration = Duration::from_secs(30);

/// Presses Ctrl-Alt-Del in `vm`. A first press must be taken; one sent `again` may be refused
/// while the guest has not read the last (its queue is full) or, once it ends, has disabled its
/// keyboard: the test goes on waiting, and says so.
fn ctrl_alt_del(vm: &mut ZoneGuestVm, again: bool) {
    let body = r#"{"action_type":"SendCtrlAltDel"}"#;
    let response = vm
        .api
        .request("PUT", "/actions", Some(body))
        .unwrap_or_else(|e| {
            panic!(
                "{}: PUT /actions: {e} ({})",
                vm.name,
                process_state(&mut vm.run)
            )
        });
    match response.status {
        204 => {}
        400 if again => eprintln!(
            "  {}: the press sent again was refused: {}",
            vm.name, response.body
        ),
        status => panic!(
            "{}: Ctrl-Alt-Del answered {status} {} ({}); the guest's keyboard: {}; its last \
             line: {}",
            vm.name,
            response.body,
            process_state(&mut vm.run),
            keyboard_lines(&vm.run.stdout_so_far()),
            vm.run.stdout_so_far().lines().last().unwrap_or_default()
        ),
    }
}

/// The guest's kernel lines about its keyboard controller, on one line.
fn keyboard_lines(stdout: &str) -> String {
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|line| line.contains("i8042") || line.contains("atkbd") || line.contains("input:"))
        .collect();
    lines.join(" | ")
}

/// Sends every VM its go (Ctrl-Alt-Del) and waits until each has written its burst; then
/// tells them all to end (Ctrl-Alt-Del again) and waits until each rebooted (status 7). None
/// ends while another writes: an ending VM gives its frames back at once, a surplus the others'
/// policies would begin to deflate into. A VM that shows no sign of a signal (no "burst-go",
/// or no end) gets it again after [`SIGNAL_AGAIN_AFTER`], and the test says so.
fn burst(zone: &str, mut vms: Vec<ZoneGuestVm>) {
    vms.iter_mut().for_each(|vm| ctrl_alt_del(vm, false));
    let mut signalled = vec![Instant::now(); vms.len()];
    // What each VM does meanwhile, every 15 s: a slow host shows as progress, a hang as none.
    let deadline = Instant::now() + 4 * BOOT_TIMEOUT;
    let mut shown = Instant::now();
    let mut ending = false;
    while vms.iter_mut().any(|vm| vm.run.running()) {
        if !ending
            && vms
                .iter()
                .all(|vm| vm.run.stdout_so_far().contains("LLFREE-L2 burst-done"))
        {
            ending = true;
            vms.iter_mut().for_each(|vm| ctrl_alt_del(vm, false));
            signalled.fill(Instant::now());
        }
        for (vm, signalled) in vms.iter_mut().zip(&mut signalled) {
            // Before the end, its go shows as "burst-go"; after, the VM ends.
            let unseen = vm.run.running()
                && (ending || !vm.run.stdout_so_far().contains("LLFREE-L2 burst-go"));
            if unseen && signalled.elapsed() >= SIGNAL_AGAIN_AFTER {
                eprintln!(
                    "  {}: no sign of its Ctrl-Alt-Del after {SIGNAL_AGAIN_AFTER:?}: sent again",
                    vm.name
                );
                ctrl_alt_del(vm, true);
                *signalled = Instant::now();
            }
        }
        assert!(Instant::now() < deadline, "the bursts never ended");
        if shown.elapsed() >= Duration::from_secs(15) {
            shown = Instant::now();
            let info = zone_consistent(zone);
            eprintln!(
                "  zone: {} MiB free",
                info["free_frames"].as_u64().unwrap() * 2
            );
            for vm in &mut vms {
                let last = vm.run.stdout_so_far();
                let last = last
                    .lines()
                    .rfind(|l| l.contains("LLFREE-L2"))
                    .unwrap_or("");
                let balloon = match vm.run.running() {
                    true => get(&vm.api, "/balloon")["actual_mib"].to_string(),
                    false => "-".into(),
                };
                let waiting = info["vms"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| v["name"] == vm.name)
                    .map(|v| v["waiting"].to_string())
                    .unwrap_or_default();
                eprintln!(
                    "  {}: balloon {balloon} MiB, waiting {waiting}, {last}",
                    vm.name
                );
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    for vm in vms {
        let done = vm.run.wait(Duration::from_secs(10));
        assert!(done.stdout.contains("LLFREE-L2 burst-done"), "{done:#?}");
        assert!(!done.stdout.contains("fill-failed"), "{done:#?}");
        assert_eq!(
            done.code,
            Some(7),
            "{} rebooted when done: {done:#?}",
            vm.name
        );
    }
}

fn new_zone(scratch: &Scratch) -> String {
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "288M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    zone
}

#[test]
fn three_linux_vms_on_a_short_zone_all_finish_because_the_policy_reclaims_in_time() {
    let test = "three_linux_vms_on_a_short_zone_all_finish_because_the_policy_reclaims_in_time";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-zone-reclaim");
    let zone = new_zone(&scratch);
    let started = Instant::now();
    let mut vms: Vec<ZoneGuestVm> = Vec::new();
    let mut peak_balloon = 0;
    let mut warm_times = Vec::new();
    for name in VMS {
        let vm_started = Instant::now();
        // A generous bound: the property is that nobody waits for ever, not how fast.
        // The policy starts at a quarter of the zone free, leaving the slow (QEMU/TCG) guests
        // more time.
        let args = ["--wait-for-memory=300s", "--reclaim-below", "25"];
        let mut vm = start(&guest, &scratch, &zone, name, &args);
        if !wait_warmed(&mut vm, &mut vms, &zone, &mut peak_balloon) {
            panic!(
                "{name} ended before it warmed up: {}\n{}",
                process_state(&mut vm.run),
                vm.run.stderr_so_far()
            );
        }
        warm_times.push(vm_started.elapsed());
        eprintln!(
            "{test}: {name} warmed up after {:.1?}; zone {} MiB free",
            vm_started.elapsed(),
            free_mib(&zone)
        );
        vms.push(vm);
    }
    // What a and b held free went back through hinting (a balloon took free pages in no
    // order, untouched ones that hold no frame among them, and c starved in some runs).
    let hinted: Vec<(usize, u64)> = vms.iter().map(hinting_runs).collect();
    assert!(
        hinted[..2].iter().any(|&(_, frames)| frames > 0),
        "the policy's hinting gave nothing back, yet c found memory: {hinted:?}"
    );
    assert_eq!(
        peak_balloon, 0,
        "a balloon was inflated on guests that hint"
    );
    // The policy gives back what c held free after its warm-up, while the zone is low.
    let waited = Instant::now();
    while free_mib(&zone) < BURSTS_MIB {
        assert!(
            waited.elapsed() < BOOT_TIMEOUT,
            "the zone never had {BURSTS_MIB} MiB free again: {} MiB, hinting runs {:?}",
            free_mib(&zone),
            vms.iter().map(hinting_runs).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "{test}: {} MiB free {:.1?} after c's warm-up",
        free_mib(&zone),
        waited.elapsed()
    );
    let go = Instant::now();
    burst(&zone, vms);
    let together = started.elapsed();
    eprintln!(
        "{test}: policy on: warm-ups {warm_times:.1?} (hinting runs and frames they gave back \
         by c's warm-up: {hinted:?}), the bursts at the same moment took {:.1?}, all of it \
         {together:.1?}",
        go.elapsed()
    );
    zone_consistent(&zone);

    // The same three one after another, each alone on the zone, for comparison.
    let started = Instant::now();
    for name in VMS {
        let mut vm = start(&guest, &scratch, &zone, name, &["--wait-for-memory=300s"]);
        if !wait_warmed(&mut vm, &mut [], &zone, &mut 0) {
            panic!(
                "{name} ended before it warmed up alone: {}",
                process_state(&mut vm.run)
            );
        }
        burst(&zone, vec![vm]);
    }
    eprintln!(
        "{test}: one after another: {:.1?} (on the zone together with the policy: {together:.1?})",
        started.elapsed()
    );
    zone_consistent(&zone);
}

#[test]
fn with_the_policy_off_the_linux_vm_that_runs_the_zone_dry_ends_with_status_8() {
    let test = "with_the_policy_off_the_linux_vm_that_runs_the_zone_dry_ends_with_status_8";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("linux-zone-no-reclaim");
    let zone = new_zone(&scratch);
    let mut vms: Vec<ZoneGuestVm> = Vec::new();
    for name in ["a", "b"] {
        // A guest touches memory now and then while idle, and c runs the zone dry: a touch of
        // a new frame then waits until c has ended and its frames are back.
        let args = ["--reclaim-below", "0", "--wait-for-memory"];
        let mut vm = start(&guest, &scratch, &zone, name, &args);
        if !wait_warmed(&mut vm, &mut [], &zone, &mut 0) {
            panic!(
                "{name} ended before it warmed up alone: {}",
                process_state(&mut vm.run)
            );
        }
        vms.push(vm);
    }
    let started = Instant::now();
    let mut c = start(
        &guest,
        &scratch,
        &zone,
        "c",
        &["--reclaim-below", "0", "--wait-for-memory=20s"],
    );
    assert!(
        !wait_warmed(&mut c, &mut vms, &zone, &mut 0),
        "c warmed up: nothing was short"
    );
    let ended = c.run.wait(Duration::from_secs(60));
    assert_eq!(ended.code, Some(8), "{ended:#?}");
    assert!(
        ended
            .stderr
            .contains(&format!("zone {zone} of 288 MiB, 0 bytes free")),
        "{ended:#?}"
    );
    eprintln!(
        "{test}: c ended with status 8 after {:.1?}: {}",
        started.elapsed(),
        ended.stderr.lines().last().unwrap_or_default()
    );
    for vm in &vms {
        assert_eq!(get(&vm.api, "/balloon")["actual_mib"], 0, "left alone");
    }
    burst(&zone, vms);
    zone_consistent(&zone);
}
