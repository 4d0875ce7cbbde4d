//! End-to-end: boot the built-in test guest in a real KVM VM and run memory workloads.

use std::sync::Arc;

use e2e_tests::kvm_available;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm::testguest::{self, exit_code, Workload};

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
