//! The test guest as a kernel image file (`vmm guest-image`): where no Linux guest can boot (a
//! host without hardware virtualisation), Firecracker's API, its SDK and `vmm run --kernel`
//! boot this file instead. A kernel file that is this image runs as the test guest, with the
//! workload that `workload=` on its command line gives (the default without it).
//!
//! The image also boots itself under any loader of the PVH boot protocol (its ELF note names
//! the entry: Firecracker and Cloud Hypervisor boot it so) or of Linux's 64-bit boot protocol:
//! it maps its RAM, reads `workload=` (a subset of the grammar, see the guest's `self_boot`
//! module) and ends by resetting the machine. With the word [`SELF_BOOT`] on its command line,
//! this VMM boots it that way too, as a kernel (through PVH).

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::spec::{WorkloadSpec, WorkloadSpecError};
use super::IMAGE;
use crate::config::{check_vcpus, BalloonDeviceConfig, ConfigError, GuestConfig, LinuxConfig};
use crate::layout::RamRegion;

/// The command-line word that has this VMM boot the image as a kernel (Linux's boot protocol)
/// instead of running it as its test guest.
pub const SELF_BOOT: &str = "self-boot";
/// Words that only the test guest's image holds (its console messages).
const MARKER: &[u8] = b"llfree-vmm test guest";
/// Larger kernel files are no test guest (it is tens of KiB) and are not read.
const LARGEST_IMAGE: u64 = 1 << 20;

/// Why a kernel file that is the test guest's image cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// It cannot be opened or read whole.
    #[error("kernel {}: {source}", .path.display())]
    Read {
        /// The kernel file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// It is the test guest of another version of the VMM.
    #[error(
        "kernel {}: the test guest image of another vmm version; write it again with \
         `vmm guest-image --out FILE`",
        .0.display()
    )]
    OtherVersion(PathBuf),
    /// Its command line asks for a workload that cannot run.
    #[error("the test guest image's workload= on the command line: {0}")]
    Workload(#[from] WorkloadSpecError),
    /// It was given an initrd, which it cannot use.
    #[error("the test guest image takes no initrd")]
    Initrd,
    /// The VM does not suit the test guest (e.g. too many vCPUs).
    #[error("the test guest image: {0}")]
    Config(#[from] ConfigError),
}

/// Whether the kernel at `path` is this VMM's test guest image. The path is a kernel as
/// [`LinuxConfig::new`] accepts it (a regular file, perhaps through a symbolic link, as
/// `/boot/vmlinuz` often is); it is opened without blocking, and whatever is not a regular
/// file by then is no image.
pub fn is_image(path: &Path) -> Result<bool, ImageError> {
    let read_error = |source| ImageError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(read_error)?;
    let meta = file.metadata().map_err(read_error)?;
    if !meta.is_file() || meta.len() > LARGEST_IMAGE {
        return Ok(false);
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(read_error)?;
    if bytes == IMAGE {
        return Ok(true);
    }
    if bytes.windows(MARKER.len()).any(|w| w == MARKER) {
        return Err(ImageError::OtherVersion(path.to_owned()));
    }
    Ok(false)
}

/// The workload that `cmdline` asks of the test guest image: its (last) `workload=` word, or
/// `otherwise` without one.
pub fn workload_in(cmdline: &str, otherwise: &WorkloadSpec) -> Result<WorkloadSpec, ImageError> {
    match cmdline
        .split_ascii_whitespace()
        .filter_map(|word| word.strip_prefix("workload="))
        .next_back()
    {
        Some(text) => Ok(text.parse()?),
        None => Ok(otherwise.clone()),
    }
}

/// What runs for the kernel of `linux`: the test guest, with the workload of its command line
/// (or `otherwise`) on `memory_size` bytes, `vcpus`, `balloon` and the hot-pluggable memory
/// `hotplug`, where the kernel is its image and the command line lacks [`SELF_BOOT`]; else the
/// kernel, booted as Linux is.
pub fn guest_for_kernel(
    linux: LinuxConfig,
    memory_size: u64,
    vcpus: usize,
    balloon: Option<&BalloonDeviceConfig>,
    hotplug: Option<RamRegion>,
    otherwise: &WorkloadSpec,
) -> Result<GuestConfig, ImageError> {
    let self_boot = linux
        .cmdline
        .split_ascii_whitespace()
        .any(|word| word == SELF_BOOT);
    if self_boot || !is_image(&linux.kernel)? {
        return Ok(GuestConfig::Linux(linux));
    }
    if linux.initrd.is_some() {
        return Err(ImageError::Initrd);
    }
    check_vcpus(vcpus, true)?;
    let spec = workload_in(&linux.cmdline, otherwise)?;
    spec.check_balloon(balloon)?;
    spec.check_hotplug(hotplug.is_some())?;
    Ok(GuestConfig::TestGuest(spec.resolve_with_hotplug(
        memory_size,
        vcpus,
        hotplug,
    )?))
}

#[cfg(test)]
mod tests;
