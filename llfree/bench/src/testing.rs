//! Test helpers shared by the allocators' unit tests.

use crate::frame_alloc::{AllocError, FrameAllocator};
use crate::rng::Rng;

/// Runs `threads` threads doing random gets and puts of the given orders on `alloc`, each on its
/// own core id (draining it at the end), then checks that no frame was handed out twice, frees
/// everything, drains every core and checks that all frames are free again.
pub fn stress(alloc: &dyn FrameAllocator, threads: usize, orders: &[usize], ops: usize) {
    let held: Vec<Vec<(usize, usize)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|core| s.spawn(move || random_gets_and_puts(alloc, core, orders, ops)))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut owned = vec![false; alloc.frames()];
    for &(frame, order) in held.iter().flatten() {
        for (offset, owned) in owned[frame..frame + (1 << order)].iter_mut().enumerate() {
            assert!(!*owned, "frame {} handed out twice", frame + offset);
            *owned = true;
        }
    }
    let in_use = owned.iter().filter(|&&o| o).count();
    assert_eq!(alloc.free_frames(), alloc.frames() - in_use);
    for (core, frames) in held.into_iter().enumerate() {
        for (frame, order) in frames {
            alloc.put(core, frame, order).unwrap();
        }
    }
    (0..threads).for_each(|core| alloc.drain(core));
    assert_eq!(alloc.free_frames(), alloc.frames());
}

/// `ops` random gets (two in three) and puts of `orders` on `core`, which is drained at the end;
/// returns the frames still held, with their orders.
fn random_gets_and_puts(
    alloc: &dyn FrameAllocator,
    core: usize,
    orders: &[usize],
    ops: usize,
) -> Vec<(usize, usize)> {
    let mut rng = Rng::new(core as u64 + 1);
    let mut held = Vec::new();
    for _ in 0..ops {
        if !held.is_empty() && rng.below(3) == 0 {
            let (frame, order) = held.swap_remove(rng.below(held.len()));
            alloc.put(core, frame, order).unwrap();
            continue;
        }
        let order = orders[rng.below(orders.len())];
        match alloc.get(core, order) {
            Ok(frame) => held.push((frame, order)),
            Err(AllocError::Frame(llfree::Error::Memory { .. })) => {}
            Err(e) => panic!("get failed: {e}"),
        }
    }
    alloc.drain(core);
    held
}

/// Checks the error paths every order-0 allocator shares: double free, out of range, bad order.
pub fn rejects_bad_puts(alloc: &dyn FrameAllocator) {
    let frame = alloc.get(0, 0).unwrap();
    alloc.put(0, frame, 0).unwrap();
    assert!(matches!(
        alloc.put(0, frame, 0),
        Err(AllocError::Frame(llfree::Error::NotAllocated { .. }))
    ));
    assert!(matches!(
        alloc.put(0, alloc.frames(), 0),
        Err(AllocError::Frame(llfree::Error::OutOfRange { .. }))
    ));
    assert!(matches!(
        alloc.get(0, 63),
        Err(AllocError::Frame(llfree::Error::InvalidOrder(63)))
    ));
    assert!(!alloc.supports_order(63));
}

/// Allocates every frame of order 0 on core 0 and checks that they are distinct and that the
/// next allocation fails with [`AllocError::Memory`].
pub fn exhausts_exactly(alloc: &dyn FrameAllocator) {
    let mut seen = vec![false; alloc.frames()];
    for _ in 0..alloc.frames() {
        let frame = alloc.get(0, 0).unwrap();
        assert!(
            !std::mem::replace(&mut seen[frame], true),
            "frame {frame} twice"
        );
    }
    assert_eq!(
        alloc.get(0, 0),
        Err(AllocError::Frame(llfree::Error::Memory { order: 0 }))
    );
    assert_eq!(alloc.free_frames(), 0);
    for frame in 0..alloc.frames() {
        alloc.put(0, frame, 0).unwrap();
    }
    assert_eq!(alloc.free_frames(), alloc.frames());
}
