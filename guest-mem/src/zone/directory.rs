//! The VM directory of a zone: one 4 KiB slot per VM, with its name, RAM layout, owner and state.
//!
//! A slot changes state with one atomic store, after everything it publishes was written:
//! * `FREE` → `CREATING` → `ACTIVE`: the slot's tables are zeroed and its fields written (and
//!   synced) while it is `CREATING`; an open finds a creation cut short and frees the slot.
//! * `ACTIVE` → `DELETING` → `FREE`: every frame-table entry is cleared (its frame freed) while the
//!   slot is `DELETING`; an open finds a deletion cut short and finishes it. The record's
//!   checksum is cleared before the slot is free, so that a free slot whose record checks is
//!   one whose state word was damaged.
//!
//! Every word of an active slot can be checked, so that damage to the directory is found, never
//! acted on: the state is one of three magic values; the record written once at creation (name,
//! layout, identity) has a checksum word; each word that changes later (owner, seal, flags,
//! the balloon's spare bytes, the wait) holds a 48-bit value and a 16-bit check of it and of
//! its place, in one store, so that a crash between two stores never looks like damage.
//! [`DirectorySlot::damage`] says what does not check.

use std::sync::atomic::{AtomicU64, Ordering};

use super::layout::{ZoneLayout, PAGE};
use crate::pool::FrameSize;

const FREE: u64 = 0;
const CREATING: u64 = u64::from_le_bytes(*b"LLFVMNEW");
const ACTIVE: u64 = u64::from_le_bytes(*b"LLFVMOK1");
const DELETING: u64 = u64::from_le_bytes(*b"LLFVMDEL");

/// The longest VM name, in bytes.
pub const MAX_NAME: usize = 64;
/// The most RAM regions a VM may have.
pub const MAX_REGIONS: usize = 8;

const STATE: usize = 0;
const OWNER: usize = 1;
const NAME_LEN: usize = 2;
const NAME: usize = 3;
const CHUNK_ORDER: usize = NAME + MAX_NAME / 8;
const REGION_COUNT: usize = CHUNK_ORDER + 1;
const REGIONS: usize = REGION_COUNT + 1;
const ID: usize = REGIONS + 2 * MAX_REGIONS;
const SEAL: usize = ID + 1;
const FLAGS: usize = SEAL + 1;
const SPARE: usize = FLAGS + 1;
const WAITING_SINCE: usize = SPARE + 1;
const WAITING_BYTES: usize = WAITING_SINCE + 1;
const CHECKSUM: usize = WAITING_BYTES + 1;
const SLOT_WORDS: usize = CHECKSUM + 1;
/// The record's words, written once at creation and covered by [`CHECKSUM`].
const RECORD: std::ops::RangeInclusive<usize> = NAME_LEN..=ID;
/// The words that change after creation, each checked on its own.
const CHECKED_WORDS: [(usize, &str); 6] = [
    (OWNER, "owner"),
    (SEAL, "seal"),
    (FLAGS, "flags"),
    (SPARE, "spare bytes"),
    (WAITING_SINCE, "wait start"),
    (WAITING_BYTES, "wait size"),
];

/// The largest value a checked word holds (48 bits): tokens and seals are drawn below it, byte
/// counts and times saturate at it.
pub const MAX_CHECKED_VALUE: u64 = (1 << 48) - 1;

/// The 16-bit check of `value` in word `index` of a slot: never all zeroes or all ones, so that
/// a zeroed or all-ones word fails it whatever its value bits.
fn check_of(index: usize, value: u64) -> u64 {
    let mut hash = (value ^ ((index as u64) << 52) ^ 0x9e37_79b9_7f4a_7c15)
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 31;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    match hash >> 48 {
        0 | 0xffff => 0x5a5a,
        check => check,
    }
}

/// Word `index` holding `value` (at most [`MAX_CHECKED_VALUE`]) and its check.
fn checked(index: usize, value: u64) -> u64 {
    let value = value.min(MAX_CHECKED_VALUE);
    value | check_of(index, value) << 48
}

/// The value of checked word `index`, if its check holds.
fn unchecked(index: usize, word: u64) -> Option<u64> {
    let value = word & MAX_CHECKED_VALUE;
    (word >> 48 == check_of(index, value)).then_some(value)
}

