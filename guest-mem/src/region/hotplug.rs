//! Plugging and unplugging hot-pluggable memory (virtio-mem), a request's chunks at once.
//!
//! A core's frames come out of LLFree in order, so the chunks of one request are mostly backed
//! by consecutive frames: each such run is mapped, made inaccessible and scrubbed with one
//! system call. Every mmap over guest memory is a KVM MMU notification; in a nested VM, one per
//! 2 MiB block made a plug request of 128 MiB take 6–34 ms of host time.

use std::ops::Range;

use super::run::FrameRun;
use super::{GuestRegion, RegionError};
use crate::frame_table::ChunkState;
use crate::pool::{CoreFrames, Frame};
use crate::sys::mmap;

impl GuestRegion {
    /// Puts an inaccessible reservation over `chunks` (claimed, or not yet shared).
    pub(super) fn make_inaccessible(&self, chunks: Range<usize>) -> Result<(), RegionError> {
        let (addr, _) = self.chunk_range(chunks.start);
        let len = chunks.len() * self.chunk.bytes() as usize;
        // SAFETY: the chunks belong to this region and nobody else changes them; they hold no
        // frame the guest may keep.
        unsafe { mmap::map_inaccessible(addr, len) }.map_err(|source| RegionError::Protect {
            chunk: chunks.start,
            source,
        })
    }

    /// Plugs unplugged `chunks` of hot-pluggable memory: each gets a frame allocated with
    /// `core`, mapped and recorded (in a zone) as populating does. All or nothing: on an error
    /// the chunks this call plugged are unplugged again.
    pub(crate) fn plug(
        &self,
        chunks: Range<usize>,
        core: &mut CoreFrames,
    ) -> Result<(), RegionError> {
        let Err((plugged, e)) = self.plug_runs(chunks, core) else {
            return Ok(());
        };
        if !plugged.is_empty() {
            // Fresh frames that never held data: unplugging them fails only on a scrub, which
            // keeps the frame (lost, not leaked).
            let _ = self.unplug(plugged, core);
        }
        Err(e)
    }

    /// Plugs `chunks` run by run. On an error, returns it with the chunks plugged (the first
    /// ones); the others are unplugged.
    fn plug_runs(
        &self,
        chunks: Range<usize>,
        core: &mut CoreFrames,
    ) -> Result<(), (Range<usize>, RegionError)> {
        let mut pending: Option<FrameRun> = None;
        for chunk in chunks.clone() {
            let frame = match self.claim_for_plug(chunk, core) {
                Ok(frame) => frame,
                Err(e) => {
                    let Some(run) = pending else {
                        return Err((chunks.start..chunk, e));
                    };
                    return match self.map_plugged(run, core) {
                        Ok(()) => Err((chunks.start..chunk, e)),
                        Err(_) => Err((chunks.start..run.chunk, e)),
                    };
                }
            };
            if pending.as_mut().is_some_and(|run| run.extend(chunk, frame)) {
                continue;
            }
            let next = FrameRun::single(chunk, frame);
            if let Some(run) = pending.replace(next) {
                if let Err(e) = self.map_plugged(run, core) {
                    self.abandon_plug(next, core);
                    return Err((chunks.start..run.chunk, e));
                }
            }
        }
        match pending {
            Some(run) => self
                .map_plugged(run, core)
                .map_err(|e| (chunks.start..run.chunk, e)),
            None => Ok(()),
        }
    }

    /// Claims unplugged `chunk` and gives it a frame allocated with `core`, recorded in the
    /// zone (allocate, then record: a crash in between leaves a frame that the zone's recovery
    /// finds referenced by no VM, and frees).
    fn claim_for_plug(&self, chunk: usize, core: &mut CoreFrames) -> Result<Frame, RegionError> {
        if !self.table.claim_unplugged(chunk) {
            return Err(RegionError::Plugged { chunk });
        }
        // Its given-away pieces (a balloon's, while it was unplugged) are the new memory's.
        self.pieces.clear(chunk, 0, self.pieces.pieces_per_chunk());
        let Some(frame) = core.alloc(self.chunk) else {
            self.table.publish_unplugged(chunk);
            return Err(RegionError::Exhausted(self.chunk.name()));
        };
        self.table.persist(chunk, frame.index);
        Ok(frame)
    }

    /// Maps the frames of claimed `run` over its chunks and publishes them; on failure gives
    /// the frames back and leaves the chunks unplugged.
    fn map_plugged(&self, run: FrameRun, core: &mut CoreFrames) -> Result<(), RegionError> {
        self.map_run(run)
            .inspect_err(|_| self.abandon_plug(run, core))
    }

