//! Guest memory on hugetlb pools with 2 MiB and 1 GiB pages, touched by real KVM vCPUs.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::Arc;

use common::{memory_config, touch, HugePageReservation, RegionVm, GIB, MIB};
use guest_mem::{
    Backing, FrameSize, GuestMemory, MemoryConfig, MemoryError, Pool, PoolConfig, Populate,
};
use llfree::TREE_FRAMES;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

fn reserve(kb: u64, count: u64) -> Option<HugePageReservation> {
    match HugePageReservation::reserve(kb, count) {
        Ok(pages) => Some(pages),
        Err(why) => {
            eprintln!("SKIP: {why}");
            None
        }
    }
}

fn memory(pool: &Arc<Pool>, size: u64, chunk: FrameSize, vcpus: usize) -> GuestMemory {
    let mut config = memory_config(size, vcpus);
    config.chunk_size = Some(chunk);
    GuestMemory::new(Arc::clone(pool), config).expect("memory")
}

#[test]
fn two_vcpus_on_2m_pages_fill_their_own_reservations() {
    let Some(_pages) = reserve(2048, 128) else {
        return;
    };
    let mut config = PoolConfig::new(Backing::Hugetlb2M, 256 * MIB);
    config.cores = 4;
    let pool = Pool::new(config).expect("pool");
    assert!(pool.is_hugetlb());
    let memory = memory(&pool, 128 * MIB, FrameSize::Huge, 2);
    assert_eq!(
        memory.iter().next().map(|r| r.is_hugetlbfs()),
        Some(Some(true))
    );
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    let jobs = [
        touch(2 * MIB, 2 * MIB, 10, 0xA),
        touch(64 * MIB, 2 * MIB, 10, 0xB),
    ];
    let results = vm.run_in_parallel(&memory, &jobs);
    assert_eq!(results, vec![Ok(0), Ok(0)]);
    let tree = |chunk: u64| {
        memory
            .frame_at(GuestAddress(chunk * 2 * MIB))
            .map(|f| f.index as usize / TREE_FRAMES)
            .expect("populated")
    };
    assert!((1..11).all(|c| tree(c) == tree(1)));
    assert!((32..42).all(|c| tree(c) == tree(32)));
    assert_ne!(tree(1), tree(32));
    assert_eq!(memory.stats().vcpu_faults, vec![10, 10]);
}

#[test]
fn a_2m_pool_hands_out_1g_chunks() {
    let Some(_pages) = reserve(2048, 512) else {
        return;
    };
    let pool = Pool::new(PoolConfig::new(Backing::Hugetlb2M, GIB)).expect("pool");
    let memory = memory(&pool, GIB, FrameSize::Giant, 1);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, touch(4 * MIB, 4 * MIB, 200, 5)), Ok(0));
    let frame = memory.frame_at(GuestAddress(0)).expect("populated");
    assert_eq!(frame.size, FrameSize::Giant);
    assert_eq!(pool.stats().free_bytes, 0);
    memory
        .discard(
            GuestAddress(0),
            GIB,
            &mut pool.core_frames(pool.claim_cores(1)),
        )
        .expect("discard");
    assert_eq!(pool.stats().free_giant, 1);
}

#[test]
fn one_gib_pages_populate_discard_and_come_back_zeroed() {
    let Some(_pages) = reserve(1_048_576, 2) else {
        return;
    };
    let pool = Pool::new(PoolConfig::new(Backing::Hugetlb1G, 2 * GIB)).expect("pool");
    assert_eq!(pool.frame_size(), FrameSize::Giant);
    let memory = memory(&pool, 2 * GIB, FrameSize::Giant, 1);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, touch(GIB, 64 * MIB, 16, 0x77)), Ok(0));
    assert_eq!(memory.stats().populated_chunks, 2);
    let mut core = pool.core_frames(pool.claim_cores(1));
    let freed = memory
        .discard(GuestAddress(GIB), GIB, &mut core)
        .expect("discard");
    assert_eq!(freed.freed_chunks, 1);
    let vm = RegionVm::new(&memory).expect("KVM");
    assert_eq!(vm.run(&memory, 0, touch(GIB, 64 * MIB, 16, 0x78)), Ok(0));
    // 2 MiB chunks cannot come from a 1 GiB pool.
    let mut config = MemoryConfig::new(vec![(GuestAddress(0), 2 * MIB)], 1);
    config.chunk_size = Some(FrameSize::Huge);
    let err = GuestMemory::new(Arc::clone(&pool), config).expect_err("too small");
    assert!(matches!(err, MemoryError::ChunkTooSmall { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "chunk size 2 MiB is smaller than the pool's frames (1 GiB)"
    );
}

#[test]
fn eager_memory_on_2m_pages_is_faulted_in_before_the_guest_runs() {
    let Some(_pages) = reserve(2048, 8) else {
        return;
    };
    let pool = Pool::new(PoolConfig::new(Backing::Hugetlb2M, 16 * MIB)).expect("pool");
    let mut config = MemoryConfig::new(vec![(GuestAddress(0), 16 * MIB)], 1);
    config.populate = Populate::Eager;
    let memory = GuestMemory::new(Arc::clone(&pool), config).expect("memory");
    let region = &memory.regions()[0];
    assert_eq!(
        common::resident_pages(region.host_addr(), region.size()),
        (16 * MIB / 4096) as usize,
        "the kernel has allocated, zeroed and mapped every huge page"
    );
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, touch(2 * MIB, 2 * MIB, 7, 9)), Ok(0));
    assert_eq!(memory.stats().faults, 0);
}

#[test]
fn mapped_memory_on_2m_pages_gets_its_huge_pages_at_the_guest_s_first_touches() {
    let Some(_pages) = reserve(2048, 8) else {
        return;
    };
    let pool = Pool::new(PoolConfig::new(Backing::Hugetlb2M, 16 * MIB)).expect("pool");
    let mut config = memory_config(16 * MIB, 1);
    config.populate = Populate::Mapped;
    let memory = GuestMemory::new(Arc::clone(&pool), config).expect("memory");
    assert_eq!(memory.stats().populated_chunks, 8);
    let region = &memory.regions()[0];
    let resident = || common::resident_pages(region.host_addr(), region.size());
    assert_eq!(resident(), 0, "no huge page allocated yet");
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, touch(2 * MIB, 2 * MIB, 3, 9)), Ok(0));
    assert_eq!(memory.stats().faults, 0, "no fault through userfaultfd");
    assert_eq!(
        resident(),
        (4 * 2 * MIB / 4096) as usize,
        "the touch program's chunk and the three touched"
    );
}

#[test]
fn missing_huge_pages_give_a_clear_error() {
    let _lock = reserve(2048, 0);
    let err = Pool::new(PoolConfig::new(Backing::Hugetlb2M, 1 << 40)).expect_err("1 TiB");
    let text = err.to_string();
    assert!(
        text.starts_with("not enough 2 MiB huge pages: need 524288, free ")
            && text.ends_with("(raise /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)"),
        "{text}"
    );
}
