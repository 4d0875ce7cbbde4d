//! End-to-end: `vmm run` boots the built-in test guest and runs its memory workload on every
//! backing (plain memory, hugetlb with 2 MiB and 1 GiB pages, a pool file), populated eagerly,
//! lazily and mapped ahead.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use e2e_tests::kvm_available;
use guest_mem::testing::HugePageReservation;
use vmm_common::{Scratch, VmmRun};

/// Runs the workload with `--populate eager`, `lazy` and `mapped`: each must pass.
fn every_population(args: &[&str]) {
    for populate in ["eager", "lazy", "mapped"] {
        let run = VmmRun::run(&[args, &["--populate", populate]].concat());
        run.assert_success();
        assert!(
            run.stdout.contains("test guest: done"),
            "--populate {populate}: {run:#?}"
        );
    }
}

#[test]
fn plain_memory_on_two_vcpus() {
    if kvm_available("plain_memory_on_two_vcpus") {
        // The default workload writes and verifies every page above 2 MiB.
        every_population(&["--memory", "64M", "--vcpus", "2", "--backing", "anon"]);
    }
}

#[test]
fn plain_memory_above_the_mmio_gap() {
    if kvm_available("plain_memory_above_the_mmio_gap") {
        // 4 GiB of RAM: 3 GiB below the gap, 1 GiB from 4 GiB on; touch both ends.
        let workload = "write:2M+8M,write:4G+8M:7,verify:2M+8M,verify:4G+8M:7,verify-zero:5112M+8M";
        every_population(&["--memory", "4G", "--workload", workload]);
    }
}

#[test]
fn ram_of_any_number_of_mib_ends_where_asked() {
    if !kvm_available("ram_of_any_number_of_mib_ends_where_asked") {
        return;
    }
    // 129 MiB in 65 frames of 2 MiB, the last half used: the guest writes and verifies all of
    // it, and has no RAM past it.
    every_population(&["--memory", "129M", "--backing", "anon"]);
    let beyond = VmmRun::run(&["--memory", "129M", "--workload", "write:128M+2M"]);
    assert_eq!(beyond.code, Some(2), "{beyond:#?}");
}

#[test]
fn a_pool_file_and_its_reuse() {
    if !kvm_available("a_pool_file_and_its_reuse") {
        return;
    }
    let scratch = Scratch::new("pool-file");
    let pool = scratch.path("pool");
    let backing = format!("file:{pool}");
    every_population(&["--memory", "32M", "--vcpus", "2", "--backing", &backing]);
    let size = std::fs::metadata(&pool).unwrap().len();
    assert!(size > 32 << 20, "header and 32 MiB of frames: {size}");
    // Clean exits gave every frame back: the pool is whole for an eager guest, and what the
    // last guest wrote is gone.
    let run = VmmRun::run(&[
        "--memory",
        "32M",
        "--backing",
        &backing,
        "--populate",
        "eager",
        "--workload",
        "verify-zero:all",
    ]);
    run.assert_success();
}

/// Reserves `count` huge pages of `kib` KiB for the test, or prints SKIP.
fn huge_pages(test: &str, kib: u64, count: u64) -> Option<HugePageReservation> {
    if !kvm_available(test) {
        return None;
    }
    match HugePageReservation::reserve(kib, count) {
        Ok(pages) => Some(pages),
        Err(why) => {
            eprintln!("SKIP: {test}: {why}");
            None
        }
    }
}

#[test]
fn hugetlb_with_2m_pages() {
    let Some(_pages) = huge_pages("hugetlb_with_2m_pages", 2048, 32) else {
        return;
    };
    every_population(&["--memory", "64M", "--vcpus", "2", "--backing", "hugetlb-2m"]);
}

#[test]
fn hugetlb_with_1g_pages() {
    let Some(_pages) = huge_pages("hugetlb_with_1g_pages", 1_048_576, 1) else {
        return;
    };
    // One 1 GiB chunk: touch a part of it (every page would take the emulator long).
    let workload = "write:2M+62M:3,verify:2M+62M:3,verify-zero:960M+64M";
    // RAM of 65 MiB in the one frame, which the VMM warns about.
    let partial = VmmRun::run(&["--memory", "65M", "--backing", "hugetlb-1g"]);
    assert!(
        partial.code == Some(0)
            && partial.stdout.contains("test guest: done")
            && partial
                .stderr
                .contains("its last 1 GiB frame is partly used"),
        "{partial:#?}"
    );
    every_population(&[
        "--memory",
        "1G",
        "--vcpus",
        "2",
        "--backing",
        "hugetlb-1g",
        "--workload",
        workload,
    ]);
}