/// The checksum of a record's words: never 0, so that a zeroed checksum fails.
fn record_checksum(words: impl Iterator<Item = u64>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for word in words {
        hash = (hash ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        hash ^= hash >> 29;
    }
    hash.max(1)
}

/// Slot flag: the VM is deleted when its process leaves or dies.
const EPHEMERAL: u64 = 1;
/// Where the flags word keeps a clone's base: its slot + 1 in the bits from here (0: the VM
/// is no clone).
const CLONE_BASE_SHIFT: u32 = 16;

/// A VM's RAM: its chunk size and its regions as (guest address, size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmLayout {
    /// The chunk size (the zone's frame size).
    pub chunk_size: FrameSize,
    /// RAM regions as (guest address, size), multiples of the chunk size.
    pub regions: Vec<(u64, u64)>,
}

impl VmLayout {
    /// Chunks in all regions.
    pub fn chunks(&self) -> u64 {
        self.regions
            .iter()
            .map(|(_, size)| size / self.chunk_size.bytes())
            .sum()
    }

    /// Bytes of RAM.
    pub fn bytes(&self) -> u64 {
        self.regions.iter().map(|(_, size)| size).sum()
    }
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Nothing.
    Free,
    /// A VM being created.
    Creating,
    /// A VM.
    Active,
    /// A VM being deleted.
    Deleting,
    /// Anything else: the zone is damaged.
    Corrupted(u64),
}

/// One slot of the directory, seen through the zone mapping.
#[derive(Debug, Clone, Copy)]
pub struct DirectorySlot<'a> {
    words: &'a [AtomicU64],
}

impl<'a> DirectorySlot<'a> {
    /// The slot whose words are `words` (at least [`SLOT_WORDS`]).
    pub fn new(words: &'a [AtomicU64]) -> Self {
        debug_assert!(words.len() >= SLOT_WORDS && SLOT_WORDS * 8 <= PAGE as usize);
        Self { words }
    }

    fn get(&self, index: usize) -> u64 {
        self.words[index].load(Ordering::Acquire)
    }

    fn set(&self, index: usize, value: u64) {
        self.words[index].store(value, Ordering::Release);
    }

    /// The value of checked word `index`, its check bits dropped (see [`Self::damage`]).
    fn get_checked(&self, index: usize) -> u64 {
        self.get(index) & MAX_CHECKED_VALUE
    }

    fn set_checked(&self, index: usize, value: u64) {
        self.set(index, checked(index, value));
    }

    /// What of the slot does not check, `None` if all does (or it is being created or
    /// deleted, which recovery finishes without its record): an active slot's every word; a
    /// free slot's record, which must not check. A slot with damage must not be acted on: its
    /// VM is neither attached nor deleted, and its frames stay its, until a person decides.
    pub fn damage(&self) -> Option<String> {
        let record_checks = record_checksum(RECORD.map(|i| self.get(i))) == self.get(CHECKSUM);
        match self.state() {
            SlotState::Creating | SlotState::Deleting => return None,
            SlotState::Corrupted(state) => {
                return Some(format!("its state word is unknown ({state:#x})"));
            }
            SlotState::Free if record_checks => {
                return Some("its state word reads free, yet its VM's record checks".into());
            }
            SlotState::Free => return None,
            SlotState::Active if !record_checks => {
                return Some("its record (name, RAM layout, identity) fails its checksum".into());
            }
            SlotState::Active => {}
        }
        let bad: Vec<&str> = CHECKED_WORDS
            .iter()
            .filter(|&&(index, _)| unchecked(index, self.get(index)).is_none())
            .map(|&(_, name)| name)
            .collect();
        match bad.is_empty() {
            true => None,
            false => Some(format!("its {} word fails its check", bad.join(", "))),
        }
    }

    /// Makes a damaged slot whose record checks (or whose record a person accepts as it
    /// reads) hold again: the record's checksum written anew, and every checked word that
    /// fails reset to what a VM without a process has (no owner, no seal, not ephemeral, no
    /// spare bytes, no wait); a state word that reads anything but active, active again.
    pub fn accept_as_read(&self) {
        self.set(CHECKSUM, record_checksum(RECORD.map(|i| self.get(i))));
        for (index, _) in CHECKED_WORDS {
            if unchecked(index, self.get(index)).is_none() {
                self.set_checked(index, 0);
            }
        }
        self.set(STATE, ACTIVE);
    }

    /// The state.
    pub fn state(&self) -> SlotState {
        match self.get(STATE) {
            FREE => SlotState::Free,
            CREATING => SlotState::Creating,
            ACTIVE => SlotState::Active,
            DELETING => SlotState::Deleting,
            other => SlotState::Corrupted(other),
        }
    }

    /// Marks a free slot as being created (its tables and fields are written next).
    pub fn begin_creation(&self) {
        self.set(STATE, CREATING);
    }

    /// Publishes the slot as active (its fields written before).
    pub fn activate(&self) {
        self.set(STATE, ACTIVE);
    }

