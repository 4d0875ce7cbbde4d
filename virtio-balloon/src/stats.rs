//! Guest memory statistics (virtio 1.2 §5.5.6.3): the statistics buffer is a packed array of
//! `le16 tag` + `le64 val` entries in device-readable descriptors.

use serde::Serialize;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestMemory};

use crate::spec::{stat_tag, STAT_ENTRY_SIZE};
use crate::violations::{Violation, Violations};
use crate::MAX_CHAIN_DESCRIPTORS;

/// The most statistics bytes the device reads from one buffer (256 entries; Linux sends 16).
pub const MAX_STATS_BUFFER_BYTES: usize = 256 * STAT_ENTRY_SIZE;

/// The latest statistics the guest sent; a tag it left out is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct GuestStats {
    /// Memory swapped in, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    /// Memory swapped out, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    /// Major page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Minor page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    /// Unused memory, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    /// Total memory, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Memory available without swapping, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    /// Disk caches, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    /// Successful huge page allocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_allocations: Option<u64>,
    /// Failed huge page allocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_failures: Option<u64>,
    /// OOM killer invocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    /// Allocation stalls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stalls: Option<u64>,
    /// Memory scanned asynchronously, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_scans: Option<u64>,
    /// Memory scanned directly, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_scans: Option<u64>,
    /// Memory reclaimed asynchronously, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_reclaims: Option<u64>,
    /// Memory reclaimed directly, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_reclaims: Option<u64>,
}

impl GuestStats {
    /// The value of statistics tag `tag`, if the guest sent it.
    pub fn get(&self, tag: u16) -> Option<u64> {
        let mut copy = *self;
        copy.slot(tag).and_then(|slot| *slot)
    }

    /// The statistics the guest sent, as (tag, value) pairs in tag order.
    pub fn entries(&self) -> Vec<(u16, u64)> {
        (0..=stat_tag::MAX)
            .filter_map(|tag| Some((tag, self.get(tag)?)))
            .collect()
    }

    /// Statistics from (tag, value) pairs; unknown tags are left out.
    pub fn from_entries(entries: &[(u16, u64)]) -> Self {
        let mut stats = Self::default();
        for &(tag, value) in entries {
            if let Some(slot) = stats.slot(tag) {
                *slot = Some(value);
            }
        }
        stats
    }

    fn slot(&mut self, tag: u16) -> Option<&mut Option<u64>> {
        Some(match tag {
            stat_tag::SWAP_IN => &mut self.swap_in,
            stat_tag::SWAP_OUT => &mut self.swap_out,
            stat_tag::MAJFLT => &mut self.major_faults,
            stat_tag::MINFLT => &mut self.minor_faults,
            stat_tag::MEMFREE => &mut self.free_memory,
            stat_tag::MEMTOT => &mut self.total_memory,
            stat_tag::AVAIL => &mut self.available_memory,
            stat_tag::CACHES => &mut self.disk_caches,
            stat_tag::HTLB_PGALLOC => &mut self.hugetlb_allocations,
            stat_tag::HTLB_PGFAIL => &mut self.hugetlb_failures,
            stat_tag::OOM_KILL => &mut self.oom_kills,
            stat_tag::ALLOC_STALL => &mut self.alloc_stalls,
            stat_tag::ASYNC_SCAN => &mut self.async_scans,
            stat_tag::DIRECT_SCAN => &mut self.direct_scans,
            stat_tag::ASYNC_RECLAIM => &mut self.async_reclaims,
            stat_tag::DIRECT_RECLAIM => &mut self.direct_reclaims,
            _ => return None,
        })
    }

    /// Parses packed entries; unknown tags are skipped (the spec lets drivers send more), and
    /// a trailing partial entry counts as misaligned.
    pub(crate) fn parse(bytes: &[u8], violations: &mut Violations) -> Self {
        let mut stats = Self::default();
        let entries = bytes.chunks_exact(STAT_ENTRY_SIZE);
        if !entries.remainder().is_empty() {
            violations.record(
                Violation::Misaligned,
                1,
                format_args!("{}-byte statistics buffer", bytes.len()),
            );
        }
        for entry in entries {
            let (tag, value) = entry.split_at(2);
            let tag = u16::from_le_bytes([tag[0], tag[1]]);
            let mut val = [0; 8];
            val.copy_from_slice(value);
            if let Some(slot) = stats.slot(tag) {
                *slot = Some(u64::from_le_bytes(val));
            }
        }
        stats
    }

    /// Reads a statistics buffer from the descriptors of a chain.
    pub(crate) fn read<G: GuestMemory>(
        mem: &G,
        chain: impl Iterator<Item = Descriptor>,
        violations: &mut Violations,
    ) -> Self {
        let mut buffer = [0u8; MAX_STATS_BUFFER_BYTES];
        let mut filled = 0;
        for (position, desc) in chain.enumerate() {
            if position == MAX_CHAIN_DESCRIPTORS {
                violations.record(Violation::ChainTooLong, 1, format_args!("statistics chain"));
                break;
            }
            let len = desc.len() as usize;
            if desc.is_write_only() {
                violations.record(
                    Violation::WrongDirection,
                    1,
                    format_args!("device-writable statistics buffer"),
                );
                continue;
            }
            if len == 0 {
                violations.record(Violation::ZeroLength, 1, format_args!("statistics buffer"));
                continue;
            }
            let Some(room) = buffer.get_mut(filled..filled + len) else {
                violations.record(
                    Violation::ChainTooLong,
                    1,
                    format_args!("statistics buffer over {MAX_STATS_BUFFER_BYTES} bytes"),
                );
                break;
            };
            match mem.read_slice(room, desc.addr()) {
                Ok(()) => filled += len,
                Err(e) => violations.record(
                    Violation::Unreadable,
                    1,
                    format_args!("statistics buffer at {:#x}: {e}", desc.addr().0),
                ),
            }
        }
        Self::parse(&buffer[..filled], violations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, value: u64) -> Vec<u8> {
        [&tag.to_le_bytes()[..], &value.to_le_bytes()].concat()
    }

    #[test]
    fn known_tags_are_kept_and_unknown_ones_skipped() {
        let bytes = [
            entry(stat_tag::MEMFREE, 1 << 30),
            entry(99, 5),
            entry(stat_tag::DIRECT_RECLAIM, 7),
            entry(stat_tag::MEMFREE, 2 << 30),
        ]
        .concat();
        let mut violations = Violations::default();
        let stats = GuestStats::parse(&bytes, &mut violations);
        assert_eq!(stats.free_memory, Some(2 << 30));
        assert_eq!(stats.direct_reclaims, Some(7));
        assert_eq!(stats.get(stat_tag::DIRECT_RECLAIM), Some(7));
        assert_eq!(stats.get(stat_tag::SWAP_IN), None);
        assert_eq!(stats.get(99), None);
        assert_eq!(violations.total(), 0);
        let json = serde_json::to_string(&stats).unwrap();
        assert_eq!(json, r#"{"free_memory":2147483648,"direct_reclaims":7}"#);
    }

    #[test]
    fn a_partial_entry_is_misaligned() {
        let mut bytes = entry(stat_tag::MEMTOT, 3);
        bytes.extend_from_slice(&[1, 2, 3]);
        let mut violations = Violations::default();
        let stats = GuestStats::parse(&bytes, &mut violations);
        assert_eq!(stats.total_memory, Some(3));
        assert_eq!(violations.count(Violation::Misaligned), 1);
    }
}
