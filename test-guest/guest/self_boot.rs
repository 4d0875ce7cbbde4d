//! Self-boot: the test guest started by a loader of Linux's 64-bit boot protocol (or of PVH,
//! through `pvh`, which writes a zero page of what its loader gave: Firecracker, Cloud
//! Hypervisor, `vmm run --kernel IMAGE` with `self-boot` on the command line) rather than by its
//! VMM.
//!
//! A loader of Linux's protocol enters `_start` in long mode on its own page tables (the first
//! GiB), with RSI at the zero page (`struct boot_params`) and no workload descriptor. The guest then reads the
//! e820 map and the command line from the zero page, maps all RAM itself, and writes the
//! descriptor of its `workload=` word (the default `write:all,verify:all` without one), in
//! the subset a guest can parse: comma-separated `write:all`, `verify:all`, `verify-zero:all`,
//! `read:all` and `checkpoint:ID`. `all` is every usable e820 range from 2 MiB up. Only the
//! boot vCPU runs (the loader starts no other). A checkpoint prints its id and waits for a byte
//! on the serial console; the end resets the machine through the i8042, which ends
//! Firecracker and our VMM alike.

use core::ptr::{read_volatile, write_volatile};

use test_guest::protocol::*;

/// Offsets in the zero page.
const E820_ENTRIES: u64 = 0x1e8;
const HEADER_MAGIC: u64 = 0x202;
const CMD_LINE_PTR: u64 = 0x228;
const E820_TABLE: u64 = 0x2d0;
/// Bytes of one e820 entry (address, size, type) and the zero page's room for them.
const E820_ENTRY_SIZE: u64 = 20;
const E820_MAX_ENTRIES: u8 = 128;
/// e820 type of usable RAM.
const E820_RAM: u32 = 1;
/// The setup header's magic, "HdrS".
const HDRS_MAGIC: u32 = u32::from_le_bytes(*b"HdrS");
/// The workload of a command line without `workload=`.
const DEFAULT_WORKLOAD: &[u8] = b"write:all,verify:all";
/// The longest command line read.
const CMDLINE_MAX: u64 = 2048;
/// The pattern of write and verify steps (the VMM's default pattern).
const PATTERN: u64 = 0x5a5a_5a5a_5a5a_5a5a;

/// The page tables the guest builds: above the loader's command line (at 128 KiB) and below
/// the stacks; one page directory per GiB, 2 MiB pages.
const TABLES: u64 = 0x2_1000;
const PAGE: u64 = 0x1000;
const GIB: u64 = 1 << 30;
/// GiBs the tables can map: every page directory after the PML4 and the PDPT.
const MAX_MAPPED_GIB: u64 = (STACKS_START - TABLES) / PAGE - 2;

/// Whether `zero_page` is a zero page of the Linux boot protocol (the loader's RSI).
pub fn is_zero_page(zero_page: u64) -> bool {
    // SAFETY: the loader's RSI points at a page it wrote; reading a word of it has no effect.
    unsafe { read_volatile((zero_page + HEADER_MAGIC) as *const u32) == HDRS_MAGIC }
}

/// Writes a zero page at `zero_page` (zeroed memory) that names the command line at `cmdline`
/// and the memory ranges `entry` gives, by index, as (address, size, e820 type), until `None`:
/// what a loader of another protocol (PVH) gave, as a loader of Linux's would have.
pub fn write_zero_page(
    zero_page: u64,
    cmdline: u64,
    entry: impl Fn(u32) -> Option<(u64, u64, u32)>,
) {
    // A command line above 4 GiB does not fit the field: the guest reads none.
    let cmdline = u32::try_from(cmdline).unwrap_or(0);
    let mut count = 0;
    while count < E820_MAX_ENTRIES {
        let Some((addr, size, kind)) = entry(u32::from(count)) else {
            break;
        };
        let slot = zero_page + E820_TABLE + u64::from(count) * E820_ENTRY_SIZE;
        // SAFETY: an entry of the zero page's e820 table (packed: written unaligned).
        unsafe {
            (slot as *mut u64).write_unaligned(addr);
            ((slot + 8) as *mut u64).write_unaligned(size);
            ((slot + 16) as *mut u32).write_unaligned(kind);
        }
        count += 1;
    }
    // SAFETY: fields of the zero page, which the caller hands over.
    unsafe {
        write_volatile((zero_page + E820_ENTRIES) as *mut u8, count);
        write_volatile((zero_page + CMD_LINE_PTR) as *mut u32, cmdline);
        write_volatile((zero_page + HEADER_MAGIC) as *mut u32, HDRS_MAGIC);
    }
}

