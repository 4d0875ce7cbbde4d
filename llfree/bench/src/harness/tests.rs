//! Tests of the benchmark harness.

use super::*;
use crate::buddy::{Buddy, BuddyConfig};
use crate::list_local::ListLocal;
use crate::llfree_alloc::LLFreeAlloc;

fn params(bench: Bench, order: usize, threads: usize) -> RunParams {
    RunParams {
        bench,
        order,
        threads,
        iterations: 3,
        seed: 1,
    }
}

#[test]
fn every_bench_runs_and_leaves_the_zone_free() {
    for (bench, order) in [
        (Bench::Bulk, 0),
        (Bench::Bulk, 9),
        (Bench::Rand, 0),
        (Bench::Rand, 3),
        (Bench::Repeat, 0),
    ] {
        let alloc = Buddy::new(BuddyConfig::new(2), 1 << 14).unwrap();
        let samples = run(&alloc, params(bench, order, 2)).unwrap();
        assert_eq!(samples.len(), 3);
        for sample in &samples {
            let timed = [sample.get_ns, sample.put_ns];
            assert!(
                timed.iter().flatten().all(|&ns| ns > 0.0),
                "{bench}: {sample:?}"
            );
        }
        assert_eq!(samples[0].get_ns.is_some(), bench != Bench::Rand);
        assert_eq!(samples[0].put_ns.is_some(), bench != Bench::Repeat);
        assert_eq!(alloc.free_frames(), alloc.frames(), "{bench} order {order}");
    }
}

/// Counts the free frames an allocator had at the last get.
struct FreeAtGet<'a> {
    inner: &'a dyn FrameAllocator,
    free: AtomicUsize,
}

impl FrameAllocator for FreeAtGet<'_> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn supports_order(&self, order: usize) -> bool {
        self.inner.supports_order(order)
    }
    fn get(&self, core: usize, order: usize) -> Result<usize, AllocError> {
        self.free.store(self.inner.free_frames(), Relaxed);
        self.inner.get(core, order)
    }
    fn put(&self, core: usize, frame: usize, order: usize) -> Result<(), AllocError> {
        self.inner.put(core, frame, order)
    }
    fn drain(&self, core: usize) {
        self.inner.drain(core)
    }
    fn free_frames(&self) -> usize {
        self.inner.free_frames()
    }
    fn frames(&self) -> usize {
        self.inner.frames()
    }
}

#[test]
fn repeat_runs_with_half_the_zone_allocated_as_in_the_paper() {
    let buddy = Buddy::new(BuddyConfig::new(2), 1 << 14).unwrap();
    let alloc = FreeAtGet {
        inner: &buddy,
        free: AtomicUsize::new(0),
    };
    run(&alloc, params(Bench::Repeat, 0, 2)).unwrap();
    // The last get is one of the loop's: half the zone is allocated, at most one more frame
    // per thread.
    let free = alloc.free.load(Relaxed);
    assert!(((1 << 13) - 2..=1 << 13).contains(&free), "{free}");
    assert_eq!(buddy.free_frames(), buddy.frames());
}

#[test]
fn rand_frees_frames_of_other_threads() {
    let alloc = ListLocal::new(2, 4096).unwrap();
    run(&alloc, params(Bench::Rand, 0, 2)).unwrap();
    assert_eq!(alloc.free_frames(), 4096);
}

#[test]
fn llfree_threads_with_caches_allocate_the_whole_zone() {
    // Three threads do not split 8 trees evenly: the last frames of a tree are counted in
    // another thread's cache, and borrowed from it.
    for (bench, order) in [(Bench::Rand, 0), (Bench::Rand, 9), (Bench::Bulk, 0)] {
        let alloc = LLFreeAlloc::new(3, 8 * llfree::TREE_FRAMES).unwrap();
        run(&alloc, params(bench, order, 3)).unwrap();
        assert_eq!(alloc.free_frames(), alloc.frames(), "{bench} order {order}");
        alloc.llfree().validate().unwrap();
    }
}

#[test]
fn allocator_errors_end_the_run_without_hanging() {
    // One ListLocal core shared by two threads: the second thread's claim fails.
    let alloc = ListLocal::new(1, 4096).unwrap();
    for bench in [Bench::Bulk, Bench::Rand, Bench::Repeat] {
        let err = run(&alloc, params(bench, 0, 2)).unwrap_err();
        assert!(
            matches!(
                err,
                BenchError::Alloc {
                    source: AllocError::CoreBusy(_),
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn rejects_runs_without_work() {
    let alloc = Buddy::new(BuddyConfig::new(1), 1024).unwrap();
    assert!(matches!(
        run(&alloc, params(Bench::Bulk, 10, 1)),
        Err(BenchError::Params(_))
    ));
    assert!("nope".parse::<Bench>().is_err());
    assert_eq!("rand".parse::<Bench>().unwrap(), Bench::Rand);
}
