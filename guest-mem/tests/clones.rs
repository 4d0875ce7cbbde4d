//! Clones of a VM in a zone: each maps the base's frames privately, reads the base's memory,
//! keeps its own writes (copy-on-write) and takes frames of its own from the zone only for what
//! the base had not populated; the base never changes and can be neither attached nor deleted
//! while a clone is attached; a clone goes with its own frames when it is detached.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::Arc;

use common::{TempFile, MIB};
use guest_mem::zone::{VmLayout, Zone, ZoneConfig, ZoneError, DEFAULT_MAX_VMS};
use guest_mem::{FrameSize, GuestMemory, Population};
use vm_memory::{Bytes, GuestAddress};

const SIZE: u64 = 16 * MIB;

fn layout() -> VmLayout {
    VmLayout {
        chunk_size: FrameSize::Huge,
        regions: vec![(0, SIZE)],
    }
}

fn memory_of(vm: guest_mem::zone::ZoneVm) -> GuestMemory {
    GuestMemory::new_in_zone(vm, common::memory_config(SIZE, 1), &Population::default())
        .expect("memory")
}

fn frames_of(zone: &Zone, name: &str) -> Option<u64> {
    let info = zone.info().expect("info");
    assert_eq!((info.leaked_frames, info.lost_frames), (0, 0));
    info.vms
        .iter()
        .find(|vm| vm.name == name)
        .map(|vm| vm.frames)
}

/// A zone at `path` with VM `base`, which wrote `base` at the start of its first two chunks and
/// was detached.
fn zone_with_base(path: &std::path::Path) -> Arc<Zone> {
    Zone::create(
        path,
        &ZoneConfig {
            size: 64 * MIB,
            frame_size: FrameSize::Huge,
            max_vms: DEFAULT_MAX_VMS,
        },
    )
    .expect("create");
    let zone = Zone::open(path, 8).expect("open");
    let base = memory_of(zone.attach("base", &layout()).expect("attach"));
    for chunk in 0..2 {
        base.write_slice(b"base", GuestAddress(chunk * 2 * MIB))
            .expect("write");
    }
    zone
}

fn read4(memory: &GuestMemory, addr: u64) -> [u8; 4] {
    let mut text = [0u8; 4];
    memory
        .read_slice(&mut text, GuestAddress(addr))
        .expect("read");
    text
}

#[test]
fn clones_read_the_base_keep_their_own_writes_and_leave_the_base_as_it_was() {
    let path = TempFile::new("zone-clones");
    let zone = zone_with_base(&path.0);
    let one = memory_of(zone.attach_clone("base", "one").expect("clone one"));
    let two = memory_of(zone.attach_clone("base", "two").expect("clone two"));
    assert_eq!(one.stats().file_backed_chunks, 2);
    assert_eq!(one.zone_vm().unwrap().base().unwrap().name(), "base");
    assert_eq!(&read4(&one, 0), b"base");
    one.write_slice(b"one!", GuestAddress(0)).expect("write");
    // A chunk the base never populated: a frame of the clone's own from the zone.
    one.write_slice(b"new!", GuestAddress(8 * MIB))
        .expect("write");
    assert_eq!(&read4(&one, 0), b"one!");
    assert_eq!(&read4(&two, 0), b"base", "a clone saw another's write");
    assert_eq!(read4(&two, 8 * MIB), [0; 4]);
    assert_eq!(frames_of(&zone, "one"), Some(1));
    // Its read of the chunk populated it with a zeroed frame of its own.
    assert_eq!(frames_of(&zone, "two"), Some(1));
    assert_eq!(frames_of(&zone, "base"), Some(2));
    let info = zone.info().expect("info");
    let one_info = info.vms.iter().find(|vm| vm.name == "one").unwrap();
    assert_eq!(one_info.clone_of.as_deref(), Some("base"));

    // The base is tied to its clones; a clone lives only as a clone.
    let err = zone.attach("base", &layout()).unwrap_err();
    assert!(matches!(err, ZoneError::BaseInUse { .. }), "{err}");
    assert!(err.to_string().contains("'one' in process"), "{err}");
    let err = zone.delete_vm("base").unwrap_err();
    assert!(matches!(err, ZoneError::BaseInUse { .. }), "{err}");
    let err = zone.attach("one", &layout()).unwrap_err();
    assert!(matches!(err, ZoneError::IsClone { .. }), "{err}");
    let err = zone.attach_clone("one", "three").unwrap_err();
    assert!(matches!(err, ZoneError::IsClone { .. }), "{err}");
    let err = zone.attach_clone("base", "two").unwrap_err();
    assert!(matches!(err, ZoneError::NameTaken { .. }), "{err}");
    let err = zone.attach_clone("nobody", "three").unwrap_err();
    assert!(matches!(err, ZoneError::NoSuchVm { .. }), "{err}");

    // Detached, the clones go with their frames; the base is as it was.
    drop(one);
    drop(two);
    assert_eq!(frames_of(&zone, "one"), None);
    assert_eq!(frames_of(&zone, "two"), None);
    let info = zone.info().expect("info");
    assert_eq!(info.free_frames, info.frames - 2);
    let base = memory_of(zone.attach("base", &layout()).expect("the base again"));
    assert_eq!(&read4(&base, 0), b"base");
    assert_eq!(&read4(&base, 2 * MIB), b"base");
}

