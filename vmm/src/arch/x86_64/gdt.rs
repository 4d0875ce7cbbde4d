//! The boot Global Descriptor Tables: a flat 64-bit code segment, a flat data segment and a TSS
//! descriptor, as Firecracker and Cloud Hypervisor set up for Linux's 64-bit boot protocol, and
//! the same with a flat 32-bit code segment for the PVH boot protocol.

use kvm_bindings::kvm_segment;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// Errors of GDT set-up.
#[derive(Debug, thiserror::Error)]
pub enum GdtError {
    /// The GDT or IDT could not be written to guest memory.
    #[error("cannot write the boot GDT/IDT to guest memory at {addr:#x}: {source}")]
    Write {
        /// Guest physical address of the failed write.
        addr: u64,
        /// The guest memory error.
        source: vm_memory::GuestMemoryError,
    },
}

/// Selector of the 64-bit code segment (GDT index 1).
pub const CODE_SELECTOR: u16 = 1 << 3;
/// Selector of the data segment (GDT index 2).
pub const DATA_SELECTOR: u16 = 2 << 3;
/// Selector of the task state segment (GDT index 3).
pub const TSS_SELECTOR: u16 = 3 << 3;

/// Access/flags word of a present, ring-0, executable, readable, accessed, 64-bit (L=1) code
/// segment with 4 KiB granularity.
const CODE_FLAGS: u16 = 0xa09b;
/// Access/flags word of a present, ring-0, executable, readable, accessed, 32-bit (D/B=1) code
/// segment with 4 KiB granularity.
const CODE32_FLAGS: u16 = 0xc09b;
/// Access/flags word of a present, ring-0, writable, accessed, 32-bit (D/B=1) data segment with
/// 4 KiB granularity.
const DATA_FLAGS: u16 = 0xc093;
/// Access/flags word of a present, busy 64-bit TSS with 4 KiB granularity.
const TSS_FLAGS: u16 = 0x808b;

/// The four boot GDT entries: null, code, data, TSS.
pub const BOOT_GDT: [u64; 4] = [
    0,
    gdt_entry(CODE_FLAGS, 0, 0xfffff),
    gdt_entry(DATA_FLAGS, 0, 0xfffff),
    gdt_entry(TSS_FLAGS, 0, 0xfffff),
];

/// The four GDT entries of a PVH entry (32-bit protected mode): null, code, data, TSS.
pub const PVH_GDT: [u64; 4] = [
    0,
    gdt_entry(CODE32_FLAGS, 0, 0xfffff),
    gdt_entry(DATA_FLAGS, 0, 0xfffff),
    gdt_entry(TSS_FLAGS, 0, 0xfffff),
];

/// Encodes a segment descriptor from its access/flags word (access byte in bits 0-7, flags in
/// bits 12-15), base and 20-bit limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let base = base as u64;
    let limit = limit as u64;
    let flags = flags as u64;
    ((base & 0xff00_0000) << (56 - 24))
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << (48 - 16))
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0x0000_ffff)
}

