//! End-to-end: one snapshot of a real Linux in a zone bases clones that run at once, each a new
//! machine to its kernel. The guest's init counts in userspace; paused, it is snapshotted into
//! its zone and its VMM killed. Four VMMs load the snapshot at once, each as a clone of its own
//! name (mapping the base's frames privately): each kernel goes on counting from where the base
//! stood, side by side. Each finds a VM generation id of its own, different from the base's
//! and every other clone's, and its vmgenid driver, bound since the base booted, reseeds the
//! random pool for the VM fork. Once the clones are gone, the zone has lost and leaked nothing
//! and holds the base alone, and the base loads as itself, counts on from its own count (no
//! clone's run reached its memory) and gets a new id too. (See linux_common for the guest and
//! where this runs.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use linux_common::{cmdline, field, LinuxGuest, BOOT_TIMEOUT};
use vmm_common::{client, send, start_snapshot_load, zone_consistent, Scratch, VmmRun};

const CLONES: usize = 4;

/// What a count line says of the VM's identity: its generation id and how often its kernel
/// reseeded for a VM fork.
fn identity(line: &str) -> (String, u32) {
    let genid = field(line, "genid").unwrap_or_else(|| panic!("no genid in {line:?}"));
    assert_eq!(genid.len(), 32, "a 16-byte id: {line:?}");
    let forks = field(line, "forks").and_then(|n| n.parse().ok());
    (
        genid.to_owned(),
        forks.unwrap_or_else(|| panic!("no forks in {line:?}")),
    )
}

/// Every whole count in `stdout`.
fn counts(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter_map(|line| line.find("LLFREE-L2 count ").map(|at| &line[at..]))
        .filter_map(|line| field(line, "n")?.parse().ok())
        .collect()
}

/// Asserts that `after` goes on from `last` in steps of one (its first line is the one being
/// printed at the pause, or the next).
fn assert_counts_on(who: &str, last: u64, after: &[u64]) {
    let first = *after.first().unwrap_or_else(|| panic!("{who}: no count"));
    assert!(
        first == last || first == last + 1,
        "{who}: counted {last} before the snapshot, {first} first after"
    );
    assert!(
        after.windows(2).all(|w| w[1] == w[0] + 1),
        "{who}: {after:?}"
    );
}

#[test]
fn clones_of_one_linux_snapshot_count_on_side_by_side_and_leave_the_base_as_it_was() {
    let name = "clones_of_one_linux_snapshot_count_on_side_by_side_and_leave_the_base_as_it_was";
    let Some(guest) = LinuxGuest::find(name) else {
        return;
    };
    let scratch = Scratch::new("linux-clones");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "512M", "--max-vms", "8"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let (socket, snapshot) = (scratch.path("api.sock"), scratch.path("vm.snap"));
    let line = cmdline(&format!(
        "llfree.test=counter llfree.pmem=off llfree.vmgenid={:#x}",
        vmm::layout::VMGENID_START
    ));
    let args = [
        "--zone",
        &zone,
        "--vm",
        "counter",
        "--memory",
        "256M",
        "--cmdline",
        &line,
        "--api-socket",
        &socket,
    ];
    let mut base = VmmRun::start(&guest.args(&args));
    let bound = base.wait_for_line("LLFREE-L2 vmgenid ", BOOT_TIMEOUT);
    assert_eq!(field(&bound, "bound"), Some("1"), "{bound:?}");
    let (base_id, base_forks) = identity(&base.wait_for_line("LLFREE-L2 count n=3 ", BOOT_TIMEOUT));
    assert_eq!(base_forks, 0, "a booted VM is no fork");
    let api = base.api(&socket);
    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{zone}"}}"#);
    send(&api, "PUT", "/snapshot/create", &body);
    let last = *counts(&base.kill().stdout).last().expect("counts before");

    let mut clones: Vec<VmmRun> = (0..CLONES)
        .map(|index| {
            let clone = format!("clone-{index}");
            start_snapshot_load(&snapshot, &zone, &["--clone", &clone])
        })
        .collect();
    let mut ids = vec![base_id.clone()];
    for (index, clone) in clones.iter_mut().enumerate() {
        // The notification reaches the driver from a work queue: soon after the resume.
        let line = clone.wait_for_line(" forks=1 ", BOOT_TIMEOUT);
        let (id, _) = identity(&line);
        assert!(!ids.contains(&id), "clone-{index} has id {id}, as {ids:?}");
        println!("clone-{index}: generation id {id} (the base's {base_id}), reseeded for the fork");
        ids.push(id);
        clone.wait_for_line(&format!("LLFREE-L2 count n={} ", last + 3), BOOT_TIMEOUT);
    }
    for (index, clone) in clones.into_iter().enumerate() {
        let run = clone.kill();
        assert_counts_on(&format!("clone-{index}"), last, &counts(&run.stdout));
    }

    // The killed clones went with their own frames when the zone was opened again.
    let info = zone_consistent(&zone);
    let vms: Vec<&str> = info["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vm| vm["name"].as_str().unwrap())
        .collect();
    assert_eq!(vms, ["counter"], "{info:#}");
    let mut again = start_snapshot_load(&snapshot, &zone, &[]);
    let (id, _) = identity(&again.wait_for_line(" forks=1 ", BOOT_TIMEOUT));
    assert!(
        !ids.contains(&id),
        "the base loaded again has id {id}, as {ids:?}"
    );
    again.wait_for_line(&format!("LLFREE-L2 count n={} ", last + 2), BOOT_TIMEOUT);
    assert_counts_on("the base", last, &counts(&again.kill().stdout));
}