#[test]
fn a_base_attached_to_a_process_bases_no_clone() {
    let path = TempFile::new("zone-clones-attached");
    let zone = zone_with_base(&path.0);
    let _base = zone.attach("base", &layout()).expect("attach");
    let other = Zone::open(&path.0, 4).expect("a second open");
    let err = other.attach_clone("base", "one").unwrap_err();
    assert!(matches!(err, ZoneError::VmInUse { .. }), "{err}");
}

#[test]
fn clones_on_hugetlbfs_copy_whole_huge_pages_reserved_when_they_map_the_base() {
    let hugetlbfs = match common::HugetlbfsMount::new(2048, 48) {
        Ok(mount) => mount,
        Err(why) => {
            return eprintln!("SKIP: clones_on_hugetlbfs_copy_whole_huge_pages: {why}");
        }
    };
    let path = hugetlbfs.path.join("zone");
    let zone = zone_with_base(&path);
    assert!(zone.pool().is_hugetlb());
    let one = memory_of(zone.attach_clone("base", "one").expect("clone"));
    assert_eq!(one.stats().file_backed_chunks, 2);
    assert_eq!(&read4(&one, 2 * MIB), b"base");
    one.write_slice(b"one!", GuestAddress(2 * MIB))
        .expect("write");
    assert_eq!(&read4(&one, 2 * MIB), b"one!");
    drop(one);
    let base = memory_of(zone.attach("base", &layout()).expect("the base again"));
    assert_eq!(&read4(&base, 2 * MIB), b"base");
    drop((base, zone));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_kept_clone_owns_copies_of_the_base_s_frames_and_outlives_its_process() {
    let path = TempFile::new("zone-kept-clone");
    let zone = zone_with_base(&path.0);
    let clone = zone.attach_clone("base", "kept").expect("clone");
    assert_eq!(zone.copy_vm(clone).expect("copy"), 2);
    let info = zone.info().expect("info");
    let kept = info.vms.iter().find(|vm| vm.name == "kept").unwrap();
    assert_eq!((kept.frames, kept.clone_of.as_deref()), (2, None));
    assert_eq!(info.free_frames, info.frames - 4);
    // A VM of its own: attached, written and attached again, as any; the base as it was.
    let layout = layout();
    let kept = memory_of(zone.attach("kept", &layout).expect("attach the copy"));
    assert_eq!(&read4(&kept, 2 * MIB), b"base");
    kept.write_slice(b"kept", GuestAddress(2 * MIB))
        .expect("write");
    drop(kept);
    let kept = memory_of(zone.attach("kept", &layout).expect("again"));
    assert_eq!(&read4(&kept, 2 * MIB), b"kept");
    drop(kept);
    let base = memory_of(zone.attach("base", &layout).expect("the base"));
    assert_eq!(&read4(&base, 2 * MIB), b"base");
    drop(base);
    assert_eq!(zone.delete_vm("kept").expect("delete"), 2);
    assert_eq!(frames_of(&zone, "base"), Some(2));
}
