//! Persistent zones: a VM's memory in a zone file outlives the process, through clean exits and
//! SIGKILL crashes, and the zone's recovery loses and leaks no frame.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::{TempFile, MIB};
use guest_mem::zone::{RecoveryKind, VmLayout, Zone, ZoneConfig, ZoneError, DEFAULT_MAX_VMS};
use guest_mem::{FrameSize, GuestMemory, MemoryConfig, Populate, Population};
use vm_memory::{Bytes, GuestAddress};

/// The environment variable that turns [`crashing_child`] into a child process's work.
const CHILD_ENV: &str = "GUEST_MEM_ZONE_CHILD";

fn zone_config(size: u64) -> ZoneConfig {
    ZoneConfig {
        size,
        frame_size: FrameSize::Huge,
        max_vms: DEFAULT_MAX_VMS,
    }
}

fn layout(size: u64) -> VmLayout {
    VmLayout {
        chunk_size: FrameSize::Huge,
        regions: vec![(0, size)],
    }
}

fn memory_config(size: u64) -> MemoryConfig {
    common::memory_config(size, 1)
}

fn open_memory(zone: &Arc<Zone>, name: &str, size: u64) -> GuestMemory {
    let vm = zone.attach(name, &layout(size)).expect("attach");
    GuestMemory::new_in_zone(vm, memory_config(size), &Population::default()).expect("memory")
}

fn read_text(memory: &GuestMemory, addr: u64) -> [u8; 16] {
    let mut text = [0u8; 16];
    memory
        .read_slice(&mut text, GuestAddress(addr))
        .expect("read");
    text
}

#[test]
fn a_vm_keeps_its_memory_across_closing_and_reopening_the_zone() {
    let path = TempFile::new("zone-reopen");
    Zone::create(&path.0, &zone_config(64 * MIB)).expect("create");
    let zone = Zone::open(&path.0, 4).expect("open");
    assert_eq!(zone.recovery().kind, RecoveryKind::Clean);
    let memory = open_memory(&zone, "vm1", 32 * MIB);
    memory
        .write_slice(b"persistent hello", GuestAddress(20 * MIB + 4096))
        .expect("write");
    memory
        .write_slice(b"second chunk....", GuestAddress(2 * MIB))
        .expect("write");
    assert_eq!(memory.stats().populated_chunks, 2);
    drop(memory);
    let id = zone.id();
    drop(zone);

    let zone = Zone::open(&path.0, 4).expect("reopen");
    assert_eq!(zone.id(), id, "a zone keeps its identity");
    assert_ne!(id, 0);
    let info = zone.info().expect("info");
    assert_eq!(zone.recovery().kind, RecoveryKind::Clean);
    assert_eq!((info.leaked_frames, info.lost_frames), (0, 0));
    assert_eq!(info.vms.len(), 1);
    assert_eq!((info.vms[0].name.as_str(), info.vms[0].frames), ("vm1", 2));
    assert_eq!(info.free_frames, info.frames - 2);
    let memory = open_memory(&zone, "vm1", 32 * MIB);
    // The VM's frames count as its own at once; they are mapped on first touch.
    assert_eq!(memory.stats().populated_chunks, 2);
    assert_eq!(memory.stats().faults, 0);
    assert!(memory.frame_at(GuestAddress(2 * MIB)).is_some());
    assert_eq!(&read_text(&memory, 20 * MIB + 4096), b"persistent hello");
    assert_eq!(&read_text(&memory, 2 * MIB), b"second chunk....");
    assert_eq!(read_text(&memory, 4 * MIB), [0; 16]);
    assert_eq!(zone.info().expect("info").vms[0].frames, 3);

    // Eager population maps every recorded frame up front.
    drop(memory);
    let vm = zone.attach("vm1", &layout(32 * MIB)).expect("attach");
    let mut config = memory_config(32 * MIB);
    config.populate = Populate::Eager;
    let memory = GuestMemory::new_in_zone(vm, config, &Population::default()).expect("eager");
    assert_eq!(&read_text(&memory, 20 * MIB + 4096), b"persistent hello");
    assert_eq!(zone.info().expect("info").vms[0].frames, 16);
}

