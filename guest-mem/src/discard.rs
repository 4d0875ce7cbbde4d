//! Discarding guest memory: whole chunks back to the pool, pieces counted until a chunk is
//! entirely given away.

use std::sync::atomic::Ordering;

use llfree::FRAME_SIZE;
use vm_memory::GuestAddress;

use crate::memory::{GuestMemory, MemoryError};
use crate::pool::CoreFrames;
use crate::region::{GuestRegion, RegionError, Repopulation};
use crate::stats::Counters;

/// What a discard did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiscardStats {
    /// Chunks whose frame went back to the pool.
    pub freed_chunks: usize,
    /// 4 KiB pieces newly counted as given away.
    pub pieces: usize,
}

/// What a balloon deflation took back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reclaimed {
    /// 4 KiB pieces that had been given away.
    pub pieces: usize,
    /// Chunks given a frame again before the guest touches them.
    pub populated_chunks: usize,
}

/// The part of one chunk that a guest range covers.
struct Part<'a> {
    region: &'a GuestRegion,
    chunk: usize,
    /// The first 4 KiB piece in the chunk.
    first: usize,
    /// How many pieces.
    pieces: usize,
}

/// What is given back of a chunk part.
enum GiveBack {
    /// The whole chunk: its frame goes back to the pool.
    Chunk,
    /// The part's pieces: punched out of the chunk's frame, which stays.
    Pieces,
    /// Nothing (the pieces were given away before).
    Nothing,
}

