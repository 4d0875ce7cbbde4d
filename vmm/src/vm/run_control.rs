//! Run control shared by a VM's vCPU threads and whoever drives the VM (the CLI, the API,
//! devices): pause, resume and stop, and the reason the VM stopped.
//!
//! The vCPUs poll one atomic flag after every exit (lock-free on the hot path); only when a
//! request is pending do they take the lock. A request also kicks every vCPU thread out of
//! `KVM_RUN` with a signal (see [`super::kick`]), so a guest spinning without exits stops too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::kick;
use crate::arch::x86_64::state::KvmVcpuState;

/// How a vCPU thread ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VcpuExitReason {
    /// It saw a stop request.
    Stopped,
    /// The guest executed HLT (only exits without an in-kernel irqchip).
    Halted,
    /// The guest triple-faulted or asked for a reset or power-off.
    Shutdown,
    /// KVM reported an error; the message says which.
    Failed(String),
}

/// Errors of run control requests.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RunControlError {
    /// The VM has stopped (or is stopping) and cannot be paused or resumed.
    #[error("the VM has stopped")]
    Stopped,
    /// `pause` was called on a vCPU thread, which would wait for itself.
    #[error("a vCPU thread cannot pause its own VM")]
    CalledFromVcpu,
    /// The vCPUs' state can only be read while the VM is paused.
    #[error("the VM is not paused")]
    NotPaused,
    /// A vCPU of the paused VM waits for guest memory in the kernel, where its state cannot be
    /// read.
    #[error(
        "vCPU {vcpu} waits for guest memory (its pool or zone is exhausted) and its state \
         cannot be read until it gets a frame: give the VM memory (e.g. deflate its balloon or \
         inflate another VM's) or stop it"
    )]
    WaitsForMemory {
        /// The vCPU.
        vcpu: usize,
    },
    /// A vCPU could not read its state.
    #[error("vCPU {vcpu}: {message}")]
    SaveFailed {
        /// The vCPU.
        vcpu: usize,
        /// What failed.
        message: String,
    },
}

/// What a vCPU is to do after [`VmControl::vcpu_checkpoint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checkpoint {
    /// Enter the guest.
    Run,
    /// Leave the run loop.
    Stop,
    /// Read the vCPU's state and hand it to [`VmControl::vcpu_saved`], then check in again.
    Save,
}

/// What the VM's owner asked the vCPUs to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// vCPUs run the guest.
    Running,
    /// vCPUs wait outside `KVM_RUN` until resumed.
    Paused,
    /// vCPUs leave their run loops for good.
    Stopped,
}

/// Why a VM stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Its owner asked it to stop (API, Ctrl-C, a timeout).
    Requested,
    /// The guest asked to exit with a status (e.g. the test guest's exit report).
    GuestExit(u64),
    /// A vCPU triple-faulted (`KVM_EXIT_SHUTDOWN`) or asked for a reset or power-off.
    GuestShutdown {
        /// Index of the vCPU.
        vcpu: usize,
    },
    /// The guest reset the machine through a device (the i8042's CPU reset).
    GuestReset,
    /// Every vCPU halted with interrupts off.
    AllHalted,
    /// A vCPU failed: a KVM error, a failed entry, an internal error or a memory fault.
    VcpuFailed {
        /// Index of the vCPU.
        vcpu: usize,
        /// What went wrong.
        message: String,
    },
}

impl StopReason {
    /// Whether the VM ended in an orderly way with success (owner stop, guest exit 0, halt).
    pub fn is_success(&self) -> bool {
        matches!(
            self,
            StopReason::Requested | StopReason::GuestExit(0) | StopReason::AllHalted
        )
    }
}

struct ControlState {
    requested: RunState,
    /// vCPUs waiting in `vcpu_checkpoint` while paused.
    parked: usize,
    /// Per vCPU: whether it waits in `vcpu_checkpoint`.
    parked_vcpus: Vec<bool>,
    /// Tells whether a vCPU that is not parked is as paused (see [`VmControl::on_pause_count`]).
    held: Option<HeldProbe>,
    /// Per vCPU: how its thread ended, once it has.
    exits: Vec<Option<VcpuExitReason>>,
    stop_reason: Option<StopReason>,
    /// pthread handles of the vCPU threads, to kick them.
    threads: Vec<libc::pthread_t>,
    /// Per vCPU: asked to read its state (while paused).
    save_requested: Vec<bool>,
    /// Per vCPU: the state it read, once it has.
    saved: Vec<Option<Result<KvmVcpuState, String>>>,
    /// Called whenever the VM is stopped (see [`VmControl::on_stop`]).
    stop_hook: Option<StopHook>,
}

