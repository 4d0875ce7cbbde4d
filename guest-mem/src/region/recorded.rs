//! Mapping the frames a zone records for a VM ahead of the guest's touches.
//!
//! A VM in a zone that a process takes up again (a restart after a crash, a snapshot loaded)
//! finds a frame recorded for each chunk it had populated. They are mapped lazily, so that
//! taking the VM up costs nothing that grows with its memory; left to the guest, though, each
//! chunk's first touch is a fault through userfaultfd, a round trip of tens of microseconds
//! with the vCPU waiting. A fault handler thread therefore maps them while it has no fault to
//! serve: a run of consecutive frames per `mmap`, no frame allocated (they hold the VM's data
//! already), no page touched.

use super::run::FrameRun;
use super::{GuestRegion, RegionError};
use crate::pool::Frame;

impl GuestRegion {
    /// Maps the recorded frames of unpopulated chunks from chunk `*cursor` on, at most `max`
    /// chunks, and moves the cursor past the chunks it looked at; returns how many it mapped.
    /// The region is done when the cursor reaches its number of chunks. A chunk being
    /// populated, mapped or unplugged meanwhile is left alone. On an error the chunks of the
    /// failed run stay unpopulated (their faults map them) and the cursor is past them.
    pub(crate) fn map_recorded(
        &self,
        cursor: &mut usize,
        max: usize,
    ) -> Result<usize, RegionError> {
        let chunks = self.table.len();
        if !self.table.is_persistent() {
            *cursor = chunks;
            return Ok(0);
        }
        let mut mapped = 0;
        let mut pending: Option<FrameRun> = None;
        while *cursor < chunks && mapped + pending.map_or(0, |run| run.len) < max {
            let chunk = *cursor;
            *cursor += 1;
            if !self.table.claim_empty(chunk) {
                continue;
            }
            let Some(index) = self.table.persisted(chunk) else {
                self.table.publish_empty(chunk);
                continue;
            };
            let frame = Frame {
                index,
                size: self.chunk,
            };
            if pending.as_mut().is_some_and(|run| run.extend(chunk, frame)) {
                continue;
            }
            if let Some(run) = pending.replace(FrameRun::single(chunk, frame)) {
                match self.map_recorded_run(run) {
                    Ok(n) => mapped += n,
                    Err(e) => {
                        // The chunk claimed for the next run was not touched: give it back.
                        self.table.publish_empty(chunk);
                        return Err(e);
                    }
                }
            }
        }
        if let Some(run) = pending {
            mapped += self.map_recorded_run(run)?;
        }
        Ok(mapped)
    }

    /// Maps claimed `run` of recorded frames; on failure its chunks are left unpopulated.
    fn map_recorded_run(&self, run: FrameRun) -> Result<usize, RegionError> {
        if let Err(e) = self.map_run(run) {
            for chunk in run.chunks() {
                self.publish_empty_behind_placeholder(chunk);
            }
            return Err(e);
        }
        Ok(run.len)
    }
}
