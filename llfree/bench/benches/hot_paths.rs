//! criterion benches of the single-operation hot paths: one get+put pair at orders 0 and 9,
//! LLFree against the buddy baseline, on one core of an otherwise free 1 GiB zone.

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use llfree_bench::buddy::{Buddy, BuddyConfig};
use llfree_bench::llfree_alloc::LLFreeAlloc;
use llfree_bench::FrameAllocator;
use std::hint::black_box;

const ZONE_FRAMES: usize = 1 << 18;

/// Benches `alloc` statically dispatched, so that its hot path can be inlined as in real use.
fn bench_get_put<A: FrameAllocator>(group: &mut BenchmarkGroup<'_, WallTime>, alloc: &A) {
    for order in [0, 9] {
        group.bench_function(format!("{}/order{order}", alloc.name()), |b| {
            b.iter(|| {
                let frame = alloc.get(0, black_box(order)).expect("get");
                alloc.put(0, black_box(frame), order).expect("put");
            })
        });
    }
}

fn get_put(c: &mut Criterion) {
    let mut group = c.benchmark_group("get_put");
    bench_get_put(
        &mut group,
        &LLFreeAlloc::new(1, ZONE_FRAMES).expect("llfree"),
    );
    bench_get_put(
        &mut group,
        &Buddy::new(BuddyConfig::new(1), ZONE_FRAMES).expect("buddy"),
    );
    group.finish();
}

criterion_group!(benches, get_put);
criterion_main!(benches);
