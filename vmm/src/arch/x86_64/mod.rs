//! x86_64 boot set-up: GDT, identity page tables and the register state for 64-bit entry.
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

pub mod cpuid;
pub mod gdt;
pub mod msr;
pub mod paging;
pub mod regs;

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

/// Whether a CPUID table offers 1 GiB pages (CPUID.80000001H:EDX bit 26).
pub fn cpuid_has_1g_pages(cpuid: &kvm_bindings::CpuId) -> bool {
    cpuid
        .as_slice()
        .iter()
        .any(|e| e.function == 0x8000_0001 && e.edx & (1 << 26) != 0)
}

/// Writes the GDT, IDT and an identity map of `[0, max(ram_end, 4 GiB))` into `mem`, and
/// returns the addresses the vCPUs' system registers must point at.
pub fn write_boot_tables<M: GuestMemoryBackend>(
    mem: &M,
    layout: &BootLayout,
    ram_end: u64,
) -> Result<BootTables, ArchError> {
    gdt::write_gdt_and_idt(mem, layout.gdt, layout.idt)?;
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
