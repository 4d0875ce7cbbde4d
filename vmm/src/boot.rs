//! Direct Linux boot with the 64-bit boot protocol, as Firecracker does it: load the kernel
//! (ELF `vmlinux` or `bzImage`), the initrd and the command line, and write the zero page; or,
//! for an ELF kernel with a PVH entry note, the PVH boot protocol's start info instead (as
//! Firecracker and Cloud Hypervisor prefer it).
//!
//! The boot vCPU must then start as [`LinuxBoot::entry`] says: in long mode with RSI at the
//! zero page, or in 32-bit protected mode with EBX at the start info (page tables, GDT and
//! registers are set up in `arch`).
//!
//! Guest kernels: any x86_64 kernel with boot protocol 2.12+ (Linux 3.8+) boots. To see the
//! virtio-mmio devices it also needs `CONFIG_VIRTIO_MMIO=y` and
//! `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y` (see [`cmdline`]); Debian's stock kernels lack the
//! latter, Firecracker's CI kernels have it. `CONFIG_SERIAL_8250_CONSOLE=y` gives the console.

pub mod cmdline;
pub mod initrd;
pub mod kernel;
pub mod pvh;
pub mod zero_page;

use std::path::{Path, PathBuf};

use linux_loader::loader::load_cmdline;
use vm_memory::{GuestAddress, GuestMemoryBackend};

pub use cmdline::{add_kernel_arg, build_cmdline, VirtioMmioEntry, DEFAULT_CMDLINE};
pub use initrd::InitrdPlacement;
pub use kernel::{KernelFormat, LoadedKernel};

use crate::layout::{CMDLINE_MAX_SIZE, CMDLINE_START};

