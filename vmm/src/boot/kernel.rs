//! Loading a Linux kernel image (ELF `vmlinux` or `bzImage`) into guest memory.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, ReadVolatile};

use super::BootError;
use crate::layout::HIGH_MEMORY_START;

/// "HdrS": the setup header magic of the x86 boot protocol.
pub const HDRS_MAGIC: u32 = 0x5372_6448;
/// xloadflags bit: the kernel has a 64-bit entry point at load address + 0x200.
pub const XLF_KERNEL_64: u16 = 1;
/// First boot protocol version with `xloadflags` (2.12).
const PROTOCOL_WITH_XLOADFLAGS: u16 = 0x020c;
/// Offset of the 64-bit entry point in a loaded bzImage's protected-mode kernel.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// Offset of the setup header in a bzImage file.
const SETUP_HEADER_OFFSET: u64 = 0x1f1;

/// The kernel image formats we can load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    /// An uncompressed ELF `vmlinux`.
    Elf,
    /// A compressed `bzImage`.
    BzImage,
}

/// Where a kernel landed and how to enter it.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    /// Format that was detected.
    pub format: KernelFormat,
    /// 64-bit entry point (RIP for the boot vCPU).
    pub entry: GuestAddress,
    /// First guest address after the kernel image.
    pub kernel_end: u64,
    /// The bzImage setup header, to be copied into the zero page; `None` for ELF.
    pub setup_header: Option<setup_header>,
    /// The 32-bit entry point of the PVH boot protocol, where an ELF kernel names one (its
    /// `XEN_ELFNOTE_PHYS32_ENTRY` note): such a kernel is booted through PVH, as Firecracker
    /// and Cloud Hypervisor boot it.
    pub pvh_entry: Option<GuestAddress>,
}

/// Detects the image format from its first bytes.
pub fn detect_format<F: Read + Seek>(image: &mut F) -> Result<KernelFormat, BootError> {
    let mut magic = [0u8; 4];
    image.rewind().map_err(BootError::KernelRead)?;
    image
        .read_exact(&mut magic)
        .map_err(BootError::KernelRead)?;
    if magic == *b"\x7fELF" {
        return Ok(KernelFormat::Elf);
    }
    let mut hdrs = [0u8; 4];
    // The "HdrS" magic sits 0x11 bytes into the setup header.
    image
        .seek(SeekFrom::Start(SETUP_HEADER_OFFSET + 0x11))
        .map_err(BootError::KernelRead)?;
    if image.read_exact(&mut hdrs).is_ok() && u32::from_le_bytes(hdrs) == HDRS_MAGIC {
        return Ok(KernelFormat::BzImage);
    }
    Err(BootError::UnknownKernelFormat)
}

/// Loads the kernel in `image` into `memory` at its preferred address (at or above 1 MiB).
pub fn load_kernel<M, F>(memory: &M, image: &mut F) -> Result<LoadedKernel, BootError>
where
    M: GuestMemoryBackend,
    F: Read + ReadVolatile + Seek,
{
    let format = detect_format(image)?;
    let highmem = Some(GuestAddress(HIGH_MEMORY_START));
    let result = match format {
        KernelFormat::Elf => Elf::load(memory, None, image, highmem),
        KernelFormat::BzImage => BzImage::load(memory, None, image, highmem),
    }
    .map_err(BootError::KernelLoad)?;

    let entry = match (format, result.setup_header) {
        (KernelFormat::BzImage, Some(header)) => {
            check_64bit_entry(&header)?;
            result
                .kernel_load
                .checked_add(BZIMAGE_64BIT_ENTRY_OFFSET)
                .ok_or(BootError::KernelPastMemory)?
        }
        _ => result.kernel_load,
    };
    if result.kernel_end > memory.last_addr().0 {
        return Err(BootError::KernelPastMemory);
    }
    let pvh_entry = match result.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(entry) => Some(entry),
        PvhBootCapability::PvhEntryNotPresent | PvhBootCapability::PvhEntryIgnored => None,
    };
    Ok(LoadedKernel {
        format,
        entry,
        kernel_end: result.kernel_end,
        setup_header: result.setup_header,
        pvh_entry,
    })
}

/// Opens and loads the kernel at `path`.
pub fn load_kernel_file<M: GuestMemoryBackend>(
    memory: &M,
    path: &std::path::Path,
) -> Result<LoadedKernel, BootError> {
    let mut file = File::open(path).map_err(|e| BootError::KernelOpen(path.into(), e))?;
    load_kernel(memory, &mut file)
}

/// Rejects bzImages without a 64-bit entry point (protocol < 2.12 or no `XLF_KERNEL_64`).
pub fn check_64bit_entry(header: &setup_header) -> Result<(), BootError> {
    let version = header.version;
    let xloadflags = header.xloadflags;
    if version < PROTOCOL_WITH_XLOADFLAGS || xloadflags & XLF_KERNEL_64 == 0 {
        return Err(BootError::No64BitEntry {
            version,
            xloadflags,
        });
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
