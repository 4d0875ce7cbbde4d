//! Firecracker's pre-boot bodies: the machine, boot source, drives, pmem, balloon, logger and
//! metrics a VMM started as `vmm --api-sock PATH` is configured with before `InstanceStart`
//! (and `--config-file`'s [`FullVmConfiguration`]). Fields Firecracker does not have are
//! marked as this VMM's extensions.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::PopulateMode;

/// Firecracker's default vCPU count before `PUT /machine-config`.
pub const DEFAULT_VCPUS: u64 = 1;
/// Firecracker's default memory size before `PUT /machine-config`, in MiB.
pub const DEFAULT_MEM_SIZE_MIB: u64 = 128;

/// Which pages back guest memory (Firecracker's `huge_pages`; `1G` is this VMM's extension).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum HugePages {
    /// Plain shared memory, managed in 2 MiB frames (Firecracker: 4 KiB pages).
    #[default]
    None,
    /// Transparent huge pages (refused: the pool's frames are 2 MiB already).
    Transparent,
    /// hugetlbfs 2 MiB pages.
    #[serde(rename = "2M")]
    Huge2M,
    /// hugetlbfs 1 GiB pages (extension).
    #[serde(rename = "1G")]
    Giant1G,
}

/// A VM kept in a persistent zone (extension): its memory outlives the VMM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneAttachment {
    /// The zone file (`vmm zone create`).
    pub path: PathBuf,
    /// The VM's name in it.
    pub vm: String,
    /// Delete the VM from the zone when this VMM ends or dies.
    #[serde(default)]
    pub ephemeral: bool,
    /// Attach the VM even though the zone's recovery lost some of its memory.
    #[serde(default, skip_serializing_if = "is_false")]
    pub accept_damaged: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// `PUT`/`GET /machine-config`: Firecracker's `MachineConfiguration`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfiguration {
    /// vCPUs: 1 to 32 in Firecracker, up to 254 here.
    pub vcpu_count: u64,
    /// Guest RAM in MiB.
    pub mem_size_mib: u64,
    /// Simultaneous multithreading (refused when true: the vCPUs are single cores).
    #[serde(default)]
    pub smt: bool,
    /// Dirty page tracking for diff snapshots (refused when true: a VM in a zone is
    /// snapshotted without copying anything).
    #[serde(default)]
    pub track_dirty_pages: bool,
    /// A CPU template (only "None" is taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_template: Option<String>,
    /// Which pages back guest memory.
    #[serde(default)]
    pub huge_pages: HugePages,
    /// Extension: keep guest memory in this zone instead of a pool of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<ZoneAttachment>,
    /// Extension: when guest memory gets its frames (default lazy: on first touch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub populate: Option<PopulateMode>,
    /// Extension: a vCPU that finds the pool exhausted waits for a frame instead of the VM
    /// stopping.
    #[serde(default, skip_serializing_if = "is_false")]
    pub wait_for_memory: bool,
    /// Extension: with `wait_for_memory`, how many seconds a fault may wait before the VM is
    /// stopped (absent: as long as it takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_memory_limit_s: Option<u64>,
}

impl Default for MachineConfiguration {
    fn default() -> Self {
        MachineConfiguration {
            vcpu_count: DEFAULT_VCPUS,
            mem_size_mib: DEFAULT_MEM_SIZE_MIB,
            smt: false,
            track_dirty_pages: false,
            cpu_template: None,
            huge_pages: HugePages::None,
            zone: None,
            populate: None,
            wait_for_memory: false,
            wait_for_memory_limit_s: None,
        }
    }
}

