//! Guest memory into a snapshot's memory file: all of it (a full snapshot) or the pages dirty
//! since the last snapshot (a diff), with the trailer and the checksum of all of it.

use std::os::unix::fs::FileExt;
use std::path::Path;

use guest_mem::GuestMemory;
use vm_memory::{Bytes, GuestAddress};

use super::{check_copy_target, guest_memory_error, memory_file_error, Session, SnapshotError};
use crate::host_file;
use crate::layout::saved_ram_regions;
use crate::runner::progress::LoopProgress;
use crate::snapshot::memory_file::{self, MemoryChecksum};
use crate::snapshot::MemorySource;

/// The granule of dirty page tracking.
const PAGE_SIZE: u64 = 4096;

/// What of guest memory a snapshot writes into its memory file.
pub(super) enum MemoryCopy<'a> {
    /// All of it, into a new file.
    Full,
    /// The pages dirty since the last snapshot (a bitmap per region, a bit per 4 KiB page), at
    /// their places: over the memory file of the last snapshot when the path names it (it then
    /// is this snapshot's), else into a new sparse file to merge onto it.
    Diff(&'a [Vec<u64>]),
}

/// Copies guest memory, a VM's with `ram_size` bytes of RAM, into the file at `path`, regions
/// one after the other, as `copy` says: every populated chunk (chunks never touched stay holes),
/// or the dirty pages. RAM is kept as [`saved_ram_regions`] gives it (the part of a last 1 GiB
/// frame past the guest's RAM is left out), so that the file loads on any backing. A trailer
/// with a new identity follows ([`memory_file`]); the checksum covers all the memory, also of a
/// diff (a load onto the merged base verifies the merge). Returns where the snapshot's memory
/// is.
pub(super) fn copy_memory_out(
    memory: &GuestMemory,
    ram_size: u64,
    path: &Path,
    copy: MemoryCopy<'_>,
) -> Result<MemorySource, SnapshotError> {
    check_copy_target(path)?;
    let saved_ram = saved_ram_regions(ram_size);
    let saved: Vec<(u64, u64)> = memory
        .regions()
        .iter()
        .map(|region| {
            let start = region.start().0;
            let size = saved_ram
                .iter()
                .find(|ram| ram.start == start)
                .map_or(region.size(), |ram| ram.size.min(region.size()));
            (start, size)
        })
        .collect();
    let total: u64 = saved.iter().map(|&(_, size)| size).sum();
    let file = match copy {
        MemoryCopy::Full => host_file::create_output("mem_file_path", path)?,
        MemoryCopy::Diff(_) => {
            let file = host_file::open_output_keeping("mem_file_path", path)?;
            // Another VM's file, or none: a new one of the right size, all holes.
            let fits = file
                .metadata()
                .is_ok_and(|meta| meta.len() == total + memory_file::TRAILER_LEN);
            if !fits {
                file.set_len(0)
                    .and_then(|()| file.set_len(total + memory_file::TRAILER_LEN))
                    .map_err(memory_file_error(path, "cannot size"))?;
            }
            file
        }
    };
    let mut regions = Vec::new();
    let mut checksum = MemoryChecksum::default();
    let mut offset = 0;
    let mut progress = LoopProgress::new(
        format!("copying guest memory into {}", path.display()),
        total,
    );
    for (index, (region, &(start, size))) in memory.regions().iter().zip(&saved).enumerate() {
        let chunk = region.chunk_size().bytes();
        let mut buffer = vec![0u8; chunk as usize];
        for at in (start..start + size).step_by(chunk as usize) {
            // The last chunk of RAM may be kept in part.
            let part = &mut buffer[..(start + size - at).min(chunk) as usize];
            let data = memory.holds_data(GuestAddress(at));
            match data {
                true => {
                    memory
                        .read_slice(part, GuestAddress(at))
                        .map_err(guest_memory_error(path, "cannot read guest memory"))?;
                    checksum.add(part);
                }
                false => checksum.add_zero_chunk(part.len()),
            }
            let file_at = offset + at - start;
            match copy {
                MemoryCopy::Full if data => file
                    .write_all_at(part, file_at)
                    .map_err(memory_file_error(path, "cannot write"))?,
                MemoryCopy::Full => {}
                MemoryCopy::Diff(dirty) => {
                    let first = (at - start) / PAGE_SIZE;
                    let pages = part.len() as u64 / PAGE_SIZE;
                    let bits = dirty.get(index).map_or(&[][..], Vec::as_slice);
                    // A chunk without data reads zeros: the buffer is cleared for it only
                    // where it has dirty pages to write.
                    let mut filled = data;
                    for (from, to) in dirty_runs(bits, first, pages) {
                        if !filled {
                            part.fill(0);
                            filled = true;
                        }
                        let bytes = &part[((from - first) * PAGE_SIZE) as usize
                            ..((to - first) * PAGE_SIZE) as usize];
                        file.write_all_at(bytes, offset + from * PAGE_SIZE)
                            .map_err(memory_file_error(path, "cannot write"))?;
                    }
                }
            }
            progress.at(file_at);
        }
        offset += size;
        regions.push((start, size));
    }
    let identity =
        guest_mem::random_u64().map_err(memory_file_error(path, "cannot draw an identity"))?;
    memory_file::write_trailer(&file, offset, identity)
        .and_then(|()| file.sync_all())
        .map_err(memory_file_error(path, "cannot write"))?;
    Ok(MemorySource::File {
        regions,
        identity,
        checksum: checksum.value(),
    })
}

