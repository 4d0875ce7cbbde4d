//! Crash consistency with real crashes: a forked child allocates and frees at random in a
//! persistent zone on a shared file mapping and logs what it holds; the parent kills it with
//! SIGKILL at a random moment, recovers the zone and checks that every logged frame is still
//! allocated. At most one frame run per in-flight operation (one per child thread) may be lost.
//!
//! `LLFREE_CRASHES=N` sets the number of crashes (default 200).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use llfree::{
    Config, CoreId, FileRegion, FrameId, Init, LLFree, Order, Recovery, GIANT_ORDER, TREE_FRAMES,
};

/// Threads in the child, each with an operation in flight at any time.
const THREADS: usize = 2;
/// Log slots per thread.
const SLOTS: usize = 512;
/// Orders the child allocates.
const ORDERS: [usize; 8] = [0, 0, 0, 2, 5, 9, 10, GIANT_ORDER];

/// Memory shared between parent and child: an operation counter and one log per thread.
/// A slot holds `(frame << 8 | order) + 1`, or 0 when empty.
struct Log {
    ops: AtomicU64,
    slots: [[AtomicU64; SLOTS]; THREADS],
}

fn shared_log() -> &'static Log {
    // SAFETY: a fresh anonymous shared mapping, checked below; zeroed memory is a valid `Log`
    // (atomics only). It is never unmapped, so the reference is valid for the process lifetime
    // and shared with forked children.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            std::mem::size_of::<Log>(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(ptr, libc::MAP_FAILED);
        &*ptr.cast::<Log>()
    }
}

fn open(file: &File, config: Config, init: Init) -> LLFree {
    let region = FileRegion::map(file, 0, LLFree::metadata_size(config.frames)).unwrap();
    LLFree::persistent(config, Box::new(region), init).unwrap()
}

/// The child: allocate and free forever, logging held frames.
fn child(file: &File, config: Config, log: &'static Log, seed: u64) -> ! {
    let alloc = open(file, config, Init::Recover);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let alloc = &alloc;
            scope.spawn(move || {
                let mut rng = (seed + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t as u64 + 1);
                loop {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let slot = &log.slots[t][(rng % SLOTS as u64) as usize];
                    match slot.load(Ordering::Acquire) {
                        0 => {
                            let order = ORDERS[(rng >> 32) as usize % ORDERS.len()];
                            if let Ok(FrameId(frame)) = alloc.get(CoreId(t), Order(order)) {
                                slot.store(((frame << 8 | order) + 1) as u64, Ordering::Release);
                            }
                        }
                        entry => {
                            slot.store(0, Ordering::Release);
                            let entry = entry as usize - 1;
                            let (frame, order) = (FrameId(entry >> 8), Order(entry & 0xff));
                            alloc.put(CoreId(t), frame, order).unwrap();
                        }
                    }
                    log.ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    unreachable!()
}

#[test]
fn recovers_after_sigkill() {
    let crashes: usize = std::env::var("LLFREE_CRASHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let config = Config::new(THREADS, 64 * TREE_FRAMES);
    let path = std::env::temp_dir().join(format!("llfree-crash-{}", std::process::id()));
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file.set_len(LLFree::metadata_size(config.frames) as u64)
        .unwrap();
    let log = shared_log();
    let mut lost_total = 0;
    let mut crashes_with_loss = 0;
    let mut lost_ops = 0;
    let start = Instant::now();
    for crash in 0..crashes {
        // A fresh zone and an empty log for every run.
        drop(open(&file, config, Init::Fresh));
        log.ops.store(0, Ordering::Relaxed);
        for slot in log.slots.iter().flatten() {
            slot.store(0, Ordering::Relaxed);
        }
        // SAFETY: fork in a test process; the child only runs `child` and never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            child(&file, config, log, crash as u64);
        }
        let target = 1000 + (crash as u64 * 7919) % 20_000;
        let deadline = Instant::now() + Duration::from_secs(10);
        while log.ops.load(Ordering::Relaxed) < target && Instant::now() < deadline {
            std::hint::spin_loop();
        }
        // SAFETY: `pid` is our child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(
            log.ops.load(Ordering::Relaxed) >= target,
            "child made no progress"
        );

        let alloc = open(&file, config, Init::Recover);
        assert_eq!(alloc.recovery(), Recovery::Crash);
        alloc.validate().unwrap();
        let mut logged = vec![false; alloc.frames()];
        for entry in log.slots.iter().flatten() {
            let entry = entry.load(Ordering::Relaxed) as usize;
            if entry != 0 {
                let (frame, order) = ((entry - 1) >> 8, (entry - 1) & 0xff);
                assert!(
                    !alloc.is_free(FrameId(frame), Order(order)),
                    "logged frame {frame} lost"
                );
                logged[frame..frame + (1 << order)].fill(true);
            }
        }
        let lost_runs = lost_runs(&alloc, &logged);
        // At most one operation per thread was in flight.
        assert!(lost_runs.len() <= THREADS, "lost {lost_runs:?}");
        let lost: usize = lost_runs.iter().map(|(_, frames)| frames).sum();
        assert_eq!(
            alloc.free_frames(),
            alloc.frames() - lost - logged.iter().filter(|l| **l).count()
        );
        lost_ops += lost_runs.len();
        lost_total += lost;
        crashes_with_loss += usize::from(lost > 0);
        // Everything logged can still be freed.
        for entry in log.slots.iter().flatten() {
            let entry = entry.load(Ordering::Relaxed) as usize;
            if entry != 0 {
                let (frame, order) = (FrameId((entry - 1) >> 8), Order((entry - 1) & 0xff));
                alloc.put(CoreId(0), frame, order).unwrap();
            }
        }
        assert_eq!(alloc.free_frames(), alloc.frames() - lost);
    }
    eprintln!(
        "{crashes} crashes in {:.1?}: {crashes_with_loss} crashes lost frames, {lost_ops} \
         operations ({lost_total} frames) in all; bound: one operation per thread ({THREADS})",
        start.elapsed()
    );
}

/// Runs of allocated frames that are not logged: `(first frame, frames)`.
fn lost_runs(alloc: &LLFree, logged: &[bool]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for child in (0..alloc.frames()).step_by(512) {
        if alloc.is_free(FrameId(child), Order::HUGE) {
            continue;
        }
        for (frame, logged) in logged.iter().enumerate().skip(child).take(512) {
            if *logged || alloc.is_free(FrameId(frame), Order::BASE) {
                continue;
            }
            match runs.last_mut() {
                Some((first, frames)) if *first + *frames == frame => *frames += 1,
                _ => runs.push((frame, 1)),
            }
        }
    }
    runs
}
