//! The Linux zero page (`struct boot_params`) for the 64-bit boot protocol, and its e820 map.

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::initrd::InitrdPlacement;
use super::kernel::HDRS_MAGIC;
use super::BootError;
use crate::layout::{EBDA_START, HIGH_MEMORY_START, ZERO_PAGE_START};

/// e820 type of usable RAM.
pub const E820_RAM: u32 = 1;
/// Maximum number of e820 entries in the zero page.
pub const E820_MAX_ENTRIES: usize = 128;
/// `boot_flag` value every boot sector carries.
pub const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// `type_of_loader` for a loader without an assigned ID.
pub const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// Physical alignment a kernel without a setup header (ELF) is assumed to need: 16 MiB.
pub const ELF_KERNEL_ALIGNMENT: u32 = 0x0100_0000;

/// Builds the e820 map of `ram` (start, size) regions: each region is usable RAM, except that
/// the legacy hole between the EBDA and 1 MiB is left out.
pub fn e820_map(ram: &[(u64, u64)]) -> Result<Vec<boot_e820_entry>, BootError> {
    let mut map = Vec::new();
    let mut add = |start: u64, end: u64| {
        if end > start {
            map.push(boot_e820_entry {
                addr: start,
                size: end - start,
                r#type: E820_RAM,
            });
        }
    };
    for &(start, size) in ram {
        let end = start
            .checked_add(size)
            .ok_or(BootError::BadMemoryLayout { start, size })?;
        add(start, end.min(EBDA_START));
        add(start.max(HIGH_MEMORY_START), end);
    }
    if map.len() > E820_MAX_ENTRIES {
        return Err(BootError::TooManyE820Entries(map.len()));
    }
    map.sort_by_key(|entry| entry.addr);
    Ok(map)
}

/// Inputs of the zero page.
#[derive(Clone, Copy, Debug)]
pub struct ZeroPageConfig<'a> {
    /// The bzImage's setup header, copied into the zero page; `None` for ELF kernels.
    pub setup_header: Option<setup_header>,
    /// Guest address of the NUL-terminated command line.
    pub cmdline_addr: u64,
    /// Command line length without the NUL.
    pub cmdline_len: usize,
    /// The initrd, if any.
    pub initrd: Option<InitrdPlacement>,
    /// The e820 map.
    pub e820: &'a [boot_e820_entry],
}

/// Fills a `boot_params` as the 64-bit boot protocol requires (Documentation/arch/x86/boot.rst).
pub fn build_zero_page(config: &ZeroPageConfig) -> Result<boot_params, BootError> {
    let mut params = boot_params::default();
    match config.setup_header {
        Some(header) => params.hdr = header,
        None => params.hdr.kernel_alignment = ELF_KERNEL_ALIGNMENT,
    }
    params.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    params.hdr.boot_flag = BOOT_FLAG_MAGIC;
    params.hdr.header = HDRS_MAGIC;
    params.hdr.cmd_line_ptr = config.cmdline_addr as u32;
    params.ext_cmd_line_ptr = (config.cmdline_addr >> 32) as u32;
    params.hdr.cmdline_size =
        u32::try_from(config.cmdline_len).map_err(|_| BootError::CmdlineTooLong)?;
    if let Some(initrd) = config.initrd {
        params.hdr.ramdisk_image = initrd.address as u32;
        params.ext_ramdisk_image = (initrd.address >> 32) as u32;
        params.hdr.ramdisk_size = initrd.size as u32;
        params.ext_ramdisk_size = (initrd.size >> 32) as u32;
    }
    if config.e820.len() > E820_MAX_ENTRIES {
        return Err(BootError::TooManyE820Entries(config.e820.len()));
    }
    params.e820_table[..config.e820.len()].copy_from_slice(config.e820);
    params.e820_entries = config.e820.len() as u8;
    Ok(params)
}

