//! Unit tests of the allocator.

use std::fs::File;
use std::sync::Mutex;

use super::*;
use crate::region::{temp_file, FileRegion};
use crate::stop;
use crate::{FrameState, MAX_FRAMES};

fn zone(cores: usize, trees: usize) -> LLFree {
    LLFree::new(Config::new(cores, trees * TREE_FRAMES)).unwrap()
}

#[test]
fn every_order_round_trips() {
    let alloc = zone(2, 32);
    for order in (0..=MAX_ORDER).chain([GIANT_ORDER]) {
        let frame = alloc.get_frames(1, order).unwrap();
        assert!(!alloc.frames_are_free(frame, order));
        assert_eq!(alloc.free_frames(), alloc.frames() - (1 << order));
        alloc.validate().unwrap();
        alloc.put_frames(0, frame, order).unwrap();
        assert!(alloc.frames_are_free(frame, order));
        assert_eq!(alloc.free_frames(), alloc.frames());
    }
    alloc.validate().unwrap();
}

#[test]
fn is_allocated_checks_the_recorded_order() {
    let alloc = zone(2, 32);
    let huge = alloc.get_frames(0, HUGE_ORDER).unwrap();
    let pair = alloc.get_frames(0, 10).unwrap();
    let run = alloc.get_frames(0, 3).unwrap();
    let giant = alloc.get_frames(0, GIANT_ORDER).unwrap();
    assert!(alloc.frames_are_allocated(huge, HUGE_ORDER) && !alloc.frames_are_allocated(huge, 10));
    assert!(alloc.frames_are_allocated(pair, 10) && !alloc.frames_are_allocated(pair, HUGE_ORDER));
    assert!(alloc.frames_are_allocated(run, 3) && alloc.frames_are_allocated(run, 0));
    assert!(!alloc.frames_are_allocated(run + 8, 0) && !alloc.frames_are_allocated(run, 4));
    assert!(
        alloc.frames_are_allocated(giant, GIANT_ORDER)
            && !alloc.frames_are_allocated(giant, HUGE_ORDER)
    );
    assert!(!alloc.frames_are_allocated(usize::MAX, 0));
    let reserved: Vec<_> = alloc.reservations().collect();
    assert_eq!(reserved.len(), 2);
    assert!(reserved[0].is_some() && reserved[1].is_none());
}

#[test]
fn invalid_requests_are_errors() {
    let alloc = zone(1, 1);
    assert_eq!(alloc.get_frames(0, 11), Err(Error::InvalidOrder(11)));
    assert_eq!(alloc.put_frames(0, 0, 17), Err(Error::InvalidOrder(17)));
    assert_eq!(
        alloc.put_frames(0, TREE_FRAMES, 0),
        Err(Error::OutOfRange {
            frame: TREE_FRAMES,
            order: 0,
            frames: TREE_FRAMES
        })
    );
    assert_eq!(
        alloc.put_frames(0, 0, GIANT_ORDER),
        Err(Error::OutOfRange {
            frame: 0,
            order: GIANT_ORDER,
            frames: TREE_FRAMES
        })
    );
    assert_eq!(
        alloc.put_frames(0, 3, 1),
        Err(Error::Misaligned { frame: 3, order: 1 })
    );
    assert_eq!(
        alloc.put_frames(0, 0, 0),
        Err(Error::NotAllocated { frame: 0, order: 0 })
    );
    let huge = alloc.get_frames(0, HUGE_ORDER).unwrap();
    assert_eq!(
        alloc.put_frames(0, huge, 0),
        Err(Error::WrongOrder {
            frame: huge,
            order: 0
        })
    );
    assert_eq!(
        alloc.get_frames(0, GIANT_ORDER),
        Err(Error::Memory { order: 18 })
    );
    alloc.validate().unwrap();
    assert!(!alloc.frames_are_free(usize::MAX, 0));
}

#[test]
fn invalid_configurations_are_errors() {
    for config in [
        Config::new(0, 512),
        Config::new(1, 0),
        Config::new(1, 513),
        Config::new(1, MAX_FRAMES),
        Config {
            almost_allocated: TREE_FRAMES,
            almost_free: 1,
            ..Config::new(1, 512)
        },
    ] {
        assert!(matches!(LLFree::new(config), Err(InitError::Config(_))));
    }
}

