//! A zone's recovery when it is opened: interrupted deletions are finished, every VM's frame
//! table is checked, and the allocator is made to agree with the tables.

use std::sync::atomic::{AtomicU64, Ordering};

use llfree::{FrameId, FrameState, Recovery};

use super::directory::SlotState;
use super::layout::ZoneHeader;
use super::vm_table::{entry_frame, Owner, DAMAGED, EMPTY};
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
    /// Frame-table entries or owners that were damaged and were repaired from the other: the
    /// VMs' memory is as it was.
    pub repaired_entries: u64,
    /// VM chunks whose memory recovery could not find (entry and owner both damaged): marked
    /// damaged, the VM is refused until the loss is accepted.
    pub damaged_chunks: u64,
    /// Leaked frames that held data: no VM's entry nor any owner named them, yet only a VM's
    /// memory holds data (every other frame is scrubbed before it is unpublished). Some VM lost
    /// memory and nothing tells which.
    pub orphaned_frames: u64,
    /// Processes that had died with the zone open: their part recovered.
    pub dead_processes: u64,
    /// Nanoseconds from opening the file to the end of the cross-check.
    pub nanos: u64,
}

impl RecoveryReport {
    /// Records the report in the zone header.
    pub(super) fn record(&self, header: &ZoneHeader) {
        header.opens.fetch_add(1, Ordering::Relaxed);
        header.last_kind.store(self.kind as u64, Ordering::Relaxed);
        header
            .last_leaked
            .store(self.leaked_frames, Ordering::Relaxed);
        header.last_lost.store(self.lost_frames, Ordering::Relaxed);
        header.last_nanos.store(self.nanos, Ordering::Relaxed);
        header
            .last_repaired
            .store(self.repaired_entries, Ordering::Relaxed);
        header
            .last_damaged
            .store(self.damaged_chunks, Ordering::Relaxed);
        header
            .last_orphaned
            .store(self.orphaned_frames, Ordering::Relaxed);
    }
}

/// The frames every VM references, and how they disagree with the allocator.
pub(super) struct Check {
    /// Frames (first 4 KiB frame numbers) allocated but referenced by no VM.
    pub leaked: Vec<u64>,
    /// Frames referenced but free.
    pub lost: Vec<u64>,
}

/// What the repair of the frame tables did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Repair {
    /// Entries and owners restored from the other.
    pub repaired: u64,
    /// Chunks marked damaged.
    pub damaged: u64,
}

/// What recovery did to the frame tables and the allocator.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recovered {
    pub leaked: u64,
    pub lost: u64,
    pub orphaned: u64,
    pub repair: Repair,
}

/// What a directory slot is to recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotUse {
    /// No VM (free, or being created or deleted).
    Unused,
    /// An active VM of this many chunks, its every word checked.
    Vm(u64),
    /// A slot with damage (see `DirectorySlot::damage`): its frames, whichever its table or their
    /// owners name, stay allocated and untouched until a person decides.
    Quarantined,
}

impl Zone {
    /// What every slot is.
    pub(super) fn slot_uses(&self) -> Vec<SlotUse> {
        (0..self.layout.max_vms)
            .map(|index| self.slot_use(index))
            .collect()
    }

    /// What slot `index` is.
    pub(super) fn slot_use(&self, index: u64) -> SlotUse {
        let slot = self.slot(index);
        if slot.damage().is_some() {
            return SlotUse::Quarantined;
        }
        match slot.state() {
            SlotState::Active => match (slot.name(), slot.layout(&self.layout)) {
                (Some(_), Some(layout)) => SlotUse::Vm(layout.chunks()),
                _ => SlotUse::Quarantined,
            },
            _ => SlotUse::Unused,
        }
    }

    /// The chunk count of every slot: `Some` for an active VM, `None` for anything else.
    fn active_slots(&self) -> Vec<Option<u64>> {
        self.slot_uses()
            .into_iter()
            .map(|usage| match usage {
                SlotUse::Vm(chunks) => Some(chunks),
                SlotUse::Unused | SlotUse::Quarantined => None,
            })
            .collect()
    }

    /// What is damaged in quarantined slot `index`.
    pub(super) fn slot_damage(&self, index: u64) -> String {
        self.slot(index)
            .damage()
            .unwrap_or_else(|| "its name or RAM layout cannot be read".into())
    }

    /// Whether frame-owner word `word` names a quarantined slot.
    fn names_quarantined(&self, word: u64, uses: &[SlotUse]) -> bool {
        Owner::from_word(word)
            .is_some_and(|owner| uses.get(owner.slot as usize) == Some(&SlotUse::Quarantined))
    }

    /// The frame-table entry of `owner` (a chunk of an active VM).
    fn entry(&self, owner: Owner) -> &AtomicU64 {
        &self.table(owner.slot)[owner.chunk as usize]
    }

