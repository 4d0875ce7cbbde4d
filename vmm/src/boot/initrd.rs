//! Initial ramdisk placement and loading.
//!
//! Like QEMU and Firecracker, the initrd goes as high as possible: at the highest page-aligned
//! address where it ends below both the top of low RAM (the MMIO gap) and the kernel's
//! `initrd_addr_max`, and above the kernel.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::Path;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::BootError;

/// Alignment of the initrd's start.
pub const INITRD_ALIGNMENT: u64 = 0x1000;
/// `initrd_addr_max` assumed when the kernel does not say (ELF images; x86_64 kernels report
/// this value in their setup header).
pub const DEFAULT_INITRD_ADDR_MAX: u64 = 0x7fff_ffff;

/// Where an initrd was put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitrdPlacement {
    /// Guest physical address of the first byte.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Chooses the initrd's address.
///
/// * `size`: initrd size in bytes (non-zero).
/// * `low_ram_end`: end (exclusive) of the RAM region that starts at 0.
/// * `initrd_addr_max`: highest address the kernel accepts for the initrd's last byte.
/// * `kernel_end`: end of the loaded kernel; the initrd must start at or after it.
pub fn place_initrd(
    size: u64,
    low_ram_end: u64,
    initrd_addr_max: u64,
    kernel_end: u64,
) -> Result<InitrdPlacement, BootError> {
    let limit = low_ram_end.min(initrd_addr_max.saturating_add(1));
    let address = limit
        .checked_sub(size)
        .filter(|_| size > 0)
        .map(|start| start & !(INITRD_ALIGNMENT - 1))
        .filter(|start| *start >= kernel_end)
        .ok_or(BootError::InitrdTooLarge {
            size,
            space: limit.saturating_sub(kernel_end),
        })?;
    Ok(InitrdPlacement { address, size })
}

/// End of the RAM region that starts at guest address 0.
pub fn low_ram_end<M: GuestMemoryBackend>(memory: &M) -> u64 {
    memory
        .find_region(GuestAddress(0))
        .map_or(0, |region| region.len())
}

/// Loads the initrd at `path` into `memory`, above `kernel_end`.
pub fn load_initrd<M: GuestMemoryBackend>(
    memory: &M,
    path: &Path,
    initrd_addr_max: u64,
    kernel_end: u64,
) -> Result<InitrdPlacement, BootError> {
    let mut file = File::open(path).map_err(|e| BootError::InitrdOpen(path.into(), e))?;
    let size = file
        .seek(SeekFrom::End(0))
        .map_err(|e| BootError::InitrdOpen(path.into(), e))?;
    file.rewind()
        .map_err(|e| BootError::InitrdOpen(path.into(), e))?;
    let placement = place_initrd(size, low_ram_end(memory), initrd_addr_max, kernel_end)?;
    let len = usize::try_from(size).map_err(|_| BootError::InitrdTooLarge { size, space: 0 })?;
    memory
        .read_exact_volatile_from(GuestAddress(placement.address), &mut file, len)
        .map_err(BootError::InitrdWrite)?;
    Ok(placement)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vm_memory::GuestMemoryMmap;

    const MIB: u64 = 1 << 20;

    #[test]
    fn goes_to_the_top_of_low_ram_page_aligned() {
        let p = place_initrd(10 * MIB + 5, 512 * MIB, DEFAULT_INITRD_ADDR_MAX, 20 * MIB).unwrap();
        assert_eq!(p.address % INITRD_ALIGNMENT, 0);
        assert!(p.address + p.size <= 512 * MIB);
        assert!(512 * MIB - (p.address + p.size) < INITRD_ALIGNMENT);
    }

    #[test]
    fn respects_initrd_addr_max() {
        let p = place_initrd(MIB, 3 << 30, 0x37ff_ffff, 20 * MIB).unwrap();
        assert_eq!(p.address, 0x3800_0000 - MIB);
    }

    #[test]
    fn does_not_overlap_the_kernel() {
        assert!(place_initrd(MIB, 64 * MIB, DEFAULT_INITRD_ADDR_MAX, 63 * MIB + 1).is_err());
        let p = place_initrd(MIB, 64 * MIB, DEFAULT_INITRD_ADDR_MAX, 63 * MIB - 4096).unwrap();
        assert_eq!(p.address, 63 * MIB);
    }

    #[test]
    fn rejects_empty_and_oversized_images() {
        assert!(place_initrd(0, 64 * MIB, DEFAULT_INITRD_ADDR_MAX, MIB).is_err());
        assert!(place_initrd(u64::MAX, 64 * MIB, DEFAULT_INITRD_ADDR_MAX, MIB).is_err());
        assert!(place_initrd(MIB, 0, DEFAULT_INITRD_ADDR_MAX, 0).is_err());
    }

    #[test]
    fn loads_a_file_into_guest_memory() {
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let mut file = tempfile_in_target();
        let contents: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        file.1.write_all(&contents).unwrap();
        let p = load_initrd(&memory, &file.0, DEFAULT_INITRD_ADDR_MAX, 2 << 20).unwrap();
        let mut back = vec![0u8; contents.len()];
        memory
            .read_slice(&mut back, GuestAddress(p.address))
            .unwrap();
        assert_eq!(back, contents);
        std::fs::remove_file(&file.0).unwrap();
        assert!(matches!(
            load_initrd(&memory, &file.0, DEFAULT_INITRD_ADDR_MAX, 0),
            Err(BootError::InitrdOpen(..))
        ));
    }

    fn tempfile_in_target() -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!("vmm-initrd-test-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        (path, file)
    }
}
