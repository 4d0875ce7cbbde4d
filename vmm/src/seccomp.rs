//! Seccomp: the system calls each kind of VMM thread may make, enforced by the kernel.
//!
//! ```text
//! lock_down()      the process filter (`vmm`) on every thread at once (TSYNC); threads
//!                  started later inherit it. A VM's process starts it on a thread of its own
//!                  (the setup, opening files, KVM, sockets and memory, needs only calls it
//!                  allows): `vmm run` at once (lock_down_early), a VMM of Firecracker's kind
//!                  on its API server's thread once the socket takes connections, and its API
//!                  answers nothing before; the guest's first run waits for it
//!                  (Session::start_guest)
//! enter(kind)      each vCPU before its first KVM_RUN (`vcpu`), the API server once locked
//!                  down, before it answers anything (`api`, inherited by the request
//!                  threads), a guest memory's fault handler thread when it next wakes
//!                  (`fault`, through [`confine_fault_handler`]), the event loop that runs
//!                  the devices as it starts where the process is locked down, else before
//!                  the guest's start (`devices`): a narrower filter stacked on the process
//!                  filter
//! ```
//!
//! A denied call traps (SIGSYS): the VMM writes which thread made which call to stderr, counts
//! it (`seccomp.num_faults`) and exits at once with status [`BAD_SYSCALL_EXIT_STATUS`], as
//! Firecracker does. `--no-seccomp` turns the filters off; `--seccomp-filter FILE` replaces
//! them with filters in seccompiler's JSON format (Firecracker's, keys `vmm`, `vcpu`, `api`;
//! and `fault`, `devices`).
//!
//! The policy is off until the front end sets it ([`set_policy`]): library users and unit
//! tests run without filters.

mod filters;
mod search;
mod sigsys;

use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use seccompiler::{BpfProgram, TargetArch};
use thiserror::Error;

pub use sigsys::BAD_SYSCALL_EXIT_STATUS;

/// Errors of building and installing the filters.
#[derive(Debug, Error)]
pub enum SeccompError {
    /// Building a filter failed (a bug in the built-in rules).
    #[error("cannot build the seccomp filter of the {kind} threads: {source}")]
    Build {
        /// The thread kind.
        kind: &'static str,
        /// seccompiler's error.
        #[source]
        source: seccompiler::BackendError,
    },
    /// A custom filter file could not be read or compiled.
    #[error("cannot use seccomp filter file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The kernel refused a filter.
    #[error(
        "cannot install the seccomp filter of the {kind} threads: {source} (--no-seccomp runs \
         without filters)"
    )]
    Install {
        /// The thread kind.
        kind: &'static str,
        /// seccompiler's error.
        #[source]
        source: seccompiler::Error,
    },
    /// The SIGSYS handler could not be installed.
    #[error("cannot install the SIGSYS handler: {0}")]
    Handler(#[source] std::io::Error),
}

/// The kinds of threads with a filter of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// Every thread of the process (the filter the others stack on).
    Vmm,
    /// A vCPU thread.
    Vcpu,
    /// The API server and the threads that answer its requests.
    Api,
    /// A guest memory's fault handler thread (populating chunks through userfaultfd).
    Fault,
    /// The event loop: the devices' queues and host sides, console input, stop signals.
    Devices,
}

impl ThreadKind {
    /// Every kind.
    pub const ALL: [ThreadKind; 5] = [
        ThreadKind::Vmm,
        ThreadKind::Vcpu,
        ThreadKind::Api,
        ThreadKind::Fault,
        ThreadKind::Devices,
    ];

    /// The kind's name, as Firecracker's filter files name it.
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Vmm => "vmm",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::Api => "api",
            ThreadKind::Fault => "fault",
            ThreadKind::Devices => "devices",
        }
    }
}

/// Which filters the VMM installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// None (`--no-seccomp`, and every user of the library that sets no policy).
    Off,
    /// The built-in filters.
    BuiltIn,
    /// The filters of this file (seccompiler's JSON format).
    File(PathBuf),
}

/// The filters in force, per thread kind; `None` where a kind has none.
#[derive(Debug)]
struct Filters {
    /// Installed on every thread, in order.
    vmm: Vec<BpfProgram>,
    vcpu: Option<BpfProgram>,
    api: Option<BpfProgram>,
    fault: Option<BpfProgram>,
    devices: Option<BpfProgram>,
}

