//! The configuration of one VM ([`VmConfig`]), and the checks its parts pass, in the style of
//! Firecracker's `vmm_config`: every front end (the `vmm` command line, the control API, a
//! configuration file) builds these types and gets the same errors.
//!
//! Every [`ConfigError`] message starts with the name of the setting it is about, spelt as the
//! command line's flag without its dashes (`vcpus 255: must be between 1 and 254`), so that a
//! front end can name the setting its own way in front of it.

mod backing;

pub use crate::layout::{MAX_MEMORY, MIN_MEMORY};
pub use backing::{BackingKind, BackingKindError};
pub use vmm_devices::balloon::config::{BalloonConfigError, BalloonDeviceConfig};
pub use vmm_devices::block::config::{
    check_drive_id, check_drives, open_image, DriveConfig, DriveError, MAX_DRIVE_ID,
};
pub use vmm_devices::mem::config::{
    HotplugConfig, HotplugConfigError, DEFAULT_BLOCK_SIZE, DEFAULT_SLOT_SIZE, MIN_SLOT_SIZE,
};
pub use vmm_devices::net::config::{
    check_network_interfaces, MacAddr, NetConfig, NetConfigError, MAX_IFACE_ID, MIN_MTU,
};
pub use vmm_devices::size::{format_size, format_size_approx, parse_mib, parse_size, SizeError};
pub use vmm_devices::vsock::config::{VsockConfig, VsockConfigError, MIN_GUEST_CID};

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use guest_mem::{FrameSize, Populate, Scrub};

use crate::boot::cmdline::DEFAULT_CMDLINE;
use crate::layout::{ram_regions, RamRegion, CMDLINE_MAX_SIZE};
use crate::testguest::{protocol, Workload};
use vmm_devices::rate_limiter::RateLimiterConfig;

/// Most vCPUs a VM can have: xAPIC ids are 8 bits and 0xff is the broadcast id.
pub const MAX_VCPUS: usize = 254;
pub use vmm_devices::socket_files::MAX_SOCKET_PATH;

