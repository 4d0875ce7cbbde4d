//! The test guest's report device (the MMIO window of [`super::protocol`]) and the [`GuestReport`]
//! it assembles. Every value comes from the guest and is treated as hostile: unknown codes,
//! bad sizes, out-of-range vCPUs or step indices are counted as protocol errors, never trusted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::protocol::{exit_status, report_code, REPORT_STRIDE};
use crate::vm::run_control::{StopReason, VmControl};
use vmm_devices::{BusDevice, GuestWarnings};

/// A checkpoint hook: runs on the vCPU thread that reached the checkpoint, while the other vCPUs
/// wait at the guest's barrier.
pub type CheckpointHook = Arc<dyn Fn(u64) + Send + Sync>;

/// A hinting hook: runs on the vCPU thread of a hint step that asks for a free page hinting
/// run, before the guest looks for it.
pub type HintingHook = Arc<dyn Fn() + Send + Sync>;

/// The first page a verification found wrong.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Guest physical address of the page.
    pub addr: u64,
    /// The `u64` found there.
    pub found: u64,
}

/// What one vCPU reported for one step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReport {
    /// The vCPU finished the step.
    pub done: bool,
    /// Pages it handled.
    pub pages: u64,
    /// Pages that did not hold the expected value.
    pub mismatches: u64,
    /// The first of them.
    pub first_mismatch: Option<Mismatch>,
}

/// How far the guest is: what [`ReportDevice::progress`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestProgress {
    /// Pages all vCPUs handled so far, per step.
    pub pages: Vec<u64>,
    /// The steps some vCPU is running, in order.
    pub running: Vec<usize>,
}

/// What one vCPU reported.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuReport {
    /// It reached the guest's entry point.
    pub started: bool,
    /// Per workload step.
    pub steps: Vec<StepReport>,
    /// Its exit status (see `protocol::exit_status`), once it exited.
    pub exit_status: Option<u64>,
    /// Checkpoints it reported, in order.
    pub checkpoints: Vec<u64>,
}

/// The outcome of a test guest run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestReport {
    /// Why the VM stopped.
    pub stop_reason: StopReason,
    /// The VM did not finish in time and was stopped.
    pub timed_out: bool,
    /// Per vCPU.
    pub vcpus: Vec<VcpuReport>,
    /// Malformed reports the guest sent.
    pub protocol_errors: u64,
    /// What the guest printed on the serial port.
    pub serial_output: String,
    /// Time from resuming the vCPUs to their end.
    pub elapsed: Duration,
}

/// Exit codes of a run, for the CLI and tests.
pub mod exit_code {
    /// The workload ran and every check passed.
    pub const SUCCESS: i32 = 0;
    /// The guest reported a failed verification.
    pub const VERIFY_FAILED: i32 = 1;
    /// The guest rejected the workload, broke the protocol, or did not finish all steps.
    pub const GUEST_ERROR: i32 = 2;
    /// A vCPU failed or the guest crashed (triple fault).
    pub const VM_ERROR: i32 = 3;
    /// The run timed out.
    pub const TIMEOUT: i32 = 4;
}

impl GuestReport {
    /// Whether every vCPU ran every step and exited with success.
    pub fn success(&self) -> bool {
        self.exit_code() == exit_code::SUCCESS
    }

    /// The run's exit code (see [`exit_code`]).
    pub fn exit_code(&self) -> i32 {
        if self.timed_out {
            return exit_code::TIMEOUT;
        }
        match self.stop_reason {
            StopReason::GuestShutdown { .. }
            | StopReason::GuestReset
            | StopReason::VcpuFailed { .. } => return exit_code::VM_ERROR,
            StopReason::GuestExit(exit_status::VERIFY_FAILED) => return exit_code::VERIFY_FAILED,
            StopReason::GuestExit(exit_status::SUCCESS) => {}
            _ => return exit_code::GUEST_ERROR,
        }
        let complete = self
            .vcpus
            .iter()
            .all(|v| v.exit_status == Some(exit_status::SUCCESS) && v.steps.iter().all(|s| s.done));
        if complete && self.protocol_errors == 0 {
            exit_code::SUCCESS
        } else {
            exit_code::GUEST_ERROR
        }
    }

