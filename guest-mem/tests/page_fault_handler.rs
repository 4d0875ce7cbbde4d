//! Guest memory handed to a page-fault handler of another process (Firecracker's Uffd
//! backend): each RAM region becomes registered anonymous memory described as the handler
//! needs it (where it lies, where its contents start in the memory file, the page size), no
//! pool frame is taken, and memory that is populated already is refused. (The handler's side,
//! faults answered from a memory file, is tests/tests/snapshot_uffd.rs of the workspace.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use common::MIB;
use guest_mem::{Backing, GuestMemory, MemoryConfig, MemoryError, Pool, PoolConfig, RegionError};
use vm_memory::{Bytes, GuestAddress};

#[test]
fn each_region_is_described_for_the_handler_and_takes_no_pool_frame() {
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 32 * MIB)).expect("pool");
    let ranges = vec![
        (GuestAddress(0), 8 * MIB),
        (GuestAddress(16 * MIB), 4 * MIB),
    ];
    let memory = GuestMemory::new(pool, MemoryConfig::new(ranges, 1)).expect("memory");
    let free = memory.pool().free_frames();
    let handed = memory.map_for_handler().expect("handed to the handler");
    assert!(handed.uffd() >= 0);
    let regions = handed.regions();
    assert_eq!(regions.len(), 2);
    for (region, (guest, offset)) in regions
        .iter()
        .zip(memory.regions().iter().zip([0, 8 * MIB]))
    {
        assert_eq!(region.host_addr, guest.host_addr() as u64);
        assert_eq!(region.size, guest.size());
        assert_eq!(region.offset, offset, "the regions one after the other");
        assert_eq!(region.page_size, 4096);
    }
    assert_eq!(memory.pool().free_frames(), free, "no pool frame taken");
    assert_eq!(memory.stats().file_backed_chunks, 6);
}

#[test]
fn populated_memory_is_not_handed_over() {
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 16 * MIB)).expect("pool");
    let memory = GuestMemory::new(pool, common::memory_config(8 * MIB, 1)).expect("memory");
    memory
        .write_obj(1u8, GuestAddress(0))
        .expect("populate one chunk");
    let refused = memory.map_for_handler().unwrap_err();
    assert!(
        matches!(
            refused,
            MemoryError::Region(RegionError::NotEmpty { chunk: 0 })
        ),
        "{refused}"
    );
}
