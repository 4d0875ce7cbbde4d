//! Model-specific registers of a vCPU at boot, as Firecracker sets them.

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

/// MSR indices (Intel SDM vol. 4).
pub mod index {
    /// Time-stamp counter.
    pub const IA32_TSC: u32 = 0x10;
    /// Miscellaneous feature enables.
    pub const IA32_MISC_ENABLE: u32 = 0x1a0;
    /// SYSENTER code segment.
    pub const IA32_SYSENTER_CS: u32 = 0x174;
    /// SYSENTER stack pointer.
    pub const IA32_SYSENTER_ESP: u32 = 0x175;
    /// SYSENTER entry point.
    pub const IA32_SYSENTER_EIP: u32 = 0x176;
    /// Default memory type of the MTRRs.
    pub const IA32_MTRR_DEF_TYPE: u32 = 0x2ff;
    /// SYSCALL segment selectors.
    pub const STAR: u32 = 0xc000_0081;
    /// 64-bit SYSCALL entry point.
    pub const LSTAR: u32 = 0xc000_0082;
    /// Compatibility-mode SYSCALL entry point.
    pub const CSTAR: u32 = 0xc000_0083;
    /// RFLAGS mask for SYSCALL.
    pub const SYSCALL_MASK: u32 = 0xc000_0084;
    /// GS base swapped in by SWAPGS.
    pub const KERNEL_GS_BASE: u32 = 0xc000_0102;
}

/// IA32_MISC_ENABLE: fast string operations (REP MOVS/STOS).
pub const MISC_ENABLE_FAST_STRING: u64 = 1;
/// IA32_MTRR_DEF_TYPE: MTRRs enabled.
pub const MTRR_ENABLE: u64 = 1 << 11;
/// Memory type write-back.
pub const MTRR_MEM_TYPE_WB: u64 = 6;

/// Errors of MSR set-up.
#[derive(Debug, thiserror::Error)]
pub enum MsrError {
    /// Building the `kvm_msrs` array failed.
    #[error("cannot build the MSR list")]
    Build,
    /// `KVM_SET_MSRS` failed.
    #[error("KVM_SET_MSRS: {0}")]
    Set(#[source] kvm_ioctls::Error),
    /// KVM stopped at an MSR it does not accept.
    #[error("KVM rejected MSR {0:#x}")]
    Rejected(u32),
}

/// The MSRs a vCPU gets before its first instruction: SYSENTER/SYSCALL state cleared, TSC 0,
/// fast strings on, MTRRs enabled with write-back as the default type.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    use index::*;
    [
        (IA32_SYSENTER_CS, 0),
        (IA32_SYSENTER_ESP, 0),
        (IA32_SYSENTER_EIP, 0),
        (STAR, 0),
        (CSTAR, 0),
        (KERNEL_GS_BASE, 0),
        (SYSCALL_MASK, 0),
        (LSTAR, 0),
        (IA32_TSC, 0),
        (IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (IA32_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
    .into_iter()
    .map(|(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect()
}

/// Writes [`boot_msr_entries`] to `vcpu`; fails naming the first MSR KVM refused.
pub fn setup_boot_msrs(vcpu: &VcpuFd) -> Result<(), MsrError> {
    let entries = boot_msr_entries();
    let msrs = Msrs::from_entries(&entries).map_err(|_| MsrError::Build)?;
    let written = vcpu.set_msrs(&msrs).map_err(MsrError::Set)?;
    match entries.get(written) {
        Some(rejected) => Err(MsrError::Rejected(rejected.index)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_ioctls::Kvm;

    #[test]
    fn boot_msrs_match_the_firecracker_set() {
        let entries = boot_msr_entries();
        let value = |i: u32| entries.iter().find(|e| e.index == i).map(|e| e.data);
        assert_eq!(value(index::IA32_MISC_ENABLE), Some(1));
        assert_eq!(value(index::IA32_MTRR_DEF_TYPE), Some(0x806));
        assert_eq!(value(index::LSTAR), Some(0));
        assert_eq!(value(index::IA32_TSC), Some(0));
        assert_eq!(entries.len(), 11);
    }

    #[test]
    fn kvm_accepts_the_boot_msrs() {
        let Ok(kvm) = Kvm::new() else {
            eprintln!("SKIP: /dev/kvm is not available");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        setup_boot_msrs(&vcpu).unwrap();
        let mut msrs = Msrs::from_entries(&boot_msr_entries()).unwrap();
        for entry in msrs.as_mut_slice() {
            entry.data = u64::MAX;
        }
        assert_eq!(vcpu.get_msrs(&mut msrs).unwrap(), 11);
        for (entry, expected) in msrs.as_slice().iter().zip(boot_msr_entries()) {
            if entry.index != index::IA32_TSC {
                assert_eq!(entry.data, expected.data, "MSR {:#x}", entry.index);
            }
        }
    }
}