#[test]
fn allocates_everything_then_frees_everything() {
    for order in [0, 3, 7, HUGE_ORDER, 10] {
        let alloc = zone(2, 2);
        let frames: Vec<usize> =
            std::iter::from_fn(|| alloc.get_frames(order, order).ok()).collect();
        assert_eq!(frames.len(), alloc.frames() >> order);
        assert_eq!(alloc.get_frames(0, order), Err(Error::Memory { order }));
        assert_eq!(alloc.free_frames(), 0);
        alloc.validate().unwrap();
        for frame in frames {
            alloc.put_frames(1, frame, order).unwrap();
        }
        assert_eq!(alloc.free_frames(), alloc.frames());
        assert_eq!(alloc.free_huge(), alloc.frames() / CHILD_FRAMES);
        alloc.validate().unwrap();
    }
}

#[test]
fn cores_reserve_different_trees() {
    let alloc = zone(2, 8);
    let a = alloc.get_frames(0, 0).unwrap();
    let b = alloc.get_frames(1, 0).unwrap();
    assert_ne!(a / TREE_FRAMES, b / TREE_FRAMES);
    assert_eq!(alloc.tree_stats().filter(|t| t.reserved).count(), 2);
    alloc.drain(CoreId(0));
    alloc.drain(CoreId(1));
    assert_eq!(alloc.tree_stats().filter(|t| t.reserved).count(), 0);
    alloc.validate().unwrap();
}

#[test]
fn reserve_on_free_takes_over_a_tree() {
    let alloc = zone(2, 8);
    let frames: Vec<usize> = (0..8).map(|_| alloc.get_frames(0, 0).unwrap()).collect();
    let tree = frames[0] / TREE_FRAMES;
    alloc.drain(CoreId(0));
    let own = alloc.get_frames(1, 0).unwrap() / TREE_FRAMES;
    assert_ne!(own, tree);
    for frame in &frames[..4] {
        alloc.put_frames(1, *frame, 0).unwrap();
    }
    let reserved: Vec<usize> = alloc
        .tree_stats()
        .filter(|t| t.reserved)
        .map(|t| t.index)
        .collect();
    assert_eq!(reserved, vec![tree]);
    // Core 1 now allocates next to the frames it freed.
    assert_eq!(alloc.get_frames(1, 0).unwrap() / TREE_FRAMES, tree);
    alloc.validate().unwrap();
}

#[test]
fn fragmented_trees_are_left_for_free_ones() {
    let alloc = zone(1, 2);
    // Take one base frame in every child of the first tree.
    let mut held = Vec::new();
    for _ in 0..TREE_FRAMES {
        held.push(alloc.get_frames(0, 0).unwrap());
        if held.len() == TREE_CHILDREN * 2 {
            break;
        }
    }
    let keep: Vec<usize> = held
        .iter()
        .copied()
        .filter(|f| f % CHILD_FRAMES == 0)
        .collect();
    for frame in held.iter().filter(|f| *f % CHILD_FRAMES != 0) {
        alloc.put_frames(0, *frame, 0).unwrap();
    }
    assert_eq!(keep.len(), 1);
    let huge = alloc.get_frames(0, HUGE_ORDER).unwrap();
    assert!(alloc.frames_are_free(huge, 0) || !alloc.frames_are_free(huge, HUGE_ORDER));
    alloc.validate().unwrap();
}

#[test]
fn fewer_trees_than_cores_share_slots() {
    let alloc = zone(8, 1);
    assert_eq!(alloc.cores(), 1);
    let frames: Vec<usize> = (0..16).map(|c| alloc.get_frames(c, 0).unwrap()).collect();
    for (c, frame) in frames.iter().enumerate() {
        alloc.put_frames(c + 3, *frame, 0).unwrap();
    }
    alloc.validate().unwrap();
}

#[test]
fn giant_frames_need_sixteen_free_trees() {
    let alloc = zone(2, 32);
    let a = alloc.get_frames(0, GIANT_ORDER).unwrap();
    let b = alloc.get_frames(1, GIANT_ORDER).unwrap();
    assert_ne!(a, b);
    assert_eq!(
        alloc.get_frames(0, GIANT_ORDER),
        Err(Error::Memory { order: 18 })
    );
    assert_eq!(alloc.get_frames(0, 0), Err(Error::Memory { order: 0 }));
    alloc.put_frames(0, a, GIANT_ORDER).unwrap();
    assert_eq!(alloc.free_giant(), 1);
    let base = alloc.get_frames(0, 0).unwrap();
    assert_eq!(
        alloc.get_frames(1, GIANT_ORDER),
        Err(Error::Memory { order: 18 })
    );
    alloc.put_frames(1, base, 0).unwrap();
    // The base frame's tree is still reserved by core 0: the giant search drains it.
    assert_eq!(alloc.get_frames(1, GIANT_ORDER), Ok(a));
    alloc.validate().unwrap();
}

