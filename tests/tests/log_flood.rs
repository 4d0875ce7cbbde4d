//! End-to-end: a guest cannot flood the host's log. The test guest breaks its balloon's inflate
//! queue 20,000 times (an available index beyond the queue size), waits each time for the
//! device to ask for a reset, and resets and probes it again: every event is logged by the VMM,
//! and the rate limit shows 10 of them and one summary of the rest.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use e2e_tests::kvm_available;
use vmm_common::VmmRun;

const BREAKS: u64 = 20_000;

#[test]
fn a_guest_that_breaks_its_balloon_queue_20000_times_writes_a_few_lines() {
    if !kvm_available("a_guest_that_breaks_its_balloon_queue_20000_times_writes_a_few_lines") {
        return;
    }
    let workload = format!("break-balloon*{BREAKS}");
    let run = VmmRun::run(&[
        "--memory",
        "64M",
        "--balloon",
        "size=0",
        "--workload",
        &workload,
    ]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    eprintln!(
        "{BREAKS} broken-queue events: {} lines, {} bytes on stderr",
        lines.len(),
        run.stderr.len()
    );
    let broken = |line: &&&str| line.contains("balloon queue 0 is broken");
    assert_eq!(lines.iter().filter(broken).count(), 11, "{run:#?}");
    let summary = lines.last().expect("a summary");
    assert!(
        summary.contains(&format!("{} similar messages not shown", BREAKS - 10))
            && summary.contains("rate-limited"),
        "{run:#?}"
    );
}
