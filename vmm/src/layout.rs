//! Guest physical memory layout of an x86_64 microVM.
//!
//! Follows Firecracker and Cloud Hypervisor: RAM starts at 0, a 1 GiB MMIO gap sits just below
//! 4 GiB, and RAM above the gap continues at 4 GiB. The boot structures (GDT, zero page, page
//! tables, command line) live in the low 1 MiB; kernels are loaded at or above 1 MiB.
//!
//! ```text
//! 0x0000_0000 .. 0x0009_fc00   low RAM: GDT 0x500, zero page 0x7000, stack 0x8ff0,
//!                              page tables 0x9000.., command line 0x2_0000
//! 0x0009_fc00 .. 0x0010_0000   EBDA / VGA / BIOS hole (not RAM in the e820 map);
//!                              MP table 0x9_fc00 .. 0xa_1c00, ACPI tables (Linux guests)
//!                              0xe_0000 .. 0xf_f000, VM generation id 0xf_f000
//! 0x0010_0000 .. MMIO_GAP_START  RAM (kernel at 1 MiB, initrd at the top)
//! 0xc000_0000 .. 0x1_0000_0000   MMIO gap: virtio-mmio slots, 0x1000 apart
//! 0x1_0000_0000 ..               RAM above 4 GiB
//! next 1 GiB boundary ..         the virtio-pmem device's memory (`--pmem`), if any
//! ```

/// First guest physical address of RAM.
pub const RAM_START: u64 = 0;
/// Smallest guest RAM.
pub const MIN_MEMORY: u64 = 4 << 20;
/// Largest guest RAM.
pub const MAX_MEMORY: u64 = 1 << 40;

/// Address of the boot GDT.
pub const BOOT_GDT_START: u64 = 0x500;
/// Address of the boot IDT (empty; only its limit matters at boot).
pub const BOOT_IDT_START: u64 = 0x520;
/// Address of the PVH start info (`struct hvm_start_info`), for a kernel booted through PVH.
pub const PVH_INFO_START: u64 = 0x6000;
/// Address of the PVH module list (the initrd), after the start info.
pub const PVH_MODLIST_START: u64 = 0x6040;
/// Address of the Linux zero page (`struct boot_params`).
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Address of the PVH memory map: where the zero page goes for Linux's boot protocol (a kernel
/// gets one or the other).
pub const PVH_MEMMAP_START: u64 = ZERO_PAGE_START;
/// Initial stack pointer of the boot vCPU.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Address of the boot PML4 table.
pub const PML4_START: u64 = 0x9000;
/// Address of the boot PDPT.
pub const PDPTE_START: u64 = 0xa000;
/// Address of the boot page directory.
pub const PDE_START: u64 = 0xb000;
/// Address of the kernel command line.
pub const CMDLINE_START: u64 = 0x2_0000;
/// Largest command line (including the NUL) we hand a kernel; Linux/x86 `COMMAND_LINE_SIZE`.
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// Start of the Extended BIOS Data Area: low RAM in the e820 map ends here.
pub const EBDA_START: u64 = 0x9_fc00;
/// Address of the MP table (floating pointer, then the configuration table): the first KiB of
/// the EBDA, where Linux looks for the floating pointer. It lies in the legacy hole, which the
/// e820 map leaves out, so the guest never takes it for RAM.
pub const MPTABLE_START: u64 = EBDA_START;
/// Bytes reserved for the MP table at [`MPTABLE_START`]: room for 254 processor entries.
pub const MPTABLE_MAX_SIZE: u64 = 0x2000;
/// Address of the ACPI tables of a Linux guest: the RSDP first, at the start of the BIOS area
/// Linux scans for it (as Firecracker puts it), then the XSDT, FADT, MADT and DSDT. Like the MP
/// table it lies in the legacy hole.
pub const ACPI_START: u64 = 0xe_0000;
/// Address of the VM generation id (16 bytes), in the last page of the BIOS area: the ACPI
/// tables end below it.
pub const VMGENID_START: u64 = 0xf_f000;
/// GSI of the ACPI event device that announces a new VM generation id: the IOAPIC's last pin,
/// the virtio-mmio slots end below it.
pub const VMGENID_GSI: u32 = IRQ_MAX;
/// Start of "high" memory (1 MiB): kernels are loaded at or above it.
pub const HIGH_MEMORY_START: u64 = 0x10_0000;

/// First address of the MMIO gap below 4 GiB.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End (exclusive) of the MMIO gap: 4 GiB.
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// Size of the MMIO gap.
pub const MMIO_GAP_SIZE: u64 = MMIO_GAP_END - MMIO_GAP_START;

