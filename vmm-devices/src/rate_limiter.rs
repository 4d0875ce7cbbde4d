//! Firecracker's rate limiter: up to two token buckets, one of bytes (`bandwidth`) and one of
//! operations (`ops`), each of `size` tokens refilled in full every `refill_time` milliseconds
//! (continuously, at `size / refill_time`), with an optional `one_time_burst` of extra tokens
//! spent first and never refilled. An operation passes when both buckets hold its tokens, and
//! takes them; otherwise it takes nothing and the device waits for as long as the buckets need
//! (see [`RateLimiter::consume`]). An operation larger than a whole bucket passes once that
//! bucket is full, and empties it. A bucket of size 0 or refill time 0 limits nothing, as in
//! Firecracker.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vmm_sys_util::timerfd::TimerFd;

/// Firecracker's `TokenBucket`, as the API takes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketConfig {
    /// Tokens the bucket holds.
    pub size: u64,
    /// Extra tokens at the start, spent first and never refilled.
    #[serde(default)]
    pub one_time_burst: Option<u64>,
    /// Milliseconds to refill the whole bucket.
    pub refill_time: u64,
}

/// Firecracker's `RateLimiter`, as the API takes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterConfig {
    /// Bytes.
    #[serde(default)]
    pub bandwidth: Option<TokenBucketConfig>,
    /// Operations.
    #[serde(default)]
    pub ops: Option<TokenBucketConfig>,
}

/// One bucket.
#[derive(Debug)]
struct TokenBucket {
    size: u64,
    burst: u64,
    refill_ns: u64,
    budget: u64,
    refilled_at: Instant,
}

impl TokenBucket {
    /// The bucket of `config`, full; none where it limits nothing.
    fn new(config: TokenBucketConfig, now: Instant) -> Option<Self> {
        if config.size == 0 || config.refill_time == 0 {
            return None;
        }
        Some(TokenBucket {
            size: config.size,
            burst: config.one_time_burst.unwrap_or(0),
            refill_ns: config.refill_time.saturating_mul(1_000_000),
            budget: config.size,
            refilled_at: now,
        })
    }

    /// Adds the tokens refilled since the last look.
    fn refill(&mut self, now: Instant) {
        let elapsed = u64::try_from(now.saturating_duration_since(self.refilled_at).as_nanos())
            .unwrap_or(u64::MAX);
        let tokens = u128::from(elapsed) * u128::from(self.size) / u128::from(self.refill_ns);
        let tokens = u64::try_from(tokens).unwrap_or(u64::MAX);
        if tokens == 0 {
            return;
        }
        self.budget = self.budget.saturating_add(tokens).min(self.size);
        // The time the added tokens took: the rest of the elapsed time carries over.
        let used_ns = u128::from(tokens) * u128::from(self.refill_ns) / u128::from(self.size);
        self.refilled_at += Duration::from_nanos(u64::try_from(used_ns).unwrap_or(u64::MAX));
        if self.budget == self.size {
            self.refilled_at = now;
        }
    }

    /// The tokens it would take for `tokens` (a larger request takes a full bucket), and how
    /// long until it holds them (zero: now).
    fn wait_for(&self, tokens: u64) -> Duration {
        let need = tokens.saturating_sub(self.burst).min(self.size);
        let missing = need.saturating_sub(self.budget);
        let ns = u128::from(missing) * u128::from(self.refill_ns) / u128::from(self.size);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Takes `tokens` (the burst first; at most a full bucket), which [`Self::wait_for`] said
    /// are there.
    fn take(&mut self, tokens: u64) {
        let from_burst = tokens.min(self.burst);
        self.burst -= from_burst;
        let rest = (tokens - from_burst).min(self.size);
        self.budget = self.budget.saturating_sub(rest);
    }
}

/// The buckets of one device.
#[derive(Debug, Default)]
pub struct RateLimiter {
    bandwidth: Option<TokenBucket>,
    ops: Option<TokenBucket>,
}

impl RateLimiter {
    /// The limiter of `config`, its buckets full at `now`.
    pub fn new(config: RateLimiterConfig, now: Instant) -> Self {
        RateLimiter {
            bandwidth: config.bandwidth.and_then(|c| TokenBucket::new(c, now)),
            ops: config.ops.and_then(|c| TokenBucket::new(c, now)),
        }
    }