/// Decodes a descriptor into the `kvm_segment` KVM expects in `kvm_sregs` for `selector`.
pub fn kvm_segment_from_gdt(entry: u64, selector: u16) -> kvm_segment {
    let bit = |n: u32| ((entry >> n) & 1) as u8;
    let limit = ((entry & 0xffff) | ((entry >> 32) & 0xf_0000)) as u32;
    let granularity = bit(55);
    kvm_segment {
        base: ((entry >> 16) & 0xff_ffff) | ((entry >> 32) & 0xff00_0000),
        // With 4 KiB granularity the limit counts pages: KVM wants it in bytes.
        limit: if granularity == 1 {
            (limit << 12) | 0xfff
        } else {
            limit
        },
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present: bit(47),
        dpl: ((entry >> 45) & 0x3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g: granularity,
        avl: bit(52),
        unusable: u8::from(bit(47) == 0),
        padding: 0,
    }
}

/// The segments a vCPU starts with.
#[derive(Clone, Copy, Debug)]
pub struct BootSegments {
    /// Code segment.
    pub code: kvm_segment,
    /// Data segment, loaded into DS, ES, FS, GS and SS.
    pub data: kvm_segment,
    /// Task register.
    pub tss: kvm_segment,
}

impl BootSegments {
    /// The segments described by [`BOOT_GDT`] (64-bit mode).
    pub fn new() -> Self {
        Self::of(&BOOT_GDT)
    }

    /// The segments described by [`PVH_GDT`] (32-bit protected mode).
    pub fn pvh() -> Self {
        Self::of(&PVH_GDT)
    }

    fn of(gdt: &[u64; 4]) -> Self {
        BootSegments {
            code: kvm_segment_from_gdt(gdt[1], CODE_SELECTOR),
            data: kvm_segment_from_gdt(gdt[2], DATA_SELECTOR),
            tss: kvm_segment_from_gdt(gdt[3], TSS_SELECTOR),
        }
    }
}

impl Default for BootSegments {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes `gdt` ([`BOOT_GDT`] or [`PVH_GDT`]) at `gdt_addr` and an empty IDT (one zero entry)
/// at `idt_addr`.
pub fn write_gdt_and_idt<M: GuestMemoryBackend>(
    mem: &M,
    gdt: &[u64; 4],
    gdt_addr: GuestAddress,
    idt_addr: GuestAddress,
) -> Result<(), GdtError> {
    for (index, entry) in gdt.iter().enumerate() {
        let addr = gdt_addr.0 + (index * 8) as u64;
        mem.write_obj(*entry, GuestAddress(addr))
            .map_err(|source| GdtError::Write { addr, source })?;
    }
    mem.write_obj(0u64, idt_addr)
        .map_err(|source| GdtError::Write {
            addr: idt_addr.0,
            source,
        })
}

/// Size in bytes of the boot GDT, as loaded into GDTR (limit = size - 1).
pub const BOOT_GDT_SIZE: u16 = (BOOT_GDT.len() * 8) as u16;

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn entries_match_the_well_known_encodings() {
        // The values Linux's own boot GDT and Firecracker use.
        assert_eq!(BOOT_GDT[1], 0x00af_9b00_0000_ffff);
        assert_eq!(BOOT_GDT[2], 0x00cf_9300_0000_ffff);
        assert_eq!(BOOT_GDT[3], 0x008f_8b00_0000_ffff);
        assert_eq!(gdt_entry(0, 0x1234_5678, 0), 0x1200_0034_5678_0000);
    }

    #[test]
    fn code_segment_is_flat_64_bit_ring_0() {
        let seg = BootSegments::new().code;
        assert_eq!((seg.base, seg.limit), (0, 0xffff_ffff));
        assert_eq!(
            (seg.l, seg.db, seg.dpl, seg.present, seg.s),
            (1, 0, 0, 1, 1)
        );
        assert_eq!(seg.type_, 0xb);
        assert_eq!(seg.selector, CODE_SELECTOR);
        assert_eq!(seg.unusable, 0);
    }

    #[test]
    fn pvh_code_segment_is_flat_32_bit_ring_0() {
        assert_eq!(PVH_GDT[1], 0x00cf_9b00_0000_ffff);
        let segments = BootSegments::pvh();
        assert_eq!((segments.code.base, segments.code.limit), (0, 0xffff_ffff));
        assert_eq!(
            (segments.code.l, segments.code.db, segments.code.type_),
            (0, 1, 0xb)
        );
        assert_eq!(segments.data.type_, BootSegments::new().data.type_);
    }

    #[test]
    fn data_and_tss_segments() {
        let segments = BootSegments::new();
        assert_eq!(
            (segments.data.l, segments.data.db, segments.data.type_),
            (0, 1, 3)
        );
        assert_eq!(segments.data.limit, 0xffff_ffff);
        assert_eq!(
            (segments.tss.s, segments.tss.type_, segments.tss.g),
            (0, 0xb, 1)
        );
        assert_eq!(segments.tss.limit, 0xffff_ffff);
    }

    #[test]
    fn writes_gdt_and_idt_to_guest_memory() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        write_gdt_and_idt(&mem, &BOOT_GDT, GuestAddress(0x500), GuestAddress(0x520)).unwrap();
        for (index, entry) in BOOT_GDT.iter().enumerate() {
            let read: u64 = mem
                .read_obj(GuestAddress(0x500 + index as u64 * 8))
                .unwrap();
            assert_eq!(read, *entry);
        }
        let err = write_gdt_and_idt(&mem, &PVH_GDT, GuestAddress(0xff8), GuestAddress(0x520))
            .unwrap_err();
        assert!(err.to_string().contains("0x1000"), "{err}");
    }
}