impl Session {
    /// The pages dirtied since the last call, a bitmap per region: the guest's (KVM's log of
    /// every memslot) and the VMM's (guest memory's own); both are cleared.
    pub(super) fn take_dirty_pages(
        &self,
        vm_fd: &kvm_ioctls::VmFd,
    ) -> Result<Vec<Vec<u64>>, SnapshotError> {
        let mut guest = crate::vm::dirty_pages(vm_fd, self.memory().as_ref())
            .map_err(|e| SnapshotError::State(format!("cannot read the dirty pages: {e}")))?;
        for (guest, vmm) in guest.iter_mut().zip(self.memory().take_dirty_pages()) {
            for (word, vmm) in guest.iter_mut().zip(vmm) {
                *word |= vmm;
            }
        }
        Ok(guest)
    }
}

/// The runs `[from, to)` of set bits among pages `first..first + pages` of `bits` (a bit per
/// page, 64 to a word; missing words are clear).
fn dirty_runs(bits: &[u64], first: u64, pages: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let set = move |page: u64| {
        bits.get((page / 64) as usize)
            .is_some_and(|word| word & (1 << (page % 64)) != 0)
    };
    let end = first + pages;
    let mut at = first;
    std::iter::from_fn(move || {
        while at < end && !set(at) {
            // A clear word is skipped at once.
            if at.is_multiple_of(64) && bits.get((at / 64) as usize).is_none_or(|w| *w == 0) {
                at = (at + 64).min(end);
                continue;
            }
            at += 1;
        }
        if at >= end {
            return None;
        }
        let from = at;
        while at < end && set(at) {
            at += 1;
        }
        Some((from, at))
    })
}

#[cfg(test)]
mod tests {
    use super::dirty_runs;

    #[test]
    fn dirty_runs_are_the_runs_of_set_bits_in_the_pages_asked_for() {
        // Pages 1-2, 63-65 and 200 of 256.
        let bits = [0b110 | 1 << 63, 0b11, 0, 1 << 8];
        let runs = |first, pages| dirty_runs(&bits, first, pages).collect::<Vec<_>>();
        assert_eq!(runs(0, 256), vec![(1, 3), (63, 66), (200, 201)]);
        // A range cuts runs at its ends.
        assert_eq!(runs(2, 62), vec![(2, 3), (63, 64)]);
        // Words past the bitmap are clear.
        assert_eq!(runs(256, 512), vec![]);
        assert_eq!(dirty_runs(&[], 0, 10).count(), 0);
    }
}
