//! A VMM started without a VM, as Firecracker starts (`vmm --api-sock PATH`, [`serve`]): its
//! API ([`ApiFront`]) takes the pre-boot configuration ([`VmResources`]) until
//! `InstanceStart` boots it, or loads a snapshot (`PUT /snapshot/load`); from then on it is
//! that VM's API. `--config-file` gives the configuration at once and boots.
//!
//! ```text
//! API thread     PUT /machine-config, /boot-source, /drives/{id}, ... -> VmResources
//!                InstanceStart or PUT /snapshot/load -> main thread, wait for the VM to start
//! main thread    wait -> frames (pool or zone) or snapshot -> run the VM as `vmm run` does
//! ```

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::console::SerialFile;
use super::metrics_file::MetricsSink;
use super::restore::{prepare, SnapshotError};
use super::session::Session;
use super::session_api::update_store;
use super::signals::StopSignals;
use super::{RunError, RunOutcome, StopCause};
use crate::build::early_vm::EarlyKvmVm;
use crate::build::resources::{VmResources, DEFAULT_PMEM_ID};
use crate::config::VmConfig;
use vmm_api::metrics::{Level, Operation, METRICS};
use vmm_api::model::{
    BalloonHintingStatus, BalloonInfo, BalloonStartCmd, BalloonStatistics, BalloonUpdate,
    FullVmConfiguration, InstanceInfo, MachineConfiguration, MachineInfo, MemoryHotplugSizeUpdate,
    MemoryHotplugStatus, MemoryInfo, PartialDrive, PartialNetworkInterface, PartialPmem,
    SnapshotCreateParams, SnapshotLoadParams, VmState,
};
use vmm_api::vmm_control::{HOTPLUG_NOT_CONFIGURED, NOT_AFTER_START, NOT_BEFORE_START};
use vmm_api::{ApiServer, ControlError, LogControl, PreBoot, VmmControl};
use vmm_devices::serial::SerialOutput;

/// What the API thread asks the main thread to do.
enum MainThreadCall {
    /// Boot this VM.
    Start(Box<VmConfig>),
    /// Load this snapshot.
    Load(SnapshotLoadParams),
}

/// A request and where its answer goes (once the VM runs, or when it could not start).
struct Pending {
    request: MainThreadCall,
    answer: Sender<Result<(), ControlError>>,
}

/// How `vmm --api-sock` was started.
pub struct ServeOptions {
    /// The API socket, if any (`--config-file` alone serves none).
    pub api_socket: Option<PathBuf>,
    /// The instance id (`--id`).
    pub id: String,
    /// The configuration of `--config-file`: the VM boots at once.
    pub config: Option<FullVmConfiguration>,
    /// The front end's logger, for `PUT /logger`.
    pub logger: Option<Arc<dyn LogControl>>,
    /// Pre-boot requests the command line makes (Firecracker's `--log-path`, `--level`, ...,
    /// `--metrics-path`), applied before the configuration file and the API.
    pub command_line: Vec<PreBoot>,
    /// The MMDS document of the command line (Firecracker's `--metadata`).
    pub metadata: Option<serde_json::Value>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("api_socket", &self.api_socket)
            .field("id", &self.id)
            .field("config", &self.config)
            .field("logger", &self.logger.is_some())
            .field("command_line", &self.command_line)
            .field("metadata", &self.metadata.is_some())
            .finish()
    }
}

/// The API of a VMM that may not have a VM yet.
pub(super) struct ApiFront {
    id: String,
    api_socket: Option<PathBuf>,
    requests: Mutex<Option<Sender<Pending>>>,
    session: Mutex<Option<Arc<Session>>>,
    /// The answer to the start or load in progress, sent once its VM has started.
    pending: Mutex<Option<Sender<Result<(), ControlError>>>>,
    resources: Mutex<VmResources>,
    logger: Option<Arc<dyn LogControl>>,
    metrics: Mutex<Option<MetricsSink>>,
    /// Where the guest's console goes (`PUT /serial`); stdout without it.
    console: Mutex<Option<SerialFile>>,
}

