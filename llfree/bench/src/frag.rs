//! The fragmentation benchmark of the LLFree paper (§5.6).
//!
//! Allocate 90 % of the zone as 4 KiB frames, free half of them at random, then run rounds that
//! each free 10 % of the allocated frames at random and allocate as many 4 KiB frames again.
//! After each round all per-core caches and reservations are drained and two metrics recorded:
//! the free (allocatable) 2 MiB frames, and the minimal compaction cost: the 4 KiB copies needed
//! to free as many 2 MiB frames as the free memory allows ([`compaction`]).

use crate::alloc_kind::{AllocKind, CreateError};
use crate::buddy::{Buddy, BuddyConfig};
use crate::frame_alloc::{AllocError, FrameAllocator};
use crate::llfree_alloc::LLFreeAlloc;
use crate::rng::Rng;
use crate::svg_plot::{render, Panel, Series};
use llfree::{FrameId, Order, CHILD_FRAMES};
use std::io::{self, Write};

/// An allocator whose huge-frame fragmentation can be measured.
pub trait HugeFragmentation: FrameAllocator {
    /// Free 2 MiB frames that can be allocated without compaction (caches drained).
    fn free_huge(&self) -> usize;

    /// Writes the free base frames of every 2 MiB block into `counts`. For a quiescent allocator.
    fn count_free_per_huge(&self, counts: &mut [u16]);
}

impl HugeFragmentation for Buddy {
    fn free_huge(&self) -> usize {
        Buddy::free_huge(self)
    }

    fn count_free_per_huge(&self, counts: &mut [u16]) {
        Buddy::count_free_per_huge(self, counts);
    }
}

impl HugeFragmentation for LLFreeAlloc {
    fn free_huge(&self) -> usize {
        self.llfree().free_huge()
    }

    /// Probes every frame with `is_free`, split over the available CPUs.
    fn count_free_per_huge(&self, counts: &mut [u16]) {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = counts.len().div_ceil(cpus).max(1);
        std::thread::scope(|s| {
            for (index, part) in counts.chunks_mut(chunk).enumerate() {
                s.spawn(move || {
                    for (offset, count) in part.iter_mut().enumerate() {
                        let first = (index * chunk + offset) * CHILD_FRAMES;
                        *count = (first..first + CHILD_FRAMES)
                            .filter(|&frame| self.llfree().is_free(FrameId(frame), Order::BASE))
                            .count() as u16;
                    }
                });
            }
        });
    }
}

/// Creates a fresh allocator of `kind` (LLFree or buddy) for the benchmark.
pub fn create(
    kind: AllocKind,
    cores: usize,
    frames: usize,
) -> Result<Box<dyn HugeFragmentation>, CreateError> {
    match kind {
        AllocKind::LLFree => Ok(Box::new(LLFreeAlloc::new(cores, frames)?)),
        AllocKind::Buddy => Ok(Box::new(Buddy::new(
            BuddyConfig::without_pcp(cores),
            frames,
        )?)),
        AllocKind::BuddyPcp => Ok(Box::new(Buddy::new(BuddyConfig::new(cores), frames)?)),
        alloc => Err(CreateError::Unsupported {
            alloc,
            bench: "the fragmentation benchmark",
        }),
    }
}

/// Parameters of the benchmark.
#[derive(Debug, Clone, Copy)]
pub struct FragParams {
    /// Reallocation rounds (the paper: 100).
    pub rounds: usize,
    /// Threads (core ids) that free and allocate in parallel.
    pub threads: usize,
    /// Seed of the random choices.
    pub seed: u64,
}

/// The state after one round (round 0: after the initial allocation and free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragRound {
    /// The round.
    pub round: usize,
    /// Free base frames.
    pub free_frames: usize,
    /// Allocatable 2 MiB frames.
    pub free_huge: usize,
    /// 2 MiB frames that compaction could free.
    pub possible_huge: usize,
    /// Minimal 4 KiB copies to free `possible_huge` 2 MiB frames.
    pub compaction_cost: usize,
}

