//! [`Session`]: what the main thread, the event loop, the API server and the guest's hooks
//! share about one VM run.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use guest_mem::{FaultError, GuestMemory};
use kvm_ioctls::VmFd;

use super::reclaim::{Reclaim, ReclaimThread};
use super::{FaultingThread, RunError, RunOutcome, StopCause};
use crate::build::devices::Devices;
use crate::config::{format_size, BackingKind, VmConfig};
use crate::testguest::ReportDevice;
use crate::testguest::TestGuestError;
use crate::vm::run_control::{RunState, StopReason, VmControl};
use crate::vm::RunningVm;
use vmm_devices::balloon::BalloonHandle;
use vmm_devices::block::BlockHandle;
use vmm_devices::entropy::EntropyHandle;
use vmm_devices::i8042::I8042Device;
use vmm_devices::mem::MemHandle;
use vmm_devices::net::NetHandle;
use vmm_devices::pmem::PmemHandle;
use vmm_devices::serial::SerialDevice;
use vmm_devices::virtio::mmio::StatefulTransport;
use vmm_devices::vmgenid::VmGenId;
use vmm_devices::vsock::VsockCounters;
use vmm_devices::GuestWarnings;

/// How often a run whose zone ran out of frames looks for dead VMMs to recover.
const DEAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Longest an API request waits for the guest to start (the API serves from before the VM
/// exists, which takes milliseconds once guest memory is there).
const START_WAIT: Duration = Duration::from_secs(10);

/// Where the run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// The VM is being set up.
    Setup,
    /// The guest has been let run (it may be paused or stopped since).
    Started,
    /// The run is over.
    Ended,
}

/// A fault a guest's memory access could not be served with.
#[derive(Clone, Debug, PartialEq, Eq)]
struct GuestFault {
    thread: FaultingThread,
    error: FaultError,
    pool: String,
    /// How long it waited, when it was stopped for waiting too long (`--wait-for-memory=`).
    waited: Option<Duration>,
}

/// How often [`Session::watch_memory_waits`] looks at the waits for memory.
pub(super) const MEMORY_WAIT_CHECK: Duration = Duration::from_millis(100);

/// How often a wait for memory that goes on is summarised in a warning.
const WAIT_SUMMARY: Duration = Duration::from_secs(60);

/// Whether a summary of a wait is due at `now`, and the new time of the last one, given the
/// last (`None`: nothing waited) and whether anything `waits` now: the first look at a wait
/// only starts the clock (its start was warned of), then one every [`WAIT_SUMMARY`].
fn summary_due(last: Option<Instant>, now: Instant, waits: bool) -> (Option<Instant>, bool) {
    match (last, waits) {
        (_, false) => (None, false),
        (None, true) => (Some(now), false),
        (Some(at), true) if now.duration_since(at) >= WAIT_SUMMARY => (Some(now), true),
        (Some(at), true) => (Some(at), false),
    }
}

/// Calls to make once, in the order they were added, when a moment of the run comes.
#[derive(Default)]
struct Hooks(Mutex<Vec<Box<dyn FnOnce() + Send>>>);

impl Hooks {
    fn add(&self, hook: Box<dyn FnOnce() + Send>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(hook);
    }

    /// Makes the calls added so far (outside the lock: a call may add another).
    fn run(&self) {
        let hooks = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        hooks.into_iter().for_each(|hook| hook());
    }
}

