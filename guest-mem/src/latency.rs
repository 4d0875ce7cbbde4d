//! Lock-free latency histograms for the fault path: a few `Instant` reads and atomic adds per
//! fault, summarised as count, mean, median, p99 and maximum.
//!
//! Buckets are log-linear: exact below 32 ns, then 16 buckets per power of two, so a percentile
//! is known to within 1/32 of its value (it is reported as the middle of its bucket).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Values below this are counted exactly, one bucket each.
const EXACT: u64 = 2 * SUB;
/// The largest power of two with buckets of its own (2^40 ns is about 18 minutes).
const MAX_MSB: u32 = 40;
const BUCKETS: usize = (EXACT + (MAX_MSB - SUB_BITS) as u64 * SUB) as usize;

/// Recorded latencies in nanoseconds; every operation is lock-free.
#[derive(Debug)]
pub(crate) struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

/// The bucket of `ns`.
fn bucket(ns: u64) -> usize {
    if ns < EXACT {
        return ns as usize;
    }
    let msb = 63 - ns.leading_zeros();
    if msb > MAX_MSB {
        return BUCKETS - 1;
    }
    let sub = (ns >> (msb - SUB_BITS)) & (SUB - 1);
    (EXACT + u64::from(msb - SUB_BITS - 1) * SUB + sub) as usize
}

/// The smallest value of bucket `index` and the bucket's width.
fn bucket_range(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < EXACT {
        return (index, 1);
    }
    let msb = (index - EXACT) / SUB + u64::from(SUB_BITS) + 1;
    let sub = (index - EXACT) % SUB;
    let width = 1 << (msb - u64::from(SUB_BITS));
    ((1 << msb) + sub * width, width)
}

impl LatencyHistogram {
    /// Records one latency.
    pub fn record(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// A summary of what was recorded so far.
    pub fn summary(&self) -> LatencySummary {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return LatencySummary::default();
        }
        let max_ns = self.max_ns.load(Ordering::Relaxed);
        let percentile = |per_mille: u64| {
            let rank = (count * per_mille).div_ceil(1000).max(1);
            let mut seen = 0;
            for (index, &n) in counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    let (low, width) = bucket_range(index);
                    return (low + width / 2).min(max_ns);
                }
            }
            max_ns
        };
        LatencySummary {
            count,
            mean_ns: self.sum_ns.load(Ordering::Relaxed) / count,
            p50_ns: percentile(500),
            p99_ns: percentile(990),
            max_ns,
        }
    }
}

/// Count, mean, median, 99th percentile and maximum of recorded latencies, in nanoseconds.
/// Percentiles are accurate to within 1/32 of their value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencySummary {
    /// How many latencies were recorded.
    pub count: u64,
    /// Their mean.
    pub mean_ns: u64,
    /// Their median.
    pub p50_ns: u64,
    /// Their 99th percentile.
    pub p99_ns: u64,
    /// The largest.
    pub max_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order_and_within_their_range() {
        let mut last = 0;
        for ns in (0..5000).chain([1 << 20, (1 << 20) + 12_345, 1 << 39, (1 << 41) - 1]) {
            let index = bucket(ns);
            assert!(index >= last && index < BUCKETS, "{ns}");
            last = index;
            let (low, width) = bucket_range(index);
            assert!(low <= ns && ns < low + width, "{ns} in [{low}, +{width})");
            assert!(width == 1 || width * 16 <= low, "{ns}: bucket too wide");
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn summary_gives_percentiles_to_within_a_bucket() {
        let h = LatencyHistogram::default();
        assert_eq!(h.summary(), LatencySummary::default());
        for us in 1..=100 {
            h.record(Duration::from_micros(us));
        }
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert_eq!(s.mean_ns, 50_500);
        assert_eq!(s.max_ns, 100_000);
        assert!(s.p50_ns.abs_diff(50_000) <= 50_000 / 32, "{s:?}");
        assert!(s.p99_ns.abs_diff(99_000) <= 99_000 / 32, "{s:?}");
    }
}