/// Base address of the first virtio-mmio device slot.
pub const VIRTIO_MMIO_START: u64 = MMIO_GAP_START;
/// Size of (and distance between) virtio-mmio device slots.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// Number of virtio-mmio slots; bounded by the legacy IRQ lines available to them (those from
/// [`VIRTIO_IRQ_BASE`] up to the generation id's).
pub const VIRTIO_MMIO_SLOTS: u64 = (VMGENID_GSI - VIRTIO_IRQ_BASE) as u64;

/// The virtio-mmio slot of `vmm run`'s balloon: the runner adds it before any other device.
pub const BALLOON_SLOT: u64 = 0;

/// I/O port base of the first 16550 serial port (COM1).
pub const SERIAL_PORT_BASE: u64 = 0x3f8;
/// Number of I/O ports the 16550 occupies.
pub const SERIAL_PORT_SIZE: u64 = 0x8;
/// Legacy IRQ (GSI) of COM1.
pub const SERIAL_IRQ: u32 = 4;
/// GSI of the first virtio-mmio device; device `n` uses `VIRTIO_IRQ_BASE + n`.
pub const VIRTIO_IRQ_BASE: u32 = 5;
/// Highest GSI we hand out: the in-kernel IOAPIC has 24 pins.
pub const IRQ_MAX: u32 = 23;

/// Base address of virtio-mmio slot `slot`, or `None` past the last slot.
pub fn virtio_mmio_base(slot: u64) -> Option<u64> {
    (slot < VIRTIO_MMIO_SLOTS).then(|| VIRTIO_MMIO_START + slot * VIRTIO_MMIO_SIZE)
}

/// GSI of virtio-mmio slot `slot`, or `None` past the last slot.
pub fn virtio_mmio_irq(slot: u64) -> Option<u32> {
    (slot < VIRTIO_MMIO_SLOTS).then(|| VIRTIO_IRQ_BASE + slot as u32)
}

/// A contiguous range of guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRegion {
    /// First guest physical address.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
}

impl RamRegion {
    /// End (exclusive) of the region.
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
}

/// Splits `ram_size` bytes of guest RAM around the MMIO gap: one region below the gap and, if
/// needed, one starting at 4 GiB. Returns no region for a size of 0.
pub fn ram_regions(ram_size: u64) -> Vec<RamRegion> {
    let low = ram_size.min(MMIO_GAP_START - RAM_START);
    let high = ram_size - low;
    let mut regions = Vec::with_capacity(2);
    if low > 0 {
        regions.push(RamRegion {
            start: RAM_START,
            size: low,
        });
    }
    if high > 0 {
        regions.push(RamRegion {
            start: MMIO_GAP_END,
            size: high,
        });
    }
    regions
}

/// Guest RAM of `ram_size` bytes as the host backs it in frames of `frame` bytes: the regions
/// of the size rounded up to a whole frame. The guest's memory map says `ram_size`: the rest of
/// the last frame is never used (as in Firecracker, whose RAM is any number of MiB).
pub fn backed_ram_regions(ram_size: u64, frame: u64) -> Vec<RamRegion> {
    ram_regions(ram_size.next_multiple_of(frame))
}

/// What a snapshot's memory file keeps of guest RAM of `ram_size` bytes, whatever frames backed
/// it: the RAM rounded up to 2 MiB, the smallest frame, so that it loads on any backing.
pub fn saved_ram_regions(ram_size: u64) -> Vec<RamRegion> {
    backed_ram_regions(ram_size, 2 << 20)
}

/// Where the virtio-pmem device's memory of `pmem_size` bytes lies for `ram_size` bytes of RAM:
/// above RAM and the MMIO gap, at a 1 GiB boundary (Linux maps it with ZONE_DEVICE pages, which
/// want it aligned to its memory sections).
pub fn pmem_region(ram_size: u64, pmem_size: u64) -> RamRegion {
    let ram_end = ram_regions(ram_size)
        .last()
        .map_or(RAM_START, RamRegion::end)
        .max(MMIO_GAP_END);
    RamRegion {
        start: ram_end.next_multiple_of(PMEM_ALIGN),
        size: pmem_size,
    }
}

/// Alignment of the virtio-pmem region's guest address.
pub const PMEM_ALIGN: u64 = 1 << 30;

