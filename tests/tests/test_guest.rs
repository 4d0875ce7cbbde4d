//! End-to-end: boot the built-in test guest in a real KVM VM and run memory workloads.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::sync::Arc;
use std::time::Duration;

use e2e_tests::kvm_available;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::testguest::{self, exit_code, RunOptions, TestGuestError, Workload, WorkloadError};
use vmm::vm::run_control::{RunControlError, RunState, StopReason};

const MIB: u64 = 1 << 20;
const RAM: u64 = 64 * MIB;
/// The workload area: everything above the guest's own 2 MiB.
const AREA: (u64, u64) = (2 * MIB, RAM - 2 * MIB);

fn memory() -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap())
}

fn touch_and_verify(vcpus: usize) {
    let (addr, size) = AREA;
    let workload = Workload::new()
        .write(addr, size, 0x5eed_0000_0000_0001)
        .verify(addr, size, 0x5eed_0000_0000_0001);
    let report = testguest::run(memory(), vcpus, &workload).unwrap();
    assert!(report.success(), "{report:#?}");
    assert_eq!(report.exit_code(), exit_code::SUCCESS);
    let pages = size / 4096;
    assert_eq!((report.pages(0), report.pages(1)), (pages, pages));
    assert_eq!(report.mismatches(1), 0);
    for vcpu in &report.vcpus {
        assert!(vcpu.started);
        assert_eq!(vcpu.steps[0].pages, pages / vcpus as u64, "an even split");
    }
    assert!(
        report.serial_output.contains("test guest: done"),
        "{}",
        report.serial_output
    );
}

#[test]
fn touch_and_verify_64m_on_one_vcpu() {
    if kvm_available("touch_and_verify_64m_on_one_vcpu") {
        touch_and_verify(1);
    }
}

#[test]
fn touch_and_verify_64m_on_two_vcpus() {
    if kvm_available("touch_and_verify_64m_on_two_vcpus") {
        touch_and_verify(2);
    }
}

#[test]
fn a_wrong_pattern_fails_verification_with_the_first_bad_page() {
    if !kvm_available("a_wrong_pattern_fails_verification_with_the_first_bad_page") {
        return;
    }
    let (addr, size) = (4 * MIB, 8 * MIB);
    let workload = Workload::new()
        .write(addr, size, 1)
        .verify(addr, size, 2)
        .verify_zero(32 * MIB, MIB);
    let report = testguest::run(memory(), 2, &workload).unwrap();
    assert_eq!(report.exit_code(), exit_code::VERIFY_FAILED, "{report:#?}");
    assert_eq!(report.mismatches(1), size / 4096);
    assert_eq!(report.mismatches(2), 0, "untouched memory reads as zero");
    let first = report.vcpus[0].steps[1].first_mismatch.unwrap();
    assert_eq!(first.addr, addr);
    assert_eq!(first.found, 1 ^ addr);
    let second = report.vcpus[1].steps[1].first_mismatch.unwrap();
    assert_eq!(second.addr, addr + size / 2, "vCPU 1 checks the upper half");
    assert!(report
        .serial_output
        .contains("step 2: FAILED, mismatching pages: 2048"));
}

#[test]
fn checkpoints_run_the_hook_while_the_guest_waits() {
    if !kvm_available("checkpoints_run_the_hook_while_the_guest_waits") {
        return;
    }
    let mem = memory();
    let hook_mem = mem.clone();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook_seen = seen.clone();
    let options = RunOptions {
        on_checkpoint: Some(Arc::new(move |id| {
            hook_seen.lock().unwrap().push(id);
            // Overwrite one page the guest wrote: the next step must notice.
            hook_mem.write_obj(0u64, GuestAddress(3 * MIB)).unwrap();
        })),
        ..Default::default()
    };
    let workload = Workload::new()
        .write(2 * MIB, 2 * MIB, 9)
        .checkpoint(42)
        .on_vcpu(1)
        .verify(2 * MIB, 2 * MIB, 9);
    let report = testguest::run_with(mem, 2, &workload, options).unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![42]);
    assert_eq!(report.vcpus[1].checkpoints, vec![42]);
    assert!(report.vcpus[0].checkpoints.is_empty());
    assert_eq!(report.mismatches(2), 1, "{report:#?}");
    let mismatch = report.vcpus[1].steps[2].first_mismatch.unwrap();
    assert_eq!((mismatch.addr, mismatch.found), (3 * MIB, 0));
}