/// Errors of Linux boot setup.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel file cannot be opened.
    #[error("cannot open kernel {0}: {1}")]
    KernelOpen(PathBuf, #[source] std::io::Error),
    /// The kernel file cannot be read.
    #[error("cannot read kernel: {0}")]
    KernelRead(#[source] std::io::Error),
    /// Neither an ELF nor a bzImage.
    #[error("kernel is neither an ELF vmlinux nor a bzImage")]
    UnknownKernelFormat,
    /// linux-loader rejected or could not load the image.
    #[error("cannot load kernel: {0}")]
    KernelLoad(#[source] linux_loader::loader::Error),
    /// The kernel does not fit in guest memory.
    #[error("kernel does not fit in guest memory")]
    KernelPastMemory,
    /// A bzImage without a 64-bit entry point.
    #[error("bzImage has no 64-bit entry point (boot protocol {version:#x}, xloadflags {xloadflags:#x}); need protocol 2.12+")]
    No64BitEntry {
        /// Boot protocol version.
        version: u16,
        /// xloadflags field.
        xloadflags: u16,
    },
    /// The initrd file cannot be opened or read.
    #[error("cannot read initrd {0}: {1}")]
    InitrdOpen(PathBuf, #[source] std::io::Error),
    /// No room for the initrd between the kernel and the top of low RAM.
    #[error("initrd of {size} bytes does not fit ({space} bytes free above the kernel)")]
    InitrdTooLarge {
        /// Initrd size.
        size: u64,
        /// Room available.
        space: u64,
    },
    /// Copying the initrd into guest memory failed.
    #[error("cannot write initrd to guest memory: {0}")]
    InitrdWrite(#[source] vm_memory::GuestMemoryError),
    /// The command line is invalid or too long.
    #[error("invalid kernel command line: {0}")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    /// The command line length does not fit the zero page.
    #[error("kernel command line too long")]
    CmdlineTooLong,
    /// Writing the command line to guest memory failed.
    #[error("cannot write command line: {0}")]
    CmdlineWrite(#[source] linux_loader::loader::Error),
    /// A guest memory region wraps the address space.
    #[error("bad guest memory region {start:#x}+{size:#x}")]
    BadMemoryLayout {
        /// Region start.
        start: u64,
        /// Region size.
        size: u64,
    },
    /// More e820 entries than the zero page holds.
    #[error("{0} e820 entries; the zero page holds 128")]
    TooManyE820Entries(usize),
    /// Writing the zero page failed.
    #[error("cannot write the zero page: {0}")]
    ZeroPage(#[source] linux_loader::configurator::Error),
    /// Writing the PVH start info failed.
    #[error("cannot write the PVH start info: {0}")]
    StartInfo(#[source] linux_loader::configurator::Error),
}

/// What to boot.
#[derive(Clone, Copy, Debug)]
pub struct LinuxBootConfig<'a> {
    /// Kernel image (ELF vmlinux or bzImage).
    pub kernel: &'a Path,
    /// Optional initial ramdisk.
    pub initrd: Option<&'a Path>,
    /// Command line; [`DEFAULT_CMDLINE`] when `None`.
    pub cmdline: Option<&'a str>,
    /// virtio-mmio devices to announce on the command line.
    pub virtio_devices: &'a [VirtioMmioEntry],
    /// Guest RAM as (start, size), the e820 map's usable RAM. Guest memory may hold more (a
    /// virtio-pmem device's memory), which the guest must not take for RAM.
    pub ram: &'a [(u64, u64)],
}

/// How the boot vCPU enters the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootEntry {
    /// Linux's 64-bit boot protocol: long mode at `rip`, RSI at the zero page.
    Linux64 {
        /// The 64-bit entry point.
        rip: GuestAddress,
        /// Address of the zero page.
        zero_page: GuestAddress,
    },
    /// The PVH boot protocol: 32-bit protected mode without paging at `rip`, EBX at the
    /// start info.
    Pvh {
        /// The 32-bit entry point.
        rip: GuestAddress,
        /// Address of the start info.
        start_info: GuestAddress,
    },
}

/// The result of boot setup: how to start the boot vCPU.
#[derive(Clone, Debug)]
pub struct LinuxBoot {
    /// The entry point and the boot protocol's structure.
    pub entry: BootEntry,
    /// The loaded kernel.
    pub kernel: LoadedKernel,
    /// Where the initrd went.
    pub initrd: Option<InitrdPlacement>,
    /// The final command line.
    pub cmdline: String,
}

/// Loads kernel, initrd and command line into `memory` and writes the zero page.
pub fn load_linux<M: GuestMemoryBackend>(
    memory: &M,
    config: &LinuxBootConfig,
) -> Result<LinuxBoot, BootError> {
    let kernel = kernel::load_kernel_file(memory, config.kernel)?;

    // Protocol 2.06+ kernels state their command line limit (without the NUL).
    let max_cmdline = kernel
        .setup_header
        .filter(|h| h.version >= 0x0206 && h.cmdline_size > 0)
        .map_or(CMDLINE_MAX_SIZE, |h| h.cmdline_size as usize + 1);
    let cmdline = build_cmdline(config.cmdline, config.virtio_devices, max_cmdline)?;
    load_cmdline(memory, GuestAddress(CMDLINE_START), &cmdline).map_err(BootError::CmdlineWrite)?;
    let cmdline = cmdline
        .as_cstring()
        .map_err(BootError::Cmdline)?
        .into_string()
        .map_err(|_| BootError::CmdlineTooLong)?;

    let initrd = match config.initrd {
        Some(path) => {
            let addr_max = kernel
                .setup_header
                .map(|h| u64::from(h.initrd_addr_max))
                .filter(|max| *max > 0)
                .unwrap_or(initrd::DEFAULT_INITRD_ADDR_MAX);
            Some(initrd::load_initrd(
                memory,
                path,
                addr_max,
                kernel.kernel_end,
            )?)
        }
        None => None,
    };

    let e820 = zero_page::e820_map(config.ram)?;
    let entry = match kernel.pvh_entry {
        Some(rip) => BootEntry::Pvh {
            rip,
            start_info: pvh::write_start_info(memory, CMDLINE_START, initrd, &e820)?,
        },
        None => {
            let params = zero_page::build_zero_page(&zero_page::ZeroPageConfig {
                setup_header: kernel.setup_header,
                cmdline_addr: CMDLINE_START,
                cmdline_len: cmdline.len(),
                initrd,
                e820: &e820,
            })?;
            BootEntry::Linux64 {
                rip: kernel.entry,
                zero_page: zero_page::write_zero_page(memory, &params)?,
            }
        }
    };
    log::debug!(
        "kernel {} loaded: {entry:x?}, initrd {}, command line {:?}",
        config.kernel.display(),
        initrd.as_ref().map_or("none".to_owned(), |i| format!(
            "{} bytes at {:#x}",
            i.size, i.address
        )),
        config.cmdline.unwrap_or_default()
    );
    Ok(LinuxBoot {
        entry,
        kernel,
        initrd,
        cmdline,
    })
}
