//! Several processes share one persistent allocator in a file: each maps it, claims per-core
//! slots and allocates and frees from its threads at once. Afterwards no frame was handed to two
//! of them, every frame they hold is allocated, and the counters agree with the lower level; a
//! process SIGKILLed in the middle is recovered while the others go on, and one killed with
//! frames in its core cache gets them back to the zone even after its reservation was drained.
//!
//! The children are this test binary again, run with `LLFREE_SHARED_CHILD` set.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use llfree::{Config, CoreId, FileRegion, FrameId, Init, LLFree, Order, Recovery, TREE_FRAMES};

const CHILD_ENV: &str = "LLFREE_SHARED_CHILD";
/// Frames of the shared zone: 128 trees (8 GiB, eight giant frames).
const FRAMES: usize = 128 * TREE_FRAMES;
/// Threads per process.
const THREADS: usize = 3;
/// How long each thread allocates and frees.
const RUN: Duration = Duration::from_millis(600);
/// The orders the threads use: mostly what guests use (2 MiB frames; 1 GiB ones now and then),
/// and the small ones.
const ORDERS: [usize; 16] = [9, 9, 9, 9, 9, 9, 0, 0, 3, 3, 6, 6, 10, 10, 9, 18];

fn map(path: &Path, init: Init) -> LLFree {
    let file = File::options().read(true).write(true).open(path).unwrap();
    let region = FileRegion::map(&file, 0, LLFree::metadata_size(FRAMES)).unwrap();
    let config = Config {
        shared: true,
        ..Config::new(1, FRAMES)
    };
    LLFree::persistent(config, Box::new(region), init).unwrap()
}

/// The child's work: allocate and free from `THREADS` threads, then print what it holds as
/// `frame order` lines and leave (slots released).
fn child(path: &Path, owner: u64, seed: u64) {
    let alloc = map(path, Init::Attach);
    let first = alloc.claim_slots(owner, THREADS).expect("free slots");
    // One 1 GiB frame per process, taken before anybody allocates (the parent waits for every
    // child's "ready" before it says "go").
    let giant = (
        alloc.get(first, Order(18)).expect("a 1 GiB frame"),
        Order(18),
    );
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    let held = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let alloc = &alloc;
                scope.spawn(move || {
                    let core = CoreId(first.0 + thread);
                    let mut rng = seed ^ (thread as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    let mut mine: Vec<(FrameId, Order)> = Vec::new();
                    if thread == 0 {
                        mine.push(giant);
                    }
                    let started = std::time::Instant::now();
                    let mut operations = 0u64;
                    while started.elapsed() < RUN {
                        operations += 1;
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        // Keep about half of the zone held across processes.
                        let free = mine.len() > 8 && rng % 16 < 7;
                        if free {
                            let (frame, order) = mine.swap_remove((rng >> 8) as usize % mine.len());
                            alloc.put(core, frame, order).expect("free");
                        } else {
                            let order = Order(ORDERS[(rng >> 16) as usize % ORDERS.len()]);
                            if let Ok(frame) = alloc.get(core, order) {
                                mine.push((frame, order));
                            }
                        }
                    }
                    (mine, operations)
                })
            })
            .collect();
        let mut held = Vec::new();
        let mut operations = 0;
        for thread in threads {
            let (mine, count) = thread.join().unwrap();
            held.extend(mine);
            operations += count;
        }
        eprintln!("owner {owner}: {operations} operations on {THREADS} threads");
        held
    });
    for (frame, order) in held {
        println!("{} {}", frame.0, order.0);
    }
    alloc.release_slots(owner);
}

#[test]
fn shared_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split(',');
    let path = PathBuf::from(parts.next().unwrap());
    let owner: u64 = parts.next().unwrap().parse().unwrap();
    let seed: u64 = parts.next().unwrap().parse().unwrap();
    match parts.next() {
        Some("cache") => cache_holder(&path, owner),
        _ => child(&path, owner, seed),
    }
}

/// Frames the cache holder allocates through its core cache.
const CACHED_GETS: usize = 1000;

/// The cache holder's work: allocate through a core cache, print `core N`, then the frames as
/// `frame 0` lines and `ready`, and wait to be killed with frames left in the cache.
fn cache_holder(path: &Path, owner: u64) {
    let alloc = map(path, Init::Attach);
    let core = alloc.claim_slots(owner, 1).expect("a free slot");
    let mut cache = alloc.core_cache(core);
    println!("core {}", core.0);
    for _ in 0..CACHED_GETS {
        let frame = alloc.get_cached(&mut cache, Order(0)).expect("a frame");
        println!("{} 0", frame.0);
    }
    assert!(cache.frames() > 0, "frames left in the cache");
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut never = String::new();
    let _ = std::io::stdin().read_line(&mut never);
    std::process::abort();
}

/// A zone file in the temp directory, removed when dropped.
struct ZoneFile(PathBuf);

impl ZoneFile {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("llfree-{name}-{}", std::process::id()));
        File::create(&path)
            .unwrap()
            .set_len(LLFree::metadata_size(FRAMES) as u64)
            .unwrap();
        ZoneFile(path)
    }
}

