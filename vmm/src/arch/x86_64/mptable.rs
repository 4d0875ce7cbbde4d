//! The MP table (Intel MultiProcessor Specification 1.4) through which Linux finds the vCPUs
//! beyond the boot one, the I/O APIC and the legacy interrupt wiring, as Firecracker writes it.
//!
//! The floating pointer structure sits at [`MPTABLE_START`] (the first KiB of the EBDA, where
//! Linux scans for it) and points at the configuration table right behind it: the header, one
//! processor entry per vCPU, the ISA bus, the I/O APIC, one I/O interrupt entry per IOAPIC pin
//! and the two local interrupt entries of the virtual-wire mode.

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout::{IRQ_MAX, MPTABLE_MAX_SIZE, MPTABLE_START};

/// Errors of MP table set-up.
#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    /// The vCPU count is 0, or its entries do not fit (or their APIC ids run out).
    #[error("an MP table describes 1 to {max} vCPUs, not {vcpus}")]
    VcpuCount {
        /// The requested vCPU count.
        vcpus: usize,
        /// The most vCPUs an MP table holds here.
        max: usize,
    },
    /// The MP table could not be written to guest memory.
    #[error("cannot write the MP table to guest memory at {addr:#x}: {source}")]
    Write {
        /// Guest physical address of the failed write.
        addr: u64,
        /// The guest memory error.
        source: vm_memory::GuestMemoryError,
    },
}

/// Size of the MP floating pointer structure.
const FLOATING_POINTER_SIZE: usize = 16;
/// Size of the configuration table header.
const HEADER_SIZE: usize = 44;
/// Size of a processor entry.
const PROCESSOR_ENTRY_SIZE: usize = 20;
/// Size of every other base table entry (bus, I/O APIC, interrupt assignments).
const ENTRY_SIZE: usize = 8;
/// Number of IOAPIC pins, each with an I/O interrupt assignment entry.
const IOAPIC_PINS: usize = IRQ_MAX as usize + 1;
/// Entries other than processors: bus, I/O APIC, I/O interrupts, two local interrupts.
const OTHER_ENTRIES: usize = 2 + IOAPIC_PINS + 2;
/// Highest usable APIC id + 1: 0xff addresses all local APICs, and the I/O APIC takes the id
/// after the last vCPU.
const APIC_IDS: usize = 0xff;

/// MP specification revision 1.4.
const SPEC_REVISION: u8 = 4;
/// Physical address of the local APICs.
const LAPIC_ADDRESS: u32 = 0xfee0_0000;
/// Physical address of the I/O APIC.
const IOAPIC_ADDRESS: u32 = 0xfec0_0000;
/// Version of KVM's local APIC (integrated APIC).
const LAPIC_VERSION: u8 = 0x14;
/// Version of KVM's I/O APIC (82093AA).
const IOAPIC_VERSION: u8 = 0x11;
/// Processor signature: family 6.
const CPU_SIGNATURE: u32 = 0x600;
/// Processor feature flags: on-chip FPU (bit 0) and APIC (bit 9).
const CPU_FEATURES: u32 = 1 | 1 << 9;

/// Entry types of the base configuration table.
const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
/// Processor flags: enabled (bit 0), bootstrap processor (bit 1).
const CPU_ENABLED: u8 = 1;
const CPU_BSP: u8 = 2;
/// I/O APIC flag: usable.
const IOAPIC_USABLE: u8 = 1;
/// Interrupt types: vectored (INT), NMI, ExtINT.
const INTERRUPT_INT: u8 = 0;
const INTERRUPT_NMI: u8 = 1;
const INTERRUPT_EXTINT: u8 = 3;
/// Id of the only bus, the ISA bus.
const ISA_BUS_ID: u8 = 0;
/// Destination APIC id meaning "all local APICs".
const ALL_LAPICS: u8 = 0xff;

/// Size of the MP table (floating pointer and configuration table) for `vcpus` vCPUs.
pub const fn mptable_size(vcpus: usize) -> usize {
    FLOATING_POINTER_SIZE + HEADER_SIZE + vcpus * PROCESSOR_ENTRY_SIZE + OTHER_ENTRIES * ENTRY_SIZE
}

/// The most vCPUs an MP table at [`MPTABLE_START`] describes: bounded by
/// [`MPTABLE_MAX_SIZE`] and by the APIC ids.
pub const fn max_vcpus() -> usize {
    let fitting = (MPTABLE_MAX_SIZE as usize - mptable_size(0)) / PROCESSOR_ENTRY_SIZE;
    if fitting < APIC_IDS {
        fitting
    } else {
        APIC_IDS
    }
}

