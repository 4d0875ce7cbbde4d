//! [`VmResources`]: what a VMM started without a VM (`vmm --api-sock PATH`) is configured with
//! before `InstanceStart`, as in Firecracker. Every `PUT`/`PATCH` is checked when it arrives,
//! with the same checks as `vmm run`'s flags; `InstanceStart` turns it into a [`VmConfig`].

use std::path::Path;

use guest_mem::{Populate, Scrub};

use crate::arch::x86_64::cpu_template::CpuTemplate;
use crate::config::{
    check_memory, check_pmem, check_smt, check_vcpus, check_zone, BackingKind, BalloonDeviceConfig,
    ConfigError, DriveConfig, GuestConfig, HotplugConfig, LinuxConfig, VmConfig, ZoneTarget,
};
use crate::testguest::image::guest_for_kernel;
use crate::testguest::WorkloadSpec;
use vmm_api::model::CustomCpuTemplate;
use vmm_api::model::{
    Balloon, BootSource, CacheType, Drive, EntropyDevice, FullVmConfiguration, HugePages, Logger,
    MachineConfiguration, MachineConfigurationUpdate, MemoryHotplugConfig, Metrics,
    MmdsConfigRequest, NetworkInterface, Pmem, Vsock, ZoneAttachment,
};
use vmm_api::vmm_control::ControlError;
use vmm_devices::rate_limiter::RateLimiterConfig;

/// MiB in bytes.
const MIB: u64 = 1 << 20;

fn invalid(error: impl Into<ConfigError>) -> ControlError {
    ControlError::InvalidArgument(error.into().to_string())
}

fn refuse(why: impl Into<String>) -> ControlError {
    ControlError::InvalidArgument(why.into())
}

/// The backing `huge_pages` asks for.
fn backing(huge_pages: HugePages) -> Result<BackingKind, ControlError> {
    match huge_pages {
        HugePages::None => Ok(BackingKind::Anonymous),
        HugePages::Huge2M => Ok(BackingKind::Hugetlb2M),
        HugePages::Giant1G => Ok(BackingKind::Hugetlb1G),
        HugePages::Transparent => Err(refuse(
            "huge_pages Transparent is not supported: guest memory is managed in 2 MiB frames \
             already (None), or comes from hugetlbfs (2M, 1G)",
        )),
    }
}

/// The `huge_pages` of a backing.
fn huge_pages(backing: &BackingKind) -> HugePages {
    match backing {
        BackingKind::Hugetlb2M => HugePages::Huge2M,
        BackingKind::Hugetlb1G => HugePages::Giant1G,
        _ => HugePages::None,
    }
}

/// Checks a machine configuration, and that `balloon` still fits it.
fn check_machine(
    machine: &MachineConfiguration,
    balloon: Option<&Balloon>,
) -> Result<(), ControlError> {
    let vcpus = usize::try_from(machine.vcpu_count).unwrap_or(usize::MAX);
    check_vcpus(vcpus, false).map_err(invalid)?;
    check_smt(vcpus, machine.smt).map_err(|_| {
        refuse(
            "The vCPU number is invalid! The vCPU number can only be 1 or an even number when \
             hyperthreading is enabled.",
        )
    })?;
    if let Some(template) = machine.cpu_template.as_deref() {
        match template {
            "None" | "T2A" => {}
            // Firecracker's answer on an AMD host to its Intel and Arm templates.
            "C3" | "T2" | "T2S" | "T2CL" | "V1N1" => {
                return Err(refuse(format!(
                    "cpu_template {template}: the CPU template is not supported on this CPU \
                     vendor (AMD)"
                )))
            }
            other => {
                return Err(refuse(format!(
                    "cpu_template {other}: expected C3, T2, T2S, T2CL, T2A, V1N1 or None"
                )))
            }
        }
    }
    let size = machine
        .mem_size_mib
        .checked_mul(MIB)
        .ok_or_else(|| refuse("The memory size (MiB) is invalid."))?;
    // Firecracker takes any number of MiB on 4 KiB pages and whole huge pages on hugetlbfs; here
    // RAM is backed in 2 MiB frames (None) or hugetlbfs pages (2M, 1G), and refused as it is
    // there.
    let page = backing(machine.huge_pages)?.frame_size().bytes();
    if machine.huge_pages != HugePages::None && !size.is_multiple_of(page) {
        return Err(refuse(
            "The memory size (MiB) is either 0, or not a multiple of the configured page size.",
        ));
    }
    check_memory(size).map_err(invalid)?;
    if let Some(zone) = &machine.zone {
        check_zone(&zone_target(zone)).map_err(invalid)?;
    }
    match machine.wait_for_memory_limit_s {
        Some(0) => return Err(refuse("wait_for_memory_limit_s must be at least 1.")),
        Some(_) if !machine.wait_for_memory => {
            return Err(refuse(
                "wait_for_memory_limit_s bounds wait_for_memory, which is off.",
            ))
        }
        _ => {}
    }
    if balloon.is_some_and(|b| b.amount_mib > machine.mem_size_mib) {
        return Err(refuse(
            "The memory size (MiB) is smaller than the previously set balloon device target size.",
        ));
    }
    Ok(())
}