#[test]
fn threads_of_one_core_race_for_a_new_tree() {
    for bits in 0..1u32 << 12 {
        let schedule: Vec<usize> = (0..12).map(|i| ((bits >> i) & 1) as usize).collect();
        let alloc = zone(1, 2);
        // Leave exactly one free frame in the reserved tree.
        let orders = [10; 15].into_iter().chain((0..HUGE_ORDER + 1).rev());
        let held: Vec<(usize, usize)> = orders
            .map(|o| (alloc.get_frames(0, o).unwrap(), o))
            .collect();
        assert_eq!(alloc.free_frames(), alloc.frames() - TREE_FRAMES + 1);
        let got = Mutex::new(Vec::new());
        stop::run(2, &schedule, |_| {
            let frame = alloc.get_frames(0, 0).unwrap();
            got.lock().unwrap().push(frame);
        });
        let mut got = got.into_inner().unwrap();
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len(), 2, "schedule {schedule:?}");
        assert!(got
            .iter()
            .all(|f| held.iter().all(|(h, o)| f < h || *f >= h + (1 << o))));
        alloc.validate().unwrap();
    }
}

fn persistent(file: &File, config: Config, init: Init) -> Result<LLFree, InitError> {
    let len = LLFree::metadata_size(config.frames);
    let region = FileRegion::map(file, 0, len).unwrap();
    LLFree::persistent(config, Box::new(region), init)
}

#[test]
fn persistent_state_survives_a_clean_shutdown() {
    let config = Config::new(2, 64 * TREE_FRAMES);
    let file = temp_file(LLFree::metadata_size(config.frames) as u64);
    assert!(matches!(
        persistent(&file, config, Init::Recover),
        Err(InitError::BadMagic { found: 0 })
    ));
    let alloc = persistent(&file, config, Init::Fresh).unwrap();
    let frames: Vec<(usize, usize)> = (0..=MAX_ORDER)
        .chain([GIANT_ORDER])
        .map(|order| (alloc.get_frames(order % 2, order).unwrap(), order))
        .collect();
    let free = alloc.free_frames();
    drop(alloc);
    let alloc = persistent(&file, config, Init::Recover).unwrap();
    assert_eq!(alloc.recovery(), Recovery::Clean);
    assert_eq!(alloc.free_frames(), free);
    for (frame, order) in &frames {
        assert!(!alloc.frames_are_free(*frame, *order));
    }
    alloc.validate().unwrap();
    drop(alloc);
    let alloc = persistent(&file, config, Init::RecoverDeep).unwrap();
    assert_eq!(alloc.recovery(), Recovery::Crash);
    assert_eq!(alloc.free_frames(), free);
    for (frame, order) in frames {
        alloc.put_frames(0, frame, order).unwrap();
    }
    assert_eq!(alloc.free_frames(), alloc.frames());
}

#[test]
fn persistent_metadata_is_checked() {
    let config = Config::new(1, TREE_FRAMES);
    let file = temp_file(LLFree::metadata_size(config.frames) as u64 * 2);
    drop(persistent(&file, config, Init::Fresh).unwrap());
    let bigger = Config::new(1, 2 * TREE_FRAMES);
    assert!(matches!(
        persistent(&file, bigger, Init::Recover),
        Err(InitError::Size { .. })
    ));
    let small = FileRegion::map(&file, 0, 4096).unwrap();
    assert!(matches!(
        LLFree::persistent(config, Box::new(small), Init::Fresh),
        Err(InitError::RegionTooSmall { .. })
    ));
    // Corrupt a child entry: the first pair claims 1000 free frames.
    let region = FileRegion::map(&file, 0, 8192).unwrap();
    // SAFETY: the region is 8192 bytes; the child pairs start at 4096.
    unsafe { region.as_ptr().add(4096).cast::<u32>().write(1000) };
    assert!(matches!(
        persistent(&file, config, Init::Recover),
        Err(InitError::Corrupted { index: 0, .. })
    ));
}

