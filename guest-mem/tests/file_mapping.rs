//! Guest memory mapped privately from a memory file (a copy snapshot loaded by mapping): two
//! VMs' memories share the file's pages, each one's writes are its own, the file never
//! changes, and memory the guest gives back becomes ordinary pool memory.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use common::{touch, RegionVm, TempFile, MIB};
use guest_mem::{Backing, GuestMemory, Pool, PoolConfig};
use vm_memory::{Bytes, GuestAddress};

const SIZE: u64 = 8 * MIB;

/// The byte the file holds at `offset`: each 4 KiB page its own, never zero.
fn pattern(offset: u64) -> u8 {
    ((offset / 4096) % 251) as u8 + 1
}

fn memory_file(name: &str) -> (TempFile, std::fs::File) {
    let path = TempFile::new(name);
    let contents: Vec<u8> = (0..SIZE).map(pattern).collect();
    std::fs::write(&path.0, &contents).expect("write the memory file");
    let file = std::fs::File::open(&path.0).expect("open the memory file");
    (path, file)
}

fn mapped_memory(file: &std::fs::File) -> GuestMemory {
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 16 * MIB)).expect("pool");
    let memory = GuestMemory::new(pool, common::memory_config(SIZE, 1)).expect("memory");
    let free = memory.pool().free_frames();
    assert_eq!(memory.map_file(file).expect("map the file"), SIZE);
    assert_eq!(
        memory.pool().free_frames(),
        free,
        "nothing copied into the pool"
    );
    memory
}

fn byte_at(memory: &GuestMemory, addr: u64) -> u8 {
    memory
        .read_obj(GuestAddress(addr))
        .expect("read guest memory")
}

#[test]
fn two_memories_share_a_file_each_writing_its_own_pages() {
    let (path, file) = memory_file("shared-file");
    let a = mapped_memory(&file);
    let b = mapped_memory(&file);
    let stats = a.stats();
    assert_eq!((stats.file_backed_chunks, stats.populated_chunks), (4, 0));
    for addr in [0, 4096, 3 * MIB + 12_345, SIZE - 1] {
        assert_eq!(byte_at(&a, addr), pattern(addr));
        assert_eq!(byte_at(&b, addr), pattern(addr));
    }
    a.write_obj(0xAAu8, GuestAddress(4096)).unwrap();
    assert_eq!(byte_at(&a, 4096), 0xAA);
    assert_eq!(
        byte_at(&b, 4096),
        pattern(4096),
        "B sees the file, not A's write"
    );
    let on_disk = std::fs::read(&path.0).unwrap();
    assert_eq!(on_disk[4096], pattern(4096), "the file never changes");

    // A whole chunk given back: ordinary memory again, zero until touched, then a pool frame.
    let mut core = a.pool().core_frames(0);
    a.discard(GuestAddress(0), 2 * MIB, &mut core).unwrap();
    assert_eq!(byte_at(&a, 4096), 0);
    let stats = a.stats();
    assert_eq!((stats.file_backed_chunks, stats.populated_chunks), (3, 1));
    assert_eq!(byte_at(&b, 4096), pattern(4096));

    // Pieces given back in a file-backed chunk read as the file again.
    a.write_obj(0x55u8, GuestAddress(2 * MIB)).unwrap();
    a.discard(GuestAddress(2 * MIB), 4096, &mut core).unwrap();
    assert_eq!(byte_at(&a, 2 * MIB), pattern(2 * MIB));
    assert_eq!(a.stats().file_backed_chunks, 3);
}

#[test]
fn a_guest_reads_and_writes_the_mapped_file_and_gives_its_copies_back() {
    let (_path, file) = memory_file("guest-file");
    let memory = mapped_memory(&file);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    // The guest reads and writes one dword per 4 KiB page of the second and third chunks: it
    // sees the file's bytes (the program answers the OR of what it read).
    let seen = (0..1024u64)
        .map(|page| u32::from(pattern(2 * MIB + page * 4096)) * 0x0101_0101)
        .fold(0, |all, dword| all | dword);
    assert_eq!(
        vm.run(&memory, 0, touch(2 * MIB, 4096, 1024, 0x1234_5678)),
        Ok(seen)
    );
    let written: u32 = memory.read_obj(GuestAddress(2 * MIB + 8)).unwrap();
    assert_eq!(written, 0x1234_5678);
    // Given back whole (balloon inflation of both chunks): unpopulated memory again.
    let mut core = memory.pool().core_frames(0);
    memory
        .release_pieces(GuestAddress(2 * MIB), 4 * MIB, &mut core)
        .unwrap();
    assert_eq!(memory.stats().file_backed_chunks, 2);
    assert_eq!(byte_at(&memory, 2 * MIB + 8), 0);
}
