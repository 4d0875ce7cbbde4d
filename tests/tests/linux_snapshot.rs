//! End-to-end: a real Linux is snapshotted and resumed in another VMM process. Its init counts
//! in userspace (writing each count to an ext4 `-o dax` file system on virtio-pmem and syncing
//! it); the VM, in a zone with a balloon, is paused, snapshotted into its zone, and its VMM
//! killed; a fresh `vmm --api-sock` loads the snapshot and resumes it. The count goes on from
//! where it stood, the guest's clock goes on from where it stood (no jump, still running), its
//! syncs still reach the pmem device, and its balloon driver still follows a new target. A VM
//! that tracks dirty pages takes a full snapshot, counts on, takes a diff; merged onto the full
//! one's memory file, the diff loads (its memory verified) and the count goes on from the diff.
//! A copy snapshot loaded through Firecracker's Uffd backend counts on, every page it touches
//! served by a page-fault handler of the test's (`e2e_tests::page_fault_handler`).
//! (See linux_common for the guest and where this runs.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use e2e_tests::page_fault_handler::PageFaultHandler;
use linux_common::{cmdline, field, LinuxGuest, BOOT_TIMEOUT};
use vmm_common::{client, get, rebase_snapshot, send, start_snapshot_load, Scratch, VmmRun};

/// The balloon target set after the restore, in MiB.
const TARGET_MIB: u64 = 64;