impl GuestMemory {
    /// Calls `f` for every chunk part of `[addr, addr+len)`, after checking that the whole range
    /// is aligned RAM.
    fn for_each_part<'s>(
        &'s self,
        addr: GuestAddress,
        len: u64,
        mut f: impl FnMut(Part<'s>) -> Result<(), MemoryError>,
    ) -> Result<(), MemoryError> {
        let page = FRAME_SIZE as u64;
        if len == 0 || !addr.0.is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(MemoryError::Unaligned { addr: addr.0, len });
        }
        if !self.is_ram(addr, len) {
            return Err(MemoryError::NotRam { addr: addr.0, len });
        }
        // Cannot overflow: the range is RAM.
        let end = addr.0 + len;
        let mut at = addr.0;
        while at < end {
            let region = self.locate_guest(GuestAddress(at)).expect("checked above");
            let chunk_bytes = region.chunk_size().bytes();
            let offset = at - region.start().0;
            let chunk = offset / chunk_bytes;
            let part_end = ((chunk + 1) * chunk_bytes).min(end - region.start().0);
            f(Part {
                region,
                chunk: chunk as usize,
                first: ((offset % chunk_bytes) / page) as usize,
                pieces: ((part_end - offset) / page) as usize,
            })?;
            at = region.start().0 + part_end;
        }
        Ok(())
    }

    /// Gives back every chunk part of `[addr, addr + len)` as `decide` says (which may count
    /// pieces in the stats): a whole chunk's frame goes back to the pool with `core`, pieces
    /// are punched out of their frame. Freed chunks are counted as discarded as they go, also
    /// when a later part fails.
    fn give_back_parts(
        &self,
        addr: GuestAddress,
        len: u64,
        core: &mut CoreFrames,
        mut decide: impl FnMut(&Part<'_>, &mut DiscardStats) -> GiveBack,
    ) -> Result<DiscardStats, MemoryError> {
        self.check_core(core);
        let mut stats = DiscardStats::default();
        let discarded = &self.inner.shared.counters.discarded_chunks;
        self.for_each_part(addr, len, |part| {
            let decision = decide(&part, &mut stats);
            if !matches!(decision, GiveBack::Nothing) {
                // What the guest reads there changes (to zeros): a diff snapshot keeps it.
                part.region.mark_dirty(
                    part.chunk as u64 * part.region.chunk_size().bytes()
                        + (part.first * FRAME_SIZE) as u64,
                    (part.pieces * FRAME_SIZE) as u64,
                );
            }
            match decision {
                GiveBack::Chunk => {
                    if part.region.discard_chunk(part.chunk, core)? {
                        stats.freed_chunks += 1;
                        Counters::bump(discarded);
                    }
                }
                GiveBack::Pieces => {
                    part.region
                        .punch_pieces(part.chunk, part.first, part.pieces)?;
                }
                GiveBack::Nothing => {}
            }
            Ok(())
        })?;
        Ok(stats)
    }

    /// Discards `[addr, addr + len)`: the guest no longer needs its contents but may touch it
    /// again (free page reporting). Whole chunks go back to unpopulated and their frames, scrubbed,
    /// to the pool (allocated to `core`'s reservation on free); parts of chunks keep their frame
    /// (on plain memory their 4 KiB pages go back to the host). Given-away pieces are not counted.
    pub fn discard(
        &self,
        addr: GuestAddress,
        len: u64,
        core: &mut CoreFrames,
    ) -> Result<DiscardStats, MemoryError> {
        self.give_back_parts(addr, len, core, |part, _| {
            match part.pieces == part.region.pieces().pieces_per_chunk() {
                true => GiveBack::Chunk,
                false => GiveBack::Pieces,
            }
        })
    }

    /// Gives `[addr, addr + len)` away until [`GuestMemory::reclaim_pieces`] (balloon inflation).
    /// Its 4 KiB pieces are counted in per-chunk bitmaps that outlive the call; a chunk whose
    /// pieces are all given away returns its frame to the pool with `core`.
    pub fn release_pieces(
        &self,
        addr: GuestAddress,
        len: u64,
        core: &mut CoreFrames,
    ) -> Result<DiscardStats, MemoryError> {
        self.give_back_parts(addr, len, core, |part, stats| {
            let (newly, full) = part
                .region
                .pieces()
                .set(part.chunk, part.first, part.pieces);
            stats.pieces += newly;
            match (full, newly) {
                (true, _) => GiveBack::Chunk,
                (false, 0) => GiveBack::Nothing,
                (false, _) => GiveBack::Pieces,
            }
        })
    }

    /// Takes back every piece given away with [`GuestMemory::release_pieces`]: the guest's
    /// balloon is empty again (a device reset, or a guest that boots afresh on the memory of a
    /// VM in a zone, whose bitmaps outlived the previous guest). Returns how many there were.
    pub fn reclaim_all_pieces(&self) -> usize {
        self.inner
            .regions
            .iter()
            .map(|region| {
                let pieces = region.pieces();
                let per_chunk = pieces.pieces_per_chunk();
                (0..region.table().len())
                    .filter(|&chunk| pieces.count(chunk) > 0)
                    .map(|chunk| pieces.clear(chunk, 0, per_chunk))
                    .sum::<usize>()
            })
            .sum()
    }

    /// Takes back pieces given away with [`GuestMemory::release_pieces`] (balloon deflation).
    /// A chunk that gets pieces back and has no frame (its frame went back to the pool when it
    /// was given away entirely) gets a fresh one allocated with `core` now, before the guest
    /// uses it, runs of them mapped at once; where the pool has none, or mapping fails (a
    /// warning), the guest's first touch populates it as any fault does.
    pub fn reclaim_pieces(
        &self,
        addr: GuestAddress,
        len: u64,
        core: &mut CoreFrames,
    ) -> Result<Reclaimed, MemoryError> {
        self.check_core(core);
        let mut reclaimed = Reclaimed::default();
        let mut repopulation = Repopulation::new(core);
        self.for_each_part(addr, len, |part| {
            let cleared = part
                .region
                .pieces()
                .clear(part.chunk, part.first, part.pieces);
            reclaimed.pieces += cleared;
            if cleared > 0 {
                if let Err(e) = repopulation.add(part.region, part.chunk) {
                    self.warn_repopulation(&e);
                }
            }
            Ok(())
        })?;
        let (populated, failed) = repopulation.finish();
        reclaimed.populated_chunks = populated;
        if let Some(e) = failed {
            self.warn_repopulation(&e);
        }
        Ok(reclaimed)
    }

    /// Warns that chunks taken back could not be given frames (at powers of two of such
    /// failures: a guest deflates as often as it likes).
    fn warn_repopulation(&self, e: &RegionError) {
        let failures = &self.inner.shared.counters.repopulate_failures;
        let count = failures.fetch_add(1, Ordering::Relaxed) + 1;
        if count.is_power_of_two() {
            log::warn!(
                "guest memory: cannot give frames to pages the guest took back from its \
                 balloon ({count} failures so far; its touch will populate them): {e}"
            );
        }
    }
}
