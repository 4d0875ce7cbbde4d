//! Unit and deterministic interleaving tests of the lower level.

use std::sync::Mutex;

use super::*;
use crate::meta::Layout;
use crate::region::{HeapRegion, MetaRegion};
use crate::stop;
use crate::InitError;

/// A lower level of `children` free children on leaked heap memory.
fn lower(children: usize) -> Lower {
    let layout = Layout::new(children * CHILD_FRAMES, false, 1);
    let region: &'static HeapRegion = Box::leak(Box::new(HeapRegion::new(layout.size).unwrap()));
    // SAFETY: the region is leaked, so it lives forever; the offsets come from the layout.
    let (pairs, fields) = unsafe {
        (
            std::slice::from_raw_parts(
                region.as_ptr().add(layout.pairs).cast::<ChildPair>(),
                Lower::pairs_size(children) / 4,
            ),
            std::slice::from_raw_parts(
                region.as_ptr().add(layout.fields).cast::<Bitfield>(),
                children,
            ),
        )
    };
    let lower = Lower::new(pairs, fields, false);
    lower.init_fresh();
    lower
}

/// Every schedule of `len` turns for two threads.
fn schedules(len: u32) -> impl Iterator<Item = Vec<usize>> {
    (0..1u32 << len).map(move |bits| (0..len).map(|i| ((bits >> i) & 1) as usize).collect())
}

#[test]
fn every_order_round_trips() {
    let lower = lower(64);
    for order in 0..=10 {
        let frame = lower.get(0, order).unwrap();
        assert_eq!(frame % (1 << order), 0);
        assert!(!lower.is_free(frame, order));
        lower.put(frame, order).unwrap();
        assert!(lower.is_free(frame, order));
        assert_eq!(
            lower.put(frame, order),
            Err(Error::NotAllocated { frame, order })
        );
    }
    lower.validate_counters().unwrap();
}

#[test]
fn wrong_orders_are_detected() {
    let lower = lower(32);
    let huge = lower.get(0, HUGE_ORDER).unwrap();
    assert!(matches!(lower.put(huge, 0), Err(Error::WrongOrder { .. })));
    assert!(matches!(lower.put(huge, 10), Err(Error::WrongOrder { .. })));
    let pair = lower.get(0, 10).unwrap();
    assert!(matches!(
        lower.put(pair, HUGE_ORDER),
        Err(Error::WrongOrder { .. })
    ));
    let base = lower.get(0, 0).unwrap();
    assert!(matches!(
        lower.put(base, HUGE_ORDER),
        Err(Error::WrongOrder { .. })
    ));
    lower.put(huge, HUGE_ORDER).unwrap();
    lower.put(pair, 10).unwrap();
    lower.put(base, 0).unwrap();
    lower.validate_counters().unwrap();
}

#[test]
fn giant_frames_commit_and_recover() {
    let lower = lower(1024);
    assert!(lower.get_giant(0));
    assert!(!lower.is_free(0, GIANT_ORDER));
    assert!((0..512).all(|c| lower.child(c) == GIANT_CHILD));
    lower.recover(true).unwrap();
    assert!((0..512).all(|c| lower.child(c) == GIANT_CHILD));
    assert!(matches!(
        lower.put_giant(1 << 18),
        Err(Error::NotAllocated { .. })
    ));
    lower.put_giant(0).unwrap();
    assert!(lower.is_free(0, GIANT_ORDER));
    // An unfinished allocation (first child not yet committed) is undone by recovery.
    for p in 1..256 {
        lower.pairs[p].store([GIANT_CHILD; 2]);
    }
    lower.recover(true).unwrap();
    assert!(lower.is_free(0, GIANT_ORDER));
    // A giant frame does not fit over used children.
    lower.get(CHILD_FRAMES * 700, 0).unwrap();
    assert!(!lower.get_giant(1 << 18));
    assert!(lower.is_free(1 << 18, HUGE_ORDER));
}

#[test]
fn deep_recovery_rebuilds_counters_from_bitfields() {
    let lower = lower(4);
    let frame = lower.get(0, 3).unwrap();
    // A crash between the counter decrement and the bit set: the counter is off by 8.
    assert_eq!(lower.pair(1).take(1, 8), Some(CHILD_FRAMES));
    lower.recover(true).unwrap();
    assert_eq!(lower.child(0).free(), CHILD_FRAMES - 8);
    assert_eq!(lower.child(1).free(), CHILD_FRAMES);
    lower.put(frame, 3).unwrap();
    lower.validate_counters().unwrap();
}

