//! Progress of work that takes longer than about a second: eager population of guest memory
//! and the test guest's memory steps. On a terminal (and a VMM without a name, whose lines
//! would interleave with others') each piece of work is a bar updated in place with its
//! percentage, rate and time left (indicatif); elsewhere a plain line starting with
//! `progress: `, about every second.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::format_size_approx;
use crate::testguest::protocol::{step_kind, PAGE_SIZE};
use crate::testguest::workload::kind_name;
use crate::testguest::{GuestProgress, Workload, PROGRESS_INTERVAL};

/// How far a piece of work got: `done` of `total` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Advance {
    /// What is under way, e.g. "step 2 (write)".
    pub what: String,
    /// Bytes done.
    pub done: u64,
    /// Bytes in all.
    pub total: u64,
}

impl Advance {
    /// The plain line: "progress: step 2 (write): 1.0 GiB of 2.0 GiB".
    pub fn line(&self) -> String {
        format!(
            "progress: {}: {} of {}",
            self.what,
            format_size_approx(self.done),
            format_size_approx(self.total)
        )
    }
}

/// Eager population that has populated `done` of `total` bytes.
pub(super) fn population_advance(done: u64, total: u64) -> Advance {
    Advance {
        what: "populating guest memory".into(),
        done,
        total,
    }
}

/// Every bar on the terminal, drawn together on stderr.
static BARS: OnceLock<MultiProgress> = OnceLock::new();
/// Bars on the terminal now.
static SHOWN: AtomicUsize = AtomicUsize::new(0);

fn all_bars() -> &'static MultiProgress {
    BARS.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// Whether bars are on the terminal: the console then writes whole lines, each with the bars
/// lifted ([`around_bars`]), so that its lines and the bars do not run into each other.
pub(super) fn bars_shown() -> bool {
    SHOWN.load(Ordering::Acquire) > 0
}

/// Runs `write` with the bars lifted off the terminal, and draws them again after it.
pub(super) fn around_bars<T>(write: impl FnOnce() -> T) -> T {
    match BARS.get() {
        Some(bars) if bars_shown() => bars.suspend(write),
        _ => write(),
    }
}

/// The progress of a loop over `total` bytes: shown once it has run for
/// [`PROGRESS_INTERVAL`], then at that interval (a snapshot's copy of guest memory).
#[derive(Debug)]
pub(super) struct LoopProgress {
    what: String,
    total: u64,
    display: ProgressDisplay,
    next: Instant,
}

impl LoopProgress {
    /// Progress of `what` over `total` bytes, starting now.
    pub fn new(what: String, total: u64) -> Self {
        LoopProgress {
            what,
            total,
            display: ProgressDisplay::new(),
            next: Instant::now() + PROGRESS_INTERVAL,
        }
    }

    /// `done` bytes are done.
    pub fn at(&mut self, done: u64) {
        if Instant::now() < self.next {
            return;
        }
        self.next = Instant::now() + PROGRESS_INTERVAL;
        self.display.show(&[Advance {
            what: self.what.clone(),
            done,
            total: self.total,
        }]);
    }
}

/// A bar on the terminal.
#[derive(Debug)]
struct Shown {
    /// The work it shows.
    what: String,
    bar: ProgressBar,
    /// Its position at its last update, and when that was: its rate counts from there.
    last: (u64, Instant),
}

/// Shows advances: bars in place on a terminal, plain lines elsewhere.
#[derive(Debug)]
pub(super) struct ProgressDisplay {
    /// On a terminal: a bar per piece of work under way.
    bars: Option<Mutex<Vec<Shown>>>,
}

impl ProgressDisplay {
    /// Bars when stderr is a terminal and the VMM's lines carry no name, else plain lines.
    pub fn new() -> Self {
        let in_place = std::io::stderr().is_terminal() && super::line_prefix().is_none();
        ProgressDisplay {
            bars: in_place.then(|| Mutex::new(Vec::new())),
        }
    }

    /// Shows `advances`, the work under way now; a bar of work that is not among them is done.
    pub fn show(&self, advances: &[Advance]) {
        let Some(bars) = &self.bars else {
            for advance in advances {
                super::say(advance.line());
            }
            return;
        };
        let mut bars = bars.lock().unwrap_or_else(|e| e.into_inner());
        bars.retain(|shown| {
            let going = advances.iter().any(|a| a.what == shown.what);
            if !going {
                remove(&shown.bar);
            }
            going
        });
        for advance in advances {
            let position = advance.done.min(advance.total);
            match bars.iter_mut().find(|shown| shown.what == advance.what) {
                Some(shown) => {
                    let (before, at) = shown.last;
                    let seconds = at.elapsed().as_secs_f64();
                    if position > before && seconds > 0.0 {
                        let rate = (position - before) as f64 / seconds;
                        let left = (advance.total - position) as f64 / rate;
                        shown.bar.set_prefix(format!(
                            ", {}/s, {left:.0} s left",
                            format_size_approx(rate as u64)
                        ));
                    }
                    shown.last = (position, Instant::now());
                    shown.bar.set_position(position);
                }
                None => {
                    SHOWN.fetch_add(1, Ordering::AcqRel);
                    let bar = ProgressBar::new(advance.total).with_position(position);
                    bar.set_style(style());
                    bar.set_message(advance.what.clone());
                    bars.push(Shown {
                        what: advance.what.clone(),
                        bar: all_bars().add(bar),
                        last: (position, Instant::now()),
                    });
                }
            }
        }
    }
}

