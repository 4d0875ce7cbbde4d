//! Repopulating chunks the guest takes back from its balloon, in runs of frames.
//!
//! A guest reuses the pages it deflates first (freed pages are hot), and the chunks they lie
//! in gave their frames back when they were inflated entirely: left to the guest, each would
//! be a fault through userfaultfd. Given a frame when the guest takes them back, before it is
//! told that it may use them, they are mapped like plugged memory: a core's frames come out of
//! LLFree in order, so one mmap maps a run of chunks, and the guest's first touch is the
//! kernel's own fault.

use super::run::FrameRun;
use super::{GuestRegion, RegionError};
use crate::pool::CoreFrames;

/// Chunks being given frames, a run of consecutive chunks and frames at a time. Dropping it
/// maps the pending run (errors ignored); [`Repopulation::finish`] reports them.
pub(crate) struct Repopulation<'a> {
    core: &'a mut CoreFrames,
    pending: Option<(&'a GuestRegion, FrameRun)>,
    populated: usize,
    /// The pool had no frame, or mapping failed: the other chunks wait for the guest's touch,
    /// as any fault does.
    stopped: bool,
}

impl<'a> Repopulation<'a> {
    /// Allocates frames with `core`.
    pub fn new(core: &'a mut CoreFrames) -> Self {
        Self {
            core,
            pending: None,
            populated: 0,
            stopped: false,
        }
    }

    /// Gives `chunk` of `region` a fresh frame if it has none: unpopulated, and (a VM in a
    /// zone) no frame recorded for it. A chunk that is mapped, unplugged or being populated by a
    /// fault is left alone. Chunks come in ascending order within a region. After an error
    /// (returned once) it adds nothing more.
    pub fn add(&mut self, region: &'a GuestRegion, chunk: usize) -> Result<(), RegionError> {
        if self.stopped || !region.table.claim_empty(chunk) {
            return Ok(());
        }
        if region.table.persisted(chunk).is_some() {
            // Its own frame, mapped ahead or on first touch.
            region.table.publish_empty(chunk);
            return Ok(());
        }
        let Some(frame) = self.core.alloc(region.chunk) else {
            region.table.publish_empty(chunk);
            self.stopped = true;
            return Ok(());
        };
        // Allocate, then record: a crash in between leaves a frame that the zone's recovery
        // finds referenced by no VM, and frees.
        region.table.persist(chunk, frame.index);
        if let Some((pending, run)) = &mut self.pending {
            if std::ptr::eq(*pending, region) && run.extend(chunk, frame) {
                return Ok(());
            }
        }
        let next = (region, FrameRun::single(chunk, frame));
        match self.pending.replace(next) {
            Some((pending, run)) => self.map(pending, run).inspect_err(|_| {
                self.abandon();
                self.stopped = true;
            }),
            None => Ok(()),
        }
    }

    /// Maps the pending run; returns how many chunks were given a frame, and the error of
    /// that last mapping if it failed.
    pub fn finish(mut self) -> (usize, Option<RegionError>) {
        let failed = match self.pending.take() {
            Some((region, run)) => self.map(region, run).err(),
            None => None,
        };
        (self.populated, failed)
    }

    /// Maps claimed `run` (see [`GuestRegion::map_run`]); on failure gives its frames back
    /// and leaves its chunks unpopulated.
    fn map(&mut self, region: &GuestRegion, run: FrameRun) -> Result<(), RegionError> {
        region
            .map_run(run)
            .inspect_err(|_| give_back(region, run, self.core))?;
        self.populated += run.len;
        Ok(())
    }

    /// Gives the pending run's frames back unmapped (after a failure).
    fn abandon(&mut self) {
        if let Some((region, run)) = self.pending.take() {
            give_back(region, run, self.core);
        }
    }
}

impl Drop for Repopulation<'_> {
    fn drop(&mut self) {
        if let Some((region, run)) = self.pending.take() {
            let _ = self.map(region, run);
        }
    }
}

/// Gives the fresh frames of claimed `run` (they never held data) back with `core` and
/// publishes its chunks unpopulated behind fresh placeholders (a failed MAP_FIXED may have
/// removed the old ones).
fn give_back(region: &GuestRegion, run: FrameRun, core: &mut CoreFrames) {
    region.free_fresh_frames(run, core);
    for chunk in run.chunks() {
        region.publish_empty_behind_placeholder(chunk);
    }
}
