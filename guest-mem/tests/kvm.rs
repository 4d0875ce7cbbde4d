//! Real KVM vCPUs populating, discarding and sharing pool-backed guest memory (plain memory pool).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::{memory_config, RegionVm, Touch, TouchError, MIB};
use guest_mem::{
    Backing, FaultError, FrameSize, GuestMemory, MemoryError, Pool, PoolConfig, Populate,
    Reclaimed, Scrub,
};
use llfree::TREE_FRAMES;
use vm_memory::{Bytes, GuestAddress};

const CHUNK: u64 = 2 * MIB;

fn pool(size: u64) -> Arc<Pool> {
    pool_scrubbed(size, Scrub::PunchHole)
}

fn pool_scrubbed(size: u64, scrub: Scrub) -> Arc<Pool> {
    let mut config = PoolConfig::new(Backing::Anonymous, size);
    config.cores = 8;
    config.scrub = scrub;
    Pool::new(config).expect("pool")
}

fn memory(pool: &Arc<Pool>, size: u64, vcpus: usize) -> GuestMemory {
    GuestMemory::new(Arc::clone(pool), memory_config(size, vcpus)).expect("memory")
}

/// Touches `count` chunks from chunk `first`, one dword each.
fn chunks(first: u64, count: u32, marker: u32) -> Touch {
    common::touch(first * CHUNK, CHUNK, count, marker)
}

fn tree_of(memory: &GuestMemory, chunk: u64) -> usize {
    let frame = memory
        .frame_at(GuestAddress(chunk * CHUNK))
        .expect("chunk populated");
    frame.index as usize / TREE_FRAMES
}

#[test]
fn two_vcpus_populate_lazily_into_their_own_reservations() {
    let pool = pool(512 * MIB);
    let memory = memory(&pool, 256 * MIB, 2);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(
        memory.stats().populated_chunks,
        1,
        "only the program's chunk"
    );
    let jobs = [chunks(1, 20, 0xAAAA_0001), chunks(64, 20, 0xBBBB_0002)];
    let results = vm.run_in_parallel(&memory, &jobs);
    assert_eq!(results, vec![Ok(0), Ok(0)], "fresh frames read as zero");
    let stats = memory.stats();
    assert_eq!(stats.vcpu_faults, vec![20, 20]);
    assert_eq!(stats.populated_chunks, 41);
    let tree0 = tree_of(&memory, 1);
    let tree1 = tree_of(&memory, 64);
    assert_ne!(
        tree0, tree1,
        "each vCPU allocates from its own reserved tree"
    );
    assert!((1..21).all(|c| tree_of(&memory, c) == tree0));
    assert!((64..84).all(|c| tree_of(&memory, c) == tree1));
    let reserved = pool.stats().trees.iter().filter(|t| t.reserved).count();
    assert!(reserved >= 2, "{:?}", pool.stats().trees);
    // The VMM sees what the vCPUs wrote.
    let value: u32 = memory.read_obj(GuestAddress(5 * CHUNK + 8)).expect("read");
    assert_eq!(value, 0xAAAA_0001);
    // The fault handler threads allocated through their caches of the vCPUs' cores: the rest of
    // the batches they took is free memory, and goes back with the memory.
    let cached = pool.allocator().cached_frames() as u64;
    assert!(cached > 0, "the handlers hold the vCPUs' core caches");
    let populated = 41 * CHUNK;
    assert_eq!(pool.stats().used_bytes, populated);
    drop(vm);
    drop(memory);
    assert_eq!(pool.allocator().cached_frames(), 0);
    assert_eq!(pool.stats().used_bytes, 0);
    pool.allocator().validate().expect("consistent");
}

#[test]
fn discard_then_touch_gives_a_fresh_zeroed_frame() {
    discard_then_touch(Scrub::PunchHole);
}

#[test]
fn discard_then_touch_gives_a_zeroed_frame_when_zeroing_on_free() {
    discard_then_touch(Scrub::ZeroOnFree);
}