/// `PATCH /machine-config`: any fields of [`MachineConfiguration`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigurationUpdate {
    /// vCPUs.
    #[serde(default)]
    pub vcpu_count: Option<u64>,
    /// Guest RAM in MiB.
    #[serde(default)]
    pub mem_size_mib: Option<u64>,
    /// SMT.
    #[serde(default)]
    pub smt: Option<bool>,
    /// Dirty page tracking.
    #[serde(default)]
    pub track_dirty_pages: Option<bool>,
    /// A CPU template.
    #[serde(default)]
    pub cpu_template: Option<String>,
    /// Which pages back guest memory.
    #[serde(default)]
    pub huge_pages: Option<HugePages>,
    /// Extension: the zone.
    #[serde(default)]
    pub zone: Option<ZoneAttachment>,
    /// Extension: eager or lazy population.
    #[serde(default)]
    pub populate: Option<PopulateMode>,
    /// Extension: wait for memory.
    #[serde(default)]
    pub wait_for_memory: Option<bool>,
    /// Extension: the longest wait for memory, in seconds.
    #[serde(default)]
    pub wait_for_memory_limit_s: Option<u64>,
}

impl MachineConfigurationUpdate {
    /// Whether no field is set (Firecracker refuses such a PATCH).
    pub fn is_empty(&self) -> bool {
        *self == MachineConfigurationUpdate::default()
    }

    /// `machine` with this update's fields.
    pub fn apply(self, machine: &MachineConfiguration) -> MachineConfiguration {
        MachineConfiguration {
            vcpu_count: self.vcpu_count.unwrap_or(machine.vcpu_count),
            mem_size_mib: self.mem_size_mib.unwrap_or(machine.mem_size_mib),
            smt: self.smt.unwrap_or(machine.smt),
            track_dirty_pages: self.track_dirty_pages.unwrap_or(machine.track_dirty_pages),
            cpu_template: self.cpu_template.or_else(|| machine.cpu_template.clone()),
            huge_pages: self.huge_pages.unwrap_or(machine.huge_pages),
            zone: self.zone.or_else(|| machine.zone.clone()),
            populate: self.populate.or(machine.populate),
            wait_for_memory: self.wait_for_memory.unwrap_or(machine.wait_for_memory),
            wait_for_memory_limit_s: self
                .wait_for_memory_limit_s
                .or(machine.wait_for_memory_limit_s),
        }
    }
}

/// `PUT /boot-source`: Firecracker's `BootSource`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    /// The kernel: an ELF vmlinux or a bzImage.
    pub kernel_image_path: PathBuf,
    /// The initial ramdisk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<PathBuf>,
    /// The kernel command line (default: this VMM's, Firecracker-like).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
}

/// A drive's cache type: flushes are always carried out (Unsafe included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CacheType {
    /// Firecracker's default.
    Unsafe,
    /// Flushes reach the disk.
    Writeback,
}

/// A drive's I/O engine: `Sync` or `Async` (io_uring), as the device names them.
pub use vmm_devices::block::config::IoEngine;

/// `PUT /drives/{drive_id}`: Firecracker's `Drive`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drive {
    /// The drive's id, the same as in the path.
    pub drive_id: String,
    /// The root file system.
    pub is_root_device: bool,
    /// The root partition, for a disk with a partition table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    /// The cache type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type: Option<CacheType>,
    /// Read-only (required, as for Firecracker's virtio-blk drives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_read_only: Option<bool>,
    /// The raw image (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_on_host: Option<PathBuf>,
    /// Caps the bytes read and written and the requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
    /// The I/O engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_engine: Option<IoEngine>,
    /// A vhost-user-block socket (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

/// `PUT /pmem/{id}`: Firecracker's `Pmem`. Here a virtio-pmem device's memory lives in the
/// VM's zone, so `path_on_host` names the zone and `size_mib` (an extension) its size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pmem {
    /// The device's id, the same as in the path.
    pub id: String,
    /// The VM's zone (machine-config's `zone.path`).
    pub path_on_host: PathBuf,
    /// Extension: the device's size in MiB, a multiple of 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_mib: Option<u64>,
    /// Boot from it (refused when true).
    #[serde(default)]
    pub root_device: bool,
    /// Map it read-only (refused when true).
    #[serde(default)]
    pub read_only: bool,
    /// Caps the flush requests (each an operation of no bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
}