fn zone_target(zone: &ZoneAttachment) -> ZoneTarget {
    ZoneTarget {
        path: zone.path.clone(),
        vm: zone.vm.clone(),
        ephemeral: zone.ephemeral,
        accept_damaged: zone.accept_damaged,
    }
}

/// Checks that the id in the path is the body's.
pub(crate) fn check_path_id(path_id: &str, body_id: &str) -> Result<(), ControlError> {
    if path_id != body_id {
        return Err(refuse(
            "The id from the path does not match the id from the body!",
        ));
    }
    Ok(())
}

/// The drive a `PUT /drives/{id}` body describes.
fn drive_config(drive: &Drive) -> Result<DriveConfig, ControlError> {
    if drive.socket.is_some() {
        return Err(refuse(
            "vhost-user-block drives (socket) are not supported: give path_on_host",
        ));
    }
    let path = drive
        .path_on_host
        .clone()
        .ok_or_else(|| refuse("path_on_host is required for a virtio-block drive"))?;
    let read_only = drive
        .is_read_only
        .ok_or_else(|| refuse("is_read_only is required for a virtio-block drive"))?;
    let config = DriveConfig {
        id: drive.drive_id.clone(),
        path,
        read_only,
        root: drive.is_root_device,
        partuuid: drive.partuuid.clone().filter(|_| drive.is_root_device),
        rate_limiter: drive.rate_limiter.unwrap_or_default(),
        io_engine: drive.io_engine.unwrap_or_default(),
    };
    config.check().map_err(invalid)?;
    Ok(config)
}

/// The id of a virtio-pmem device that was not configured through the API (`vmm run --pmem`).
pub const DEFAULT_PMEM_ID: &str = "pmem0";

/// What a VMM is configured with before it starts its VM.
#[derive(Debug, Default)]
pub struct VmResources {
    machine: MachineConfiguration,
    boot_source: Option<(BootSource, LinuxConfig)>,
    balloon: Option<Balloon>,
    drives: Vec<(Drive, DriveConfig)>,
    pmem: Option<Pmem>,
    entropy: Option<EntropyDevice>,
    network_interfaces: Vec<NetworkInterface>,
    vsock: Option<Vsock>,
    mmds_config: Option<MmdsConfigRequest>,
    cpu_config: Option<CustomCpuTemplate>,
    hotplug: Option<MemoryHotplugConfig>,
    /// The MMDS document: set before the start or after, served once the VM runs.
    mmds_store: std::sync::Arc<std::sync::Mutex<vmm_devices::mmds::Store>>,
    logger: Option<Logger>,
    metrics: Option<Metrics>,
    /// Whether anything that only a boot uses was configured (a snapshot is then refused).
    boot_specific: bool,
}

impl VmResources {
    /// The machine configuration (Firecracker's defaults until a `PUT`).
    pub fn machine(&self) -> &MachineConfiguration {
        &self.machine
    }

    /// `PUT /machine-config`: fields left out take their defaults.
    pub fn put_machine(&mut self, machine: MachineConfiguration) -> Result<(), ControlError> {
        check_machine(&machine, self.balloon.as_ref())?;
        self.check_pmem_with(&machine, self.pmem.as_ref())?;
        // As in Firecracker, the CPU template given last is the VM's.
        if machine.cpu_template.as_deref() == Some("T2A") {
            self.cpu_config = None;
        }
        self.machine = machine;
        self.boot_specific = true;
        Ok(())
    }

    /// `PATCH /machine-config`: only the fields given change.
    pub fn patch_machine(
        &mut self,
        update: MachineConfigurationUpdate,
    ) -> Result<(), ControlError> {
        if update.is_empty() {
            return Err(refuse("Empty PATCH request."));
        }
        self.put_machine(update.apply(&self.machine))
    }

