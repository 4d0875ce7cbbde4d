//! The ACPI tables of a Linux guest, built with rust-vmm's `acpi_tables`: the RSDP at
//! [`ACPI_START`] (where Linux scans the BIOS area for it), an XSDT naming the FADT and the
//! MADT, a FADT of a hardware-reduced platform, a MADT of the vCPUs' local APICs, and a DSDT
//! with the two devices only ACPI can describe: the VM generation id (`VMGENCTR`, its `ADDR`
//! package naming where the id lies) and the generic event device (`ACPI0013`) whose interrupt
//! notifies it, as Firecracker describes them.
//!
//! The MADT names no IOAPIC, so that Linux takes the IOAPIC and the interrupt wiring of all its
//! pins from the MP table, as it does without ACPI (a hardware-reduced platform has no legacy
//! PIC, and an IOAPIC from the MADT would then wire no legacy IRQ); without any MADT Linux
//! would drop the MP table and boot on one CPU without an IOAPIC. The virtio-mmio devices stay
//! on the command line, and the FADT's boot flags say the legacy devices and the i8042 are
//! there, so that Linux keeps probing them.

use acpi_tables::aml::{
    Arg, Device, Equal, If, Interrupt, Method, Name, Notify, Package, Path, ResourceTemplate, Scope,
};
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::madt::{EnabledStatus, LocalInterruptController, ProcessorLocalApic, MADT};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout::{ACPI_START, VMGENID_START};

/// Errors of ACPI table set-up.
#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    /// More vCPUs than local APIC ids.
    #[error("a MADT lists at most 255 local APICs, not {0}")]
    VcpuCount(usize),
    /// The tables do not fit below the generation id.
    #[error("the ACPI tables take {size} bytes, {room} fit at {ACPI_START:#x}")]
    TooLarge {
        /// Their size.
        size: u64,
        /// The room there is.
        room: u64,
    },
    /// A table could not be written to guest memory.
    #[error("cannot write the ACPI table {table} at {address:#x}: {source}")]
    Write {
        /// The table's signature.
        table: &'static str,
        /// Its guest address.
        address: u64,
        /// The guest memory's error.
        source: vm_memory::GuestMemoryError,
    },
}

/// The OEM id every table carries.
const OEM_ID: [u8; 6] = *b"LLFREE";
/// The OEM table id every table carries.
const OEM_TABLE_ID: [u8; 8] = *b"LLFVMM  ";
/// The OEM revision every table carries.
const OEM_REVISION: u32 = 1;
/// The hypervisor's name in the FADT.
const HYPERVISOR_VENDOR: u64 = u64::from_le_bytes(*b"LLFREEVM");
/// The DSDT's revision: 2 and up have 64-bit integers.
const DSDT_REVISION: u8 = 6;
/// IA-PC boot architecture flags of the FADT: legacy devices (the serial port) and an 8042.
const BOOT_ARCH_LEGACY_DEVICES: u16 = 1 << 0;
const BOOT_ARCH_8042: u16 = 1 << 1;
/// The notification value that tells the generation id device its id changed.
const VMGENID_NOTIFY: u8 = 0x80;
/// Where each table starts: 16-byte aligned.
const TABLE_ALIGN: u64 = 16;
/// Physical address of the local APICs.
const LAPIC_ADDRESS: u32 = 0xfee0_0000;

/// Where the devices the DSDT describes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcpiDevices {
    /// Guest physical address of the 16-byte VM generation id.
    pub vmgenid_address: u64,
    /// GSI of the generic event device (edge-triggered, active high): it notifies the
    /// generation id device.
    pub ged_gsi: u32,
}

/// Writes RSDP, XSDT, FADT, MADT (of `vcpus` local APICs, ids 0 up, as the MP table numbers
/// them) and DSDT into `memory` from [`ACPI_START`]; returns the address past the last table.
pub fn write_acpi_tables<M: GuestMemoryBackend>(
    memory: &M,
    vcpus: usize,
    devices: &AcpiDevices,
) -> Result<u64, AcpiError> {
    let madt = aml_bytes(&madt(vcpus)?);
    let xsdt_address = align(ACPI_START + Rsdp::len() as u64);
    let fadt_address = align(xsdt_address + XSDT_LEN);
    let madt_address = align(fadt_address + acpi_tables::fadt::FADT::len() as u64);
    let dsdt_address = align(madt_address + madt.len() as u64);
    let dsdt = dsdt(devices);
    let end = dsdt_address + dsdt.len() as u64;
    if end > VMGENID_START {
        return Err(AcpiError::TooLarge {
            size: end - ACPI_START,
            room: VMGENID_START - ACPI_START,
        });
    }

    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(fadt_address);
    xsdt.add_entry(madt_address);
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt_address)
        .flag(Flags::HwReducedAcpi)
        // The power and sleep buttons are not fixed hardware (there are none).
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    fadt.iapc_boot_arch = (BOOT_ARCH_LEGACY_DEVICES | BOOT_ARCH_8042).into();
    fadt.hypervisor_vendor_identity = HYPERVISOR_VENDOR.into();
    let fadt = fadt.finalize();
    let rsdp = Rsdp::new(OEM_ID, xsdt_address);

    write(memory, "RSDP", ACPI_START, &aml_bytes(&rsdp))?;
    write(memory, "XSDT", xsdt_address, &aml_bytes(&xsdt))?;
    write(memory, "FACP", fadt_address, &aml_bytes(&fadt))?;
    write(memory, "APIC", madt_address, &madt)?;
    write(memory, "DSDT", dsdt_address, dsdt.as_slice())?;
    Ok(end)
}