/// `PUT /serial`: Firecracker's `SerialDevice`, where the guest's console output goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialConfig {
    /// A regular file (appended to) or a named pipe on the host.
    pub serial_out_path: PathBuf,
    /// Caps the bytes per second; output beyond it is dropped and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<vmm_devices::rate_limiter::TokenBucketConfig>,
}

/// `PUT /entropy`: Firecracker's `EntropyDevice`, a virtio-rng device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyDevice {
    /// Caps the random bytes and requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
}

/// `PUT /network-interfaces/{iface_id}`: Firecracker's `NetworkInterface`, a virtio-net device
/// over a host tap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterface {
    /// The interface's id (the same as in the path).
    pub iface_id: String,
    /// The host's tap.
    pub host_dev_name: String,
    /// The guest's Ethernet address; none: the guest picks one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mac: Option<vmm_devices::net::config::MacAddr>,
    /// The MTU the guest is told (VIRTIO_NET_F_MTU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Caps what the guest receives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
    /// Caps what the guest sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
}

impl NetworkInterface {
    /// The device's configuration.
    pub fn config(&self) -> vmm_devices::net::config::NetConfig {
        vmm_devices::net::config::NetConfig {
            id: self.iface_id.clone(),
            host_dev_name: self.host_dev_name.clone(),
            guest_mac: self.guest_mac,
            mtu: self.mtu,
            rx_rate_limiter: self.rx_rate_limiter.unwrap_or_default(),
            tx_rate_limiter: self.tx_rate_limiter.unwrap_or_default(),
        }
    }

    /// The API's view of a device's configuration.
    pub fn from_config(config: &vmm_devices::net::config::NetConfig) -> Self {
        let limiter = |l: vmm_devices::rate_limiter::RateLimiterConfig| {
            (l != Default::default()).then_some(l)
        };
        NetworkInterface {
            iface_id: config.id.clone(),
            host_dev_name: config.host_dev_name.clone(),
            guest_mac: config.guest_mac,
            mtu: config.mtu,
            rx_rate_limiter: limiter(config.rx_rate_limiter),
            tx_rate_limiter: limiter(config.tx_rate_limiter),
        }
    }
}

/// `PATCH /network-interfaces/{iface_id}` after the start: Firecracker's
/// `PartialNetworkInterface`, new rate limiters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialNetworkInterface {
    /// The interface's id (the same as in the path).
    pub iface_id: String,
    /// Replaces the receive limiter.
    #[serde(default)]
    pub rx_rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
    /// Replaces the transmit limiter.
    #[serde(default)]
    pub tx_rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
}

/// `PATCH /drives/{drive_id}` after the start: Firecracker's `PartialDrive`, a new image
/// (media change) and/or a new rate limiter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialDrive {
    /// The drive's id (the same as in the path).
    pub drive_id: String,
    /// Replaces the drive's image; the guest is told its new size.
    #[serde(default)]
    pub path_on_host: Option<PathBuf>,
    /// Replaces the rate limiter.
    #[serde(default)]
    pub rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
}

/// `PATCH /pmem/{id}` after the start: Firecracker's `PartialPmem`, a new rate limiter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialPmem {
    /// The device's id (the same as in the path).
    pub id: String,
    /// Replaces the rate limiter.
    #[serde(default)]
    pub rate_limiter: Option<vmm_devices::rate_limiter::RateLimiterConfig>,
}

/// `PUT /vsock`: Firecracker's `Vsock`, a virtio-vsock device whose host side is Unix sockets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vsock {
    /// The guest's CID (at least 3).
    pub guest_cid: u32,
    /// The Unix socket host programs connect to.
    pub uds_path: PathBuf,
    /// Deprecated in Firecracker; ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_id: Option<String>,
}

impl Vsock {
    /// The device's configuration.
    pub fn config(&self) -> vmm_devices::vsock::config::VsockConfig {
        vmm_devices::vsock::config::VsockConfig {
            guest_cid: self.guest_cid,
            uds_path: self.uds_path.clone(),
        }
    }
}

