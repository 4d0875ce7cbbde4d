//! The balloon device: what it offers, its configuration space, activation with the driver's
//! queues, and what the VMM asks of it (targets, statistics requests, information).

#[cfg(test)]
mod fuzz_tests;
mod process;
mod state;
#[cfg(test)]
mod tests;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use log::{debug, error, warn};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddressSpace;

use crate::backend::{BalloonBackend, GuestNotifier};
use crate::config::{pages_from_mib, BalloonConfig, ConfigSpace, OptionsError};
use crate::queues::{QueueLayout, QueueRole};
use crate::spec::{
    FREE_PAGE_HINT_DONE, FREE_PAGE_HINT_STOP, VIRTIO_BALLOON_F_FREE_PAGE_HINT, VIRTIO_ID_BALLOON,
};
use crate::stats::GuestStats;
use crate::violations::{Violation, Violations};
use process::Handler;
pub use state::{ActiveState, BalloonState, Reactivation};

/// Errors of the balloon device.
#[derive(Debug, Error)]
pub enum BalloonError {
    /// The options or a target are invalid.
    #[error(transparent)]
    Config(#[from] OptionsError),
    /// `activate` was called on an active device.
    #[error("the balloon is active already; reset it first")]
    AlreadyActive,
    /// The driver acknowledged features the device did not offer.
    #[error("the driver acknowledged features {0:#x} that the balloon did not offer")]
    UnofferedFeatures(u64),
    /// A queue was handed over that does not exist with the negotiated features.
    #[error("balloon queue {0} does not exist with the negotiated features")]
    UnexpectedQueue(u16),
    /// A queue was handed over twice.
    #[error("balloon queue {0} was handed over twice")]
    DuplicateQueue(u16),
    /// A queue that the negotiated features require was not handed over.
    #[error("balloon queue {index} ({role:?}) was not set up by the driver")]
    MissingQueue {
        /// The queue index.
        index: u16,
        /// What it is for.
        role: QueueRole,
    },
    /// A queue is not ready or its rings are not in guest memory.
    #[error("balloon queue {0} is not ready or its rings lie outside guest memory")]
    InvalidQueue(u16),
    /// A queue's rings are broken (e.g. the driver moved the available index too far). The
    /// device ignores the guest until it is reset.
    #[error("balloon queue {index} is broken, the device needs a reset: {source}")]
    Queue {
        /// The queue index.
        index: u16,
        /// What virtio-queue reported.
        #[source]
        source: virtio_queue::Error,
    },
    /// The driver published a chain whose available ring entry cannot be read. The device
    /// ignores the guest until it is reset.
    #[error("balloon queue {0} is broken, the device needs a reset: unreadable available ring")]
    UnreadableRing(u16),
    /// Raising an interrupt failed.
    #[error("cannot notify the guest: {0}")]
    Notify(#[source] io::Error),
    /// A saved state cannot be restored.
    #[error("cannot restore the balloon: {0}")]
    BadState(String),
    /// Free page hinting was not offered (`free_page_hinting` off).
    #[error("free page hinting was not enabled when the balloon was configured")]
    HintingDisabled,
    /// No driver drives the device (or it waits for a reset), or it took no free page hinting.
    #[error("the balloon's driver is not running with free page hinting")]
    HintingInactive,
}

/// What the device did, as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BalloonCounters {
    /// Buffers of page frame numbers the guest gave on the inflate queue.
    pub inflate_buffers: u64,
    /// Buffers of page frame numbers the guest gave on the deflate queue.
    pub deflate_buffers: u64,
    /// Buffers of free ranges the guest gave on the reporting queue.
    pub report_buffers: u64,
    /// 4 KiB pages the guest has given away and not taken back.
    pub inflated_pages: u64,
    /// 4 KiB pages taken back by deflation.
    pub deflated_pages: u64,
    /// Frames that inflation returned to the pool.
    pub inflate_freed_frames: u64,
    /// Free ranges the guest reported (after merging adjacent ones).
    pub reported_ranges: u64,
    /// Bytes the guest reported free.
    pub reported_bytes: u64,
    /// Frames that free page reporting returned to the pool.
    pub report_freed_frames: u64,
    /// Buffers the guest gave on the free page hinting queue (command ids and hints).
    #[serde(default)]
    pub hint_buffers: u64,
    /// Bytes the guest hinted free in the host's current run.
    #[serde(default)]
    pub hinted_bytes: u64,
    /// Frames that free page hinting returned to the pool.
    #[serde(default)]
    pub hint_freed_frames: u64,
    /// Statistics buffers received.
    pub stats_updates: u64,
    /// Backend operations that failed on the host side.
    pub backend_errors: u64,
}

/// A snapshot of the device for the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BalloonReading {
    /// The target in 4 KiB pages (`num_pages`).
    pub target_pages: u32,
    /// The balloon size the driver last reported, in 4 KiB pages (`actual`).
    pub actual_pages: u32,
    /// Whether a driver is driving the device.
    pub active: bool,
    /// Whether the device stopped after broken queues and waits for a reset.
    pub needs_reset: bool,
    /// The features the driver acknowledged (0 while inactive).
    pub acked_features: u64,
    /// What the device did.
    pub counters: BalloonCounters,
    /// The guest's latest statistics.
    pub stats: GuestStats,
    /// Invalid driver input seen.
    pub violations: Violations,
}