fn discard_then_touch(scrub: Scrub) {
    let pool = pool_scrubbed(128 * MIB, scrub);
    let memory = memory(&pool, 64 * MIB, 1);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, chunks(1, 8, 0x1234_5678)), Ok(0));
    let used = pool.stats().used_bytes;
    // A device's core through its cache (the VMM's: a pool of two trees has two cores, and the
    // vCPU's handler holds the other's): the frames wait there, counted as free.
    let mut balloon_core = pool.core_frames(memory.vmm_core());
    assert!(balloon_core.is_cached());
    let cached = pool.allocator().cached_frames();
    let freed = memory
        .discard(GuestAddress(CHUNK), 8 * CHUNK, &mut balloon_core)
        .expect("discard");
    assert_eq!(freed.freed_chunks, 8);
    assert_eq!(pool.stats().used_bytes, used - 8 * CHUNK);
    assert!(memory.frame_at(GuestAddress(CHUNK)).is_none());
    assert_eq!(pool.allocator().cached_frames(), cached + 8 * 512);
    drop(balloon_core);
    assert_eq!(
        pool.allocator().cached_frames(),
        cached,
        "given to their tree"
    );
    assert_eq!(pool.stats().used_bytes, used - 8 * CHUNK);
    // Touching again faults in fresh frames: the old marker is gone.
    let again = std::thread::scope(|s| {
        s.spawn(|| {
            let vcpu = vm_again(&memory);
            vcpu.run(&memory, 0, chunks(1, 8, 0x9999_0000))
        })
        .join()
        .expect("join")
    });
    assert_eq!(again, Ok(0), "a discarded chunk comes back zeroed");
    assert_eq!(memory.stats().faults, 16);
    assert_eq!(memory.stats().discarded_chunks, 8);
    drop(vm);
}

/// A second VM over the same memory (a vCPU id can only be created once per VM).
fn vm_again(memory: &GuestMemory) -> RegionVm {
    RegionVm::new(memory).expect("KVM worked a moment ago")
}

#[test]
fn given_away_pieces_accumulate_until_the_chunk_goes_back() {
    let pool = pool(128 * MIB);
    let memory = memory(&pool, 64 * MIB, 1);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, chunks(3, 1, 7)), Ok(0));
    let mut core = pool.core_frames(pool.claim_cores(1));
    let base = GuestAddress(3 * CHUNK);
    let first = memory
        .release_pieces(base, MIB, &mut core)
        .expect("inflate");
    assert_eq!((first.pieces, first.freed_chunks), (256, 0));
    let deflated = memory
        .reclaim_pieces(base, 4096, &mut core)
        .expect("deflate");
    assert_eq!((deflated.pieces, deflated.populated_chunks), (1, 0));
    let second = memory
        .release_pieces(GuestAddress(3 * CHUNK + MIB), MIB, &mut core)
        .expect("inflate");
    assert_eq!((second.pieces, second.freed_chunks), (256, 0));
    assert!(memory.frame_at(base).is_some(), "one piece is still in use");
    let last = memory
        .release_pieces(base, 4096, &mut core)
        .expect("inflate");
    assert_eq!((last.pieces, last.freed_chunks), (1, 1));
    assert!(memory.frame_at(base).is_none());
    assert_eq!(memory.stats().given_away_pieces, 512);
}

