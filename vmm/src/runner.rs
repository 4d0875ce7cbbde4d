//! `vmm run`'s engine: builds the frame pool and guest memory, the VM and its devices, boots the
//! built-in test guest or a Linux kernel, serves the control API and runs the guest to its end.
//!
//! ```text
//! main thread    block SIGINT/SIGTERM -> pool -> guest memory -> devices -> event thread
//!                -> API server -> VM (test guest or Linux) -> wait for the vCPUs -> outcome
//! event thread   SIGINT/SIGTERM (signalfd): stop the VM; guest memory fault errors: report
//!                and stop; virtio queue notifications; the balloon's statistics timer;
//!                console input (Linux)
//! vCPU threads   run the guest; registered with guest-mem by thread id, so that each vCPU's
//!                lazy faults allocate with its own LLFree core (its own reservation)
//! ```
//!
//! The vCPUs start paused: their thread ids are registered, the run control is handed to the
//! API and the signal handling, and only then does the guest run.
//!
//! Outcomes ([`RunOutcome`], [`RunError`]): a guest that finished its work and a
//! Linux guest that reset or powered off are successes; a stop asked for by the owner (API
//! shutdown, SIGINT, SIGTERM) is [`RunOutcome::Stopped`] with its [`StopCause`]. A test guest
//! whose verification or protocol failed, or that crashed, is a guest failure. A fault the pool
//! cannot serve ends the run with an error.
//!
//! Workload checkpoints (`--workload ...,checkpoint:ID`) pause the VM when an API socket is
//! served, so that the VM can be inspected and then resumed (`vmm resume`); without an API
//! the guest goes on.

mod console;
mod events;
mod front;
mod linux;
mod metrics_file;
mod progress;
mod reclaim;
mod restore;
mod session;
mod session_api;
mod signals;
mod test_guest;

pub use crate::build::devices::{DeviceError, VirtioMmioDevices};
pub use crate::build::memory::{ZoneSetupError, SPARE_CORES};

use std::path::PathBuf;
use std::sync::Arc;

use guest_mem::{FaultError, MemoryError, Pool, PoolError, Populate, Population};

use crate::boot::BootError;
use crate::build::early_vm::EarlyKvmVm;
use crate::build::memory::Frames;
use crate::config::{GuestConfig, LinuxConfig, VmConfig};
use crate::testguest::{self, TestGuestError, Workload};
use crate::vm::VmError;
use restore::Resumption;
use session::Session;
use vmm_api::{ApiServer, ServerError};
use vmm_devices::serial::SerialOutput;

pub use console::{line_prefix, name_lines, say};
pub use front::{serve, ServeOptions};
pub use restore::{load, SnapshotError};

/// How a VM run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// The guest finished its work (test guest: every step passed; Linux: halted).
    Success,
    /// The guest reset the VM (Linux: `reboot`, a panic with panic=N, a triple fault).
    GuestReset(ResetCause),
    /// The guest reported a failure, described here.
    GuestFailure(String),
    /// Its owner stopped the VM before the guest finished.
    Stopped(StopCause),
}

/// How a guest reset its VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetCause {
    /// Through the i8042's CPU reset (Linux's reboot=k, the default, and so panic=N).
    Keyboard,
    /// A vCPU triple-faulted (Linux's reboot=t, or a crash).
    TripleFault {
        /// The vCPU.
        vcpu: usize,
    },
}

impl std::fmt::Display for ResetCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResetCause::Keyboard => f.write_str("through the i8042 keyboard controller"),
            ResetCause::TripleFault { vcpu } => write!(f, "by a triple fault of vCPU {vcpu}"),
        }
    }
}

/// Who stopped a VM before its guest finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// A signal (SIGINT or SIGTERM), by its number.
    Signal(i32),
    /// An API client (`PUT /actions {"action_type":"Shutdown"}`).
    Api,
}

impl std::fmt::Display for StopCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopCause::Signal(libc::SIGINT) => f.write_str("SIGINT"),
            StopCause::Signal(libc::SIGTERM) => f.write_str("SIGTERM"),
            StopCause::Signal(signal) => write!(f, "signal {signal}"),
            StopCause::Api => f.write_str("an API shutdown request"),
        }
    }
}

/// The thread whose fault on guest memory could not be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultingThread {
    /// A vCPU, by index.
    Vcpu(usize),
    /// A kernel worker resolving a guest fault for a vCPU (KVM's asynchronous page faults,
    /// which serve most faults of a guest running with interrupts on), or a VMM thread.
    Worker,
}

impl std::fmt::Display for FaultingThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultingThread::Vcpu(vcpu) => write!(f, "vCPU {vcpu}"),
            FaultingThread::Worker => {
                f.write_str("a kernel worker resolving a guest fault (KVM's async page faults)")
            }
        }
    }
}