/// `PUT /mmds/config`: Firecracker's `MmdsConfig`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmdsConfigRequest {
    /// V1 (default) or V2.
    #[serde(default)]
    pub version: vmm_devices::mmds::Version,
    /// The interfaces MMDS answers on (they must exist).
    pub network_interfaces: Vec<String>,
    /// Its address (default 169.254.169.254; link-local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_address: Option<std::net::Ipv4Addr>,
    /// IMDS's text form always.
    #[serde(default)]
    pub imds_compat: bool,
}

impl MmdsConfigRequest {
    /// The configuration it asks for.
    pub fn config(&self) -> vmm_devices::mmds::MmdsConfig {
        vmm_devices::mmds::MmdsConfig {
            version: self.version,
            ipv4_address: self.ipv4_address.unwrap_or(vmm_devices::mmds::DEFAULT_IPV4),
            network_interfaces: self.network_interfaces.clone(),
            imds_compat: self.imds_compat,
        }
    }

    /// The API's view of a configuration.
    pub fn from_config(config: &vmm_devices::mmds::MmdsConfig) -> Self {
        MmdsConfigRequest {
            version: config.version,
            network_interfaces: config.network_interfaces.clone(),
            ipv4_address: Some(config.ipv4_address),
            imds_compat: config.imds_compat,
        }
    }
}

/// `PUT /balloon` before the start: Firecracker's `Balloon`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Balloon {
    /// Target in MiB.
    pub amount_mib: u64,
    /// The guest may deflate on OOM.
    pub deflate_on_oom: bool,
    /// Seconds between statistics requests; 0 turns statistics off for good.
    #[serde(default)]
    pub stats_polling_interval_s: u32,
    /// Free page hinting: the runs `PATCH /balloon/hinting/start` starts give the pages the
    /// guest hints back to the frame pool.
    #[serde(default)]
    pub free_page_hinting: bool,
    /// Free page reporting: reported pages go back to the frame pool.
    #[serde(default)]
    pub free_page_reporting: bool,
}

/// A log level as Firecracker spells it (case-insensitive on input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// Nothing.
    Off,
    /// Errors.
    Error,
    /// Warnings and up.
    Warning,
    /// Information and up.
    Info,
    /// Debug messages and up.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    const NAMES: [(&'static str, LogLevel); 6] = [
        ("Off", LogLevel::Off),
        ("Error", LogLevel::Error),
        ("Warning", LogLevel::Warning),
        ("Info", LogLevel::Info),
        ("Debug", LogLevel::Debug),
        ("Trace", LogLevel::Trace),
    ];

    /// The `log` crate's filter for this level.
    pub fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Off => log::LevelFilter::Off,
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warning => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        }
    }

    fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, level)| *level == self)
            .map_or("Info", |(name, _)| name)
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(&text))
            .map(|(_, level)| *level)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "unknown log level {text:?}: expected Error, Warning, Info, Debug, Trace or \
                     Off"
                ))
            })
    }
}

/// `PUT /logger`: Firecracker's `Logger`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logger {
    /// A file or named pipe for the log (default: stderr, as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<PathBuf>,
    /// The level (default Info).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<LogLevel>,
    /// Show each message's level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_level: Option<bool>,
    /// Show each message's origin (file and line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_log_origin: Option<bool>,
    /// Only messages of this module path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// `PUT /metrics`: Firecracker's `Metrics`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    /// A file or named pipe that gets a JSON line per flush.
    pub metrics_path: PathBuf,
    /// Put the instance id in each line as `id`.
    #[serde(default)]
    pub emit_id: bool,
    /// Put these pairs in each line as `properties`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<BTreeMap<String, String>>,
    /// This VMM's: how often a line is written unasked, in milliseconds
    /// ([`MIN_METRICS_INTERVAL_MS`] to an hour; Firecracker's minute without it), so that a
    /// sampler of an experiment reads the series from the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_interval_ms: Option<u64>,
}