    /// Pages all vCPUs handled in step `index`.
    pub fn pages(&self, index: usize) -> u64 {
        self.vcpus
            .iter()
            .filter_map(|v| v.steps.get(index))
            .map(|s| s.pages)
            .sum()
    }

    /// Mismatching pages all vCPUs found in step `index`.
    pub fn mismatches(&self, index: usize) -> u64 {
        self.vcpus
            .iter()
            .filter_map(|v| v.steps.get(index))
            .map(|s| s.mismatches)
            .sum()
    }
}

/// The device's state, for snapshots: per vCPU its report so far and the step it reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportSnapshot {
    /// Per vCPU: the report and the step being reported.
    pub vcpus: Vec<(VcpuReport, StepReport)>,
    /// vCPUs that exited with success.
    pub exited: u64,
    /// Malformed reports so far.
    pub protocol_errors: u64,
}

/// A saved state that does not fit the device.
#[derive(Debug, thiserror::Error)]
#[error("cannot restore the test guest's reports: {0}")]
pub struct ReportStateError(String);

/// Per-vCPU state of the device: the report so far and the step being reported.
#[derive(Debug, Default)]
struct ReportedVcpu {
    report: VcpuReport,
    current: StepReport,
}

/// Locks a vCPU's state; a panic elsewhere left it usable (plain counters).
fn lock(state: &Mutex<ReportedVcpu>) -> std::sync::MutexGuard<'_, ReportedVcpu> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The MMIO device receiving the guest's reports.
pub struct ReportDevice {
    vcpus: Vec<Mutex<ReportedVcpu>>,
    exited: AtomicU64,
    /// Malformed reports: counted, and warned about rate-limited.
    protocol_errors: GuestWarnings,
    /// Protocol errors of the VM's life before a restore.
    restored_protocol_errors: AtomicU64,
    control: OnceLock<Arc<VmControl>>,
    on_checkpoint: Option<CheckpointHook>,
    on_hinting_run: Option<HintingHook>,
}

impl std::fmt::Debug for ReportDevice {
    /// The reports so far and the counts, not the checkpoint hook.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportDevice")
            .field("vcpus", &self.vcpus)
            .field("exited", &self.exited)
            .field("protocol_errors", &self.protocol_errors)
            .finish_non_exhaustive()
    }
}

impl ReportDevice {
    /// A device for `vcpus` vCPUs running a workload of `steps` steps.
    pub fn new(vcpus: usize, steps: usize, on_checkpoint: Option<CheckpointHook>) -> Self {
        let state = || {
            Mutex::new(ReportedVcpu {
                report: VcpuReport {
                    steps: vec![StepReport::default(); steps],
                    ..Default::default()
                },
                current: StepReport::default(),
            })
        };
        ReportDevice {
            vcpus: (0..vcpus).map(|_| state()).collect(),
            exited: AtomicU64::new(0),
            protocol_errors: GuestWarnings::default(),
            restored_protocol_errors: AtomicU64::new(0),
            control: OnceLock::new(),
            on_checkpoint,
            on_hinting_run: None,
        }
    }

    /// The device with `hook` run when the guest asks for a free page hinting run.
    pub fn with_hinting_hook(mut self, hook: Option<HintingHook>) -> Self {
        self.on_hinting_run = hook;
        self
    }

    /// Connects the device to the VM it stops when the guest exits.
    pub fn set_control(&self, control: Arc<VmControl>) {
        // Set once, before the vCPUs run; a second call keeps the first VM.
        let _ = self.control.set(control);
    }

    /// The reports so far, per vCPU, and the number of protocol errors.
    pub fn reports(&self) -> (Vec<VcpuReport>, u64) {
        let reports = self.vcpus.iter().map(|v| lock(v).report.clone()).collect();
        (reports, self.protocol_errors())
    }

    fn protocol_errors(&self) -> u64 {
        self.protocol_errors.count() + self.restored_protocol_errors.load(Ordering::Relaxed)
    }