/// Where the virtio-mem device's memory of `total_size` bytes lies: above RAM, the MMIO gap
/// and the virtio-pmem memory (`pmem_size`, if any), at a 1 GiB boundary (whole Linux memory
/// blocks, and room for 1 GiB frames).
pub fn hotplug_region(ram_size: u64, pmem_size: Option<u64>, total_size: u64) -> RamRegion {
    let below = match pmem_size {
        Some(size) => pmem_region(ram_size, size).end(),
        None => ram_regions(ram_size)
            .last()
            .map_or(RAM_START, RamRegion::end)
            .max(MMIO_GAP_END),
    };
    RamRegion {
        start: below.next_multiple_of(HOTPLUG_ALIGN),
        size: total_size,
    }
}

/// Alignment of the virtio-mem region's guest address.
pub const HOTPLUG_ALIGN: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmem_lies_above_ram_and_the_gap_at_a_gib_boundary() {
        assert_eq!(pmem_region(512 << 20, 64 << 20).start, MMIO_GAP_END);
        assert_eq!(pmem_region(4 << 30, 1 << 20).start, 5 << 30);
        assert_eq!(pmem_region((4 << 30) + (2 << 20), 1 << 20).start, 6 << 30);
    }

    #[test]
    fn hot_pluggable_memory_lies_above_ram_the_gap_and_pmem_at_a_gib_boundary() {
        assert_eq!(hotplug_region(512 << 20, None, 1 << 30).start, MMIO_GAP_END);
        assert_eq!(hotplug_region(4 << 30, None, 1 << 30).start, 5 << 30);
        assert_eq!(
            hotplug_region(512 << 20, Some(2 << 20), 1 << 30).start,
            5 << 30
        );
        assert_eq!(hotplug_region(512 << 20, None, 3 << 30).size, 3 << 30);
    }

    #[test]
    fn small_ram_is_one_region_below_the_gap() {
        assert_eq!(
            ram_regions(512 << 20),
            vec![RamRegion {
                start: 0,
                size: 512 << 20
            }]
        );
        assert!(ram_regions(0).is_empty());
    }

    #[test]
    fn large_ram_is_split_around_the_gap() {
        let regions = ram_regions(4 << 30);
        assert_eq!(regions.len(), 2);
        assert_eq!(regions[0].end(), MMIO_GAP_START);
        assert_eq!(regions[1].start, MMIO_GAP_END);
        assert_eq!(regions[0].size + regions[1].size, 4 << 30);
    }

    #[test]
    fn ram_filling_exactly_the_low_part_has_no_high_region() {
        assert_eq!(ram_regions(MMIO_GAP_START).len(), 1);
    }

    #[test]
    fn virtio_slots_fit_in_the_gap_and_irqs_in_the_ioapic() {
        assert_eq!(virtio_mmio_base(0), Some(MMIO_GAP_START));
        assert_eq!(virtio_mmio_base(1), Some(MMIO_GAP_START + 0x1000));
        let last = VIRTIO_MMIO_SLOTS - 1;
        assert!(virtio_mmio_base(last).unwrap() + VIRTIO_MMIO_SIZE <= MMIO_GAP_END);
        assert_eq!(virtio_mmio_irq(last), Some(IRQ_MAX - 1));
        assert!(virtio_mmio_irq(last) < Some(VMGENID_GSI));
        assert_eq!(virtio_mmio_base(VIRTIO_MMIO_SLOTS), None);
        assert_eq!(virtio_mmio_irq(VIRTIO_MMIO_SLOTS), None);
        assert_ne!(virtio_mmio_irq(0), Some(SERIAL_IRQ));
    }

    #[test]
    fn boot_structures_are_below_the_ebda_and_do_not_overlap() {
        let mut areas = [
            (BOOT_GDT_START, 0x20),
            (BOOT_IDT_START, 0x8),
            (ZERO_PAGE_START, 0x1000),
            (PML4_START, 0x1000),
            (PDPTE_START, 0x1000),
            (PDE_START, 0x1000),
            (CMDLINE_START, CMDLINE_MAX_SIZE as u64),
        ];
        areas.sort();
        for pair in areas.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{pair:x?}");
        }
        const {
            assert!(CMDLINE_START + CMDLINE_MAX_SIZE as u64 <= EBDA_START);
            assert!(BOOT_STACK_POINTER < PML4_START);
            assert!(BOOT_STACK_POINTER > ZERO_PAGE_START + 0x1000);
            assert!(MPTABLE_START >= EBDA_START);
            assert!(MPTABLE_START + MPTABLE_MAX_SIZE <= ACPI_START);
            assert!(ACPI_START < VMGENID_START);
            assert!(VMGENID_START + 16 <= HIGH_MEMORY_START);
        }
    }
}