/// One VM run's shared state.
pub(super) struct Session {
    config: VmConfig,
    memory: Arc<GuestMemory>,
    /// The balloon, if the VM has one.
    balloon: Option<BalloonHandle>,
    /// The virtio-pmem device, if any.
    pmem: Option<PmemHandle>,
    /// The virtio-mem device, if the VM has hot-pluggable memory.
    hotplug: Option<MemHandle>,
    /// The drives.
    drives: Vec<BlockHandle>,
    /// The virtio-rng device's counters, if the VM has one.
    entropy: Option<EntropyHandle>,
    /// The network interfaces.
    network_interfaces: Vec<NetHandle>,
    /// The vsock device's counters, if the VM has one.
    vsock: Option<Arc<VsockCounters>>,
    /// The VM's run control, once its vCPU threads exist.
    control: OnceLock<Arc<VmControl>>,
    /// The keyboard controller of a Linux guest, once it is on the bus.
    keyboard: OnceLock<Arc<I8042Device>>,
    /// The VM generation id of a Linux guest, once its interrupt is wired (for snapshots).
    vmgenid: OnceLock<Arc<VmGenId>>,
    /// The KVM VM, once it has started (for snapshots).
    vm_fd: OnceLock<Arc<VmFd>>,
    /// The serial port, once it exists (for snapshots).
    serial: OnceLock<Arc<SerialDevice>>,
    /// The test guest's report device, once it exists (for snapshots).
    report: OnceLock<Arc<ReportDevice>>,
    /// The virtio-mmio transports by slot (for snapshots).
    transports: Vec<Arc<dyn StatefulTransport>>,
    /// Where the run is; changes are announced on `phase_changed`.
    phase: Mutex<Phase>,
    phase_changed: Condvar,
    /// Who asked for the first stop; one asked for before the start stops the VM as soon as
    /// it has started.
    stop_cause: Mutex<Option<StopCause>>,
    /// vCPUs that wait for a frame (`--wait-for-memory`): a guest decides how often, so the
    /// warnings are rate-limited.
    memory_waits: GuestWarnings,
    /// The first fault a vCPU could not be served with.
    fault: Mutex<Option<GuestFault>>,
    /// When the last summary of a wait for memory was given (or the wait began).
    wait_summary: Mutex<Option<Instant>>,
    /// The zone's reclaim policy, if it runs; stopped with the session.
    reclaim: Mutex<Option<ReclaimThread>>,
    /// Since when each vCPU (then the other threads) has waited for memory, as
    /// [`Self::watch_memory_waits`] saw it: the time paused is not counted.
    waiting_since: Mutex<Vec<Option<Instant>>>,
    /// Called once the guest has started.
    on_start: Hooks,
    /// Called once every thread has the process's seccomp filter, before the guest may run.
    on_locked_down: Hooks,
    /// When this run last looked for dead VMMs in its zone.
    dead_check: Mutex<Option<std::time::Instant>>,
    /// Held while a snapshot is taken: the VM must stay paused from its vCPUs' state to its
    /// memory, so a resume (or another snapshot) is refused meanwhile.
    snapshotting: Mutex<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("config", &self.config)
            .field("phase", &self.phase())
            .field("stop_cause", &self.stop_cause())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session for `config` over `memory`, with the VM's balloon and virtio-pmem device if it
    /// has them.
    pub fn new(config: VmConfig, memory: Arc<GuestMemory>, devices: &Devices) -> Self {
        Session {
            config,
            memory,
            balloon: devices.balloon.clone(),
            pmem: devices.pmem.clone(),
            hotplug: devices.hotplug.clone(),
            drives: devices.drives.clone(),
            entropy: devices.entropy.clone(),
            network_interfaces: devices.network_interfaces.clone(),
            vsock: devices.vsock.clone(),
            control: OnceLock::new(),
            keyboard: OnceLock::new(),
            vmgenid: OnceLock::new(),
            vm_fd: OnceLock::new(),
            serial: OnceLock::new(),
            report: OnceLock::new(),
            transports: devices.mmio.transports(),
            phase: Mutex::new(Phase::Setup),
            phase_changed: Condvar::new(),
            stop_cause: Mutex::new(None),
            memory_waits: GuestWarnings::default(),
            fault: Mutex::new(None),
            waiting_since: Mutex::new(Vec::new()),
            wait_summary: Mutex::new(None),
            reclaim: Mutex::new(None),
            on_start: Hooks::default(),
            on_locked_down: Hooks::default(),
            dead_check: Mutex::new(None),
            snapshotting: Mutex::new(()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &VmConfig {
        &self.config
    }

    /// Guest memory.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.memory
    }

    /// The balloon, if the VM has one.
    pub fn balloon_handle(&self) -> Option<&BalloonHandle> {
        self.balloon.as_ref()
    }

    /// The drives.
    pub fn drives(&self) -> &[BlockHandle] {
        &self.drives
    }

    /// The network interfaces' configurations with the rate limiters the API last gave them.
    pub fn network_interfaces_now(&self) -> Vec<crate::config::NetConfig> {
        self.config
            .network_interfaces
            .iter()
            .map(|config| {
                let mut config = config.clone();
                let handle = self.network_interfaces.iter().find(|n| n.id == config.id);
                if let Some((rx, tx)) = handle.map(NetHandle::rate_limiters) {
                    config.rx_rate_limiter = rx;
                    config.tx_rate_limiter = tx;
                }
                config
            })
            .collect()
    }

    /// The virtio-rng device's counters, if the VM has one.
    pub fn entropy(&self) -> Option<&EntropyHandle> {
        self.entropy.as_ref()
    }

    /// The network interfaces.
    pub fn network_interfaces(&self) -> &[NetHandle] {
        &self.network_interfaces
    }

    /// The vsock device's counters, if the VM has one.
    pub fn vsock(&self) -> Option<&VsockCounters> {
        self.vsock.as_deref()
    }

    /// The virtio-pmem device, if the VM has one.
    pub fn pmem_handle(&self) -> Option<&PmemHandle> {
        self.pmem.as_ref()
    }

    /// The virtio-mem device, if the VM has hot-pluggable memory.
    pub fn hotplug_handle(&self) -> Option<&MemHandle> {
        self.hotplug.as_ref()
    }

    /// Makes `keyboard` the VM's keyboard controller (for Ctrl-Alt-Del); the first one stays.
    pub fn attach_keyboard(&self, keyboard: Arc<I8042Device>) {
        let _ = self.keyboard.set(keyboard);
    }

    /// The keyboard controller, if the VM has one.
    pub fn keyboard(&self) -> Option<&Arc<I8042Device>> {
        self.keyboard.get()
    }

    /// Makes `vmgenid` the VM's generation id device (for snapshots); the first one stays.
    pub fn attach_vmgenid(&self, vmgenid: Arc<VmGenId>) {
        let _ = self.vmgenid.set(vmgenid);
    }

    /// The generation id device, if the VM has one.
    pub fn vmgenid(&self) -> Option<&Arc<VmGenId>> {
        self.vmgenid.get()
    }

    /// Makes `serial` the VM's serial port (for snapshots); the first one stays.
    pub fn attach_serial(&self, serial: Arc<SerialDevice>) {
        let _ = self.serial.set(serial);
    }

    /// The serial port, once the VM has one.
    pub fn serial(&self) -> Option<&Arc<SerialDevice>> {
        self.serial.get()
    }

    /// Makes `report` the test guest's report device (for snapshots); the first one stays.
    pub fn attach_report(&self, report: Arc<ReportDevice>) {
        let _ = self.report.set(report);
    }

    /// The test guest's report device, once it exists.
    pub fn report(&self) -> Option<&Arc<ReportDevice>> {
        self.report.get()
    }

    /// The virtio-mmio transports, by slot.
    pub fn transports(&self) -> &[Arc<dyn StatefulTransport>] {
        &self.transports
    }

    /// The KVM VM, once it has started.
    pub fn vm_fd(&self) -> Option<&Arc<VmFd>> {
        self.vm_fd.get()
    }

    /// Breaks the seal a snapshot put on the VM's memory in its zone, before the guest runs
    /// and changes it: that snapshot can no longer be loaded.
    pub fn break_seal(&self) -> Result<(), guest_mem::zone::ZoneError> {
        match self.memory.zone_vm() {
            Some(vm) => vm.break_seal(),
            None => Ok(()),
        }
    }

    /// The run control, once the VM has started.
    pub fn control(&self) -> Option<&Arc<VmControl>> {
        self.control.get()
    }

    fn lock_phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called once the vCPU threads exist (paused): registers each vCPU thread with guest
    /// memory (its faults allocate with its own core), hands out the control and lets the
    /// guest run, unless `paused` (a snapshot loaded without resuming: an API client resumes
    /// it). Pause and resume requests wait for this, so none is lost to the start.
    pub fn start_guest(&self, vm: &RunningVm, paused: bool) {
        let control = vm.control();
        // A stopping VM's faults that wait for a frame (a vCPU's, or those of KVM's asynchronous
        // page fault workers, which KVM waits for before it destroys the VM) must end: weak,
        // as the memory must not outlive the run through the control.
        let memory = Arc::downgrade(&self.memory);
        control.on_stop(Arc::new({
            let memory = memory.clone();
            move || {
                if let Some(memory) = memory.upgrade() {
                    memory.release_faults();
                }
            }
        }));
        // A vCPU that waits for a frame while the VM is paused is held there (see `pause`).
        control.on_pause_count(Arc::new(move |index| {
            memory
                .upgrade()
                .is_some_and(|memory| memory.vcpu_held(index))
        }));
        self.start_reclaim(control);
        let _ = self.vm_fd.set(vm.fd().clone());
        if !paused {
            if let Err(e) = self.break_seal() {
                control.request_stop(StopReason::VcpuFailed {
                    vcpu: 0,
                    message: format!("cannot mark the VM's memory as changing: {e}"),
                });
            }
        }
        for (index, tid) in vm.vcpu_tids().iter().enumerate() {
            if let Err(e) = self.memory.register_vcpu_tid(index, *tid) {
                control.request_stop(StopReason::VcpuFailed {
                    vcpu: index,
                    message: format!("cannot register vCPU {index} with guest memory: {e}"),
                });
            }
        }
        // The first VM of a session is its only one.
        let _ = self.control.set(control.clone());
        // The cause's lock orders this against `request_stop`: one of the two sees the other.
        if self.stop_cause().is_some() {
            control.request_stop(StopReason::Requested);
        }
        // Every thread gets the process's seccomp filter before the guest may run, and the
        // threads with a filter of their own that are not the guest's to start stack it.
        match crate::seccomp::lock_down() {
            Ok(()) => self.on_locked_down.run(),
            Err(e) => control.request_stop(StopReason::VcpuFailed {
                vcpu: 0,
                message: e,
            }),
        }
        let mut phase = self.lock_phase();
        if !paused {
            // Fails only when the VM was stopped already; it ends at once then.
            let _ = control.resume();
        }
        *phase = Phase::Started;
        self.phase_changed.notify_all();
        drop(phase);
        self.on_start.run();
    }

    /// Calls `hook` once the process is locked down, before the guest may run (see
    /// [`Self::start_guest`]).
    pub fn on_locked_down(&self, hook: Box<dyn FnOnce() + Send>) {
        self.on_locked_down.add(hook);
    }

    /// Calls `hook` once the guest has started (see [`Self::start_guest`]).
    pub fn on_start(&self, hook: Box<dyn FnOnce() + Send>) {
        self.on_start.add(hook);
    }

    /// Called when the guest has ended (or never started): the control API answers with that.
    pub fn finish(&self) {
        *self.lock_phase() = Phase::Ended;
        self.phase_changed.notify_all();
    }

    /// The phase, waiting up to [`START_WAIT`] while the VM is being set up.
    pub fn phase_after_setup(&self) -> Phase {
        let phase = self.lock_phase();
        let (phase, _) = self
            .phase_changed
            .wait_timeout_while(phase, START_WAIT, |phase| *phase == Phase::Setup)
            .unwrap_or_else(|e| e.into_inner());
        *phase
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        *self.lock_phase()
    }

    /// Stops the VM at its owner's request (API, signals); before the start, the VM stops as
    /// soon as it has started. The first cause is the one the run reports.
    pub fn request_stop(&self, cause: StopCause) {
        self.stop_cause
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(cause);
        if let Some(control) = self.control.get() {
            control.request_stop(StopReason::Requested);
        }
    }

    /// Called when guest memory reports a fault error: records the first and stops the VM (the
    /// stop ends every fault that waits, see [`Self::start_guest`]). With `--wait-for-memory`,
    /// a fault that found the pool exhausted waits for a frame instead (guest memory retries it
    /// until another VM of the pool gives one back), with a warning. Faults of threads that are
    /// no vCPU (KVM's asynchronous page fault workers) are the VM's as much as a vCPU's.
    pub fn guest_fault_reported(&self) {
        let Some(control) = self.control.get() else {
            return;
        };
        let errors = (0..self.config.vcpus)
            .map(|vcpu| {
                (
                    FaultingThread::Vcpu(vcpu),
                    self.memory.take_fault_error(vcpu),
                )
            })
            .chain([(FaultingThread::Worker, self.memory.take_other_fault_error())]);
        let mut first = None;
        for (thread, error) in errors {
            let Some(error) = error else {
                continue;
            };
            if error == FaultError::PoolExhausted {
                self.recover_dead_vmms();
                if self.config.wait_for_memory {
                    self.memory_waits.warn(format_args!(
                        "{thread}: {error} ({}); it waits for a frame another VM gives back",
                        self.pool_summary()
                    ));
                    continue;
                }
            }
            first.get_or_insert(GuestFault {
                thread,
                error,
                pool: self.pool_summary(),
                waited: None,
            });
        }
        let Some(fault) = first else {
            return;
        };
        let message = format!("guest memory fault: {}", fault.error);
        let vcpu = match fault.thread {
            FaultingThread::Vcpu(vcpu) => vcpu,
            FaultingThread::Worker => 0,
        };
        self.fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(fault);
        control.request_stop(StopReason::VcpuFailed { vcpu, message });
    }

    /// Starts the zone's reclaim policy for this VM (see `reclaim`): a VM in a zone with a
    /// balloon that reports statistics, unless it opted out.
    fn start_reclaim(&self, control: &Arc<VmControl>) {
        let stats = self
            .balloon
            .as_ref()
            .filter(|balloon| balloon.stats_interval().is_some());
        let (Some(balloon), Some(_)) = (stats, self.memory.zone_vm()) else {
            return;
        };
        if self.config.reclaim.below_percent == 0 {
            return;
        }
        let policy = Reclaim::new(
            balloon.clone(),
            &self.memory,
            control,
            self.config.reclaim,
            self.config.memory_size,
        );
        match policy.spawn() {
            Ok(thread) => {
                *self.reclaim.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
            }
            Err(e) => log::warn!("cannot start the zone's reclaim policy: {e}"),
        }
    }

    /// With `--wait-for-memory`, called every [`MEMORY_WAIT_CHECK`]: records in the VM's zone
    /// slot whether it waits for memory, since when and for how much (`vmm zone inspect`); and
    /// with a limit (`--wait-for-memory=LIMIT`), a vCPU (or another thread) that has waited for
    /// a frame longer than the limit, not counting while the VM is paused, stops the VM with
    /// [`RunError::MemoryWaitExpired`].
    pub fn watch_memory_waits(&self) {
        let Some(control) = self.control.get() else {
            return;
        };
        let mut since = self.waiting_since.lock().unwrap_or_else(|e| e.into_inner());
        let threads = self.config.vcpus + 1;
        since.resize(threads, None);
        let now = Instant::now();
        let waits: Vec<bool> = (0..threads)
            .map(|index| match index < self.config.vcpus {
                true => self.memory.vcpu_waits(index),
                false => self.memory.other_fault_waits(),
            })
            .collect();
        for (started, &waits) in since.iter_mut().zip(&waits) {
            if !waits {
                *started = None;
            }
        }
        self.report_waiting(&waits, &since);
        let Some(limit) = self.config.memory_wait_limit else {
            return;
        };
        if control.state() != RunState::Running {
            // Paused (or stopping): the wait starts over from the resume.
            since.iter_mut().for_each(|s| *s = s.map(|_| now));
            return;
        }
        for (index, started) in since.iter_mut().enumerate() {
            let Some(at) = started.filter(|_| waits[index]) else {
                *started = waits[index].then_some(now);
                continue;
            };
            let waited = now - at;
            if waited < limit {
                continue;
            }
            let thread = match index < self.config.vcpus {
                true => FaultingThread::Vcpu(index),
                false => FaultingThread::Worker,
            };
            self.fault
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(GuestFault {
                    thread,
                    error: FaultError::PoolExhausted,
                    pool: self.pool_summary(),
                    waited: Some(waited),
                });
            control.request_stop(StopReason::VcpuFailed {
                vcpu: index.min(self.config.vcpus - 1),
                message: format!("waited for guest memory for {waited:?}"),
            });
            return;
        }
    }

    /// Reports whether the VM's threads (`waits`: the vCPUs', then the other threads') wait
    /// for memory: in the VM's zone slot (since the earliest wait began, one chunk each), and
    /// in a warning every [`WAIT_SUMMARY`] while they wait (each wait's start is warned of as
    /// it is reported).
    fn report_waiting(&self, waits: &[bool], since: &[Option<Instant>]) {
        let count = waits.iter().filter(|&&w| w).count() as u64;
        let longest = (0..waits.len())
            .filter(|&index| waits[index])
            .filter_map(|index| match index < self.config.vcpus {
                true => self.memory.vcpu_waited(index),
                false => since[index].map(|at| at.elapsed()),
            })
            .max()
            .unwrap_or_default();
        let mut summary = self.wait_summary.lock().unwrap_or_else(|e| e.into_inner());
        let due;
        (*summary, due) = summary_due(*summary, Instant::now(), count > 0);
        drop(summary);
        if due {
            log::warn!(
                "still waiting for guest memory: {count} of the VM's faults, the longest for \
                 {:.0} s ({})",
                longest.as_secs_f64(),
                self.pool_summary()
            );
        }
        let Some(vm) = self.memory.zone_vm() else {
            return;
        };
        if count == 0 {
            vm.set_waiting(None);
            return;
        }
        let began = std::time::SystemTime::now()
            .checked_sub(longest)
            .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(1, |at| {
                u64::try_from(at.as_millis()).unwrap_or(u64::MAX).max(1)
            });
        let chunk = self.memory.pool().frame_size().bytes();
        vm.set_waiting(Some((began, count * chunk)));
    }

    /// In a zone shared with other VMMs that ran out of frames: recovers VMMs that died with the
    /// zone open (their allocator reservations may hold free frames), at most once a second.
    fn recover_dead_vmms(&self) {
        let Some(vm) = self.memory.zone_vm() else {
            return;
        };
        let mut last = self.dead_check.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| at.elapsed() < DEAD_CHECK_INTERVAL) {
            return;
        }
        *last = Some(std::time::Instant::now());
        if let Err(e) = vm.zone().recover_dead_processes() {
            log::warn!("cannot recover the dead VMMs of the zone: {e}");
        }
    }

    /// "pool of 64 MiB, 0 bytes free, 2 MiB frames" ("zone PATH of ..." for a zone; and a hint
    /// for persistent pools).
    fn pool_summary(&self) -> String {
        let stats = self.memory.pool().stats();
        let hint = if matches!(self.config.backing, BackingKind::File(_)) {
            "; a pool file keeps the frames of a VMM that was killed"
        } else {
            ""
        };
        let pool = match &self.config.zone {
            Some(zone) => format!("zone {}", zone.path.display()),
            None => "pool".to_owned(),
        };
        format!(
            "{pool} of {}, {} free, {} frames{hint}",
            format_size(stats.total_bytes),
            format_size(stats.free_bytes),
            self.memory.pool().frame_size().name()
        )
    }

    /// Marks a snapshot as being taken until the guard goes; `None` while another one is.
    pub fn begin_snapshot(&self) -> Option<MutexGuard<'_, ()>> {
        match self.snapshotting.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Who asked for the first stop, if anybody did.
    pub fn stop_cause(&self) -> Option<StopCause> {
        *self.stop_cause.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run's outcome: a recorded guest memory fault wins over what the guest path saw, and
    /// a guest image that could not be loaded into an exhausted pool says so (the loaders only
    /// see a failed write).
    pub fn outcome(&self, outcome: Result<RunOutcome, RunError>) -> Result<RunOutcome, RunError> {
        let fault = self.fault.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(GuestFault {
            thread,
            error,
            pool,
            waited,
        }) = fault
        {
            return Err(match waited {
                Some(waited) => RunError::MemoryWaitExpired {
                    thread,
                    waited_s: waited.as_secs_f64(),
                    pool,
                },
                None => RunError::GuestMemory {
                    thread,
                    error,
                    pool,
                },
            });
        }
        let loading = match &outcome {
            Err(RunError::Boot { kernel, .. }) => format!("the kernel {}", kernel.display()),
            Err(RunError::TestGuest(TestGuestError::Load(_))) => "the test guest image".into(),
            _ => return outcome,
        };
        let pool = self.memory.pool();
        if pool.stats().free_bytes >= pool.frame_size().bytes() {
            return outcome;
        }
        Err(RunError::PoolExhaustedAtStart {
            loading,
            pool: self.pool_summary(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_summarised_once_a_minute_while_it_lasts() {
        let start = Instant::now();
        let (last, due) = summary_due(None, start, true);
        assert_eq!((last, due), (Some(start), false), "its start was warned of");
        let minute = start + WAIT_SUMMARY;
        assert_eq!(
            summary_due(last, start + WAIT_SUMMARY / 2, true),
            (last, false)
        );
        assert_eq!(summary_due(last, minute, true), (Some(minute), true));
        assert_eq!(summary_due(Some(minute), minute, false), (None, false));
    }
}