impl std::fmt::Debug for ApiFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiFront")
            .field("id", &self.id)
            .field("started", &self.session().is_some())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl ApiFront {
    fn new(options: &ServeOptions, requests: Sender<Pending>) -> Self {
        ApiFront {
            id: options.id.clone(),
            api_socket: options.api_socket.clone(),
            requests: Mutex::new(Some(requests)),
            session: Mutex::new(None),
            pending: Mutex::new(None),
            resources: Mutex::new(VmResources::default()),
            logger: options.logger.clone(),
            metrics: Mutex::new(None),
            console: Mutex::new(None),
        }
    }

    /// The guest's console output: the file or pipe of `PUT /serial`, or stdout.
    pub fn console_output(&self) -> SerialOutput {
        match lock(&self.console).take() {
            Some(file) => Box::new(file),
            None => super::console::serial_output(),
        }
    }

    /// Writes the metrics a last time as the VMM ends (what happened since the last line).
    fn flush_metrics_at_exit(&self) {
        if let Err(e) = self.flush_metrics() {
            log::warn!("{e}");
        }
    }

    fn session(&self) -> Option<Arc<Session>> {
        lock(&self.session).clone()
    }

    /// Hands the API to the VM's session; the start or load is answered once the VM starts.
    pub fn attach(&self, session: Arc<Session>) {
        if let Some(answer) = lock(&self.pending).take() {
            session.on_start(Box::new(move || {
                // The client may have gone: nobody to tell then.
                let _ = answer.send(Ok(()));
            }));
        }
        *lock(&self.session) = Some(session);
    }

    /// The VM's session, or Firecracker's answer while there is none.
    fn started(&self) -> Result<Arc<Session>, ControlError> {
        self.session()
            .ok_or_else(|| ControlError::InvalidState(NOT_BEFORE_START.into()))
    }

    /// Refuses pre-boot requests once a start or load was asked for.
    fn check_not_started(&self) -> Result<(), ControlError> {
        if self.session().is_some() || lock(&self.requests).is_none() {
            return Err(ControlError::InvalidState(NOT_AFTER_START.into()));
        }
        Ok(())
    }

    /// Sends `request` to the main thread and waits for its answer, however long the start or
    /// load takes (a client is never told a request failed while it is still under way, nor
    /// can a success follow a failure); only one is taken. Should the main thread drop the
    /// request unanswered, the VM did not start.
    fn submit(&self, request: MainThreadCall) -> Result<(), ControlError> {
        let (answer, answered) = mpsc::channel();
        let sent = lock(&self.requests)
            .take()
            .is_some_and(|requests| requests.send(Pending { request, answer }).is_ok());
        if !sent {
            return Err(ControlError::InvalidState(NOT_AFTER_START.into()));
        }
        answered
            .recv()
            .unwrap_or_else(|_| Err(ControlError::Internal("the VM did not start".into())))
    }

    /// Takes requests again after a start that failed before anything was made.
    fn reopen(&self, requests: Sender<Pending>) {
        *lock(&self.requests) = Some(requests);
    }

    /// Applies a pre-boot request.
    fn apply(&self, request: PreBoot) -> Result<(), ControlError> {
        let mut resources = lock(&self.resources);
        match request {
            PreBoot::Machine(machine) => resources.put_machine(machine),
            PreBoot::PatchMachine(update) => resources.patch_machine(update),
            PreBoot::BootSource(boot) => resources.put_boot_source(boot),
            PreBoot::Drive(id, drive) => resources.put_drive(&id, drive),
            PreBoot::Pmem(id, pmem) => resources.put_pmem(&id, pmem),
            PreBoot::MemoryHotplug(hotplug) => resources.put_memory_hotplug(hotplug),
            PreBoot::Entropy(entropy) => resources.put_entropy(entropy),
            PreBoot::NetworkInterface(id, interface) => {
                resources.put_network_interface(&id, interface)
            }
            PreBoot::Vsock(vsock) => resources.put_vsock(vsock),
            PreBoot::MmdsConfig(request) => resources.put_mmds_config(request),
            PreBoot::CpuConfig(template) => resources.put_cpu_config(template),
            PreBoot::Balloon(balloon) => resources.put_balloon(balloon),
            PreBoot::Logger(logger) => {
                let control = self.logger.as_ref().ok_or_else(|| {
                    ControlError::InvalidArgument("this VMM's logger cannot be changed".into())
                })?;
                control
                    .configure(&logger)
                    .map_err(|e| ControlError::InvalidArgument(format!("Logger error: {e}")))?;
                resources.set_logger(logger);
                Ok(())
            }
            PreBoot::Serial(serial) => {
                let opened = SerialFile::open(&serial)
                    .map_err(|e| ControlError::InvalidArgument(format!("Serial error: {e}")))?;
                *lock(&self.console) = Some(opened);
                Ok(())
            }
            PreBoot::Metrics(metrics) => {
                let mut sink = lock(&self.metrics);
                if sink.is_some() {
                    return Err(ControlError::InvalidArgument(
                        "Metrics error: Reinitialization of metrics not allowed.".into(),
                    ));
                }
                let opened = MetricsSink::open(&metrics, &self.id)
                    .map_err(|e| ControlError::InvalidArgument(format!("Metrics error: {e}")))?;
                *sink = Some(opened);
                resources.set_metrics(metrics);
                Ok(())
            }
        }
    }
}

