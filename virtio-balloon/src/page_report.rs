//! Free page reporting buffers (virtio 1.2 §5.5.6.7): every device-writable descriptor of a
//! chain names a free range of guest memory (its address and length); the device reads and
//! writes nothing. Adjacent ranges of one chain are merged.

use virtio_queue::desc::split::Descriptor;

use crate::backend::GuestRange;
use crate::spec::BALLOON_PAGE_SIZE;
use crate::violations::{Violation, Violations};
use crate::MAX_CHAIN_DESCRIPTORS;

/// Calls `emit` with the valid reported ranges of a chain, adjacent ones merged. Read-only,
/// empty, unaligned and wrapping descriptors are skipped; descriptors past the limit are cut
/// off; all with a recorded violation.
pub(crate) fn read_reported_ranges(
    chain: impl Iterator<Item = Descriptor>,
    violations: &mut Violations,
    mut emit: impl FnMut(GuestRange, &mut Violations),
) {
    let mut pending: Option<GuestRange> = None;
    for (position, desc) in chain.enumerate() {
        if position == MAX_CHAIN_DESCRIPTORS {
            violations.record(Violation::ChainTooLong, 1, format_args!("reporting chain"));
            break;
        }
        let range = GuestRange {
            addr: desc.addr(),
            len: u64::from(desc.len()),
        };
        let problem = if !desc.is_write_only() {
            Some(Violation::WrongDirection)
        } else if range.len == 0 {
            Some(Violation::ZeroLength)
        } else if !range.addr.0.is_multiple_of(BALLOON_PAGE_SIZE)
            || !range.len.is_multiple_of(BALLOON_PAGE_SIZE)
            || range.end().is_none()
        {
            Some(Violation::Misaligned)
        } else {
            None
        };
        if let Some(kind) = problem {
            violations.record(kind, 1, format_args!("reported range {range}"));
            continue;
        }
        match &mut pending {
            Some(merged) if merged.end() == Some(range.addr.0) => merged.len += range.len,
            _ => {
                if let Some(done) = pending.replace(range) {
                    emit(done, violations);
                }
            }
        }
    }
    if let Some(done) = pending {
        emit(done, violations);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;

    const W: u16 = VRING_DESC_F_WRITE as u16;

    fn ranges(descs: &[Descriptor]) -> (Vec<(u64, u64)>, Violations) {
        let mut violations = Violations::default();
        let mut found = Vec::new();
        read_reported_ranges(descs.iter().copied(), &mut violations, |r, _| {
            found.push((r.addr.0, r.len))
        });
        (found, violations)
    }

    #[test]
    fn adjacent_ranges_merge() {
        let mb2: u32 = 0x20_0000;
        let at = |n: u32| u64::from(n * mb2);
        let descs = [
            Descriptor::new(0, 2 * mb2, W, 0),
            Descriptor::new(at(2), 2 * mb2, W, 0),
            Descriptor::new(at(8), mb2, W, 0),
        ];
        let (found, violations) = ranges(&descs);
        assert_eq!(found, [(0, at(4)), (at(8), at(1))]);
        assert_eq!(violations.total(), 0);
    }

    #[test]
    fn invalid_descriptors_are_skipped() {
        let descs = [
            Descriptor::new(0x1000, 0x1000, 0, 0),
            Descriptor::new(0x1000, 0, W, 0),
            Descriptor::new(0x1800, 0x1000, W, 0),
            Descriptor::new(0x1000, 0x800, W, 0),
            Descriptor::new(u64::MAX - 0xfff, 0x2000, W, 0),
            Descriptor::new(0x3000, 0x1000, W, 0),
        ];
        let (found, violations) = ranges(&descs);
        assert_eq!(found, [(0x3000, 0x1000)]);
        assert_eq!(violations.count(Violation::WrongDirection), 1);
        assert_eq!(violations.count(Violation::ZeroLength), 1);
        assert_eq!(violations.count(Violation::Misaligned), 3);
    }

    #[test]
    fn long_chains_are_cut_off() {
        let descs: Vec<_> = (0..MAX_CHAIN_DESCRIPTORS as u64 + 3)
            .map(|i| Descriptor::new(i * 0x2000, 0x1000, W, 0))
            .collect();
        let (found, violations) = ranges(&descs);
        assert_eq!(found.len(), MAX_CHAIN_DESCRIPTORS);
        assert_eq!(violations.count(Violation::ChainTooLong), 1);
    }
}
