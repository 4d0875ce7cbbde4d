//! Counts of driver mistakes (or attacks), with warnings that cannot flood the log.

use std::fmt;

use log::warn;
use serde::{Deserialize, Serialize};

/// A kind of invalid driver input. Each is ignored (or the chain dropped) with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A page or range outside guest RAM (a hole, MMIO, or beyond the end).
    OutsideRam,
    /// A range or buffer that is not 4 KiB (or entry-size) aligned, or wraps around.
    Misaligned,
    /// A zero-length buffer or range.
    ZeroLength,
    /// A chain with more descriptors or bytes than the device accepts.
    ChainTooLong,
    /// A device-writable buffer where a readable one belongs, or the other way round.
    WrongDirection,
    /// A buffer the device cannot read from guest memory.
    Unreadable,
    /// Inflation of pages that are inflated already.
    DuplicateInflation,
    /// Deflation of pages that were not inflated.
    NotInflated,
    /// A second statistics buffer while the device still holds one.
    ExtraStatsBuffer,
    /// A notification for a queue that does not exist.
    UnknownQueue,
    /// A chain with an indirect descriptor (VIRTIO_RING_F_INDIRECT_DESC is not offered).
    IndirectDescriptor,
}

/// How often each [`Violation`] happened since the device was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Violations {
    /// See [`Violation::OutsideRam`].
    pub outside_ram: u64,
    /// See [`Violation::Misaligned`].
    pub misaligned: u64,
    /// See [`Violation::ZeroLength`].
    pub zero_length: u64,
    /// See [`Violation::ChainTooLong`].
    pub chain_too_long: u64,
    /// See [`Violation::WrongDirection`].
    pub wrong_direction: u64,
    /// See [`Violation::Unreadable`].
    pub unreadable: u64,
    /// See [`Violation::DuplicateInflation`].
    pub duplicate_inflation: u64,
    /// See [`Violation::NotInflated`].
    pub not_inflated: u64,
    /// See [`Violation::ExtraStatsBuffer`].
    pub extra_stats_buffer: u64,
    /// See [`Violation::UnknownQueue`].
    pub unknown_queue: u64,
    /// See [`Violation::IndirectDescriptor`].
    pub indirect_descriptor: u64,
}

impl Violations {
    /// The counter of `kind`.
    pub fn count(&self, kind: Violation) -> u64 {
        *self.counter(kind)
    }

    /// All violations together (saturating).
    pub fn total(&self) -> u64 {
        [
            self.outside_ram,
            self.misaligned,
            self.zero_length,
            self.chain_too_long,
            self.wrong_direction,
            self.unreadable,
            self.duplicate_inflation,
            self.not_inflated,
            self.extra_stats_buffer,
            self.unknown_queue,
            self.indirect_descriptor,
        ]
        .iter()
        .fold(0u64, |sum, &count| sum.saturating_add(count))
    }

    fn counter(&self, kind: Violation) -> &u64 {
        match kind {
            Violation::OutsideRam => &self.outside_ram,
            Violation::Misaligned => &self.misaligned,
            Violation::ZeroLength => &self.zero_length,
            Violation::ChainTooLong => &self.chain_too_long,
            Violation::WrongDirection => &self.wrong_direction,
            Violation::Unreadable => &self.unreadable,
            Violation::DuplicateInflation => &self.duplicate_inflation,
            Violation::NotInflated => &self.not_inflated,
            Violation::ExtraStatsBuffer => &self.extra_stats_buffer,
            Violation::UnknownQueue => &self.unknown_queue,
            Violation::IndirectDescriptor => &self.indirect_descriptor,
        }
    }

    fn counter_mut(&mut self, kind: Violation) -> &mut u64 {
        match kind {
            Violation::OutsideRam => &mut self.outside_ram,
            Violation::Misaligned => &mut self.misaligned,
            Violation::ZeroLength => &mut self.zero_length,
            Violation::ChainTooLong => &mut self.chain_too_long,
            Violation::WrongDirection => &mut self.wrong_direction,
            Violation::Unreadable => &mut self.unreadable,
            Violation::DuplicateInflation => &mut self.duplicate_inflation,
            Violation::NotInflated => &mut self.not_inflated,
            Violation::ExtraStatsBuffer => &mut self.extra_stats_buffer,
            Violation::UnknownQueue => &mut self.unknown_queue,
            Violation::IndirectDescriptor => &mut self.indirect_descriptor,
        }
    }

    /// Counts `times` occurrences of `kind`. Warns when the counter reaches a new power of two,
    /// so that a guest repeating a mistake cannot flood the log.
    pub(crate) fn record(&mut self, kind: Violation, times: u64, what: fmt::Arguments<'_>) {
        let counter = self.counter_mut(kind);
        let before = *counter;
        *counter = before.saturating_add(times);
        if times > 0 && before.checked_ilog2() != counter.checked_ilog2() {
            warn!(
                "virtio-balloon: ignored invalid driver input ({kind:?}, {} so far): {what}",
                *counter
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_accumulate_per_kind() {
        let mut violations = Violations::default();
        violations.record(Violation::OutsideRam, 1, format_args!("pfn 1"));
        violations.record(Violation::OutsideRam, 5, format_args!("pfns"));
        violations.record(Violation::NotInflated, 0, format_args!("none"));
        violations.record(Violation::UnknownQueue, u64::MAX, format_args!("many"));
        assert_eq!(violations.count(Violation::OutsideRam), 6);
        assert_eq!(violations.count(Violation::NotInflated), 0);
        assert_eq!(violations.unknown_queue, u64::MAX);
        violations.record(Violation::UnknownQueue, 1, format_args!("saturates"));
        assert_eq!(violations.unknown_queue, u64::MAX);
        assert_eq!(violations.total(), u64::MAX);
    }
}