impl VmmControl for ApiFront {
    fn confine_api_thread(&self) {
        crate::seccomp::confine_api_thread();
    }

    fn machine_info(&self) -> Result<MachineInfo, ControlError> {
        self.started()?.machine_info()
    }

    fn instance_id(&self) -> String {
        self.id.clone()
    }

    fn instance_info(&self) -> Result<InstanceInfo, ControlError> {
        let state = match self.session() {
            Some(session) => session.machine_info()?.state,
            None => VmState::NotStarted,
        };
        Ok(InstanceInfo::new(&self.id, state))
    }

    fn machine_config(&self) -> Result<MachineConfiguration, ControlError> {
        match self.session() {
            Some(session) => session.machine_config(),
            None => Ok(lock(&self.resources).machine().clone()),
        }
    }

    fn vm_config(&self) -> Result<FullVmConfiguration, ControlError> {
        let resources = lock(&self.resources);
        match self.session() {
            Some(session) => {
                let mut config = session.vm_config()?;
                let configured = resources.full_config();
                config.logger = configured.logger;
                config.metrics = configured.metrics;
                // A static template shows as the API was given it, not as its changes.
                config.cpu_config = configured.cpu_config;
                if let (Some(machine), Some(given)) =
                    (&mut config.machine_config, configured.machine_config)
                {
                    machine.cpu_template = given.cpu_template;
                }
                if let (Some(pmem), Some(id)) = (config.pmem.first_mut(), resources.pmem_id()) {
                    id.clone_into(&mut pmem.id);
                }
                Ok(config)
            }
            None => Ok(resources.full_config()),
        }
    }

    fn configure(&self, request: PreBoot) -> Result<(), ControlError> {
        self.check_not_started()?;
        self.apply(request)
    }

    fn start_instance(&self) -> Result<(), ControlError> {
        self.check_not_started()?;
        let config = lock(&self.resources).vm_config(self.api_socket.as_deref())?;
        self.submit(MainThreadCall::Start(Box::new(config)))
    }

    fn flush_metrics(&self) -> Result<(), ControlError> {
        let sink = lock(&self.metrics);
        let Some(sink) = sink.as_ref() else {
            return Ok(());
        };
        sink.flush(self.session().as_deref())
            .map_err(|e| ControlError::Internal(format!("cannot write the metrics: {e}")))
    }

    fn memory_info(&self) -> Result<MemoryInfo, ControlError> {
        self.started()?.memory_info()
    }

    fn pause(&self) -> Result<(), ControlError> {
        let session = self.started()?;
        METRICS
            .latencies
            .time(Level::Vmm, Operation::PauseVm, || session.pause())
    }

    fn resume(&self) -> Result<(), ControlError> {
        let session = self.started()?;
        METRICS
            .latencies
            .time(Level::Vmm, Operation::ResumeVm, || session.resume())
    }

    fn shutdown(&self) -> Result<(), ControlError> {
        match self.session() {
            Some(session) => session.shutdown(),
            None => {
                // No VM: the VMM itself ends, as on SIGTERM.
                // SAFETY: sends SIGTERM to this process, whose main thread handles it.
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
                Ok(())
            }
        }
    }

    fn send_ctrl_alt_del(&self) -> Result<(), ControlError> {
        self.started()?.send_ctrl_alt_del()
    }

    fn balloon(&self) -> Result<BalloonInfo, ControlError> {
        if let Some(session) = self.session() {
            return session.balloon();
        }
        let resources = lock(&self.resources);
        let balloon = resources
            .balloon()
            .ok_or(ControlError::BalloonNotConfigured)?;
        Ok(BalloonInfo {
            amount_mib: balloon.amount_mib,
            actual_mib: 0,
            deflate_on_oom: balloon.deflate_on_oom,
            free_page_reporting: balloon.free_page_reporting,
            free_page_hinting: balloon.free_page_hinting,
            stats_polling_interval_s: balloon.stats_polling_interval_s,
            needs_reset: false,
            driver_violations: Default::default(),
        })
    }

