//! Kept clones: a VM of the zone made a copy of another, frame by frame, so that it owns its
//! memory and survives a crash like any VM (where an ephemeral clone maps its base's frames
//! and lives only as long as its process).
//!
//! The copy is made as an ephemeral clone of the base, owned by this process: while it is
//! made, the base can be neither attached nor deleted, and a crash leaves nothing behind (the
//! next open deletes the ephemeral VM with the frames it was given). Each frame is allocated,
//! recorded (its owner, then the entry) and only then written, so that no frame holding data
//! is ever named by nobody. Once every frame is copied and the tables are durable, one store
//! makes the copy a VM of its own: neither ephemeral nor a clone.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::vm_table::{self, Owner};
use super::{Zone, ZoneError, ZoneVm, PAGE};
use crate::pool::Frame;
use crate::sys::mmap::{self, Mapping};

impl Zone {
    /// Makes `copy`, a clone this process attached ([`Zone::attach_clone`]) whose guest memory
    /// has not been built, a VM of its own: its base's frames are copied into frames of its own
    /// and the pages its base's balloon gave away are its too; the base stays as it is. Returns
    /// how many frames were copied; the copy is detached, to be attached like any VM. On an
    /// error it is deleted with the frames it was given.
    pub fn copy_vm(self: &Arc<Self>, copy: ZoneVm) -> Result<u64, ZoneError> {
        let name = copy.name.clone();
        let index = copy.index;
        let base_index = copy.base.as_ref().expect("a clone has a base").index;
        let chunks = copy.layout.chunks() as usize;
        let frame_size = self.layout.frame_size;
        let base_frames = frame_size.base_frames();
        let core = self.pool.own_core();
        let mut copied = 0;
        for chunk in 0..chunks {
            let entry = self.table(base_index)[chunk].load(Ordering::Acquire);
            let Some(from) = vm_table::entry_frame(entry, base_frames, self.layout.frames) else {
                continue;
            };
            let from = Frame {
                index: from,
                size: frame_size,
            };
            // Dropping `copy` on an error deletes it with the frames it was given.
            let to =
                self.pool
                    .alloc(core, frame_size)
                    .ok_or_else(|| ZoneError::NoFrameForCopy {
                        path: self.path.clone(),
                        name: name.clone(),
                    })?;
            let owner = Owner {
                slot: index,
                chunk: chunk as u64,
            };
            self.owners()[(to.index / base_frames) as usize].store(owner.word(), Ordering::Release);
            self.table(index)[chunk].store(to.index + 1, Ordering::Release);
            self.copy_frame(from, to)
                .map_err(self.io_err("cannot copy a frame"))?;
            copied += 1;
        }
        let pieces = chunks * base_frames as usize / 64;
        let from = self
            .map
            .words(self.pieces_offset(base_index), pieces as u64);
        let to = self.map.words(self.pieces_offset(index), pieces as u64);
        for (from, to) in from.iter().zip(to) {
            to.store(from.load(Ordering::Acquire), Ordering::Release);
        }
        let sync = self.io_err("cannot sync the copy's tables");
        self.map
            .sync(self.table_offset(index), self.layout.slot_tables)
            .and_then(|()| {
                self.map
                    .sync(self.layout.owners_off, self.layout.vm_chunks() * 8)
            })
            .map_err(sync)?;
        let slot = self.slot(index);
        slot.make_own_vm();
        slot.set_owner(0);
        self.map
            .sync(self.layout.dir_off + index * PAGE, PAGE)
            .map_err(self.io_err("cannot sync the directory"))?;
        // Detached as a VM of its own: dropping it deletes nothing.
        drop(copy);
        Ok(copied)
    }

    /// Copies frame `from` of the zone into frame `to`, durably (through a mapping of each:
    /// any zone's file or device maps shared).
    fn copy_frame(&self, from: Frame, to: Frame) -> std::io::Result<()> {
        let file = self.pool.backing_file();
        let len = from.size.bytes() as usize;
        let source = Mapping::shared_file(file.raw_fd(), self.pool.file_offset(from.index), len)?;
        let target = Mapping::shared_file(file.raw_fd(), self.pool.file_offset(to.index), len)?;
        // SAFETY: both are fresh mappings of `len` bytes of distinct frames: the source is the
        // base's (no process runs it), the target this copy's, which nobody maps yet.
        unsafe {
            std::ptr::copy_nonoverlapping(
                source.addr() as *const u8,
                target.addr() as *mut u8,
                len,
            );
        }
        mmap::sync(target.addr(), len, file.durability)
    }
}