/// Takes `bar` off the terminal.
fn remove(bar: &ProgressBar) {
    bar.finish_and_clear();
    all_bars().remove(bar);
    SHOWN.fetch_sub(1, Ordering::AcqRel);
}

impl Drop for ProgressDisplay {
    fn drop(&mut self) {
        if let Some(bars) = &self.bars {
            let bars = bars.lock().unwrap_or_else(|e| e.into_inner());
            bars.iter().for_each(|shown| remove(&shown.bar));
        }
    }
}

/// A bar's look; its prefix is its rate and time left, once it has moved between updates
/// (the rate of the last update: the guest's speed changes as it faults, populates, waits).
const LOOK: &str = "{msg}: [{bar:20}] {percent:>3}% of {binary_total_bytes}{prefix}";

fn style() -> ProgressStyle {
    ProgressStyle::with_template(LOOK)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// One memory step, as progress shows it.
struct StepInfo {
    /// "step 2 (write)".
    name: String,
    /// Pages over all runs and vCPUs.
    pages: u64,
}

/// The progress of the test guest's long memory steps, once per call of
/// [`StepProgress::update`] (about every second).
pub(super) struct StepProgress {
    /// Per workload step; `None` for steps without progress (balloon steps, checkpoints).
    steps: Vec<Option<StepInfo>>,
    /// The steps running at the last update, and their pages then.
    last: Vec<(usize, u64)>,
}

impl StepProgress {
    /// Progress for `workload`.
    pub fn new(workload: &Workload) -> Self {
        let steps = workload
            .steps()
            .iter()
            .enumerate()
            .map(|(index, step)| {
                let memory = matches!(
                    step.kind,
                    step_kind::WRITE | step_kind::VERIFY | step_kind::VERIFY_ZERO | step_kind::READ
                );
                let number = workload.user_step_number(index)?;
                memory.then(|| StepInfo {
                    name: format!("step {number} ({})", kind_name(step.kind)),
                    pages: (step.size / PAGE_SIZE).saturating_mul(step.repeat.into()),
                })
            })
            .collect();
        StepProgress {
            steps,
            last: Vec::new(),
        }
    }

    /// The advances of `progress`: one per memory step that was running at the previous update
    /// too (so it has run for about a second) and has advanced since.
    pub fn update(&mut self, progress: &GuestProgress) -> Vec<Advance> {
        let now: Vec<(usize, u64)> = progress
            .running
            .iter()
            .map(|&index| (index, progress.pages.get(index).copied().unwrap_or(0)))
            .collect();
        let lines = now
            .iter()
            .filter(|(index, pages)| {
                self.last
                    .iter()
                    .any(|(last, before)| last == index && before < pages)
            })
            .filter_map(|&(index, pages)| {
                let info = self.steps.get(index)?.as_ref()?;
                // A hostile guest may report more pages than the step has.
                let done = pages.min(info.pages);
                Some(Advance {
                    what: info.name.clone(),
                    done: done.saturating_mul(PAGE_SIZE),
                    total: info.pages.saturating_mul(PAGE_SIZE),
                })
            })
            .collect();
        self.last = now;
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_step_shows_progress_from_its_second_update_while_it_advances() {
        let workload = Workload::new()
            .write(2 * MIB, 1024 * MIB, 1)
            .repeat(2)
            .checkpoint(1)
            .verify(2 * MIB, 1024 * MIB, 1);
        let mut steps = StepProgress::new(&workload);
        let mut progress = |now: &GuestProgress| -> Vec<String> {
            steps.update(now).iter().map(Advance::line).collect()
        };
        let at = |running: Vec<usize>, pages: Vec<u64>| GuestProgress { pages, running };
        assert!(progress(&at(vec![0], vec![1000, 0, 0])).is_empty());
        assert_eq!(
            progress(&at(vec![0], vec![262_144, 0, 0])),
            ["progress: step 1 (write): 1.0 GiB of 2.0 GiB"]
        );
        // Paused (no advance), then a checkpoint, which has no progress.
        assert!(progress(&at(vec![0], vec![262_144, 0, 0])).is_empty());
        assert!(progress(&at(vec![1], vec![524_288, 0, 0])).is_empty());
        assert!(progress(&at(vec![1], vec![524_288, 0, 0])).is_empty());
        assert!(progress(&at(vec![2], vec![524_288, 0, 1])).is_empty());
        // More pages than the step has are shown as the whole step.
        assert_eq!(
            progress(&at(vec![2], vec![524_288, 0, u64::MAX])),
            ["progress: step 3 (verify): 1.0 GiB of 1.0 GiB"]
        );
    }

    #[test]
    fn population_shows_done_and_total() {
        assert_eq!(
            population_advance(3 << 29, 6 << 30).line(),
            "progress: populating guest memory: 1.5 GiB of 6.0 GiB"
        );
    }
}