    /// Marks the slot as being deleted.
    pub fn mark_deleting(&self) {
        self.set(STATE, DELETING);
    }

    /// Frees the slot (being created or deleted): its record's checksum is cleared first.
    pub fn release(&self) {
        self.set(CHECKSUM, 0);
        self.set(STATE, FREE);
    }

    /// The token of the VMM process attached to the VM (see `processes`), 0 for none.
    pub fn owner(&self) -> u64 {
        self.get_checked(OWNER)
    }

    /// Records the attached VMM's token (0: none; at most [`MAX_CHECKED_VALUE`]).
    pub fn set_owner(&self, token: u64) {
        self.set_checked(OWNER, token);
    }

    /// The name; `None` if the recorded one is not a valid name.
    pub fn name(&self) -> Option<String> {
        let len = self.get(NAME_LEN) as usize;
        if len == 0 || len > MAX_NAME {
            return None;
        }
        let bytes: Vec<u8> = (NAME..NAME + MAX_NAME / 8)
            .flat_map(|i| self.get(i).to_le_bytes())
            .take(len)
            .collect();
        let name = String::from_utf8(bytes).ok()?;
        check_name(&name).is_ok().then_some(name)
    }

    /// The RAM layout; `None` if the recorded one is malformed or does not fit `zone`.
    pub fn layout(&self, zone: &ZoneLayout) -> Option<VmLayout> {
        if self.get(CHUNK_ORDER) != zone.frame_size.order().0 as u64 {
            return None;
        }
        let count = self.get(REGION_COUNT) as usize;
        if count == 0 || count > MAX_REGIONS {
            return None;
        }
        let regions = (0..count)
            .map(|i| (self.get(REGIONS + 2 * i), self.get(REGIONS + 2 * i + 1)))
            .collect();
        let layout = VmLayout {
            chunk_size: zone.frame_size,
            regions,
        };
        check_layout(&layout, zone).is_ok().then_some(layout)
    }

    /// The VM's identity: random, set when it was created (another VM of the same name later
    /// has another).
    pub fn id(&self) -> u64 {
        self.get(ID)
    }

    /// Writes the name, layout (checked by the caller) and identity of a slot about to be
    /// activated.
    pub fn write(&self, name: &str, layout: &VmLayout, id: u64) {
        let mut bytes = [0u8; MAX_NAME];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        for (i, word) in bytes.chunks(8).enumerate() {
            self.set(
                NAME + i,
                u64::from_le_bytes(word.try_into().expect("8 bytes")),
            );
        }
        self.set(NAME_LEN, name.len() as u64);
        self.set(CHUNK_ORDER, layout.chunk_size.order().0 as u64);
        self.set(REGION_COUNT, layout.regions.len() as u64);
        for (i, (start, size)) in layout.regions.iter().enumerate() {
            self.set(REGIONS + 2 * i, *start);
            self.set(REGIONS + 2 * i + 1, *size);
        }
        self.set(ID, id);
        for (index, _) in CHECKED_WORDS {
            self.set_checked(index, 0);
        }
        self.set(CHECKSUM, record_checksum(RECORD.map(|i| self.get(i))));
    }

    /// Since when (milliseconds since the Unix epoch) the VM has waited for how many bytes of
    /// memory, as its VMM last recorded; `None` when it does not wait.
    pub fn waiting(&self) -> Option<(u64, u64)> {
        match (
            self.get_checked(WAITING_SINCE),
            self.get_checked(WAITING_BYTES),
        ) {
            (0, _) => None,
            (since, bytes) => Some((since, bytes)),
        }
    }

    /// Records that the VM waits for memory (see [`Self::waiting`]), or no longer does.
    pub fn set_waiting(&self, waiting: Option<(u64, u64)>) {
        let (since, bytes) = waiting.unwrap_or((0, 0));
        self.set_checked(WAITING_BYTES, bytes);
        self.set_checked(WAITING_SINCE, since);
    }

    /// The bytes the VM's guest could give back, as its VMM last saw them (see
    /// `ZoneVm::set_spare`).
    pub fn spare(&self) -> u64 {
        self.get_checked(SPARE)
    }

    /// Records the bytes the VM's guest could give back (saturating at
    /// [`MAX_CHECKED_VALUE`]).
    pub fn set_spare(&self, bytes: u64) {
        self.set_checked(SPARE, bytes);
    }

    /// The seal of the VM's memory: set by a snapshot, cleared when the guest runs again; 0
    /// for none.
    pub fn seal(&self) -> u64 {
        self.get_checked(SEAL)
    }

