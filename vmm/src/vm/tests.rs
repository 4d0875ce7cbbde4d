//! Tests of VM creation and vCPU run control on real KVM, with hand-assembled guest code.

use std::sync::Arc;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::run_control::VcpuExitReason;
use super::run_control::{RunControlError, RunState, StopReason};
use super::vcpu::Buses;
use super::{Vm, VmError};
use crate::arch::x86_64::paging::PageSize;
use crate::arch::x86_64::regs::{setup_long_mode, EntryPoint};
use crate::arch::x86_64::{write_boot_tables, BootLayout};

const CODE: u64 = 0x10_0000;
const JMP_SELF: &[u8] = &[0xeb, 0xfe];
const CLI_HLT: &[u8] = &[0xfa, 0xf4, 0xeb, 0xfc];
const UD2: &[u8] = &[0x0f, 0x0b];

fn kvm_available(test: &str) -> bool {
    let available = std::path::Path::new("/dev/kvm").exists();
    if !available {
        eprintln!("SKIP: {test}: /dev/kvm is absent");
    }
    available
}

fn memory() -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap())
}

/// A VM whose vCPUs run `code` at 1 MiB in 64-bit mode.
fn vm_running(code: &[u8], vcpus: usize) -> Vm<GuestMemoryMmap> {
    let memory = memory();
    memory.write_slice(code, GuestAddress(CODE)).unwrap();
    let vm = Vm::new(memory, vcpus).unwrap();
    let layout = BootLayout {
        gdt: GuestAddress(0x500),
        idt: GuestAddress(0x520),
        page_tables: GuestAddress(0x9000),
        page_tables_max_size: 0x10000,
        page_size: PageSize::Size2M,
    };
    let tables = write_boot_tables(vm.memory().as_ref(), &layout, 4 << 20).unwrap();
    for vcpu in vm.vcpus() {
        let entry = EntryPoint {
            rip: CODE,
            rsp: 0x8_0000,
            ..Default::default()
        };
        setup_long_mode(vcpu.fd(), &tables, &entry).unwrap();
        let runnable = kvm_bindings::kvm_mp_state {
            mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
        };
        vcpu.fd().set_mp_state(runnable).unwrap();
    }
    vm
}

#[test]
fn rejects_bad_vcpu_counts_and_unaligned_regions() {
    if !kvm_available("rejects_bad_vcpu_counts_and_unaligned_regions") {
        return;
    }
    for count in [0, 255] {
        let err = Vm::new(memory(), count).unwrap_err();
        assert!(matches!(err, VmError::InvalidVcpuCount { requested, .. } if requested == count));
    }
    let unaligned =
        Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0x800), 0x1000)]).unwrap());
    let err = Vm::new(unaligned, 1).unwrap_err();
    assert!(err.to_string().contains("4 KiB aligned"), "{err}");
}

#[test]
fn vcpus_start_paused_and_stop_while_spinning() {
    if !kvm_available("vcpus_start_paused_and_stop_while_spinning") {
        return;
    }
    let running = vm_running(JMP_SELF, 2)
        .start(Arc::new(Buses::default()))
        .unwrap();
    assert_eq!(running.control().state(), RunState::Paused);
    assert_eq!(running.vcpu_tids().len(), 2);
    assert!(running.vcpu_tids().iter().all(|tid| *tid > 0));
    running.resume().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    running.control().pause().unwrap();
    running.control().resume().unwrap();
    running.control().request_stop(StopReason::Requested);
    let control = running.control().clone();
    let (reason, timed_out) = running.wait_timeout(Some(Duration::from_secs(10)));
    assert_eq!((reason, timed_out), (StopReason::Requested, false));
    let exits = control.vcpu_exits();
    assert!(exits.iter().all(|e| *e == Some(VcpuExitReason::Stopped)));
    assert_eq!(control.resume(), Err(RunControlError::Stopped));
}

#[test]
fn stop_wakes_vcpus_halted_in_the_kernel() {
    if !kvm_available("stop_wakes_vcpus_halted_in_the_kernel") {
        return;
    }
    let running = vm_running(CLI_HLT, 1)
        .start(Arc::new(Buses::default()))
        .unwrap();
    running.resume().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let (reason, timed_out) = running.wait_timeout(Some(Duration::from_millis(100)));
    assert_eq!((reason, timed_out), (StopReason::Requested, true));
}

#[test]
fn a_triple_fault_stops_the_vm_as_a_guest_shutdown() {
    if !kvm_available("a_triple_fault_stops_the_vm_as_a_guest_shutdown") {
        return;
    }
    let running = vm_running(UD2, 2)
        .start(Arc::new(Buses::default()))
        .unwrap();
    running.resume().unwrap();
    let (reason, timed_out) = running.wait_timeout(Some(Duration::from_secs(10)));
    assert!(!timed_out);
    assert!(
        matches!(reason, StopReason::GuestShutdown { .. }),
        "{reason:?}"
    );
    assert!(!reason.is_success());
}

#[test]
fn dropping_a_running_vm_stops_its_vcpus() {
    if !kvm_available("dropping_a_running_vm_stops_its_vcpus") {
        return;
    }
    let running = vm_running(JMP_SELF, 2)
        .start(Arc::new(Buses::default()))
        .unwrap();
    running.resume().unwrap();
    let control = running.control().clone();
    drop(running);
    assert_eq!(control.state(), RunState::Stopped);
    assert!(control.vcpu_exits().iter().all(Option::is_some));
}