/// Where free page hinting is, as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HintingStatus {
    /// The host's command: the current run's id, or [`FREE_PAGE_HINT_STOP`] (none yet) or
    /// [`FREE_PAGE_HINT_DONE`] (the run is over).
    pub host_cmd: u32,
    /// The guest's last command: the run it hints for, or [`FREE_PAGE_HINT_STOP`] once it
    /// is through; none before its first.
    pub guest_cmd: Option<u32>,
}

/// The host's side of free page hinting.
#[derive(Debug, Clone, Copy, Default)]
struct HintRuns {
    /// The id of the last run started.
    last_id: u32,
    /// End a run (tell the guest [`FREE_PAGE_HINT_DONE`]) as soon as the guest is through.
    acknowledge_on_stop: bool,
}

/// Bookkeeping the queue handlers update.
#[derive(Debug, Default)]
struct Record {
    counters: BalloonCounters,
    violations: Violations,
    stats: GuestStats,
    /// The guest's last free page hinting command.
    guest_hint_cmd: Option<u32>,
}

/// State while a driver drives the device.
struct Active<M> {
    memory: M,
    acked_features: u64,
    layout: QueueLayout,
    queues: [Option<Queue>; QueueRole::COUNT],
    notifier: Arc<dyn GuestNotifier>,
    /// The head of the statistics buffer the device holds until it wants new statistics.
    held_stats: Option<u16>,
    needs_reset: bool,
}

/// A virtio-balloon device over memory backend `B`, with queues in guest memory `M`.
pub struct VirtioBalloon<M: GuestAddressSpace, B: BalloonBackend> {
    config: BalloonConfig,
    queue_max_sizes: Vec<u16>,
    backend: B,
    space: ConfigSpace,
    active: Option<Active<M>>,
    record: Record,
    hint_runs: HintRuns,
}

impl<M: GuestAddressSpace, B: BalloonBackend> std::fmt::Debug for VirtioBalloon<M, B> {
    /// The options, the configuration space, whether a driver drives it and with which
    /// features, and what it has counted.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioBalloon")
            .field("config", &self.config)
            .field("space", &self.space)
            .field(
                "acked_features",
                &self.active.as_ref().map(|a| a.acked_features),
            )
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl<M: GuestAddressSpace, B: BalloonBackend> VirtioBalloon<M, B> {
    /// Creates a device with `config`'s options over `backend`.
    pub fn new(config: BalloonConfig, backend: B) -> Result<Self, BalloonError> {
        config.validate()?;
        let queues = QueueLayout::new(config.features()).len();
        Ok(Self {
            config,
            queue_max_sizes: vec![config.queue_size; queues],
            backend,
            space: ConfigSpace {
                num_pages: config.target_pages,
                actual: 0,
                free_page_hint_cmd_id: FREE_PAGE_HINT_STOP,
            },
            active: None,
            record: Record::default(),
            hint_runs: HintRuns::default(),
        })
    }

    /// The virtio device ID.
    pub fn device_type(&self) -> u32 {
        VIRTIO_ID_BALLOON
    }

    /// The features offered, VIRTIO_F_VERSION_1 included.
    pub fn device_features(&self) -> u64 {
        self.config.features()
    }

    /// The maximum size of each queue; one entry per queue the offered features can bring.
    pub fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_max_sizes
    }

    /// The memory backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// How often the VMM should call [`VirtioBalloon::request_stats`]; `None` without statistics.
    pub fn stats_interval(&self) -> Option<Duration> {
        self.config.stats_interval
    }