#[test]
fn a_vm_taken_up_again_has_its_recorded_frames_mapped_before_any_touch() {
    let path = TempFile::new("zone-map-ahead");
    Zone::create(&path.0, &zone_config(64 * MIB)).expect("create");
    let zone = Zone::open(&path.0, 4).expect("open");
    let memory = open_memory(&zone, "vm1", 32 * MIB);
    // Two neighbouring chunks (one run of frames, as a core allocates them) and one apart.
    for (addr, text) in [
        (2 * MIB, b"chunk one......."),
        (4 * MIB + 8, b"chunk two......."),
        (20 * MIB, b"chunk ten......."),
    ] {
        memory.write_slice(text, GuestAddress(addr)).expect("write");
    }
    drop(memory);

    let memory = open_memory(&zone, "vm1", 32 * MIB);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while memory.stats().mapped_ahead_chunks < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "not mapped ahead: {:?}",
            memory.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let stats = memory.stats();
    assert_eq!(
        (stats.mapped_ahead_chunks, stats.faults),
        (3, 0),
        "{stats:?}"
    );
    assert_eq!(&read_text(&memory, 2 * MIB), b"chunk one.......");
    assert_eq!(&read_text(&memory, 4 * MIB + 8), b"chunk two.......");
    assert_eq!(&read_text(&memory, 20 * MIB), b"chunk ten.......");
    // Nothing else was populated: the other chunks still wait for their first touch.
    assert_eq!(memory.stats().populated_chunks, 3);
    assert_eq!(zone.info().expect("info").vms[0].frames, 3);
}

#[test]
fn a_vm_mapped_ahead_keeps_its_recorded_frames_and_records_fresh_ones_for_the_rest() {
    let path = TempFile::new("zone-mapped");
    Zone::create(&path.0, &zone_config(64 * MIB)).expect("create");
    let zone = Zone::open(&path.0, 4).expect("open");
    let memory = open_memory(&zone, "vm1", 32 * MIB);
    memory
        .write_slice(b"recorded before.", GuestAddress(6 * MIB))
        .expect("write");
    drop(memory);
    assert_eq!(zone.info().expect("info").vms[0].frames, 1);

    let vm = zone.attach("vm1", &layout(32 * MIB)).expect("attach");
    let mut config = memory_config(32 * MIB);
    config.populate = Populate::Mapped;
    let memory = GuestMemory::new_in_zone(vm, config, &Population::default()).expect("mapped");
    let stats = memory.stats();
    assert_eq!((stats.populated_chunks, stats.faults), (16, 0), "{stats:?}");
    assert_eq!(zone.info().expect("info").vms[0].frames, 16);
    assert_eq!(&read_text(&memory, 6 * MIB), b"recorded before.");
    assert_eq!(read_text(&memory, 8 * MIB), [0; 16], "a fresh frame");
    assert_eq!(memory.stats().faults, 0);
    drop(memory);
    // Every frame recorded stays the VM's: taken up again lazily, it has them all.
    let memory = open_memory(&zone, "vm1", 32 * MIB);
    assert_eq!(&read_text(&memory, 6 * MIB), b"recorded before.");
    assert_eq!(zone.info().expect("info").vms[0].frames, 16);
}

