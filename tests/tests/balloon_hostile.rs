//! End-to-end: a hostile balloon driver in the test guest. Page numbers outside RAM and in the
//! MMIO gap, unaligned, zero-length and oversized reports, over-long chains, wrong read/write
//! flags, duplicate inflation and deflation of pages never inflated are all ignored and counted;
//! the VMM stays alive, no frame goes back to the pool and no page outside them changes.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod balloon_common;

use balloon_common::{guest_memory, pool_free, probed_workload, run_sampled, MIB};
use e2e_tests::kvm_available;
use vmm::layout::MMIO_GAP_START;
use vmm::testguest::protocol::WORKLOAD_MIN_ADDR;
use vmm::testguest::workload::RawChain;

const INFLATE: u8 = 0;
const DEFLATE: u8 = 1;
const REPORTING: u8 = 3;

/// One descriptor with the page frame numbers of `pages` pages from `addr`.
fn pfns(queue: u8, addr: u64, pages: u64) -> RawChain {
    RawChain {
        queue,
        count: 1,
        writable: false,
        pfn_buffer: true,
        addr,
        size: pages * 4096,
    }
}

/// `count` device-writable ranges of `size` bytes from `addr`.
fn ranges(addr: u64, size: u64, count: u16) -> RawChain {
    RawChain {
        queue: REPORTING,
        count,
        writable: true,
        pfn_buffer: false,
        addr,
        size,
    }
}

#[test]
fn hostile_driver_input_is_ignored_and_counted() {
    if !kvm_available("hostile_driver_input_is_ignored_and_counted") {
        return;
    }
    let ram = 64 * MIB;
    let memory = guest_memory(ram, 128 * MIB, 1);
    let pattern = 0xbad_0000_0000_0001;
    let chains = [
        pfns(INFLATE, ram, 16),             // beyond RAM
        pfns(INFLATE, MMIO_GAP_START, 16),  // the MMIO gap, the balloon's own registers
        pfns(INFLATE, u64::MAX - 0xfff, 1), // a page number that truncates to 32 bits
        RawChain {
            writable: true, // a device-writable page frame buffer
            ..pfns(INFLATE, 8 * MIB, 16)
        },
        pfns(INFLATE, 10 * MIB, 16),
        pfns(INFLATE, 10 * MIB, 16), // duplicate inflation
        pfns(DEFLATE, 12 * MIB, 16), // never inflated
        RawChain {
            writable: false, // a device-readable reported range
            ..ranges(16 * MIB, 2 * MIB, 1)
        },
        ranges(20 * MIB + 1, 4096, 1),             // unaligned
        ranges(20 * MIB, 0, 1),                    // zero length
        ranges(MMIO_GAP_START, 2 * MIB, 1),        // MMIO
        ranges(ram, 2 * MIB, 1),                   // beyond RAM
        ranges(ram - 2 * MIB, 4 * MIB, 1),         // runs past the end
        ranges(WORKLOAD_MIN_ADDR, 0xffff_f000, 1), // 4 GiB over RAM and the gap
        ranges(40 * MIB, 4096, 100),               // too long: the first 64 ranges count
        RawChain {
            count: 100, // too long, and 99 duplicates of one page
            ..pfns(INFLATE, 44 * MIB, 1)
        },
        pfns(DEFLATE, 10 * MIB, 16),
    ];
    let mut workload = probed_workload(ram, pattern);
    for chain in chains {
        workload = workload.balloon_raw(chain);
    }
    // Pages that were inflated (and deflated again) or reported read zero; the others keep
    // their values.
    for (addr, size) in [
        (WORKLOAD_MIN_ADDR, 8 * MIB),
        (11 * MIB, 29 * MIB),
        (48 * MIB, 16 * MIB),
    ] {
        workload = workload.verify(addr, size, pattern);
    }
    for (addr, size) in [
        (10 * MIB, 16 * 4096),
        (40 * MIB, 64 * 4096),
        (44 * MIB, 4096),
    ] {
        workload = workload.verify_zero(addr, size);
    }
    let (run, free) = run_sampled(&memory, &workload, |_, memory| pool_free(memory));
    assert!(run.report.success(), "{:#?}", run.report);
    let info = run.balloon.info();
    let v = info.violations;
    assert_eq!(v.outside_ram, 16 + 16 + 1 + 4, "{v:?}");
    assert_eq!(v.wrong_direction, 2, "{v:?}");
    assert_eq!(v.misaligned, 1, "{v:?}");
    assert_eq!(v.zero_length, 1, "{v:?}");
    assert_eq!(v.chain_too_long, 2, "{v:?}");
    assert_eq!(v.duplicate_inflation, 16 + 63, "{v:?}");
    assert_eq!(v.not_inflated, 16, "{v:?}");
    assert!(!info.needs_reset);
    assert_eq!(
        info.counters.backend_errors, 0,
        "only RAM reached the backend"
    );
    assert_eq!(info.counters.inflated_pages, 1, "the page at 44 MiB");
    assert_eq!(info.counters.reported_bytes, 64 * 4096);
    assert_eq!(
        info.counters.inflate_freed_frames + info.counters.report_freed_frames,
        0
    );
    assert_eq!(
        pool_free(&memory),
        *free.last().expect("a checkpoint"),
        "no frame changed hands"
    );
}