    /// `PUT /boot-source`.
    pub fn put_boot_source(&mut self, boot: BootSource) -> Result<(), ControlError> {
        let linux = LinuxConfig::new(
            boot.kernel_image_path.clone(),
            boot.initrd_path.clone(),
            boot.boot_args.clone(),
        )
        .map_err(invalid)?;
        self.boot_source = Some((boot, linux));
        self.boot_specific = true;
        Ok(())
    }

    /// `PUT /drives/{id}`: a new drive, or a new configuration for drive `id`.
    pub fn put_drive(&mut self, id: &str, drive: Drive) -> Result<(), ControlError> {
        check_path_id(id, &drive.drive_id)?;
        let config = drive_config(&drive)?;
        if config.root && self.drives.iter().any(|(_, d)| d.root && d.id != config.id) {
            return Err(refuse("A root block device already exists!"));
        }
        if config.root && self.pmem.as_ref().is_some_and(|p| p.root_device) {
            return Err(refuse(
                "Attempt to add block as a root device while the root device defined as a pmem \
                 device",
            ));
        }
        match self.drives.iter_mut().find(|(_, d)| d.id == config.id) {
            Some(slot) => *slot = (drive, config),
            None => self.drives.push((drive, config)),
        }
        self.boot_specific = true;
        Ok(())
    }

    fn check_pmem_with(
        &self,
        machine: &MachineConfiguration,
        pmem: Option<&Pmem>,
    ) -> Result<(), ControlError> {
        let Some(pmem) = pmem else {
            return Ok(());
        };
        let zone = machine.zone.as_ref().ok_or_else(|| {
            refuse(
                "a virtio-pmem device keeps its memory in the VM's zone: set machine-config's \
                 zone first",
            )
        })?;
        let same = match (
            std::fs::metadata(&pmem.path_on_host),
            std::fs::metadata(&zone.path),
        ) {
            (Ok(a), Ok(b)) => {
                use std::os::unix::fs::MetadataExt;
                a.dev() == b.dev() && a.ino() == b.ino()
            }
            _ => pmem.path_on_host == zone.path,
        };
        if !same {
            return Err(refuse(format!(
                "pmem path_on_host {}: a virtio-pmem device's memory lives in the VM's zone ({})",
                pmem.path_on_host.display(),
                zone.path.display()
            )));
        }
        let size_mib = pmem
            .size_mib
            .ok_or_else(|| refuse("pmem size_mib is required (the device's size in the zone)"))?;
        check_pmem(size_mib.saturating_mul(MIB), Some(&zone_target(zone))).map_err(invalid)
    }

    /// `PUT /entropy`: a virtio-rng device (again: the same device with the new settings).
    pub fn put_entropy(&mut self, entropy: EntropyDevice) -> Result<(), ControlError> {
        self.entropy = Some(entropy);
        self.boot_specific = true;
        Ok(())
    }