#[test]
fn attaching_checks_names_layouts_and_owners() {
    let path = TempFile::new("zone-attach");
    Zone::create(&path.0, &zone_config(64 * MIB)).expect("create");
    let zone = Zone::open(&path.0, 4).expect("open");
    let vm = zone.attach("a", &layout(32 * MIB)).expect("attach");
    let err = zone.attach("b/c", &layout(32 * MIB)).unwrap_err();
    assert!(matches!(err, ZoneError::BadName { .. }), "{err}");
    let err = zone.attach("a", &layout(16 * MIB)).unwrap_err();
    assert!(
        err.to_string().contains("has 32 MiB of guest memory"),
        "{err}"
    );
    let err = zone.attach("big", &layout(128 * MIB)).unwrap_err();
    assert!(
        err.to_string().contains("exceed the zone's 64 MiB"),
        "{err}"
    );
    let err = zone.delete_vm("a").unwrap_err();
    assert!(matches!(err, ZoneError::VmInUse { .. }), "{err}");
    // A second open (as another process has) shares the zone, not the VM.
    let other = Zone::open(&path.0, 1).expect("a second open");
    assert_eq!(other.recovery().kind, RecoveryKind::Attached);
    let err = other.attach("a", &layout(32 * MIB)).unwrap_err();
    assert!(matches!(err, ZoneError::VmInUse { .. }), "{err}");
    assert_eq!(zone.processes().expect("processes").len(), 2);
    drop(vm);
    let moved = other
        .attach("a", &layout(32 * MIB))
        .expect("attach elsewhere");
    drop(moved);
    assert_eq!(zone.delete_vm("a").expect("delete"), 0);
    let err = zone.delete_vm("a").unwrap_err();
    assert!(matches!(err, ZoneError::NoSuchVm { .. }), "{err}");
}

#[test]
fn deleting_a_vm_frees_its_frames_and_gc_releases_free_memory() {
    let path = TempFile::new("zone-delete");
    Zone::create(&path.0, &zone_config(64 * MIB)).expect("create");
    let zone = Zone::open(&path.0, 4).expect("open");
    let memory = open_memory(&zone, "gone", 16 * MIB);
    for chunk in 0..8 {
        memory
            .write_obj(0xABu8, GuestAddress(chunk * 2 * MIB))
            .expect("write");
    }
    drop(memory);
    let info = zone.info().expect("info");
    assert_eq!(info.free_frames, info.frames - 8);
    let old_id = zone.info().expect("info").vms[0].id;
    assert_eq!(zone.delete_vm("gone").expect("delete"), 8);
    let info = zone.info().expect("info");
    assert_eq!((info.free_frames, info.vms.len()), (info.frames, 0));
    assert_eq!(zone.release_free_frames().expect("gc"), info.frames);
    // A new VM of the same name starts empty, and is another VM.
    let memory = open_memory(&zone, "gone", 16 * MIB);
    assert_eq!(memory.read_obj::<u8>(GuestAddress(0)).expect("read"), 0);
    assert_ne!(zone.info().expect("info").vms[0].id, old_id);
}

#[test]
fn a_zone_whose_creation_was_cut_short_is_never_used_and_can_be_created_again() {
    let path = TempFile::new("zone-half");
    Zone::create(&path.0, &zone_config(32 * MIB)).expect("create");
    let err = Zone::create(&path.0, &zone_config(32 * MIB)).unwrap_err();
    assert!(matches!(err, ZoneError::Exists(_)), "{err}");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path.0)
        .expect("open");
    file.write_all_at(b"LLFZONE~", 0).expect("write");
    let err = Zone::open(&path.0, 1).unwrap_err();
    assert!(matches!(err, ZoneError::HalfCreated(_)), "{err}");
    Zone::create(&path.0, &zone_config(32 * MIB)).expect("create again");
    Zone::open(&path.0, 1).expect("open");

    file.write_all_at(b"not a zone at all", 0).expect("write");
    let err = Zone::open(&path.0, 1).unwrap_err();
    assert!(matches!(err, ZoneError::NotAZone { .. }), "{err}");
    let err = Zone::create(&path.0, &zone_config(32 * MIB)).unwrap_err();
    assert!(matches!(err, ZoneError::NotAZone { .. }), "{err}");
    // An empty file (a creation killed at once) holds no zone; create makes one in it.
    file.set_len(0).expect("truncate");
    let err = Zone::open(&path.0, 1).unwrap_err();
    assert!(matches!(err, ZoneError::Empty(_)), "{err}");
    Zone::create(&path.0, &zone_config(32 * MIB)).expect("create in an empty file");
    let missing = TempFile::new("zone-missing");
    let err = Zone::open(&missing.0, 1).unwrap_err();
    assert!(matches!(err, ZoneError::Missing(_)), "{err}");
    assert!(
        err.to_string().contains("does not exist (create it with"),
        "{err}"
    );
}

