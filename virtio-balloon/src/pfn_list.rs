//! Inflate and deflate buffers: arrays of `le32` page frame numbers (4 KiB pages) in
//! device-readable descriptors, read in fixed-size pieces of up to 256 entries (Linux's whole
//! buffer), each piece sorted and then coalesced into runs of consecutive pages, so that a list
//! in any order (descending, shuffled) becomes as few runs as an ascending one. Reading
//! allocates nothing: the pieces are sorted in place on the stack, and the runs go to a
//! callback as they complete.

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestMemory};

use crate::backend::GuestRange;
use crate::spec::PFN_SIZE;
use crate::violations::{Violation, Violations};
use crate::MAX_CHAIN_DESCRIPTORS;

/// The most page frame numbers one inflate or deflate chain may carry (256 MiB worth; Linux
/// sends 256 per buffer).
pub const MAX_PFNS_PER_CHAIN: usize = 65536;

/// Bytes read from guest memory at a time.
const READ_PIECE: usize = 1024;
/// Page frame numbers sorted together: one piece's worth (a piece plus the fewer than
/// [`PFN_SIZE`] bytes carried over from the previous one never holds more whole entries).
const SORT_BATCH: usize = READ_PIECE / PFN_SIZE;

/// Coalesces page frame numbers into runs.
struct Runs<F> {
    first: u64,
    pages: u64,
    emit: F,
}

impl<F: FnMut(GuestRange, &mut Violations)> Runs<F> {
    fn push(&mut self, pfn: u64, violations: &mut Violations) {
        if self.pages > 0 && self.first + self.pages == pfn {
            self.pages += 1;
            return;
        }
        self.flush(violations);
        self.first = pfn;
        self.pages = 1;
    }

    fn flush(&mut self, violations: &mut Violations) {
        if self.pages > 0 {
            (self.emit)(GuestRange::from_pfns(self.first, self.pages), violations);
            self.pages = 0;
        }
    }
}

