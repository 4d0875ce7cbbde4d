//! `llfree-compare`: this tree's LLFree against a base revision's (`llfree_base`), both driven by
//! the llfree-bench harness, cell by cell with the two alternating in every round. Prints the
//! median over the rounds of each cell's mean ns per operation and the speed-up base / this tree.

use llfree_bench::frame_alloc::{AllocError, FrameAllocator};
use llfree_bench::harness::{self, Bench, RunParams, Sample};
use llfree_bench::llfree_alloc::LLFreeAlloc;

/// The base revision's LLFree behind the harness's interface. Its errors end the run: the
/// benchmarks make no request that may fail.
struct BaseAlloc(llfree_base::LLFree);

impl FrameAllocator for BaseAlloc {
    fn name(&self) -> &'static str {
        "llfree-base"
    }

    fn supports_order(&self, order: usize) -> bool {
        order <= llfree_base::MAX_ORDER || order == llfree_base::GIANT_ORDER
    }

    #[inline]
    fn get(&self, core: usize, order: usize) -> Result<usize, AllocError> {
        let frame = self
            .0
            .get(llfree_base::CoreId(core), llfree_base::Order(order))
            .unwrap_or_else(|e| panic!("base llfree: get: {e}"));
        Ok(frame.0)
    }

    #[inline]
    fn put(&self, core: usize, frame: usize, order: usize) -> Result<(), AllocError> {
        self.0
            .put(
                llfree_base::CoreId(core),
                llfree_base::FrameId(frame),
                llfree_base::Order(order),
            )
            .unwrap_or_else(|e| panic!("base llfree: put: {e}"));
        Ok(())
    }

    fn drain(&self, core: usize) {
        self.0.drain(llfree_base::CoreId(core));
    }

    fn free_frames(&self) -> usize {
        self.0.free_frames()
    }

    fn frames(&self) -> usize {
        self.0.frames()
    }
}

/// The cells of the comparison: benchmark, order, threads.
const CELLS: [(Bench, usize, usize); 10] = [
    (Bench::Bulk, 0, 1),
    (Bench::Bulk, 0, 2),
    (Bench::Bulk, 9, 1),
    (Bench::Bulk, 9, 2),
    (Bench::Rand, 0, 1),
    (Bench::Rand, 0, 2),
    (Bench::Repeat, 0, 1),
    (Bench::Repeat, 0, 2),
    (Bench::Repeat, 9, 1),
    (Bench::Repeat, 9, 2),
];

/// The mean of the timed values of `samples` (get or put).
fn mean(samples: &[Sample], pick: fn(&Sample) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = samples.iter().filter_map(pick).collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Parses `--rounds N --zone SIZE --iterations N`.
fn options() -> Result<(usize, usize, usize), String> {
    let (mut rounds, mut zone, mut iterations) = (7, 8usize << 30, 5);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rounds" => rounds = value.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--iterations" => {
                iterations = value.parse().map_err(|e| format!("--iterations: {e}"))?
            }
            "--zone" => zone = llfree_bench::units::parse_zone(&value)?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok((rounds, zone, iterations))
}

/// `count SIDE ORDER GETS PUTS`: on one core of an 8 GiB allocator of SIDE (`base` or `new`),
/// `GETS` gets of ORDER, then puts of the first `PUTS` of them; for instruction counts under
/// callgrind (the difference of two runs is the cost of the operations between them).
fn count(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let [side, order, gets, puts] = args else {
        return Err("usage: count base|new ORDER GETS PUTS".into());
    };
    let (order, gets, puts): (usize, usize, usize) = (order.parse()?, gets.parse()?, puts.parse()?);
    let frames = (8 << 30) / llfree_bench::units::FRAME_SIZE;
    let alloc: Box<dyn FrameAllocator> = match side.as_str() {
        "base" => Box::new(BaseAlloc(llfree_base::LLFree::new(
            llfree_base::Config::new(1, frames),
        )?)),
        "new" => Box::new(LLFreeAlloc::new(1, frames)?),
        _ => return Err(format!("unknown side {side}").into()),
    };
    let taken: Vec<usize> = (0..gets)
        .map(|_| alloc.get(0, order))
        .collect::<Result<_, _>>()?;
    for &frame in taken.iter().take(puts) {
        alloc.put(0, frame, order)?;
    }
    std::hint::black_box(&taken);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("count") {
        return count(&args[1..]);
    }
    let (rounds, zone, iterations) = options()?;
    let frames = zone / llfree_bench::units::FRAME_SIZE;
    // Per cell, per side (0 base, 1 this tree): the get and put means of every round.
    let mut results = vec![[[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]]; CELLS.len()];
    for round in 0..rounds {
        for (cell, &(bench, order, threads)) in CELLS.iter().enumerate() {
            let params = RunParams {
                bench,
                order,
                threads,
                iterations,
                seed: 1,
            };
            // Alternate which side goes first.
            for side in [round % 2, 1 - round % 2] {
                let samples = if side == 0 {
                    let config = llfree_base::Config::new(threads, frames);
                    let alloc = BaseAlloc(llfree_base::LLFree::new(config)?);
                    harness::run(&alloc, params)?
                } else {
                    harness::run(&LLFreeAlloc::new(threads, frames)?, params)?
                };
                let [gets, puts] = &mut results[cell][side];
                gets.extend(mean(&samples, |s| s.get_ns));
                puts.extend(mean(&samples, |s| s.put_ns));
            }
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    println!(
        "| cell | base get / put (ns) | this tree get / put (ns) | speed-up get / put |\n\
         |---|---|---|---|"
    );
    for (cell, &(bench, order, threads)) in CELLS.iter().enumerate() {
        let [mut base, mut new] = results[cell].clone();
        let pair = |values: &mut [Vec<f64>; 2]| {
            values
                .iter_mut()
                .filter(|v| !v.is_empty())
                .map(|v| median(v))
                .collect::<Vec<f64>>()
        };
        let (base, new) = (pair(&mut base), pair(&mut new));
        let show = |v: &[f64]| {
            v.iter()
                .map(|ns| format!("{ns:.1}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let speedup: Vec<String> = base
            .iter()
            .zip(&new)
            .map(|(b, n)| format!("{:.2}", b / n))
            .collect();
        println!(
            "| {bench} order {order}, {threads} thread{} | {} | {} | {} |",
            if threads == 1 { "" } else { "s" },
            show(&base),
            show(&new),
            speedup.join(" / ")
        );
    }
    Ok(())
}
