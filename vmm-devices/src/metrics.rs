//! The devices' counters for Firecracker's metrics: what the legacy devices (the i8042, the
//! serial port) did, process-wide as Firecracker's are (one VMM process runs one VM). Each
//! counter is a relaxed atomic add: no lock, no allocation on a vCPU's exit path. The virtio
//! devices count per device (their `*Counters`, which the VMM collects).

use std::sync::atomic::{AtomicU64, Ordering};

/// A count that only grows.
#[derive(Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Zero.
    pub const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }

    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The count so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

/// What a legacy device (the i8042, the serial port) did, with Firecracker's names.
#[derive(Debug)]
pub struct LegacyDeviceMetrics {
    /// Reads of its registers.
    pub read_count: Counter,
    /// Writes to its registers.
    pub write_count: Counter,
    /// Reads it could not answer (e.g. of the wrong size).
    pub missed_read_count: Counter,
    /// Writes it could not take (e.g. of the wrong size).
    pub missed_write_count: Counter,
    /// CPU resets the guest asked for (the i8042 only).
    pub reset_count: Counter,
    /// Errors (e.g. the serial port's output could not be written).
    pub error_count: Counter,
    /// Output bytes a rate limiter dropped (the serial port's, `PUT /serial`).
    pub rate_limiter_dropped_bytes: Counter,
}

impl LegacyDeviceMetrics {
    /// Nothing counted yet.
    pub const fn new() -> Self {
        LegacyDeviceMetrics {
            read_count: Counter::new(),
            write_count: Counter::new(),
            missed_read_count: Counter::new(),
            missed_write_count: Counter::new(),
            reset_count: Counter::new(),
            error_count: Counter::new(),
            rate_limiter_dropped_bytes: Counter::new(),
        }
    }
}

impl Default for LegacyDeviceMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The i8042's counters (Firecracker's `i8042` metrics).
pub static I8042: LegacyDeviceMetrics = LegacyDeviceMetrics::new();
/// The serial port's counters (Firecracker's `uart` metrics).
pub static UART: LegacyDeviceMetrics = LegacyDeviceMetrics::new();
