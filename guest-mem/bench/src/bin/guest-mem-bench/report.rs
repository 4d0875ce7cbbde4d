//! Results: CSV rows on stdout as they are measured, medians over the repeats at the end, and
//! a human summary on stderr.

use std::collections::BTreeMap;
use std::io::Write;

/// The CSV header.
const HEADER: &str = "group,case,size_mib,stride,metric,unit,run,value";

/// What one measured row is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// The benchmark group ("populate", "faults", "discard", "steps").
    pub group: &'static str,
    /// The memory and how it is populated, e.g. "hugetlb-2m/lazy".
    pub case: String,
    /// MiB of guest memory (or of the zone measured).
    pub size_mib: u64,
    /// What the guest touches: "4k", "2m", "1g" (one u64 per 4 KiB, 2 MiB, 1 GiB), or "-".
    pub stride: &'static str,
}

impl Key {
    /// A key; the case name gets the pinning mode appended.
    pub fn new(
        group: &'static str,
        case: impl Into<String>,
        size: u64,
        stride: &'static str,
    ) -> Self {
        Self {
            group,
            case: case.into() + crate::pinning::suffix(),
            size_mib: size >> 20,
            stride,
        }
    }
}

/// Collected results.
#[derive(Debug, Default)]
pub struct Report {
    /// (key, metric, unit) → one value per run, in insertion order of the keys.
    values: BTreeMap<(Key, &'static str, &'static str), Vec<f64>>,
    order: Vec<(Key, &'static str, &'static str)>,
    skips: Vec<String>,
}

impl Report {
    /// A report; prints the CSV header.
    pub fn new() -> Self {
        println!("{HEADER}");
        Self::default()
    }

    /// Records one value of run `run` and prints its CSV row.
    pub fn add(
        &mut self,
        key: &Key,
        run: usize,
        metric: &'static str,
        unit: &'static str,
        value: f64,
    ) {
        println!(
            "{},{},{},{},{metric},{unit},{run},{value:.3}",
            key.group, key.case, key.size_mib, key.stride
        );
        let _ = std::io::stdout().flush();
        let id = (key.clone(), metric, unit);
        let values = self.values.entry(id.clone()).or_default();
        if values.is_empty() {
            self.order.push(id);
        }
        values.push(value);
    }

    /// Records a value computed from the medians (e.g. a ratio to a baseline), reported with
    /// the medians.
    pub fn add_derived(&mut self, key: &Key, metric: &'static str, unit: &'static str, value: f64) {
        let id = (key.clone(), metric, unit);
        if !self.values.contains_key(&id) {
            self.order.push(id.clone());
        }
        self.values.insert(id, vec![value]);
    }

    /// Notes that `key` could not be measured, with a SKIP line on stderr and a CSV comment.
    pub fn skip(&mut self, key: &Key, why: &str) {
        let line = format!(
            "SKIP: {} {} {} MiB stride {}: {why}",
            key.group, key.case, key.size_mib, key.stride
        );
        eprintln!("{line}");
        println!("# {line}");
        self.skips.push(line);
    }

    /// Measures `key` in runs 0 to `runs - 1` with `measure(report, run)`, which adds the run's
    /// values; the first failure is noted as a skip and ends the runs.
    pub fn repeat(
        &mut self,
        key: &Key,
        runs: usize,
        mut measure: impl FnMut(&mut Self, usize) -> Result<(), String>,
    ) {
        for run in 0..runs {
            if let Err(why) = measure(self, run) {
                self.skip(key, &why);
                break;
            }
        }
    }

    /// The median of a metric over the runs, if measured.
    pub fn median(&self, key: &Key, metric: &'static str) -> Option<f64> {
        self.values
            .iter()
            .find(|((k, m, _), _)| k == key && *m == metric)
            .map(|(_, values)| median(values))
    }

    /// Prints the median rows (run "median") on stdout and the summary on stderr.
    pub fn finish(&self) {
        let mut last: Option<&Key> = None;
        eprintln!("\n=== guest-mem-bench: medians over the runs ===");
        for id in &self.order {
            let (key, metric, unit) = id;
            let values = &self.values[id];
            let m = median(values);
            println!(
                "{},{},{},{},{metric},{unit},median,{m:.3}",
                key.group, key.case, key.size_mib, key.stride
            );
            if last != Some(key) {
                eprintln!(
                    "{:<9} {:<28} {:>5} MiB  stride {}",
                    key.group, key.case, key.size_mib, key.stride
                );
                last = Some(key);
            }
            eprintln!("    {metric:<28} {m:>12.3} {unit:<6} (n={})", values.len());
        }
        for line in &self.skips {
            eprintln!("{line}");
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The `q`-quantile (0..=1) of `values` by the nearest-rank method.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