#[test]
fn a_chunk_taken_back_from_the_balloon_has_its_frame_before_the_guest_touches_it() {
    let pool = pool(128 * MIB);
    let memory = memory(&pool, 64 * MIB, 1);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, chunks(3, 4, 0x5555_0001)), Ok(0));
    let faults = memory.stats().faults;
    let mut core = pool.core_frames(pool.claim_cores(1));
    let inflated = memory
        .release_pieces(GuestAddress(3 * CHUNK), 4 * CHUNK, &mut core)
        .expect("inflate");
    assert_eq!(inflated.freed_chunks, 4);
    let used = pool.stats().used_bytes;
    // Chunks 3 and 4 entirely, and one page of chunk 6 (the guest took back what it asked).
    let deflated = memory
        .reclaim_pieces(GuestAddress(3 * CHUNK), 2 * CHUNK, &mut core)
        .expect("deflate");
    assert_eq!((deflated.pieces, deflated.populated_chunks), (1024, 2));
    let page = memory
        .reclaim_pieces(GuestAddress(6 * CHUNK + MIB), 4096, &mut core)
        .expect("deflate");
    assert_eq!((page.pieces, page.populated_chunks), (1, 1));
    assert_eq!(pool.stats().used_bytes, used + 3 * CHUNK);
    assert!(
        memory.frame_at(GuestAddress(5 * CHUNK)).is_none(),
        "still given away"
    );
    // Pages never given away, deflated by a confused guest, take no frame.
    let never = memory
        .reclaim_pieces(GuestAddress(20 * CHUNK), CHUNK, &mut core)
        .expect("deflate");
    assert_eq!(never, Reclaimed::default());
    assert!(memory.frame_at(GuestAddress(20 * CHUNK)).is_none());
    // The guest's touches are the kernel's: no fault reaches the VMM, and the frames are fresh.
    let again = std::thread::scope(|s| {
        s.spawn(|| vm_again(&memory).run(&memory, 0, chunks(3, 2, 0x5555_0002)))
            .join()
            .expect("join")
    });
    assert_eq!(again, Ok(0), "repopulated chunks read as zero");
    assert_eq!(memory.stats().faults, faults);
    let value: u32 = memory.read_obj(GuestAddress(4 * CHUNK + 8)).expect("read");
    assert_eq!(value, 0x5555_0002);
    drop(vm);
    drop(memory);
    assert_eq!(pool.stats().used_bytes, 0, "nothing leaked");
    pool.allocator().validate().expect("consistent");
}

#[test]
fn two_guests_share_one_pool() {
    let pool = pool(64 * MIB);
    let a = memory(&pool, 64 * MIB, 1);
    let b = memory(&pool, 64 * MIB, 1);
    let (Some(vm_a), Some(vm_b)) = (RegionVm::new(&a), RegionVm::new(&b)) else {
        return;
    };
    // 32 frames: A takes 1 + 24, B 1 + 6, leaving 0 after B wants 12 more unless A gives back.
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(vm_a.run(&a, 0, chunks(1, 24, 0xA)), Ok(0)));
    });
    let a_frames: Vec<_> = (1..25)
        .map(|c| a.frame_at(GuestAddress(c * CHUNK)).expect("populated"))
        .collect();
    let mut core = pool.core_frames(pool.claim_cores(1));
    a.discard(GuestAddress(CHUNK), 12 * CHUNK, &mut core)
        .expect("discard");
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(vm_b.run(&b, 0, chunks(1, 18, 0xB)), Ok(0)));
    });
    assert_eq!(pool.stats().free_bytes, 0);
    let reused = (1..19)
        .filter_map(|c| b.frame_at(GuestAddress(c * CHUNK)))
        .filter(|f| a_frames.contains(f))
        .count();
    assert!(reused >= 12, "B runs on frames A gave back ({reused})");
}

/// Waits until `event` is readable.
fn wait_readable(event: &vmm_sys_util::eventfd::EventFd, timeout: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: event.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as i32) == 1 }
}

#[test]
fn exhaustion_gives_the_vcpu_and_the_vmm_an_error() {
    let pool = pool(16 * MIB);
    let memory = memory(&pool, 64 * MIB, 1);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    let result = std::thread::scope(|s| {
        let vcpu = s.spawn(|| vm.run(&memory, 0, chunks(1, 20, 1)));
        assert!(
            wait_readable(memory.fault_event(), Duration::from_secs(20)),
            "the VMM is told"
        );
        // While the vCPU waits for a frame, VMM accesses fail cleanly.
        let err = memory
            .write_obj(5u32, GuestAddress(30 * CHUNK))
            .expect_err("no frame left");
        assert!(err.to_string().contains("exhausted"), "{err}");
        // Give up on the guest: let the vCPU go on so that its kick ends KVM_RUN (the release
        // holds for faults that come after it too).
        memory.release_faults();
        vcpu.join().expect("join")
    });
    assert_eq!(result, Err(TouchError::Fault(FaultError::PoolExhausted)));
    assert_eq!(memory.stats().populated_chunks, 8);
    assert!(memory.stats().exhausted >= 1);
    assert_eq!(pool.stats().free_bytes, 0);
}

