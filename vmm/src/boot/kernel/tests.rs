//! Kernel loading tests with synthetic ELF and bzImage files (built here byte by byte, as the
//! boot protocol and the ELF spec lay them out), plus a real kernel when one is available.

use std::io::Cursor;

use vm_memory::{Bytes, GuestMemoryMmap};

use super::*;
use crate::boot::{load_linux, BootEntry, LinuxBootConfig, VirtioMmioEntry};
use crate::layout::{CMDLINE_START, PVH_INFO_START, ZERO_PAGE_START};

pub(crate) const MEM_SIZE: usize = 64 << 20;

pub(crate) fn memory() -> GuestMemoryMmap<()> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

fn put(image: &mut [u8], offset: usize, bytes: &[u8]) {
    image[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// A minimal ELF64 executable with one PT_LOAD segment of `payload` at physical 16 MiB.
pub(crate) fn elf_image(payload: &[u8], entry: u64) -> Vec<u8> {
    let mut image = vec![0u8; 0x1000 + payload.len()];
    put(&mut image, 0, b"\x7fELF\x02\x01\x01");
    put(&mut image, 16, &2u16.to_le_bytes()); // e_type: EXEC
    put(&mut image, 18, &0x3eu16.to_le_bytes()); // e_machine: x86_64
    put(&mut image, 20, &1u32.to_le_bytes()); // e_version
    put(&mut image, 24, &entry.to_le_bytes()); // e_entry
    put(&mut image, 32, &64u64.to_le_bytes()); // e_phoff
    put(&mut image, 52, &64u16.to_le_bytes()); // e_ehsize
    put(&mut image, 54, &56u16.to_le_bytes()); // e_phentsize
    put(&mut image, 56, &1u16.to_le_bytes()); // e_phnum
    let ph = 64;
    put(&mut image, ph, &1u32.to_le_bytes()); // PT_LOAD
    put(&mut image, ph + 4, &5u32.to_le_bytes()); // R+X
    put(&mut image, ph + 8, &0x1000u64.to_le_bytes()); // p_offset
    put(&mut image, ph + 16, &0xffff_ffff_8100_0000u64.to_le_bytes()); // p_vaddr
    put(&mut image, ph + 24, &0x100_0000u64.to_le_bytes()); // p_paddr
    put(&mut image, ph + 32, &(payload.len() as u64).to_le_bytes()); // p_filesz
    put(
        &mut image,
        ph + 40,
        &(payload.len() as u64 + 0x1000).to_le_bytes(),
    ); // p_memsz
    put(&mut image, ph + 48, &0x1000u64.to_le_bytes()); // p_align
    put(&mut image, 0x1000, payload);
    image
}

/// A minimal bzImage: one setup sector after the boot sector, then `payload`.
pub(crate) fn bzimage(payload: &[u8], version: u16, xloadflags: u16) -> Vec<u8> {
    let setup_sects = 1u8;
    let setup_len = (usize::from(setup_sects) + 1) * 512;
    let mut image = vec![0u8; setup_len + payload.len()];
    put(&mut image, 0x1f1, &[setup_sects]);
    put(&mut image, 0x1fe, &0xaa55u16.to_le_bytes());
    put(&mut image, 0x202, b"HdrS");
    put(&mut image, 0x206, &version.to_le_bytes());
    put(&mut image, 0x211, &[1]); // loadflags: LOADED_HIGH
    put(&mut image, 0x214, &0x10_0000u32.to_le_bytes()); // code32_start
    put(&mut image, 0x22c, &0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
    put(&mut image, 0x230, &0x20_0000u32.to_le_bytes()); // kernel_alignment
    put(&mut image, 0x234, &[1]); // relocatable_kernel
    put(&mut image, 0x236, &xloadflags.to_le_bytes());
    put(&mut image, 0x238, &2047u32.to_le_bytes()); // cmdline_size
    put(&mut image, setup_len, payload);
    image
}

#[test]
fn loads_an_elf_vmlinux_at_its_physical_address() {
    let memory = memory();
    let image = elf_image(b"ELF kernel payload", 0x100_0000);
    let kernel = load_kernel(&memory, &mut Cursor::new(image)).unwrap();
    assert_eq!(kernel.format, KernelFormat::Elf);
    assert_eq!(kernel.entry, GuestAddress(0x100_0000));
    assert_eq!(kernel.kernel_end, 0x100_0000 + 18 + 0x1000);
    assert!(kernel.setup_header.is_none());
    assert!(kernel.pvh_entry.is_none());
    let mut back = [0u8; 18];
    memory
        .read_slice(&mut back, GuestAddress(0x100_0000))
        .unwrap();
    assert_eq!(&back, b"ELF kernel payload");
}

#[test]
fn loads_a_bzimage_and_enters_at_the_64bit_entry() {
    let memory = memory();
    let image = bzimage(b"compressed kernel", 0x020f, XLF_KERNEL_64);
    let kernel = load_kernel(&memory, &mut Cursor::new(image)).unwrap();
    assert_eq!(kernel.format, KernelFormat::BzImage);
    assert_eq!(kernel.entry, GuestAddress(0x10_0200));
    assert_eq!(kernel.kernel_end, 0x10_0000 + 17);
    assert_eq!({ kernel.setup_header.unwrap().cmdline_size }, 2047);
    let mut back = [0u8; 17];
    memory
        .read_slice(&mut back, GuestAddress(0x10_0000))
        .unwrap();
    assert_eq!(&back, b"compressed kernel");
}

#[test]
fn rejects_bad_images() {
    let memory = memory();
    let mut garbage = Cursor::new(vec![0x42u8; 4096]);
    assert!(matches!(
        load_kernel(&memory, &mut garbage),
        Err(BootError::UnknownKernelFormat)
    ));
    let mut short = Cursor::new(vec![0x7fu8]);
    assert!(matches!(
        load_kernel(&memory, &mut short),
        Err(BootError::KernelRead(_))
    ));
    for (version, xloadflags) in [(0x020f, 0), (0x020b, XLF_KERNEL_64)] {
        let mut old = Cursor::new(bzimage(b"k", version, xloadflags));
        assert!(matches!(
            load_kernel(&memory, &mut old),
            Err(BootError::No64BitEntry { .. })
        ));
    }
    // Entry below 1 MiB, and a segment past the end of guest memory.
    let mut low = Cursor::new(elf_image(b"k", 0x1000));
    assert!(matches!(
        load_kernel(&memory, &mut low),
        Err(BootError::KernelLoad(_))
    ));
    let mut big = elf_image(b"k", 0x100_0000);
    big[64 + 24..64 + 32].copy_from_slice(&(MEM_SIZE as u64).to_le_bytes());
    assert!(matches!(
        load_kernel(&memory, &mut Cursor::new(big)),
        Err(BootError::KernelLoad(_))
    ));
}

#[test]
fn full_linux_boot_setup_writes_cmdline_initrd_and_zero_page() {
    let dir = std::env::temp_dir().join(format!("vmm-boot-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kernel_path = dir.join("bzImage");
    let initrd_path = dir.join("initrd");
    std::fs::write(&kernel_path, bzimage(&[0x90; 4096], 0x020f, XLF_KERNEL_64)).unwrap();
    std::fs::write(&initrd_path, vec![0x5a; 100_000]).unwrap();

    let memory = memory();
    let devices = [VirtioMmioEntry {
        base: 0xc000_0000,
        size: 0x1000,
        irq: 5,
    }];
    let boot = load_linux(
        &memory,
        &LinuxBootConfig {
            kernel: &kernel_path,
            initrd: Some(&initrd_path),
            cmdline: Some("console=ttyS0"),
            virtio_devices: &devices,
            ram: &[(0, MEM_SIZE as u64)],
        },
    )
    .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let BootEntry::Linux64 { rip, zero_page } = boot.entry else {
        panic!("a bzImage boots through Linux's protocol: {:?}", boot.entry);
    };
    assert_eq!(rip, GuestAddress(0x10_0200));
    assert_eq!(zero_page, GuestAddress(ZERO_PAGE_START));
    let expected = "console=ttyS0 virtio_mmio.device=4K@0xc0000000:5";
    assert_eq!(boot.cmdline, expected);
    let mut cmdline = vec![0u8; expected.len() + 1];
    memory
        .read_slice(&mut cmdline, GuestAddress(CMDLINE_START))
        .unwrap();
    assert_eq!(&cmdline[..expected.len()], expected.as_bytes());
    assert_eq!(cmdline[expected.len()], 0);

    let initrd = boot.initrd.unwrap();
    assert_eq!(initrd.size, 100_000);
    assert_eq!(initrd.address % 4096, 0);
    assert!(initrd.address + initrd.size <= MEM_SIZE as u64);
    let mut first = [0u8; 1];
    memory
        .read_slice(&mut first, GuestAddress(initrd.address))
        .unwrap();
    assert_eq!(first, [0x5a]);

    let params: linux_loader::loader::bootparam::boot_params = memory.read_obj(zero_page).unwrap();
    assert_eq!({ params.hdr.cmd_line_ptr } as u64, CMDLINE_START);
    assert_eq!({ params.hdr.cmdline_size } as usize, expected.len());
    assert_eq!({ params.hdr.ramdisk_image } as u64, initrd.address);
    assert_eq!({ params.hdr.version }, 0x020f);
    assert_eq!(params.e820_entries, 2);
}

#[test]
fn an_elf_kernel_with_a_pvh_note_boots_through_pvh() {
    // The test guest's image names its 32-bit entry in a Xen note, as Linux with CONFIG_PVH.
    let dir = std::env::temp_dir().join(format!("llfree-vmm-pvh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kernel_path = dir.join("guest.elf");
    std::fs::write(&kernel_path, crate::testguest::IMAGE).unwrap();
    let memory = memory();
    let boot = load_linux(
        &memory,
        &LinuxBootConfig {
            kernel: &kernel_path,
            initrd: None,
            cmdline: Some("self-boot"),
            virtio_devices: &[],
            ram: &[(0, MEM_SIZE as u64)],
        },
    )
    .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let BootEntry::Pvh { rip, start_info } = boot.entry else {
        panic!("the image boots through PVH: {:?}", boot.entry);
    };
    assert_eq!(start_info, GuestAddress(PVH_INFO_START));
    // The entry lies in the image's code, after its 64-bit entry.
    assert!(rip > boot.kernel.entry && rip.0 < boot.kernel.kernel_end);
    let info: linux_loader::loader::elf::start_info::hvm_start_info =
        memory.read_obj(start_info).unwrap();
    assert_eq!(
        (info.cmdline_paddr, info.memmap_entries),
        (CMDLINE_START, 2)
    );
}

#[test]
fn missing_files_are_clear_errors() {
    let memory = memory();
    let config = LinuxBootConfig {
        kernel: std::path::Path::new("/nonexistent/vmlinux"),
        initrd: None,
        cmdline: None,
        virtio_devices: &[],
        ram: &[],
    };
    let err = load_linux(&memory, &config).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/vmlinux"), "{err}");
}

/// Loads a real distribution kernel when one is around (LLFREE_VMM_TEST_KERNEL or /boot).
#[test]
fn loads_a_real_kernel_if_available() {
    let candidate = std::env::var_os("LLFREE_VMM_TEST_KERNEL")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::fs::read_dir("/boot")
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz"))
                })
        });
    let Some(path) = candidate else {
        eprintln!(
            "SKIP: loads_a_real_kernel_if_available: no kernel image (set LLFREE_VMM_TEST_KERNEL \
             or install one in /boot)"
        );
        return;
    };
    let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 256 << 20)]).unwrap();
    let boot = load_linux(
        &memory,
        &LinuxBootConfig {
            kernel: &path,
            initrd: None,
            cmdline: None,
            virtio_devices: &[],
            ram: &[(0, 256 << 20)],
        },
    )
    .unwrap();
    let kernel = boot.kernel;
    assert!(kernel.entry.0 >= 0x10_0000, "{kernel:?}");
    assert!(kernel.kernel_end > kernel.entry.0);
    if let Some(header) = kernel.setup_header {
        assert!({ header.version } >= 0x020c);
        assert_eq!(kernel.entry.0, u64::from(header.code32_start) + 0x200);
    }
}
