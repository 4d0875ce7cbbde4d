//! [`VmmControl`]: what the API server asks of the VMM. The VMM core implements it; the server
//! only parses requests, calls it and serialises the answers.

use super::model::{
    Balloon, BalloonHintingStatus, BalloonInfo, BalloonStartCmd, BalloonStatistics, BalloonUpdate,
    BootSource, Drive, EntropyDevice, FullVmConfiguration, InstanceInfo, Logger,
    MachineConfiguration, MachineConfigurationUpdate, MachineInfo, MemoryHotplugConfig,
    MemoryHotplugSizeUpdate, MemoryHotplugStatus, MemoryInfo, Metrics, MmdsConfigRequest,
    NetworkInterface, PartialDrive, PartialNetworkInterface, PartialPmem, Pmem, SerialConfig,
    SnapshotCreateParams, SnapshotLoadParams, Vsock, DEFAULT_INSTANCE_ID,
};

/// Firecracker's answer to a pre-boot request after the VM started.
pub const NOT_AFTER_START: &str =
    "The requested operation is not supported after starting the microVM.";
/// Firecracker's answer to a request that needs a running VM before it started.
pub const NOT_BEFORE_START: &str =
    "The requested operation is not supported before starting the microVM.";

/// The answer to a hot-pluggable memory request of a VM that has none.
pub const HOTPLUG_NOT_CONFIGURED: &str =
    "memory hotplug not configured (PUT /hotplug/memory before the start)";

/// The answer to an MMDS request of a VM that has none.
pub const MMDS_NOT_CONFIGURED: &str =
    "MMDS is not configured for this VM (PUT /mmds/config before the start)";

/// A pre-boot configuration request (Firecracker's pre-boot `PUT`s and `PATCH`es).
#[derive(Clone, Debug, PartialEq)]
pub enum PreBoot {
    /// `PUT /machine-config`.
    Machine(MachineConfiguration),
    /// `PATCH /machine-config`.
    PatchMachine(MachineConfigurationUpdate),
    /// `PUT /boot-source`.
    BootSource(BootSource),
    /// `PUT /drives/{id}`: the id in the path and the drive.
    Drive(String, Drive),
    /// `PUT /pmem/{id}`: the id in the path and the device.
    Pmem(String, Pmem),
    /// `PUT /entropy`.
    Entropy(EntropyDevice),
    /// `PUT /network-interfaces/{iface_id}`: the id in the path and the interface.
    NetworkInterface(String, NetworkInterface),
    /// `PUT /vsock`.
    Vsock(Vsock),
    /// `PUT /mmds/config`.
    MmdsConfig(MmdsConfigRequest),
    /// `PUT /cpu-config`.
    CpuConfig(crate::model::CustomCpuTemplate),
    /// `PUT /serial`.
    Serial(SerialConfig),
    /// `PUT /balloon`.
    Balloon(Balloon),
    /// `PUT /hotplug/memory`.
    MemoryHotplug(MemoryHotplugConfig),
    /// `PUT /logger`.
    Logger(Logger),
    /// `PUT /metrics`.
    Metrics(Metrics),
}

/// Why the VMM refused or failed a control request.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ControlError {
    /// The VM has no balloon device (answered with 400).
    #[error("balloon not configured")]
    BalloonNotConfigured,
    /// The VM has no keyboard controller for Ctrl-Alt-Del (answered with 400).
    #[error("the VM has no keyboard controller (only Linux guests have an i8042)")]
    NoKeyboard,
    /// The request does not fit the VM's state, e.g. resuming a stopped VM (answered with 400).
    #[error("{0}")]
    InvalidState(String),
    /// A value in the request is out of range, e.g. a balloon larger than RAM (answered with 400).
    #[error("{0}")]
    InvalidArgument(String),
    /// The VMM failed to carry out a valid request (answered with 500).
    #[error("internal error: {0}")]
    Internal(String),
}

impl ControlError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> u16 {
        match self {
            ControlError::Internal(_) => 500,
            _ => 400,
        }
    }
}