/// A zone file seen from outside, as a damaging tool sees it: the header's offsets of the frame
/// tables (slot 0 first), the owner map and the frames, and words to read and write.
struct ZoneFile {
    file: std::fs::File,
    tables: u64,
    owners: u64,
}

impl ZoneFile {
    fn open(path: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("open");
        let mut zone = Self {
            file,
            tables: 0,
            owners: 0,
        };
        (zone.tables, zone.owners) = (zone.word(9 * 8), zone.word(19 * 8));
        zone
    }

    fn word(&self, offset: u64) -> u64 {
        let mut word = [0u8; 8];
        self.file.read_exact_at(&mut word, offset).expect("read");
        u64::from_le_bytes(word)
    }

    fn set_word(&self, offset: u64, value: u64) {
        self.file
            .write_all_at(&value.to_le_bytes(), offset)
            .expect("write");
    }

    /// The frame-table entry of chunk `chunk` of the VM in slot 0.
    fn entry(&self, chunk: u64) -> u64 {
        self.word(self.tables + chunk * 8)
    }

    fn set_entry(&self, chunk: u64, value: u64) {
        self.set_word(self.tables + chunk * 8, value);
    }

    /// Sets the owner word of the 2 MiB frame that entry `entry` names.
    fn set_owner(&self, entry: u64, value: u64) {
        self.set_word(self.owners + (entry - 1) / 512 * 8, value);
    }
}

/// A zone with VM "vm" (16 MiB) that wrote `texts` (at their addresses), closed.
fn zone_with_texts(name: &str, texts: &[(u64, &[u8; 16])]) -> TempFile {
    let path = TempFile::new(name);
    Zone::create(&path.0, &zone_config(32 * MIB)).expect("create");
    let zone = Zone::open(&path.0, 1).expect("open");
    let memory = open_memory(&zone, "vm", 16 * MIB);
    for (addr, text) in texts {
        memory
            .write_slice(*text, GuestAddress(*addr))
            .expect("write");
    }
    path
}

#[test]
fn a_damaged_frame_table_entry_or_owner_is_repaired_from_the_other() {
    let path = zone_with_texts(
        "zone-repair",
        &[
            (6 * MIB + 100, b"chunk 3 precious"),
            (10 * MIB, b"chunk 5 precious"),
        ],
    );
    let file = ZoneFile::open(&path.0);
    file.set_entry(3, 0);
    file.set_owner(file.entry(5), 0);
    let zone = Zone::open(&path.0, 1).expect("open");
    let recovery = zone.recovery();
    assert_eq!(
        (recovery.repaired_entries, recovery.damaged_chunks),
        (2, 0),
        "{recovery:?}"
    );
    assert_eq!(
        (recovery.leaked_frames, recovery.orphaned_frames),
        (0, 0),
        "{recovery:?}"
    );
    let info = zone.info().expect("info");
    assert!(info.vms[0].damaged.is_empty(), "{info:?}");
    let memory = open_memory(&zone, "vm", 16 * MIB);
    assert_eq!(&read_text(&memory, 6 * MIB + 100), b"chunk 3 precious");
    assert_eq!(&read_text(&memory, 10 * MIB), b"chunk 5 precious");
}