/// Errors of checking a VM configuration; each message starts with the setting's name.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The vCPU count is out of range.
    #[error("vcpus {0}: must be between 1 and {MAX_VCPUS}")]
    Vcpus(usize),
    /// With SMT, vCPUs come in pairs (the two threads of a core).
    #[error("vcpus {0}: with --smt, the vCPU count must be 1 or even (two threads per core)")]
    SmtVcpus(usize),
    /// The test guest supports fewer vCPUs than KVM.
    #[error("vcpus {0}: the built-in test guest runs on at most {max} vCPUs", max = protocol::MAX_VCPUS)]
    TestGuestVcpus(usize),
    /// The memory size is outside [`MIN_MEMORY`, `MAX_MEMORY`].
    #[error("memory {}: must be between 4 MiB and 1 TiB", format_size(*.0))]
    MemoryRange(u64),
    /// The memory size is not a whole number of MiB.
    #[error("memory {}: must be a whole number of MiB", format_size(*.0))]
    MemoryNotWholeMib(u64),
    /// The reclaim policy's floor is more than the VM's RAM.
    #[error("reclaim-floor {}: more than the VM's memory ({})", format_size(*floor), format_size(*memory))]
    ReclaimFloor {
        /// The floor.
        floor: u64,
        /// The VM's RAM.
        memory: u64,
    },
    /// A file the VM needs is missing or unusable.
    #[error("{setting}{}: {why}", .path.display())]
    Path {
        /// The setting naming the file, with its separator ("kernel ", "backing file:").
        setting: &'static str,
        /// The path.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The zone file does not exist.
    #[error("zone {} does not exist (create it with `vmm zone create`)", .0.display())]
    ZoneMissing(PathBuf),
    /// The kernel command line is too long or has bytes a kernel cannot take.
    #[error("cmdline: {0}")]
    Cmdline(String),
    /// Formatting asked for a pool that is no file or device.
    #[error("format-pool: only a pool in a file or device (backing file:PATH or dax:PATH) can be formatted, not backing {0}")]
    FormatWithoutFile(BackingKind),
    /// A VM name in a zone is invalid.
    #[error("vm {name}: {why}")]
    VmName {
        /// The name.
        name: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A virtio-pmem device needs a zone to keep its memory in.
    #[error("pmem: a virtio-pmem device keeps its memory in a zone (--zone PATH --vm NAME)")]
    PmemWithoutZone,
    /// The virtio-pmem size is not a positive multiple of 2 MiB, or too large.
    #[error("pmem {}: must be a multiple of 2 MiB, at most 1 TiB", format_size(*.0))]
    PmemSize(u64),
    /// A drive's settings.
    #[error(transparent)]
    Drive(#[from] DriveError),
    /// A network interface's settings.
    #[error(transparent)]
    Net(#[from] NetConfigError),
    /// The vsock device's settings.
    #[error(transparent)]
    Vsock(#[from] VsockConfigError),
    /// The hot-pluggable memory's settings.
    #[error(transparent)]
    Hotplug(#[from] HotplugConfigError),
    /// The balloon's settings.
    #[error(transparent)]
    Balloon(#[from] BalloonConfigError),
}

/// A Linux guest: kernel, initrd and command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxConfig {
    /// The kernel image (bzImage or ELF).
    pub kernel: PathBuf,
    /// The initial ramdisk.
    pub initrd: Option<PathBuf>,
    /// The command line, before virtio-mmio devices are appended.
    pub cmdline: String,
}

/// What the VM runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestConfig {
    /// The built-in test guest with its workload.
    TestGuest(Workload),
    /// A Linux kernel.
    Linux(LinuxConfig),
    /// A Linux guest restored from a snapshot: its kernel is in guest memory.
    RestoredLinux,
}

/// A VM in a persistent zone: its memory outlives the VMM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneTarget {
    /// The zone file (`vmm zone create`).
    pub path: PathBuf,
    /// The VM's name in the zone; created there on first use.
    pub vm: String,
    /// Delete the VM (free its frames) when its VMM ends or dies, instead of keeping its memory.
    pub ephemeral: bool,
    /// Attach the VM even though the zone's recovery lost some of its memory (which then reads
    /// as zeroes).
    pub accept_damaged: bool,
}

/// The zone's free memory, in percent of the zone, below which a VMM reclaims memory from its
/// guest by default.
pub const DEFAULT_RECLAIM_BELOW_PERCENT: u8 = 10;
/// A VM's weight in the zone's reclaim policy by default.
pub const DEFAULT_RECLAIM_WEIGHT: u16 = 100;

/// A VM's part in its zone's reclaim policy (see `runner::reclaim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimSettings {
    /// Below this percentage of the zone free, the VMM inflates its balloon by its share of
    /// the deficit; 0: never.
    pub below_percent: u8,
    /// The VM's weight in sharing a deficit: its share is in proportion to what its guest can
    /// spare times its weight (1 to 1000; of two VMs that can spare as much, one of weight 300
    /// gives three times what one of weight 100 gives).
    pub weight: u16,
    /// Bytes of RAM the policy always leaves the guest: it never inflates the balloon beyond
    /// RAM less this.
    pub floor: u64,
}

impl Default for ReclaimSettings {
    fn default() -> Self {
        Self {
            below_percent: DEFAULT_RECLAIM_BELOW_PERCENT,
            weight: DEFAULT_RECLAIM_WEIGHT,
            floor: 0,
        }
    }
}

/// The validated configuration of one VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmConfig {
    /// Guest RAM in bytes, a multiple of the backing's frame size.
    pub memory_size: u64,
    /// The host memory of the frame pool (without a zone).
    pub backing: BackingKind,
    /// The zone whose frames and VM directory hold guest RAM, instead of a pool of its own.
    pub zone: Option<ZoneTarget>,
    /// Bytes of a virtio-pmem device's memory (in the zone), if the VM has one.
    pub pmem_size: Option<u64>,
    /// Caps the virtio-pmem device's flush requests.
    pub pmem_rate_limiter: RateLimiterConfig,
    /// Hot-pluggable memory behind a virtio-mem device, if the VM has some.
    pub hotplug: Option<HotplugConfig>,
    /// Lay out a new pool in the backing's file or device, whatever it holds.
    pub format_pool: bool,
    /// A vCPU that finds the pool exhausted waits for a frame instead of the VM stopping.
    pub wait_for_memory: bool,
    /// With `wait_for_memory`: how long a fault may wait before the VM is stopped (`None`:
    /// for as long as it takes).
    pub memory_wait_limit: Option<std::time::Duration>,
    /// A VM in a zone with a balloon that reports statistics: its part in the zone's reclaim
    /// policy (see `runner::reclaim`).
    pub reclaim: ReclaimSettings,
    /// How freed frames are cleaned: zeroing for device DAX (which cannot punch holes), hole
    /// punching otherwise.
    pub scrub: Scrub,
    /// Eager, lazy or mapped-ahead population.
    pub populate: Populate,
    /// Track the pages the guest and the VMM write, for diff snapshots (Firecracker's
    /// `track_dirty_pages`): KVM logs the guest's, guest memory the VMM's.
    pub track_dirty_pages: bool,
    /// Number of vCPUs.
    pub vcpus: usize,
    /// SMT: the vCPUs are the two threads of each core (Firecracker's `smt`), not a core each.
    pub smt: bool,
    /// What the VM runs.
    pub guest: GuestConfig,
    /// Where to serve the control API.
    pub api_socket: Option<PathBuf>,
    /// The balloon device, if any.
    pub balloon: Option<BalloonDeviceConfig>,
    /// virtio-blk drives, the root drive first.
    pub drives: Vec<DriveConfig>,
    /// A virtio-rng entropy device (Firecracker's `PUT /entropy`) and its rate limiter.
    pub entropy: Option<RateLimiterConfig>,
    /// virtio-net interfaces over host taps.
    pub network_interfaces: Vec<NetConfig>,
    /// A virtio-vsock device.
    pub vsock: Option<VsockConfig>,
    /// The metadata service and the interfaces it answers on.
    pub mmds: Option<vmm_devices::mmds::Mmds>,
    /// Firecracker's custom CPU template, applied to every vCPU.
    pub cpu_template: Option<vmm_api::model::CustomCpuTemplate>,
}

impl VmConfig {
    /// Guest RAM regions around the MMIO gap, as the guest's memory map gives them.
    pub fn ram_regions(&self) -> Vec<RamRegion> {
        ram_regions(self.memory_size)
    }

    /// The virtio-pmem device's memory, if the VM has one ([`crate::layout::pmem_region`]).
    pub fn pmem_region(&self) -> Option<RamRegion> {
        self.pmem_size
            .map(|size| crate::layout::pmem_region(self.memory_size, size))
    }

    /// Bytes of RAM the host backs in frames of `frame`: the guest's RAM rounded up to a whole
    /// frame.
    pub fn backed_memory_size(&self, frame: FrameSize) -> u64 {
        self.memory_size.next_multiple_of(frame.bytes())
    }

    /// Every region of guest memory but the hot-pluggable one, as the host backs it in frames
    /// of `frame`: RAM in whole frames ([`crate::layout::backed_ram_regions`]), then the
    /// virtio-pmem memory.
    pub fn memory_regions(&self, frame: FrameSize) -> Vec<RamRegion> {
        let mut regions = crate::layout::backed_ram_regions(self.memory_size, frame.bytes());
        regions.extend(self.pmem_region());
        regions
    }

    /// The virtio-mem device's memory, if the VM has some ([`crate::layout::hotplug_region`]).
    pub fn hotplug_region(&self) -> Option<RamRegion> {
        self.hotplug.map(|hotplug| {
            crate::layout::hotplug_region(self.memory_size, self.pmem_size, hotplug.total_size)
        })
    }

    /// The built-in test guest with an empty workload on `memory_size` bytes of anonymous
    /// memory, populated lazily, with `vcpus` vCPUs and no devices, for the library's tests.
    #[cfg(test)]
    pub(crate) fn test_guest(memory_size: u64, vcpus: usize) -> Self {
        VmConfig {
            memory_size,
            backing: BackingKind::Anonymous,
            zone: None,
            pmem_size: None,
            pmem_rate_limiter: RateLimiterConfig::default(),
            hotplug: None,
            format_pool: false,
            wait_for_memory: false,
            memory_wait_limit: None,
            reclaim: ReclaimSettings::default(),
            scrub: Scrub::PunchHole,
            populate: Populate::Lazy,
            track_dirty_pages: false,
            vcpus,
            smt: false,
            guest: GuestConfig::TestGuest(Workload::new()),
            api_socket: None,
            balloon: None,
            drives: Vec::new(),
            entropy: None,
            network_interfaces: Vec::new(),
            vsock: None,
            mmds: None,
            cpu_template: None,
        }
    }

    /// [`VmConfig::test_guest`] with a balloon given in its textual form, for tests.
    #[cfg(test)]
    pub(crate) fn with_balloon(self, balloon: &str) -> Self {
        VmConfig {
            balloon: Some(balloon.parse().expect("balloon option")),
            ..self
        }
    }
}

/// Checks a vCPU count; the built-in test guest (`test_guest`) runs on fewer vCPUs than KVM.
pub fn check_vcpus(vcpus: usize, test_guest: bool) -> Result<(), ConfigError> {
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(ConfigError::Vcpus(vcpus));
    }
    if test_guest && vcpus > protocol::MAX_VCPUS as usize {
        return Err(ConfigError::TestGuestVcpus(vcpus));
    }
    Ok(())
}

