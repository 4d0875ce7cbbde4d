//! Tests of the buddy allocator.

use super::*;
use crate::testing::{exhausts_exactly, rejects_bad_puts, stress};

fn buddy(frames: usize, cores: usize) -> Buddy {
    Buddy::new(BuddyConfig::new(cores), frames).unwrap()
}

#[test]
fn rejects_bad_zones() {
    assert!(Buddy::new(BuddyConfig::new(1), 0).is_err());
    assert!(Buddy::new(BuddyConfig::new(0), 1024).is_err());
}

#[test]
fn allocates_aligned_blocks_of_every_order() {
    let alloc = buddy(1 << 14, 1);
    for order in 0..=MAX_ORDER {
        let frame = alloc.get(0, order).unwrap();
        assert_eq!(frame % (1 << order), 0);
        assert_eq!(
            alloc.pages[frame].state.load(Relaxed),
            state_allocated(order)
        );
        alloc.put(0, frame, order).unwrap();
    }
    alloc.drain(0);
    assert_eq!(alloc.free_huge(), 32);
}

#[test]
fn wrong_order_and_inner_frames_are_rejected() {
    let alloc = buddy(1 << 12, 1);
    let frame = alloc.get(0, 3).unwrap();
    assert_eq!(
        alloc.put(0, frame, 2),
        Err(AllocError::Frame(llfree::Error::NotAllocated {
            frame,
            order: 2
        }))
    );
    assert!(alloc.put(0, frame + 1, 0).is_err());
    assert!(matches!(
        alloc.put(0, frame + 1, 3),
        Err(AllocError::Frame(llfree::Error::Misaligned { .. }))
    ));
    alloc.put(0, frame, 3).unwrap();
    rejects_bad_puts(&alloc);
}

#[test]
fn exhausts_exactly_through_the_pcp() {
    exhausts_exactly(&buddy(3000, 1));
}

#[test]
fn pcp_frames_are_drained_for_other_cores_and_orders() {
    let alloc = buddy(1024, 2);
    let frame = alloc.get(0, 0).unwrap();
    alloc.put(0, frame, 0).unwrap();
    // Core 0 caches frames; a large allocation must drain them to merge the zone again.
    assert!(!alloc.pcp(0).lock().is_empty());
    assert_eq!(alloc.get(1, 10), Ok(0));
    assert_eq!(alloc.pcp(0).lock().len(), 0);
    alloc.put(1, 0, 10).unwrap();
}

#[test]
fn pcp_gives_batches_back_at_the_high_mark() {
    let alloc = buddy(4096, 1);
    let frames: Vec<usize> = (0..1000).map(|_| alloc.get(0, 0).unwrap()).collect();
    for frame in frames {
        alloc.put(0, frame, 0).unwrap();
        assert!(alloc.pcp(0).lock().len() < alloc.high);
    }
}

#[test]
fn counts_free_frames_per_huge_block() {
    let alloc = buddy(2048 + 512, 1);
    let a = alloc.get(0, 9).unwrap();
    let b = alloc.get(0, 0).unwrap();
    let mut counts = vec![0u16; 5];
    alloc.count_free_per_huge(&mut counts);
    assert_eq!(
        counts.iter().map(|&c| c as usize).sum::<usize>(),
        2048 + 512 - 513
    );
    assert_eq!(counts[a >> 9], 0);
    assert_eq!(counts[b >> 9], 511);
    assert_eq!(alloc.free_huge(), 3);
}

#[test]
fn stress_all_orders() {
    let alloc = buddy(1 << 16, 4);
    stress(&alloc, 4, &[0, 0, 0, 1, 2, 5, 9, 10], 20_000);
    assert_eq!(alloc.free_huge(), 128);
}

#[test]
fn stress_order_zero_with_shared_cores() {
    let alloc = buddy(1 << 12, 1);
    stress(&alloc, 4, &[0], 50_000);
}
