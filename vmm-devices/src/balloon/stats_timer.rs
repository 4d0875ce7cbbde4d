//! The statistics timer: a timerfd in the event loop that asks the guest for fresh memory
//! statistics ([`virtio_balloon::VirtioBalloon::request_stats`]) at the configured interval, which
//! the API may change while the guest runs.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use log::warn;
use vmm_sys_util::timerfd::TimerFd;

use super::{lock, BalloonDevice};

/// Errors of the statistics timer.
#[derive(Debug, thiserror::Error)]
pub enum StatsTimerError {
    /// The timerfd could not be created or set.
    #[error("balloon statistics timer: {0}")]
    Timer(#[source] io::Error),
    /// Statistics were not enabled when the device was created, so the guest has no statistics
    /// queue and polling cannot be turned on later.
    #[error("balloon statistics were not enabled when the VM started")]
    NotEnabled,
}

/// The timer and the interval it runs at.
#[derive(Debug)]
struct Timer {
    fd: TimerFd,
    interval: Option<Duration>,
}

impl Timer {
    fn arm(&mut self, interval: Option<Duration>) -> Result<(), StatsTimerError> {
        match interval {
            Some(every) => self.fd.reset(every, Some(every)),
            None => self.fd.clear(),
        }
        .map_err(|e| StatsTimerError::Timer(e.into()))?;
        self.interval = interval;
        Ok(())
    }
}

/// Reads and sets the statistics polling interval of a running balloon.
#[derive(Debug, Clone)]
pub struct StatsInterval {
    timer: Arc<Mutex<Timer>>,
    enabled: bool,
}

impl StatsInterval {
    /// The interval statistics are requested at; `None` when polling is off.
    pub fn get(&self) -> Option<Duration> {
        lock(&self.timer).interval
    }

    /// Polls every `interval`, or stops polling with `None` (or zero). Polling cannot be turned
    /// on for a balloon created without statistics: its guest has no statistics queue.
    pub fn set(&self, interval: Option<Duration>) -> Result<(), StatsTimerError> {
        let interval = interval.filter(|i| !i.is_zero());
        if interval.is_some() && !self.enabled {
            return Err(StatsTimerError::NotEnabled);
        }
        lock(&self.timer).arm(interval)
    }
}

/// The event-loop side: calls `request_stats` on the balloon when the timer fires.
#[derive(Debug)]
pub struct StatsTimer {
    device: Arc<Mutex<BalloonDevice>>,
    timer: Arc<Mutex<Timer>>,
    fd: RawFd,
}

impl StatsTimer {
    /// A timer armed with the device's statistics interval (none: disarmed), and the handle
    /// that changes it.
    pub fn new(
        device: Arc<Mutex<BalloonDevice>>,
    ) -> Result<(Self, StatsInterval), StatsTimerError> {
        let interval = lock(&device).balloon().stats_interval();
        let fd = TimerFd::new().map_err(|e| StatsTimerError::Timer(e.into()))?;
        let raw_fd = fd.as_raw_fd();
        // Non-blocking: a read after the API disarmed the timer must not block the event loop.
        // SAFETY: fcntl on a descriptor we own; no memory is passed.
        if unsafe { libc::fcntl(raw_fd, libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
            return Err(StatsTimerError::Timer(io::Error::last_os_error()));
        }
        let mut timer = Timer { fd, interval: None };
        timer.arm(interval)?;
        let timer = Arc::new(Mutex::new(timer));
        let handle = StatsInterval {
            timer: timer.clone(),
            enabled: interval.is_some(),
        };
        let subscriber = Self {
            device,
            timer,
            fd: raw_fd,
        };
        Ok((subscriber, handle))
    }
}

impl MutEventSubscriber for StatsTimer {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new_raw(self.fd, EventSet::IN)) {
            warn!("virtio-balloon: cannot watch the statistics timer: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        // Nothing to read: the API disarmed the timer after it fired.
        if lock(&self.timer).fd.wait().is_err() {
            return;
        }
        if let Err(e) = lock(&self.device).balloon_mut().request_stats() {
            warn!("virtio-balloon: statistics request: {e}");
        }
    }
}