#[test]
fn flushed_persistent_metadata_round_trips() {
    let config = Config {
        flush: true,
        ..Config::new(1, TREE_FRAMES)
    };
    let file = temp_file(LLFree::metadata_size(config.frames) as u64);
    let alloc = persistent(&file, config, Init::Fresh).unwrap();
    let frame = alloc.get_frames(0, HUGE_ORDER).unwrap();
    drop(alloc);
    let alloc = persistent(&file, config, Init::Recover).unwrap();
    assert_eq!(alloc.recovery(), Recovery::Clean);
    assert!(alloc.frames_are_allocated(frame, HUGE_ORDER));
}

#[test]
fn a_crashed_allocator_is_recovered_deeply() {
    let config = Config::new(1, TREE_FRAMES);
    let file = temp_file(LLFree::metadata_size(config.frames) as u64);
    let alloc = persistent(&file, config, Init::Fresh).unwrap();
    let frame = alloc.get_frames(0, 0).unwrap();
    // Simulate a crash: the allocator is never dropped, so no clean marker is written.
    std::mem::forget(alloc);
    let alloc = persistent(&file, config, Init::Recover).unwrap();
    assert_eq!(alloc.recovery(), Recovery::Crash);
    assert!(!alloc.frames_are_free(frame, 0));
    assert_eq!(alloc.free_frames(), alloc.frames() - 1);
}

#[test]
fn get_at_takes_back_a_specific_huge_or_giant_frame() {
    let alloc = zone(2, 48);
    let huge = FrameId(3 * CHILD_FRAMES);
    alloc.get_at(huge, Order::HUGE).unwrap();
    assert!(alloc.is_allocated(huge, Order::HUGE));
    assert_eq!(
        alloc.get_at(huge, Order::HUGE),
        Err(Error::NotFree {
            frame: huge.0,
            order: HUGE_ORDER
        })
    );
    assert_eq!(alloc.free_frames(), alloc.frames() - CHILD_FRAMES);
    // A tree reserved by a core is given back first.
    let base = alloc.get_frames(1, 0).unwrap();
    let next = FrameId(base / CHILD_FRAMES * CHILD_FRAMES + CHILD_FRAMES);
    alloc.get_at(next, Order::HUGE).unwrap();
    let giant = FrameId(2 << GIANT_ORDER);
    alloc.get_at(giant, Order::GIANT).unwrap();
    assert!(alloc.is_allocated(giant, Order::GIANT));
    assert!(
        alloc.get_at(FrameId(0), Order::GIANT).is_err(),
        "partly used"
    );
    assert_eq!(
        alloc.get_at(FrameId(0), Order(3)),
        Err(Error::InvalidOrder(3))
    );
    alloc.validate().unwrap();
    alloc.put(CoreId(0), giant, Order::GIANT).unwrap();
    alloc.put(CoreId(0), next, Order::HUGE).unwrap();
    alloc.put(CoreId(0), huge, Order::HUGE).unwrap();
    alloc.put_frames(0, base, 0).unwrap();
    assert_eq!(alloc.free_frames(), alloc.frames());
}

#[test]
fn frame_states_classify_every_frame_of_an_order() {
    let alloc = zone(1, 32);
    let huge = alloc.get(CoreId(0), Order::HUGE).unwrap();
    let base = alloc.get(CoreId(0), Order::BASE).unwrap();
    let states: Vec<_> = alloc.frame_states(Order::HUGE).collect();
    assert_eq!(states.len(), 32 * TREE_CHILDREN);
    assert_eq!(states[huge.0 / CHILD_FRAMES], FrameState::Allocated);
    assert_eq!(states[base.0 / CHILD_FRAMES], FrameState::Mixed);
    let free = states.iter().filter(|s| **s == FrameState::Free).count();
    assert_eq!(free, states.len() - 2);
    let giant = alloc.get(CoreId(0), Order::GIANT).unwrap();
    let giants: Vec<_> = alloc.frame_states(Order::GIANT).collect();
    assert_eq!(giants.len(), 2);
    assert_eq!(giants[giant.0 >> GIANT_ORDER], FrameState::Allocated);
    assert_eq!(giants[1 - (giant.0 >> GIANT_ORDER)], FrameState::Mixed);
}

/// A shared allocator on `file` with `init`, as one process of several maps it.
fn shared(file: &File, frames: usize, init: Init) -> LLFree {
    let config = Config {
        shared: true,
        ..Config::new(1, frames)
    };
    persistent(file, config, init).unwrap()
}

