//! Progress lines on stderr for work that takes longer than about a second: eager population of
//! guest memory and the test guest's memory steps. Each line starts with `progress: `.

use crate::config::format_size_approx;
use crate::testguest::protocol::{step_kind, PAGE_SIZE};
use crate::testguest::workload::kind_name;
use crate::testguest::{Progress, Workload};

/// The line for eager population that has populated `done` of `total` bytes.
pub(super) fn population_line(done: u64, total: u64) -> String {
    format!(
        "progress: populating guest memory: {} of {}",
        format_size_approx(done),
        format_size_approx(total)
    )
}

/// One memory step, as progress shows it.
struct StepInfo {
    /// "step 2 (write)".
    name: String,
    /// Pages over all runs and vCPUs.
    pages: u64,
}

/// Prints the progress of the test guest's long memory steps, once per call of
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

    /// The lines for `progress`: one per memory step that was running at the previous update
    /// too (so it has run for about a second) and has advanced since.
    pub fn update(&mut self, progress: &Progress) -> Vec<String> {
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
                Some(format!(
                    "progress: {}: {} of {}",
                    info.name,
                    format_size_approx(done.saturating_mul(PAGE_SIZE)),
                    format_size_approx(info.pages.saturating_mul(PAGE_SIZE))
                ))
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
        let mut progress = StepProgress::new(&workload);
        let at = |running: Vec<usize>, pages: Vec<u64>| Progress { pages, running };
        assert!(progress.update(&at(vec![0], vec![1000, 0, 0])).is_empty());
        assert_eq!(
            progress.update(&at(vec![0], vec![262_144, 0, 0])),
            ["progress: step 1 (write): 1.0 GiB of 2.0 GiB"]
        );
        // Paused (no advance), then a checkpoint, which has no progress.
        assert!(progress
            .update(&at(vec![0], vec![262_144, 0, 0]))
            .is_empty());
        assert!(progress
            .update(&at(vec![1], vec![524_288, 0, 0]))
            .is_empty());
        assert!(progress
            .update(&at(vec![1], vec![524_288, 0, 0]))
            .is_empty());
        assert!(progress
            .update(&at(vec![2], vec![524_288, 0, 1]))
            .is_empty());
        // More pages than the step has are shown as the whole step.
        assert_eq!(
            progress.update(&at(vec![2], vec![524_288, 0, u64::MAX])),
            ["progress: step 3 (verify): 1.0 GiB of 1.0 GiB"]
        );
    }

    #[test]
    fn population_shows_done_and_total() {
        assert_eq!(
            population_line(3 << 29, 6 << 30),
            "progress: populating guest memory: 1.5 GiB of 6.0 GiB"
        );
    }
}
