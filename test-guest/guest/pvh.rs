//! PVH entry: the test guest started by a loader of the PVH boot protocol (Xen's
//! `XEN_ELFNOTE_PHYS32_ENTRY`, which Cloud Hypervisor, Firecracker, QEMU and this VMM honour
//! in an ELF kernel) rather than by its VMM or through Linux's 64-bit boot protocol.
//!
//! Such a loader enters `pvh_start` in 32-bit protected mode without paging, with EBX at its
//! `hvm_start_info` and no stack. The entry maps the first GiB with the page tables below,
//! enters long mode, and hands the start info to [`pvh_main`], which writes what it holds (the
//! command line and the memory map) into a zero page of Linux's boot protocol and goes on as
//! a self-booted guest (`self_boot`).

use core::arch::global_asm;
use core::ptr::read_volatile;
use core::sync::atomic::Ordering;

use test_guest::protocol::{STACKS_START, STACK_SIZE};

/// `hvm_start_info`'s magic and the offsets of its fields that the guest reads.
const START_INFO_MAGIC: u32 = 0x336e_c578;
const START_INFO_VERSION: u64 = 4;
const START_INFO_CMDLINE: u64 = 24;
const START_INFO_MEMMAP: u64 = 40;
const START_INFO_MEMMAP_ENTRIES: u64 = 48;
/// Bytes of one `hvm_memmap_table_entry` (address, size, type, reserved).
const MEMMAP_ENTRY_SIZE: u64 = 24;

// The ELF note that names the 32-bit entry; the 32-bit entry itself, which builds the tables,
// enters long mode through a GDT of its own and calls `pvh_main` with the start info.
global_asm!(
    ".pushsection .note.Xen, \"a\", @note",
    ".balign 4",
    ".long 4, 4, 18", // name size ("Xen\0"), descriptor size, XEN_ELFNOTE_PHYS32_ENTRY
    ".asciz \"Xen\"",
    ".balign 4",
    ".long pvh_start",
    ".popsection",
    ".pushsection .bss.pvh_tables, \"aw\", @nobits",
    ".balign 4096",
    "pvh_tables:", // PML4, PDPT, page directory
    ".skip 3 * 4096",
    ".popsection",
    ".pushsection .rodata.pvh_gdt, \"a\"",
    ".balign 8",
    "pvh_gdt:",
    ".quad 0",
    ".quad 0x00af9a000000ffff", // 0x08: 64-bit code
    ".quad 0x00cf92000000ffff", // 0x10: data
    "pvh_gdt_pointer:",
    ".word 3 * 8 - 1",
    ".long pvh_gdt",
    ".popsection",
    ".pushsection .text.pvh, \"ax\"",
    ".code32",
    ".global pvh_start",
    "pvh_start:",
    "movl %ebx, %esi",
    // The page directory: 512 2 MiB pages, present and writable, over the first GiB.
    "movl $(pvh_tables + 2 * 4096), %edi",
    "movl $0x83, %eax",
    "movl $512, %ecx",
    "1:",
    "movl %eax, (%edi)",
    "movl $0, 4(%edi)",
    "addl $0x200000, %eax",
    "addl $8, %edi",
    "loop 1b",
    "movl $(pvh_tables + 2 * 4096 + 3), pvh_tables + 4096",
    "movl $(pvh_tables + 4096 + 3), pvh_tables",
    // PAE, the tables, long mode enabled (EFER.LME), then paging on.
    "movl %cr4, %eax",
    "orl $0x20, %eax",
    "movl %eax, %cr4",
    "movl $pvh_tables, %eax",
    "movl %eax, %cr3",
    "movl $0xc0000080, %ecx",
    "rdmsr",
    "orl $0x100, %eax",
    "wrmsr",
    "lgdt pvh_gdt_pointer",
    "movl %cr0, %eax",
    "orl $0x80000001, %eax",
    "movl %eax, %cr0",
    "ljmp $0x08, $2f",
    ".code64",
    "2:",
    "movl $0x10, %eax",
    "movl %eax, %ds",
    "movl %eax, %es",
    "movl %eax, %ss",
    "movl %eax, %fs",
    "movl %eax, %gs",
    "movq ${stack_top}, %rsp",
    "movl %esi, %edi",
    "call {main}",
    "3:",
    "cli",
    "hlt",
    "jmp 3b",
    ".popsection",
    stack_top = const STACKS_START + STACK_SIZE,
    main = sym pvh_main,
    options(att_syntax)
);

/// The zero page the start info is written into.
#[repr(C, align(4096))]
struct ZeroPage([u8; 4096]);

/// Written once by [`pvh_main`], before anything reads it.
static mut ZERO_PAGE: ZeroPage = ZeroPage([0; 4096]);

/// Writes the start info at `start_info` into a zero page and runs as a self-booted guest.
extern "C" fn pvh_main(start_info: u64) -> ! {
    // SAFETY: the loader's start info, in RAM the first GiB maps; a word of it.
    let magic = unsafe { read_volatile(start_info as *const u32) };
    if magic != START_INFO_MAGIC {
        super::print("test guest: the PVH loader's start info has a wrong magic\n");
        super::self_boot::reset();
    }
    let zero_page = core::ptr::addr_of_mut!(ZERO_PAGE) as u64;
    let read = |offset: u64| {
        // SAFETY: a field of the start info (8-byte aligned as the PVH ABI lays it out).
        unsafe { read_volatile((start_info + offset) as *const u64) }
    };
    // Version 1 added the memory map: a version 0 loader gives none (no RAM is used).
    // SAFETY: as for the magic.
    let version = unsafe { read_volatile((start_info + START_INFO_VERSION) as *const u32) };
    let (memmap, entries) = if version >= 1 {
        // SAFETY: as for the magic.
        let entries =
            unsafe { read_volatile((start_info + START_INFO_MEMMAP_ENTRIES) as *const u32) };
        (read(START_INFO_MEMMAP), entries)
    } else {
        (0, 0)
    };
    super::self_boot::write_zero_page(zero_page, read(START_INFO_CMDLINE), |index| {
        (index < entries).then(|| {
            let entry = memmap + u64::from(index) * MEMMAP_ENTRY_SIZE;
            // SAFETY: an entry of the loader's memory map, in low RAM.
            unsafe {
                (
                    read_volatile(entry as *const u64),
                    read_volatile((entry + 8) as *const u64),
                    read_volatile((entry + 16) as *const u32),
                )
            }
        })
    });
    super::SELF_BOOTED.store(super::STARTED_BY_PVH_LOADER, Ordering::Relaxed);
    super::guest_main(0, zero_page)
}