#[test]
fn a_blocked_vcpu_goes_on_when_another_guest_frees_memory() {
    let pool = pool(16 * MIB);
    let hog = memory(&pool, 16 * MIB, 1);
    hog.write_slice(&[1; 4096], GuestAddress(0))
        .expect("populate");
    hog.write_slice(&[1; 4096], GuestAddress(CHUNK))
        .expect("populate");
    let given_back = hog.frame_at(GuestAddress(0)).expect("populated");
    let memory = memory(&pool, 64 * MIB, 1);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    // 8 frames: the hog has 2, the program's chunk 1, the vCPU gets 5 and blocks on its 6th
    // chunk until the hog gives one back.
    let (report, finished) = mpsc::channel();
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            // The test is the VMM: it takes the error, the vCPU only waits for its frame.
            let _ = report.send(vm.run_leaving_faults_to_the_vmm(&memory, 0, chunks(1, 6, 1)));
        });
        assert!(
            wait_readable(memory.fault_event(), Duration::from_secs(20)),
            "the VMM is told"
        );
        assert_eq!(memory.take_fault_error(0), Some(FaultError::PoolExhausted));
        hog.discard(
            GuestAddress(0),
            CHUNK,
            &mut pool.core_frames(pool.claim_cores(1)),
        )
        .expect("discard");
        let result = finished.recv_timeout(Duration::from_secs(20));
        if result.is_err() {
            // Failing: let the vCPU run to its end so that the scope can join it.
            give_up(&memory, &finished);
        }
        result
    });
    assert_eq!(
        result,
        Ok(Ok(0)),
        "the vCPU finished on the frame the other guest gave back"
    );
    // The VMM sees the vCPU's write. A kicked vCPU goes on as soon as the frame is mapped, maybe
    // before the fault handler has published the chunk: a vm-memory access waits for that.
    let marker: u32 = memory.read_obj(GuestAddress(6 * CHUNK + 8)).expect("read");
    assert_eq!(marker, 1);
    assert_eq!(memory.frame_at(GuestAddress(6 * CHUNK)), Some(given_back));
    // The kick makes the kernel deliver the blocked fault again: still one wait, one report.
    assert_eq!(memory.fault_event().read().ok(), Some(1), "reported once");
    assert_eq!(memory.take_fault_error(0), None);
    assert_eq!(memory.stats().exhausted, 1);
    assert_eq!(memory.stats().populated_chunks, 7);
}

/// Lets the vCPUs of `memory` blocked on faults go on, and waits until `finished` has the
/// run's result.
fn give_up<T>(memory: &GuestMemory, finished: &mpsc::Receiver<T>) {
    memory.release_faults();
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the vCPUs end once their faults are released");
}

/// Memory of `size` bytes in 2 MiB chunks for one vCPU, populated as `populate` says.
fn populated_memory(
    pool: &Arc<Pool>,
    size: u64,
    populate: Populate,
) -> Result<GuestMemory, MemoryError> {
    let mut config = memory_config(size, 1);
    config.populate = populate;
    config.chunk_size = Some(FrameSize::Huge);
    GuestMemory::new(Arc::clone(pool), config)
}

/// After the memory is dropped, the `size` bytes of `pool` are free.
fn assert_every_frame_free(pool: &Pool, size: u64) {
    assert_eq!(pool.stats().free_bytes, size, "dropping frees every frame");
}

#[test]
fn eager_memory_is_populated_up_front() {
    let pool = pool(64 * MIB);
    let memory = populated_memory(&pool, 16 * MIB, Populate::Eager).expect("memory");
    assert_eq!(memory.stats().populated_chunks, 8);
    let region = &memory.regions()[0];
    assert_eq!(
        common::resident_pages(region.host_addr(), region.size()),
        (16 * MIB / 4096) as usize,
        "every page is faulted in before the guest runs"
    );
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, chunks(1, 7, 3)), Ok(0));
    assert_eq!(memory.stats().faults, 0);
    drop(memory);
    assert_every_frame_free(&pool, 64 * MIB);
}

