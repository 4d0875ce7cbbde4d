//! The control API's view of a running VMM: [`VmmControl`] on a [`Session`], its balloon
//! included (target and actual size in MiB, statistics).

use std::time::Duration;

use guest_mem::FrameSize;
use vmm_api::model::{
    BalloonHintingStatus, BalloonInfo, BalloonStartCmd, BalloonStatistics, BalloonUpdate,
    FullVmConfiguration, MachineConfiguration, MachineInfo, MemoryHotplugSizeUpdate,
    MemoryHotplugStatus, MemoryInfo, PartialDrive, PartialNetworkInterface, PartialPmem,
    SnapshotCreateParams, VmState, DEFAULT_INSTANCE_ID,
};

use crate::build::resources::{check_path_id, full_configuration, machine_configuration};
use crate::config::{GuestConfig, VmConfig};
use crate::vm::run_control::{self, RunState, VmControl};
use vmm_api::vmm_control::HOTPLUG_NOT_CONFIGURED;
use vmm_api::{ControlError, VmmControl};
use vmm_devices::balloon::{BalloonControlError, BalloonHandle, StatsTimerError};
use vmm_devices::block::BlockHandle;
use vmm_devices::mem::MemControlError;

use super::session::{Phase, Session};
use super::StopCause;

/// What a run control error means to an API client.
fn api_error(error: run_control::RunControlError) -> ControlError {
    match error {
        run_control::RunControlError::Stopped => {
            ControlError::InvalidState("the VM has stopped".into())
        }
        run_control::RunControlError::NotPaused => ControlError::InvalidState(
            "the VM is not paused (PATCH /vm {\"state\":\"Paused\"})".into(),
        ),
        run_control::RunControlError::WaitsForMemory { .. } => {
            ControlError::InvalidState(error.to_string())
        }
        run_control::RunControlError::CalledFromVcpu
        | run_control::RunControlError::SaveFailed { .. } => {
            ControlError::Internal(error.to_string())
        }
    }
}

/// `PUT /mmds` (`patch`: `PATCH /mmds`) on `store`.
pub(super) fn update_store(
    store: &std::sync::Mutex<vmm_devices::mmds::Store>,
    data: serde_json::Value,
    patch: bool,
) -> Result<(), ControlError> {
    let mut store = store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let result = if patch {
        store.patch(&data)
    } else {
        store.put(data)
    };
    result.map_err(|e| ControlError::InvalidArgument(e.to_string()))
}

/// Firecracker's answer to turning statistics on or off after the start.
const STATS_STATE_CHANGE: &str = "Statistics cannot be enabled/disabled after activation.";
/// Firecracker's answer to a statistics request when they are off.
const STATS_DISABLED: &str =
    "Received stats query when stats are disabled (stats_polling_interval_s is 0).";

/// 4 KiB balloon pages in a MiB.
const PAGES_PER_MIB: u64 = 256;

/// What a balloon control error means to an API client: a refused value is the client's fault
/// (400), a failed timer or interrupt the VMM's (500).
fn balloon_error(error: BalloonControlError) -> ControlError {
    match error {
        BalloonControlError::TargetAboveRam { .. }
        | BalloonControlError::Stats(StatsTimerError::NotEnabled)
        | BalloonControlError::Device(
            virtio_balloon::BalloonError::Config(_)
            | virtio_balloon::BalloonError::HintingDisabled
            | virtio_balloon::BalloonError::HintingInactive,
        ) => ControlError::InvalidArgument(error.to_string()),
        _ => ControlError::Internal(error.to_string()),
    }
}

impl Session {
    /// The balloon, or the API's "balloon not configured".
    fn configured_balloon(&self) -> Result<&BalloonHandle, ControlError> {
        self.balloon_handle()
            .ok_or(ControlError::BalloonNotConfigured)
    }

    /// The run control of a started VM; before the start, waits for it (briefly).
    fn started_control(&self) -> Result<&VmControl, ControlError> {
        match (self.phase_after_setup(), self.control()) {
            (Phase::Started, Some(control)) => Ok(control),
            (Phase::Setup, _) => Err(ControlError::InvalidState(
                "the VM has not started yet".into(),
            )),
            _ => Err(ControlError::InvalidState("the VM has stopped".into())),
        }
    }
}