/// Writes `params` to the zero page address.
pub fn write_zero_page<M: GuestMemoryBackend>(
    memory: &M,
    params: &boot_params,
) -> Result<GuestAddress, BootError> {
    let address = GuestAddress(ZERO_PAGE_START);
    let boot_params = BootParams::new::<boot_params>(params, address);
    LinuxBootConfigurator::write_bootparams::<M>(&boot_params, memory)
        .map_err(BootError::ZeroPage)?;
    Ok(address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{
        ram_regions, MMIO_GAP_END, MMIO_GAP_START, MPTABLE_MAX_SIZE, MPTABLE_START,
    };
    use vm_memory::{Address, Bytes, GuestMemoryMmap};

    fn regions(size: u64) -> Vec<(u64, u64)> {
        ram_regions(size)
            .iter()
            .map(|r| (r.start, r.size))
            .collect()
    }

    fn entries(map: &[boot_e820_entry]) -> Vec<(u64, u64)> {
        map.iter().map(|e| (e.addr, e.addr + e.size)).collect()
    }

    #[test]
    fn e820_skips_the_legacy_hole_and_the_mmio_gap() {
        let map = e820_map(&regions(256 << 20)).unwrap();
        assert_eq!(
            entries(&map),
            vec![(0, EBDA_START), (HIGH_MEMORY_START, 256 << 20)]
        );
        assert!(map.iter().all(|e| e.r#type == E820_RAM));
        let mptable = MPTABLE_START..MPTABLE_START + MPTABLE_MAX_SIZE;
        assert!(map
            .iter()
            .all(|e| e.addr + e.size <= mptable.start || e.addr >= mptable.end));

        let map = e820_map(&regions(6 << 30)).unwrap();
        assert_eq!(
            entries(&map),
            vec![
                (0, EBDA_START),
                (HIGH_MEMORY_START, MMIO_GAP_START),
                (MMIO_GAP_END, MMIO_GAP_END + (3 << 30)),
            ]
        );
    }

    #[test]
    fn e820_rejects_wrapping_regions_and_too_many_entries() {
        assert!(e820_map(&[(u64::MAX - 10, 100)]).is_err());
        let many: Vec<_> = (0..200u64).map(|i| ((i + 1) << 30, 4096)).collect();
        assert!(matches!(
            e820_map(&many),
            Err(BootError::TooManyE820Entries(200))
        ));
    }

    #[test]
    fn zero_page_for_a_bzimage_keeps_its_header_and_sets_ours() {
        let header = setup_header {
            version: 0x020f,
            xloadflags: 1,
            initrd_addr_max: 0x7fff_ffff,
            kernel_alignment: 0x20_0000,
            setup_sects: 30,
            ..Default::default()
        };
        let e820 = e820_map(&regions(512 << 20)).unwrap();
        let params = build_zero_page(&ZeroPageConfig {
            setup_header: Some(header),
            cmdline_addr: 0x2_0000,
            cmdline_len: 42,
            initrd: Some(InitrdPlacement {
                address: 0x1f00_0000,
                size: 0x12_3456,
            }),
            e820: &e820,
        })
        .unwrap();
        let hdr = params.hdr;
        assert_eq!(
            (hdr.version, hdr.setup_sects, hdr.kernel_alignment),
            (0x020f, 30, 0x20_0000)
        );
        assert_eq!({ hdr.type_of_loader }, 0xff);
        assert_eq!({ hdr.boot_flag }, 0xaa55);
        assert_eq!({ hdr.header }, 0x5372_6448);
        assert_eq!((hdr.cmd_line_ptr, hdr.cmdline_size), (0x2_0000, 42));
        assert_eq!(
            (hdr.ramdisk_image, hdr.ramdisk_size),
            (0x1f00_0000, 0x12_3456)
        );
        assert_eq!(params.e820_entries, 2);
        let second = params.e820_table[1];
        assert_eq!((second.addr, second.size), (HIGH_MEMORY_START, (511 << 20)));
    }

    #[test]
    fn zero_page_for_an_elf_kernel_and_high_addresses() {
        let params = build_zero_page(&ZeroPageConfig {
            setup_header: None,
            cmdline_addr: 0x1_0002_0000,
            cmdline_len: 0,
            initrd: Some(InitrdPlacement {
                address: 0x1_2000_0000,
                size: 0x1_0000_0000,
            }),
            e820: &[],
        })
        .unwrap();
        assert_eq!({ params.hdr.kernel_alignment }, ELF_KERNEL_ALIGNMENT);
        assert_eq!(
            ({ params.hdr.cmd_line_ptr }, { params.ext_cmd_line_ptr }),
            (0x2_0000, 1)
        );
        assert_eq!(
            ({ params.hdr.ramdisk_image }, { params.ext_ramdisk_image }),
            (0x2000_0000, 1)
        );
        assert_eq!(
            ({ params.hdr.ramdisk_size }, { params.ext_ramdisk_size }),
            (0, 1)
        );
        assert_eq!(params.e820_entries, 0);
    }

    #[test]
    fn zero_page_lands_at_its_address() {
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let e820 = e820_map(&[(0, 1 << 20)]).unwrap();
        let params = build_zero_page(&ZeroPageConfig {
            setup_header: None,
            cmdline_addr: 0x2_0000,
            cmdline_len: 5,
            initrd: None,
            e820: &e820,
        })
        .unwrap();
        let address = write_zero_page(&memory, &params).unwrap();
        let back: boot_params = memory.read_obj(address).unwrap();
        assert_eq!({ back.hdr.boot_flag }, BOOT_FLAG_MAGIC);
        assert_eq!(back.e820_entries, 1);
        // boot_flag lives at 0x1fe in the zero page, as the protocol specifies.
        let flag: u16 = memory.read_obj(address.unchecked_add(0x1fe)).unwrap();
        assert_eq!(flag, 0xaa55);
    }
}