#[test]
fn mapped_memory_has_every_frame_before_the_guest_runs_and_no_page_touched() {
    let pool = pool(64 * MIB);
    let memory = populated_memory(&pool, 16 * MIB, Populate::Mapped).expect("memory");
    assert_eq!(memory.stats().populated_chunks, 8);
    assert_eq!(pool.stats().used_bytes, 16 * MIB);
    let region = &memory.regions()[0];
    assert_eq!(
        common::resident_pages(region.host_addr(), region.size()),
        0,
        "the kernel fills the pages at the first touches"
    );
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(vm.run(&memory, 0, chunks(1, 7, 3)), Ok(0));
    assert_eq!(memory.stats().faults, 0, "no fault through userfaultfd");
    assert_eq!(memory.read_obj::<u32>(GuestAddress(CHUNK + 8)).unwrap(), 3);
    // A discarded chunk goes back to lazy population: its next touch faults in a frame.
    let mut core = pool.core_frames(memory.vmm_core());
    let freed = memory
        .discard(GuestAddress(CHUNK), CHUNK, &mut core)
        .expect("discard");
    assert_eq!(freed.freed_chunks, 1);
    drop(core);
    let again = std::thread::scope(|s| {
        s.spawn(|| vm_again(&memory).run(&memory, 0, chunks(1, 1, 4)))
            .join()
            .expect("join")
    });
    assert_eq!(again, Ok(0));
    assert_eq!(memory.stats().faults, 1);
    drop(vm);
    drop(memory);
    assert_every_frame_free(&pool, 64 * MIB);
}

#[test]
fn mapped_memory_larger_than_its_pool_fails_and_gives_every_frame_back() {
    let pool = pool(8 * MIB);
    let err = populated_memory(&pool, 16 * MIB, Populate::Mapped).expect_err("more than the pool");
    assert_eq!(
        err.to_string(),
        "guest memory pool exhausted: no free 2 MiB frame"
    );
    assert_eq!(pool.stats().free_bytes, 8 * MIB);
}

/// A guest that keeps writing a chunk while the VMM discards it, over and over (a balloon
/// driver reporting memory it still uses): whatever the interleaving, the guest's memory comes
/// from the pool. A page the guest touches between the placeholder's mapping and its
/// registration with userfaultfd must not become anonymous memory outside the pool.
#[test]
fn a_guest_writing_a_chunk_while_it_is_discarded_never_gets_memory_outside_the_pool() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let pool = pool(64 * MIB);
    let memory = memory(&pool, 16 * MIB, 1);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    let mut core = pool.core_frames(pool.claim_cores(1));
    let chunk = &memory.regions()[0];
    let chunk_addr = chunk.host_addr() + CHUNK as usize;
    let done = AtomicBool::new(false);
    let discards = std::thread::scope(|s| {
        // 300,000 stores to one dword of chunk 1 (stride 0).
        let vcpu = s.spawn(|| {
            let result = vm.run(&memory, 0, common::touch(CHUNK, 0, 300_000, 0x5EED));
            done.store(true, Ordering::Release);
            result
        });
        let mut discards = 0;
        while !done.load(Ordering::Acquire) {
            memory
                .discard(GuestAddress(CHUNK), CHUNK, &mut core)
                .expect("discard");
            discards += 1;
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(vcpu.join().expect("join").is_ok());
        discards
    });
    memory
        .discard(GuestAddress(CHUNK), CHUNK, &mut core)
        .expect("discard");
    assert!(discards >= 20, "only {discards} discards raced the guest");
    assert_eq!(
        common::resident_pages(chunk_addr, CHUNK),
        0,
        "a discarded chunk holds no memory ({discards} discards)"
    );
    let stats = memory.stats();
    assert_eq!(stats.populated_chunks, 1, "only the program's chunk");
    assert_eq!(pool.stats().used_bytes, CHUNK, "the pool agrees");
}

