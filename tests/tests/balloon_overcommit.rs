//! End-to-end overcommit: two guests share a pool smaller than their RAM together. The second
//! blocks on an exhausted pool until the first reports free memory through its balloon; then
//! both finish their workloads.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod balloon_common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use balloon_common::{balloon_base, balloon_config, run, MIB};
use e2e_tests::kvm_available;
use guest_mem::{Backing, GuestMemory, MemoryConfig, Pool, PoolConfig};
use vm_memory::GuestAddress;
use vmm::testguest::protocol::{BALLOON_DRIVER_FEATURES, WORKLOAD_MIN_ADDR};
use vmm::testguest::{self, GuestReport, RunOptions, Workload};

const RAM: u64 = 192 * MIB;

fn memory(pool: &Arc<Pool>) -> Arc<GuestMemory> {
    let config = MemoryConfig::new(vec![(GuestAddress(0), RAM)], 1);
    Arc::new(GuestMemory::new(pool.clone(), config).unwrap())
}

/// Runs `workload` on `memory` without devices, its vCPU registered with the memory.
fn run_plain(memory: Arc<GuestMemory>, workload: Workload) -> GuestReport {
    let tid_memory = memory.clone();
    let options = RunOptions {
        timeout: Duration::from_secs(240),
        on_start: Some(Box::new(move |vm| {
            tid_memory.register_vcpu_tid(0, vm.vcpu_tids()[0]).unwrap();
        })),
        ..RunOptions::default()
    };
    testguest::run_with(memory, 1, &workload, options).unwrap()
}

#[test]
fn a_guest_blocked_on_an_exhausted_pool_finishes_when_another_reports_memory() {
    if !kvm_available("a_guest_blocked_on_an_exhausted_pool_finishes_when_another_reports_memory") {
        return;
    }
    // 288 MiB for 2 x 192 MiB of RAM.
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 288 * MIB)).unwrap();
    let (giver, taker) = (memory(&pool), memory(&pool));
    let area = RAM - WORKLOAD_MIN_ADDR;
    let giver_workload = Workload::new()
        .write(WORKLOAD_MIN_ADDR, area, 1)
        .checkpoint(1)
        .balloon_probe(balloon_base(), RAM, BALLOON_DRIVER_FEATURES)
        .report(64 * MIB, RAM - 64 * MIB)
        .verify(WORKLOAD_MIN_ADDR, 62 * MIB, 1);

    // At the giver's checkpoint its RAM is populated: start the taker and wait until it is
    // blocked on the exhausted pool, then let the giver report.
    let taker_report: Arc<Mutex<Option<std::thread::JoinHandle<GuestReport>>>> = Arc::default();
    let hook_report = taker_report.clone();
    let hook_taker = taker.clone();
    let blocked_for = Arc::new(Mutex::new(Duration::ZERO));
    let hook_blocked = blocked_for.clone();
    let hook = move |_, _: &_| {
        let memory = hook_taker.clone();
        let workload =
            Workload::new()
                .write(WORKLOAD_MIN_ADDR, area, 2)
                .verify(WORKLOAD_MIN_ADDR, area, 2);
        *hook_report.lock().unwrap() =
            Some(std::thread::spawn(move || run_plain(memory, workload)));
        let deadline = Instant::now() + Duration::from_secs(60);
        while hook_taker.stats().exhausted == 0 {
            assert!(
                Instant::now() < deadline,
                "the taker never ran out of memory"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let blocked = Instant::now();
        std::thread::sleep(Duration::from_millis(100));
        *hook_blocked.lock().unwrap() = blocked.elapsed();
    };
    let giver_run = run(
        &giver,
        1,
        balloon_config(),
        &giver_workload,
        Some(Box::new(hook)),
    );
    assert!(giver_run.report.success(), "{:#?}", giver_run.report);
    let taker = taker_report.lock().unwrap().take().unwrap().join().unwrap();
    assert!(taker.success(), "{taker:#?}");
    assert!(*blocked_for.lock().unwrap() >= Duration::from_millis(100));
    assert_eq!(giver_run.balloon.info().counters.report_freed_frames, 64);
    assert_eq!(pool.stats().free_bytes, 288 * MIB - 32 * 2 * MIB - RAM);
}
