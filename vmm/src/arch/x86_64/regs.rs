//! Register state of a vCPU entering 64-bit code: general-purpose registers, segment and
//! control registers (CR0/CR3/CR4/EFER, GDT/IDT) and the FPU, as Firecracker sets them for Linux;
//! and of one entering 32-bit code without paging, as the PVH boot protocol starts a kernel.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;

use super::gdt::{BootSegments, BOOT_GDT_SIZE};

/// Errors of register set-up.
#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    /// KVM_GET_SREGS failed.
    #[error("KVM_GET_SREGS failed: {0}")]
    GetSregs(kvm_ioctls::Error),
    /// KVM_SET_SREGS failed.
    #[error("KVM_SET_SREGS failed: {0}")]
    SetSregs(kvm_ioctls::Error),
    /// KVM_SET_REGS failed.
    #[error("KVM_SET_REGS failed: {0}")]
    SetRegs(kvm_ioctls::Error),
    /// KVM_SET_FPU failed.
    #[error("KVM_SET_FPU failed: {0}")]
    SetFpu(kvm_ioctls::Error),
}

/// CR0: protected mode enable.
pub const CR0_PE: u64 = 1 << 0;
/// CR0: extension type (always 1 on modern CPUs).
pub const CR0_ET: u64 = 1 << 4;
/// CR0: paging.
pub const CR0_PG: u64 = 1 << 31;
/// CR4: physical address extension, required for long mode.
pub const CR4_PAE: u64 = 1 << 5;
/// EFER: long mode enable.
pub const EFER_LME: u64 = 1 << 8;
/// EFER: long mode active.
pub const EFER_LMA: u64 = 1 << 10;
/// RFLAGS bit 1 is reserved and always set.
const RFLAGS_RESERVED: u64 = 1 << 1;
/// x87 control word after FNINIT.
const FPU_CONTROL_WORD: u16 = 0x37f;
/// MXCSR after reset: all SIMD exceptions masked.
const MXCSR_DEFAULT: u32 = 0x1f80;

/// Where a vCPU starts and what it finds in its argument registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryPoint {
    /// Instruction pointer (a guest virtual = physical address in the identity map).
    pub rip: u64,
    /// Stack pointer (also loaded into RBP).
    pub rsp: u64,
    /// RDI: the first SysV argument (the test guest's vCPU index).
    pub rdi: u64,
    /// RSI: the zero page for Linux, the workload descriptor for the test guest.
    pub rsi: u64,
}

/// Addresses of the boot structures the control registers point at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootTables {
    /// Guest physical address of the GDT.
    pub gdt: u64,
    /// Guest physical address of the IDT.
    pub idt: u64,
    /// Guest physical address of the PML4 (the value of CR3).
    pub cr3: u64,
}

/// General-purpose registers for `entry`.
pub fn entry_regs(entry: &EntryPoint) -> kvm_regs {
    kvm_regs {
        rflags: RFLAGS_RESERVED,
        rip: entry.rip,
        rsp: entry.rsp,
        rbp: entry.rsp,
        rdi: entry.rdi,
        rsi: entry.rsi,
        ..Default::default()
    }
}

/// Points `sregs` at `tables`' GDT and IDT and loads `segments`.
fn load_segments(sregs: &mut kvm_sregs, tables: &BootTables, segments: BootSegments) {
    sregs.gdt.base = tables.gdt;
    sregs.gdt.limit = BOOT_GDT_SIZE - 1;
    sregs.idt.base = tables.idt;
    sregs.idt.limit = 7;
    sregs.cs = segments.code;
    sregs.ds = segments.data;
    sregs.es = segments.data;
    sregs.fs = segments.data;
    sregs.gs = segments.data;
    sregs.ss = segments.data;
    sregs.tr = segments.tss;
}

/// Turns `sregs` (as read from a fresh vCPU) into 64-bit mode with paging through `tables`.
pub fn long_mode_sregs(mut sregs: kvm_sregs, tables: &BootTables) -> kvm_sregs {
    load_segments(&mut sregs, tables, BootSegments::new());
    sregs.cr3 = tables.cr3;
    sregs.cr4 |= CR4_PAE;
    sregs.cr0 |= CR0_PE | CR0_PG | CR0_ET;
    sregs.efer |= EFER_LME | EFER_LMA;
    sregs
}

/// Turns `sregs` into the PVH boot protocol's start: 32-bit protected mode with flat segments,
/// paging and long mode off.
pub fn pvh_sregs(mut sregs: kvm_sregs, tables: &BootTables) -> kvm_sregs {
    load_segments(&mut sregs, tables, BootSegments::pvh());
    sregs.cr0 = CR0_PE | CR0_ET;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    sregs
}