#[test]
fn an_owner_without_entry_over_zeroes_is_a_crash_and_its_frame_is_freed() {
    let path = zone_with_texts(
        "zone-crash-owner",
        &[(0, b"chunk 0 is kept."), (6 * MIB, &[0; 16])],
    );
    let file = ZoneFile::open(&path.0);
    file.set_entry(3, 0);
    let zone = Zone::open(&path.0, 1).expect("open");
    let recovery = zone.recovery();
    assert_eq!(recovery.leaked_frames, 1, "{recovery:?}");
    assert_eq!(
        (
            recovery.repaired_entries,
            recovery.damaged_chunks,
            recovery.orphaned_frames
        ),
        (0, 0, 0),
        "{recovery:?}"
    );
    let info = zone.info().expect("info");
    assert_eq!((info.free_frames, info.vms[0].frames), (info.frames - 1, 1));
}

#[test]
fn memory_recovery_cannot_find_marks_the_vm_damaged_until_the_loss_is_accepted() {
    let path = zone_with_texts(
        "zone-damaged",
        &[(0, b"chunk 0 is kept."), (6 * MIB, b"chunk 3 is lost.")],
    );
    let file = ZoneFile::open(&path.0);
    let lost = file.entry(3);
    file.set_owner(lost, 0);
    file.set_entry(3, 4);
    // Chunk 1 (never populated) names chunk 0's frame, whose owner is chunk 0.
    file.set_entry(1, file.entry(0));
    let zone = Zone::open(&path.0, 1).expect("open");
    let recovery = zone.recovery();
    assert_eq!(
        (
            recovery.damaged_chunks,
            recovery.orphaned_frames,
            recovery.leaked_frames
        ),
        (2, 1, 1),
        "{recovery:?}"
    );
    let damaged = vec![(2 * MIB, 2 * MIB), (6 * MIB, 2 * MIB)];
    assert_eq!(zone.info().expect("info").vms[0].damaged, damaged);
    let refused = zone.attach("vm", &layout(16 * MIB)).unwrap_err();
    assert!(matches!(refused, ZoneError::Damaged { .. }), "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("0x200000-0x400000 (2 MiB), 0x600000-0x800000 (2 MiB)")
            && text.contains("--accept-damaged"),
        "{text}"
    );
    // The mark outlives the process.
    drop(zone);
    let zone = Zone::open(&path.0, 1).expect("open");
    assert_eq!(zone.recovery().damaged_chunks, 0);
    assert!(zone.attach("vm", &layout(16 * MIB)).is_err());
    assert_eq!(zone.accept_damage("vm").expect("accept"), damaged);
    let memory = open_memory(&zone, "vm", 16 * MIB);
    assert_eq!(&read_text(&memory, 0), b"chunk 0 is kept.");
    assert_eq!(read_text(&memory, 6 * MIB), [0; 16]);
    drop(memory);
    let info = zone.info().expect("info");
    assert!(info.vms[0].damaged.is_empty());
    assert_eq!((info.leaked_frames, info.lost_frames), (0, 0));
    // A truncated file is refused before anything maps past its end.
    drop(zone);
    let len = file.file.metadata().expect("metadata").len();
    file.file.set_len(len - 4096).expect("truncate");
    let err = Zone::open(&path.0, 1).unwrap_err();
    assert!(matches!(err, ZoneError::Truncated { .. }), "{err}");
}

