//! Mapping every chunk's frame before the guest runs without touching a page
//! ([`crate::Populate::Mapped`]).
//!
//! Lazy population takes a chunk's frame at its first touch, through userfaultfd: a round trip
//! to the handler thread with the vCPU waiting, which in a nested VM goes through the outer
//! KVM's asynchronous page fault worker and costs milliseconds. Mapped ahead, the frames come
//! out of the pool when the memory is made (nothing is overcommitted), a run of consecutive
//! frames per `mmap`, and the host kernel fills the pages at the guest's first touches, as it
//! does for memory that is not a pool's; eager population instead faults every page in first.

use super::run::FrameRun;
use super::{GuestRegion, RegionError};
use crate::pool::CoreFrames;

impl GuestRegion {
    /// Gives every unpopulated chunk a fresh frame allocated with `core` and maps the frames, a
    /// run per `mmap`, touching no page. Chunks with a frame
    /// recorded in a zone are left to [`GuestRegion::map_recorded`] and their faults, unplugged
    /// ones stay unplugged. On an error the chunks mapped so far stay mapped (the caller drops
    /// the memory, which gives their frames back); the others stay unpopulated.
    pub(crate) fn map_fresh_frames(&self, core: &mut CoreFrames) -> Result<(), RegionError> {
        let mut pending: Option<FrameRun> = None;
        for chunk in 0..self.table.len() {
            if !self.table.claim_empty(chunk) {
                continue;
            }
            if self.table.persisted(chunk).is_some() {
                self.table.publish_empty(chunk);
                continue;
            }
            let Some(frame) = core.alloc(self.chunk) else {
                self.table.publish_empty(chunk);
                if let Some(run) = pending {
                    self.map_fresh_run(run, core)?;
                }
                return Err(RegionError::Exhausted(self.chunk.name()));
            };
            // Allocate, then record: as lazy population does.
            self.table.persist(chunk, frame.index);
            if pending.as_mut().is_some_and(|run| run.extend(chunk, frame)) {
                continue;
            }
            let next = FrameRun::single(chunk, frame);
            if let Some(run) = pending.replace(next) {
                if let Err(e) = self.map_fresh_run(run, core) {
                    self.abandon_fresh_run(next, core);
                    return Err(e);
                }
            }
        }
        pending.map_or(Ok(()), |run| self.map_fresh_run(run, core))
    }

    /// Maps claimed `run` of fresh frames; on failure gives them back and leaves its chunks
    /// unpopulated.
    fn map_fresh_run(&self, run: FrameRun, core: &mut CoreFrames) -> Result<(), RegionError> {
        self.map_run(run)
            .inspect_err(|_| self.abandon_fresh_run(run, core))
    }

    /// Gives the fresh frames of claimed `run` back (they never held data) and publishes its
    /// chunks unpopulated behind a placeholder (a failed MAP_FIXED may have removed the old one).
    fn abandon_fresh_run(&self, run: FrameRun, core: &mut CoreFrames) {
        self.free_fresh_frames(run, core);
        run.chunks()
            .for_each(|chunk| self.publish_empty_behind_placeholder(chunk));
    }
}