/// What [`VmControl::on_stop`] calls.
pub type StopHook = Arc<dyn Fn() + Send + Sync>;

/// What [`VmControl::on_pause_count`] asks: whether vCPU `index` is held where it waits.
pub type HeldProbe = Arc<dyn Fn(usize) -> bool + Send + Sync>;

impl ControlState {
    fn exited(&self) -> usize {
        self.exits.iter().filter(|e| e.is_some()).count()
    }

    /// Whether every vCPU is parked, has ended, or (with `held`) is held where it waits.
    fn all_paused(&self, held: bool) -> bool {
        (0..self.exits.len()).all(|index| {
            self.parked_vcpus[index]
                || self.exits[index].is_some()
                || (held && self.held.as_ref().is_some_and(|probe| probe(index)))
        })
    }
}

/// Shared run control of one VM.
pub struct VmControl {
    /// Set while the vCPUs must look at `state` (a pause or stop is pending).
    pending: AtomicBool,
    state: Mutex<ControlState>,
    changed: Condvar,
}

impl std::fmt::Debug for VmControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmControl")
            .field("state", &self.state())
            .field("stop_reason", &self.stop_reason())
            .finish()
    }
}

impl VmControl {
    /// Control for `vcpu_count` vCPUs, which start paused.
    pub(crate) fn new(vcpu_count: usize) -> Self {
        VmControl {
            pending: AtomicBool::new(true),
            state: Mutex::new(ControlState {
                requested: RunState::Paused,
                parked: 0,
                parked_vcpus: vec![false; vcpu_count],
                held: None,
                exits: vec![None; vcpu_count],
                stop_reason: None,
                threads: Vec::new(),
                save_requested: vec![false; vcpu_count],
                saved: (0..vcpu_count).map(|_| None).collect(),
                stop_hook: None,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ControlState> {
        // A panic while holding this lock leaves the state consistent: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the vCPU threads so that requests can kick them.
    pub(crate) fn set_threads(&self, threads: Vec<libc::pthread_t>) {
        self.lock().threads = threads;
    }

    /// Kicks every vCPU thread that has not ended out of `KVM_RUN`.
    fn kick_all(state: &ControlState) {
        for (thread, exit) in state.threads.iter().zip(&state.exits) {
            if exit.is_none() {
                kick::kick_thread(*thread);
            }
        }
    }

    /// The state the owner asked for.
    pub fn state(&self) -> RunState {
        self.lock().requested
    }

    /// Why the VM stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.lock().stop_reason.clone()
    }

    /// How each vCPU thread ended (`None`: still running).
    pub fn vcpu_exits(&self) -> Vec<Option<VcpuExitReason>> {
        self.lock().exits.clone()
    }

    /// Asks all vCPUs to stop for `reason` and returns at once; the first reason sticks.
    /// Safe to call from a vCPU thread (e.g. from a device).
    pub fn request_stop(&self, reason: StopReason) {
        let mut state = self.lock();
        state.stop_reason.get_or_insert(reason);
        state.requested = RunState::Stopped;
        self.pending.store(true, Ordering::SeqCst);
        Self::kick_all(&state);
        self.changed.notify_all();
        let hook = state.stop_hook.clone();
        drop(state);
        if let Some(hook) = hook {
            hook();
        }
    }

    /// Has `hook` called, outside the control's lock, whenever the VM is stopped (each stop
    /// request, and when the last vCPU has ended), and at once if it has stopped already: e.g.
    /// guest memory ending the faults that wait for a frame, which a stopping vCPU may wait on
    /// where a kick cannot interrupt it.
    pub fn on_stop(&self, hook: StopHook) {
        let mut state = self.lock();
        state.stop_hook = Some(hook.clone());
        let stopped = state.requested == RunState::Stopped;
        drop(state);
        if stopped {
            hook();
        }
    }

    /// Has [`Self::pause`] count vCPU `index` as paused while `probe(index)` says it is held
    /// where it waits: a vCPU waiting in the kernel for guest memory, where no kick reaches it,
    /// whose fault is held until the resume (`GuestMemory::hold_waiting_vcpus`). Such a vCPU is
    /// not parked: its state cannot be read (a snapshot needs every vCPU parked).
    pub fn on_pause_count(&self, probe: HeldProbe) {
        self.lock().held = Some(probe);
    }

    /// Asks all vCPUs to pause and returns at once; each parks when it next leaves `KVM_RUN`.
    /// Safe to call from a vCPU thread (e.g. from a device); [`Self::pause`] also waits.
    pub fn request_pause(&self) -> Result<(), RunControlError> {
        Self::request_pause_locked(&mut self.lock(), &self.pending)
    }

    fn request_pause_locked(
        state: &mut ControlState,
        pending: &AtomicBool,
    ) -> Result<(), RunControlError> {
        if state.requested == RunState::Stopped {
            return Err(RunControlError::Stopped);
        }
        state.requested = RunState::Paused;
        pending.store(true, Ordering::SeqCst);
        Self::kick_all(state);
        Ok(())
    }

    /// Pauses all vCPUs and returns once every running vCPU waits outside `KVM_RUN`, or is held
    /// where it waits for memory (see [`Self::on_pause_count`]).
    pub fn pause(&self) -> Result<(), RunControlError> {
        if kick::current_vcpu_index().is_some() {
            return Err(RunControlError::CalledFromVcpu);
        }
        let mut state = self.lock();
        Self::request_pause_locked(&mut state, &self.pending)?;
        while state.requested == RunState::Paused && !state.all_paused(true) {
            state = self.wait_for_change(state);
        }
        match state.requested {
            RunState::Stopped => Err(RunControlError::Stopped),
            _ => Ok(()),
        }
    }

    /// Waits until the state changes; with vCPUs that may be held where they wait (see
    /// [`Self::on_pause_count`]), whose waits change without a notification, at most 1 ms.
    fn wait_for_change<'a>(
        &self,
        state: MutexGuard<'a, ControlState>,
    ) -> MutexGuard<'a, ControlState> {
        match state.held {
            Some(_) => {
                self.changed
                    .wait_timeout(state, Duration::from_millis(1))
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Lets paused vCPUs run (again).
    pub fn resume(&self) -> Result<(), RunControlError> {
        let mut state = self.lock();
        if state.requested == RunState::Stopped {
            return Err(RunControlError::Stopped);
        }
        state.requested = RunState::Running;
        self.pending.store(false, Ordering::SeqCst);
        self.changed.notify_all();
        Ok(())
    }

    /// Waits until every vCPU thread has ended, or `timeout` passed. Returns whether they all
    /// ended.
    pub fn wait_for_exit(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.lock();
        while state.exited() < state.exits.len() {
            state = match deadline {
                None => self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    self.changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        true
    }

    /// Whether a vCPU must call [`Self::vcpu_checkpoint`] before entering the guest again.
    /// One atomic load: the hot path.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Waits until every vCPU of a VM whose pause was asked for (e.g. by a checkpoint) has
    /// parked; fails if no pause is asked for, or the VM stops or resumes meanwhile.
    /// A vCPU held where it waits for memory (see [`Self::on_pause_count`]) never parks: then
    /// this fails at once.
    pub fn wait_parked(&self) -> Result<(), RunControlError> {
        let mut state = self.lock();
        while state.requested == RunState::Paused && !state.all_paused(false) {
            if state.all_paused(true) {
                let held = (0..state.exits.len())
                    .find(|&index| !state.parked_vcpus[index] && state.exits[index].is_none());
                return Err(RunControlError::WaitsForMemory {
                    vcpu: held.unwrap_or_default(),
                });
            }
            state = self.wait_for_change(state);
        }
        match state.requested {
            RunState::Paused => Ok(()),
            RunState::Stopped => Err(RunControlError::Stopped),
            RunState::Running => Err(RunControlError::NotPaused),
        }
    }

    /// Reads the state of every vCPU of a paused VM: each vCPU thread reads its own, where it
    /// waits. Fails when the VM is not paused (or stops meanwhile) or a vCPU cannot read it.
    pub fn save_vcpus(&self) -> Result<Vec<KvmVcpuState>, RunControlError> {
        let mut state = self.lock();
        let count = state.exits.len();
        let all_parked = |state: &ControlState| state.parked + state.exited() == count;
        if state.requested != RunState::Paused || !all_parked(&state) || state.exited() > 0 {
            return Err(RunControlError::NotPaused);
        }
        state.save_requested.fill(true);
        state.saved.iter_mut().for_each(|saved| *saved = None);
        self.changed.notify_all();
        while state.requested == RunState::Paused && state.saved.iter().any(Option::is_none) {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.save_requested.fill(false);
        if state.requested != RunState::Paused {
            return Err(RunControlError::Stopped);
        }
        // Wait until every vCPU is parked again, so that a resume finds them all where it expects.
        while state.requested == RunState::Paused && !all_parked(&state) {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        let saved = std::mem::take(&mut state.saved);
        state.saved = (0..count).map(|_| None).collect();
        saved
            .into_iter()
            .enumerate()
            .map(|(vcpu, saved)| match saved {
                Some(Ok(vcpu_state)) => Ok(vcpu_state),
                Some(Err(message)) => Err(RunControlError::SaveFailed { vcpu, message }),
                None => Err(RunControlError::Stopped),
            })
            .collect()
    }

    /// Called by a vCPU thread with the state it read after [`Checkpoint::Save`].
    pub(crate) fn vcpu_saved(&self, index: usize, saved: Result<KvmVcpuState, String>) {
        let mut state = self.lock();
        if let Some(slot) = state.saved.get_mut(index) {
            *slot = Some(saved);
        }
        self.changed.notify_all();
    }

    /// Called by a vCPU when a request is pending: waits while paused, and reads its state
    /// when asked to.
    pub(crate) fn vcpu_checkpoint(&self, index: usize) -> Checkpoint {
        let mut state = self.lock();
        loop {
            match state.requested {
                RunState::Running => return Checkpoint::Run,
                RunState::Stopped => return Checkpoint::Stop,
                RunState::Paused
                    if state.save_requested.get(index) == Some(&true)
                        && state.saved.get(index).is_some_and(Option::is_none) =>
                {
                    return Checkpoint::Save;
                }
                RunState::Paused => {
                    state.parked += 1;
                    state.parked_vcpus[index] = true;
                    self.changed.notify_all();
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                    state.parked -= 1;
                    state.parked_vcpus[index] = false;
                }
            }
        }
    }

    /// Called by a vCPU thread as it ends. When the last vCPU ends without a stop request, the
    /// VM has stopped because all vCPUs halted (or failed).
    pub(crate) fn vcpu_exited(&self, index: usize, reason: VcpuExitReason) {
        let mut state = self.lock();
        if let Some(slot) = state.exits.get_mut(index) {
            *slot = Some(reason);
        }
        let mut hook = None;
        if state.exited() == state.exits.len() {
            state.stop_reason.get_or_insert(StopReason::AllHalted);
            state.requested = RunState::Stopped;
            self.pending.store(true, Ordering::SeqCst);
            hook = state.stop_hook.clone();
        }
        self.changed.notify_all();
        drop(state);
        if let Some(hook) = hook {
            hook();
        }
    }
}

impl vmm_devices::ResetLine for VmControl {
    /// The guest reset the VM through a device: the VM stops with [`StopReason::GuestReset`].
    fn reset(&self) {
        self.request_stop(StopReason::GuestReset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Runs `count` threads that behave like vCPUs at their checkpoints, without KVM.
    fn fake_vcpus(control: &Arc<VmControl>, count: usize) -> Vec<std::thread::JoinHandle<()>> {
        (0..count)
            .map(|index| {
                let control = control.clone();
                std::thread::spawn(move || {
                    loop {
                        if control.is_pending() {
                            match control.vcpu_checkpoint(index) {
                                Checkpoint::Run => {}
                                Checkpoint::Stop => break,
                                Checkpoint::Save => {
                                    control.vcpu_saved(index, Err(format!("fake vCPU {index}")))
                                }
                            }
                        }
                        std::thread::yield_now();
                    }
                    control.vcpu_exited(index, VcpuExitReason::Stopped);
                })
            })
            .collect()
    }

    #[test]
    fn a_device_s_reset_stops_the_vm_as_a_guest_reset() {
        let control = Arc::new(VmControl::new(1));
        vmm_devices::ResetLine::reset(&*control);
        assert_eq!(control.stop_reason(), Some(StopReason::GuestReset));
    }

    #[test]
    fn the_stop_hook_runs_on_every_stop_and_at_once_when_stopped_already() {
        use std::sync::atomic::AtomicUsize;

        let calls = Arc::new(AtomicUsize::new(0));
        let counting = |calls: &Arc<AtomicUsize>| -> StopHook {
            let calls = calls.clone();
            Arc::new(move || {
                calls.fetch_add(1, Ordering::SeqCst);
            })
        };
        let control = Arc::new(VmControl::new(1));
        control.on_stop(counting(&calls));
        assert_eq!(calls.load(Ordering::SeqCst), 0, "not stopped yet");
        control.request_pause().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 0, "a pause is no stop");
        control.request_stop(StopReason::Requested);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        control.vcpu_exited(0, VcpuExitReason::Stopped);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "and when the last vCPU ends"
        );
        // A hook set on a stopped VM runs at once.
        let late = Arc::new(AtomicUsize::new(0));
        control.on_stop(counting(&late));
        assert_eq!(late.load(Ordering::SeqCst), 1);
        // A VM whose vCPUs all ended by themselves stopped too.
        let halted = Arc::new(VmControl::new(1));
        let by_exit = Arc::new(AtomicUsize::new(0));
        halted.on_stop(counting(&by_exit));
        halted.vcpu_exited(0, VcpuExitReason::Stopped);
        assert_eq!(by_exit.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn pause_waits_for_every_vcpu_and_stop_ends_them() {
        let control = Arc::new(VmControl::new(2));
        let threads = fake_vcpus(&control, 2);
        control.resume().unwrap();
        assert_eq!(control.state(), RunState::Running);
        control.pause().unwrap();
        assert_eq!(control.lock().parked, 2);
        // Each parked vCPU answers a save request (these fake ones with an error).
        assert_eq!(
            control.save_vcpus().unwrap_err(),
            RunControlError::SaveFailed {
                vcpu: 0,
                message: "fake vCPU 0".into()
            }
        );
        assert_eq!(control.lock().parked, 2, "parked again");
        control.resume().unwrap();
        assert_eq!(
            control.save_vcpus().unwrap_err(),
            RunControlError::NotPaused
        );
        control.request_stop(StopReason::GuestExit(3));
        control.request_stop(StopReason::Requested);
        assert!(control.wait_for_exit(Some(Duration::from_secs(10))));
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(
            control.stop_reason(),
            Some(StopReason::GuestExit(3)),
            "first wins"
        );
        assert_eq!(control.pause(), Err(RunControlError::Stopped));
        assert_eq!(control.resume(), Err(RunControlError::Stopped));
    }

    #[test]
    fn a_requested_pause_returns_at_once_and_parks_the_vcpus() {
        let control = Arc::new(VmControl::new(2));
        let threads = fake_vcpus(&control, 2);
        control.resume().unwrap();
        control.request_pause().unwrap();
        assert_eq!(control.state(), RunState::Paused);
        while control.lock().parked < 2 {
            std::thread::yield_now();
        }
        control.request_stop(StopReason::Requested);
        assert_eq!(control.request_pause(), Err(RunControlError::Stopped));
        threads.into_iter().for_each(|t| t.join().unwrap());
    }

    #[test]
    fn all_vcpus_ending_on_their_own_means_all_halted() {
        let control = VmControl::new(2);
        assert!(!control.wait_for_exit(Some(Duration::from_millis(10))));
        control.vcpu_exited(0, VcpuExitReason::Halted);
        control.vcpu_exited(1, VcpuExitReason::Halted);
        assert!(control.wait_for_exit(None));
        assert_eq!(control.stop_reason(), Some(StopReason::AllHalted));
        assert!(StopReason::AllHalted.is_success());
        assert!(!StopReason::GuestExit(1).is_success());
    }
}