/// What the front end lets the API change of its logger (`PUT /logger`): the VMM library does
/// not install the logger, the program does.
pub trait LogControl: Send + Sync {
    /// Sends the log to the file or pipe of `logger`, at its level, formatted as it asks;
    /// returns why not when the file cannot be opened.
    fn configure(&self, logger: &Logger) -> Result<(), String>;
}

/// The VMM's side of the control API. Calls come from the API server's thread.
///
/// The balloon methods default to [`ControlError::BalloonNotConfigured`], which is right for a
/// VM without a balloon device.
pub trait VmmControl: Send + Sync {
    /// Confines the API server's thread before its first answer: where the VMM installs its
    /// seccomp filters (the request threads, started from that thread, inherit them). A
    /// failure is the VMM's to log; the server serves on.
    fn confine_api_thread(&self) {}

    /// The machine and its run state (`GET /machine`).
    fn machine_info(&self) -> Result<MachineInfo, ControlError>;

    /// The instance id, as Firecracker's `GET /` reports it.
    fn instance_id(&self) -> String {
        DEFAULT_INSTANCE_ID.into()
    }

    /// Firecracker's instance info (`GET /`).
    fn instance_info(&self) -> Result<InstanceInfo, ControlError> {
        let state = self.machine_info()?.state;
        Ok(InstanceInfo::new(&self.instance_id(), state))
    }

    /// Firecracker's machine configuration (`GET /machine-config`); by default what
    /// [`Self::machine_info`] tells of it.
    fn machine_config(&self) -> Result<MachineConfiguration, ControlError> {
        let info = self.machine_info()?;
        Ok(MachineConfiguration {
            vcpu_count: info.vcpu_count as u64,
            mem_size_mib: info.mem_size_mib,
            ..MachineConfiguration::default()
        })
    }

    /// Firecracker's full configuration (`GET /vm/config`); by default the machine alone.
    fn vm_config(&self) -> Result<FullVmConfiguration, ControlError> {
        Ok(FullVmConfiguration {
            machine_config: Some(self.machine_config()?),
            ..FullVmConfiguration::default()
        })
    }

    /// Configures the VM before it starts; a VMM whose VM runs refuses.
    fn configure(&self, request: PreBoot) -> Result<(), ControlError> {
        let _ = request;
        Err(ControlError::InvalidState(NOT_AFTER_START.into()))
    }

    /// Boots the configured VM (`PUT /actions` InstanceStart); a VMM whose VM runs refuses.
    fn start_instance(&self) -> Result<(), ControlError> {
        Err(ControlError::InvalidState(NOT_AFTER_START.into()))
    }

    /// Writes the metrics now (`PUT /actions` FlushMetrics); without `PUT /metrics` there is
    /// nowhere to write and nothing happens (as in Firecracker).
    fn flush_metrics(&self) -> Result<(), ControlError> {
        Ok(())
    }

    /// Guest memory, per-vCPU and pool counters (`GET /memory`).
    fn memory_info(&self) -> Result<MemoryInfo, ControlError>;

    /// Pauses all vCPUs and returns once they are out of the guest (`PATCH /vm` Paused).
    fn pause(&self) -> Result<(), ControlError>;

    /// Lets paused vCPUs run again (`PATCH /vm` Resumed).
    fn resume(&self) -> Result<(), ControlError>;

    /// Asks the VM to stop; returns without waiting (`PUT /actions` Shutdown).
    fn shutdown(&self) -> Result<(), ControlError>;

    /// Presses Ctrl-Alt-Del on the guest's keyboard (`PUT /actions` SendCtrlAltDel); a VM
    /// without one refuses.
    fn send_ctrl_alt_del(&self) -> Result<(), ControlError> {
        Err(ControlError::NoKeyboard)
    }

    /// The balloon's configuration and size (`GET /balloon`).
    fn balloon(&self) -> Result<BalloonInfo, ControlError> {
        Err(ControlError::BalloonNotConfigured)
    }

    /// Changes the balloon's target or statistics interval (`PUT`/`PATCH /balloon`,
    /// `PATCH /balloon/statistics`). At least one field is set.
    fn update_balloon(&self, update: BalloonUpdate) -> Result<(), ControlError> {
        let _ = update;
        Err(ControlError::BalloonNotConfigured)
    }