const _: () = assert!(max_vcpus() >= crate::vm::MAX_VCPUS);

/// The byte that makes the sum of `bytes` and itself 0 modulo 256.
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |sum, byte| sum.wrapping_add(*byte))
        .wrapping_neg()
}

/// Appends an I/O or local (`type_`) interrupt assignment entry of interrupt type `kind` from
/// ISA IRQ `source_irq` to pin `pin` of APIC `apic`, with bus-default polarity and trigger.
fn interrupt_entry(table: &mut Vec<u8>, type_: u8, kind: u8, source_irq: u8, apic: u8, pin: u8) {
    table.extend_from_slice(&[type_, kind, 0, 0, ISA_BUS_ID, source_irq, apic, pin]);
}

/// Builds the configuration table (header and entries) for `vcpus` vCPUs, checksummed.
fn config_table(vcpus: usize) -> Vec<u8> {
    let ioapic_id = vcpus as u8;
    let mut table = Vec::with_capacity(mptable_size(vcpus) - FLOATING_POINTER_SIZE);
    table.resize(HEADER_SIZE, 0);
    for id in 0..vcpus {
        let flags = if id == 0 {
            CPU_ENABLED | CPU_BSP
        } else {
            CPU_ENABLED
        };
        table.extend_from_slice(&[ENTRY_PROCESSOR, id as u8, LAPIC_VERSION, flags]);
        table.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        table.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        table.extend_from_slice(&[0; 8]);
    }
    table.extend_from_slice(&[ENTRY_BUS, ISA_BUS_ID]);
    table.extend_from_slice(b"ISA   ");
    table.extend_from_slice(&[ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, IOAPIC_USABLE]);
    table.extend_from_slice(&IOAPIC_ADDRESS.to_le_bytes());
    for pin in 0..IOAPIC_PINS as u8 {
        interrupt_entry(
            &mut table,
            ENTRY_IO_INTERRUPT,
            INTERRUPT_INT,
            pin,
            ioapic_id,
            pin,
        );
    }
    let (local, extint, nmi) = (ENTRY_LOCAL_INTERRUPT, INTERRUPT_EXTINT, INTERRUPT_NMI);
    interrupt_entry(&mut table, local, extint, 0, 0, 0);
    interrupt_entry(&mut table, local, nmi, 0, ALL_LAPICS, 1);

    let entries = (vcpus + OTHER_ENTRIES) as u16;
    let mut header = [0u8; HEADER_SIZE];
    header[0..4].copy_from_slice(b"PCMP");
    header[4..6].copy_from_slice(&(table.len() as u16).to_le_bytes());
    header[6] = SPEC_REVISION;
    header[8..16].copy_from_slice(b"LLFREE  ");
    header[16..28].copy_from_slice(b"LLFREE-VMM  ");
    header[34..36].copy_from_slice(&entries.to_le_bytes());
    header[36..40].copy_from_slice(&LAPIC_ADDRESS.to_le_bytes());
    table[..HEADER_SIZE].copy_from_slice(&header);
    table[7] = checksum(&table);
    table
}

/// Builds the floating pointer structure pointing at a configuration table at `config_addr`.
fn floating_pointer(config_addr: u32) -> [u8; FLOATING_POINTER_SIZE] {
    let mut pointer = [0u8; FLOATING_POINTER_SIZE];
    pointer[0..4].copy_from_slice(b"_MP_");
    pointer[4..8].copy_from_slice(&config_addr.to_le_bytes());
    pointer[8] = 1; // Length in 16-byte units.
    pointer[9] = SPEC_REVISION;
    // Feature byte 1 = 0: a configuration table is present.
    pointer[10] = checksum(&pointer);
    pointer
}