    /// Reads the configuration space.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.space.read(offset, data);
    }

    /// Writes the configuration space (the driver reporting `actual`).
    pub fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.space.write(offset, data);
    }

    /// The target in 4 KiB pages.
    pub fn target_pages(&self) -> u32 {
        self.space.num_pages
    }

    /// The balloon size the driver reported, in 4 KiB pages.
    pub fn actual_pages(&self) -> u32 {
        self.space.actual
    }

    /// Whether a driver is driving the device.
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Sets the target and tells an active driver.
    pub fn set_target_pages(&mut self, pages: u32) -> Result<(), BalloonError> {
        self.space.num_pages = pages;
        match &self.active {
            Some(active) if !active.needs_reset => active
                .notifier
                .config_changed()
                .map_err(BalloonError::Notify),
            _ => Ok(()),
        }
    }

    /// Sets the target in MiB (the API's unit).
    pub fn set_target_mib(&mut self, mib: u64) -> Result<(), BalloonError> {
        self.set_target_pages(pages_from_mib(mib)?)
    }

    /// Starts a free page hinting run (Firecracker's `PATCH /balloon/hinting/start`): the
    /// guest is told a new run id and hints its free pages, which go back to the pool. With
    /// `acknowledge_on_stop` the run ends by itself once the guest is through; otherwise
    /// [`Self::stop_hinting`] ends it (until then the guest keeps the hinted pages out of use).
    /// Returns the run's id.
    pub fn start_hinting(&mut self, acknowledge_on_stop: bool) -> Result<u32, BalloonError> {
        self.check_hinting()?;
        // 0 and 1 are STOP and DONE.
        let id = self
            .hint_runs
            .last_id
            .wrapping_add(1)
            .max(FREE_PAGE_HINT_DONE + 1);
        self.hint_runs = HintRuns {
            last_id: id,
            acknowledge_on_stop,
        };
        self.set_hint_cmd(id)?;
        Ok(id)
    }

    /// Ends the hinting run (`PATCH /balloon/hinting/stop`): the guest may use the pages it
    /// hinted again.
    pub fn stop_hinting(&mut self) -> Result<(), BalloonError> {
        self.check_hinting()?;
        self.set_hint_cmd(FREE_PAGE_HINT_DONE)
    }

    /// Where hinting is (`GET /balloon/hinting/status`).
    pub fn hinting_status(&self) -> Result<HintingStatus, BalloonError> {
        if !self.config.free_page_hinting {
            return Err(BalloonError::HintingDisabled);
        }
        Ok(HintingStatus {
            host_cmd: self.space.free_page_hint_cmd_id,
            guest_cmd: self.record.guest_hint_cmd,
        })
    }

    /// Whether a hinting command can go to the guest: offered, and a driver took it.
    fn check_hinting(&self) -> Result<(), BalloonError> {
        if !self.config.free_page_hinting {
            return Err(BalloonError::HintingDisabled);
        }
        match &self.active {
            Some(active)
                if !active.needs_reset
                    && active.acked_features & (1 << VIRTIO_BALLOON_F_FREE_PAGE_HINT) != 0 =>
            {
                Ok(())
            }
            _ => Err(BalloonError::HintingInactive),
        }
    }

    /// Sets the host's hinting command and tells the driver.
    fn set_hint_cmd(&mut self, cmd: u32) -> Result<(), BalloonError> {
        self.space.free_page_hint_cmd_id = cmd;
        match &self.active {
            Some(active) => active
                .notifier
                .config_changed()
                .map_err(BalloonError::Notify),
            None => Ok(()),
        }
    }

    /// A snapshot for the API.
    pub fn info(&self) -> BalloonReading {
        BalloonReading {
            target_pages: self.space.num_pages,
            actual_pages: self.space.actual,
            active: self.active.is_some(),
            needs_reset: self.active.as_ref().is_some_and(|a| a.needs_reset),
            acked_features: self.active.as_ref().map_or(0, |a| a.acked_features),
            counters: self.record.counters,
            stats: self.record.stats,
            violations: self.record.violations,
        }
    }

    /// Starts the device with the queues the driver set up, as (index, queue) pairs, and
    /// processes the buffers the driver made available before (such as the first statistics).
    pub fn activate(
        &mut self,
        memory: M,
        acked_features: u64,
        queues: impl IntoIterator<Item = (u16, Queue)>,
        notifier: Arc<dyn GuestNotifier>,
    ) -> Result<(), BalloonError> {
        if self.active.is_some() {
            return Err(BalloonError::AlreadyActive);
        }
        let active = self.check_activation(memory, acked_features, queues, notifier)?;
        let layout = active.layout;
        self.active = Some(active);
        for role in layout.roles() {
            if let Err(e) = self.process_role(role) {
                self.reset();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Checks what a driver hands over on activation (features, queues) and makes the state of
    /// an active device of it.
    fn check_activation(
        &self,
        memory: M,
        acked_features: u64,
        queues: impl IntoIterator<Item = (u16, Queue)>,
        notifier: Arc<dyn GuestNotifier>,
    ) -> Result<Active<M>, BalloonError> {
        let unoffered = acked_features & !self.device_features();
        if unoffered != 0 {
            return Err(BalloonError::UnofferedFeatures(unoffered));
        }
        let layout = QueueLayout::new(acked_features);
        let mut slots: [Option<Queue>; QueueRole::COUNT] = Default::default();
        for (index, queue) in queues {
            let role = layout
                .role(index)
                .ok_or(BalloonError::UnexpectedQueue(index))?;
            if !queue.ready() || !queue.is_valid(&*memory.memory()) {
                return Err(BalloonError::InvalidQueue(index));
            }
            if slots[role.slot()].replace(queue).is_some() {
                return Err(BalloonError::DuplicateQueue(index));
            }
        }
        for role in layout.roles() {
            if slots[role.slot()].is_none() {
                let index = layout.index(role).unwrap_or_default();
                return Err(BalloonError::MissingQueue { index, role });
            }
        }
        Ok(Active {
            memory,
            acked_features,
            layout,
            queues: slots,
            notifier,
            held_stats: None,
            needs_reset: false,
        })
    }

    /// Handles a driver notification on queue `index`. Notifications while inactive are
    /// ignored. A broken queue returns [`BalloonError::Queue`] once; the device then ignores the
    /// guest until it is reset.
    pub fn process_queue(&mut self, index: u16) -> Result<(), BalloonError> {
        let Some(active) = &self.active else {
            debug!("virtio-balloon: notification for queue {index} while inactive");
            return Ok(());
        };
        match active.layout.role(index) {
            Some(role) => self.process_role(role),
            None => {
                self.record.violations.record(
                    Violation::UnknownQueue,
                    1,
                    format_args!("notification for queue {index}"),
                );
                Ok(())
            }
        }
    }

    fn process_role(&mut self, role: QueueRole) -> Result<(), BalloonError> {
        let Some(active) = self.active.as_mut().filter(|a| !a.needs_reset) else {
            return Ok(());
        };
        let mut handler = Handler {
            backend: &self.backend,
            record: &mut self.record,
            host_hint_cmd: self.space.free_page_hint_cmd_id,
            guest_done_hinting: false,
        };
        let result = handler.process(active, role);
        let done_hinting = handler.guest_done_hinting;
        Self::check_broken(active, &result);
        result?;
        // The guest is through with the run: end it, so that it uses its hinted pages again.
        let host_cmd = self.space.free_page_hint_cmd_id;
        if done_hinting && self.hint_runs.acknowledge_on_stop && host_cmd > FREE_PAGE_HINT_DONE {
            self.set_hint_cmd(FREE_PAGE_HINT_DONE)?;
        }
        Ok(())
    }

    /// Asks the guest for fresh statistics by returning the statistics buffer it holds; the VMM
    /// calls this every [`VirtioBalloon::stats_interval`]. Returns whether a request went out (not
    /// when the driver has not given a buffer back yet).
    pub fn request_stats(&mut self) -> Result<bool, BalloonError> {
        let Some(active) = self.active.as_mut().filter(|a| !a.needs_reset) else {
            return Ok(false);
        };
        let result = process::return_stats_buffer(active);
        Self::check_broken(active, &result);
        result
    }

    /// Stops processing after an error that leaves the rings in an unknown state (the caller
    /// gets the error and logs it).
    fn check_broken<T>(active: &mut Active<M>, result: &Result<T, BalloonError>) {
        if let Err(BalloonError::Queue { .. } | BalloonError::UnreadableRing(_)) = result {
            active.needs_reset = true;
            if let Err(e) = active.notifier.needs_reset() {
                error!("virtio-balloon: cannot tell the driver that the device needs a reset: {e}");
            }
        }
    }

    /// Stops the device: drops the queues, forgets `actual`, and takes every given-away page back
    /// (a driver that resets the device no longer knows its balloon).
    pub fn reset(&mut self) {
        self.space.actual = 0;
        self.space.free_page_hint_cmd_id = FREE_PAGE_HINT_STOP;
        self.record.guest_hint_cmd = None;
        if self.active.take().is_none() {
            return;
        }
        match self.backend.deflate_all() {
            Ok(pages) => {
                let counters = &mut self.record.counters;
                counters.deflated_pages += pages;
                counters.inflated_pages = 0;
            }
            Err(e) => {
                self.record.counters.backend_errors += 1;
                warn!("virtio-balloon: cannot take the balloon's pages back on reset: {e}");
            }
        }
    }
}