/// The CSV header of [`write_csv`].
pub const CSV_HEADER: &str = "alloc,round,free_frames,free_huge,possible_huge,compaction_cost";

/// Writes the rounds of `alloc` as CSV rows.
pub fn write_csv(out: &mut impl Write, alloc: &str, rounds: &[FragRound]) -> io::Result<()> {
    for r in rounds {
        let FragRound {
            round,
            free_frames,
            free_huge,
            possible_huge,
            compaction_cost,
        } = r;
        writeln!(
            out,
            "{alloc},{round},{free_frames},{free_huge},{possible_huge},{compaction_cost}"
        )?;
    }
    Ok(())
}

/// Given the free base frames of every 2 MiB block, returns how many 2 MiB frames compaction
/// could free and the minimal number of 4 KiB copies to do so: the blocks with the most free
/// frames are emptied into the fullest ones.
pub fn compaction(counts: &mut [u16]) -> (usize, usize) {
    let free: usize = counts.iter().map(|&c| c as usize).sum();
    let possible = (free / CHILD_FRAMES).min(counts.len());
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let cost = counts[..possible]
        .iter()
        .map(|&c| CHILD_FRAMES - c as usize)
        .sum();
    (possible, cost)
}

/// The share of the initially polluted (not entirely free) 2 MiB frames that were free again
/// after the last round, in percent.
pub fn recovered_percent(rounds: &[FragRound], huge_frames: usize) -> f64 {
    match (rounds.first(), rounds.last()) {
        (Some(first), Some(last)) if first.free_huge < huge_frames => {
            let polluted = (huge_frames - first.free_huge) as f64;
            100.0 * (last.free_huge as f64 - first.free_huge as f64) / polluted
        }
        _ => 0.0,
    }
}

/// Plots free huge frames (left) and compaction cost (right) over the rounds, one line per
/// allocator, as an SVG document.
pub fn plot(results: &[(&str, Vec<FragRound>)]) -> String {
    let series = |metric: fn(&FragRound) -> usize| {
        results
            .iter()
            .map(|(name, rounds)| Series {
                name,
                points: rounds
                    .iter()
                    .map(|r| (r.round as f64, metric(r) as f64))
                    .collect(),
            })
            .collect()
    };
    render(&[
        Panel {
            title: "Free huge frames (2 MiB)",
            x_label: "round",
            y_label: "free huge frames",
            series: series(|r| r.free_huge),
        },
        Panel {
            title: "Minimal compaction cost",
            x_label: "round",
            y_label: "4 KiB copies",
            series: series(|r| r.compaction_cost),
        },
    ])
}

/// Runs the benchmark on a fresh allocator (all frames free) and returns round 0 and every round.
pub fn run(
    alloc: &dyn HugeFragmentation,
    params: FragParams,
) -> Result<Vec<FragRound>, AllocError> {
    let mut rng = Rng::new(params.seed);
    let mut counts = vec![0u16; alloc.frames().div_ceil(CHILD_FRAMES)];
    let mut held = vec![0usize; alloc.frames() * 9 / 10];
    parallel(alloc, params.threads, &mut held, |core, frames| {
        frames.iter_mut().try_for_each(|f| {
            *f = alloc.get(core, 0)?;
            Ok(())
        })
    })?;
    let half = held.len() / 2;
    rng.choose_front(&mut held, half);
    parallel(alloc, params.threads, &mut held[..half], |core, frames| {
        frames.iter().try_for_each(|&f| alloc.put(core, f, 0))
    })?;
    held.drain(..half);
    let mut rounds = vec![measure(alloc, params.threads, 0, &mut counts)];
    let batch = held.len() / 10;
    for round in 1..=params.rounds {
        rng.choose_front(&mut held, batch);
        parallel(alloc, params.threads, &mut held[..batch], |core, frames| {
            for frame in frames.iter_mut() {
                alloc.put(core, *frame, 0)?;
            }
            for frame in frames.iter_mut() {
                *frame = alloc.get(core, 0)?;
            }
            Ok(())
        })?;
        rounds.push(measure(alloc, params.threads, round, &mut counts));
    }
    parallel(alloc, params.threads, &mut held, |core, frames| {
        frames.iter().try_for_each(|&f| alloc.put(core, f, 0))
    })?;
    Ok(rounds)
}