#[test]
fn recovery_rejects_corrupted_entries() {
    let lower = lower(4);
    lower.pairs[0].store([Child::new(0, PAIR), Child::FREE]);
    assert!(matches!(
        lower.recover(false),
        Err(InitError::Corrupted { index: 0, .. })
    ));
    lower.pairs[0].store([Child::FREE, Child::new(7, HUGE)]);
    assert!(matches!(
        lower.recover(false),
        Err(InitError::Corrupted { index: 1, .. })
    ));
    lower.pairs[0].store([Child::FREE, Child::new(0, HUGE | PAIR)]);
    assert!(lower.recover(false).is_err());
    lower.pairs[0].store([Child::new(0, GIANT), Child::FREE]);
    assert!(matches!(
        lower.recover(false),
        Err(InitError::Corrupted { .. })
    ));
}

/// Two threads race on one child (the interleavings of every stop point are enumerated).
fn race(
    children: usize,
    len: u32,
    setup: impl Fn(&Lower),
    op: impl Fn(&Lower, usize) -> Option<usize> + Sync,
    check: impl Fn(&Lower, &[Option<usize>]),
) {
    for schedule in schedules(len) {
        let lower = lower(children);
        setup(&lower);
        let results = Mutex::new([None; 2]);
        stop::run(2, &schedule, |id| {
            let result = op(&lower, id);
            results.lock().unwrap()[id] = result;
        });
        lower.validate_counters().unwrap();
        check(&lower, &*results.lock().unwrap());
    }
}

#[test]
fn concurrent_base_gets_and_puts_on_one_bitfield() {
    race(
        1,
        10,
        |lower| {
            lower.get(0, 0).unwrap();
        },
        |lower, id| {
            if id == 0 {
                lower.get(0, 0)
            } else {
                lower.put(0, 0).ok().map(|_| 0)
            }
        },
        |lower, results| {
            let got = results[0].unwrap();
            assert_eq!(results[1], Some(0));
            assert!(!lower.is_free(got, 0));
            assert_eq!(lower.child(0).free(), CHILD_FRAMES - 1);
        },
    );
}

#[test]
fn order_9_against_order_0_in_one_child() {
    race(
        1,
        10,
        |_| {},
        |lower, id| lower.get(0, if id == 0 { HUGE_ORDER } else { 0 }),
        |lower, results| {
            assert!(results[0].is_some() != results[1].is_some());
            let free = if results[0].is_some() {
                0
            } else {
                CHILD_FRAMES - 1
            };
            assert_eq!(lower.child(0).free(), free);
        },
    );
}

#[test]
fn order_10_pairs_against_order_9() {
    race(
        2,
        10,
        |_| {},
        |lower, id| lower.get(CHILD_FRAMES, if id == 0 { 10 } else { HUGE_ORDER }),
        |lower, results| {
            // Either the pair won (and the huge frame found no free child), or the huge frame
            // took one child and the pair failed.
            assert!(results[0].is_some() != results[1].is_some());
            if results[0].is_some() {
                assert_eq!(lower.pair(0).load(), [PAIR_CHILD; 2]);
            } else {
                assert_eq!(lower.child(results[1].unwrap() / CHILD_FRAMES), HUGE_CHILD);
            }
        },
    );
}

#[test]
fn race_for_the_last_free_frame() {
    race(
        1,
        10,
        |lower| {
            for _ in 0..CHILD_FRAMES - 1 {
                lower.get(0, 0).unwrap();
            }
        },
        |lower, _| lower.get(0, 0),
        |lower, results| {
            assert_eq!(results.iter().flatten().count(), 1);
            assert_eq!(lower.child(0).free(), 0);
        },
    );
}

#[test]
fn racing_double_free_succeeds_once() {
    race(
        1,
        8,
        |lower| {
            lower.get(0, 4).unwrap();
        },
        |lower, _| lower.put(0, 4).ok().map(|_| 0),
        |lower, results| {
            assert_eq!(results.iter().flatten().count(), 1);
            assert_eq!(lower.child(0).free(), CHILD_FRAMES);
        },
    );
}

#[test]
fn racing_multi_word_orders_roll_back() {
    race(
        1,
        10,
        |lower| {
            lower.get(0, 8).unwrap();
        },
        |lower, _| lower.get(0, 8),
        |lower, results| {
            assert_eq!(results.iter().flatten().count(), 1);
            assert_eq!(lower.child(0).free(), 0);
        },
    );
}