    /// As Firecracker's: only once the VM runs (before, `PUT /balloon` configures it).
    fn update_balloon(&self, update: BalloonUpdate) -> Result<(), ControlError> {
        self.started()?.update_balloon(update)
    }

    fn update_network_interface(
        &self,
        id: &str,
        update: &PartialNetworkInterface,
    ) -> Result<(), ControlError> {
        self.started()?.update_network_interface(id, update)
    }

    /// As Firecracker's: only once the VM runs (the guest's driver takes part).
    fn start_balloon_hinting(&self, cmd: BalloonStartCmd) -> Result<(), ControlError> {
        self.started()?.start_balloon_hinting(cmd)
    }

    fn stop_balloon_hinting(&self) -> Result<(), ControlError> {
        self.started()?.stop_balloon_hinting()
    }

    fn balloon_hinting_status(&self) -> Result<BalloonHintingStatus, ControlError> {
        self.started()?.balloon_hinting_status()
    }

    fn update_drive(&self, id: &str, update: &PartialDrive) -> Result<(), ControlError> {
        self.started()?.update_drive(id, update)
    }

    fn update_pmem(&self, id: &str, update: &PartialPmem) -> Result<(), ControlError> {
        let session = self.started()?;
        // The device's id is the API's, or `pmem0` for a `vmm run --pmem` VM.
        let configured = lock(&self.resources).pmem_id().map(str::to_owned);
        if id != configured.as_deref().unwrap_or(DEFAULT_PMEM_ID) {
            return Err(ControlError::InvalidArgument(format!(
                "Invalid pmem ID: {id}"
            )));
        }
        session.update_pmem(id, update)
    }

    /// Before the start into the document the VM will serve; after it, the VM's.
    fn update_mmds(&self, data: serde_json::Value, patch: bool) -> Result<(), ControlError> {
        if let Some(session) = self.session() {
            return session.update_mmds(data, patch);
        }
        let store = lock(&self.resources).mmds_store().clone();
        update_store(&store, data, patch)
    }

    fn mmds(&self) -> Result<serde_json::Value, ControlError> {
        if let Some(session) = self.session() {
            return session.mmds();
        }
        let store = lock(&self.resources).mmds_store().clone();
        let value = lock(&store).get();
        Ok(value)
    }

    fn balloon_statistics(&self) -> Result<BalloonStatistics, ControlError> {
        self.started()?.balloon_statistics()
    }

    /// Before the start, the configuration with nothing plugged or requested.
    fn memory_hotplug(&self) -> Result<MemoryHotplugStatus, ControlError> {
        if let Some(session) = self.session() {
            return session.memory_hotplug();
        }
        let resources = lock(&self.resources);
        let hotplug = resources
            .memory_hotplug()
            .ok_or_else(|| ControlError::InvalidArgument(HOTPLUG_NOT_CONFIGURED.into()))?;
        Ok(MemoryHotplugStatus {
            total_size_mib: hotplug.total_size_mib,
            slot_size_mib: hotplug.slot_size_mib,
            block_size_mib: hotplug.block_size_mib,
            plugged_size_mib: 0,
            requested_size_mib: 0,
        })
    }

    /// As Firecracker's: only once the VM runs (the guest's driver takes part).
    fn update_memory_hotplug(&self, update: MemoryHotplugSizeUpdate) -> Result<(), ControlError> {
        self.started()?.update_memory_hotplug(update)
    }

    fn create_snapshot(&self, params: &SnapshotCreateParams) -> Result<(), ControlError> {
        let session = self.started()?;
        let operation = params.snapshot_type.operation();
        METRICS.latencies.time(Level::Vmm, operation, || {
            VmmControl::create_snapshot(session.as_ref(), params)
        })
    }

    fn load_snapshot(&self, params: &SnapshotLoadParams) -> Result<(), ControlError> {
        self.check_not_started()?;
        if lock(&self.resources).boot_specific() {
            return Err(ControlError::InvalidState(
                "Loading a microVM snapshot not allowed after configuring boot-specific \
                 resources."
                    .into(),
            ));
        }
        params
            .check_supported()
            .map_err(ControlError::InvalidArgument)?;
        METRICS
            .latencies
            .time(Level::Vmm, Operation::LoadSnapshot, || {
                self.submit(MainThreadCall::Load(params.clone()))
            })
    }
}