impl VmmControl for Session {
    fn confine_api_thread(&self) {
        crate::seccomp::confine_api_thread();
    }

    /// A VM in a zone is its name there.
    fn instance_id(&self) -> String {
        match &self.config().zone {
            Some(zone) => zone.vm.clone(),
            None => DEFAULT_INSTANCE_ID.into(),
        }
    }

    fn machine_info(&self) -> Result<MachineInfo, ControlError> {
        let state = match (self.phase(), self.control().map(|c| c.state())) {
            (Phase::Setup, _) => VmState::NotStarted,
            (Phase::Started, Some(RunState::Running)) => VmState::Running,
            (Phase::Started, Some(RunState::Paused)) => VmState::Paused,
            _ => VmState::Stopped,
        };
        let frame_size = self.memory().pool().frame_size();
        Ok(machine_info(self.config(), frame_size, state))
    }

    fn machine_config(&self) -> Result<MachineConfiguration, ControlError> {
        Ok(machine_configuration(self.config()))
    }

    fn vm_config(&self) -> Result<FullVmConfiguration, ControlError> {
        // The images and rate limiters API clients may have changed since the start.
        let mut now = self.config().clone();
        now.drives = self.drives().iter().map(BlockHandle::config).collect();
        now.network_interfaces = self.network_interfaces_now();
        if let Some(pmem) = self.pmem_handle() {
            now.pmem_rate_limiter = pmem.rate_limiter();
        }
        let mut config = full_configuration(&now);
        // The interval an API client may have changed since the start.
        if let (Some(balloon), Some(handle)) = (&mut config.balloon, self.balloon_handle()) {
            balloon.amount_mib = u64::from(handle.info().target_pages) / PAGES_PER_MIB;
            balloon.stats_polling_interval_s = handle
                .stats_interval()
                .map_or(0, |i| u32::try_from(i.as_secs()).unwrap_or(u32::MAX));
        }
        Ok(config)
    }

    fn memory_info(&self) -> Result<MemoryInfo, ControlError> {
        Ok(MemoryInfo::collect(self.memory(), self.pmem_handle()))
    }

    fn pause(&self) -> Result<(), ControlError> {
        let control = self.started_control()?;
        // A vCPU that waits for a frame is blocked in the kernel, where no kick reaches it on
        // many kernels: it stays there, held, and counts as paused.
        self.memory().hold_waiting_vcpus();
        let paused = control.pause().map_err(api_error);
        if paused.is_err() {
            self.memory().release_held_vcpus();
        }
        paused
    }

    fn resume(&self) -> Result<(), ControlError> {
        let control = self.started_control()?;
        // Not in the middle of a snapshot: it would save vCPU states from before the resume
        // and memory from after it.
        let _not_snapshotting = self.begin_snapshot().ok_or_else(|| {
            ControlError::InvalidState(
                "a snapshot of the VM is being taken; resume it once the snapshot is done".into(),
            )
        })?;
        // The guest is about to change its memory: a snapshot that left it in the zone no
        // longer matches it.
        self.break_seal()
            .map_err(|e| ControlError::Internal(e.to_string()))?;
        let resumed = control.resume().map_err(api_error);
        self.memory().release_held_vcpus();
        resumed
    }

    fn shutdown(&self) -> Result<(), ControlError> {
        self.request_stop(StopCause::Api);
        Ok(())
    }

    fn send_ctrl_alt_del(&self) -> Result<(), ControlError> {
        self.started_control()?;
        // Firecracker answers 204 whatever the guest: its i8042 is always there, read or not.
        // The test guest has none; the press is answered the same, and said to go nowhere.
        let Some(keyboard) = self.keyboard() else {
            log::warn!(
                "SendCtrlAltDel: the built-in test guest has no keyboard controller; nothing \
                 was pressed"
            );
            return Ok(());
        };
        if keyboard.send_ctrl_alt_del() {
            Ok(())
        } else {
            Err(ControlError::InvalidState(
                "the guest's keyboard is disabled or has not read its last keys".into(),
            ))
        }
    }