/// Reads the page frame numbers of a chain and calls `emit` with each run of consecutive pages.
/// The entries of each read piece (at most [`SORT_BATCH`]) are sorted first, so the runs come in
/// buffer order piece by piece, ascending within a piece; duplicates become separate runs (the
/// backend sees them as such). Device-writable, empty and unreadable descriptors are skipped; a chain with
/// too many descriptors or page frame numbers is cut off; all with a recorded violation.
pub(crate) fn read_pfn_runs<G: GuestMemory>(
    mem: &G,
    chain: impl Iterator<Item = Descriptor>,
    violations: &mut Violations,
    emit: impl FnMut(GuestRange, &mut Violations),
) {
    let mut runs = Runs {
        first: 0,
        pages: 0,
        emit,
    };
    // Bytes of a page frame number split across reads (or descriptors) are carried over.
    let mut buffer = [0u8; READ_PIECE + PFN_SIZE];
    let mut batch = [0u32; SORT_BATCH];
    let mut carried = 0;
    let mut budget = MAX_PFNS_PER_CHAIN * PFN_SIZE;
    'chain: for (position, desc) in chain.enumerate() {
        if position == MAX_CHAIN_DESCRIPTORS {
            violations.record(Violation::ChainTooLong, 1, format_args!("page frame chain"));
            break;
        }
        if desc.is_write_only() {
            violations.record(
                Violation::WrongDirection,
                1,
                format_args!("device-writable page frame buffer"),
            );
            continue;
        }
        let len = desc.len() as usize;
        if len == 0 {
            violations.record(Violation::ZeroLength, 1, format_args!("page frame buffer"));
            continue;
        }
        let mut offset = 0;
        while offset < len {
            if budget == 0 {
                violations.record(
                    Violation::ChainTooLong,
                    1,
                    format_args!("more than {MAX_PFNS_PER_CHAIN} page frame numbers"),
                );
                break 'chain;
            }
            let piece = READ_PIECE.min(len - offset).min(budget);
            let read = desc
                .addr()
                .checked_add(offset as u64)
                .ok_or(vm_memory::GuestMemoryError::GuestAddressOverflow)
                .and_then(|addr| mem.read_slice(&mut buffer[carried..carried + piece], addr));
            if let Err(e) = read {
                violations.record(
                    Violation::Unreadable,
                    1,
                    format_args!("page frame buffer {:#x}+{len:#x}: {e}", desc.addr().0),
                );
                carried = 0;
                continue 'chain;
            }
            offset += piece;
            budget -= piece;
            let filled = carried + piece;
            let whole = filled - filled % PFN_SIZE;
            let pfns = &mut batch[..whole / PFN_SIZE];
            for (pfn, bytes) in pfns.iter_mut().zip(buffer[..whole].chunks_exact(PFN_SIZE)) {
                *pfn = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            }
            // In place (no allocation): a descending list would otherwise be a run per page.
            pfns.sort_unstable();
            for &pfn in pfns.iter() {
                runs.push(u64::from(pfn), violations);
            }
            buffer.copy_within(whole..filled, 0);
            carried = filled - whole;
        }
    }
    runs.flush(violations);
    if carried != 0 {
        violations.record(
            Violation::Misaligned,
            1,
            format_args!("page frame buffer ends in a partial entry"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    fn write_pfns(mem: &GuestMemoryMmap, addr: u64, pfns: &[u32]) -> u32 {
        let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
        mem.write_slice(&bytes, GuestAddress(addr)).unwrap();
        bytes.len() as u32
    }

    fn runs(mem: &GuestMemoryMmap, descs: &[Descriptor]) -> (Vec<(u64, u64)>, Violations) {
        let mut violations = Violations::default();
        let mut found = Vec::new();
        read_pfn_runs(mem, descs.iter().copied(), &mut violations, |range, _| {
            found.push((range.addr.0 >> 12, range.pages()))
        });
        (found, violations)
    }

    #[test]
    fn consecutive_pages_coalesce_and_others_split() {
        let mem = memory();
        let len = write_pfns(&mem, 0x1000, &[10, 11, 12, 20, 22, 23, u32::MAX]);
        let (found, violations) = runs(&mem, &[Descriptor::new(0x1000, len, 0, 0)]);
        assert_eq!(found, [(10, 3), (20, 1), (22, 2), (u32::MAX as u64, 1)]);
        assert_eq!(violations.total(), 0);
    }

    #[test]
    fn each_piece_is_sorted_before_its_runs_are_merged() {
        let mem = memory();
        // Linux-sized buffers of 256 entries: descending, and shuffled with duplicates.
        let descending: Vec<u32> = (1000..1256).rev().collect();
        let len = write_pfns(&mem, 0x1000, &descending);
        let (found, violations) = runs(&mem, &[Descriptor::new(0x1000, len, 0, 0)]);
        assert_eq!(found, [(1000, 256)], "one run, not 256 single pages");
        assert_eq!(violations.total(), 0);

        let shuffled = [7, 3, 12, 4, 5, 3, 6, 11, 20];
        let len = write_pfns(&mem, 0x1000, &shuffled);
        let (found, _) = runs(&mem, &[Descriptor::new(0x1000, len, 0, 0)]);
        assert_eq!(found, [(3, 1), (3, 5), (11, 2), (20, 1)]);

        // A longer buffer is sorted piece by piece (256 entries each): two descending halves
        // of 512 pages become one run per piece, and consecutive pieces still merge.
        let long: Vec<u32> = (2000..2256).rev().chain((2256..2512).rev()).collect();
        let len = write_pfns(&mem, 0x1000, &long);
        let (found, _) = runs(&mem, &[Descriptor::new(0x1000, len, 0, 0)]);
        assert_eq!(found, [(2000, 512)]);
        let reversed: Vec<u32> = (3000..3512).rev().collect();
        let len = write_pfns(&mem, 0x1000, &reversed);
        let (found, _) = runs(&mem, &[Descriptor::new(0x1000, len, 0, 0)]);
        assert_eq!(found, [(3256, 256), (3000, 256)]);
    }

    #[test]
    fn entries_may_straddle_descriptors_and_pieces() {
        let mem = memory();
        let pfns: Vec<u32> = (100..700).collect();
        let len = write_pfns(&mem, 0x1000, &pfns);
        let descs = [
            Descriptor::new(0x1000, 6, 0, 0),
            Descriptor::new(0x1006, len - 6, 0, 0),
        ];
        let (found, violations) = runs(&mem, &descs);
        assert_eq!(found, [(100, 600)]);
        assert_eq!(violations.total(), 0);
    }

    #[test]
    fn bad_descriptors_are_skipped_with_violations() {
        let mem = memory();
        let len = write_pfns(&mem, 0x1000, &[5, 6]);
        let descs = [
            Descriptor::new(0x1000, len, VRING_DESC_F_WRITE as u16, 0),
            Descriptor::new(0x1000, 0, 0, 0),
            Descriptor::new(0xf_fff0, 0x100, 0, 0),
            Descriptor::new(u64::MAX - 1, 0x100, 0, 0),
            Descriptor::new(0x1000, len + 1, 0, 0),
        ];
        let (found, violations) = runs(&mem, &descs);
        assert_eq!(found, [(5, 2)]);
        assert_eq!(violations.count(Violation::WrongDirection), 1);
        assert_eq!(violations.count(Violation::ZeroLength), 1);
        assert_eq!(violations.count(Violation::Unreadable), 2);
        assert_eq!(violations.count(Violation::Misaligned), 1);
    }

    #[test]
    fn long_chains_are_cut_off() {
        let mem = memory();
        let len = write_pfns(&mem, 0x1000, &[1]);
        let descs = vec![Descriptor::new(0x1000, len, 0, 0); MAX_CHAIN_DESCRIPTORS + 5];
        let (found, violations) = runs(&mem, &descs);
        assert_eq!(found.len(), MAX_CHAIN_DESCRIPTORS);
        assert_eq!(violations.count(Violation::ChainTooLong), 1);

        let mem = memory();
        let all: Vec<u32> = (0..MAX_PFNS_PER_CHAIN as u32).collect();
        let big = write_pfns(&mem, 0, &all);
        let descs = [Descriptor::new(0, big, 0, 0), Descriptor::new(0, 4, 0, 0)];
        let (found, violations) = runs(&mem, &descs);
        assert_eq!(found, [(0, MAX_PFNS_PER_CHAIN as u64)]);
        assert_eq!(violations.count(Violation::ChainTooLong), 1);
    }
}