/// Each word of the first directory slot, damaged in a zone that holds VM "vm" with texts:
/// the damage is found, nothing is done to the VM and its frames stay allocated, no VM is
/// created while the slot is there; accepting the slot (where its record reads) gives the VM
/// back with its memory, deleting it frees its frames.
#[test]
fn a_damaged_directory_slot_is_reported_and_its_vm_kept_for_a_person_to_decide() {
    const SLOT_WORDS: u64 = 36;
    let texts: &[(u64, &[u8; 16])] = &[(0, b"chunk 0 precious"), (6 * MIB, b"chunk 3 precious")];
    for word in 0..SLOT_WORDS {
        for damaged in [u64::MAX, 0] {
            let path = zone_with_texts("zone-slot-damage", texts);
            let file = ZoneFile::open(&path.0);
            let at = file.word(8 * 8) + word * 8;
            let kept = file.word(at);
            if kept == damaged {
                continue;
            }
            file.set_word(at, damaged);
            let case = format!("word {word} = {damaged:#x}");
            let zone = Zone::open(&path.0, 1).expect("open");
            let recovery = zone.recovery();
            assert_eq!(
                (recovery.leaked_frames, recovery.lost_frames),
                (0, 0),
                "{case}: {recovery:?}"
            );
            let info = zone.info().expect("info");
            assert!(info.vms.is_empty(), "{case}: {info:?}");
            assert_eq!(info.damaged_slots.len(), 1, "{case}: {info:?}");
            assert_eq!(info.damaged_slots[0].frames, 2, "{case}: {info:?}");
            assert_eq!(info.free_frames, info.frames - 2, "{case}: {info:?}");
            let refused = zone.attach("vm", &layout(16 * MIB)).unwrap_err();
            assert!(
                matches!(refused, ZoneError::SlotDamaged { slot: 0, .. }),
                "{case}: {refused}"
            );
            let other = zone.attach("other", &layout(2 * MIB)).unwrap_err();
            assert!(
                matches!(other, ZoneError::SlotDamaged { .. }),
                "{case}: {other}"
            );
            match zone.accept_slot(0) {
                Ok(name) => {
                    assert_eq!(name, "vm", "{case}");
                    let memory = open_memory(&zone, "vm", 16 * MIB);
                    assert_eq!(&read_text(&memory, 0), b"chunk 0 precious", "{case}");
                    assert_eq!(&read_text(&memory, 6 * MIB), b"chunk 3 precious", "{case}");
                }
                // The name or layout itself is what was damaged: only deletion is left.
                Err(ZoneError::CannotAccept { .. }) => {
                    assert_eq!(zone.delete_slot(0).expect("delete"), 2, "{case}");
                    let info = zone.info().expect("info");
                    assert_eq!(info.free_frames, info.frames, "{case}: {info:?}");
                    assert!(info.damaged_slots.is_empty(), "{case}: {info:?}");
                }
                Err(e) => panic!("{case}: {e}"),
            }
            drop(zone);
            let info = Zone::open(&path.0, 1).expect("open").info().expect("info");
            assert_eq!(
                (
                    info.leaked_frames,
                    info.lost_frames,
                    info.damaged_slots.len()
                ),
                (0, 0, 0),
                "{case}: {info:?}"
            );
        }
    }
}

/// Runs [`crashing_child`] in a child process on `zone`, waits until it is ready and kills it
/// with SIGKILL.
fn crash_child(zone: &Path) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "crashing_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, zone)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line == "ready");
    assert!(ready, "the child did not get ready");
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
}

/// In a child process (see [`crash_child`]): writes to a VM's memory, leaks a frame (allocated,
/// never published, as a crash during population leaves it) and loses one (freed in the
/// allocator while the VM references it), then waits to be killed.
#[test]
fn crashing_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let zone = Zone::open(Path::new(&path), 2).expect("open");
    let memory = open_memory(&zone, "victim", 16 * MIB);
    memory
        .write_slice(b"before the crash", GuestAddress(6 * MIB))
        .expect("write");
    memory.write_obj(7u8, GuestAddress(0)).expect("write");
    let pool = zone.pool();
    let leaked = pool.alloc(0, FrameSize::Huge).expect("leak");
    pool.free(0, memory.frame_at(GuestAddress(6 * MIB)).expect("frame"))
        .expect("lose");
    println!("leaked {}", leaked.index);
    println!("ready");
    std::io::stdout().flush().expect("flush");
    loop {
        std::thread::park();
    }
}

