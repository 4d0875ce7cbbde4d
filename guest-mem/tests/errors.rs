//! Bad parameters give clear errors, never a crash.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::sync::Arc;

use guest_mem::{Backing, GuestMemory, MemoryConfig, Pool, PoolConfig};
use vm_memory::{Bytes, GuestAddress};

const MIB: u64 = 1 << 20;

fn pool() -> Arc<Pool> {
    Pool::new(PoolConfig::new(Backing::Anonymous, 64 * MIB)).expect("pool")
}

fn memory_err(ranges: Vec<(GuestAddress, u64)>) -> String {
    GuestMemory::new(pool(), MemoryConfig::new(ranges, 1))
        .expect_err("bad config")
        .to_string()
}

#[test]
fn bad_pool_parameters() {
    let mut config = PoolConfig::new(Backing::Anonymous, 64 * MIB);
    config.cores = 0;
    assert_eq!(
        Pool::new(config).unwrap_err().to_string(),
        "a pool needs at least one core"
    );
    let dir = PoolConfig::new(
        Backing::File {
            path: "/proc/no-such-dir/pool".into(),
            format: false,
        },
        64 * MIB,
    );
    let err = Pool::new(dir).unwrap_err().to_string();
    assert!(
        err.starts_with("pool file /proc/no-such-dir/pool: "),
        "{err}"
    );
}

#[test]
fn bad_region_layouts() {
    assert_eq!(memory_err(vec![]), "guest memory needs at least one region");
    assert_eq!(
        memory_err(vec![(GuestAddress(4096), 2 * MIB)]),
        "bad RAM region at 0x1000, size 0x200000: not a multiple of the chunk size (2 MiB chunks)"
    );
    assert_eq!(
        memory_err(vec![(GuestAddress(0), 0)]),
        "bad RAM region at 0x0, size 0x0: empty (2 MiB chunks)"
    );
    assert_eq!(
        memory_err(vec![(GuestAddress(0), 4 * MIB), (GuestAddress(2 * MIB), 2 * MIB)]),
        "bad RAM region at 0x200000, size 0x200000: overlaps or precedes the region before it (2 MiB chunks)"
    );
    let mut config = MemoryConfig::new(vec![(GuestAddress(0), 2 * MIB)], 1);
    config.fault_threads = 0;
    assert_eq!(
        GuestMemory::new(pool(), config).unwrap_err().to_string(),
        "at least one fault handler thread is needed"
    );
}

#[test]
fn bad_ranges_and_vcpus() {
    let ranges = vec![(GuestAddress(0), 4 * MIB), (GuestAddress(8 * MIB), 4 * MIB)];
    let memory = GuestMemory::new(pool(), MemoryConfig::new(ranges, 2)).expect("memory");
    let mut core = memory.pool().core_frames(0);
    assert_eq!(
        memory
            .discard(GuestAddress(100), 4096, &mut core)
            .unwrap_err()
            .to_string(),
        "guest range 0x64+0x1000 is empty or not 4 KiB aligned"
    );
    assert_eq!(
        memory
            .release_pieces(GuestAddress(0), 0, &mut core)
            .unwrap_err()
            .to_string(),
        "guest range 0x0+0x0 is empty or not 4 KiB aligned"
    );
    assert_eq!(
        memory
            .discard(GuestAddress(2 * MIB), 4 * MIB, &mut core)
            .unwrap_err()
            .to_string(),
        "guest range 0x200000+0x400000 is not RAM"
    );
    assert_eq!(
        memory
            .discard(GuestAddress(u64::MAX - 4095), 8192, &mut core)
            .unwrap_err()
            .to_string(),
        "guest range 0xfffffffffffff000+0x2000 is not RAM"
    );
    assert_eq!(
        memory.register_vcpu(2).unwrap_err().to_string(),
        "vCPU 2 does not exist (the memory has 2 vCPUs)"
    );
    // vm-memory accesses outside RAM or across a hole fail cleanly.
    assert!(memory.write_obj(1u64, GuestAddress(5 * MIB)).is_err());
    assert!(memory
        .write_slice(&[0; 8], GuestAddress(4 * MIB - 4))
        .is_err());
    assert_eq!(
        memory.stats().populated_chunks,
        1,
        "only the chunk before the hole"
    );
    // A range across the hole is refused as a whole; one inside RAM works.
    assert!(memory
        .discard(GuestAddress(0), 12 * MIB, &mut core)
        .is_err());
    let stats = memory
        .discard(GuestAddress(0), 4 * MIB, &mut core)
        .expect("discard");
    assert_eq!(stats.freed_chunks, 1);
}

#[test]
#[should_panic(expected = "belongs to another pool")]
fn frames_of_another_pool_s_core_are_refused() {
    let ranges = vec![(GuestAddress(0), 4 * MIB)];
    let memory = GuestMemory::new(pool(), MemoryConfig::new(ranges, 1)).expect("memory");
    let other = pool();
    // A caller's mistake: the frames would go to the other pool's allocator.
    let _ = memory.discard(GuestAddress(0), 4 * MIB, &mut other.core_frames(0));
}
