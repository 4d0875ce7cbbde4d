//! Running the built-in test guest through [`crate::testguest::run_with`], and what its report
//! means for `vmm run`.

use std::sync::Arc;
use std::time::Duration;

use super::devices::VirtioMmioDevices;
use super::session::Session;
use super::{console, RunError, RunOutcome};
use crate::testguest::{self, exit_code, Report, RunOptions, Workload};
use crate::vm::control::StopReason;

/// Boots the test guest over the session's memory and runs `workload` to its end.
pub(super) fn run(
    session: &Arc<Session>,
    workload: &Workload,
    devices: VirtioMmioDevices,
) -> Result<RunOutcome, RunError> {
    let start_session = session.clone();
    let checkpoint_session = session.clone();
    let options = RunOptions {
        timeout: Duration::MAX,
        on_start: Some(Box::new(move |vm| start_session.start_guest(vm))),
        on_checkpoint: Some(Arc::new(move |_id| {
            // With an API, a checkpoint pauses the VM until a client resumes it.
            if checkpoint_session.config().api_socket.is_some() {
                if let Some(control) = checkpoint_session.control() {
                    // Fails only when the VM is stopping already.
                    let _ = control.request_pause();
                }
            }
        })),
        serial_output: Some(console::serial_output()),
        add_devices: Some(Box::new(move |vm, buses| {
            devices.attach(vm, buses).map_err(|e| e.to_string())
        })),
        start_paused: true,
    };
    let vcpus = session.config().vcpus;
    let report = testguest::run_with(session.memory().clone(), vcpus, workload, options)?;
    outcome(&report)
}

/// `vmm run`'s outcome of a test guest run that ended with `report`.
fn outcome(report: &Report) -> Result<RunOutcome, RunError> {
    match &report.stop_reason {
        StopReason::Requested => return Ok(RunOutcome::Success),
        StopReason::VcpuFailed { message, .. } => {
            return Err(RunError::VcpuFailed(message.clone()))
        }
        StopReason::GuestShutdown { vcpu } => {
            return Ok(RunOutcome::GuestFailure(format!(
                "vCPU {vcpu} crashed (triple fault) or asked for a reset"
            )))
        }
        StopReason::GuestExit(_) | StopReason::AllHalted => {}
    }
    Ok(match report.exit_code() {
        exit_code::SUCCESS => RunOutcome::Success,
        exit_code::VERIFY_FAILED => RunOutcome::GuestFailure(verify_failure(report)),
        _ => RunOutcome::GuestFailure(incomplete(report)),
    })
}

/// Describes the first step whose verification failed.
fn verify_failure(report: &Report) -> String {
    let steps = report
        .vcpus
        .iter()
        .map(|v| v.steps.len())
        .max()
        .unwrap_or(0);
    let failed = (0..steps).find(|&step| report.mismatches(step) > 0);
    let Some(step) = failed else {
        return "a verification failed".into();
    };
    let first = report
        .vcpus
        .iter()
        .filter_map(|v| v.steps.get(step)?.first_mismatch)
        .min_by_key(|m| m.addr);
    let mut text = format!(
        "step {step}: {} of {} pages did not hold the expected value",
        report.mismatches(step),
        report.pages(step)
    );
    if let Some(first) = first {
        text += &format!(
            ", the first at {:#x} (found {:#x})",
            first.addr, first.found
        );
    }
    text
}

/// Describes a run that ended before every vCPU finished its steps.
fn incomplete(report: &Report) -> String {
    if report.protocol_errors > 0 {
        return format!(
            "the guest sent {} malformed reports",
            report.protocol_errors
        );
    }
    if let StopReason::GuestExit(status) = report.stop_reason {
        if status == crate::testguest::protocol::exit_status::BAD_DESCRIPTOR {
            return "the guest rejected its workload descriptor".into();
        }
        return format!("the guest exited with status {status}");
    }
    let unfinished = report
        .vcpus
        .iter()
        .filter(|v| v.exit_status.is_none())
        .count();
    format!("{unfinished} vCPUs halted before finishing the workload")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testguest::{Mismatch, StepReport, VcpuReport};

    fn report(stop_reason: StopReason, steps: Vec<StepReport>) -> Report {
        Report {
            stop_reason,
            timed_out: false,
            vcpus: vec![VcpuReport {
                started: true,
                steps,
                exit_status: Some(0),
                checkpoints: Vec::new(),
            }],
            protocol_errors: 0,
            serial_output: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    fn done(pages: u64) -> StepReport {
        StepReport {
            done: true,
            pages,
            ..Default::default()
        }
    }

    #[test]
    fn a_finished_workload_and_an_owner_stop_are_successes() {
        let finished = report(StopReason::GuestExit(0), vec![done(4)]);
        assert_eq!(outcome(&finished).unwrap(), RunOutcome::Success);
        let stopped = report(StopReason::Requested, vec![StepReport::default()]);
        assert_eq!(outcome(&stopped).unwrap(), RunOutcome::Success);
    }

    #[test]
    fn a_failed_verification_names_the_step_and_the_first_bad_page() {
        let bad = StepReport {
            mismatches: 3,
            first_mismatch: Some(Mismatch {
                addr: 0x20_0000,
                found: 0x1111,
            }),
            ..done(8)
        };
        let mut failed = report(StopReason::GuestExit(1), vec![done(8), bad]);
        failed.vcpus[0].exit_status = Some(1);
        assert_eq!(
            outcome(&failed).unwrap(),
            RunOutcome::GuestFailure(
                "step 1: 3 of 8 pages did not hold the expected value, the first at 0x200000 \
                 (found 0x1111)"
                    .into()
            )
        );
    }

    #[test]
    fn crashes_bad_descriptors_and_vcpu_failures_are_told_apart() {
        let crashed = report(StopReason::GuestShutdown { vcpu: 1 }, Vec::new());
        assert!(matches!(
            outcome(&crashed),
            Ok(RunOutcome::GuestFailure(why)) if why.contains("vCPU 1 crashed")
        ));
        let rejected = report(StopReason::GuestExit(2), Vec::new());
        assert!(matches!(
            outcome(&rejected),
            Ok(RunOutcome::GuestFailure(why)) if why.contains("workload descriptor")
        ));
        let failed = report(
            StopReason::VcpuFailed {
                vcpu: 0,
                message: "vCPU 0: KVM_RUN: boom".into(),
            },
            Vec::new(),
        );
        assert!(matches!(
            outcome(&failed),
            Err(RunError::VcpuFailed(message)) if message == "vCPU 0: KVM_RUN: boom"
        ));
    }
}
