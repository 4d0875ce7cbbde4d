//! [`GuestWarnings`]: warnings a guest can trigger at will, logged so that it cannot flood the
//! log.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts a device's guest-triggered warnings and logs the n-th only when n is a power of two
/// (1, 2, 4, 8, ...), with the count so far: a guest repeating a mistake a million times
/// leaves 20 lines. Lock-free, so it can sit on a device's I/O path.
#[derive(Debug, Default)]
pub struct GuestWarnings {
    count: AtomicU64,
}

impl GuestWarnings {
    /// Counts one warning and logs it if its number is a power of two; returns whether it
    /// was logged.
    pub fn warn(&self, what: fmt::Arguments<'_>) -> bool {
        self.warn_of("guest", what)
    }

    /// As [`Self::warn`], for warnings that `source` (e.g. "host client": whoever can reach a
    /// device's socket) can trigger at will.
    pub fn warn_of(&self, source: &str, what: fmt::Arguments<'_>) -> bool {
        let count = self.count.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let logged = count.is_power_of_two();
        if logged {
            log::warn!(
                "{what} ({source} warning {count} of this device; repeats are rate-limited)"
            );
        }
        logged
    }

    /// Warnings counted so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_million_warnings_log_20_lines_and_count_all() {
        let warnings = GuestWarnings::default();
        let logged = (0..1_000_000)
            .filter(|_| warnings.warn(format_args!("bad register")))
            .count();
        assert_eq!(logged, 20);
        assert_eq!(warnings.count(), 1_000_000);
    }
}