/// Two processes on one shared region of `frames`: a survivor holding one slot (owner 7) and
/// one that is about to die holding `slots` (owner 9); the file, then each with its first slot.
fn survivor_and_dead(frames: usize, slots: usize) -> (File, (LLFree, CoreId), (LLFree, CoreId)) {
    let file = temp_file(LLFree::metadata_size(frames) as u64);
    let survivor = shared(&file, frames, Init::Fresh);
    let dead = shared(&file, frames, Init::Attach);
    let live = survivor.claim_slots(7, 1).unwrap();
    let gone = dead.claim_slots(9, slots).unwrap();
    (file, (survivor, live), (dead, gone))
}

#[test]
fn owners_on_one_shared_region_allocate_side_by_side_and_leave_it_consistent() {
    let frames = 16 * TREE_FRAMES;
    let file = temp_file(LLFree::metadata_size(frames) as u64);
    let first = shared(&file, frames, Init::Fresh);
    // A second mapping of the same file: another process.
    let second = shared(&file, frames, Init::Attach);
    assert_eq!(second.recovery(), Recovery::Attached);
    assert_eq!(first.cores(), PERSISTENT_SLOTS);
    let a = first.claim_slots(1, 3).unwrap();
    let b = second.claim_slots(2, 2).unwrap();
    assert_eq!((a, b), (CoreId(0), CoreId(3)));
    assert_eq!(&first.slot_owners()[..6], [1, 1, 1, 2, 2, 0]);
    let held = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for (alloc, core) in [(&first, 0), (&first, 1), (&second, 3), (&second, 4)] {
            let held = &held;
            scope.spawn(move || {
                let mut mine = Vec::new();
                for round in 0..2000 {
                    let order = [0, 3, HUGE_ORDER, 0][round % 4];
                    if let Ok(frame) = alloc.get_frames(core, order) {
                        mine.push((frame, order));
                    }
                    if round % 3 == 0 {
                        if let Some((frame, order)) = mine.pop() {
                            alloc.put_frames(core, frame, order).unwrap();
                        }
                    }
                }
                held.lock().unwrap().extend(mine);
            });
        }
    });
    let held = held.into_inner().unwrap();
    let mut seen = std::collections::HashSet::new();
    for &(frame, order) in &held {
        assert!(first.frames_are_allocated(frame, order));
        for f in frame..frame + (1 << order) {
            assert!(seen.insert(f), "frame {f} handed out twice");
        }
    }
    assert_eq!(first.free_frames(), frames - seen.len());
    assert_eq!(second.free_frames(), first.free_frames(), "one state");
    // The second owner leaves; its frames are still allocated (its users keep them).
    assert_eq!(second.release_slots(2), 2);
    drop(second);
    first.validate().unwrap();
    // It comes back and frees what it held, into trees the first owner may have reserved.
    let again = shared(&file, frames, Init::Attach);
    let core = again.claim_slots(2, 1).unwrap();
    assert_eq!(core, CoreId(3), "the freed slots are claimed again");
    for (frame, order) in held {
        again.put_frames(core.0, frame, order).unwrap();
    }
    assert_eq!(first.free_frames(), frames);
    assert_eq!(again.release_slots(2) + first.release_slots(1), 4);
    first.validate().unwrap();
    assert!(first.slot_owners().iter().all(|owner| *owner == 0));
}

#[test]
fn a_dead_owner_s_reservations_are_recounted_while_others_allocate() {
    let frames = 8 * TREE_FRAMES;
    let (_file, (survivor, live), (dead, gone)) = survivor_and_dead(frames, 2);
    let mut kept = Vec::new();
    for core in [gone.0, gone.0 + 1] {
        for _ in 0..100 {
            kept.push(dead.get_frames(core, 0).unwrap());
        }
    }
    // Its local counter drifts as if it died in the middle of an allocation.
    dead.locals.get(gone.0).take(5).unwrap();
    // The process dies: nothing of it runs any more, its slots stay claimed.
    drop(dead);
    assert!(
        survivor.validate().is_err(),
        "a local counter lost 5 frames"
    );
    let report = std::thread::scope(|scope| {
        let busy = scope.spawn(|| {
            for _ in 0..500 {
                let frame = survivor.get_frames(live.0, HUGE_ORDER).unwrap();
                survivor.put_frames(live.0, frame, HUGE_ORDER).unwrap();
            }
        });
        let report = survivor.recover_slots(9);
        busy.join().unwrap();
        report
    });
    assert_eq!(
        report,
        SlotRecovery {
            slots: 2,
            trees: 2,
            counter_drift: -5,
            cached_frames: 0,
        }
    );
    assert_eq!(survivor.slot_owners()[gone.0], 0);
    survivor.validate().unwrap();
    assert_eq!(survivor.free_frames(), frames - kept.len());
    for frame in kept {
        assert!(
            survivor.frames_are_allocated(frame, 0),
            "its frames stay with their users"
        );
    }
}

