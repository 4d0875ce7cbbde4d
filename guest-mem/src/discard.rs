//! Discarding guest memory: whole chunks back to the pool, pieces counted until a chunk is
//! entirely given away.

use std::sync::atomic::Ordering;

use llfree::FRAME_SIZE;
use vm_memory::GuestAddress;

use crate::memory::{GuestMemory, MemoryError};
use crate::region::GuestRegion;

/// What a discard did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiscardStats {
    /// Chunks whose frame went back to the pool.
    pub freed_chunks: usize,
    /// 4 KiB pieces newly counted as given away.
    pub pieces: usize,
}

impl GuestMemory {
    /// Calls `f(region, chunk, first piece, pieces)` for every chunk part of `[addr, addr+len)`,
    /// after checking that the whole range is aligned RAM.
    fn for_each_part(
        &self,
        addr: GuestAddress,
        len: u64,
        mut f: impl FnMut(&GuestRegion, usize, usize, usize) -> Result<(), MemoryError>,
    ) -> Result<(), MemoryError> {
        let page = FRAME_SIZE as u64;
        if len == 0 || !addr.0.is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(MemoryError::Unaligned { addr: addr.0, len });
        }
        let end = addr
            .0
            .checked_add(len)
            .ok_or(MemoryError::NotRam { addr: addr.0, len })?;
        let mut at = addr.0;
        while at < end {
            let region = self
                .locate_guest(GuestAddress(at))
                .ok_or(MemoryError::NotRam { addr: addr.0, len })?;
            at = (region.start().0 + region.size()).min(end);
        }
        let mut at = addr.0;
        while at < end {
            let region = self.locate_guest(GuestAddress(at)).expect("checked above");
            let chunk_bytes = region.chunk_size().bytes();
            let offset = at - region.start().0;
            let chunk = offset / chunk_bytes;
            let part_end = ((chunk + 1) * chunk_bytes).min(end - region.start().0);
            let first = (offset % chunk_bytes) / page;
            let pieces = (part_end - offset) / page;
            f(region, chunk as usize, first as usize, pieces as usize)?;
            at = region.start().0 + part_end;
        }
        Ok(())
    }

    /// Discards `[addr, addr + len)`: the guest no longer needs its contents but may touch it
    /// again (free page reporting). Whole chunks go back to unpopulated and their frames, scrubbed,
    /// to the pool (allocated to `core`'s reservation on free); parts of chunks keep their frame
    /// (on plain memory their 4 KiB pages go back to the host). Given-away pieces are not counted.
    pub fn discard(
        &self,
        addr: GuestAddress,
        len: u64,
        core: usize,
    ) -> Result<DiscardStats, MemoryError> {
        let mut stats = DiscardStats::default();
        self.for_each_part(addr, len, |region, chunk, first, pieces| {
            if pieces == region.pieces().pieces_per_chunk() {
                stats.freed_chunks += usize::from(region.discard_chunk(chunk, core)?);
            } else {
                region.punch_pieces(chunk, first, pieces)?;
            }
            Ok(())
        })?;
        self.count_discards(stats.freed_chunks);
        Ok(stats)
    }

    /// Gives `[addr, addr + len)` away until [`GuestMemory::reclaim_pieces`] (balloon inflation).
    /// Its 4 KiB pieces are counted in per-chunk bitmaps that outlive the call; a chunk whose
    /// pieces are all given away returns its frame to the pool with `core`.
    pub fn release_pieces(
        &self,
        addr: GuestAddress,
        len: u64,
        core: usize,
    ) -> Result<DiscardStats, MemoryError> {
        let mut stats = DiscardStats::default();
        self.for_each_part(addr, len, |region, chunk, first, pieces| {
            let (newly, full) = region.pieces().set(chunk, first, pieces);
            stats.pieces += newly;
            if full {
                stats.freed_chunks += usize::from(region.discard_chunk(chunk, core)?);
            } else if newly > 0 {
                region.punch_pieces(chunk, first, pieces)?;
            }
            Ok(())
        })?;
        self.count_discards(stats.freed_chunks);
        Ok(stats)
    }

    /// Takes back pieces given away with [`GuestMemory::release_pieces`] (balloon deflation);
    /// returns how many were given away. They are repopulated when touched.
    pub fn reclaim_pieces(&self, addr: GuestAddress, len: u64) -> Result<usize, MemoryError> {
        let mut reclaimed = 0;
        self.for_each_part(addr, len, |region, chunk, first, pieces| {
            reclaimed += region.pieces().clear(chunk, first, pieces);
            Ok(())
        })?;
        Ok(reclaimed)
    }

    fn count_discards(&self, chunks: usize) {
        self.inner
            .shared
            .counters
            .discarded_chunks
            .fetch_add(chunks as u64, Ordering::Relaxed);
    }
}