/// Bytes of an XSDT with two entries.
const XSDT_LEN: u64 = 36 + 2 * 8;

fn align(address: u64) -> u64 {
    address.next_multiple_of(TABLE_ALIGN)
}

fn aml_bytes(table: &dyn Aml) -> Vec<u8> {
    let mut bytes = Vec::new();
    table.to_aml_bytes(&mut bytes);
    bytes
}

fn write<M: GuestMemoryBackend>(
    memory: &M,
    table: &'static str,
    address: u64,
    bytes: &[u8],
) -> Result<(), AcpiError> {
    memory
        .write_slice(bytes, GuestAddress(address))
        .map_err(|source| AcpiError::Write {
            table,
            address,
            source,
        })
}

/// The MADT: one enabled local APIC per vCPU, its id the vCPU's index.
fn madt(vcpus: usize) -> Result<MADT, AcpiError> {
    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
        LocalInterruptController::Address(LAPIC_ADDRESS),
    );
    for index in 0..vcpus {
        let id = u8::try_from(index)
            .ok()
            .filter(|id| *id != u8::MAX)
            .ok_or(AcpiError::VcpuCount(vcpus))?;
        madt.add_structure(ProcessorLocalApic::new(id, id, EnabledStatus::Enabled));
    }
    Ok(madt)
}

