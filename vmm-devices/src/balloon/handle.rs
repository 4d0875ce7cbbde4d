//! Making a balloon ([`create`]: the device, its statistics timer and the [`BalloonHandle`] the
//! control API keeps) and the device options of a `--balloon` option ([`device_config`]). The
//! runner puts the device behind its virtio-mmio transport like any other virtio device
//! (the VMM's `VirtioMmioDevices::add_balloon`).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guest_mem::GuestMemory;
use virtio_balloon::{
    pages_from_bytes, pages_from_mib, BalloonConfig, BalloonError, BalloonReading, HintingStatus,
    OptionsError,
};

use super::config::BalloonDeviceConfig;
use super::stats_timer::{StatsInterval, StatsTimer, StatsTimerError};
use super::{lock, BalloonDevice};

/// Errors of creating a balloon.
#[derive(Debug, thiserror::Error)]
pub enum BalloonCreateError {
    /// The balloon options are invalid.
    #[error("virtio-balloon: {0}")]
    Device(#[source] BalloonError),
    /// Creating the statistics timer failed.
    #[error(transparent)]
    StatsTimer(#[from] StatsTimerError),
}

/// Errors of controlling a running balloon.
#[derive(Debug, thiserror::Error)]
pub enum BalloonControlError {
    /// The target is larger than the guest's RAM.
    #[error("balloon target of {target_mib} MiB exceeds the guest's {ram_mib} MiB of RAM")]
    TargetAboveRam {
        /// The target asked for.
        target_mib: u64,
        /// The guest's RAM.
        ram_mib: u64,
    },
    /// The device refused the target or could not interrupt the guest.
    #[error(transparent)]
    Device(#[from] BalloonError),
    /// The statistics interval could not be changed.
    #[error(transparent)]
    Stats(#[from] StatsTimerError),
}

/// What the VMM keeps of a balloon to control it (from the API thread).
#[derive(Clone)]
pub struct BalloonHandle {
    device: Arc<Mutex<BalloonDevice>>,
    config: BalloonConfig,
    /// The guest memory the balloon may take: RAM and hot-pluggable memory.
    memory_bytes: u64,
    stats: StatsInterval,
}

impl fmt::Debug for BalloonHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalloonHandle")
            .field("config", &self.config)
            .field("memory_bytes", &self.memory_bytes)
            .finish_non_exhaustive()
    }
}

impl BalloonHandle {
    /// The most the balloon may hold: the guest's RAM and hot-pluggable memory, in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// The device (shared with its transport and the event loop).
    pub fn device(&self) -> &Arc<Mutex<BalloonDevice>> {
        &self.device
    }

    /// The options the balloon was created with.
    pub fn config(&self) -> BalloonConfig {
        self.config
    }

    /// Sets the target in MiB and tells the guest; the target may not exceed guest RAM.
    pub fn set_target_mib(&self, mib: u64) -> Result<(), BalloonControlError> {
        self.update(Some(mib), None)
    }

    /// Changes the target (MiB) and the statistics polling interval (zero: off), those given.
    /// Both are checked before either is applied: a refused request changes nothing.
    pub fn update(
        &self,
        target_mib: Option<u64>,
        stats_interval: Option<Duration>,
    ) -> Result<(), BalloonControlError> {
        let target_pages = target_mib.map(|mib| self.target_pages(mib)).transpose()?;
        if let Some(interval) = stats_interval {
            // Refused (NotEnabled) before anything changes.
            self.stats.set(Some(interval))?;
        }
        if let Some(pages) = target_pages {
            lock(&self.device).balloon_mut().set_target_pages(pages)?;
        }
        Ok(())
    }

    /// A target of `mib` in balloon pages, if it fits in guest RAM.
    fn target_pages(&self, mib: u64) -> Result<u32, BalloonControlError> {
        let ram_mib = self.memory_bytes >> 20;
        if mib > ram_mib {
            return Err(BalloonControlError::TargetAboveRam {
                target_mib: mib,
                ram_mib,
            });
        }
        Ok(pages_from_mib(mib).map_err(BalloonError::from)?)
    }

    /// Target, actual size, counters, the guest's statistics and its violations.
    pub fn info(&self) -> BalloonReading {
        lock(&self.device).balloon().info()
    }

    /// Starts a free page hinting run (`PATCH /balloon/hinting/start`); returns its id.
    pub fn start_hinting(&self, acknowledge_on_stop: bool) -> Result<u32, BalloonControlError> {
        Ok(lock(&self.device)
            .balloon_mut()
            .start_hinting(acknowledge_on_stop)?)
    }

    /// Ends the hinting run (`PATCH /balloon/hinting/stop`).
    pub fn stop_hinting(&self) -> Result<(), BalloonControlError> {
        Ok(lock(&self.device).balloon_mut().stop_hinting()?)
    }

    /// Where hinting is (`GET /balloon/hinting/status`).
    pub fn hinting_status(&self) -> Result<HintingStatus, BalloonControlError> {
        Ok(lock(&self.device).balloon().hinting_status()?)
    }

    /// The statistics polling interval; `None` when polling is off.
    pub fn stats_interval(&self) -> Option<Duration> {
        self.stats.get()
    }

    /// Changes the statistics polling interval (`None` or zero: off). Polling cannot be turned
    /// on when the balloon was created without statistics.
    pub fn set_stats_interval(
        &self,
        interval: Option<Duration>,
    ) -> Result<(), BalloonControlError> {
        Ok(self.stats.set(interval)?)
    }
}

/// The virtio-balloon options of a configured balloon device: the initial target, deflate-on-OOM, free page
/// reporting, statistics (an interval of 0 turns them off), MUST_TELL_HOST and 1024-entry queues.
pub fn device_config(balloon: &BalloonDeviceConfig) -> Result<BalloonConfig, OptionsError> {
    let interval = balloon.stats_polling_interval_s;
    Ok(BalloonConfig {
        target_pages: pages_from_bytes(balloon.size)?,
        deflate_on_oom: balloon.deflate_on_oom,
        free_page_reporting: balloon.free_page_reporting,
        free_page_hinting: balloon.free_page_hinting,
        stats_interval: (interval > 0).then(|| Duration::from_secs(interval.into())),
        ..BalloonConfig::default()
    })
}

/// A balloon that is not on a transport yet.
#[derive(Debug)]
pub struct NewBalloon {
    /// The device, to put behind a virtio-mmio transport (whose queue subscriber processes it).
    pub device: Arc<Mutex<BalloonDevice>>,
    /// The event-loop subscriber that asks the guest for statistics.
    pub stats_timer: StatsTimer,
    /// What the control API keeps.
    pub handle: BalloonHandle,
}

/// Creates a balloon with `config` over `memory`, with its statistics timer and API handle.
pub fn create(
    memory: Arc<GuestMemory>,
    config: BalloonConfig,
) -> Result<NewBalloon, BalloonCreateError> {
    let memory_bytes = memory.regions().iter().map(|r| r.size()).sum();
    let device = BalloonDevice::new(config, memory).map_err(BalloonCreateError::Device)?;
    let device = Arc::new(Mutex::new(device));
    let (stats_timer, stats) = StatsTimer::new(device.clone())?;
    let handle = BalloonHandle {
        device: device.clone(),
        config,
        memory_bytes,
        stats,
    };
    Ok(NewBalloon {
        device,
        stats_timer,
        handle,
    })
}