    fn memory_hotplug(&self) -> Result<MemoryHotplugStatus, ControlError> {
        let handle = self
            .hotplug_handle()
            .ok_or_else(|| ControlError::InvalidArgument(HOTPLUG_NOT_CONFIGURED.into()))?;
        let status = handle.status();
        let mib = |bytes: u64| bytes >> 20;
        Ok(MemoryHotplugStatus {
            total_size_mib: mib(status.config.total_size),
            slot_size_mib: mib(status.config.slot_size),
            block_size_mib: mib(status.config.block_size),
            plugged_size_mib: mib(status.plugged_size),
            requested_size_mib: mib(status.requested_size),
        })
    }

    fn update_memory_hotplug(&self, update: MemoryHotplugSizeUpdate) -> Result<(), ControlError> {
        let handle = self
            .hotplug_handle()
            .ok_or_else(|| ControlError::InvalidArgument(HOTPLUG_NOT_CONFIGURED.into()))?;
        let bytes = update
            .requested_size_mib
            .checked_mul(1 << 20)
            .ok_or_else(|| ControlError::InvalidArgument("requested_size_mib overflows".into()))?;
        handle.set_requested_size(bytes).map_err(|e| match e {
            MemControlError::Size(e) => ControlError::InvalidArgument(e.to_string()),
            e @ MemControlError::Notify(_) => ControlError::Internal(e.to_string()),
        })
    }

    fn balloon(&self) -> Result<BalloonInfo, ControlError> {
        let balloon = self.configured_balloon()?;
        let info = balloon.info();
        let config = balloon.config();
        let interval = balloon.stats_interval().map_or(0, |i| i.as_secs());
        let ram = GuestValues::new(balloon.memory_bytes());
        Ok(BalloonInfo {
            amount_mib: u64::from(info.target_pages) / PAGES_PER_MIB,
            actual_mib: ram.pages(info.actual_pages) / PAGES_PER_MIB,
            deflate_on_oom: config.deflate_on_oom,
            free_page_reporting: config.free_page_reporting,
            free_page_hinting: config.free_page_hinting,
            stats_polling_interval_s: u32::try_from(interval).unwrap_or(u32::MAX),
            needs_reset: info.needs_reset,
            driver_violations: info.violations,
        })
    }

    fn update_balloon(&self, update: BalloonUpdate) -> Result<(), ControlError> {
        let balloon = self.configured_balloon()?;
        let interval = update
            .stats_polling_interval_s
            .map(|s| Duration::from_secs(s.into()));
        // As in Firecracker: the interval may change, statistics not be turned on or off.
        if interval.is_some_and(|i| i.is_zero() != balloon.stats_interval().is_none()) {
            return Err(ControlError::InvalidArgument(STATS_STATE_CHANGE.into()));
        }
        balloon
            .update(update.amount_mib, interval)
            .map_err(balloon_error)
    }

    fn start_balloon_hinting(&self, cmd: BalloonStartCmd) -> Result<(), ControlError> {
        let balloon = self.configured_balloon()?;
        let run = balloon
            .start_hinting(cmd.acknowledge_on_stop)
            .map_err(balloon_error)?;
        log::info!("free page hinting run {run} started");
        Ok(())
    }

    fn stop_balloon_hinting(&self) -> Result<(), ControlError> {
        self.configured_balloon()?
            .stop_hinting()
            .map_err(balloon_error)
    }

    fn balloon_hinting_status(&self) -> Result<BalloonHintingStatus, ControlError> {
        let status = self
            .configured_balloon()?
            .hinting_status()
            .map_err(balloon_error)?;
        Ok(BalloonHintingStatus {
            host_cmd: status.host_cmd,
            guest_cmd: status.guest_cmd,
        })
    }

    fn update_network_interface(
        &self,
        id: &str,
        update: &PartialNetworkInterface,
    ) -> Result<(), ControlError> {
        check_path_id(id, &update.iface_id)?;
        let interface = self
            .network_interfaces()
            .iter()
            .find(|net| net.id == id)
            .ok_or_else(|| {
                ControlError::InvalidArgument(format!("Invalid interface ID - not found: {id}"))
            })?;
        interface.update_rate_limiters(update.rx_rate_limiter, update.tx_rate_limiter);
        Ok(())
    }