    /// Starts a free page hinting run (`PATCH /balloon/hinting/start`).
    fn start_balloon_hinting(&self, cmd: BalloonStartCmd) -> Result<(), ControlError> {
        let _ = cmd;
        Err(ControlError::BalloonNotConfigured)
    }

    /// Ends the free page hinting run (`PATCH /balloon/hinting/stop`).
    fn stop_balloon_hinting(&self) -> Result<(), ControlError> {
        Err(ControlError::BalloonNotConfigured)
    }

    /// Where free page hinting is (`GET /balloon/hinting/status`).
    fn balloon_hinting_status(&self) -> Result<BalloonHintingStatus, ControlError> {
        Err(ControlError::BalloonNotConfigured)
    }

    /// New rate limiters for a running VM's interface (`PATCH /network-interfaces/{iface_id}`);
    /// `id` is the one in the path.
    fn update_network_interface(
        &self,
        id: &str,
        update: &PartialNetworkInterface,
    ) -> Result<(), ControlError> {
        let _ = (id, update);
        Err(ControlError::InvalidState(NOT_BEFORE_START.into()))
    }

    /// A new image and/or rate limiter for a running VM's drive (`PATCH /drives/{drive_id}`);
    /// `id` is the one in the path.
    fn update_drive(&self, id: &str, update: &PartialDrive) -> Result<(), ControlError> {
        let _ = (id, update);
        Err(ControlError::InvalidState(NOT_BEFORE_START.into()))
    }

    /// A new rate limiter for a running VM's virtio-pmem device (`PATCH /pmem/{id}`); `id` is
    /// the one in the path.
    fn update_pmem(&self, id: &str, update: &PartialPmem) -> Result<(), ControlError> {
        let _ = (id, update);
        Err(ControlError::InvalidState(NOT_BEFORE_START.into()))
    }

    /// Replaces the MMDS document (`PUT /mmds`), or merges a patch into it (`PATCH /mmds`).
    fn update_mmds(&self, data: serde_json::Value, patch: bool) -> Result<(), ControlError> {
        let _ = (data, patch);
        Err(ControlError::InvalidArgument(MMDS_NOT_CONFIGURED.into()))
    }

    /// The MMDS document (`GET /mmds`).
    fn mmds(&self) -> Result<serde_json::Value, ControlError> {
        Err(ControlError::InvalidArgument(MMDS_NOT_CONFIGURED.into()))
    }

    /// The hot-pluggable memory's sizes (`GET /hotplug/memory`).
    fn memory_hotplug(&self) -> Result<MemoryHotplugStatus, ControlError> {
        Err(ControlError::InvalidArgument(HOTPLUG_NOT_CONFIGURED.into()))
    }

    /// A new requested size for the running VM's hot-pluggable memory
    /// (`PATCH /hotplug/memory`).
    fn update_memory_hotplug(&self, update: MemoryHotplugSizeUpdate) -> Result<(), ControlError> {
        let _ = update;
        Err(ControlError::InvalidState(NOT_BEFORE_START.into()))
    }

    /// The guest's memory statistics from the balloon (`GET /balloon/statistics`).
    fn balloon_statistics(&self) -> Result<BalloonStatistics, ControlError> {
        Err(ControlError::BalloonNotConfigured)
    }

    /// Snapshots the paused VM (`PUT /snapshot/create`).
    fn create_snapshot(&self, params: &SnapshotCreateParams) -> Result<(), ControlError> {
        let _ = params;
        Err(ControlError::InvalidState(
            "this VMM takes no snapshots".into(),
        ))
    }

    /// Loads a snapshot into a VMM that has no VM yet (`PUT /snapshot/load`).
    fn load_snapshot(&self, params: &SnapshotLoadParams) -> Result<(), ControlError> {
        let _ = params;
        Err(ControlError::InvalidState(
            "a snapshot is loaded by a VMM without a VM (started as `vmm --api-sock PATH`)".into(),
        ))
    }
}