/// The policy's filters: a file's, read by [`set_policy`]; the built-in ones, compiled where
/// first needed (the lock-down's own thread, off the start's path).
static FILTERS: OnceLock<Option<Filters>> = OnceLock::new();
/// Whether [`set_policy`] chose filters (built-in or a file's).
static FILTERED: OnceLock<bool> = OnceLock::new();
static LOCKED_DOWN: OnceLock<Result<(), String>> = OnceLock::new();

thread_local! {
    /// Whether the calling thread has stacked its kind's filter.
    static ENTERED: Cell<bool> = const { Cell::new(false) };
}

/// Sets the policy and reads a filter file's filters (the built-in ones are compiled where
/// first needed, by the lock-down); call once, before the VM is set up, so that a bad filter
/// file is refused before anything starts. Later calls change nothing.
pub fn set_policy(policy: &Policy) -> Result<(), SeccompError> {
    // The built-in filters are compiled when first needed, off the process's start.
    if let Policy::File(path) = policy {
        let _ = FILTERS.set(Some(read_file(path)?));
    }
    let filtered = *policy != Policy::Off;
    if filtered {
        fix_malloc_arenas();
    }
    let _ = FILTERED.set(filtered);
    Ok(())
}

/// The built-in filters of every kind.
fn built_in_filters() -> Result<Filters, SeccompError> {
    Ok(Filters {
        vmm: built_in_programs(ThreadKind::Vmm)?,
        vcpu: Some(built_in(ThreadKind::Vcpu)?),
        api: Some(built_in(ThreadKind::Api)?),
        fault: Some(built_in(ThreadKind::Fault)?),
        devices: Some(built_in(ThreadKind::Devices)?),
    })
}

/// Gives glibc's malloc its arena limit now, as it would compute it (8 per CPU): left unset,
/// the first thread to need a new arena opens /sys/devices/system/cpu/online to compute it,
/// which a filtered thread may not (a console thread started by a vCPU was stopped so).
fn fix_malloc_arenas() {
    // glibc's count: the CPUs online (std's available_parallelism reads cgroup files besides).
    // SAFETY: sysconf only reads a system value.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
    let arenas = libc::c_int::try_from(8 * cpus).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only sets a tunable of glibc's allocator.
    if unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) } == 0 {
        log::warn!("seccomp: cannot set malloc's arena limit; a thread may be stopped later");
    }
}

/// Installs the built-in filters of `kind` on the calling thread only (for the process: its
/// filter and the `clone3` companion), as [`lock_down`] and [`enter`] would: for a thread a
/// library user starts, or a benchmark of the filters' cost. Installs no SIGSYS handler.
pub fn install_built_in(kind: ThreadKind) -> Result<(), SeccompError> {
    built_in_programs(kind)?.iter().try_for_each(|program| {
        seccompiler::apply_filter(program).map_err(|source| SeccompError::Install {
            kind: kind.name(),
            source,
        })
    })
}

/// The built-in filters of `kind`, in the order they are installed: its own, and for the
/// process the `clone3` companion.
fn built_in_programs(kind: ThreadKind) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut programs = vec![built_in(kind)?];
    if kind == ThreadKind::Vmm {
        let companion = filters::clone3_enosys().map_err(|source| SeccompError::Build {
            kind: "vmm",
            source,
        })?;
        programs.push(companion);
    }
    Ok(programs)
}

/// The built-in filter of `kind` (for the process, without its `clone3` companion).
fn built_in(kind: ThreadKind) -> Result<BpfProgram, SeccompError> {
    filters::program(kind).map_err(|source| SeccompError::Build {
        kind: kind.name(),
        source,
    })
}

fn read_file(path: &Path) -> Result<Filters, SeccompError> {
    let error = |reason: String| SeccompError::File {
        path: path.to_owned(),
        reason,
    };
    let file =
        crate::host_file::open_input("seccomp filter", path).map_err(|e| error(e.to_string()))?;
    let mut map: HashMap<String, BpfProgram> =
        seccompiler::compile_from_json(file, TargetArch::x86_64)
            .map_err(|e| error(e.to_string()))?;
    let known = ["vmm", "vcpu", "api", "fault", "devices"];
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(error(format!(
            "unknown thread kind \"{unknown}\" (known: {})",
            known.join(", ")
        )));
    }
    // An empty program (a kind without rules) installs nothing.
    let mut take = |kind: &str| map.remove(kind).filter(|p| !p.is_empty());
    Ok(Filters {
        vmm: take("vmm").into_iter().collect(),
        vcpu: take("vcpu"),
        api: take("api"),
        fault: take("fault"),
        devices: take("devices"),
    })
}