/// Checks that with SMT the vCPUs make whole cores of two threads (or are a single one).
pub fn check_smt(vcpus: usize, smt: bool) -> Result<(), ConfigError> {
    if smt && vcpus > 1 && !vcpus.is_multiple_of(2) {
        return Err(ConfigError::SmtVcpus(vcpus));
    }
    Ok(())
}

/// Checks a guest RAM size: within [`MIN_MEMORY`, `MAX_MEMORY`] and a whole number of MiB, as
/// Firecracker's `mem_size_mib`. Any backing takes it: the host backs RAM in whole frames, the
/// last one partly used ([`crate::layout::backed_ram_regions`]).
pub fn check_memory(size: u64) -> Result<(), ConfigError> {
    if !(MIN_MEMORY..=MAX_MEMORY).contains(&size) {
        return Err(ConfigError::MemoryRange(size));
    }
    if !size.is_multiple_of(1 << 20) {
        return Err(ConfigError::MemoryNotWholeMib(size));
    }
    Ok(())
}

/// Checks a VM's reclaim settings against its RAM of `memory` bytes: the floor is at most the
/// RAM (the weight's range is its flag's).
pub fn check_reclaim(settings: &ReclaimSettings, memory: u64) -> Result<(), ConfigError> {
    match settings.floor > memory {
        true => Err(ConfigError::ReclaimFloor {
            floor: settings.floor,
            memory,
        }),
        false => Ok(()),
    }
}