/// The DSDT: `\_SB_.VGEN`, the generation id, and `\_SB_.GED_`, whose event method notifies
/// it when its interrupt fires.
fn dsdt(devices: &AcpiDevices) -> Sdt {
    // The id's address as the two 32-bit halves Linux's driver and Windows read.
    let low = devices.vmgenid_address as u32;
    let high = (devices.vmgenid_address >> 32) as u32;
    let address = Package::new(vec![&low, &high]);
    let interrupt = Interrupt::new(true, true, false, false, devices.ged_gsi);
    let resources = ResourceTemplate::new(vec![&interrupt]);
    let vmgenid_path = Path::new("\\_SB_.VGEN");
    let notify = Notify::new(&vmgenid_path, &VMGENID_NOTIFY);
    let is_vmgenid = Equal::new(&Arg(0), &devices.ged_gsi);
    let on_vmgenid = If::new(&is_vmgenid, vec![&notify]);
    let event = Method::new("_EVT".into(), 1, true, vec![&on_vmgenid]);
    // One statement: the names and devices are temporaries that must outlive the scope.
    let system_bus = aml_bytes(&Scope::new(
        "\\_SB_".into(),
        vec![
            &Device::new(
                "VGEN".into(),
                vec![
                    &Name::new("_HID".into(), &"VMGENCTR"),
                    &Name::new("_CID".into(), &"VM_Gen_Counter"),
                    &Name::new("_DDN".into(), &"VM_Gen_Counter"),
                    &Name::new("ADDR".into(), &address),
                ],
            ),
            &Device::new(
                "GED_".into(),
                vec![
                    &Name::new("_HID".into(), &"ACPI0013"),
                    &Name::new("_UID".into(), &0u8),
                    &Name::new("_CRS".into(), &resources),
                    &event,
                ],
            ),
        ],
    ));

    let mut dsdt = Sdt::new(
        *b"DSDT",
        36,
        DSDT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    dsdt.append_slice(&system_bus);
    dsdt
}

#[cfg(test)]
mod tests {
    use vm_memory::GuestMemoryMmap;

    use super::*;

    const DEVICES: AcpiDevices = AcpiDevices {
        vmgenid_address: VMGENID_START,
        ged_gsi: 23,
    };

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    fn read(memory: &GuestMemoryMmap, address: u64, len: usize) -> Vec<u8> {
        let mut bytes = vec![0; len];
        memory
            .read_slice(&mut bytes, GuestAddress(address))
            .unwrap();
        bytes
    }

    fn u32_at(bytes: &[u8], offset: usize) -> u32 {
        u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
    }

    fn u64_at(bytes: &[u8], offset: usize) -> u64 {
        u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
    }

    fn sums_to_zero(bytes: &[u8]) -> bool {
        bytes.iter().fold(0u8, |sum, b| sum.wrapping_add(*b)) == 0
    }

    /// Reads the table at `address` as its header's length says, checking its signature and
    /// checksum.
    fn table(memory: &GuestMemoryMmap, address: u64, signature: &[u8; 4]) -> Vec<u8> {
        let header = read(memory, address, 36);
        assert_eq!(&header[..4], signature);
        let bytes = read(memory, address, u32_at(&header, 4) as usize);
        assert!(sums_to_zero(&bytes), "{signature:?}'s checksum");
        bytes
    }

    #[test]
    fn the_rsdp_leads_through_xsdt_and_fadt_to_the_dsdt() {
        let memory = memory();
        let end = write_acpi_tables(&memory, 3, &DEVICES).unwrap();
        assert!(end <= VMGENID_START);

        let rsdp = read(&memory, ACPI_START, 36);
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert_eq!(rsdp[15], 2, "ACPI 2.0+: the XSDT");
        assert!(sums_to_zero(&rsdp[..20]) && sums_to_zero(&rsdp));
        let xsdt = table(&memory, u64_at(&rsdp, 24), b"XSDT");
        assert_eq!(xsdt.len() as u64, XSDT_LEN, "two entries");
        let fadt = table(&memory, u64_at(&xsdt, 36), b"FACP");
        let madt = table(&memory, u64_at(&xsdt, 44), b"APIC");
        assert_eq!(u32_at(&madt, 36), LAPIC_ADDRESS);
        // Three local APICs (type 0, 8 bytes: uid, id, enabled) and nothing else: no IOAPIC.
        assert_eq!(madt.len(), 44 + 3 * 8);
        for (index, entry) in madt[44..].chunks(8).enumerate() {
            assert_eq!(entry[..4], [0, 8, index as u8, index as u8]);
            assert_eq!(u32_at(entry, 4), 1);
        }
        let flags = u32_at(&fadt, 112);
        assert_ne!(flags & Flags::HwReducedAcpi as u32, 0);
        let boot_arch = u16::from_le_bytes([fadt[109], fadt[110]]);
        assert_eq!(boot_arch, BOOT_ARCH_LEGACY_DEVICES | BOOT_ARCH_8042);
        let dsdt = table(&memory, u64_at(&fadt, 140), b"DSDT");
        assert!(u64_at(&fadt, 140) + dsdt.len() as u64 == end);
    }

    #[test]
    fn the_dsdt_describes_the_generation_id_and_its_event_device() {
        let memory = memory();
        write_acpi_tables(&memory, 1, &DEVICES).unwrap();
        let aml = dsdt(&DEVICES);
        let aml = aml.as_slice();
        let has = |needle: &[u8]| aml.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"VGEN") && has(b"VMGENCTR\0") && has(b"ADDR"));
        assert!(has(b"GED_") && has(b"ACPI0013\0") && has(b"_EVT"));
        // ADDR: a package of two integers, the address's halves (DWordPrefix 0x0c; the high
        // half 0 is ZeroOp).
        let mut package = vec![0x0c];
        package.extend_from_slice(&(VMGENID_START as u32).to_le_bytes());
        package.push(0x00);
        assert!(has(&package));
        // The event device's interrupt: an extended IRQ descriptor for GSI 23, a consumer,
        // edge-triggered, active high, exclusive.
        assert!(has(&[0x89, 6, 0, 0b0011, 1, 23, 0, 0, 0]));
        // Notify (\_SB_.VGEN, 0x80).
        assert!(has(&[
            0x86, b'\\', 0x2e, b'_', b'S', b'B', b'_', b'V', b'G', b'E', b'N'
        ]));
    }

    #[test]
    fn tables_that_do_not_fit_are_refused() {
        let small = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0xe_0010)]).unwrap();
        assert!(matches!(
            write_acpi_tables(&small, 1, &DEVICES),
            Err(AcpiError::Write { table: "RSDP", .. })
        ));
        assert!(matches!(
            write_acpi_tables(&memory(), 256, &DEVICES),
            Err(AcpiError::VcpuCount(256))
        ));
        let end = write_acpi_tables(&memory(), crate::config::MAX_VCPUS, &DEVICES).unwrap();
        assert!(end <= VMGENID_START);
    }
}
