//! x86_64 boot set-up: GDT, identity page tables and the register state for 64-bit entry (and
//! for the 32-bit entry of the PVH boot protocol); the MP table and ACPI tables are in their
//! own modules.
//!
//! # What this host's KVM (PVM) supports
//!
//! Probed on the development host (kernel 6.18, `kvm_pvm` module, no VMX/SVM):
//! `KVM_CREATE_IRQCHIP`, `KVM_CREATE_PIT2`, `KVM_SET_TSS_ADDR`, `KVM_CAP_IMMEDIATE_EXIT`,
//! irqfd/ioeventfd, split irqchip, x2APIC API, 32764 memslots, `KVM_GET_SUPPORTED_CPUID` (76
//! entries: long mode, NX, but *not* 1 GiB pages: CPUID.80000001H:EDX bit 26 is clear) and
//! `KVM_GET_MSR_INDEX_LIST` all work. 64-bit entry with the structures below works; guest code
//! runs emulated (about 2 M instructions/s). Hence the identity map uses 2 MiB pages unless the
//! vCPU's CPUID offers 1 GiB pages.

pub mod acpi;
pub mod cpu_template;
pub mod cpuid;
pub mod gdt;
pub mod lapic;
pub mod mptable;
pub mod msr;
pub mod paging;
pub mod regs;
pub mod state;

use vm_memory::{GuestAddress, GuestMemoryBackend};

use gdt::GdtError;
use paging::{IdentityMap, PageSize, PagingError};
use regs::BootTables;

/// Errors of x86_64 boot set-up.
#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    /// Writing the GDT/IDT failed.
    #[error(transparent)]
    Gdt(#[from] GdtError),
    /// Planning or writing the page tables failed.
    #[error(transparent)]
    Paging(#[from] PagingError),
}

/// The smallest range every identity map covers: the low 4 GiB, with the MMIO gap and the
/// LAPIC/IOAPIC.
pub const MIN_IDENTITY_MAPPED: u64 = 1 << 32;

/// Where the boot structures go in guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootLayout {
    /// Guest physical address of the GDT.
    pub gdt: GuestAddress,
    /// Guest physical address of the IDT.
    pub idt: GuestAddress,
    /// Guest physical address of the page tables (PML4 first).
    pub page_tables: GuestAddress,
    /// Bytes reserved for page tables at `page_tables`.
    pub page_tables_max_size: u64,
    /// Leaf page size of the identity map.
    pub page_size: PageSize,
}

impl BootLayout {
    /// The layout for Linux's 64-bit boot protocol (see [`crate::layout`]): GDT and IDT in the
    /// first page, page tables from `PML4_START` up to the command line. Map only
    /// [`MIN_IDENTITY_MAPPED`] bytes with it: Linux builds its own page tables for the rest.
    pub fn linux() -> Self {
        use crate::layout::{BOOT_GDT_START, BOOT_IDT_START, CMDLINE_START, PML4_START};
        BootLayout {
            gdt: GuestAddress(BOOT_GDT_START),
            idt: GuestAddress(BOOT_IDT_START),
            page_tables: GuestAddress(PML4_START),
            page_tables_max_size: CMDLINE_START - PML4_START,
            page_size: PageSize::Size2M,
        }
    }
}

/// Whether a CPUID table offers 1 GiB pages (CPUID.80000001H:EDX bit 26).
pub fn cpuid_has_1g_pages(cpuid: &kvm_bindings::CpuId) -> bool {
    cpuid
        .as_slice()
        .iter()
        .any(|e| e.function == 0x8000_0001 && e.edx & (1 << 26) != 0)
}

/// Whether the host CPU has hardware virtualization: a `vmx` or `svm` flag in `/proc/cpuinfo`.
/// Without it, a working /dev/kvm is a software one such as PVM, which runs the built-in test
/// guest but not a stock Linux kernel.
pub fn host_has_hardware_virtualization() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|cpuinfo| cpuinfo_has_virtualization(&cpuinfo))
}

fn cpuinfo_has_virtualization(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter_map(|line| line.strip_prefix("flags"))
        .filter_map(|line| line.split_once(':'))
        .any(|(_, flags)| flags.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

/// Writes the GDT, IDT and an identity map of `[0, max(ram_end, 4 GiB))` into `mem`, and
/// returns the addresses the vCPUs' system registers must point at.
pub fn write_boot_tables<M: GuestMemoryBackend>(
    mem: &M,
    layout: &BootLayout,
    ram_end: u64,
) -> Result<BootTables, ArchError> {
    gdt::write_gdt_and_idt(mem, &gdt::BOOT_GDT, layout.gdt, layout.idt)?;
    let map = IdentityMap::new(
        layout.page_tables,
        ram_end.max(MIN_IDENTITY_MAPPED),
        layout.page_size,
        layout.page_tables_max_size,
    )?;
    let cr3 = map.write(mem)?;
    Ok(BootTables {
        gdt: layout.gdt.0,
        idt: layout.idt.0,
        cr3,
    })
}

/// Writes the GDT and IDT of a PVH entry (32-bit protected mode, no paging: no page tables)
/// where `layout` puts them, and returns the addresses the boot vCPU's registers point at.
pub fn write_pvh_tables<M: GuestMemoryBackend>(
    mem: &M,
    layout: &BootLayout,
) -> Result<BootTables, ArchError> {
    gdt::write_gdt_and_idt(mem, &gdt::PVH_GDT, layout.gdt, layout.idt)?;
    Ok(BootTables {
        gdt: layout.gdt.0,
        idt: layout.idt.0,
        cr3: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{CMDLINE_START, ZERO_PAGE_START};
    use vm_memory::{Bytes, GuestMemoryMmap};

    #[test]
    fn hardware_virtualization_is_a_cpu_flag() {
        assert!(cpuinfo_has_virtualization(
            "processor\t: 0\nflags\t\t: fpu vme svm lm\n"
        ));
        assert!(cpuinfo_has_virtualization("flags\t\t: fpu vmx\n"));
        assert!(!cpuinfo_has_virtualization(
            "flags\t\t: fpu svm_lock\nmodel name\t: svm\n"
        ));
    }

    #[test]
    fn linux_tables_fit_between_zero_page_and_command_line() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        mem.write_obj(0x5a5a_u64, GuestAddress(CMDLINE_START))
            .unwrap();
        let layout = BootLayout::linux();
        assert!(layout.page_tables.0 >= ZERO_PAGE_START + 0x1000);
        let tables = write_boot_tables(&mem, &layout, 1 << 30).unwrap();
        assert_eq!((tables.gdt, tables.idt, tables.cr3), (0x500, 0x520, 0x9000));
        let cmdline: u64 = mem.read_obj(GuestAddress(CMDLINE_START)).unwrap();
        assert_eq!(cmdline, 0x5a5a, "the tables end before the command line");
        let too_much = write_boot_tables(&mem, &layout, 64 << 30);
        assert!(matches!(
            too_much,
            Err(ArchError::Paging(PagingError::TooLarge { .. }))
        ));
    }

    #[test]
    fn detects_1g_page_support_in_cpuid() {
        let mut entry = kvm_bindings::kvm_cpuid_entry2 {
            function: 0x8000_0001,
            ..Default::default()
        };
        let without = kvm_bindings::CpuId::from_entries(&[entry]).unwrap();
        entry.edx |= 1 << 26;
        let with = kvm_bindings::CpuId::from_entries(&[entry]).unwrap();
        assert!(!cpuid_has_1g_pages(&without));
        assert!(cpuid_has_1g_pages(&with));
    }
}
