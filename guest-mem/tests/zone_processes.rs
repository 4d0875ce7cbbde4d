//! Several processes use one zone at once: what one VM gives back is at once another process's,
//! a VM is attached by one process at a time, and a process that dies with the zone open is
//! recovered by the others while they go on, its VM's memory intact.
//!
//! The second process is this test binary again, run with `GUEST_MEM_ZONE_PEER` set.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use common::{TempFile, MIB};
use guest_mem::zone::{RecoveryKind, VmLayout, Zone, ZoneConfig, ZoneError, DEFAULT_MAX_VMS};
use guest_mem::{FrameSize, GuestMemory, Population};
use vm_memory::{Bytes, GuestAddress};

const PEER_ENV: &str = "GUEST_MEM_ZONE_PEER";
/// Set for a peer whose VM is ephemeral.
const EPHEMERAL_ENV: &str = "GUEST_MEM_ZONE_PEER_EPHEMERAL";
/// The zone: 32 frames of 2 MiB.
const ZONE: u64 = 64 * MIB;
/// Each VM's RAM: together more than the zone.
const VM: u64 = 48 * MIB;
/// What the peer gives back of its RAM.
const GIVEN_BACK: u64 = 32 * MIB;

fn layout() -> VmLayout {
    VmLayout {
        chunk_size: FrameSize::Huge,
        regions: vec![(0, VM)],
    }
}

fn open_memory(zone: &std::sync::Arc<Zone>, name: &str) -> GuestMemory {
    let vm = zone.attach(name, &layout()).expect("attach");
    GuestMemory::new_in_zone(vm, common::memory_config(VM, 1), &Population::default())
        .expect("memory")
}

/// Writes `byte` into the first byte of every 2 MiB chunk of `[start, end)`.
fn fill(memory: &GuestMemory, start: u64, end: u64, byte: u8) {
    for addr in (start..end).step_by(2 << 20) {
        memory.write_obj(byte, GuestAddress(addr)).expect("write");
    }
}

/// In the peer process: fills its VM, gives most of it back, says so, and waits to be killed.
#[test]
fn zone_peer() {
    let Some(path) = std::env::var_os(PEER_ENV) else {
        return;
    };
    let zone = Zone::open(Path::new(&path), 2).expect("open");
    println!("opened {}", zone.recovery().kind.name());
    let vm = zone.attach("peer", &layout()).expect("attach");
    if std::env::var_os(EPHEMERAL_ENV).is_some() {
        vm.make_ephemeral().expect("ephemeral");
    }
    let memory = GuestMemory::new_in_zone(vm, common::memory_config(VM, 1), &Population::default())
        .expect("memory");
    fill(&memory, 0, VM, 0x9e);
    let mut core = zone.pool().core_frames(zone.pool().own_core());
    memory
        .discard(GuestAddress(VM - GIVEN_BACK), GIVEN_BACK, &mut core)
        .expect("discard");
    println!("gave back");
    std::io::stdout().flush().expect("flush");
    loop {
        std::thread::park();
    }
}

/// A new zone of [`ZONE`] bytes in a temporary file `name`.
fn new_zone(name: &str) -> TempFile {
    let path = TempFile::new(name);
    let config = ZoneConfig {
        size: ZONE,
        frame_size: FrameSize::Huge,
        max_vms: DEFAULT_MAX_VMS,
    };
    Zone::create(&path.0, &config).expect("create");
    path
}

/// Starts the peer on `zone` (its VM `ephemeral` or not) and waits until it gave its memory back.
fn peer(zone: &Path, ephemeral: bool) -> (Child, BufReader<ChildStdout>) {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args(["--exact", "zone_peer", "--nocapture", "--test-threads=1"])
        .env(PEER_ENV, zone)
        .stdout(Stdio::piped());
    if ephemeral {
        command.env(EPHEMERAL_ENV, "1");
    }
    let mut child = command.spawn().expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    while !line.starts_with("gave back") {
        line.clear();
        assert!(
            lines.read_line(&mut line).expect("read") > 0,
            "the peer ended early"
        );
    }
    (child, lines)
}

#[test]
fn what_one_process_gives_back_another_uses_and_a_dead_one_is_recovered() {
    let path = new_zone("zone-processes");
    let zone = Zone::open(&path.0, 2).expect("open");
    let (mut child, _lines) = peer(&path.0, false);
    let info = zone.info().expect("info");
    assert_eq!(info.processes.len(), 2, "{:?}", info.processes);
    // 24 frames filled, 16 given back: 24 of 32 are free, as many as this VM needs.
    assert_eq!(info.free_frames, 24, "{info:?}");
    let memory = open_memory(&zone, "mine");
    fill(&memory, 0, VM, 0x11);
    assert_eq!(zone.info().expect("info").free_frames, 0);
    // The peer's VM cannot be attached here while it runs.
    assert!(matches!(
        zone.attach("peer", &layout()),
        Err(ZoneError::VmInUse { .. })
    ));

    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    assert_eq!(zone.recover_dead_processes().expect("recover"), 1);
    assert_eq!(zone.info().expect("info").processes.len(), 1);
    // Its VM is free to be attached, its memory as it left it.
    drop(memory);
    let theirs = open_memory(&zone, "peer");
    for addr in (0..VM - GIVEN_BACK).step_by(2 << 20) {
        assert_eq!(
            theirs.read_obj::<u8>(GuestAddress(addr)).expect("read"),
            0x9e
        );
    }
    drop(theirs);
    drop(zone);
    // Alone now: the whole zone is recovered and checked; nothing leaked or lost.
    let zone = Zone::open(&path.0, 2).expect("reopen");
    assert_eq!(zone.recovery().kind, RecoveryKind::Clean);
    let info = zone.info().expect("info");
    assert_eq!((info.leaked_frames, info.lost_frames), (0, 0));
    assert_eq!(
        info.free_frames,
        32 - 24 - 8,
        "mine: 24 frames, the peer's: 8"
    );
}

#[test]
fn an_ephemeral_vm_goes_with_its_process_and_its_frames_come_back() {
    let path = new_zone("zone-ephemeral");
    let zone = Zone::open(&path.0, 2).expect("open");
    // In this process: detached, it is deleted.
    let vm = zone.attach("here", &layout()).expect("attach");
    vm.make_ephemeral().expect("ephemeral");
    assert!(vm.is_ephemeral());
    let memory = GuestMemory::new_in_zone(vm, common::memory_config(VM, 1), &Population::default())
        .expect("memory");
    fill(&memory, 0, VM, 1);
    assert_eq!(zone.info().expect("info").free_frames, 32 - 24);
    drop(memory);
    let info = zone.info().expect("info");
    assert!(info.vms.is_empty() && info.free_frames == 32, "{info:?}");
    // In a process killed with it attached: the survivors' recovery deletes it.
    let (mut child, _lines) = peer(&path.0, true);
    assert_eq!(zone.info().expect("info").free_frames, 32 - 8);
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    assert_eq!(zone.recover_dead_processes().expect("recover"), 1);
    let info = zone.info().expect("info");
    assert!(info.vms.is_empty() && info.free_frames == 32, "{info:?}");
    assert_eq!((info.leaked_frames, info.lost_frames), (0, 0));
}
