//! End-to-end: one snapshot of a real Linux in a zone bases clones that run at once, each a new
//! machine to its kernel. The guest's init counts in userspace; paused, it is snapshotted into
//! its zone and its VMM killed. Four VMMs load the snapshot at once, each as a clone of its own
//! name (mapping the base's frames privately): each kernel goes on counting from where the base
//! stood, side by side. Each finds a VM generation id of its own, different from the base's
//! and every other clone's, and its vmgenid driver, bound since the base booted, reseeds the
//! random pool for the VM fork. Once the clones are gone, the zone has lost and leaked nothing
//! and holds the base alone, and the base loads as itself, counts on from its own count (no
//! clone's run reached its memory) and gets a new id too.
//!
//! And as a code sandbox restores one snapshot many times: four clones of one copy snapshot of
//! a Linux with a network interface and MMDS, loaded at once through Firecracker's API, each
//! on a tap of its own (`network_overrides`) with MMDS contents of its own set before it
//! resumes; each guest, told of the fork by its new generation id, takes its MAC and address
//! from MMDS and answers on its tap. (See linux_common for the guest and where this runs.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use linux_common::{
    add_tap, cmdline, field, private_network, run_tool, start_networked, LinuxGuest, NetworkedVm,
    BOOT_TIMEOUT,
};
use serde_json::json;
use vmm_common::{
    client, load_all_at_once, send, start_snapshot_load, zone_consistent, Scratch, VmmRun,
};

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

/// The MAC and address of clone `index` (its tap's host side is `.1` of the same /24).
fn clone_network(index: usize) -> (String, String) {
    (
        format!("06:00:0a:00:{:02x}:02", 20 + index),
        format!("10.0.{}.2", 20 + index),
    )
}

#[test]
fn clones_of_one_snapshot_each_take_their_tap_and_mmds_identity_and_answer_on_their_own_address() {
    let name = "clones_of_one_snapshot_each_take_their_tap_and_mmds_identity_and_answer";
    let Some(guest) = LinuxGuest::find(name) else {
        return;
    };
    let scratch = Scratch::new("linux-clones-net");
    private_network();
    add_tap("tap-base", "10.0.10.1/24");
    for index in 0..CLONES {
        add_tap(
            &format!("tap-clone{index}"),
            &format!("10.0.{}.1/24", 20 + index),
        );
    }
    let (socket, snapshot, memory) = (
        scratch.path("base.sock"),
        scratch.path("vm.snap"),
        scratch.path("vm.mem"),
    );
    let mut base = VmmRun::start_command(&["--api-sock", &socket]);
    let api = base.api(&socket);
    let boot_args = cmdline(&format!(
        "llfree.test=clone-net llfree.ip=10.0.10.2 llfree.vmgenid={:#x}",
        vmm::layout::VMGENID_START
    ));
    let mmds_identity =
        |mac: &str, ip: &str| json!({"latest": {"meta-data": {"mac": mac, "ip": ip}}});
    let vm = NetworkedVm {
        cmdline: &boot_args,
        tap: "tap-base",
        mac: "06:00:0a:00:0a:02",
        mmds_version: "V1",
        mmds: mmds_identity("06:00:0a:00:0a:02", "10.0.10.2"),
    };
    start_networked(&api, &guest, vm);
    base.wait_for_line("LLFREE-L2 clone-net-ready", BOOT_TIMEOUT);
    run_tool("ping", "-c 1 -W 30 10.0.10.2");
    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#);
    send(&api, "PUT", "/snapshot/create", &body);
    let base_run = base.kill();
    let base_id = base_run
        .stdout
        .lines()
        .find_map(|line| field(line, "genid"))
        .map(str::to_owned);
    assert_eq!(base_id, None, "the base was never told of a fork");

    let loads: Vec<(String, String)> = (0..CLONES)
        .map(|index| {
            let body = json!({
                "snapshot_path": snapshot,
                "mem_backend": {"backend_type": "File", "backend_path": memory},
                "network_overrides": [{"iface_id": "eth0", "host_dev_name": format!("tap-clone{index}")}],
                "resume_vm": false,
            });
            (scratch.path(&format!("clone{index}.sock")), body.to_string())
        })
        .collect();
    let mut clones = load_all_at_once(&loads);
    for (index, (_, api)) in clones.iter().enumerate() {
        let (mac, ip) = clone_network(index);
        send(api, "PUT", "/mmds", &mmds_identity(&mac, &ip).to_string());
        send(api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    }
    let mut ids = Vec::new();
    for (index, (clone, _)) in clones.iter_mut().enumerate() {
        let (mac, ip) = clone_network(index);
        let line = clone.wait_for_line("LLFREE-L2 clone-net forks=1 ", BOOT_TIMEOUT);
        assert_eq!(
            field(&line, "mac"),
            Some(mac.as_str()),
            "clone {index}: {line:?}"
        );
        assert_eq!(
            field(&line, "ip"),
            Some(ip.as_str()),
            "clone {index}: {line:?}"
        );
        let id = field(&line, "genid").unwrap_or_default().to_owned();
        assert!(
            id.len() == 32 && !ids.contains(&id),
            "clone {index}: {id} among {ids:?}"
        );
        ids.push(id);
        // It answers on its own tap, from its own MAC.
        run_tool("ping", &format!("-c 1 -W 30 {ip}"));
        let neighbour = std::process::Command::new("ip")
            .args(["neigh", "show", &ip])
            .output()
            .expect("ip neigh");
        let neighbour = String::from_utf8_lossy(&neighbour.stdout);
        assert!(
            neighbour.contains(&mac),
            "clone {index} at {ip}: {neighbour:?}"
        );
        println!("clone {index}: {line}");
    }
    for (clone, _) in clones {
        clone.kill();
    }
}