    fn update_drive(&self, id: &str, update: &PartialDrive) -> Result<(), ControlError> {
        check_path_id(id, &update.drive_id)?;
        let drive = self
            .drives()
            .iter()
            .find(|drive| drive.id == id)
            .ok_or_else(|| ControlError::InvalidArgument(format!("Invalid block ID: {id}")))?;
        drive
            .update(update.path_on_host.as_deref(), update.rate_limiter)
            .map_err(|e| ControlError::InvalidArgument(e.to_string()))
    }

    fn update_pmem(&self, id: &str, update: &PartialPmem) -> Result<(), ControlError> {
        check_path_id(id, &update.id)?;
        // The API front checks the id against the one it was configured with.
        let pmem = self
            .pmem_handle()
            .ok_or_else(|| ControlError::InvalidArgument(format!("Invalid pmem ID: {id}")))?;
        if let Some(limiter) = update.rate_limiter {
            pmem.update_rate_limiter(limiter);
        }
        Ok(())
    }

    fn update_mmds(&self, data: serde_json::Value, patch: bool) -> Result<(), ControlError> {
        let mmds = self.config().mmds.as_ref().ok_or_else(|| {
            ControlError::InvalidArgument(vmm_api::vmm_control::MMDS_NOT_CONFIGURED.into())
        })?;
        update_store(&mmds.store, data, patch)
    }

    fn mmds(&self) -> Result<serde_json::Value, ControlError> {
        let mmds = self.config().mmds.as_ref().ok_or_else(|| {
            ControlError::InvalidArgument(vmm_api::vmm_control::MMDS_NOT_CONFIGURED.into())
        })?;
        let value = mmds
            .store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get();
        Ok(value)
    }

    fn create_snapshot(&self, params: &SnapshotCreateParams) -> Result<(), ControlError> {
        self.started_control()?;
        Session::create_snapshot(self, params).map_err(ControlError::from)
    }

    fn balloon_statistics(&self) -> Result<BalloonStatistics, ControlError> {
        let balloon = self.configured_balloon()?;
        if balloon.stats_interval().is_none() {
            return Err(ControlError::InvalidArgument(STATS_DISABLED.into()));
        }
        let info = balloon.info();
        let ram = GuestValues::new(balloon.memory_bytes());
        let target = u64::from(info.target_pages);
        let actual = ram.pages(info.actual_pages);
        let stats = info.stats;
        // Fields are evaluated in order: `clamped` last, after every checked value.
        Ok(BalloonStatistics {
            target_pages: target,
            actual_pages: actual,
            target_mib: target / PAGES_PER_MIB,
            actual_mib: actual / PAGES_PER_MIB,
            swap_in: stats.swap_in,
            swap_out: stats.swap_out,
            major_faults: stats.major_faults,
            minor_faults: stats.minor_faults,
            free_memory: ram.bytes(stats.free_memory),
            total_memory: ram.bytes(stats.total_memory),
            available_memory: ram.bytes(stats.available_memory),
            disk_caches: ram.bytes(stats.disk_caches),
            hugetlb_allocations: stats.hugetlb_allocations,
            hugetlb_failures: stats.hugetlb_failures,
            clamped: ram.clamped.get(),
        })
    }
}

/// Sizes a guest wrote (the balloon's `actual`, its memory statistics), checked against guest
/// memory (RAM and hot-pluggable memory, all a guest may have): a larger one is shown as that
/// size and flagged, never passed on unchecked.
struct GuestValues {
    memory_bytes: u64,
    clamped: std::cell::Cell<bool>,
}

impl GuestValues {
    fn new(memory_bytes: u64) -> Self {
        GuestValues {
            memory_bytes,
            clamped: std::cell::Cell::new(false),
        }
    }

    fn bytes(&self, value: Option<u64>) -> Option<u64> {
        value.map(|bytes| {
            self.clamped
                .set(self.clamped.get() || bytes > self.memory_bytes);
            bytes.min(self.memory_bytes)
        })
    }

    fn pages(&self, pages: u32) -> u64 {
        self.bytes(Some(u64::from(pages) << 12)).unwrap_or(0) >> 12
    }
}

