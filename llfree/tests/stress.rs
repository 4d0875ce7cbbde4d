//! Multi-thread stress for every order: threads allocate and free at random; afterwards no frame
//! was handed out twice, the free counts are exact and everything is free again.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::sync::atomic::{AtomicBool, Ordering};

use llfree::{Config, CoreId, FrameId, LLFree, Order, GIANT_ORDER, MAX_ORDER, TREE_FRAMES};

/// A small xorshift generator (deterministic per seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Marks frames as handed out; panics if one is handed out twice.
struct Owners(Vec<AtomicBool>);

impl Owners {
    fn claim(&self, frame: usize, order: usize) {
        for f in frame..frame + (1 << order) {
            assert!(
                !self.0[f].swap(true, Ordering::AcqRel),
                "frame {f} handed out twice"
            );
        }
    }
    fn release(&self, frame: usize, order: usize) {
        for f in frame..frame + (1 << order) {
            assert!(
                self.0[f].swap(false, Ordering::AcqRel),
                "frame {f} freed but not owned"
            );
        }
    }
}

fn stress(order: usize, trees: usize, threads: usize, cores: usize, rounds: usize) {
    let alloc = LLFree::new(Config::new(cores, trees * TREE_FRAMES)).unwrap();
    let owners = Owners(
        (0..alloc.frames())
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    let capacity = alloc.frames() >> order;
    let held: Vec<Vec<FrameId>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (alloc, owners) = (&alloc, &owners);
                scope.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9 + t as u64);
                    let mut held = Vec::new();
                    for _ in 0..rounds {
                        if held.is_empty() || rng.below(3) != 0 {
                            match alloc.get(CoreId(t), Order(order)) {
                                Ok(frame) => {
                                    owners.claim(frame.0, order);
                                    held.push(frame);
                                }
                                Err(llfree::Error::Memory { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        } else {
                            let frame = held.swap_remove(rng.below(held.len()));
                            owners.release(frame.0, order);
                            // Free from a random core: foreign frees and reserve-on-free.
                            let core = CoreId(rng.below(cores + 1));
                            alloc.put(core, frame, Order(order)).unwrap();
                        }
                    }
                    held
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let in_use: usize = held.iter().map(Vec::len).sum();
    assert!(in_use <= capacity);
    assert_eq!(alloc.free_frames(), alloc.frames() - (in_use << order));
    alloc.validate().unwrap();
    for (t, frames) in held.into_iter().enumerate() {
        for frame in frames {
            owners.release(frame.0, order);
            alloc.put(CoreId(t), frame, Order(order)).unwrap();
        }
    }
    assert_eq!(alloc.free_frames(), alloc.frames());
    assert_eq!(alloc.free_huge(), alloc.frames() / 512);
    alloc.validate().unwrap();
}

#[test]
fn base_orders() {
    for order in 0..=8 {
        stress(order, 4, 4, 2, 20_000 >> (order / 2));
    }
}

#[test]
fn huge_orders() {
    stress(9, 4, 4, 2, 5_000);
    stress(10, 4, 4, 2, 5_000);
}

#[test]
fn giant_order() {
    stress(GIANT_ORDER, 64, 4, 4, 200);
}

#[test]
fn exhaustion_with_more_threads_than_trees() {
    // Threads drain each other's reservations while the zone runs full.
    stress(0, 1, 4, 4, 40_000);
    stress(MAX_ORDER, 1, 4, 4, 2_000);
}

#[test]
fn mixed_orders_on_one_zone() {
    let alloc = LLFree::new(Config::new(2, 64 * TREE_FRAMES)).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let alloc = &alloc;
            scope.spawn(move || {
                let mut rng = Rng(7 + t as u64);
                let mut held = Vec::new();
                for _ in 0..20_000 {
                    if held.is_empty() || rng.below(2) == 0 {
                        let order = [0, 0, 0, 1, 3, 9, 10, GIANT_ORDER][rng.below(8)];
                        if let Ok(frame) = alloc.get(CoreId(t), Order(order)) {
                            held.push((frame, order));
                        }
                    } else {
                        let (frame, order) = held.swap_remove(rng.below(held.len()));
                        alloc.put(CoreId(t), frame, Order(order)).unwrap();
                    }
                }
                for (frame, order) in held {
                    alloc.put(CoreId(t), frame, Order(order)).unwrap();
                }
            });
        }
    });
    assert_eq!(alloc.free_frames(), alloc.frames());
    alloc.validate().unwrap();
}