/// Runs `work` on `threads` threads, thread `t` with core id `t` on the `t`-th chunk of `items`;
/// each thread leaves its core at the end.
fn parallel(
    alloc: &dyn HugeFragmentation,
    threads: usize,
    items: &mut [usize],
    work: impl Fn(usize, &mut [usize]) -> Result<(), AllocError> + Sync,
) -> Result<(), AllocError> {
    let chunk = items.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = items
            .chunks_mut(chunk)
            .enumerate()
            .map(|(core, frames)| {
                let work = &work;
                s.spawn(move || {
                    let result = work(core, frames);
                    alloc.leave(core);
                    result
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

fn measure(
    alloc: &dyn HugeFragmentation,
    threads: usize,
    round: usize,
    counts: &mut [u16],
) -> FragRound {
    (0..threads).for_each(|core| alloc.drain(core));
    alloc.count_free_per_huge(counts);
    let (possible_huge, compaction_cost) = compaction(counts);
    FragRound {
        round,
        free_frames: alloc.free_frames(),
        free_huge: alloc.free_huge(),
        possible_huge,
        compaction_cost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_empties_the_emptiest_blocks_into_the_fullest() {
        // 512 + 300 + 200 + 10 + 0 = 1022 free: one block can be freed (the free one, no copies).
        let mut counts = [300, 0, 512, 10, 200];
        assert_eq!(compaction(&mut counts), (1, 0));
        // 400 + 400 + 300 = 1100 free: two blocks, emptying the 400s costs 112 + 112 copies.
        let mut counts = [400, 300, 400];
        assert_eq!(compaction(&mut counts), (2, 224));
        assert_eq!(compaction(&mut []), (0, 0));
    }

    #[test]
    fn recovered_share_of_polluted_frames() {
        let round = |free_huge| FragRound {
            round: 0,
            free_frames: 0,
            free_huge,
            possible_huge: 0,
            compaction_cost: 0,
        };
        assert_eq!(recovered_percent(&[round(10), round(55)], 100), 50.0);
        assert_eq!(recovered_percent(&[round(100)], 100), 0.0);
    }

    fn check(alloc: &dyn HugeFragmentation) {
        let frames = alloc.frames();
        let params = FragParams {
            rounds: 5,
            threads: 2,
            seed: 3,
        };
        let rounds = run(alloc, params).unwrap();
        assert_eq!(rounds.len(), 6);
        let held = frames * 9 / 10;
        for r in &rounds {
            // 90 % allocated, half of it freed: 55 % free, the same in every round.
            assert_eq!(r.free_frames, frames - (held - held / 2), "{r:?}");
            assert!(r.free_huge <= r.possible_huge, "{r:?}");
        }
        assert!(rounds[0].compaction_cost > 0);
        assert_eq!(alloc.free_frames(), frames);
    }

    #[test]
    fn runs_on_buddy_and_llfree_only() {
        check(create(AllocKind::Buddy, 2, 1 << 15).unwrap().as_ref());
        check(create(AllocKind::LLFree, 2, 1 << 15).unwrap().as_ref());
        assert!(create(AllocKind::ListCas, 2, 1 << 15).is_err());
    }

    #[test]
    fn plot_has_both_panels() {
        let rounds = vec![FragRound {
            round: 0,
            free_frames: 10,
            free_huge: 1,
            possible_huge: 2,
            compaction_cost: 300,
        }];
        let svg = plot(&[("llfree", rounds.clone()), ("buddy", rounds)]);
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("compaction cost"));
    }
}