/// A pool of 8 MiB whose every frame the first 4 chunks of a 16 MiB guest memory hold.
fn full_pool() -> (Arc<Pool>, GuestMemory) {
    let pool = pool(8 * MIB);
    let memory = memory(&pool, 16 * MIB, 1);
    for chunk in 0..4 {
        memory
            .write_obj(1u8, GuestAddress(chunk * CHUNK))
            .expect("populate");
    }
    (pool, memory)
}

/// A thread that is no vCPU (KVM's asynchronous page fault worker resolving a guest fault, or a
/// VMM thread) and faults on an exhausted pool waits for a frame, as a vCPU does: it must not
/// get the zero page, whose copy on its write would be anonymous memory outside the pool.
#[test]
fn a_thread_that_is_no_vcpu_waits_for_a_frame_instead_of_taking_memory_outside_the_pool() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let (pool, memory) = full_pool();
    assert_eq!(pool.stats().free_bytes, 0);
    let target = memory.regions()[0].host_addr() + 5 * CHUNK as usize;
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: the address lies in guest memory, which outlives this scope.
            unsafe { (target as *mut u64).write_volatile(0x0DD) };
            done.store(true, Ordering::Release);
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!done.load(Ordering::Acquire), "the write waits for a frame");
        assert_eq!(
            common::resident_pages(target, CHUNK),
            0,
            "no page outside the pool"
        );
        memory
            .discard(
                GuestAddress(CHUNK),
                CHUNK,
                &mut pool.core_frames(pool.claim_cores(1)),
            )
            .expect("discard");
    });
    assert!(done.load(Ordering::Acquire));
    assert!(
        memory.frame_at(GuestAddress(5 * CHUNK)).is_some(),
        "a pool frame"
    );
    let value: u64 = memory.read_obj(GuestAddress(5 * CHUNK)).expect("read");
    assert_eq!(value, 0x0DD);
}

/// A thread that is no vCPU waiting for a frame (KVM's asynchronous page fault worker, which
/// KVM waits for before it destroys a VM) is the VM's error as much as a vCPU's, and its wait
/// ends when the VM stops: left waiting, it would hang the VMM's teardown in the kernel for
/// ever, SIGKILL included. After the release, such faults are answered at once.
#[test]
fn a_waiting_thread_that_is_no_vcpu_is_reported_and_released_when_the_vm_stops() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let (pool, memory) = full_pool();
    let host = |chunk: u64| memory.regions()[0].host_addr() + (chunk * CHUNK) as usize;
    let (first, second) = (host(5), host(6));
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: the address lies in guest memory, which outlives this scope.
            unsafe { (first as *mut u64).write_volatile(0x0DD) };
            done.store(true, Ordering::Release);
        });
        assert!(
            wait_readable(memory.fault_event(), Duration::from_secs(20)),
            "the VMM is told"
        );
        assert_eq!(
            memory.take_other_fault_error(),
            Some(FaultError::PoolExhausted)
        );
        assert_eq!(memory.take_fault_error(0), None, "no vCPU's error");
        let stats = memory.stats();
        assert_eq!((stats.waiting_other_faults, stats.waiting_vcpus), (1, 0));
        assert!(!done.load(Ordering::Acquire), "the write waits for a frame");
        assert_eq!(memory.release_faults(), 1, "one wait ended");
    });
    assert!(done.load(Ordering::Acquire));
    assert_eq!(memory.stats().waiting_other_faults, 0);
    // From now on a fault the pool cannot serve does not wait at all.
    // SAFETY: as above.
    unsafe { (second as *mut u64).write_volatile(0x0EE) };
    assert_eq!(pool.stats().free_bytes, 0, "no frame came from the pool");
    assert_eq!(memory.frame_at(GuestAddress(5 * CHUNK)), None);
    assert_eq!(memory.frame_at(GuestAddress(6 * CHUNK)), None);
}