    /// Whether it limits anything.
    pub fn is_limiting(&self) -> bool {
        self.bandwidth.is_some() || self.ops.is_some()
    }

    /// One operation of `bytes` at `now`: `Ok` when both buckets hold its tokens (taken), or
    /// how long to wait before asking again (nothing taken).
    pub fn consume(&mut self, bytes: u64, now: Instant) -> Result<(), Duration> {
        let mut wait = Duration::ZERO;
        for (bucket, tokens) in [(&mut self.bandwidth, bytes), (&mut self.ops, 1)] {
            if let Some(bucket) = bucket {
                bucket.refill(now);
                wait = wait.max(bucket.wait_for(tokens));
            }
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        if let Some(bucket) = &mut self.bandwidth {
            bucket.take(bytes);
        }
        if let Some(bucket) = &mut self.ops {
            bucket.take(1);
        }
        Ok(())
    }
}

/// A device's rate limiter, the configuration the API last gave it, and the timer that wakes
/// the device when a request that waits can be paid for (virtio-blk, virtio-pmem, virtio-rng:
/// a request that waits stays in its queue, which the device leaves alone until the timer
/// fires).
#[derive(Debug)]
pub struct Throttle {
    config: RateLimiterConfig,
    limiter: RateLimiter,
    timer: TimerFd,
    waiting: bool,
    /// The device, for the log.
    device: &'static str,
}

impl Throttle {
    /// The limiter of `config` for `device`, its buckets full.
    pub fn new(config: RateLimiterConfig, device: &'static str) -> io::Result<Self> {
        Ok(Throttle {
            config,
            limiter: RateLimiter::new(config, Instant::now()),
            timer: TimerFd::new().map_err(io::Error::from)?,
            waiting: false,
            device,
        })
    }

    /// The configuration, as the API last gave it.
    pub fn config(&self) -> RateLimiterConfig {
        self.config
    }

    /// A request waits for the timer.
    pub fn is_waiting(&self) -> bool {
        self.waiting
    }

    /// One request of `bytes()` bytes (asked only when something limits): true when it may go
    /// (its tokens taken); false when it must wait, and then the timer is armed for when the
    /// buckets hold its tokens.
    pub fn admit(&mut self, bytes: impl FnOnce() -> u64) -> bool {
        if !self.limiter.is_limiting() {
            return true;
        }
        match self.limiter.consume(bytes(), Instant::now()) {
            Ok(()) => true,
            Err(wait) => {
                self.arm(wait);
                false
            }
        }
    }

    /// Replaces the limiter, its buckets full; a request that waited for the old one is tried
    /// again at once.
    pub fn set(&mut self, config: RateLimiterConfig) {
        self.config = config;
        self.limiter = RateLimiter::new(config, Instant::now());
        if self.waiting {
            self.arm(Duration::ZERO);
        }
    }

    /// Makes the timer fire at once: the device looks at its queue (after a restore, where a
    /// request may have waited when the state was saved).
    pub fn wake_soon(&mut self) {
        self.arm(Duration::ZERO);
    }

    /// The timer fired: nothing waits any more (the device tries its queue again).
    pub fn fired(&mut self) {
        // How often it expired does not matter.
        let _ = self.timer.wait();
        self.waiting = false;
    }

    /// The device was reset: its queue is gone.
    pub fn reset(&mut self) {
        self.waiting = false;
    }

    /// Arms the timer for `wait` (at least a millisecond: a zero would disarm it).
    fn arm(&mut self, wait: Duration) {
        self.waiting = true;
        if let Err(e) = self.timer.reset(wait.max(Duration::from_millis(1)), None) {
            log::error!("{}: cannot arm the rate limiter's timer: {e}", self.device);
        }
    }
}

impl AsRawFd for Throttle {
    /// The timer, for the event loop to watch.
    fn as_raw_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }
}

#[cfg(test)]
mod tests;
