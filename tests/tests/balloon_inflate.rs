//! End-to-end: the test guest inflates and deflates a virtio-balloon on lazily populated
//! guest-mem memory (2 MiB frames from an anonymous LLFree pool), in a real KVM VM.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod balloon_common;

use std::time::{Duration, Instant};

use balloon_common::{
    balloon_base, balloon_config, free_trees, guest_memory, pool_free, probed_workload, run,
    run_sampled, MIB,
};
use e2e_tests::kvm_available;
use vmm::testguest::protocol::{BALLOON_DRIVER_FEATURES, WORKLOAD_MIN_ADDR};
use vmm::testguest::Workload;

#[test]
fn inflating_256m_frees_the_inflated_chunks_and_deflated_pages_come_back_zeroed() {
    if !kvm_available(
        "inflating_256m_frees_the_inflated_chunks_and_deflated_pages_come_back_zeroed",
    ) {
        return;
    }
    let ram = 512 * MIB;
    let memory = guest_memory(ram, 640 * MIB, 1);
    let pattern = 0xba11_0000_0000_0001;
    let workload = probed_workload(ram, pattern)
        .inflate(256 * MIB)
        .checkpoint(2)
        .deflate(256 * MIB)
        .verify_zero(256 * MIB, 256 * MIB)
        .verify(WORKLOAD_MIN_ADDR, 254 * MIB, pattern);
    let (run, seen) = run_sampled(&memory, &workload, |_, memory| {
        (memory.pool().stats(), Instant::now())
    });
    assert!(run.report.success(), "{:#?}", run.report);
    assert_eq!(run.report.pages(3), 65536);
    let [(populated, t1), (inflated, t2)] = &seen[..] else {
        panic!("two checkpoints expected: {}", seen.len());
    };
    // Every inflated chunk is entirely given away: all 128 frames are back, as huge frames.
    let freed = inflated.free_bytes - populated.free_bytes;
    assert!(freed >= 128 * 2 * MIB, "freed {freed:#x}");
    assert_eq!(inflated.free_huge - populated.free_huge, 128);
    eprintln!(
        "inflate 256 MiB in the guest (probe, 256 buffers of 256 PFNs): {:?}; pool trees \
         entirely free: {} -> {}",
        *t2 - *t1,
        free_trees(populated),
        free_trees(inflated)
    );
    assert!(free_trees(inflated) >= free_trees(populated) + 3);

    let info = run.balloon.info();
    assert_eq!(info.counters.inflate_freed_frames, 128);
    assert_eq!(info.counters.deflated_pages, 65536);
    assert_eq!(info.counters.inflated_pages, 0);
    assert_eq!(info.actual_pages, 0);
    assert_eq!(info.violations.total(), 0, "{:?}", info.violations);
    // The re-touch after deflation repopulated the 128 chunks from the pool.
    assert_eq!(memory.stats().given_away_pieces, 0);
    assert_eq!(pool_free(&memory), populated.free_bytes);
}

#[test]
fn the_guest_follows_the_target_and_answers_statistics_requests() {
    if !kvm_available("the_guest_follows_the_target_and_answers_statistics_requests") {
        return;
    }
    let ram = 128 * MIB;
    let memory = guest_memory(ram, 256 * MIB, 2);
    let config = virtio_balloon::BalloonConfig {
        target_pages: virtio_balloon::pages_from_mib(40).unwrap(),
        ..balloon_config()
    };
    let workload = Workload::new()
        .write(WORKLOAD_MIN_ADDR, ram - WORKLOAD_MIN_ADDR, 7)
        .balloon_probe(balloon_base(), ram, BALLOON_DRIVER_FEATURES)
        .balloon_to_target()
        .checkpoint(1)
        .balloon_to_target()
        .on_vcpu(1)
        .balloon_stats(3)
        .verify_zero(88 * MIB, 24 * MIB)
        .verify(WORKLOAD_MIN_ADDR, 86 * MIB, 7);
    let run = run(
        &memory,
        2,
        config,
        &workload,
        Some(Box::new(|_, balloon| {
            assert_eq!(balloon.info().actual_pages, 40 * 256);
            balloon.set_target_mib(16).unwrap();
        })),
    );
    assert!(run.report.success(), "{:#?}", run.report);
    assert_eq!(run.report.pages(2), 40 * 256);
    assert_eq!(
        run.report.vcpus[1].steps[4].pages,
        24 * 256,
        "vCPU 1 deflated"
    );
    let info = run.balloon.info();
    assert_eq!((info.target_pages, info.actual_pages), (16 * 256, 16 * 256));
    assert_eq!(info.counters.inflated_pages, 16 * 256);
    assert_eq!(info.counters.inflate_freed_frames, 20);
    assert!(info.counters.stats_updates >= 4, "{:?}", info.counters);
    assert_eq!(info.stats.total_memory, Some(ram));
    let area = ram - WORKLOAD_MIN_ADDR;
    assert_eq!(info.stats.free_memory, Some(area - 16 * MIB));
    assert_eq!(info.stats.available_memory, Some(area - 16 * MIB));
    assert_eq!(
        run.balloon.stats_interval(),
        Some(Duration::from_millis(50))
    );
}