/// The shortest `flush_interval_ms` of [`Metrics`].
pub const MIN_METRICS_INTERVAL_MS: u64 = 100;
/// The longest `flush_interval_ms` of [`Metrics`]: an hour.
pub const MAX_METRICS_INTERVAL_MS: u64 = 3_600_000;

/// `GET /vm/config` and `--config-file`: Firecracker's `FullVmConfiguration`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FullVmConfiguration {
    /// The balloon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<Balloon>,
    /// The drives.
    #[serde(default)]
    pub drives: Vec<Drive>,
    /// The kernel.
    #[serde(
        rename = "boot-source",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub boot_source: Option<BootSource>,
    /// The logger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<Logger>,
    /// The machine.
    #[serde(
        rename = "machine-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub machine_config: Option<MachineConfiguration>,
    /// The metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// virtio-pmem devices (at most one, in the VM's zone).
    #[serde(default)]
    pub pmem: Vec<Pmem>,
    /// Network interfaces.
    #[serde(rename = "network-interfaces", default)]
    pub network_interfaces: Vec<NetworkInterface>,
    /// The vsock device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<Vsock>,
    /// MMDS.
    #[serde(
        rename = "mmds-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mmds_config: Option<MmdsConfigRequest>,
    /// The custom CPU template.
    #[serde(
        rename = "cpu-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_config: Option<crate::model::CustomCpuTemplate>,
    /// The entropy device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<EntropyDevice>,
    /// The hot-pluggable memory (virtio-mem).
    #[serde(
        rename = "memory-hotplug",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_hotplug: Option<MemoryHotplugConfig>,
}

const fn default_slot_size_mib() -> u64 {
    vmm_devices::mem::config::DEFAULT_SLOT_SIZE >> 20
}

const fn default_block_size_mib() -> u64 {
    vmm_devices::mem::config::DEFAULT_BLOCK_SIZE >> 20
}

/// `PUT /hotplug/memory` and `memory-hotplug`: Firecracker's `MemoryHotplugConfig`, the
/// virtio-mem device's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryHotplugConfig {
    /// MiB that may be plugged, whole slots.
    pub total_size_mib: u64,
    /// MiB of a slot: at least 128, whole blocks.
    #[serde(default = "default_slot_size_mib")]
    pub slot_size_mib: u64,
    /// MiB of a block, the unit the guest plugs: a power of two of at least 2.
    #[serde(default = "default_block_size_mib")]
    pub block_size_mib: u64,
}

impl MemoryHotplugConfig {
    /// The configuration in bytes; `None` if a size overflows.
    pub fn config(&self) -> Option<vmm_devices::mem::config::HotplugConfig> {
        let bytes = |mib: u64| mib.checked_mul(1 << 20);
        Some(vmm_devices::mem::config::HotplugConfig {
            total_size: bytes(self.total_size_mib)?,
            block_size: bytes(self.block_size_mib)?,
            slot_size: bytes(self.slot_size_mib)?,
        })
    }

    /// The API's view of `config`.
    pub fn from_config(config: &vmm_devices::mem::config::HotplugConfig) -> Self {
        Self {
            total_size_mib: config.total_size >> 20,
            slot_size_mib: config.slot_size >> 20,
            block_size_mib: config.block_size >> 20,
        }
    }
}

/// `PATCH /hotplug/memory`: Firecracker's `MemoryHotplugSizeUpdate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryHotplugSizeUpdate {
    /// MiB the guest should have plugged.
    pub requested_size_mib: u64,
}

/// `GET /hotplug/memory`: Firecracker's `MemoryHotplugStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryHotplugStatus {
    /// MiB that may be plugged.
    pub total_size_mib: u64,
    /// MiB of a slot.
    pub slot_size_mib: u64,
    /// MiB of a block.
    pub block_size_mib: u64,
    /// MiB the guest has plugged.
    pub plugged_size_mib: u64,
    /// MiB the host asks the guest to have plugged.
    pub requested_size_mib: u64,
}