#[test]
fn a_dead_owner_s_cached_frames_come_back_even_after_survivors_drained_its_reservation() {
    let frames = 4 * TREE_FRAMES;
    let (_file, (survivor, live), (dead, gone)) = survivor_and_dead(frames, 1);
    let mut cache = dead.core_cache(gone);
    let kept: Vec<_> = (0..100)
        .map(|_| dead.get_cached(&mut cache, Order(0)).unwrap())
        .collect();
    let cached = cache.frames();
    assert!(cached > 0);
    // The process dies with frames in its cache; a survivor drains its reservation first.
    std::mem::forget(cache);
    drop(dead);
    survivor.drain(gone);
    assert_eq!(
        survivor.free_frames(),
        frames - kept.len() - cached,
        "the cache's frames are out of every counter"
    );
    let report = survivor.recover_slots(9);
    assert_eq!(
        (report.slots, report.trees),
        (1, 0),
        "nothing left reserved"
    );
    assert_eq!(report.cached_frames, cached);
    assert_eq!(survivor.free_frames(), frames - kept.len());
    survivor.validate().unwrap();
    // And they can be allocated again.
    let all: Vec<_> = (0..frames - kept.len())
        .map(|_| survivor.get_frames(live.0, 0).unwrap())
        .collect();
    assert!(matches!(
        survivor.get_frames(live.0, 0),
        Err(Error::Memory { .. })
    ));
    for frame in all.into_iter().chain(kept.into_iter().map(|f| f.0)) {
        survivor.put_frames(live.0, frame, 0).unwrap();
    }
    survivor.validate().unwrap();
}

#[test]
fn frames_a_dead_owner_freed_through_its_cache_come_back_to_their_tree() {
    let frames = 4 * TREE_FRAMES;
    let (_file, (survivor, live), (dead, device)) = survivor_and_dead(frames, 1);
    // The survivor's VM had the frames; the dead process's device freed them through its
    // cache (a balloon or an unplug) and died before giving them to the tree.
    let taken: Vec<_> = (0..8)
        .map(|_| survivor.get_frames(live.0, HUGE_ORDER).unwrap())
        .collect();
    let mut cache = dead.core_cache(device);
    for &frame in &taken {
        dead.put_cached(&mut cache, FrameId(frame), Order::HUGE)
            .unwrap();
    }
    assert_eq!(cache.frames(), 8 * CHILD_FRAMES);
    std::mem::forget(cache);
    drop(dead);
    survivor.drain(live);
    assert_eq!(
        survivor.free_frames(),
        frames - 8 * CHILD_FRAMES,
        "owed by the tree"
    );
    assert_eq!(survivor.available_frames(), frames, "but free");
    let report = survivor.recover_slots(9);
    assert_eq!(report.cached_frames, 8 * CHILD_FRAMES);
    assert_eq!(survivor.free_frames(), frames);
    survivor.validate().unwrap();
}

#[test]
fn slots_are_claimed_in_runs_and_only_by_one_owner() {
    let frames = 2 * TREE_FRAMES;
    let file = temp_file(LLFree::metadata_size(frames) as u64);
    let alloc = shared(&file, frames, Init::Fresh);
    assert_eq!(alloc.claim_slots(1, 2), Some(CoreId(0)));
    assert_eq!(alloc.claim_slots(2, 1), Some(CoreId(2)));
    assert_eq!(alloc.release_slots(1), 2);
    assert_eq!(
        alloc.claim_slots(3, 3),
        Some(CoreId(3)),
        "0..2 is too short a run"
    );
    assert_eq!(alloc.claim_slots(4, 2), Some(CoreId(0)));
    assert_eq!(alloc.claim_slots(5, PERSISTENT_SLOTS), None);
    assert_eq!(alloc.claim_slots(5, 0), None);
    // A shared allocator's drop does not mark the region clean: the last user does.
    drop(alloc);
    let reopened = shared(&file, frames, Init::Recover);
    assert_eq!(reopened.recovery(), Recovery::Crash);
    assert!(
        reopened.slot_owners().iter().all(|o| *o == 0),
        "recovery frees every slot"
    );
    reopened.mark_clean();
    drop(reopened);
    assert_eq!(
        shared(&file, frames, Init::Recover).recovery(),
        Recovery::Clean
    );
}