/// How often the waiting VMM looks for a stop signal.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Applies `config` (`--config-file`) to `front`, as the API's requests would.
fn apply_config_file(front: &ApiFront, config: FullVmConfiguration) -> Result<(), ControlError> {
    let mut requests: Vec<PreBoot> = Vec::new();
    requests.extend(config.logger.map(PreBoot::Logger));
    requests.extend(config.metrics.map(PreBoot::Metrics));
    requests.extend(config.machine_config.map(PreBoot::Machine));
    requests.extend(config.boot_source.map(PreBoot::BootSource));
    requests.extend(config.balloon.map(PreBoot::Balloon));
    for drive in config.drives {
        requests.push(PreBoot::Drive(drive.drive_id.clone(), drive));
    }
    for pmem in config.pmem {
        requests.push(PreBoot::Pmem(pmem.id.clone(), pmem));
    }
    requests.extend(config.entropy.map(PreBoot::Entropy));
    requests.extend(config.memory_hotplug.map(PreBoot::MemoryHotplug));
    requests.extend(config.vsock.map(PreBoot::Vsock));
    requests.extend(config.cpu_config.map(PreBoot::CpuConfig));
    for interface in config.network_interfaces {
        requests.push(PreBoot::NetworkInterface(
            interface.iface_id.clone(),
            interface,
        ));
    }
    // After the interfaces it names.
    requests.extend(config.mmds_config.map(PreBoot::MmdsConfig));
    for request in requests {
        front.apply(request)?;
    }
    Ok(())
}

/// `vmm --api-sock PATH [--id ID] [--config-file FILE]`: serves the API of instance `id`
/// without a VM until a client boots one (`InstanceStart`) or loads a snapshot, or boots the
/// VM of the configuration file at once; then runs that VM until it ends. SIGINT and SIGTERM
/// end the wait.
pub fn serve(options: ServeOptions) -> Result<RunOutcome, RunError> {
    let signals = StopSignals::block().map_err(RunError::Signals)?;
    let (requests, incoming): (Sender<Pending>, Receiver<Pending>) = mpsc::channel();
    let front = Arc::new(ApiFront::new(&options, requests.clone()));
    let mut flusher = MetricsFlusher::default();
    // The KVM VM is made while the VMM waits: a start or load then only fills it.
    let mut kvm_vm = EarlyKvmVm::start();
    for request in options.command_line {
        front
            .configure(request)
            .map_err(|e| RunError::CommandLine(e.to_string()))?;
    }
    if let Some(metadata) = options.metadata {
        front
            .update_mmds(metadata, false)
            .map_err(|e| RunError::CommandLine(format!("--metadata: {e}")))?;
    }
    // A configuration file boots at once: requests that configure are refused from the start.
    let file_config = match options.config {
        Some(config) => {
            let config = apply_config_file(&front, config)
                .and_then(|()| lock(&front.resources).vm_config(options.api_socket.as_deref()))
                .map_err(|e| RunError::ConfigFile(e.to_string()))?;
            lock(&front.requests).take();
            Some(config)
        }
        None => None,
    };
    let server = match &options.api_socket {
        Some(path) => {
            let server = ApiServer::start(path, front.clone())?;
            if file_config.is_none() {
                log::info!(
                    "waiting for the VM's configuration and InstanceStart, or a snapshot to \
                     load, on {}",
                    path.display()
                );
            }
            Some(server)
        }
        None => None,
    };
    // Once the socket takes connections (compiling and installing the filters took the CPU
    // from the process's start on a host with few CPUs): the API server's thread locks down
    // before it answers anything; without one, a thread of its own.
    if server.is_none() {
        crate::seccomp::lock_down_early();
    }
    if let Some(config) = file_config {
        super::check_guest(&config)?;
        let frames = super::frames_for(&config)?;
        drop(signals);
        flusher.start_once_configured(&front);
        let outcome = super::run_front(config, frames, None, front.clone(), kvm_vm);
        front.flush_metrics_at_exit();
        drop(server);
        return outcome;
    }
    loop {
        if let Some(signal) = signals.fd().take() {
            return Ok(RunOutcome::Stopped(StopCause::Signal(signal)));
        }
        flusher.start_once_configured(&front);
        let pending = match incoming.recv_timeout(SIGNAL_POLL) {
            Ok(pending) => pending,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(RunError::Snapshot(SnapshotError::State(
                    "the API stopped taking requests".into(),
                )))
            }
        };
        let (config, frames, resumption) = match pending.request {
            MainThreadCall::Start(config) => {
                match super::check_guest(&config).and_then(|()| super::frames_for(&config)) {
                    Ok(frames) => (*config, frames, None),
                    Err(e) => {
                        // Open again before the answer: the client's next request may follow
                        // it at once.
                        front.reopen(requests.clone());
                        let _ = pending
                            .answer
                            .send(Err(ControlError::InvalidArgument(e.to_string())));
                        continue;
                    }
                }
            }
            MainThreadCall::Load(params) => {
                let prepared = prepare(&params, options.api_socket.clone(), Instant::now());
                match prepared {
                    Ok((config, frames, resumption)) => (config, frames, Some(resumption)),
                    Err(e) => {
                        front.reopen(requests.clone());
                        let _ = pending.answer.send(Err(e.into()));
                        continue;
                    }
                }
            }
        };
        *lock(&front.pending) = Some(pending.answer.clone());
        drop(signals);
        flusher.start_once_configured(&front);
        let outcome = super::run_front(config, frames, resumption, front.clone(), kvm_vm.take());
        if let Err(e) = &outcome {
            // Unless the VM started and the request was answered already.
            let _ = pending
                .answer
                .send(Err(ControlError::InvalidArgument(e.to_string())));
        }
        front.flush_metrics_at_exit();
        drop(server);
        return outcome;
    }
}