    /// `PUT /network-interfaces/{id}`: a new interface, or a new configuration for interface
    /// `id`. Its tap is opened once here, so that a tap the VMM cannot use is refused now.
    pub fn put_network_interface(
        &mut self,
        id: &str,
        interface: NetworkInterface,
    ) -> Result<(), ControlError> {
        check_path_id(id, &interface.iface_id)?;
        let mut interfaces = self.network_interfaces.clone();
        match interfaces.iter_mut().find(|i| i.iface_id == id) {
            Some(slot) => *slot = interface,
            None => interfaces.push(interface),
        }
        let configs: Vec<_> = interfaces.iter().map(NetworkInterface::config).collect();
        crate::config::check_network_interfaces(&configs).map_err(invalid)?;
        let config = configs
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| refuse("the interface vanished"))?;
        vmm_devices::net::tap::Tap::open(&config.host_dev_name, vmm_devices::net::HEADER_SIZE)
            .map_err(|e| refuse(format!("Could not create the network device: {e}")))?;
        self.network_interfaces = interfaces;
        self.boot_specific = true;
        Ok(())
    }

    /// `PUT /vsock`: the VM's vsock device (again: the device with the new settings).
    pub fn put_vsock(&mut self, vsock: Vsock) -> Result<(), ControlError> {
        vsock.config().check().map_err(invalid)?;
        self.vsock = Some(vsock);
        self.boot_specific = true;
        Ok(())
    }

    /// `PUT /mmds/config`: the interfaces (configured already) MMDS answers on, its version
    /// and link-local address.
    pub fn put_mmds_config(&mut self, request: MmdsConfigRequest) -> Result<(), ControlError> {
        if request.network_interfaces.is_empty() {
            return Err(refuse(
                "network_interfaces: MMDS needs at least one interface to answer on",
            ));
        }
        if let Some(missing) = request.network_interfaces.iter().find(|id| {
            !self
                .network_interfaces
                .iter()
                .any(|interface| &interface.iface_id == *id)
        }) {
            return Err(refuse(format!(
                "The list of network interface IDs provided contains at least one ID that does \
                 not correspond to any existing network interface: {missing}"
            )));
        }
        let address = request.config().ipv4_address;
        if !address.is_link_local() {
            return Err(refuse(format!(
                "ipv4_address {address}: MMDS's address must be link-local (169.254.0.0/16)"
            )));
        }
        self.mmds_config = Some(request);
        self.boot_specific = true;
        Ok(())
    }

    /// `PUT /cpu-config`: Firecracker's custom CPU template (again: the new one), checked now
    /// and applied to every vCPU at the start.
    pub fn put_cpu_config(&mut self, template: CustomCpuTemplate) -> Result<(), ControlError> {
        CpuTemplate::try_from(&template).map_err(|e| refuse(e.to_string()))?;
        // As in Firecracker, the CPU template given last is the VM's.
        self.machine.cpu_template = None;
        self.cpu_config = Some(template);
        self.boot_specific = true;
        Ok(())
    }

    /// The MMDS document, which `PUT`/`PATCH /mmds` change before the start.
    pub fn mmds_store(&self) -> &std::sync::Arc<std::sync::Mutex<vmm_devices::mmds::Store>> {
        &self.mmds_store
    }

    /// The virtio-pmem device's id, if one was configured.
    pub fn pmem_id(&self) -> Option<&str> {
        self.pmem.as_ref().map(|pmem| pmem.id.as_str())
    }

    /// `PUT /pmem/{id}`: the VM's one virtio-pmem device, in its zone.
    pub fn put_pmem(&mut self, id: &str, pmem: Pmem) -> Result<(), ControlError> {
        check_path_id(id, &pmem.id)?;
        crate::config::check_drive_id(id).map_err(invalid)?;
        if pmem.root_device || pmem.read_only {
            return Err(refuse(
                "root_device and read_only are not supported for virtio-pmem",
            ));
        }
        if self.pmem.as_ref().is_some_and(|p| p.id != pmem.id) {
            return Err(refuse("only one virtio-pmem device is supported"));
        }
        self.check_pmem_with(&self.machine, Some(&pmem))?;
        self.pmem = Some(pmem);
        self.boot_specific = true;
        Ok(())
    }

    /// `PUT /hotplug/memory`: the VM's hot-pluggable memory (a virtio-mem device), checked
    /// against the machine's huge pages (again at the start).
    pub fn put_memory_hotplug(&mut self, hotplug: MemoryHotplugConfig) -> Result<(), ControlError> {
        self.hotplug_config(&hotplug)?;
        self.hotplug = Some(hotplug);
        self.boot_specific = true;
        Ok(())
    }

    /// The bytes of `hotplug`, checked against the machine's backing.
    fn hotplug_config(&self, hotplug: &MemoryHotplugConfig) -> Result<HotplugConfig, ControlError> {
        let config = hotplug
            .config()
            .ok_or_else(|| refuse("memory hotplug: a size overflows"))?;
        let frame = backing(self.machine.huge_pages)?.frame_size();
        config.check(frame).map_err(invalid)?;
        Ok(config)
    }

    /// `PUT /balloon` before the start.
    pub fn put_balloon(&mut self, balloon: Balloon) -> Result<(), ControlError> {
        if balloon.amount_mib > self.machine.mem_size_mib {
            return Err(refuse(format!(
                "Amount of pages requested is too large: {} MiB for {} MiB of guest memory",
                balloon.amount_mib, self.machine.mem_size_mib
            )));
        }
        self.balloon = Some(balloon);
        self.boot_specific = true;
        Ok(())
    }

    /// The hot-pluggable memory, if configured.
    pub fn memory_hotplug(&self) -> Option<&MemoryHotplugConfig> {
        self.hotplug.as_ref()
    }

    /// The balloon, if configured.
    pub fn balloon(&self) -> Option<&Balloon> {
        self.balloon.as_ref()
    }

    /// `PUT /logger`, once checked and applied by the front end.
    pub fn set_logger(&mut self, logger: Logger) {
        self.logger = Some(logger);
    }

    /// `PUT /metrics`, once its file is open.
    pub fn set_metrics(&mut self, metrics: Metrics) {
        self.metrics = Some(metrics);
    }

    /// Whether anything only a boot uses was configured (Firecracker then refuses to load a
    /// snapshot).
    pub fn boot_specific(&self) -> bool {
        self.boot_specific
    }

    /// The VM to boot on `InstanceStart`, its API served on `api_socket`.
    pub fn vm_config(&self, api_socket: Option<&Path>) -> Result<VmConfig, ControlError> {
        let (_, linux) = self
            .boot_source
            .as_ref()
            .ok_or_else(|| refuse("Start microvm error: Missing kernel configuration."))?;
        let machine = &self.machine;
        check_machine(machine, self.balloon.as_ref())?;
        let mut drives: Vec<DriveConfig> = self.drives.iter().map(|(_, d)| d.clone()).collect();
        // The root drive comes first: it is /dev/vda.
        drives.sort_by_key(|drive| !drive.root);
        let balloon = self.balloon.map(|b| BalloonDeviceConfig {
            size: b.amount_mib * MIB,
            deflate_on_oom: b.deflate_on_oom,
            free_page_reporting: b.free_page_reporting,
            free_page_hinting: b.free_page_hinting,
            stats_polling_interval_s: b.stats_polling_interval_s,
        });
        let hotplug = self
            .hotplug
            .as_ref()
            .map(|hotplug| self.hotplug_config(hotplug))
            .transpose()?;
        let pmem_size = self
            .pmem
            .as_ref()
            .and_then(|p| p.size_mib)
            .map(|mib| mib * MIB);
        Ok(VmConfig {
            memory_size: machine.mem_size_mib * MIB,
            backing: backing(machine.huge_pages)?,
            zone: machine.zone.as_ref().map(zone_target),
            pmem_size,
            pmem_rate_limiter: self
                .pmem
                .as_ref()
                .and_then(|p| p.rate_limiter)
                .unwrap_or_default(),
            hotplug,
            format_pool: false,
            wait_for_memory: machine.wait_for_memory,
            memory_wait_limit: machine
                .wait_for_memory_limit_s
                .map(std::time::Duration::from_secs),
            reclaim: crate::config::ReclaimSettings::default(),
            scrub: Scrub::PunchHole,
            populate: machine.populate.map(Populate::from).unwrap_or_default(),
            track_dirty_pages: machine.track_dirty_pages,
            vcpus: usize::try_from(machine.vcpu_count).unwrap_or(usize::MAX),
            smt: machine.smt,
            // The test guest's image (`vmm guest-image`) runs as the test guest.
            guest: guest_for_kernel(
                linux.clone(),
                machine.mem_size_mib * MIB,
                usize::try_from(machine.vcpu_count).unwrap_or(usize::MAX),
                balloon.as_ref(),
                hotplug.map(|h| {
                    crate::layout::hotplug_region(
                        machine.mem_size_mib * MIB,
                        pmem_size,
                        h.total_size,
                    )
                }),
                &WorkloadSpec::default(),
            )
            .map_err(|e| ControlError::InvalidArgument(e.to_string()))?,
            api_socket: api_socket.map(Path::to_owned),
            balloon,
            drives,
            entropy: self
                .entropy
                .as_ref()
                .map(|e| e.rate_limiter.unwrap_or_default()),
            network_interfaces: self
                .network_interfaces
                .iter()
                .map(NetworkInterface::config)
                .collect(),
            vsock: self.vsock.as_ref().map(Vsock::config),
            cpu_template: match machine.cpu_template.as_deref() {
                Some("T2A") => Some(crate::arch::x86_64::cpu_template::t2a()),
                _ => self.cpu_config.clone(),
            },
            mmds: self
                .mmds_config
                .as_ref()
                .map(|request| vmm_devices::mmds::Mmds {
                    config: request.config(),
                    store: self.mmds_store.clone(),
                }),
        })
    }

    /// `GET /vm/config`.
    pub fn full_config(&self) -> FullVmConfiguration {
        FullVmConfiguration {
            balloon: self.balloon,
            drives: self.drives.iter().map(|(d, _)| d.clone()).collect(),
            boot_source: self.boot_source.as_ref().map(|(b, _)| b.clone()),
            logger: self.logger.clone(),
            machine_config: Some(self.machine.clone()),
            metrics: self.metrics.clone(),
            pmem: self.pmem.iter().cloned().collect(),
            entropy: self.entropy.clone(),
            network_interfaces: self.network_interfaces.clone(),
            vsock: self.vsock.clone(),
            mmds_config: self.mmds_config.clone(),
            cpu_config: self.cpu_config.clone(),
            memory_hotplug: self.hotplug,
        }
    }
}

