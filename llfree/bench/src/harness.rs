//! The multi-threaded allocation benchmarks of the LLFree paper (§5.1).
//!
//! * **bulk**: every thread allocates its share of half the zone, then (after a barrier) frees it
//!   again; repeated.
//! * **rand**: every thread allocates its share of the whole zone; the frames are shuffled across
//!   threads and freed; only the frees are timed.
//! * **repeat**: every thread allocates its share of half the zone (not timed), then allocates
//!   and frees one frame in a loop; a get+put pair is timed.
//!
//! Threads are created once per run, pinned (thread `t` on the `t % n`-th allowed CPU) and use
//! core id `t`; phases are separated by barriers. Each thread times its whole phase and divides
//! by its operations, so the clock is read outside the loops, which neither allocate nor lock.

use crate::affinity::{allowed_cpus, pin_current_thread};
use crate::frame_alloc::{AllocError, FrameAllocator};
use crate::rng::Rng;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Barrier, Mutex};
use std::time::Instant;
use thiserror::Error;

/// A benchmark of the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bench {
    /// Allocate half the zone, free it, repeat.
    Bulk,
    /// Allocate the whole zone, free it in random order (frees timed).
    Rand,
    /// With half the zone allocated, allocate and free one frame in a loop.
    Repeat,
}

impl fmt::Display for Bench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Bench::Bulk => "bulk",
            Bench::Rand => "rand",
            Bench::Repeat => "repeat",
        })
    }
}

impl FromStr for Bench {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s {
            "bulk" => Ok(Bench::Bulk),
            "rand" => Ok(Bench::Rand),
            "repeat" => Ok(Bench::Repeat),
            _ => Err(BenchError::UnknownBench(s.to_string())),
        }
    }
}

/// A benchmark failed.
#[derive(Debug, Error)]
pub enum BenchError {
    /// The benchmark name is not known.
    #[error("unknown benchmark {0:?} (expected bulk, rand or repeat)")]
    UnknownBench(String),
    /// The parameters do not fit the zone.
    #[error("invalid parameters: {0}")]
    Params(String),
    /// The CPUs could not be read or a thread could not be pinned.
    #[error("thread pinning failed: {0}")]
    Pin(#[source] std::io::Error),
    /// An allocation or free failed.
    #[error("{alloc}: thread {thread} failed: {source}")]
    Alloc {
        /// The allocator.
        alloc: &'static str,
        /// The failing thread.
        thread: usize,
        /// The error.
        #[source]
        source: AllocError,
    },
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct RunParams {
    /// The benchmark.
    pub bench: Bench,
    /// The order of every allocation.
    pub order: usize,
    /// Number of threads (core ids 0..threads).
    pub threads: usize,
    /// Number of timed iterations.
    pub iterations: usize,
    /// Seed of the shuffle of `rand`.
    pub seed: u64,
}

/// The result of one iteration: mean nanoseconds per operation, averaged over the threads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The iteration, from 0.
    pub iteration: usize,
    /// Per get (repeat: per get+put pair); `None` where not timed.
    pub get_ns: Option<f64>,
    /// Per put; `None` where not timed.
    pub put_ns: Option<f64>,
}

/// Operations (frames) per thread and iteration.
pub fn ops_per_thread(params: &RunParams, frames: usize) -> usize {
    let blocks = frames >> params.order;
    match params.bench {
        Bench::Bulk | Bench::Repeat => blocks / 2 / params.threads,
        Bench::Rand => blocks / params.threads,
    }
}

/// Shared state of one run.
struct Run<'a> {
    alloc: &'a dyn FrameAllocator,
    params: RunParams,
    ops: usize,
    frames: Vec<AtomicUsize>,
    /// Per thread and iteration: nanoseconds of the get and the put phase.
    times: Vec<[AtomicU64; 2]>,
    barrier: Barrier,
    failed: AtomicBool,
    error: Mutex<Option<BenchError>>,
}

/// Runs `params` on `alloc` and returns one sample per iteration.
pub fn run(alloc: &dyn FrameAllocator, params: RunParams) -> Result<Vec<Sample>, BenchError> {
    let ops = ops_per_thread(&params, alloc.frames());
    if params.threads == 0 || params.iterations == 0 || ops == 0 {
        return Err(BenchError::Params(format!(
            "{} threads, {} iterations and order {} leave no work in a zone of {} frames",
            params.threads,
            params.iterations,
            params.order,
            alloc.frames()
        )));
    }
    let cpus = allowed_cpus().map_err(BenchError::Pin)?;
    let run = Run {
        alloc,
        params,
        ops,
        frames: (0..ops * params.threads)
            .map(|_| AtomicUsize::new(0))
            .collect(),
        times: (0..params.threads * params.iterations)
            .map(|_| Default::default())
            .collect(),
        barrier: Barrier::new(params.threads),
        failed: AtomicBool::new(false),
        error: Mutex::new(None),
    };
    std::thread::scope(|s| {
        for thread in 0..params.threads {
            let (run, cpu) = (&run, cpus[thread % cpus.len()]);
            s.spawn(move || run.worker(thread, cpu));
        }
    });
    if let Some(error) = run.error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(error);
    }
    Ok((0..params.iterations)
        .map(|iteration| {
            let mean = |phase: usize| {
                let total: u64 = (0..params.threads)
                    .map(|t| run.times[t * params.iterations + iteration][phase].load(Relaxed))
                    .sum();
                total as f64 / (params.threads * ops) as f64
            };
            let (get, put) = match params.bench {
                Bench::Bulk => (Some(mean(0)), Some(mean(1))),
                Bench::Rand => (None, Some(mean(1))),
                Bench::Repeat => (Some(mean(0)), None),
            };
            Sample {
                iteration,
                get_ns: get,
                put_ns: put,
            }
        })
        .collect())
}

