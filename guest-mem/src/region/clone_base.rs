//! A clone's guest memory over its base's frames: each chunk the base has a frame for is
//! mapped privately from that frame of the zone, so that the clone reads the base's memory
//! without a copy and its writes copy pages into memory of its own process (the kernel's
//! copy-on-write), never into the base's frames. Runs of consecutive frames take one `mmap`.

use super::run::FrameRun;
use super::{GuestRegion, RegionError};
use crate::pool::Frame;
use crate::zone::VmTable;

impl GuestRegion {
    /// Maps every unpopulated chunk for which `base` (the base's frame table of this region)
    /// records a frame privately from that frame; returns how many chunks it mapped. They are
    /// file-backed ([`crate::frame_table::ChunkState::File`]): no frame of the clone's own. On
    /// an error the chunks of the failed run stay unpopulated.
    pub(crate) fn map_base(&self, base: &VmTable) -> Result<usize, RegionError> {
        let chunks = self.table.len().min(base.len());
        let mut mapped = 0;
        let mut pending: Option<FrameRun> = None;
        for chunk in 0..chunks {
            let Some(index) = base.frame(chunk) else {
                continue;
            };
            if !self.table.claim_empty(chunk) {
                continue;
            }
            let frame = Frame {
                index,
                size: self.chunk,
            };
            if pending.as_mut().is_some_and(|run| run.extend(chunk, frame)) {
                continue;
            }
            if let Some(run) = pending.replace(FrameRun::single(chunk, frame)) {
                if let Err(e) = self.map_base_run(run) {
                    // The chunk claimed for the next run was not touched: give it back.
                    self.table.publish_empty(chunk);
                    return Err(e);
                }
                mapped += run.len;
            }
        }
        if let Some(run) = pending {
            self.map_base_run(run)?;
            mapped += run.len;
        }
        Ok(mapped)
    }

    /// Maps claimed `run` of the base's frames privately and publishes its chunks
    /// file-backed; on failure they are left unpopulated.
    fn map_base_run(&self, run: FrameRun) -> Result<(), RegionError> {
        let (addr, _) = self.chunk_range(run.chunk);
        // SAFETY: the chunks belong to this region, are claimed by us and unpopulated: their
        // placeholders hold nothing anyone relies on. The private mapping never writes the
        // base's frames, and it is not registered with userfaultfd (the kernel serves its
        // faults from the zone's file).
        let mapped = unsafe {
            self.shared
                .pool
                .map_frames_private(run.first, run.len as u64, addr)
        };
        match mapped {
            Ok(()) => {
                run.chunks()
                    .for_each(|chunk| self.table.publish_file(chunk));
                Ok(())
            }
            Err(source) => {
                run.chunks()
                    .for_each(|chunk| self.publish_empty_behind_placeholder(chunk));
                Err(RegionError::MapFile { source })
            }
        }
    }
}