#[test]
fn recovery_after_sigkill_frees_leaked_frames_and_takes_back_lost_ones() {
    let path = TempFile::new("zone-crash");
    Zone::create(&path.0, &zone_config(32 * MIB)).expect("create");
    crash_child(&path.0);
    let zone = Zone::open(&path.0, 2).expect("open after the crash");
    let recovery = zone.recovery();
    assert_eq!(recovery.kind, RecoveryKind::Crash);
    assert_eq!((recovery.leaked_frames, recovery.lost_frames), (1, 1));
    let info = zone.info().expect("info");
    assert_eq!((info.leaked_frames, info.lost_frames), (0, 0));
    assert_eq!(info.free_frames, info.frames - 2);
    let memory = open_memory(&zone, "victim", 16 * MIB);
    assert_eq!(&read_text(&memory, 6 * MIB), b"before the crash");
    assert_eq!(memory.read_obj::<u8>(GuestAddress(0)).expect("read"), 7);
}

#[test]
fn zones_live_on_tmpfs_and_hugetlbfs() {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let path = TempFile::in_dir(shm, "zone-tmpfs");
        Zone::create(&path.0, &zone_config(32 * MIB)).expect("create on tmpfs");
        let zone = Zone::open(&path.0, 1).expect("open");
        let memory = open_memory(&zone, "vm", 8 * MIB);
        memory.write_obj(5u8, GuestAddress(MIB)).expect("write");
        drop((memory, zone));
        let zone = Zone::open(&path.0, 1).expect("reopen");
        let memory = open_memory(&zone, "vm", 8 * MIB);
        assert_eq!(memory.read_obj::<u8>(GuestAddress(MIB)).expect("read"), 5);
    } else {
        eprintln!("SKIP: zones_live_on_tmpfs_and_hugetlbfs: tmpfs part: no /dev/shm");
    }
    on_hugetlbfs(FrameSize::Huge, 24);
    // 1 GiB pages: the metadata takes the first page, one 1 GiB frame the second.
    on_hugetlbfs(FrameSize::Giant, 2);
}