pub(crate) fn path_error(
    setting: &'static str,
    path: &Path,
    why: impl Into<String>,
) -> ConfigError {
    ConfigError::Path {
        setting,
        path: path.to_owned(),
        why: why.into(),
    }
}

/// The parent directory of `path` ("." for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Checks a virtio-pmem size (`--pmem`), which needs a zone.
pub fn check_pmem(size: u64, zone: Option<&ZoneTarget>) -> Result<(), ConfigError> {
    if zone.is_none() {
        return Err(ConfigError::PmemWithoutZone);
    }
    if size == 0 || !size.is_multiple_of(2 << 20) || size > MAX_MEMORY {
        return Err(ConfigError::PmemSize(size));
    }
    Ok(())
}

/// Checks a zone and a VM name: the zone file exists (`vmm zone create` made it) and the name
/// is one a zone takes.
pub fn check_zone(zone: &ZoneTarget) -> Result<(), ConfigError> {
    guest_mem::zone::check_name(&zone.vm).map_err(|why| ConfigError::VmName {
        name: zone.vm.clone(),
        why,
    })?;
    match fs::metadata(&zone.path) {
        Ok(meta) if meta.is_dir() => Err(path_error("zone ", &zone.path, "is a directory")),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(ConfigError::ZoneMissing(zone.path.clone()))
        }
        Err(e) => Err(path_error("zone ", &zone.path, e.to_string())),
    }
}