    /// Whether the VM is deleted when its process leaves or dies.
    pub fn ephemeral(&self) -> bool {
        self.get_checked(FLAGS) & EPHEMERAL != 0
    }

    /// Makes the VM ephemeral.
    pub fn set_ephemeral(&self) {
        self.set_checked(FLAGS, self.get_checked(FLAGS) | EPHEMERAL);
    }

    /// The slot of the VM whose frames this VM (a clone) maps, if it is a clone.
    pub fn clone_base(&self) -> Option<u64> {
        (self.get_checked(FLAGS) >> CLONE_BASE_SHIFT).checked_sub(1)
    }

    /// Makes a clone a VM of its own: neither ephemeral nor tied to a base (a kept clone whose
    /// frames are all copied).
    pub fn make_own_vm(&self) {
        self.set_checked(FLAGS, 0);
    }

    /// Makes the VM an ephemeral clone of the VM in slot `base`.
    pub fn set_clone_of(&self, base: u64) {
        self.set_checked(FLAGS, EPHEMERAL | (base + 1) << CLONE_BASE_SHIFT);
    }

    /// Sets (or, with 0, clears) the seal (at most [`MAX_CHECKED_VALUE`]).
    pub fn set_seal(&self, seal: u64) {
        self.set_checked(SEAL, seal);
    }
}