/// Creates, fills, reopens and checks a zone of `frame` frames on a hugetlbfs mount of that
/// page size, with `pages` huge pages reserved; SKIP where they cannot be had.
fn on_hugetlbfs(frame: FrameSize, pages: u64) {
    let kib = frame.bytes() >> 10;
    let hugetlbfs = match common::HugetlbfsMount::new(kib, pages) {
        Ok(mount) => mount,
        Err(why) => {
            let page = frame.name();
            return eprintln!("SKIP: zones_live_on_tmpfs_and_hugetlbfs: {page} pages: {why}");
        }
    };
    let mount = &hugetlbfs.path;
    let result = std::panic::catch_unwind(|| {
        let path = mount.join("zone");
        let config = ZoneConfig {
            size: frame.bytes().max(32 * MIB),
            frame_size: frame,
            max_vms: DEFAULT_MAX_VMS,
        };
        let size = config.size;
        Zone::create(&path, &config).expect("create on hugetlbfs");
        let zone = Zone::open(&path, 1).expect("open");
        assert!(zone.pool().is_hugetlb());
        let layout = VmLayout {
            chunk_size: frame,
            regions: vec![(0, size)],
        };
        let open = |zone: &Arc<Zone>| {
            let vm = zone.attach("vm", &layout).expect("attach");
            let mut config = memory_config(size);
            config.chunk_size = Some(frame);
            GuestMemory::new_in_zone(vm, config, &Population::default()).expect("memory")
        };
        let memory = open(&zone);
        memory
            .write_slice(b"hugetlbfs zone..", GuestAddress(3 * MIB))
            .expect("write");
        drop((memory, zone));
        let zone = Zone::open(&path, 1).expect("reopen");
        let memory = open(&zone);
        assert_eq!(&read_text(&memory, 3 * MIB), b"hugetlbfs zone..");
        drop((memory, zone));
        std::fs::remove_file(&path).expect("remove");
        // Frames smaller than the mount's pages are refused, and leave no file behind.
        if frame == FrameSize::Giant {
            let err = Zone::create(&path, &zone_config(32 * MIB)).unwrap_err();
            assert!(err.to_string().contains("larger than the frames"), "{err}");
            assert!(!path.exists());
        }
    });
    drop(hugetlbfs);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn balloon_bitmaps_outlive_the_process_until_taken_back() {
    let path = TempFile::new("zone-pieces");
    Zone::create(&path.0, &zone_config(32 * MIB)).expect("create");
    let zone = Zone::open(&path.0, 1).expect("open");
    let memory = open_memory(&zone, "vm", 8 * MIB);
    memory.write_obj(1u8, GuestAddress(2 * MIB)).expect("write");
    let mut core = memory.pool().core_frames(memory.vmm_core());
    let given = memory
        .release_pieces(GuestAddress(2 * MIB), MIB, &mut core)
        .expect("inflate");
    assert_eq!((given.pieces, given.freed_chunks), (256, 0));
    drop((core, memory, zone));
    let zone = Zone::open(&path.0, 1).expect("reopen");
    assert_eq!(zone.info().expect("info").vms[0].given_away_pieces, 256);
    let memory = open_memory(&zone, "vm", 8 * MIB);
    let mut core = memory.pool().core_frames(memory.vmm_core());
    // The rest of the chunk completes it: its frame goes back to the zone.
    let rest = memory
        .release_pieces(GuestAddress(3 * MIB), MIB, &mut core)
        .expect("inflate");
    assert_eq!((rest.pieces, rest.freed_chunks), (256, 1));
    let frames = zone.info().expect("info").vms[0].frames;
    // Taking one page back gives the chunk a frame at once, recorded as the VM's.
    let page = memory
        .reclaim_pieces(GuestAddress(2 * MIB), 4096, &mut core)
        .expect("deflate");
    assert_eq!((page.pieces, page.populated_chunks), (1, 1));
    drop((core, memory, zone));
    let zone = Zone::open(&path.0, 1).expect("reopen");
    let info = zone.info().expect("info");
    assert_eq!(info.vms[0].frames, frames + 1);
    assert_eq!(info.vms[0].given_away_pieces, 511);
    let memory = open_memory(&zone, "vm", 8 * MIB);
    assert_eq!(
        memory.read_obj::<u8>(GuestAddress(2 * MIB)).expect("read"),
        0
    );
    assert_eq!(memory.reclaim_all_pieces(), 511);
    assert_eq!(zone.info().expect("info").vms[0].given_away_pieces, 0);
}

#[test]
fn a_seal_and_the_identity_of_a_vm_outlive_the_process_and_a_new_vm_has_neither() {
    let path = TempFile::new("zone-seal");
    Zone::create(&path.0, &zone_config(16 * MIB)).expect("create");
    let (id, other_id, seal) = {
        let zone = Zone::open(&path.0, 4).expect("open");
        let vm = zone.attach("sealed", &layout(4 * MIB)).expect("attach");
        assert_eq!(vm.seal(), 0);
        let seal = vm.seal_memory().expect("seal");
        assert_ne!(seal, 0);
        let other = zone.attach("other", &layout(4 * MIB)).expect("attach");
        (vm.id(), other.id(), seal)
    };
    assert_ne!(id, other_id);
    let zone = Zone::open(&path.0, 4).expect("reopen");
    let vm = zone.attach("sealed", &layout(4 * MIB)).expect("attach");
    assert_eq!((vm.id(), vm.seal()), (id, seal));
    vm.break_seal().expect("break the seal");
    assert_eq!(vm.seal(), 0);
    assert_ne!(
        vm.seal_memory().expect("seal"),
        seal,
        "a new seal each time"
    );
    drop(vm);
    zone.delete_vm("sealed").expect("delete");
    let again = zone.attach("sealed", &layout(4 * MIB)).expect("attach");
    assert_eq!(again.seal(), 0, "a new VM in the slot is not sealed");
    assert_ne!(again.id(), id);
}