    /// The state, for a snapshot.
    pub fn save_state(&self) -> ReportSnapshot {
        ReportSnapshot {
            vcpus: self
                .vcpus
                .iter()
                .map(|v| {
                    let state = lock(v);
                    (state.report.clone(), state.current)
                })
                .collect(),
            exited: self.exited.load(Ordering::Acquire),
            protocol_errors: self.protocol_errors(),
        }
    }

    /// Restores a saved state into a device made for the same vCPUs and workload.
    pub fn restore_state(&self, snapshot: &ReportSnapshot) -> Result<(), ReportStateError> {
        if snapshot.vcpus.len() != self.vcpus.len() {
            return Err(ReportStateError(format!(
                "{} vCPUs saved, the VM has {}",
                snapshot.vcpus.len(),
                self.vcpus.len()
            )));
        }
        let steps = self.vcpus.first().map_or(0, |v| lock(v).report.steps.len());
        if let Some((report, _)) = snapshot.vcpus.iter().find(|(r, _)| r.steps.len() != steps) {
            return Err(ReportStateError(format!(
                "{} steps saved, the workload has {steps}",
                report.steps.len()
            )));
        }
        if snapshot.exited > self.vcpus.len() as u64 {
            return Err(ReportStateError(format!(
                "{} vCPUs exited of {}",
                snapshot.exited,
                self.vcpus.len()
            )));
        }
        for (vcpu, (report, current)) in self.vcpus.iter().zip(&snapshot.vcpus) {
            let mut state = lock(vcpu);
            state.report = report.clone();
            state.current = *current;
        }
        self.exited.store(snapshot.exited, Ordering::Release);
        self.restored_protocol_errors
            .store(snapshot.protocol_errors, Ordering::Relaxed);
        Ok(())
    }

    /// How far the vCPUs are: the pages of the steps they finished and of those they run.
    pub fn progress(&self) -> GuestProgress {
        let mut progress = GuestProgress {
            pages: vec![0; self.vcpus.first().map_or(0, |v| lock(v).report.steps.len())],
            running: Vec::new(),
        };
        for vcpu in &self.vcpus {
            let state = lock(vcpu);
            let current = state.report.steps.iter().position(|step| !step.done);
            for (index, step) in state.report.steps.iter().enumerate() {
                let pages = if Some(index) == current {
                    state.current.pages
                } else {
                    step.pages
                };
                if let Some(total) = progress.pages.get_mut(index) {
                    *total = total.saturating_add(pages);
                }
            }
            if let Some(index) = current.filter(|_| state.report.exit_status.is_none()) {
                progress.running.push(index);
            }
        }
        progress.running.sort_unstable();
        progress.running.dedup();
        progress
    }

    fn protocol_error(&self, what: std::fmt::Arguments<'_>) {
        self.protocol_errors
            .warn(format_args!("test guest report: {what}"));
    }

    fn stop(&self, reason: StopReason) {
        if let Some(control) = self.control.get() {
            control.request_stop(reason);
        }
    }

    fn record(&self, vcpu: usize, code: u64, value: u64) {
        let Some(state) = self.vcpus.get(vcpu) else {
            return self.protocol_error(format_args!("report from unknown vCPU {vcpu}"));
        };
        let mut state = lock(state);
        match code {
            report_code::STARTED => state.report.started = true,
            // Progress is the count so far; the step's final count overwrites it.
            report_code::STEP_PROGRESS | report_code::STEP_PAGES => state.current.pages = value,
            report_code::STEP_MISMATCHES => state.current.mismatches = value,
            report_code::FIRST_MISMATCH_ADDR => {
                state.current.first_mismatch = Some(Mismatch {
                    addr: value,
                    found: 0,
                })
            }
            report_code::FIRST_MISMATCH_VALUE => {
                if let Some(mismatch) = state.current.first_mismatch.as_mut() {
                    mismatch.found = value;
                }
            }
            report_code::STEP_DONE => {
                let current = std::mem::take(&mut state.current);
                match usize::try_from(value)
                    .ok()
                    .and_then(|i| state.report.steps.get_mut(i))
                {
                    Some(step) if !step.done => {
                        *step = StepReport {
                            done: true,
                            ..current
                        }
                    }
                    _ => {
                        drop(state);
                        self.protocol_error(format_args!("vCPU {vcpu}: bad step index {value}"));
                    }
                }
            }
            report_code::CHECKPOINT => {
                state.report.checkpoints.push(value);
                drop(state);
                if let Some(hook) = &self.on_checkpoint {
                    hook(value);
                }
            }
            report_code::HINTING_RUN => {
                drop(state);
                if let Some(hook) = &self.on_hinting_run {
                    hook();
                }
            }
            report_code::EXIT => {
                if state.report.exit_status.is_some() {
                    drop(state);
                    return self.protocol_error(format_args!("vCPU {vcpu} exited twice"));
                }
                state.report.exit_status = Some(value);
                drop(state);
                if value != exit_status::SUCCESS {
                    self.stop(StopReason::GuestExit(value));
                } else if self.exited.fetch_add(1, Ordering::AcqRel) + 1 == self.vcpus.len() as u64
                {
                    self.stop(StopReason::GuestExit(exit_status::SUCCESS));
                }
            }
            _ => {
                drop(state);
                self.protocol_error(format_args!("vCPU {vcpu}: unknown code {code}"));
            }
        }
    }
}

