//! The balloon steps of `--workload`: their sizes, what they need of `--balloon`, and the probe
//! that precedes the first of them.

use super::{Action, WorkloadSpecError};
use crate::config::{parse_size as parse_bytes, BalloonDeviceConfig};
use crate::layout::{virtio_mmio_base, BALLOON_SLOT};
use crate::testguest::protocol::{BALLOON_DRIVER_FEATURES, PAGE_SIZE};
use crate::testguest::Workload;

/// What a step needs of the balloon device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// The step does not use the balloon.
    Nothing,
    /// The device, with any options.
    Device,
    /// Free page reporting.
    Reporting,
    /// Free page hinting.
    Hinting,
    /// Statistics.
    Statistics,
}

/// What `action` needs of the balloon.
pub(super) fn need(action: Action) -> Need {
    match action {
        Action::Inflate(_) | Action::Deflate(_) | Action::BalloonTarget | Action::BreakBalloon => {
            Need::Device
        }
        Action::Report(_) => Need::Reporting,
        Action::Hint(_) => Need::Hinting,
        Action::AnswerStats(_) => Need::Statistics,
        Action::Write(..)
        | Action::Verify(..)
        | Action::VerifyZero(_)
        | Action::Read(_)
        | Action::Checkpoint(_)
        | Action::HotplugTarget
        | Action::HotplugRequest { .. } => Need::Nothing,
    }
}

/// Checks that step `step` (doing `action`) finds what it needs in `balloon`.
pub(super) fn check(
    step: &str,
    action: Action,
    balloon: Option<&BalloonDeviceConfig>,
) -> Result<(), WorkloadSpecError> {
    let need = need(action);
    if need == Need::Nothing {
        return Ok(());
    }
    let Some(balloon) = balloon else {
        return Err(WorkloadSpecError::NoBalloon(step.to_owned()));
    };
    let off = |option| {
        Err(WorkloadSpecError::BalloonFeatureOff {
            step: step.to_owned(),
            option,
        })
    };
    match need {
        Need::Reporting if !balloon.free_page_reporting => off("free_page_reporting=on"),
        Need::Hinting if !balloon.free_page_hinting => off("free_page_hinting=on"),
        Need::Statistics if balloon.stats_polling_interval_s == 0 => {
            off("stats_polling_interval_s=N (N > 0)")
        }
        _ => Ok(()),
    }
}

/// The size of an inflate or deflate step: a positive multiple of 4 KiB.
pub(super) fn parse_size(step: &str, text: &str) -> Result<u64, WorkloadSpecError> {
    let size = parse_bytes(text).map_err(|source| WorkloadSpecError::BadSize {
        step: step.to_owned(),
        source,
    })?;
    if size == 0 || !size.is_multiple_of(PAGE_SIZE) {
        return Err(WorkloadSpecError::Malformed {
            step: step.to_owned(),
            why: "the size must be a positive multiple of 4 KiB",
        });
    }
    Ok(size)
}

/// Adds the probe of `vmm run`'s balloon, whose pages lie in the workload area below `top`.
pub(super) fn probe(workload: Workload, top: u64) -> Workload {
    let base = virtio_mmio_base(BALLOON_SLOT).expect("the balloon's slot exists");
    workload.balloon_probe(base, top, BALLOON_DRIVER_FEATURES)
}