/// Whether the policy has filters (without compiling the built-in ones).
fn filtered() -> bool {
    FILTERED.get().copied().unwrap_or(false)
}

/// The policy's filters, the built-in ones compiled by the first caller; None without
/// filters, or (logged) where a built-in filter does not compile, a bug the unit tests catch.
fn filters() -> Option<&'static Filters> {
    if !filtered() {
        return None;
    }
    FILTERS
        .get_or_init(|| {
            built_in_filters()
                .inspect_err(|e| log::error!("seccomp: {e}"))
                .ok()
        })
        .as_ref()
}

/// Starts [`lock_down`] on a thread of its own, for a process that is about to set up a VM:
/// the kernel's work on the process filter (about 0.1 ms) overlaps the setup, which needs no call
/// the filter denies, and the guest's start waits for it. Without filters it does nothing.
pub fn lock_down_early() {
    if !filtered() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("seccomp".into())
        .spawn(|| {
            let _ = lock_down();
        });
    if let Err(e) = spawned {
        log::debug!("seccomp: no thread to lock down early ({e}); the guest's start will");
    }
}

/// Installs the process filter on every thread, and the SIGSYS handler: from now on the guest
/// may run. Only the first call installs (a call meanwhile waits for it); every call returns
/// its outcome.
pub fn lock_down() -> Result<(), String> {
    LOCKED_DOWN
        .get_or_init(|| {
            if !filtered() {
                return Ok(());
            }
            let Some(filters) = filters() else {
                return Err("the built-in seccomp filters do not compile".into());
            };
            let started = std::time::Instant::now();
            sigsys::install_handler().map_err(|e| e.to_string())?;
            for program in &filters.vmm {
                seccompiler::apply_filter_all_threads(program).map_err(|source| {
                    SeccompError::Install {
                        kind: "vmm",
                        source,
                    }
                    .to_string()
                })?;
            }
            log::info!("seccomp filters installed in {:?}", started.elapsed());
            Ok(())
        })
        .clone()
}

/// Stacks the fault handlers' filter on the calling thread once the process is locked down
/// (guest-mem's [`guest_mem::MemoryConfig::confine_handler`]): after that a thread that reads
/// faults can make none of the VM's ioctls, open nothing and create nothing. A failure is
/// logged; the process filter holds.
pub fn confine_fault_handler() {
    if let Err(e) = enter(ThreadKind::Fault) {
        log::error!("guest memory fault handler: {e}");
    }
}

/// Confines the API server's thread (its `VmmControl::confine_api_thread`): the process
/// filter (a no-op without filters; failing, the guest cannot start), then the API's own, which
/// the request threads started from that thread inherit (the process's filter holds if this
/// fails). Failures are logged.
pub fn confine_api_thread() {
    if let Err(e) = lock_down() {
        log::error!("API server: {e}");
    }
    if let Err(e) = enter(ThreadKind::Api) {
        log::error!("API server: {e}");
    }
}

/// Stacks `kind`'s filter on the calling thread once the process is locked down (see
/// [`lock_down`]); does nothing before that, after the thread did it already, or without a
/// filter for `kind`.
pub fn enter(kind: ThreadKind) -> Result<(), SeccompError> {
    if ENTERED.get() || !matches!(LOCKED_DOWN.get(), Some(Ok(()))) {
        return Ok(());
    }
    ENTERED.set(true);
    sigsys::note_thread_name();
    let program = filters().and_then(|f| match kind {
        ThreadKind::Vmm => None,
        ThreadKind::Vcpu => f.vcpu.as_ref(),
        ThreadKind::Api => f.api.as_ref(),
        ThreadKind::Fault => f.fault.as_ref(),
        ThreadKind::Devices => f.devices.as_ref(),
    });
    match program {
        Some(program) => {
            seccompiler::apply_filter(program).map_err(|source| SeccompError::Install {
                kind: kind.name(),
                source,
            })
        }
        None => Ok(()),
    }
}