/// Checks a VM name: 1 to 64 bytes of letters, digits, `.`, `_` and `-`, not starting with `.`
/// or `-`.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err("a VM name has 1 to 64 characters");
    }
    if name.starts_with(['.', '-']) {
        return Err("a VM name does not start with '.' or '-'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err("a VM name consists of letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

/// Checks that a RAM layout fits a zone: 1 to [`MAX_REGIONS`] sorted, non-overlapping regions
/// of whole chunks of the zone's frame size, no more chunks than the zone has frames.
pub fn check_layout(layout: &VmLayout, zone: &ZoneLayout) -> Result<(), String> {
    let chunk = zone.frame_size.bytes();
    if layout.chunk_size != zone.frame_size {
        return Err(format!(
            "its chunks must be the zone's frames ({})",
            zone.frame_size.name()
        ));
    }
    if layout.regions.is_empty() || layout.regions.len() > MAX_REGIONS {
        return Err(format!("it must have 1 to {MAX_REGIONS} RAM regions"));
    }
    let mut end = 0u64;
    for &(start, size) in &layout.regions {
        if size == 0 || !start.is_multiple_of(chunk) || !size.is_multiple_of(chunk) {
            return Err(format!(
                "RAM region {start:#x}+{size:#x} is empty or not a multiple of the zone's \
                 frame size ({})",
                zone.frame_size.name()
            ));
        }
        if start < end || start.checked_add(size).is_none() {
            return Err(format!("RAM region {start:#x}+{size:#x} overlaps or wraps"));
        }
        end = start + size;
    }
    if layout.chunks() > zone.vm_chunks() {
        return Err(format!(
            "its {} MiB of RAM exceed the zone's {} MiB",
            layout.bytes() >> 20,
            zone.data_len() >> 20
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_words() -> Vec<AtomicU64> {
        (0..PAGE / 8).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn a_written_slot_reads_back() {
        let zone = ZoneLayout::new(FrameSize::Huge, 512 * 64, 4, 4096);
        let words = slot_words();
        let slot = DirectorySlot::new(&words);
        assert_eq!(slot.state(), SlotState::Free);
        let layout = VmLayout {
            chunk_size: FrameSize::Huge,
            regions: vec![(0, 32 << 20), (1 << 32, 64 << 20)],
        };
        slot.write("vm-1.test_a", &layout, 42);
        slot.activate();
        assert_eq!(slot.state(), SlotState::Active);
        assert_eq!(slot.name().as_deref(), Some("vm-1.test_a"));
        assert_eq!(slot.layout(&zone), Some(layout));
        assert_eq!(slot.id(), 42);
        slot.mark_deleting();
        assert_eq!(slot.state(), SlotState::Deleting);
        words[STATE].store(7, Ordering::Relaxed);
        assert_eq!(slot.state(), SlotState::Corrupted(7));
    }

    #[test]
    fn a_clone_s_slot_names_its_base_and_is_ephemeral() {
        let words = slot_words();
        let slot = DirectorySlot::new(&words);
        let layout = VmLayout {
            chunk_size: FrameSize::Huge,
            regions: vec![(0, 2 << 20)],
        };
        slot.write("c", &layout, 1);
        slot.activate();
        assert_eq!((slot.clone_base(), slot.ephemeral()), (None, false));
        slot.set_clone_of(0);
        assert_eq!((slot.clone_base(), slot.ephemeral()), (Some(0), true));
        slot.set_clone_of(1023);
        assert_eq!(slot.clone_base(), Some(1023));
        assert_eq!(slot.damage(), None);
    }

    #[test]
    fn hostile_slots_are_rejected() {
        let zone = ZoneLayout::new(FrameSize::Huge, 512 * 64, 4, 4096);
        let words = slot_words();
        let slot = DirectorySlot::new(&words);
        slot.write(
            "a",
            &VmLayout {
                chunk_size: FrameSize::Huge,
                regions: vec![(0, 2 << 20)],
            },
            1,
        );
        words[NAME_LEN].store(65, Ordering::Relaxed);
        assert_eq!(slot.name(), None);
        words[NAME_LEN].store(1, Ordering::Relaxed);
        words[NAME].store(u64::from(b'/'), Ordering::Relaxed);
        assert_eq!(slot.name(), None);
        words[REGION_COUNT].store(9, Ordering::Relaxed);
        assert_eq!(slot.layout(&zone), None);
        words[REGION_COUNT].store(1, Ordering::Relaxed);
        words[REGIONS + 1].store(256 << 20, Ordering::Relaxed);
        assert_eq!(slot.layout(&zone), None, "more RAM than the zone");
        words[REGIONS + 1].store(3 << 20, Ordering::Relaxed);
        assert_eq!(slot.layout(&zone), None, "not whole chunks");
    }

    #[test]
    fn any_damaged_word_of_an_active_slot_is_found_and_accepting_it_resets_the_word() {
        let zone = ZoneLayout::new(FrameSize::Huge, 512 * 64, 4, 4096);
        let words = slot_words();
        let slot = DirectorySlot::new(&words);
        let layout = VmLayout {
            chunk_size: FrameSize::Huge,
            regions: vec![(0, 32 << 20)],
        };
        slot.begin_creation();
        slot.write("precious", &layout, 42);
        slot.activate();
        slot.set_owner(7);
        slot.set_seal(MAX_CHECKED_VALUE);
        slot.set_spare(u64::MAX);
        assert_eq!(slot.spare(), MAX_CHECKED_VALUE);
        slot.set_waiting(Some((1, 2)));
        assert_eq!(slot.damage(), None);
        // Every word of the slot, zeroed, all ones, or one bit flipped.
        for (index, word) in words.iter().enumerate().take(SLOT_WORDS) {
            for damaged in [0, u64::MAX, word.load(Ordering::Relaxed) ^ 1 << 60] {
                let kept = word.swap(damaged, Ordering::Relaxed);
                if kept == damaged {
                    continue;
                }
                // Name bytes past the name's end too: the checksum covers them.
                assert!(
                    slot.damage().is_some(),
                    "word {index} = {damaged:#x} not found"
                );
                word.store(kept, Ordering::Relaxed);
            }
        }
        assert_eq!(slot.damage(), None);
        // All ones in the flags (which would make the VM ephemeral): found; accepted, the VM
        // is not ephemeral and keeps its name and layout.
        words[FLAGS].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(
            slot.damage().as_deref(),
            Some("its flags word fails its check")
        );
        slot.accept_as_read();
        assert_eq!(slot.damage(), None);
        assert!(!slot.ephemeral());
        assert_eq!(slot.owner(), 7);
        assert_eq!(slot.name().as_deref(), Some("precious"));
        assert_eq!(slot.layout(&zone).as_ref(), Some(&layout));
        // Released, its record no longer checks: free; a creation cut short is not damage.
        slot.mark_deleting();
        assert_eq!(slot.damage(), None);
        slot.release();
        assert_eq!((slot.state(), slot.damage()), (SlotState::Free, None));
        slot.begin_creation();
        slot.write("again", &layout, 43);
        assert_eq!(slot.damage(), None);
    }

    #[test]
    fn a_checked_word_is_never_all_zeroes_or_all_ones() {
        for index in 0..SLOT_WORDS {
            for value in [0, 1, MAX_CHECKED_VALUE, 0xdead_beef] {
                let word = checked(index, value);
                assert!(word != 0 && word != u64::MAX, "{index} {value:#x}");
                assert_eq!(unchecked(index, word), Some(value));
            }
            assert_eq!(unchecked(index, 0), None);
            assert_eq!(unchecked(index, u64::MAX), None);
        }
    }

    #[test]
    fn names_are_checked() {
        for good in ["a", "vm-1", "A.b_c", &"x".repeat(64)] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in ["", ".x", "-x", "a/b", "a b", "ä", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
