//! The PVH boot protocol's start info (`struct hvm_start_info`, version 1), its memory map and
//! module list: what a kernel entered at its `XEN_ELFNOTE_PHYS32_ENTRY` finds at EBX, as
//! Firecracker and Cloud Hypervisor write it.

use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::boot_e820_entry;
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::initrd::InitrdPlacement;
use super::BootError;
use crate::layout::{PVH_INFO_START, PVH_MEMMAP_START, PVH_MODLIST_START};

/// `hvm_start_info`'s magic.
pub const START_INFO_MAGIC: u32 = 0x336e_c578;
/// The start info's version: 1 has the memory map.
const START_INFO_VERSION: u32 = 1;

/// Writes the start info at [`PVH_INFO_START`] naming the command line at `cmdline_addr`, the
/// initrd as the one module, and `e820` as the memory map at [`PVH_MEMMAP_START`]; returns
/// the start info's address (the boot vCPU's EBX).
pub fn write_start_info<M: GuestMemoryBackend>(
    memory: &M,
    cmdline_addr: u64,
    initrd: Option<InitrdPlacement>,
    e820: &[boot_e820_entry],
) -> Result<GuestAddress, BootError> {
    let memmap: Vec<hvm_memmap_table_entry> = e820
        .iter()
        .map(|entry| hvm_memmap_table_entry {
            addr: entry.addr,
            size: entry.size,
            type_: entry.r#type,
            reserved: 0,
        })
        .collect();
    let start_info = hvm_start_info {
        magic: START_INFO_MAGIC,
        version: START_INFO_VERSION,
        nr_modules: u32::from(initrd.is_some()),
        modlist_paddr: if initrd.is_some() {
            PVH_MODLIST_START
        } else {
            0
        },
        cmdline_paddr: cmdline_addr,
        memmap_paddr: PVH_MEMMAP_START,
        memmap_entries: memmap.len() as u32,
        ..Default::default()
    };
    let address = GuestAddress(PVH_INFO_START);
    let mut params = BootParams::new(&start_info, address);
    params.set_sections(&memmap, GuestAddress(PVH_MEMMAP_START));
    if let Some(initrd) = initrd {
        let module = hvm_modlist_entry {
            paddr: initrd.address,
            size: initrd.size,
            ..Default::default()
        };
        params.set_modules(&[module], GuestAddress(PVH_MODLIST_START));
    }
    PvhBootConfigurator::write_bootparams(&params, memory).map_err(BootError::StartInfo)?;
    Ok(address)
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestMemoryMmap};

    use super::*;
    use crate::boot::zero_page::e820_map;

    #[test]
    fn start_info_names_the_command_line_the_memory_map_and_the_initrd() {
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let e820 = e820_map(&[(0, 64 << 20)]).unwrap();
        let initrd = InitrdPlacement {
            address: 0x80_0000,
            size: 0x1234,
        };
        let address = write_start_info(&memory, 0x2_0000, Some(initrd), &e820).unwrap();
        assert_eq!(address, GuestAddress(PVH_INFO_START));
        let info: hvm_start_info = memory.read_obj(address).unwrap();
        assert_eq!((info.magic, info.version), (START_INFO_MAGIC, 1));
        assert_eq!(info.cmdline_paddr, 0x2_0000);
        assert_eq!(
            (info.memmap_paddr, info.memmap_entries),
            (PVH_MEMMAP_START, 2)
        );
        let high: hvm_memmap_table_entry = memory
            .read_obj(GuestAddress(PVH_MEMMAP_START + 24))
            .unwrap();
        assert_eq!((high.addr, high.size, high.type_), (1 << 20, 63 << 20, 1));
        assert_eq!(
            (info.nr_modules, info.modlist_paddr),
            (1, PVH_MODLIST_START)
        );
        let module: hvm_modlist_entry = memory.read_obj(GuestAddress(PVH_MODLIST_START)).unwrap();
        assert_eq!((module.paddr, module.size), (0x80_0000, 0x1234));

        // Without an initrd there is no module list.
        write_start_info(&memory, 0x2_0000, None, &e820).unwrap();
        let info: hvm_start_info = memory.read_obj(address).unwrap();
        assert_eq!((info.nr_modules, info.modlist_paddr), (0, 0));
    }
}
