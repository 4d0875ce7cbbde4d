//! Running the built-in test guest through [`crate::testguest::run_with`], and what its report
//! means for `vmm run`.

use std::sync::Arc;
use std::time::Duration;

use super::progress::{ProgressDisplay, StepProgress};
use super::restore::ResumedStates;
use super::session::Session;
use super::{RunError, RunOutcome, StopCause};
use crate::arch::x86_64::cpu_template::CpuTemplate;
use crate::build::devices::VirtioMmioDevices;
use crate::testguest::protocol::{balloon_error, step_kind};
use crate::testguest::workload::kind_name;
use crate::testguest::{
    self, exit_code, GuestReport, Mismatch, RunOptions, TestGuestDevices, TestGuestResumption,
    Workload,
};
use crate::vm::run_control::StopReason;
use crate::vm::KvmVm;
use vmm_devices::serial::SerialOutput;

/// Boots the test guest over the session's memory (or resumes it from a snapshot's
/// `resumed` states) and runs `workload` to its end.
pub(super) fn run(
    session: &Arc<Session>,
    workload: &Workload,
    devices: VirtioMmioDevices,
    console: SerialOutput,
    resumed: Option<ResumedStates>,
    kvm_vm: Option<KvmVm>,
) -> Result<RunOutcome, RunError> {
    let start_session = session.clone();
    let devices_session = session.clone();
    // Weak: the session keeps the report device, which keeps these hooks.
    let checkpoint_session = Arc::downgrade(session);
    let hinting_session = Arc::downgrade(session);
    let paused = resumed.as_ref().is_some_and(|r| r.paused);
    let resumption = match resumed {
        Some(resumed) => Some(TestGuestResumption {
            vcpus: resumed.vcpus,
            vm: resumed.vm,
            serial: resumed.serial,
            report: resumed.report.ok_or_else(|| {
                RunError::VcpuSetup("the snapshot has no test guest reports".into())
            })?,
        }),
        None => None,
    };
    let options = RunOptions {
        timeout: Duration::MAX,
        on_start: Some(Box::new(move |vm| start_session.start_guest(vm, paused))),
        on_devices: Some(Box::new(move |guest_devices: &TestGuestDevices| {
            devices_session.attach_serial(guest_devices.serial.clone());
            devices_session.attach_report(guest_devices.report.clone());
        })),
        resumption,
        kvm_vm,
        on_checkpoint: Some(Arc::new(move |id| {
            // With an API, a checkpoint pauses the VM until a client resumes it.
            let Some(checkpoint_session) = checkpoint_session.upgrade() else {
                return;
            };
            if let Some(socket) = &checkpoint_session.config().api_socket {
                if let Some(control) = checkpoint_session.control() {
                    // Fails only when the VM is stopping already.
                    if control.request_pause().is_ok() {
                        super::say(format!(
                            "paused at checkpoint {id}; resume with `vmm resume --socket {}`",
                            socket.display()
                        ));
                    }
                }
            }
        })),
        // A hint step's run ends once the guest says STOP.
        on_hinting_run: Some(Arc::new(move || {
            let Some(session) = hinting_session.upgrade() else {
                return;
            };
            match session.balloon_handle().map(|b| b.start_hinting(true)) {
                Some(Ok(run)) => log::debug!("free page hinting run {run} started for the guest"),
                Some(Err(e)) => log::warn!("the test guest asked for a hinting run: {e}"),
                None => log::warn!("the test guest asked for a hinting run, but has no balloon"),
            }
        })),
        on_progress: Some({
            let mut progress = StepProgress::new(workload);
            let display = ProgressDisplay::new();
            Box::new(move |now| display.show(&progress.update(now)))
        }),
        serial_output: Some(console),
        add_devices: Some(Box::new(move |vm, buses| {
            devices.attach(vm, buses).map_err(|e| e.to_string())
        })),
        start_paused: true,
        log_dirty_pages: session.memory().tracks_dirty_pages(),
        smt: session.config().smt,
        cpu_template: session
            .config()
            .cpu_template
            .as_ref()
            .map(CpuTemplate::try_from)
            .transpose()
            .map_err(|e| RunError::VcpuSetup(e.to_string()))?,
    };
    let vcpus = session.config().vcpus;
    let report = testguest::run_with(session.memory().clone(), vcpus, workload, options)?;
    outcome(&report, workload, session.stop_cause())
}

/// `vmm run`'s outcome of a test guest run of `workload` that ended with `report`, stopped by
/// `stop_cause` if its owner asked for a stop.
fn outcome(
    report: &GuestReport,
    workload: &Workload,
    stop_cause: Option<StopCause>,
) -> Result<RunOutcome, RunError> {
    match &report.stop_reason {
        StopReason::Requested => {
            return Ok(RunOutcome::Stopped(stop_cause.unwrap_or(StopCause::Api)))
        }
        StopReason::VcpuFailed { message, .. } => {
            return Err(RunError::VcpuFailed(message.clone()))
        }
        StopReason::GuestReset => {
            return Ok(RunOutcome::GuestFailure(
                "the guest reset the VM through the i8042".into(),
            ))
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
        exit_code::VERIFY_FAILED => RunOutcome::GuestFailure(verify_failure(report, workload)),
        _ => RunOutcome::GuestFailure(incomplete(report)),
    })
}