/// The thread that writes the metrics at their interval (Firecracker's minute,
/// [`super::metrics_file::FLUSH_INTERVAL`], unless
/// `flush_interval_ms` says otherwise): started by
/// the main thread once `PUT /metrics` or the configuration file configured them (before the
/// VM starts; they cannot be configured later), so that a VMM without metrics has no such
/// thread and none competes with the API thread's start for the CPU.
#[derive(Default)]
struct MetricsFlusher {
    started: bool,
}

impl MetricsFlusher {
    fn start_once_configured(&mut self, front: &Arc<ApiFront>) {
        let interval = lock(&front.metrics).as_ref().map(MetricsSink::interval);
        if let (false, Some(interval)) = (self.started, interval) {
            self.started = true;
            spawn_metrics_flusher(Arc::downgrade(front), interval);
        }
    }
}

/// Writes the metrics every `interval` for as long as the front lives.
fn spawn_metrics_flusher(front: Weak<ApiFront>, interval: Duration) {
    let spawned = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || loop {
            std::thread::sleep(interval);
            let Some(front) = front.upgrade() else {
                return;
            };
            if let Err(e) = front.flush_metrics() {
                log::warn!("{e}");
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start writing the metrics at their interval: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_front() -> (ApiFront, mpsc::Receiver<Pending>) {
        let options = ServeOptions {
            api_socket: None,
            id: "test".into(),
            config: None,
            logger: None,
            command_line: Vec::new(),
            metadata: None,
        };
        let (requests, incoming) = mpsc::channel();
        (ApiFront::new(&options, requests), incoming)
    }

    fn load() -> MainThreadCall {
        let params = r#"{"snapshot_path": "/snap", "mem_file_path": "/mem"}"#;
        MainThreadCall::Load(serde_json::from_str(params).unwrap())
    }

    /// A load that takes longer than a minute (ten parallel loads on a loaded host did) is
    /// answered when it is done, with its outcome, not with a failure while it goes on.
    #[test]
    fn a_start_is_answered_when_it_is_done_however_long_it_takes() {
        let (front, incoming) = api_front();
        let main = std::thread::spawn(move || {
            let pending = incoming.recv().unwrap();
            std::thread::sleep(Duration::from_secs(61));
            pending.answer.send(Ok(())).unwrap();
        });
        assert_eq!(front.submit(load()), Ok(()));
        main.join().unwrap();
        // A request the main thread drops unanswered did not start.
        let (front, incoming) = api_front();
        let main = std::thread::spawn(move || drop(incoming.recv().unwrap()));
        let answer = front.submit(load());
        assert!(
            matches!(answer, Err(ControlError::Internal(_))),
            "{answer:?}"
        );
        main.join().unwrap();
    }
}