/// The Firecracker view of a running VM's configuration (`vmm run`): `GET /machine-config` and
/// `GET /vm/config` of a VM that was not configured through the API.
pub fn machine_configuration(config: &VmConfig) -> MachineConfiguration {
    MachineConfiguration {
        vcpu_count: config.vcpus as u64,
        smt: config.smt,
        mem_size_mib: config.memory_size / MIB,
        huge_pages: huge_pages(&config.backing),
        zone: config.zone.as_ref().map(|zone| ZoneAttachment {
            path: zone.path.clone(),
            vm: zone.vm.clone(),
            ephemeral: zone.ephemeral,
            accept_damaged: zone.accept_damaged,
        }),
        populate: Some(config.populate.into()),
        wait_for_memory: config.wait_for_memory,
        wait_for_memory_limit_s: config.memory_wait_limit.map(|limit| limit.as_secs()),
        track_dirty_pages: config.track_dirty_pages,
        ..MachineConfiguration::default()
    }
}

/// `GET /vm/config` of a VM that was not configured through the API.
pub fn full_configuration(config: &VmConfig) -> FullVmConfiguration {
    FullVmConfiguration {
        balloon: config.balloon.map(|b| Balloon {
            amount_mib: b.size / MIB,
            deflate_on_oom: b.deflate_on_oom,
            stats_polling_interval_s: b.stats_polling_interval_s,
            free_page_hinting: b.free_page_hinting,
            free_page_reporting: b.free_page_reporting,
        }),
        drives: config
            .drives
            .iter()
            .map(|d| Drive {
                drive_id: d.id.clone(),
                is_root_device: d.root,
                partuuid: d.partuuid.clone(),
                cache_type: Some(CacheType::Writeback),
                is_read_only: Some(d.read_only),
                path_on_host: Some(d.path.clone()),
                rate_limiter: (d.rate_limiter != RateLimiterConfig::default())
                    .then_some(d.rate_limiter),
                io_engine: Some(d.io_engine),
                socket: None,
            })
            .collect(),
        boot_source: match &config.guest {
            GuestConfig::Linux(linux) => Some(BootSource {
                kernel_image_path: linux.kernel.clone(),
                initrd_path: linux.initrd.clone(),
                boot_args: Some(linux.cmdline.clone()),
            }),
            _ => None,
        },
        machine_config: Some(machine_configuration(config)),
        network_interfaces: config
            .network_interfaces
            .iter()
            .map(NetworkInterface::from_config)
            .collect(),
        cpu_config: config.cpu_template.clone(),
        mmds_config: config
            .mmds
            .as_ref()
            .map(|mmds| MmdsConfigRequest::from_config(&mmds.config)),
        vsock: config.vsock.as_ref().map(|v| Vsock {
            guest_cid: v.guest_cid,
            uds_path: v.uds_path.clone(),
            vsock_id: None,
        }),
        entropy: config.entropy.map(|limiter| EntropyDevice {
            rate_limiter: (limiter != RateLimiterConfig::default()).then_some(limiter),
        }),
        memory_hotplug: config
            .hotplug
            .as_ref()
            .map(MemoryHotplugConfig::from_config),
        pmem: match (&config.zone, config.pmem_size) {
            (Some(zone), Some(size)) => vec![Pmem {
                id: DEFAULT_PMEM_ID.into(),
                path_on_host: zone.path.clone(),
                size_mib: Some(size / MIB),
                root_device: false,
                read_only: false,
                rate_limiter: (config.pmem_rate_limiter != RateLimiterConfig::default())
                    .then_some(config.pmem_rate_limiter),
            }],
            _ => Vec::new(),
        },
        ..FullVmConfiguration::default()
    }
}

#[cfg(test)]
mod tests;