impl Run<'_> {
    fn fail(&self, error: BenchError) {
        self.failed.store(true, Relaxed);
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(error);
    }

    /// One thread: every phase ends at a barrier that all threads reach, even after a failure.
    fn worker(&self, thread: usize, cpu: usize) {
        if let Err(e) = pin_current_thread(cpu) {
            self.fail(BenchError::Pin(e));
        }
        let mine = &self.frames[thread * self.ops..(thread + 1) * self.ops];
        // As in the paper, `repeat` runs with half the zone allocated (not timed).
        if self.params.bench == Bench::Repeat {
            self.timed(thread, || self.get_all(thread, mine));
        }
        for iteration in 0..self.params.iterations {
            let times = &self.times[thread * self.params.iterations + iteration];
            self.barrier.wait();
            match self.params.bench {
                Bench::Bulk => self.bulk(thread, mine, times),
                Bench::Rand => self.rand(thread, mine, times, iteration),
                Bench::Repeat => {
                    if let Some(ns) = self.timed(thread, || self.repeat(thread)) {
                        times[0].store(ns, Relaxed);
                    }
                }
            }
        }
        self.barrier.wait();
        if self.params.bench == Bench::Repeat {
            self.timed(thread, || self.put_all(thread, mine));
        }
        self.alloc.drain(thread);
    }

    /// One iteration of `bulk`: get all of `mine`, then (all threads done) put them back.
    fn bulk(&self, thread: usize, mine: &[AtomicUsize], times: &[AtomicU64; 2]) {
        let got = self.timed(thread, || self.get_all(thread, mine));
        self.barrier.wait();
        if let Some(ns) = got {
            times[0].store(ns, Relaxed);
            if let Some(ns) = self.timed(thread, || self.put_all(thread, mine)) {
                times[1].store(ns, Relaxed);
            }
        }
    }

    /// One iteration of `rand`: get all of `mine`; thread 0 shuffles every thread's frames
    /// while the others wait; then the timed puts.
    fn rand(&self, thread: usize, mine: &[AtomicUsize], times: &[AtomicU64; 2], iteration: usize) {
        self.timed(thread, || self.get_all(thread, mine));
        self.barrier.wait();
        if thread == 0 && !self.failed.load(Relaxed) {
            shuffle_atomics(&self.frames, self.params.seed ^ iteration as u64);
        }
        self.barrier.wait();
        if let Some(ns) = self.timed(thread, || self.put_all(thread, mine)) {
            times[1].store(ns, Relaxed);
        }
    }

    /// Runs `phase` unless the run already failed; returns its nanoseconds or records its error.
    fn timed(&self, thread: usize, phase: impl FnOnce() -> Result<(), AllocError>) -> Option<u64> {
        if self.failed.load(Relaxed) {
            return None;
        }
        let start = Instant::now();
        match phase() {
            Ok(()) => Some(start.elapsed().as_nanos() as u64),
            Err(source) => {
                self.fail(BenchError::Alloc {
                    alloc: self.alloc.name(),
                    thread,
                    source,
                });
                None
            }
        }
    }

    fn get_all(&self, core: usize, mine: &[AtomicUsize]) -> Result<(), AllocError> {
        for slot in mine {
            slot.store(self.alloc.get(core, self.params.order)?, Relaxed);
        }
        Ok(())
    }

    fn put_all(&self, core: usize, mine: &[AtomicUsize]) -> Result<(), AllocError> {
        for slot in mine {
            self.alloc
                .put(core, slot.load(Relaxed), self.params.order)?;
        }
        Ok(())
    }

    fn repeat(&self, core: usize) -> Result<(), AllocError> {
        for _ in 0..self.ops {
            let frame = self.alloc.get(core, self.params.order)?;
            self.alloc.put(core, frame, self.params.order)?;
        }
        Ok(())
    }
}

/// Fisher-Yates over atomics (the other threads wait at a barrier meanwhile).
fn shuffle_atomics(items: &[AtomicUsize], seed: u64) {
    let mut rng = Rng::new(seed);
    for i in (1..items.len()).rev() {
        let j = rng.below(i + 1);
        let (a, b) = (items[i].load(Relaxed), items[j].load(Relaxed));
        items[i].store(b, Relaxed);
        items[j].store(a, Relaxed);
    }
}

#[cfg(test)]
mod tests;