    /// Gives the fresh frames of claimed `run` back (they never held data) and publishes its
    /// chunks unplugged behind a new inaccessible reservation (a failed MAP_FIXED may have
    /// removed the old one).
    fn abandon_plug(&self, run: FrameRun, core: &mut CoreFrames) {
        self.free_fresh_frames(run, core);
        let _ = self.make_inaccessible(run.chunks());
        run.chunks()
            .for_each(|chunk| self.table.publish_unplugged(chunk));
    }

    /// Unplugs plugged `chunks` of hot-pluggable memory: they become inaccessible and their
    /// frames go back to the pool scrubbed (with `core`). Returns how many frames were freed.
    /// On an error, the chunks before the one that failed are unplugged.
    pub(crate) fn unplug(
        &self,
        chunks: Range<usize>,
        core: &mut CoreFrames,
    ) -> Result<usize, RegionError> {
        let mut freed = 0;
        // A run of chunks with frames, and whether they are mapped in this process.
        let mut pending: Option<(FrameRun, bool)> = None;
        for chunk in chunks {
            let claimed = match self.claim_for_unplug(chunk) {
                Ok(claimed) => claimed,
                Err(e) => {
                    if let Some((run, mapped)) = pending {
                        self.unplug_run(run, mapped, core)?;
                    }
                    return Err(e);
                }
            };
            if let (Some((run, mapped)), Some((frame, frame_mapped))) = (&mut pending, claimed) {
                if *mapped == frame_mapped && run.extend(chunk, frame) {
                    continue;
                }
            }
            if let Some((run, mapped)) = pending.take() {
                freed += self.unplug_run(run, mapped, core)?;
            }
            match claimed {
                Some((frame, mapped)) => pending = Some((FrameRun::single(chunk, frame), mapped)),
                // Plugged but without a frame (the balloon took it): nothing to give back.
                None => {
                    if let Err(e) = self.make_inaccessible(chunk..chunk + 1) {
                        self.table.publish_empty(chunk);
                        return Err(e);
                    }
                    self.pieces.clear(chunk, 0, self.pieces.pieces_per_chunk());
                    self.table.publish_unplugged(chunk);
                }
            }
        }
        if let Some((run, mapped)) = pending {
            freed += self.unplug_run(run, mapped, core)?;
        }
        Ok(freed)
    }

    /// Claims plugged `chunk` for unplugging it; returns its frame and whether it is mapped in
    /// this process (a VM in a zone maps its recorded frames ahead or on first touch), or `None`
    /// for a chunk without a frame.
    fn claim_for_unplug(&self, chunk: usize) -> Result<Option<(Frame, bool)>, RegionError> {
        let frame = |index| Frame {
            index,
            size: self.chunk,
        };
        loop {
            match self.table.state(chunk) {
                ChunkState::Busy => std::thread::yield_now(),
                ChunkState::Unplugged => return Err(RegionError::Unplugged { chunk }),
                ChunkState::Mapped(index) if self.table.claim_mapped(chunk, index) => {
                    return Ok(Some((frame(index), true)));
                }
                ChunkState::Empty if self.table.claim_empty(chunk) => {
                    return Ok(self
                        .table
                        .persisted(chunk)
                        .map(|index| (frame(index), false)));
                }
                _ => {}
            }
        }
    }

    /// Makes the chunks of claimed `run` inaccessible and gives their frames back scrubbed;
    /// returns how many were freed. If they cannot be made inaccessible, they are put back as
    /// they were (`mapped` or not).
    fn unplug_run(
        &self,
        run: FrameRun,
        mapped: bool,
        core: &mut CoreFrames,
    ) -> Result<usize, RegionError> {
        if let Err(e) = self.make_inaccessible(run.chunks()) {
            for (chunk, frame) in run.frames() {
                match mapped {
                    true => {
                        let _ = self.map_claimed(chunk, frame);
                    }
                    false => self.table.publish_empty(chunk),
                }
            }
            return Err(e);
        }
        for chunk in run.chunks() {
            self.pieces.clear(chunk, 0, self.pieces.pieces_per_chunk());
        }
        // Frames that cannot be scrubbed stay allocated and recorded: better lost than leaked.
        let unplugged = |chunk| self.table.publish_unplugged(chunk);
        self.give_back_frames(run, core, unplugged, unplugged)
    }
}