/// Puts `vcpu` into 32-bit protected mode at `rip` with EBX at the PVH start info `start_info`,
/// segments from `tables`' GDT (written by [`super::write_pvh_tables`]).
pub fn setup_pvh(
    vcpu: &VcpuFd,
    tables: &BootTables,
    rip: u64,
    start_info: u64,
) -> Result<(), RegsError> {
    let sregs = vcpu.get_sregs().map_err(RegsError::GetSregs)?;
    vcpu.set_sregs(&pvh_sregs(sregs, tables))
        .map_err(RegsError::SetSregs)?;
    let regs = kvm_regs {
        rflags: RFLAGS_RESERVED,
        rip,
        rbx: start_info,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(RegsError::SetRegs)?;
    vcpu.set_fpu(&initial_fpu()).map_err(RegsError::SetFpu)
}

/// The FPU state after FNINIT, with SIMD exceptions masked.
pub fn initial_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: FPU_CONTROL_WORD,
        mxcsr: MXCSR_DEFAULT,
        ..Default::default()
    }
}

/// Puts `vcpu` into 64-bit mode at `entry`, with paging through `tables`.
pub fn setup_long_mode(
    vcpu: &VcpuFd,
    tables: &BootTables,
    entry: &EntryPoint,
) -> Result<(), RegsError> {
    let sregs = vcpu.get_sregs().map_err(RegsError::GetSregs)?;
    vcpu.set_sregs(&long_mode_sregs(sregs, tables))
        .map_err(RegsError::SetSregs)?;
    vcpu.set_regs(&entry_regs(entry))
        .map_err(RegsError::SetRegs)?;
    vcpu.set_fpu(&initial_fpu()).map_err(RegsError::SetFpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::gdt::{CODE_SELECTOR, DATA_SELECTOR};

    const TABLES: BootTables = BootTables {
        gdt: 0x500,
        idt: 0x520,
        cr3: 0x9000,
    };

    #[test]
    fn sregs_enable_paging_and_long_mode() {
        let sregs = long_mode_sregs(kvm_sregs::default(), &TABLES);
        assert_eq!(sregs.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_eq!(sregs.cr4 & CR4_PAE, CR4_PAE);
        assert_eq!(sregs.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(
            (sregs.cr3, sregs.gdt.base, sregs.gdt.limit),
            (0x9000, 0x500, 31)
        );
        assert_eq!((sregs.idt.base, sregs.idt.limit), (0x520, 7));
        assert_eq!((sregs.cs.selector, sregs.cs.l), (CODE_SELECTOR, 1));
        for seg in [sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss] {
            assert_eq!(seg.selector, DATA_SELECTOR);
        }
    }

    #[test]
    fn sregs_keep_bits_kvm_set() {
        let fresh = kvm_sregs {
            cr0: 0x6000_0010,
            apic_base: 0xfee0_0900,
            ..Default::default()
        };
        let sregs = long_mode_sregs(fresh, &TABLES);
        assert_eq!(sregs.cr0, 0x6000_0010 | CR0_PE | CR0_PG);
        assert_eq!(sregs.apic_base, 0xfee0_0900);
    }

    #[test]
    fn pvh_sregs_are_32_bit_protected_mode_without_paging() {
        let fresh = kvm_sregs {
            cr0: 0x6000_0010,
            efer: EFER_LME | EFER_LMA,
            apic_base: 0xfee0_0900,
            ..Default::default()
        };
        let sregs = pvh_sregs(fresh, &TABLES);
        assert_eq!(
            (sregs.cr0, sregs.cr3, sregs.cr4, sregs.efer),
            (CR0_PE | CR0_ET, 0, 0, 0)
        );
        assert_eq!(
            (sregs.cs.selector, sregs.cs.l, sregs.cs.db),
            (CODE_SELECTOR, 0, 1)
        );
        assert_eq!((sregs.gdt.base, sregs.idt.base), (0x500, 0x520));
        for seg in [sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss] {
            assert_eq!(
                (seg.selector, seg.base, seg.limit),
                (DATA_SELECTOR, 0, 0xffff_ffff)
            );
        }
        assert_eq!(sregs.apic_base, 0xfee0_0900);
    }

    #[test]
    fn regs_carry_entry_stack_and_arguments() {
        let entry = EntryPoint {
            rip: 0x10_0000,
            rsp: 0x8ff0,
            rdi: 1,
            rsi: 0x7000,
        };
        let regs = entry_regs(&entry);
        assert_eq!((regs.rip, regs.rsp, regs.rbp), (0x10_0000, 0x8ff0, 0x8ff0));
        assert_eq!((regs.rdi, regs.rsi, regs.rflags), (1, 0x7000, 2));
        assert_eq!((initial_fpu().fcw, initial_fpu().mxcsr), (0x37f, 0x1f80));
    }
}