    /// Collects the frames the VMs reference, checking every slot and entry, and compares them
    /// with the allocator.
    pub(super) fn check(&self) -> Result<Check, ZoneError> {
        let size = self.layout.frame_size;
        let count = self.layout.vm_chunks();
        let mut referenced = vec![0u64; count.div_ceil(64) as usize];
        let uses = self.slot_uses();
        for (index, usage) in uses.iter().enumerate() {
            let chunks = match *usage {
                SlotUse::Vm(chunks) => chunks,
                // Every entry its table may hold.
                SlotUse::Quarantined => count,
                SlotUse::Unused => continue,
            };
            let table: &[AtomicU64] = &self.table(index as u64)[..chunks as usize];
            for (chunk, entry) in table.iter().enumerate() {
                let value = entry.load(Ordering::Acquire);
                if value == EMPTY || value == DAMAGED {
                    continue;
                }
                let name = || self.slot(index as u64).name().unwrap_or_default();
                let Some(frame) = entry_frame(value, size.base_frames(), self.layout.frames) else {
                    if *usage == SlotUse::Quarantined {
                        continue;
                    }
                    return Err(corrupted(
                        &self.path,
                        format!(
                            "VM '{}' chunk {chunk}: invalid frame entry {value:#x}",
                            name()
                        ),
                    ));
                };
                let bit = frame / size.base_frames();
                let word = &mut referenced[bit as usize / 64];
                if *word & (1 << (bit % 64)) != 0 {
                    return Err(corrupted(
                        &self.path,
                        format!(
                            "VM '{}' chunk {chunk}: frame {frame} is referenced twice",
                            name()
                        ),
                    ));
                }
                *word |= 1 << (bit % 64);
            }
        }
        // A frame whose owner names a quarantined slot is its too, whatever its table says.
        for (bit, owner) in self.owners().iter().enumerate() {
            if self.names_quarantined(owner.load(Ordering::Acquire), &uses) {
                referenced[bit / 64] |= 1 << (bit % 64);
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

    /// Makes every VM's frame table and the owner map agree (see `vm_table`), alone with the
    /// zone: a pair that agrees stands; an owner without entry whose frame holds only zeroes is
    /// a crash's, and is dropped; otherwise the word that disagrees is restored from the other
    /// (an owner whose frame holds data restores its entry; an entry whose frame no owner
    /// claims restores its owner). An entry that neither way explains is marked damaged.
    ///
    /// One pass over the tables and one over the owners find the pairs that agree (all of them,
    /// unless the zone was damaged); only the rest is looked at closer.
    fn repair_tables(&self) -> Result<Repair, ZoneError> {
        let base = self.layout.frame_size.base_frames();
        let uses = self.slot_uses();
        let slots = self.active_slots();
        let owners = self.owners();
        let frame_of = |value: u64| entry_frame(value, base, self.layout.frames);
        // Pairs that agree, and the entries that do not; the owners that name a quarantined
        // slot stand as they are.
        let mut settled: Vec<bool> = owners
            .iter()
            .map(|owner| self.names_quarantined(owner.load(Ordering::Acquire), &uses))
            .collect();
        let mut odd_entries = Vec::new();
        for (slot, chunks) in slots.iter().enumerate() {
            let Some(chunks) = *chunks else { continue };
            let table = &self.table(slot as u64)[..chunks as usize];
            for (chunk, entry) in table.iter().enumerate() {
                let value = entry.load(Ordering::Acquire);
                if value == EMPTY || value == DAMAGED {
                    continue;
                }
                let owner = Owner {
                    slot: slot as u64,
                    chunk: chunk as u64,
                };
                match frame_of(value).map(|frame| (frame / base) as usize) {
                    Some(bit)
                        if !settled[bit] && owners[bit].load(Ordering::Acquire) == owner.word() =>
                    {
                        settled[bit] = true;
                    }
                    _ => odd_entries.push(owner),
                }
            }
        }
        let odd_owners: Vec<usize> = (0..owners.len())
            .filter(|&bit| !settled[bit] && owners[bit].load(Ordering::Acquire) != 0)
            .collect();
        if odd_entries.is_empty() && odd_owners.is_empty() {
            return Ok(Repair::default());
        }
        self.repair_odd(&slots, &mut settled, &odd_entries, &odd_owners)
    }

    /// Repairs the entries and owners that [`Self::repair_tables`] found disagreeing.
    fn repair_odd(
        &self,
        slots: &[Option<u64>],
        settled: &mut [bool],
        odd_entries: &[Owner],
        odd_owners: &[usize],
    ) -> Result<Repair, ZoneError> {
        let base = self.layout.frame_size.base_frames();
        let owners = self.owners();
        let frame_of = |value: u64| entry_frame(value, base, self.layout.frames);
        let names = |owner: Owner| self.slot(owner.slot).name().unwrap_or_default();
        let mut repair = Repair::default();
        // An owner that names a chunk of an active VM; any other word is cleared.
        let claim = |bit: usize| {
            let owner = Owner::from_word(owners[bit].load(Ordering::Acquire))?;
            let chunks = (*slots.get(owner.slot as usize)?)?;
            (owner.chunk < chunks).then_some(owner)
        };
        let agrees = |chunk: Owner, settled: &[bool]| {
            let value = self.entry(chunk).load(Ordering::Acquire);
            frame_of(value).is_some_and(|frame| {
                let bit = (frame / base) as usize;
                settled[bit] && claim(bit) == Some(chunk)
            })
        };
        // Owners without an entry that agrees: a crash's (the frame holds only zeroes), a
        // damaged entry, or a damaged owner.
        for &bit in odd_owners {
            let Some(chunk) = claim(bit) else {
                owners[bit].store(0, Ordering::Release);
                continue;
            };
            let frame = bit as u64 * base;
            let entry = self.entry(chunk);
            let zeroes = || {
                self.pool
                    .holds_only_zeroes(Frame {
                        index: frame,
                        size: self.layout.frame_size,
                    })
                    .map_err(self.io_err("cannot read a frame"))
            };
            if agrees(chunk, settled) || (entry.load(Ordering::Acquire) == EMPTY && zeroes()?) {
                owners[bit].store(0, Ordering::Release);
                continue;
            }
            log::warn!(
                "zone {}: VM '{}' chunk {}: its frame-table entry was damaged ({:#x}); \
                 restored it from the frame's owner (frame {frame})",
                self.path.display(),
                names(chunk),
                chunk.chunk,
                entry.load(Ordering::Acquire),
            );
            entry.store(frame + 1, Ordering::Release);
            settled[bit] = true;
            repair.repaired += 1;
        }
        // Entries without an owner that agrees: a damaged owner, or a damaged entry whose frame
        // nobody can tell.
        for &chunk in odd_entries {
            let entry = self.entry(chunk);
            let value = entry.load(Ordering::Acquire);
            if agrees(chunk, settled) {
                continue;
            }
            match frame_of(value).map(|frame| (frame / base) as usize) {
                Some(bit) if !settled[bit] => {
                    log::warn!(
                        "zone {}: VM '{}' chunk {}: the owner of its frame {} was damaged; \
                         restored it from the entry",
                        self.path.display(),
                        names(chunk),
                        chunk.chunk,
                        value - 1,
                    );
                    owners[bit].store(chunk.word(), Ordering::Release);
                    settled[bit] = true;
                    repair.repaired += 1;
                }
                _ => {
                    log::warn!(
                        "zone {}: VM '{}' chunk {}: its frame-table entry ({value:#x}) is \
                         damaged and no frame's owner names the chunk: its memory is lost",
                        self.path.display(),
                        names(chunk),
                        chunk.chunk,
                    );
                    entry.store(DAMAGED, Ordering::Release);
                    repair.damaged += 1;
                }
            }
        }
        Ok(repair)
    }

    /// Recovers the directory after an open: finishes deletions, clears stale owners (this
    /// process holds the zone's lock, so none is alive), repairs the frame tables, then makes
    /// the allocator agree with them.
    pub(super) fn recover(&self) -> Result<Recovered, ZoneError> {
        for index in 0..self.layout.max_vms {
            let slot = self.slot(index);
            if self.slot_use(index) == SlotUse::Quarantined {
                log::warn!(
                    "zone {}: VM slot {index} (recorded name '{}') is damaged: {}; its frames \
                     are kept and nothing is done to it until a person decides (`vmm zone \
                     inspect`)",
                    self.path.display(),
                    slot.name().unwrap_or_default(),
                    self.slot_damage(index),
                );
                continue;
            }
            match slot.state() {
                SlotState::Creating => {
                    log::info!(
                        "zone {}: freeing VM slot {index}, whose creation was cut short",
                        self.path.display()
                    );
                    self.finish_deletion(index, false);
                }
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
        let repair = self.repair_tables()?;
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
        let mut orphaned = 0;
        for &index in &leaked {
            let frame = Frame { index, size };
            let zeroes = self.pool.holds_only_zeroes(frame);
            if !zeroes.map_err(self.io_err("cannot read a leaked frame"))? {
                log::warn!(
                    "zone {}: frame {index} held data but no VM's frame table nor its owner \
                     names it (both damaged): some VM lost a chunk of memory, and nothing tells \
                     which; scrubbed and freed",
                    self.path.display()
                );
                orphaned += 1;
            }
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
        Ok(Recovered {
            leaked,
            lost,
            orphaned,
            repair,
        })
    }
}