/// Describes the first step whose verification (or balloon driver) failed.
fn verify_failure(report: &GuestReport, workload: &Workload) -> String {
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
    let kind = workload.steps().get(step).map_or(0, |s| s.kind);
    let name = match workload.user_step_number(step) {
        Some(number) => format!("step {number} ({})", kind_name(kind)),
        None if kind == step_kind::BALLOON_PROBE => "the balloon probe".to_owned(),
        None => format!("step {}", step + 1),
    };
    if (step_kind::BALLOON_PROBE..=step_kind::BALLOON_BREAK).contains(&kind)
        || kind == step_kind::BALLOON_HINT
    {
        return format!(
            "{name}: the balloon driver failed: {}",
            first.map_or_else(|| "no reason given".into(), balloon_failure)
        );
    }
    let mut text = format!(
        "{name}: {} of {} pages did not hold the expected value",
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

/// What a balloon step's failure report (a [`balloon_error`] code and its detail) means.
fn balloon_failure(report: Mismatch) -> String {
    let detail = report.found;
    match report.addr {
        balloon_error::NO_DEVICE => format!("no virtio-balloon at its address (read {detail:#x})"),
        balloon_error::FEATURES_REJECTED => {
            format!("the device refused the features {detail:#x}")
        }
        balloon_error::BAD_QUEUE => format!("queue {detail} is missing or in use"),
        balloon_error::NOT_PROBED => "the balloon was not probed".into(),
        balloon_error::NO_ROOM => format!(
            "the balloon holds {detail} pages: it cannot deflate by more, nor inflate past the \
             workload area"
        ),
        balloon_error::TIMEOUT => format!("the device did not return a buffer on queue {detail}"),
        balloon_error::NO_FEATURE => format!("feature bit {detail} was not negotiated"),
        balloon_error::NO_HINTING_RUN => format!(
            "no free page hinting run started, or the run did not end (the host's command was \
             {detail})"
        ),
        code => format!("error {code} ({detail:#x})"),
    }
}

/// Describes a run that ended before every vCPU finished its steps.
fn incomplete(report: &GuestReport) -> String {
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

    fn report(stop_reason: StopReason, steps: Vec<StepReport>) -> GuestReport {
        GuestReport {
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
    fn a_finished_workload_is_a_success_and_an_owner_stop_is_told_apart() {
        let finished = report(StopReason::GuestExit(0), vec![done(4)]);
        assert_eq!(
            outcome(&finished, &Workload::new(), None).unwrap(),
            RunOutcome::Success
        );
        let stopped = report(StopReason::Requested, vec![StepReport::default()]);
        let sigterm = Some(StopCause::Signal(libc::SIGTERM));
        assert_eq!(
            outcome(&stopped, &Workload::new(), sigterm).unwrap(),
            RunOutcome::Stopped(StopCause::Signal(libc::SIGTERM))
        );
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
        let workload = Workload::new()
            .write(0x20_0000, 0x8000, 1)
            .verify(0x20_0000, 0x8000, 1);
        assert_eq!(
            outcome(&failed, &workload, None).unwrap(),
            RunOutcome::GuestFailure(
                "step 2 (verify): 3 of 8 pages did not hold the expected value, the first at \
                 0x200000 (found 0x1111)"
                    .into()
            )
        );
    }

    #[test]
    fn crashes_bad_descriptors_and_vcpu_failures_are_told_apart() {
        let crashed = report(StopReason::GuestShutdown { vcpu: 1 }, Vec::new());
        assert!(matches!(
            outcome(&crashed, &Workload::new(), None),
            Ok(RunOutcome::GuestFailure(why)) if why.contains("vCPU 1 crashed")
        ));
        let rejected = report(StopReason::GuestExit(2), Vec::new());
        assert!(matches!(
            outcome(&rejected, &Workload::new(), None),
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
            outcome(&failed, &Workload::new(), None),
            Err(RunError::VcpuFailed(message)) if message == "vCPU 0: KVM_RUN: boom"
        ));
    }

    #[test]
    fn a_failed_balloon_step_says_what_the_driver_saw() {
        let failed_step = StepReport {
            mismatches: 1,
            first_mismatch: Some(Mismatch {
                addr: balloon_error::NO_ROOM,
                found: 1024,
            }),
            ..done(0)
        };
        let mut failed = report(StopReason::GuestExit(1), vec![done(1), failed_step]);
        failed.vcpus[0].exit_status = Some(1);
        let workload = Workload::new()
            .balloon_probe(0xc000_0000, 64 << 20, 0)
            .deflate(8 << 20);
        assert_eq!(
            outcome(&failed, &workload, None).unwrap(),
            RunOutcome::GuestFailure(
                "step 1 (deflate): the balloon driver failed: the balloon holds 1024 pages: it \
                 cannot deflate by more, nor inflate past the workload area"
                    .into()
            )
        );
    }
}