/// (count, uptime, free KiB) of every whole `count` line in `stdout`.
fn counts(stdout: &str) -> Vec<(u64, f64, u64)> {
    stdout
        .lines()
        .filter_map(|line| line.find("LLFREE-L2 count ").map(|at| &line[at..]))
        .filter_map(|line| {
            Some((
                field(line, "n")?.parse().ok()?,
                field(line, "uptime")?.parse().ok()?,
                field(line, "free_kib")?.parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn a_linux_guest_counts_on_across_a_snapshot_into_a_new_vmm_process() {
    let name = "a_linux_guest_counts_on_across_a_snapshot_into_a_new_vmm_process";
    let Some(guest) = LinuxGuest::find(name) else {
        return;
    };
    let scratch = Scratch::new("linux-snapshot");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "512M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let (socket, snapshot) = (scratch.path("api.sock"), scratch.path("vm.snap"));
    let line = cmdline("llfree.test=counter");
    let args = [
        "--zone",
        &zone,
        "--vm",
        "counter",
        "--memory",
        "256M",
        "--pmem",
        "64M",
        "--balloon",
        "deflate_on_oom=on",
        "--cmdline",
        &line,
        "--api-socket",
        &socket,
    ];
    let mut first = VmmRun::start(&guest.args(&args));
    first.wait_for_line("LLFREE-L2 count n=5 ", BOOT_TIMEOUT);
    let api = first.api(&socket);
    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    let flushes_before = get(&api, "/memory")["pmem"]["flushes"].as_u64().unwrap();
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{zone}"}}"#);
    let started = Instant::now();
    send(&api, "PUT", "/snapshot/create", &body);
    eprintln!(
        "snapshot created in {:?} (as the client saw it)",
        started.elapsed()
    );
    let killed = first.kill();
    let before = counts(&killed.stdout);
    let &(last, last_uptime, free_before) = before.last().expect("counts before");
    assert!(last >= 5, "{before:?}");
    let _ = std::fs::remove_file(&socket);

    let mut second = VmmRun::start_command(&["--api-sock", &socket]);
    let api = second.api(&socket);
    let load = format!(
        r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{zone}"}},"resume_vm":true}}"#
    );
    let started = Instant::now();
    send(&api, "PUT", "/snapshot/load", &load);
    eprintln!(
        "snapshot loaded in {:?} (as the client saw it)",
        started.elapsed()
    );
    second.wait_for_line(&format!("LLFREE-L2 count n={} ", last + 3), BOOT_TIMEOUT);

    // The guest's syncs still reach the pmem device of the new process.
    let flushes = get(&api, "/memory")["pmem"]["flushes"].as_u64().unwrap();
    assert!(flushes >= 2, "pmem flushes after the restore: {flushes}");
    // Its balloon driver follows a new target.
    send(
        &api,
        "PATCH",
        "/balloon",
        &format!(r#"{{"amount_mib":{TARGET_MIB}}}"#),
    );
    let deadline = Instant::now() + BOOT_TIMEOUT;
    while get(&api, "/balloon")["actual_mib"] != TARGET_MIB {
        assert!(Instant::now() < deadline, "{:#}", get(&api, "/balloon"));
        std::thread::sleep(Duration::from_millis(200));
    }
    // A few more rounds with the balloon inflated.
    let now = counts(&second.stdout_so_far())
        .last()
        .map_or(last, |count| count.0);
    second.wait_for_line(&format!("LLFREE-L2 count n={} ", now + 3), BOOT_TIMEOUT);
    send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    let run = second.wait(Duration::from_secs(60));
    let after = counts(&run.stdout);
    eprintln!(
        "counted to {last} before the snapshot, on from {:?} after it; {flushes_before} pmem \
         flushes before, {flushes} after",
        after.first()
    );

    // The count goes on: the first whole line is the one being printed at the pause, or the next.
    let &(first_after, first_uptime, _) = after.first().expect("counts after");
    assert!(
        first_after == last || first_after == last + 1,
        "counted {last} before, {first_after} first after"
    );
    assert!(after.windows(2).all(|w| w[1].0 == w[0].0 + 1), "{after:?}");
    // The clock goes on from where it stood, and runs.
    assert!(
        first_uptime >= last_uptime && first_uptime < last_uptime + 30.0,
        "uptime {last_uptime} before, {first_uptime} after"
    );
    let &(_, final_uptime, free_after) = after.last().unwrap();
    assert!(final_uptime > first_uptime, "{after:?}");
    // The balloon took its pages from the guest.
    assert!(
        free_after + (TARGET_MIB - 8) * 1024 <= free_before,
        "free {free_before} KiB before, {free_after} KiB with the balloon at {TARGET_MIB} MiB"
    );
}

/// The last count in `stdout`.
fn last_count(stdout: &str) -> u64 {
    counts(stdout).last().expect("counts").0
}

#[test]
fn a_linux_guest_counts_on_from_a_diff_snapshot_merged_onto_its_full_one() {
    let name = "a_linux_guest_counts_on_from_a_diff_snapshot_merged_onto_its_full_one";
    let Some(guest) = LinuxGuest::find(name) else {
        return;
    };
    let scratch = Scratch::new("linux-snapshot-diff");
    let socket = scratch.path("api.sock");
    let (base, base_memory) = (scratch.path("base.snap"), scratch.path("base.mem"));
    let (diff, diff_memory) = (scratch.path("diff.snap"), scratch.path("diff.mem"));
    let line = cmdline("llfree.test=counter llfree.pmem=off");
    let args = [
        "--memory",
        "256M",
        "--track-dirty-pages",
        "--cmdline",
        &line,
        "--api-socket",
        &socket,
    ];
    let mut vmm = VmmRun::start(&guest.args(&args));
    vmm.wait_for_line("LLFREE-L2 count n=3 ", BOOT_TIMEOUT);
    let api = vmm.api(&socket);
    let snapshot = |kind: &str, path: &str, memory: &str| {
        send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
        let body = format!(
            r#"{{"snapshot_type":"{kind}","snapshot_path":"{path}","mem_file_path":"{memory}"}}"#
        );
        let started = Instant::now();
        send(&api, "PUT", "/snapshot/create", &body);
        let took = started.elapsed();
        let data = std::fs::metadata(memory).unwrap().blocks() * 512;
        eprintln!(
            "{name}: {kind} snapshot in {took:.1?}, {} KiB of data",
            data >> 10
        );
        data
    };
    let full = snapshot("Full", &base, &base_memory);
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let at_full = last_count(&vmm.stdout_so_far());
    vmm.wait_for_line(&format!("LLFREE-L2 count n={} ", at_full + 3), BOOT_TIMEOUT);
    let dirty = snapshot("Diff", &diff, &diff_memory);
    let at_diff = last_count(&vmm.kill().stdout);
    assert!(
        dirty * 4 < full,
        "the diff holds {dirty} bytes, the full snapshot {full}"
    );
    rebase_snapshot(&base_memory, &diff_memory);
    let mut loaded = start_snapshot_load(&diff, &base_memory, &["--verify-memory"]);
    loaded.wait_for_line(&format!("LLFREE-L2 count n={} ", at_diff + 3), BOOT_TIMEOUT);
    let after = counts(&loaded.kill().stdout);
    let first = after.first().expect("counts after the load").0;
    assert!(
        first == at_diff || first == at_diff + 1,
        "counted {at_diff} at the diff, {first} first after its load"
    );
}

#[test]
fn a_linux_guest_counts_on_with_its_memory_served_by_a_page_fault_handler() {
    let name = "a_linux_guest_counts_on_with_its_memory_served_by_a_page_fault_handler";
    let Some(guest) = LinuxGuest::find(name) else {
        return;
    };
    let scratch = Scratch::new("linux-uffd");
    let (socket, snapshot, memory) = (
        scratch.path("api.sock"),
        scratch.path("vm.snap"),
        scratch.path("vm.mem"),
    );
    let line = cmdline("llfree.test=counter llfree.pmem=off");
    let args = [
        "--memory",
        "256M",
        "--cmdline",
        &line,
        "--api-socket",
        &socket,
    ];
    let mut first = VmmRun::start(&guest.args(&args));
    first.wait_for_line("LLFREE-L2 count n=3 ", BOOT_TIMEOUT);
    let api = first.api(&socket);
    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    let body = format!(
        r#"{{"snapshot_type":"Full","snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#
    );
    send(&api, "PUT", "/snapshot/create", &body);
    let last = last_count(&first.kill().stdout);
    let _ = std::fs::remove_file(&socket);

    let uffd_socket = scratch.path("uffd.sock");
    let handler = PageFaultHandler::listen(&uffd_socket, &memory);
    let mut loaded = VmmRun::start_command(&["--api-sock", &socket]);
    let api = loaded.api(&socket);
    let load = format!(
        r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"Uffd","backend_path":"{uffd_socket}"}},"resume_vm":true}}"#
    );
    send(&api, "PUT", "/snapshot/load", &load);
    loaded.wait_for_line(&format!("LLFREE-L2 count n={} ", last + 3), BOOT_TIMEOUT);
    let run = loaded.kill();
    let served = handler.finish();
    eprintln!("{name}: counted to {last} before, served {served:?}");
    let after = counts(&run.stdout);
    let &(first_after, _, _) = after.first().expect("counts after");
    assert!(
        first_after == last || first_after == last + 1,
        "counted {last} before, {first_after} first after"
    );
    assert!(after.windows(2).all(|w| w[1].0 == w[0].0 + 1), "{after:?}");
    // The kernel, its page tables and the counting program ran on pages the handler copied in.
    assert_eq!(served.page_size, 4096);
    assert!(served.faults >= 100, "{served:?}");
}
