//! A zone's recovery when it is opened: interrupted deletions are finished, every VM's frame
//! table is checked, and the allocator is made to agree with the tables.

use std::sync::atomic::{AtomicU64, Ordering};

use llfree::{FrameId, FrameState, Recovery};

use super::directory::SlotState;
use super::layout::Header;
use super::{corrupted, Zone, ZoneError};
use crate::pool::Frame;

/// How the allocator's metadata was found when a zone was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryKind {
    /// Just created.
    #[default]
    Fresh,
    /// The last process shut down cleanly.
    Clean,
    /// The last process crashed: the counters were rebuilt from the bitfields.
    Crash,
    /// Other processes had the zone open: attached to it as it was.
    Attached,
}

impl From<Recovery> for RecoveryKind {
    fn from(recovery: Recovery) -> Self {
        match recovery {
            Recovery::Fresh => RecoveryKind::Fresh,
            Recovery::Clean => RecoveryKind::Clean,
            Recovery::Crash => RecoveryKind::Crash,
            Recovery::Attached => RecoveryKind::Attached,
        }
    }
}

impl RecoveryKind {
    /// "fresh", "clean", "crash" or "attached".
    pub fn name(self) -> &'static str {
        match self {
            RecoveryKind::Fresh => "fresh",
            RecoveryKind::Clean => "clean",
            RecoveryKind::Crash => "crash",
            RecoveryKind::Attached => "attached",
        }
    }
}

/// What opening a zone recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// How the allocator was found.
    pub kind: RecoveryKind,
    /// Frames the allocator held that no VM referenced (a crash between allocating and
    /// publishing, or unpublishing and freeing): scrubbed and freed.
    pub leaked_frames: u64,
    /// Frames a VM referenced that the allocator counted free: allocated again.
    pub lost_frames: u64,
    /// Processes that had died with the zone open: their part recovered.
    pub dead_processes: u64,
    /// Nanoseconds from opening the file to the end of the cross-check.
    pub nanos: u64,
}

impl RecoveryReport {
    /// Records the report in the zone header.
    pub(super) fn record(&self, header: &Header) {
        header.opens.fetch_add(1, Ordering::Relaxed);
        header.last_kind.store(self.kind as u64, Ordering::Relaxed);
        header
            .last_leaked
            .store(self.leaked_frames, Ordering::Relaxed);
        header.last_lost.store(self.lost_frames, Ordering::Relaxed);
        header.last_nanos.store(self.nanos, Ordering::Relaxed);
    }
}

/// The frames every VM references, and how they disagree with the allocator.
pub(super) struct Check {
    /// Frames (first 4 KiB frame numbers) allocated but referenced by no VM.
    pub leaked: Vec<u64>,
    /// Frames referenced but free.
    pub lost: Vec<u64>,
}

impl Zone {
    /// Collects the frames the VMs reference, checking every slot and entry, and compares them
    /// with the allocator.
    pub(super) fn check(&self) -> Result<Check, ZoneError> {
        let size = self.layout.frame_size;
        let count = self.layout.vm_chunks();
        let mut referenced = vec![0u64; count.div_ceil(64) as usize];
        for index in 0..self.layout.max_vms {
            let slot = self.slot(index);
            match slot.state() {
                SlotState::Free | SlotState::Deleting => continue,
                SlotState::Corrupted(state) => {
                    return Err(corrupted(
                        &self.path,
                        format!("VM slot {index} has the unknown state {state:#x}"),
                    ))
                }
                SlotState::Active => {}
            }
            let bad_slot = |what: &str| corrupted(&self.path, format!("VM slot {index}: {what}"));
            let name = slot.name().ok_or_else(|| bad_slot("invalid name"))?;
            let layout = slot
                .layout(&self.layout)
                .ok_or_else(|| bad_slot("invalid RAM layout"))?;
            let table: &[AtomicU64] = &self.table(index)[..layout.chunks() as usize];
            for (chunk, entry) in table.iter().enumerate() {
                let value = entry.load(Ordering::Acquire);
                if value == 0 {
                    continue;
                }
                let frame = value - 1;
                if !frame.is_multiple_of(size.base_frames()) || frame >= self.layout.frames {
                    return Err(corrupted(
                        &self.path,
                        format!("VM '{name}' chunk {chunk}: invalid frame entry {value:#x}"),
                    ));
                }
                let bit = frame / size.base_frames();
                let word = &mut referenced[bit as usize / 64];
                if *word & (1 << (bit % 64)) != 0 {
                    return Err(corrupted(
                        &self.path,
                        format!("VM '{name}' chunk {chunk}: frame {frame} is referenced twice"),
                    ));
                }
                *word |= 1 << (bit % 64);
            }
        }
        let (mut leaked, mut lost) = (Vec::new(), Vec::new());
        let states = self.pool.allocator().frame_states(size.order());
        for (bit, state) in states.enumerate() {
            let is_referenced = referenced[bit / 64] & (1 << (bit % 64)) != 0;
            let frame = bit as u64 * size.base_frames();
            match (is_referenced, state) {
                (_, FrameState::Mixed) => {
                    return Err(corrupted(
                        &self.path,
                        format!("frame {frame} is partly allocated"),
                    ))
                }
                (true, FrameState::Free) => lost.push(frame),
                (false, FrameState::Allocated) => leaked.push(frame),
                _ => {}
            }
        }
        Ok(Check { leaked, lost })
    }

    /// Recovers the directory after an open: finishes deletions, clears stale owners (this
    /// process holds the zone's lock, so none is alive), then makes the allocator agree with
    /// the frame tables. Returns the frames freed (leaked) and allocated again (lost).
    pub(super) fn recover(&self) -> Result<(u64, u64), ZoneError> {
        for index in 0..self.layout.max_vms {
            let slot = self.slot(index);
            match slot.state() {
                SlotState::Deleting => {
                    log::info!(
                        "zone {}: finishing the deletion of VM slot {index}",
                        self.path.display()
                    );
                    self.finish_deletion(index, false);
                }
                // Its process is gone: an ephemeral VM goes with it.
                SlotState::Active if slot.owner() != 0 && slot.ephemeral() => {
                    self.finish_deletion(index, false);
                }
                SlotState::Active if slot.owner() != 0 => slot.set_owner(0),
                _ => {}
            }
        }
        let Check { leaked, lost } = self.check()?;
        let size = self.layout.frame_size;
        for &index in &lost {
            self.pool
                .allocator()
                .get_at(FrameId(index as usize), size.order())
                .map_err(|e| {
                    corrupted(
                        &self.path,
                        format!("cannot allocate frame {index} again: {e}"),
                    )
                })?;
        }
        for &index in &leaked {
            let frame = Frame { index, size };
            self.pool
                .scrub(frame)
                .map_err(self.io_err("cannot scrub a leaked frame"))?;
            self.pool.free(0, frame).map_err(|e| {
                corrupted(&self.path, format!("cannot free leaked frame {index}: {e}"))
            })?;
        }
        let (leaked, lost) = (leaked.len() as u64, lost.len() as u64);
        if leaked + lost > 0 {
            log::info!(
                "zone {}: recovery freed {leaked} leaked frames and allocated {lost} lost ones \
                 again",
                self.path.display()
            );
        }
        Ok((leaked, lost))
    }
}