impl Drop for ZoneFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Starts a child and waits until it took its 1 GiB frame.
fn spawn(path: &Path, owner: u64, seed: u64) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shared_child", "--nocapture", "--quiet"])
        .env(CHILD_ENV, format!("{},{owner},{seed}", path.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.as_mut().unwrap();
    let mut byte = [0u8; 1];
    let mut line = Vec::new();
    while line != b"ready\n" {
        stdout.read_exact(&mut byte).expect("the child's ready");
        line.push(byte[0]);
        if byte[0] == b'\n' && line != b"ready\n" {
            line.clear();
        }
    }
    child
}

/// Starts the cache holder (owner `owner`) and reads its core and frames.
fn spawn_cache_holder(path: &Path, owner: u64) -> (std::process::Child, CoreId, Vec<usize>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shared_child", "--nocapture", "--quiet"])
        .env(CHILD_ENV, format!("{},{owner},0,cache", path.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut core = None;
    let mut frames = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("the holder's output");
        if line == "ready" {
            break;
        }
        // The test harness prints lines of its own.
        if let Some(index) = line.strip_prefix("core ") {
            core = Some(CoreId(index.parse().unwrap()));
        } else if let Some(frame) = line.strip_suffix(" 0").and_then(|f| f.parse().ok()) {
            frames.push(frame);
        }
    }
    (child, core.expect("the holder's core"), frames)
}

/// Lets the children allocate and free.
fn go(children: &mut [std::process::Child]) {
    for child in children {
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }
}

/// The `frame order` lines of a child's output.
fn holdings(child: std::process::Child) -> Option<Vec<(usize, usize)>> {
    let output = child.wait_with_output().unwrap();
    output.status.success().then(|| {
        BufReader::new(&output.stdout[..])
            .lines()
            .map_while(Result::ok)
            .filter_map(|line| {
                let (frame, order) = line.split_once(' ')?;
                Some((frame.parse().ok()?, order.parse().ok()?))
            })
            .collect()
    })
}

/// Checks that `held` frames are pairwise disjoint and allocated in `alloc`; returns how many
/// base frames they cover.
fn check_held(alloc: &LLFree, held: &[(usize, usize)]) -> usize {
    let mut seen = HashSet::new();
    for &(frame, order) in held {
        assert!(
            alloc.is_allocated(FrameId(frame), Order(order)),
            "frame {frame} order {order} is held but not allocated"
        );
        for f in frame..frame + (1 << order) {
            assert!(seen.insert(f), "frame {f} was handed to two holders");
        }
    }
    seen.len()
}

#[test]
fn processes_share_one_allocator_without_handing_a_frame_out_twice() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let zone = ZoneFile::new("shared-processes");
    let parent = map(&zone.0, Init::Fresh);
    let mut children: Vec<_> = (1..=4)
        .map(|owner| spawn(&zone.0, owner, owner * 7919))
        .collect();
    go(&mut children);
    let held: Vec<(usize, usize)> = children
        .into_iter()
        .flat_map(|child| holdings(child).expect("a child failed"))
        .collect();
    let covered = check_held(&parent, &held);
    eprintln!(
        "4 processes x {THREADS} threads for {RUN:?}, each with a 1 GiB frame taken at its start: \
         {} frames held at the end, {} of them 1 GiB",
        held.len(),
        held.iter().filter(|(_, order)| *order == 18).count()
    );
    assert_eq!(parent.free_frames(), FRAMES - covered);
    assert!(parent.slot_owners().iter().all(|owner| *owner == 0));
    parent.validate().unwrap();
    // Freed by another process than the ones that took them.
    for (frame, order) in held {
        parent.put(CoreId(0), FrameId(frame), Order(order)).unwrap();
    }
    assert_eq!(parent.free_frames(), FRAMES);
    parent.validate().unwrap();
}

#[test]
fn a_process_killed_in_the_middle_is_recovered_while_the_others_go_on() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let zone = ZoneFile::new("shared-kill");
    let parent = map(&zone.0, Init::Fresh);
    let mut survivors: Vec<_> = [1, 2]
        .map(|owner| spawn(&zone.0, owner, owner * 104_729))
        .into();
    let mut victim = spawn(&zone.0, 3, 31);
    go(&mut survivors);
    go(std::slice::from_mut(&mut victim));
    // In the middle of its run.
    std::thread::sleep(RUN / 2);
    victim.kill().unwrap();
    victim.wait().unwrap();
    // Recovered while the survivors allocate and free.
    let report = parent.recover_slots(3);
    eprintln!("recovered the killed process: {report:?}");
    let held: Vec<(usize, usize)> = survivors
        .into_iter()
        .flat_map(|child| holdings(child).expect("a survivor failed"))
        .collect();
    check_held(&parent, &held);
    assert!(parent.slot_owners().iter().all(|owner| *owner == 0));
    drop(parent);
    // The victim's frames (and anything it was doing) are the next full recovery's business.
    let recovered = map(&zone.0, Init::RecoverDeep);
    assert_eq!(recovered.recovery(), Recovery::Crash);
    recovered.validate().unwrap();
    check_held(&recovered, &held);
}

#[test]
fn a_process_killed_with_frames_in_its_core_cache_gives_them_all_back() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let zone = ZoneFile::new("shared-cache-kill");
    let parent = map(&zone.0, Init::Fresh);
    let (mut victim, core, held) = spawn_cache_holder(&zone.0, 5);
    assert_eq!(held.len(), CACHED_GETS);
    victim.kill().unwrap();
    victim.wait().unwrap();
    // Survivors drain the dead process's reservation before anybody recovers it: the frames its
    // cache held are then in no counter but the slot's record of the cache.
    parent.drain(core);
    let report = parent.recover_slots(5);
    eprintln!("recovered the killed process: {report:?}");
    assert!(report.cached_frames > 0, "{report:?}");
    assert_eq!(
        parent.free_frames(),
        FRAMES - held.len(),
        "only what it handed out stays allocated"
    );
    parent.validate().unwrap();
    for frame in held {
        assert!(parent.is_allocated(FrameId(frame), Order(0)));
        parent.put(CoreId(0), FrameId(frame), Order(0)).unwrap();
    }
    assert_eq!(parent.free_frames(), FRAMES);
    parent.validate().unwrap();
}
