//! End-to-end: free page reporting from the test guest returns exactly the reported 2 MiB
//! frames to the pool, and a re-touch repopulates them with zeroes.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod balloon_common;

use std::time::Instant;

use balloon_common::{free_trees, guest_memory, pool_free, probed_workload, run_sampled, MIB};
use e2e_tests::kvm_available;
use vm_memory::GuestAddress;
use vmm::testguest::protocol::WORKLOAD_MIN_ADDR;

#[test]
fn reporting_512m_of_2m_aligned_ranges_returns_exactly_those_frames() {
    if !kvm_available("reporting_512m_of_2m_aligned_ranges_returns_exactly_those_frames") {
        return;
    }
    let ram = 800 * MIB;
    let memory = guest_memory(ram, 1024 * MIB, 1);
    let pattern = 0x4e90_0000_0000_0001;
    // One range 4 MiB aligned, one only 2 MiB aligned: its descriptors start with a 2 MiB one.
    let reported = [(256 * MIB, 256 * MIB), (514 * MIB, 256 * MIB)];
    let mut workload = probed_workload(ram, pattern);
    for (addr, size) in reported {
        workload = workload.report(addr, size);
    }
    workload = workload.checkpoint(2);
    for (addr, size) in reported {
        workload = workload.verify_zero(addr, size);
    }
    let kept = [
        (WORKLOAD_MIN_ADDR, 254 * MIB),
        (512 * MIB, 2 * MIB),
        (770 * MIB, 30 * MIB),
    ];
    for (addr, size) in kept {
        workload = workload.verify(addr, size, pattern);
    }

    let (run, seen) = run_sampled(&memory, &workload, move |id, memory| {
        let stats = memory.pool().stats();
        let populated = memory.stats().populated_chunks;
        let now = Instant::now();
        if id == 2 {
            for chunk in (256..512).step_by(2).chain((514..770).step_by(2)) {
                let addr = GuestAddress(chunk * MIB);
                assert_eq!(memory.frame_at(addr), None, "{addr:?} reported");
            }
            for (addr, _) in kept {
                assert!(memory.frame_at(GuestAddress(addr)).is_some());
            }
        }
        (stats, populated, now)
    });
    assert!(run.report.success(), "{:#?}", run.report);
    assert_eq!(run.report.pages(3) + run.report.pages(4), 512 * 256);
    let [(before, populated_before, t1), (after, populated_after, t2)] = &seen[..] else {
        panic!("two checkpoints expected: {}", seen.len());
    };
    assert_eq!(after.free_bytes - before.free_bytes, 512 * MIB);
    assert_eq!(after.free_huge - before.free_huge, 256);
    assert_eq!(populated_before - populated_after, 256);
    eprintln!(
        "report 512 MiB from the guest (probe, 128 ranges of 4 MiB in chains of 32): {:?}; \
         pool trees entirely free: {} -> {}",
        *t2 - *t1,
        free_trees(before),
        free_trees(after)
    );
    assert!(free_trees(after) >= free_trees(before) + 7);

    let info = run.balloon.info();
    assert_eq!(info.counters.report_freed_frames, 256);
    assert_eq!(info.counters.reported_bytes, 512 * MIB);
    // Adjacent ranges of a chain are merged: two chains for the first range, three for the
    // second (2 MiB + 63 x 4 MiB + 2 MiB).
    assert_eq!(info.counters.reported_ranges, 5);
    assert_eq!(info.violations.total(), 0, "{:?}", info.violations);
    // The verifications re-touched every reported chunk: frames came back from the pool.
    assert_eq!(pool_free(&memory), before.free_bytes);
}