/// The info of a VM configured by `config`, with frames of `frame_size`, now in `state`.
pub(crate) fn machine_info(
    config: &VmConfig,
    frame_size: FrameSize,
    state: VmState,
) -> MachineInfo {
    MachineInfo {
        vmm_version: env!("CARGO_PKG_VERSION").to_owned(),
        state,
        vcpu_count: config.vcpus,
        mem_size_mib: config.memory_size >> 20,
        backing: match &config.zone {
            Some(zone) => format!("zone:{}", zone.path.display()),
            None => config.backing.to_string(),
        },
        zone_vm: config.zone.as_ref().map(|zone| zone.vm.clone()),
        frame_size_kib: frame_size.bytes() >> 10,
        populate: config.populate.into(),
        guest: match config.guest {
            GuestConfig::TestGuest(_) => "test-guest",
            GuestConfig::Linux(_) | GuestConfig::RestoredLinux => "linux",
        }
        .to_owned(),
        balloon: config.balloon.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use guest_mem::Populate;

    use super::*;
    use crate::build::devices::create_devices;
    use crate::build::memory::{create_memory, create_pool, Frames};
    use crate::config::VmConfig;

    /// A session of a 16 MiB VM with 2 vCPUs and the balloon `balloon` (if any).
    fn session_with(balloon: Option<&str>) -> Session {
        let mut config = VmConfig::test_guest(16 << 20, 2);
        if let Some(balloon) = balloon {
            config = config.with_balloon(balloon);
        }
        session_of(config)
    }

    fn session_of(config: VmConfig) -> Session {
        let memory = Arc::new(
            create_memory(
                &config,
                Frames::Pool(create_pool(&config).unwrap()),
                &Default::default(),
                true,
            )
            .unwrap(),
        );
        let devices = create_devices(&config, &memory).unwrap();
        Session::new(config, memory, &devices)
    }

    fn session() -> Session {
        session_with(None)
    }

    #[test]
    fn before_the_start_the_api_sees_the_machine_and_pauses_wait_for_the_start() {
        let session = Arc::new(session());
        let info = session.machine_info().unwrap();
        assert_eq!((info.state, info.vcpu_count), (VmState::NotStarted, 2));
        let memory = session.memory_info().unwrap();
        assert_eq!((memory.guest.chunks, memory.guest.populated_chunks), (8, 0));
        assert_eq!(
            memory.pool.reservation_slots, 1,
            "16 MiB is one tree: one reservation slot"
        );
        let waiting = session.clone();
        let pause = std::thread::spawn(move || waiting.pause());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!pause.is_finished(), "a pause waits for the start");
        // The run ends without the guest ever starting.
        session.finish();
        let stopped = ControlError::InvalidState("the VM has stopped".into());
        assert_eq!(pause.join().unwrap(), Err(stopped.clone()));
        assert_eq!(session.resume(), Err(stopped));
        assert_eq!(session.machine_info().unwrap().state, VmState::Stopped);
        assert_eq!(session.shutdown(), Ok(()));
    }

    #[test]
    fn the_balloon_answers_in_mib_and_refuses_bad_values_without_changing_anything() {
        let plain = session();
        assert_eq!(plain.balloon(), Err(ControlError::BalloonNotConfigured));
        assert_eq!(
            plain.update_balloon(BalloonUpdate {
                amount_mib: Some(1),
                ..BalloonUpdate::default()
            }),
            Err(ControlError::BalloonNotConfigured)
        );

        let session = session_with(Some("size=4M,free_page_reporting=on"));
        let info = session.balloon().unwrap();
        assert_eq!(
            info,
            BalloonInfo {
                amount_mib: 4,
                actual_mib: 0,
                deflate_on_oom: false,
                free_page_reporting: true,
                free_page_hinting: false,
                stats_polling_interval_s: 0,
                needs_reset: false,
                driver_violations: Default::default(),
            }
        );
        let target = |mib| BalloonUpdate {
            amount_mib: Some(mib),
            stats_polling_interval_s: None,
        };
        session.update_balloon(target(12)).unwrap();
        assert_eq!(session.balloon().unwrap().amount_mib, 12);
        let above = session.update_balloon(target(17)).unwrap_err();
        assert_eq!(
            above,
            ControlError::InvalidArgument(
                "balloon target of 17 MiB exceeds the guest's 16 MiB of RAM".into()
            )
        );
        // Statistics were off at the start: turning them on is refused, with the target.
        let both = BalloonUpdate {
            amount_mib: Some(2),
            stats_polling_interval_s: Some(1),
        };
        let state_change = ControlError::InvalidArgument(STATS_STATE_CHANGE.into());
        assert_eq!(session.update_balloon(both), Err(state_change.clone()));
        assert_eq!(session.balloon().unwrap().amount_mib, 12, "nothing changed");
        // As in Firecracker: no statistics when they are off.
        assert_eq!(
            session.balloon_statistics(),
            Err(ControlError::InvalidArgument(STATS_DISABLED.into()))
        );

        let polled = session_with(Some("stats_polling_interval_s=3"));
        assert_eq!(polled.balloon().unwrap().stats_polling_interval_s, 3);
        let stats = polled.balloon_statistics().unwrap();
        assert_eq!((stats.target_pages, stats.target_mib), (0, 0));
        assert_eq!((stats.actual_pages, stats.free_memory), (0, None));
        let interval = |s| BalloonUpdate {
            amount_mib: None,
            stats_polling_interval_s: Some(s),
        };
        assert_eq!(polled.update_balloon(interval(0)), Err(state_change));
        polled.update_balloon(interval(5)).unwrap();
        assert_eq!(polled.balloon().unwrap().stats_polling_interval_s, 5);
    }

    #[test]
    fn the_balloon_may_take_plugged_memory_too() {
        use crate::config::{HotplugConfig, DEFAULT_BLOCK_SIZE, DEFAULT_SLOT_SIZE};
        use vmm_devices::virtio::VirtioDevice;
        let mut config = VmConfig::test_guest(16 << 20, 2).with_balloon("size=0");
        config.hotplug = Some(HotplugConfig {
            total_size: 32 << 20,
            block_size: DEFAULT_BLOCK_SIZE,
            slot_size: DEFAULT_SLOT_SIZE,
        });
        let session = session_of(config);
        let target = |mib| BalloonUpdate {
            amount_mib: Some(mib),
            stats_polling_interval_s: None,
        };
        session.update_balloon(target(40)).unwrap();
        assert!(session.update_balloon(target(49)).is_err());
        // A guest that plugged memory inflates beyond its 16 MiB of RAM: shown as it is.
        let balloon = session.balloon_handle().unwrap();
        let pages = 24u32 << 8;
        balloon
            .device()
            .lock()
            .unwrap()
            .write_config(4, &pages.to_le_bytes());
        assert_eq!(session.balloon().unwrap().actual_mib, 24);
    }

    #[test]
    fn sizes_the_guest_wrote_beyond_its_ram_are_clamped_and_flagged() {
        use vmm_devices::virtio::VirtioDevice;
        let session = session_with(Some("size=0,stats_polling_interval_s=1"));
        let balloon = session.balloon_handle().unwrap();
        // A hostile driver claims a balloon of 2^32 - 1 pages in a 16 MiB guest.
        balloon
            .device()
            .lock()
            .unwrap()
            .write_config(4, &u32::MAX.to_le_bytes());
        assert_eq!(session.balloon().unwrap().actual_mib, 16);
        let stats = session.balloon_statistics().unwrap();
        assert_eq!((stats.actual_pages, stats.clamped), (4096, true));
        let honest = GuestValues::new(16 << 20);
        assert_eq!(honest.bytes(Some(1 << 20)), Some(1 << 20));
        assert!(!honest.clamped.get());
        assert_eq!(honest.bytes(Some(u64::MAX)), Some(16 << 20));
        assert!(honest.clamped.get());
    }

    #[test]
    fn machine_info_follows_the_config() {
        let config = VmConfig {
            populate: Populate::Eager,
            ..VmConfig::test_guest(1 << 30, 3)
        };
        let info = machine_info(&config, FrameSize::Huge, VmState::Paused);
        assert_eq!((info.vcpu_count, info.mem_size_mib), (3, 1024));
        assert_eq!((info.backing.as_str(), info.frame_size_kib), ("anon", 2048));
        assert_eq!((info.guest.as_str(), info.balloon), ("test-guest", false));
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["state"], "Paused");
        assert_eq!(json["populate"], "eager");
        let mapped = VmConfig {
            populate: Populate::Mapped,
            ..config
        };
        let info = machine_info(&mapped, FrameSize::Huge, VmState::Paused);
        assert_eq!(serde_json::to_value(&info).unwrap()["populate"], "mapped");
    }
}
