//! Output of the harness: CSV rows on stdout and a human summary with LLFree/baseline ratios.

use crate::harness::{Bench, Sample};
use std::io::{self, Write};

/// The header of the harness's CSV output.
pub const CSV_HEADER: &str = "alloc,bench,order,threads,zone_bytes,iteration,get_ns,put_ns";

/// The allocator the summary's ratios are relative to.
pub const REFERENCE: &str = "llfree";

/// Identifies one run of the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunKey {
    /// The allocator's name.
    pub alloc: &'static str,
    /// The benchmark.
    pub bench: Bench,
    /// The allocation order.
    pub order: usize,
    /// The number of threads.
    pub threads: usize,
    /// The zone size in bytes.
    pub zone_bytes: usize,
}

/// Writes one CSV row per sample; untimed phases are empty fields.
pub fn write_csv(out: &mut impl Write, key: &RunKey, samples: &[Sample]) -> io::Result<()> {
    let field = |ns: Option<f64>| ns.map_or(String::new(), |ns| format!("{ns:.2}"));
    for sample in samples {
        writeln!(
            out,
            "{},{},{},{},{},{},{},{}",
            key.alloc,
            key.bench,
            key.order,
            key.threads,
            key.zone_bytes,
            sample.iteration,
            field(sample.get_ns),
            field(sample.put_ns)
        )?;
    }
    Ok(())
}

/// The median over iterations of one run.
#[derive(Debug, Clone, Copy)]
struct Medians {
    key: RunKey,
    get_ns: Option<f64>,
    put_ns: Option<f64>,
}

fn median(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut values: Vec<f64> = values.flatten().collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2]),
        n => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// Collects runs and prints the summary.
#[derive(Debug, Default)]
pub struct Summary {
    runs: Vec<Medians>,
}

impl Summary {
    /// Records the samples of one run.
    pub fn add(&mut self, key: RunKey, samples: &[Sample]) {
        self.runs.push(Medians {
            key,
            get_ns: median(samples.iter().map(|s| s.get_ns)),
            put_ns: median(samples.iter().map(|s| s.put_ns)),
        });
    }

    /// Writes one table per benchmark, order and thread count: the median ns per operation of
    /// every allocator and, where LLFree ran, LLFree's time divided by the allocator's (below 1:
    /// LLFree is faster).
    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let mut groups: Vec<(Bench, usize, usize)> = Vec::new();
        for run in &self.runs {
            let group = (run.key.bench, run.key.order, run.key.threads);
            if !groups.contains(&group) {
                groups.push(group);
            }
        }
        let ns = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".to_string(),
        };
        for (bench, order, threads) in groups {
            let runs: Vec<_> = self
                .runs
                .iter()
                .filter(|r| (r.key.bench, r.key.order, r.key.threads) == (bench, order, threads))
                .collect();
            let reference = runs.iter().find(|r| r.key.alloc == REFERENCE);
            writeln!(
                out,
                "{bench} order {order}, {threads} thread(s), median ns/op ({REFERENCE}/x: <1 = {REFERENCE} faster)"
            )?;
            let get = if bench == Bench::Repeat {
                "get+put"
            } else {
                "get"
            };
            writeln!(
                out,
                "  {:<12} {:>10} {:>10} {:>12} {:>12}",
                "alloc", get, "put", "ratio get", "ratio put"
            )?;
            for run in runs.iter() {
                let (get_ratio, put_ratio) = match reference {
                    Some(r) if r.key.alloc != run.key.alloc => {
                        (ratio(r.get_ns, run.get_ns), ratio(r.put_ns, run.put_ns))
                    }
                    _ => ("".to_string(), "".to_string()),
                };
                writeln!(
                    out,
                    "  {:<12} {:>10} {:>10} {:>12} {:>12}",
                    run.key.alloc,
                    ns(run.get_ns),
                    ns(run.put_ns),
                    get_ratio,
                    put_ratio
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(alloc: &'static str) -> RunKey {
        RunKey {
            alloc,
            bench: Bench::Bulk,
            order: 0,
            threads: 2,
            zone_bytes: 1 << 30,
        }
    }

    fn sample(iteration: usize, get: f64, put: Option<f64>) -> Sample {
        Sample {
            iteration,
            get_ns: Some(get),
            put_ns: put,
        }
    }

    #[test]
    fn csv_rows_leave_untimed_fields_empty() {
        let mut out = Vec::new();
        write_csv(&mut out, &key("buddy"), &[sample(0, 12.345, None)]).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "buddy,bulk,0,2,1073741824,0,12.35,\n"
        );
        assert_eq!(CSV_HEADER.split(',').count(), 8);
    }

    #[test]
    fn summary_has_medians_and_ratios() {
        let mut summary = Summary::default();
        let llfree = [
            sample(0, 10.0, Some(5.0)),
            sample(1, 30.0, Some(6.0)),
            sample(2, 20.0, Some(7.0)),
        ];
        summary.add(key("llfree"), &llfree);
        summary.add(key("buddy"), &[sample(0, 80.0, Some(24.0))]);
        let mut out = Vec::new();
        summary.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("bulk order 0, 2 thread(s)"), "{text}");
        let row = |alloc: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(alloc))
                .unwrap()
        };
        let buddy = row("buddy");
        assert_eq!(buddy.matches("0.25x").count(), 2, "get and put: {buddy}");
        let llfree = row("llfree");
        assert!(
            llfree.contains("20.0") && llfree.contains("6.0"),
            "{llfree}"
        );
    }
}