/// Checks the pool file or DAX path (and that `format` asks to lay out a pool only in a file or
/// device) and picks how freed frames are scrubbed.
pub fn check_backing(backing: &BackingKind, format: bool) -> Result<Scrub, ConfigError> {
    if format && !backing.is_persistent() {
        return Err(ConfigError::FormatWithoutFile(backing.clone()));
    }
    match backing {
        BackingKind::File(path) => match fs::metadata(path) {
            Ok(meta) if meta.is_file() => Ok(Scrub::PunchHole),
            Ok(meta) if meta.is_dir() => Err(path_error("backing file:", path, "is a directory")),
            Ok(_) => Err(path_error(
                "backing file:",
                path,
                "is not a regular file (a device DAX takes --backing dax:PATH)",
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if parent_dir(path).is_dir() {
                    Ok(Scrub::PunchHole)
                } else {
                    Err(path_error(
                        "backing file:",
                        path,
                        "its directory does not exist",
                    ))
                }
            }
            Err(e) => Err(path_error("backing file:", path, e.to_string())),
        },
        BackingKind::Dax(path) => {
            let meta =
                fs::metadata(path).map_err(|e| path_error("backing dax:", path, e.to_string()))?;
            let kind = meta.file_type();
            if kind.is_char_device() {
                Ok(Scrub::ZeroOnFree)
            } else if kind.is_file() || kind.is_block_device() {
                Ok(Scrub::PunchHole)
            } else {
                Err(path_error(
                    "backing dax:",
                    path,
                    "is neither a DAX device nor a file",
                ))
            }
        }
        _ => Ok(Scrub::PunchHole),
    }
}

/// Checks that `path` is a readable regular file.
fn check_input_file(setting: &'static str, path: &Path) -> Result<(), ConfigError> {
    let meta = fs::metadata(path).map_err(|e| path_error(setting, path, e.to_string()))?;
    if !meta.is_file() {
        return Err(path_error(setting, path, "is not a regular file"));
    }
    if meta.len() == 0 {
        return Err(path_error(setting, path, "is empty"));
    }
    fs::File::open(path).map_err(|e| path_error(setting, path, e.to_string()))?;
    Ok(())
}

impl LinuxConfig {
    /// Checks that the kernel and initrd are readable files and the command line (the default
    /// one when `None`) fits and is printable ASCII.
    pub fn new(
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        cmdline: Option<String>,
    ) -> Result<Self, ConfigError> {
        check_input_file("kernel ", &kernel)?;
        if let Some(initrd) = &initrd {
            check_input_file("initrd ", initrd)?;
        }
        let cmdline = cmdline.unwrap_or_else(|| DEFAULT_CMDLINE.to_owned());
        if cmdline.len() >= CMDLINE_MAX_SIZE {
            return Err(ConfigError::Cmdline(format!(
                "{} bytes; at most {} fit",
                cmdline.len(),
                CMDLINE_MAX_SIZE - 1
            )));
        }
        if let Some(bad) = cmdline.chars().find(|c| !(' '..='~').contains(c)) {
            return Err(ConfigError::Cmdline(format!(
                "{bad:?} is not a printable ASCII character"
            )));
        }
        Ok(LinuxConfig {
            kernel,
            initrd,
            cmdline,
        })
    }
}

/// Checks that the control API can be served at `path`: short enough, in an existing
/// directory, and not some other file.
pub fn check_api_socket(path: &Path) -> Result<(), ConfigError> {
    let setting = "api-socket ";
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(path_error(
            setting,
            path,
            format!("longer than {MAX_SOCKET_PATH} bytes (the Unix socket limit)"),
        ));
    }
    if !parent_dir(path).is_dir() {
        return Err(path_error(setting, path, "its directory does not exist"));
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => Err(path_error(
            setting,
            path,
            "exists and is not a socket (refusing to replace it)",
        )),
        _ => Ok(()),
    }
}