/// Maps all RAM and writes the descriptor of the command line's workload at
/// [`DESCRIPTOR_ADDR`]; returns its address, or the text of what is wrong with the workload.
pub fn prepare(zero_page: u64) -> Result<u64, &'static str> {
    let ram_end = usable_ranges(zero_page).fold(0, |end, (_, range_end)| end.max(range_end));
    let mapped = ram_end.max(4 * GIB).div_ceil(GIB).min(MAX_MAPPED_GIB) * GIB;
    map_identity(mapped);
    let mut steps = 0usize;
    let mut add = |step: Step| -> Result<(), &'static str> {
        if steps == MAX_STEPS {
            return Err("more steps than the descriptor holds");
        }
        let addr = DESCRIPTOR_ADDR + HEADER_SIZE + steps as u64 * STEP_SIZE;
        // SAFETY: the descriptor page is guest RAM nothing else uses in this mode.
        unsafe { write_volatile(addr as *mut Step, step) };
        steps += 1;
        Ok(())
    };
    for token in workload(zero_page).split(|&byte| byte == b',') {
        let (kind, argument) = match token.iter().position(|&byte| byte == b':') {
            Some(colon) => (&token[..colon], &token[colon + 1..]),
            None => return Err("a step without ':'"),
        };
        if kind == b"checkpoint" {
            let id = parse_number(argument).ok_or("a checkpoint's id is no number")?;
            add(Step::for_all_vcpus(step_kind::CHECKPOINT, 0, 0, id))?;
            continue;
        }
        let kind = match kind {
            b"write" => step_kind::WRITE,
            b"verify" => step_kind::VERIFY,
            b"verify-zero" => step_kind::VERIFY_ZERO,
            b"read" => step_kind::READ,
            _ => return Err("an unknown step (write, verify, verify-zero, read, checkpoint)"),
        };
        if argument != b"all" {
            return Err("a self-booted guest's ranges are 'all'");
        }
        for (start, end) in usable_ranges(zero_page) {
            let start = start.max(WORKLOAD_MIN_ADDR).next_multiple_of(PAGE);
            let end = end.min(mapped) / PAGE * PAGE;
            if start < end {
                add(Step::for_all_vcpus(kind, start, end - start, PATTERN))?;
            }
        }
    }
    let header = DescriptorHeader {
        magic: DESCRIPTOR_MAGIC,
        vcpu_count: 1,
        step_count: steps as u32,
    };
    // SAFETY: as for the steps.
    unsafe { write_volatile(DESCRIPTOR_ADDR as *mut DescriptorHeader, header) };
    Ok(DESCRIPTOR_ADDR)
}

/// The usable e820 ranges of `zero_page`, as (start, end).
fn usable_ranges(zero_page: u64) -> impl Iterator<Item = (u64, u64)> {
    // SAFETY: a byte of the zero page.
    let count = unsafe { read_volatile((zero_page + E820_ENTRIES) as *const u8) };
    (0..u64::from(count.min(E820_MAX_ENTRIES))).filter_map(move |index| {
        let entry = zero_page + E820_TABLE + index * E820_ENTRY_SIZE;
        // SAFETY: an entry of the zero page's e820 table (packed: read unaligned).
        let (addr, size, kind) = unsafe {
            (
                (entry as *const u64).read_unaligned(),
                ((entry + 8) as *const u64).read_unaligned(),
                ((entry + 16) as *const u32).read_unaligned(),
            )
        };
        (kind == E820_RAM).then(|| (addr, addr.saturating_add(size)))
    })
}

/// The value of the command line's last `workload=` word, or the default workload.
fn workload(zero_page: u64) -> &'static [u8] {
    // SAFETY: a word of the zero page.
    let cmdline = unsafe { read_volatile((zero_page + CMD_LINE_PTR) as *const u32) } as u64;
    if cmdline == 0 {
        return DEFAULT_WORKLOAD;
    }
    let mut length = 0;
    // SAFETY: the loader's command line, NUL-terminated, in low RAM.
    while length < CMDLINE_MAX && unsafe { read_volatile((cmdline + length) as *const u8) } != 0 {
        length += 1;
    }
    // SAFETY: the bytes just read, which nothing writes while the guest runs.
    let text = unsafe { core::slice::from_raw_parts(cmdline as *const u8, length as usize) };
    text.split(|&byte| byte == b' ')
        .filter_map(|word| word.strip_prefix(b"workload="))
        .next_back()
        .unwrap_or(DEFAULT_WORKLOAD)
}

fn parse_number(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u64, |value, &byte| {
        let digit = byte.checked_sub(b'0').filter(|&digit| digit < 10)?;
        value.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Maps `[0, limit)` (whole GiBs) one to one with 2 MiB pages and switches to those tables.
fn map_identity(limit: u64) {
    let (pml4, pdpt) = (TABLES, TABLES + PAGE);
    // SAFETY: the table pages are RAM below the stacks that nothing else uses in this mode;
    // they map every address the guest uses, its code and stack included, where the loader's
    // tables did, so switching CR3 to them changes no translation the guest relies on.
    unsafe {
        for index in 0..512 {
            write_volatile((pml4 + index * 8) as *mut u64, 0);
            write_volatile((pdpt + index * 8) as *mut u64, 0);
        }
        write_volatile(pml4 as *mut u64, pdpt | 0x3);
        for gib in 0..limit / GIB {
            let directory = TABLES + (2 + gib) * PAGE;
            write_volatile((pdpt + gib * 8) as *mut u64, directory | 0x3);
            for index in 0..512 {
                let frame = gib * GIB + index * (2 << 20);
                // Present, writable, a 2 MiB page.
                write_volatile((directory + index * 8) as *mut u64, frame | 0x83);
            }
        }
        core::arch::asm!("mov cr3, {}", in(reg) pml4, options(nostack));
    }
}

/// Waits for a byte on the serial console (a checkpoint's go).
pub fn wait_for_input() {
    const LINE_STATUS_DATA_READY: u8 = 1;
    while super::inb(super::SERIAL_LINE_STATUS) & LINE_STATUS_DATA_READY == 0 {
        core::hint::spin_loop();
    }
    super::inb(super::SERIAL_DATA);
}

/// Resets the machine through the i8042 keyboard controller, which ends the VMM.
pub fn reset() -> ! {
    super::outb(0x64, 0xfe);
    loop {
        // SAFETY: halting with interrupts off only stops this vCPU.
        unsafe { core::arch::asm!("cli", "hlt", options(nomem, nostack)) };
    }
}