#[test]
fn the_start_hook_sees_one_named_thread_per_vcpu() {
    if !kvm_available("the_start_hook_sees_one_named_thread_per_vcpu") {
        return;
    }
    let tids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook_tids = tids.clone();
    let options = RunOptions {
        on_start: Some(Box::new(move |vm| {
            for (index, tid) in vm.vcpu_tids().iter().enumerate() {
                let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"));
                assert_eq!(comm.unwrap().trim(), format!("vcpu{index}"));
                assert_eq!(vm.vcpu_of_tid(*tid), Some(index));
            }
            *hook_tids.lock().unwrap() = vm.vcpu_tids().to_vec();
        })),
        ..Default::default()
    };
    let report = testguest::run_with(memory(), 2, &Workload::new(), options).unwrap();
    assert!(report.success(), "{report:#?}");
    assert_eq!(tids.lock().unwrap().len(), 2);
}

#[test]
fn pause_resume_and_stop_a_running_guest() {
    if !kvm_available("pause_resume_and_stop_a_running_guest") {
        return;
    }
    // Long enough to be caught running: rewrite all memory many times.
    let (addr, size) = AREA;
    let workload = (0..100).fold(Workload::new(), |w, i| w.write(addr, size, i));
    let options = RunOptions {
        on_start: Some(Box::new(|vm| {
            let control = vm.control().clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                control.pause().unwrap();
                assert_eq!(control.state(), RunState::Paused);
                std::thread::sleep(Duration::from_millis(100));
                control.resume().unwrap();
                std::thread::sleep(Duration::from_millis(100));
                control.request_stop(StopReason::Requested);
                assert_eq!(control.pause(), Err(RunControlError::Stopped));
            });
        })),
        ..Default::default()
    };
    let report = testguest::run_with(memory(), 2, &workload, options).unwrap();
    assert_eq!(report.stop_reason, StopReason::Requested, "{report:#?}");
    assert!(!report.timed_out);
    assert_eq!(report.exit_code(), exit_code::GUEST_ERROR);
    assert!(report.elapsed >= Duration::from_millis(300));
    assert!(report.vcpus.iter().all(|v| v.exit_status.is_none()));
}

#[test]
fn a_timeout_stops_the_guest() {
    if !kvm_available("a_timeout_stops_the_guest") {
        return;
    }
    let (addr, size) = AREA;
    let workload = (0..100).fold(Workload::new(), |w, i| w.write(addr, size, i));
    let options = RunOptions {
        timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let report = testguest::run_with(memory(), 1, &workload, options).unwrap();
    assert!(report.timed_out);
    assert_eq!(report.exit_code(), exit_code::TIMEOUT);
}

#[test]
fn bad_workloads_and_vcpu_counts_are_errors() {
    if !kvm_available("bad_workloads_and_vcpu_counts_are_errors") {
        return;
    }
    let outside = Workload::new().write(60 * MIB, 8 * MIB, 1);
    let err = testguest::run(memory(), 1, &outside).unwrap_err();
    assert!(err.to_string().contains("not all guest RAM"), "{err}");
    let low = Workload::new().write(MIB, MIB, 1);
    assert!(matches!(
        testguest::run(memory(), 1, &low),
        Err(TestGuestError::Workload(WorkloadError::BadStep { .. }))
    ));
    for vcpus in [0, 65] {
        let err = testguest::run(memory(), vcpus, &Workload::new()).unwrap_err();
        assert!(matches!(err, TestGuestError::BadVcpuCount(n) if n == vcpus));
    }
    let tiny =
        Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MIB as usize)]).unwrap());
    assert!(matches!(
        testguest::run(tiny, 1, &Workload::new()),
        Err(TestGuestError::MemoryTooSmall)
    ));
}