/// Writes the MP table for `vcpus` vCPUs (APIC id = vCPU index, vCPU 0 the bootstrap
/// processor, the I/O APIC with id `vcpus`) at [`MPTABLE_START`] in `mem`.
pub fn write_mptable<M: GuestMemoryBackend>(mem: &M, vcpus: usize) -> Result<(), MpTableError> {
    if vcpus == 0 || vcpus > max_vcpus() {
        return Err(MpTableError::VcpuCount {
            vcpus,
            max: max_vcpus(),
        });
    }
    let config_addr = MPTABLE_START + FLOATING_POINTER_SIZE as u64;
    let write = |bytes: &[u8], addr: u64| {
        mem.write_slice(bytes, GuestAddress(addr))
            .map_err(|source| MpTableError::Write { addr, source })
    };
    write(&floating_pointer(config_addr as u32), MPTABLE_START)?;
    write(&config_table(vcpus), config_addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn memory() -> GuestMemoryMmap<()> {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    fn read(mem: &GuestMemoryMmap<()>, addr: u64, len: usize) -> Vec<u8> {
        let mut bytes = vec![0; len];
        mem.read_slice(&mut bytes, GuestAddress(addr)).unwrap();
        bytes
    }

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0, |sum, byte| sum.wrapping_add(*byte))
    }

    /// Writes the table for `vcpus` and returns its floating pointer and configuration table.
    fn written(vcpus: usize) -> (Vec<u8>, Vec<u8>) {
        let mem = memory();
        write_mptable(&mem, vcpus).unwrap();
        let pointer = read(&mem, MPTABLE_START, FLOATING_POINTER_SIZE);
        let config_addr = u32::from_le_bytes(pointer[4..8].try_into().unwrap()) as u64;
        let header = read(&mem, config_addr, HEADER_SIZE);
        let length = u16::from_le_bytes([header[4], header[5]]) as usize;
        (pointer, read(&mem, config_addr, length))
    }

    #[test]
    fn both_structures_have_their_signature_and_a_zero_checksum() {
        for vcpus in [1, 4, max_vcpus()] {
            let (pointer, table) = written(vcpus);
            assert_eq!(&pointer[0..4], b"_MP_");
            assert_eq!(&table[0..4], b"PCMP");
            assert_eq!((pointer[8], pointer[9], table[6]), (1, 4, 4));
            assert_eq!(sum(&pointer), 0);
            assert_eq!(sum(&table), 0);
        }
    }

    #[test]
    fn entry_counts_follow_the_vcpus() {
        for vcpus in [1, 8] {
            let (pointer, table) = written(vcpus);
            let count = u16::from_le_bytes([table[34], table[35]]) as usize;
            assert_eq!(count, vcpus + 1 + 1 + 24 + 2);
            assert_eq!(table.len() + pointer.len(), mptable_size(vcpus));
            let entries = &table[HEADER_SIZE..];
            let processors: Vec<_> = entries.chunks(PROCESSOR_ENTRY_SIZE).take(vcpus).collect();
            for (id, entry) in processors.iter().enumerate() {
                let bsp = if id == 0 { CPU_BSP } else { 0 };
                assert_eq!(
                    entry[..4],
                    [ENTRY_PROCESSOR, id as u8, 0x14, CPU_ENABLED | bsp]
                );
            }
            let rest: Vec<_> = entries[vcpus * PROCESSOR_ENTRY_SIZE..].chunks(8).collect();
            assert_eq!(rest.len(), OTHER_ENTRIES);
            assert_eq!(rest[0], [ENTRY_BUS, 0, b'I', b'S', b'A', b' ', b' ', b' ']);
            assert_eq!(rest[1][..4], [ENTRY_IOAPIC, vcpus as u8, 0x11, 1]);
            assert_eq!(rest[1][4..], 0xfec0_0000u32.to_le_bytes());
            for pin in 0..24u8 {
                assert_eq!(
                    rest[2 + pin as usize],
                    [3, 0, 0, 0, 0, pin, vcpus as u8, pin]
                );
            }
            assert_eq!(rest[26], [4, INTERRUPT_EXTINT, 0, 0, 0, 0, 0, 0]);
            assert_eq!(rest[27], [4, INTERRUPT_NMI, 0, 0, 0, 0, 0xff, 1]);
        }
    }

    #[test]
    fn the_largest_table_fits_its_space_and_more_vcpus_are_an_error() {
        assert!(mptable_size(max_vcpus()) as u64 <= MPTABLE_MAX_SIZE);
        let mem = memory();
        for vcpus in [0, max_vcpus() + 1] {
            assert!(matches!(
                write_mptable(&mem, vcpus),
                Err(MpTableError::VcpuCount { .. })
            ));
        }
    }

    #[test]
    fn memory_without_the_ebda_is_a_write_error() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x9_0000)]).unwrap();
        assert!(matches!(
            write_mptable(&mem, 2),
            Err(MpTableError::Write { addr, .. }) if addr == MPTABLE_START
        ));
    }
}