impl BusDevice for ReportDevice {
    fn read(&self, _base: u64, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, _base: u64, offset: u64, data: &[u8]) {
        let Ok(bytes) = <[u8; 8]>::try_from(data) else {
            return self.protocol_error(format_args!("{}-byte write", data.len()));
        };
        if !offset.is_multiple_of(8) {
            return self.protocol_error(format_args!("unaligned write at {offset:#x}"));
        }
        let vcpu = usize::try_from(offset / REPORT_STRIDE).unwrap_or(usize::MAX);
        self.record(
            vcpu,
            (offset % REPORT_STRIDE) / 8,
            u64::from_le_bytes(bytes),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testguest::protocol::{report_address, REPORT_MMIO_BASE};

    fn send(device: &ReportDevice, vcpu: u32, code: u64, value: u64) {
        let offset = report_address(vcpu, code) - REPORT_MMIO_BASE;
        device.write(REPORT_MMIO_BASE, offset, &value.to_le_bytes());
    }

    fn report_of(device: &ReportDevice, stop_reason: StopReason) -> GuestReport {
        let (vcpus, protocol_errors) = device.reports();
        GuestReport {
            stop_reason,
            timed_out: false,
            vcpus,
            protocol_errors,
            serial_output: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn progress_counts_finished_and_running_steps_of_every_vcpu() {
        let device = ReportDevice::new(2, 3, None);
        send(&device, 0, report_code::STEP_PAGES, 100);
        send(&device, 0, report_code::STEP_DONE, 0);
        send(&device, 0, report_code::STEP_PROGRESS, 16384);
        send(&device, 1, report_code::STEP_PROGRESS, 32768);
        assert_eq!(
            device.progress(),
            GuestProgress {
                pages: vec![32868, 16384, 0],
                running: vec![0, 1],
            }
        );
        send(&device, 1, report_code::STEP_PAGES, 40000);
        send(&device, 1, report_code::STEP_DONE, 0);
        assert_eq!(device.progress().pages, [40100, 16384, 0]);
        assert_eq!(device.progress().running, [1]);
    }

    #[test]
    fn assembles_step_reports_and_exit() {
        let device = ReportDevice::new(1, 2, None);
        send(&device, 0, report_code::STARTED, 0x1000);
        send(&device, 0, report_code::STEP_PAGES, 10);
        send(&device, 0, report_code::STEP_MISMATCHES, 0);
        send(&device, 0, report_code::STEP_DONE, 0);
        send(&device, 0, report_code::STEP_PAGES, 4);
        send(&device, 0, report_code::STEP_MISMATCHES, 2);
        send(&device, 0, report_code::FIRST_MISMATCH_ADDR, 0x20_0000);
        send(&device, 0, report_code::FIRST_MISMATCH_VALUE, 7);
        send(&device, 0, report_code::STEP_DONE, 1);
        send(&device, 0, report_code::EXIT, exit_status::VERIFY_FAILED);
        let report = report_of(&device, StopReason::GuestExit(exit_status::VERIFY_FAILED));
        let vcpu = &report.vcpus[0];
        assert!(vcpu.started);
        assert_eq!(
            vcpu.steps[0],
            StepReport {
                done: true,
                pages: 10,
                mismatches: 0,
                first_mismatch: None
            }
        );
        let mismatch = Mismatch {
            addr: 0x20_0000,
            found: 7,
        };
        assert_eq!(vcpu.steps[1].first_mismatch, Some(mismatch));
        assert_eq!((report.pages(1), report.mismatches(1)), (4, 2));
        assert_eq!(report.exit_code(), exit_code::VERIFY_FAILED);
        assert_eq!(report.protocol_errors, 0);
    }

    #[test]
    fn hostile_reports_are_counted_not_trusted() {
        let device = ReportDevice::new(2, 1, None);
        device.write(REPORT_MMIO_BASE, 0, &[1, 2, 3, 4]); // 4-byte write
        device.write(REPORT_MMIO_BASE, 3, &[0; 8]); // unaligned
        send(&device, 5, report_code::STARTED, 0); // unknown vCPU
        send(&device, 0, 31, 0); // unknown code
        send(&device, 0, report_code::STEP_DONE, 1); // step out of range
        send(&device, 0, report_code::STEP_DONE, u64::MAX);
        send(&device, 0, report_code::STEP_DONE, 0);
        send(&device, 0, report_code::STEP_DONE, 0); // twice
        send(&device, 1, report_code::EXIT, 0);
        send(&device, 1, report_code::EXIT, 0); // twice
        let mut data = [0xffu8; 8];
        device.read(REPORT_MMIO_BASE, 0, &mut data);
        assert_eq!(data, [0; 8]);
        let report = report_of(&device, StopReason::GuestExit(0));
        assert_eq!(report.protocol_errors, 8);
        assert_eq!(report.vcpus[1].exit_status, Some(0));
        assert_eq!(
            report.exit_code(),
            exit_code::GUEST_ERROR,
            "vCPU 0 never exited"
        );
    }

    #[test]
    fn a_hinting_request_calls_its_hook_and_counts_as_no_step() {
        let asked = Arc::new(AtomicU64::new(0));
        let hook_asked = asked.clone();
        let hook: HintingHook = Arc::new(move || {
            hook_asked.fetch_add(1, Ordering::Relaxed);
        });
        let device = ReportDevice::new(1, 1, None).with_hinting_hook(Some(hook));
        send(&device, 0, report_code::HINTING_RUN, 0);
        send(&device, 0, report_code::STEP_DONE, 0);
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        let (reports, errors) = device.reports();
        assert_eq!((reports[0].steps[0].done, errors), (true, 0));
        // Without a hook, the request is taken and nothing happens.
        send(
            &ReportDevice::new(1, 1, None),
            0,
            report_code::HINTING_RUN,
            0,
        );
    }

    #[test]
    fn checkpoints_call_the_hook() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook_seen = seen.clone();
        let hook: CheckpointHook = Arc::new(move |id| hook_seen.lock().unwrap().push(id));
        let device = ReportDevice::new(1, 0, Some(hook));
        send(&device, 0, report_code::CHECKPOINT, 3);
        send(&device, 0, report_code::CHECKPOINT, 4);
        assert_eq!(*seen.lock().unwrap(), vec![3, 4]);
        assert_eq!(device.reports().0[0].checkpoints, vec![3, 4]);
    }

    #[test]
    fn exit_codes_follow_the_stop_reason() {
        let device = ReportDevice::new(1, 0, None);
        send(&device, 0, report_code::EXIT, 0);
        assert_eq!(
            report_of(&device, StopReason::GuestExit(0)).exit_code(),
            exit_code::SUCCESS
        );
        let crashed = report_of(&device, StopReason::GuestShutdown { vcpu: 0 });
        assert_eq!(crashed.exit_code(), exit_code::VM_ERROR);
        let bad = report_of(&device, StopReason::GuestExit(exit_status::BAD_DESCRIPTOR));
        assert_eq!(bad.exit_code(), exit_code::GUEST_ERROR);
        let timed_out = GuestReport {
            timed_out: true,
            ..report_of(&device, StopReason::Requested)
        };
        assert_eq!(timed_out.exit_code(), exit_code::TIMEOUT);
    }
}