/// Why a VM could not be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// SIGINT and SIGTERM could not be routed to the event loop.
    #[error("cannot handle SIGINT and SIGTERM: {0}")]
    Signals(#[source] std::io::Error),
    /// The frame pool could not be created.
    #[error("cannot create the frame pool: {0}")]
    Pool(#[from] PoolError),
    /// The zone could not be opened, or the VM not attached to it.
    #[error("cannot attach the VM to its zone: {0}")]
    Zone(#[from] ZoneSetupError),
    /// Guest memory could not be created or populated.
    #[error("cannot create guest memory: {0}")]
    Memory(#[from] MemoryError),
    /// A device could not be created or wired.
    #[error("cannot set up the devices: {0}")]
    Devices(#[from] DeviceError),
    /// The event loop could not be started.
    #[error("cannot start the event loop: {0}")]
    EventLoop(#[source] std::io::Error),
    /// The API server could not be started.
    #[error(transparent)]
    Api(#[from] ServerError),
    /// The VM could not be created or started.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The test guest could not be set up.
    #[error(transparent)]
    TestGuest(#[from] TestGuestError),
    /// The kernel, initrd or command line could not be loaded.
    #[error("cannot boot {}: {source}", .kernel.display())]
    Boot {
        /// The kernel.
        kernel: PathBuf,
        /// What went wrong.
        source: BootError,
    },
    /// Setting up the vCPUs (CPUID, MSRs, LAPIC, registers) failed.
    #[error("cannot set up the vCPUs: {0}")]
    VcpuSetup(String),
    /// The guest touched memory that could not be given a frame; the VM was stopped.
    #[error("{thread}: {error} ({pool}); the VM was stopped")]
    GuestMemory {
        /// Whose fault it was.
        thread: FaultingThread,
        /// What went wrong.
        error: FaultError,
        /// The pool's state, e.g. "pool of 64 MiB, 0 bytes free, 2 MiB frames".
        pool: String,
    },
    /// A fault waited for memory longer than `--wait-for-memory=` allows; the VM was stopped.
    #[error(
        "{thread}: waited {waited_s:.1} s for guest memory, longer than --wait-for-memory allows \
         ({pool}); the VM was stopped"
    )]
    MemoryWaitExpired {
        /// Whose fault it was.
        thread: FaultingThread,
        /// How long it waited, in seconds.
        waited_s: f64,
        /// The pool's state, as for [`RunError::GuestMemory`].
        pool: String,
    },
    /// The pool had no frame left to load the guest into.
    #[error("cannot load {loading}: the guest memory pool is exhausted ({pool})")]
    PoolExhaustedAtStart {
        /// What was being loaded.
        loading: String,
        /// The pool's state, as for [`RunError::GuestMemory`].
        pool: String,
    },
    /// A vCPU failed (a KVM error, a failed entry, an emulation failure).
    #[error("{0}")]
    VcpuFailed(String),
    /// A snapshot could not be loaded.
    #[error("cannot load the snapshot: {0}")]
    Snapshot(#[source] SnapshotError),
    /// The configuration file (`--config-file`) was refused.
    #[error("--config-file: {0}")]
    ConfigFile(String),
    /// A pre-boot setting of the command line (`--log-path`, `--metrics-path`, ...) was refused.
    #[error("{0}")]
    CommandLine(String),
}

/// Boots and runs the VM `config` describes, until the guest ends or is shut down, on a pool of
/// its own; the guest's console is the VMM's stdout (and, for Linux, stdin).
///
/// SIGINT and SIGTERM are blocked on the calling thread (and so in every thread it starts) and
/// handled by the event loop until this returns; call it before starting other threads that
/// leave them unblocked.
pub fn run(config: VmConfig) -> Result<RunOutcome, RunError> {
    // Before the pool exists: a refused VM leaves no pool file behind.
    check_guest(&config)?;
    // The KVM VM is made while the pool and guest memory are.
    let kvm_vm = EarlyKvmVm::start();
    let frames = frames_for(&config)?;
    run_checked(config, frames, console::serial_output(), None, None, kvm_vm)
}

/// The frames of a VM to boot: its zone's, or a new pool.
fn frames_for(config: &VmConfig) -> Result<Frames, RunError> {
    Ok(match &config.zone {
        Some(target) => Frames::Zone(crate::build::memory::attach_zone(config, target)?),
        None => Frames::Pool(crate::build::memory::create_pool(config)?),
    })
}

/// [`run`] on `pool`, which other VMs of this process may share (it needs a core for each
/// vCPU and [`SPARE_CORES`] more per VM), with the guest's console output going to `console`.
pub fn run_on(
    config: VmConfig,
    pool: Arc<Pool>,
    console: SerialOutput,
) -> Result<RunOutcome, RunError> {
    check_guest(&config)?;
    run_checked(config, Frames::Pool(pool), console, None, None, None)
}

/// Runs the VM a snapshot describes (see [`snapshot::load`]) on `frames`, in `kvm_vm` if one
/// was made ahead of time.
fn run_resumed(
    config: VmConfig,
    frames: Frames,
    resumption: Resumption,
    kvm_vm: Option<EarlyKvmVm>,
) -> Result<RunOutcome, RunError> {
    run_checked(
        config,
        frames,
        console::serial_output(),
        Some(resumption),
        None,
        kvm_vm,
    )
}

/// Runs the VM a VMM without one was given (booted, or loaded when `resumption` is given) on
/// `frames`, in `kvm_vm` if one was made ahead of time; its API is `front`'s.
fn run_front(
    config: VmConfig,
    frames: Frames,
    resumption: Option<Resumption>,
    front: Arc<front::ApiFront>,
    kvm_vm: Option<EarlyKvmVm>,
) -> Result<RunOutcome, RunError> {
    let console = front.console_output();
    run_checked(config, frames, console, resumption, Some(front), kvm_vm)
}

/// What the configuration alone cannot tell: whether the test guest's page tables fit its RAM.
fn check_guest(config: &VmConfig) -> Result<(), RunError> {
    if let GuestConfig::TestGuest(_) = &config.guest {
        testguest::check_memory_size(config.memory_size)?;
    }
    Ok(())
}

/// [`run_on`] once the guest passed [`check_guest`]; a VM resumed from a snapshot gets the
/// states of `resumption`, an API served already (by a VMM that waited for its VM) gets the
/// run's session through `front`, and a KVM VM made ahead of time is used.
fn run_checked(
    config: VmConfig,
    frames: Frames,
    console: SerialOutput,
    resumption: Option<Resumption>,
    front: Option<Arc<front::ApiFront>>,
    kvm_vm: Option<EarlyKvmVm>,
) -> Result<RunOutcome, RunError> {
    let signals = signals::StopSignals::block().map_err(RunError::Signals)?;
    // Eager population can take seconds: its progress is shown, and a stop signal cancels it.
    // A lazy one maps nothing and is not watched (a thread less on the way to the guest's
    // start): a stop signal waits in the signalfd for the event loop.
    let population = Arc::new(Population::default());
    let watch = match config.populate {
        Populate::Eager => Some(
            signals
                .watch(population.clone(), config.memory_size)
                .map_err(RunError::Signals)?,
        ),
        Populate::Lazy | Populate::Mapped => None,
    };
    let created =
        crate::build::memory::create_memory(&config, frames, &population, resumption.is_none());
    if let Some(signal) = watch.and_then(signals::SignalWatch::finish) {
        return Ok(RunOutcome::Stopped(StopCause::Signal(signal)));
    }
    let guest_memory = Arc::new(created?);
    // A page-fault handler's link lives as long as the VM.
    let mut _handler = None;
    if let Some(resumption) = &resumption {
        _handler = resumption.fill_memory(&guest_memory)?;
        resumption.timing().mark("memory");
    }
    let devices = crate::build::devices::create_devices(&config, &guest_memory)?;
    if let Some(resumption) = &resumption {
        resumption.restore_devices(&devices)?;
        resumption.timing().mark("devices");
    }
    let session = Arc::new(Session::new(config, guest_memory, &devices));
    let mut devices = devices.mmio;
    let resumption = resumption.map(|resumption| {
        let (states, timing) = resumption.into_parts();
        session.on_start(Box::new(move || timing.log()));
        states
    });
    let guest = match &session.config().guest {
        GuestConfig::TestGuest(workload) => GuestToRun::Test(workload, console),
        GuestConfig::Linux(linux) => GuestToRun::Linux(
            Some(linux),
            console::Console::new(console).map_err(DeviceError::Serial)?,
        ),
        GuestConfig::RestoredLinux => GuestToRun::Linux(
            None,
            console::Console::new(console).map_err(DeviceError::Serial)?,
        ),
    };
    let mut event_loop = events::EventLoop::new(&session, &signals).map_err(RunError::EventLoop)?;
    event_loop.add_all(devices.take_subscribers());
    if let GuestToRun::Linux(_, console) = &guest {
        event_loop.add_all(console.input_subscriber().into_iter().collect());
    }
    let events = event_loop.start().map_err(RunError::EventLoop)?;
    let api = match (&front, &session.config().api_socket) {
        (Some(front), _) => {
            front.attach(session.clone());
            None
        }
        (None, Some(path)) => Some(ApiServer::start(path, session.clone())?),
        (None, None) => None,
    };
    let kvm_vm = kvm_vm.and_then(EarlyKvmVm::take);
    let outcome = match guest {
        GuestToRun::Test(workload, console) => {
            test_guest::run(&session, workload, devices, console, resumption, kvm_vm)
        }
        GuestToRun::Linux(linux, console) => {
            linux::run(&session, linux, devices, console, resumption, kvm_vm)
        }
    };
    session.finish();
    drop(api);
    drop(events);
    drop(signals);
    session.outcome(outcome)
}

/// What the VM runs, with what it needs beyond the common parts.
enum GuestToRun<'a> {
    /// The built-in test guest, its workload and where its console goes.
    Test(&'a Workload, SerialOutput),
    /// A Linux kernel (none when it is resumed from a snapshot) and the console on stdin and
    /// stdout.
    Linux(Option<&'a LinuxConfig>, console::Console),
}
