//! Snapshots in the runner: taking one of a paused VM ([`Session::create_snapshot`], the API's
//! `PUT /snapshot/create`), loading one into a fresh process ([`load`]: `vmm snapshot load`, or
//! `PUT /snapshot/load` on a VMM that waits for it, [`super::serve`]), and what a loaded VM
//! gets instead of a boot ([`Resumption`]).
//!
//! ```text
//! create   pause -> each vCPU thread reads its state -> VM and device states
//!          -> memory: the VM's zone (seal it: nothing copied) or a file (copy)
//!          -> snapshot file (synced, renamed into place)
//! load     snapshot file (checked) -> zone, VM and seal checked (or the memory file copied
//!          into a fresh pool) -> memory, devices with their states -> VM with the vCPU and
//!          VM states -> started paused, or resumed (the seal breaks)
//! ```

use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guest_mem::zone::ZoneError;
use guest_mem::{GuestMemory, Populate, Scrub};
use vm_memory::{Bytes, GuestAddress};

use super::progress::LoopProgress;
use super::session::Session;
use super::{RunError, RunOutcome};
use crate::arch::x86_64::state::{KvmVcpuState, KvmVmState, StateError};
use crate::build::devices::{DeviceError, Devices};
use crate::build::early_vm::EarlyKvmVm;
use crate::build::memory::{self, Frames, ZoneSetupError};
use crate::config::{BackingKind, GuestConfig, VmConfig, ZoneTarget};
use crate::host_file::{self, HostFileError};
use crate::snapshot::file::{self, SnapshotFileError};
use crate::snapshot::memory_file::{self, MemoryChecksum};
use crate::snapshot::{
    DeviceStates, InconsistentSnapshot, Machine, MemorySource, SavedGuest, SavedHotplug, VmSnapshot,
};
use crate::testguest::ReportSnapshot;
use crate::vm::run_control;
use copy_out::{copy_memory_out, MemoryCopy};
use vmm_api::model::{MemoryBackendType, SnapshotCreateParams, SnapshotLoadParams, SnapshotType};
use vmm_api::ControlError;
use vmm_devices::block::BlockHandle;
use vmm_devices::i8042::I8042Snapshot;
use vmm_devices::pmem::PmemHandle;
use vmm_devices::serial::SerialSnapshot;
use vmm_devices::vmgenid::VmGenIdSnapshot;

mod copy_out;
mod page_fault_handler;

/// Errors of taking or loading a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The VM is not paused, has not started or has stopped.
    #[error("{0}")]
    State(String),
    /// A vCPU could not read its state.
    #[error("cannot read the vCPUs' state: {0}")]
    Vcpus(#[source] run_control::RunControlError),
    /// KVM could not give the VM's state.
    #[error("cannot read the VM's state: {0}")]
    Vm(#[source] StateError),
    /// The request asks for something this VMM does not do.
    #[error("{0}")]
    Unsupported(String),
    /// The snapshot file could not be written or read, or is damaged.
    #[error(transparent)]
    File(#[from] SnapshotFileError),
    /// The snapshot's parts do not fit together.
    #[error("{}: {source}", .path.display())]
    Inconsistent {
        /// The snapshot file.
        path: PathBuf,
        /// What does not fit.
        source: InconsistentSnapshot,
    },
    /// The zone could not be opened or sealed.
    #[error("zone {}: {source}", .path.display())]
    Zone {
        /// The zone.
        path: PathBuf,
        /// What went wrong.
        source: ZoneError,
    },
    /// The VM could not be attached to its zone.
    #[error(transparent)]
    ZoneSetup(#[from] ZoneSetupError),
    /// The memory file is not the snapshot's.
    #[error("{}: {why}", .path.display())]
    WrongMemory {
        /// The memory file or zone given.
        path: PathBuf,
        /// What does not match.
        why: String,
    },
    /// A memory file path is empty, or names something that is not a regular file.
    #[error(transparent)]
    Path(#[from] HostFileError),
    /// The memory could not be handed to a page-fault handler (the Uffd backend).
    #[error(transparent)]
    Handler(#[from] page_fault_handler::PageFaultHandlerError),
    /// The memory file could not be written or read.
    #[error("memory file {}: {what}: {source}", .path.display())]
    MemoryFile {
        /// The file.
        path: PathBuf,
        /// What failed.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// What [`SnapshotError`] means to an API client: bad requests and refused states are theirs
/// (400), failures to read KVM or write files the VMM's (500).
impl From<SnapshotError> for ControlError {
    fn from(error: SnapshotError) -> Self {
        match error {
            SnapshotError::Vcpus(_)
            | SnapshotError::Vm(_)
            | SnapshotError::MemoryFile { .. }
            | SnapshotError::File(SnapshotFileError::Io { .. }) => {
                ControlError::Internal(error.to_string())
            }
            _ => ControlError::InvalidArgument(error.to_string()),
        }
    }
}

fn memory_file_error(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> SnapshotError {
    let path = path.to_owned();
    move |source| SnapshotError::MemoryFile { path, what, source }
}

/// The [`SnapshotError`] of a guest memory operation (`what`) on behalf of the memory file at
/// `path` that failed with `error`.
fn guest_memory_error<E: std::fmt::Display>(
    path: &Path,
    what: &'static str,
) -> impl FnOnce(E) -> SnapshotError {
    let path = path.to_owned();
    move |error| SnapshotError::MemoryFile {
        path,
        what,
        source: io::Error::other(error.to_string()),
    }
}

/// The first bytes of every file this VMM lays out: zones, pool files, snapshots.
const OWN_FILE_MAGIC: &[u8] = b"LLF";

/// Refuses to copy guest memory anywhere but into a new or regular file, and over a file that
/// holds a zone, a pool or a snapshot.
fn check_copy_target(path: &Path) -> Result<(), SnapshotError> {
    host_file::check_output("mem_file_path", path)?;
    let mut start = [0u8; 3];
    let holds_ours = host_file::open_input("mem_file_path", path)
        .is_ok_and(|mut file| file.read_exact(&mut start).is_ok())
        && start == OWN_FILE_MAGIC;
    if holds_ours {
        return Err(SnapshotError::WrongMemory {
            path: path.to_owned(),
            why: "holds a zone, pool or snapshot: guest memory is copied only into another file \
                  (or left in the VM's own zone by naming it)"
                .into(),
        });
    }
    Ok(())
}

/// Plugs the blocks of `saved` that `memory`'s hot-pluggable region does not have plugged.
fn plug_saved(memory: &GuestMemory, saved: &SavedHotplug) -> Result<(), SnapshotError> {
    let region = memory.hotplug_region().ok_or_else(|| {
        SnapshotError::State("the snapshot has hot-pluggable memory, the VM none".into())
    })?;
    let chunk = region.chunk_size().bytes();
    let mut core = memory.pool().core_frames(memory.vmm_core());
    // Chunk by chunk: a zone's frames bring back the chunks that held them.
    for block in saved.plugged_blocks(region.start().0) {
        for at in (block..block + saved.config.block_size).step_by(chunk as usize) {
            if matches!(memory.plugged_chunks(GuestAddress(at), chunk), Ok(0)) {
                memory
                    .plug(GuestAddress(at), chunk, &mut core)
                    .map_err(|e| SnapshotError::State(format!("cannot plug {at:#x}: {e}")))?;
            }
        }
    }
    Ok(())
}

/// Loads a memory file into fresh guest memory by mapping it, as Firecracker's File backend
/// does: RAM privately from the file, so that nothing is copied and every VM loaded from the
/// file shares its page cache until its guest writes a page (the file never changes);
/// hot-pluggable memory's plugged chunks (frames of the pool, which unplugging gives back) are
/// copied from the file. With `verify`, the memory is then checked against the snapshot's
/// checksum, which reads it all.
fn map_memory_file(
    memory: &GuestMemory,
    path: &Path,
    verify: Option<u32>,
) -> Result<(), SnapshotError> {
    let file = host_file::open_input("mem_file_path", path)?;
    let hotplug_at = memory
        .map_file(&file)
        .map_err(guest_memory_error(path, "cannot map the memory file"))?;
    if let Some(region) = memory.hotplug_region() {
        let chunk = region.chunk_size().bytes();
        let mut buffer = vec![0u8; chunk as usize];
        let (start, size) = (region.start().0, region.size());
        for at in (start..start + size).step_by(chunk as usize) {
            if !matches!(memory.plugged_chunks(GuestAddress(at), chunk), Ok(1)) {
                continue;
            }
            file.read_exact_at(&mut buffer, hotplug_at + at - start)
                .map_err(memory_file_error(path, "cannot read"))?;
            if buffer.iter().any(|&byte| byte != 0) {
                memory
                    .write_slice(&buffer, GuestAddress(at))
                    .map_err(guest_memory_error(path, "cannot fill guest memory"))?;
            }
        }
    }
    match verify {
        Some(expected) => verify_memory(memory, path, expected),
        None => Ok(()),
    }
}

/// Checks `memory`, just loaded from the memory file at `path`, against the snapshot's
/// checksum `expected` (every chunk read).
fn verify_memory(memory: &GuestMemory, path: &Path, expected: u32) -> Result<(), SnapshotError> {
    let mut checksum = MemoryChecksum::default();
    let total = memory.regions().iter().map(|r| r.size()).sum();
    let mut progress = LoopProgress::new(format!("verifying {}", path.display()), total);
    let mut done = 0;
    for region in memory.regions() {
        let chunk = region.chunk_size().bytes() as usize;
        let mut buffer = vec![0u8; chunk];
        let (start, size) = (region.start().0, region.size());
        for at in (start..start + size).step_by(chunk) {
            done += chunk as u64;
            progress.at(done);
            if !memory.holds_data(GuestAddress(at)) {
                checksum.add_zero_chunk(chunk);
                continue;
            }
            memory
                .read_slice(&mut buffer, GuestAddress(at))
                .map_err(guest_memory_error(path, "cannot read guest memory"))?;
            match buffer.iter().all(|&byte| byte == 0) {
                true => checksum.add_zero_chunk(chunk),
                false => checksum.add(&buffer),
            }
        }
    }
    if checksum.value() != expected {
        return Err(SnapshotError::WrongMemory {
            path: path.to_owned(),
            why: format!(
                "the memory's checksum is {:08x}, the snapshot's {expected:08x}: the file was \
                 changed or damaged since the snapshot was taken",
                checksum.value()
            ),
        });
    }
    Ok(())
}

impl Session {
    /// Snapshots the paused VM: its state into `snapshot_path`; its memory stays in its zone
    /// when `mem_file_path` is the zone (which is sealed), or is copied into `mem_file_path`.
    pub fn create_snapshot(&self, params: &SnapshotCreateParams) -> Result<(), SnapshotError> {
        let diff = params.snapshot_type == SnapshotType::Diff;
        if diff && !self.config().track_dirty_pages {
            // Firecracker's answer.
            return Err(SnapshotError::Unsupported(
                "Diff snapshots are not allowed on uVMs with dirty page tracking disabled.".into(),
            ));
        }
        let started = Instant::now();
        // Both paths are checked before any work: a request that cannot end well is refused
        // before guest memory is copied.
        host_file::check_output("snapshot_path", &params.snapshot_path)?;
        let into_zone = match (self.memory().zone_vm(), &self.config().zone) {
            (Some(_), Some(zone)) => host_file::same_file(&params.mem_file_path, &zone.path),
            _ => false,
        };
        if !into_zone {
            check_copy_target(&params.mem_file_path)?;
        }
        if let Some(base) = self.memory().zone_vm().and_then(|vm| vm.base()) {
            if into_zone {
                return Err(SnapshotError::Unsupported(format!(
                    "this VM is a clone of '{}' and maps its frames: it is snapshotted by \
                     copying its memory (mem_file_path: another file), not into the zone",
                    base.name()
                )));
            }
        }
        if params.snapshot_path == params.mem_file_path
            || host_file::same_file(&params.snapshot_path, &params.mem_file_path)
        {
            return Err(SnapshotError::WrongMemory {
                path: params.mem_file_path.clone(),
                why: "is snapshot_path too: the state and the memory need a file each".into(),
            });
        }
        // Until the snapshot is complete, nothing resumes the VM: its memory must be what the
        // vCPU states saved below belong to.
        let _taking = self.begin_snapshot().ok_or_else(|| {
            SnapshotError::State("another snapshot of this VM is being taken".into())
        })?;
        let (Some(control), Some(vm_fd)) = (self.control(), self.vm_fd()) else {
            return Err(SnapshotError::State("the VM has not started".into()));
        };
        let not_paused = || {
            SnapshotError::State(
                "the VM is not paused (PATCH /vm {\"state\":\"Paused\"} first)".into(),
            )
        };
        // A pause asked for (by a checkpoint) may still be under way.
        let vcpus = control
            .wait_parked()
            .and_then(|()| control.save_vcpus())
            .map_err(|e| match e {
                run_control::RunControlError::NotPaused => not_paused(),
                run_control::RunControlError::Stopped => {
                    SnapshotError::State("the VM has stopped".into())
                }
                e @ run_control::RunControlError::WaitsForMemory { .. } => {
                    SnapshotError::State(e.to_string())
                }
                e => SnapshotError::Vcpus(e),
            })?;
        let vcpus_done = Instant::now();
        let vm = KvmVmState::save(vm_fd).map_err(SnapshotError::Vm)?;
        let serial = self
            .serial()
            .ok_or_else(|| SnapshotError::State("the VM has no serial port yet".into()))?;
        let devices = DeviceStates {
            serial: serial.save_state(),
            keyboard: self.keyboard().map(|k| k.save_state()),
            vmgenid: self.vmgenid().map(|v| v.save_state()),
            report: self.report().map(|r| r.save_state()),
            virtio: self.transports().iter().map(|t| t.save_state()).collect(),
        };
        let devices_done = Instant::now();
        // What was dirtied since the last snapshot, now cleared: this snapshot is the next
        // diff's base, whatever its kind.
        let dirty = match self.config().track_dirty_pages {
            true => Some(self.take_dirty_pages(vm_fd)?),
            false => None,
        };
        let memory = match (self.memory().zone_vm(), &self.config().zone) {
            (Some(vm), Some(zone)) if into_zone => {
                let seal = vm.seal_memory().map_err(|source| SnapshotError::Zone {
                    path: zone.path.clone(),
                    source,
                })?;
                MemorySource::Zone {
                    zone_id: vm.zone().id(),
                    vm: vm.name().to_owned(),
                    vm_id: vm.id(),
                    seal,
                }
            }
            _ if self.config().pmem_size.is_some() => {
                return Err(SnapshotError::Unsupported(
                    "a VM with virtio-pmem is snapshotted into its zone (mem_file_path: the \
                     zone), not copied"
                        .into(),
                ))
            }
            _ => {
                let copy = match (&dirty, diff) {
                    (Some(dirty), true) => MemoryCopy::Diff(dirty),
                    _ => MemoryCopy::Full,
                };
                let full = matches!(copy, MemoryCopy::Full);
                copy_memory_out(
                    self.memory(),
                    self.config().memory_size,
                    &params.mem_file_path,
                    copy,
                )
                .inspect_err(|_| {
                    // What a failed copy wrote goes (a diff's file may hold its base: kept).
                    if full {
                        let _ = std::fs::remove_file(&params.mem_file_path);
                    }
                })?
            }
        };
        let memory_done = Instant::now();
        let kind = match memory {
            MemorySource::Zone { .. } => "sealed in its zone",
            MemorySource::File { .. } => "copied",
        };
        let snapshot = VmSnapshot {
            machine: self.machine(),
            memory,
            vcpus,
            vm,
            devices,
        };
        if let Err(e) = file::write(&params.snapshot_path, &snapshot) {
            // A memory file without its state is of no use: it goes too.
            if matches!(snapshot.memory, MemorySource::File { .. }) {
                let _ = std::fs::remove_file(&params.mem_file_path);
            }
            return Err(e.into());
        }
        let done = Instant::now();
        log::info!(
            "snapshot created in {:?}: vCPUs {:?}, VM and devices {:?}, memory {:?} ({kind}), \
             file {:?}",
            done - started,
            vcpus_done - started,
            devices_done - vcpus_done,
            memory_done - devices_done,
            done - memory_done
        );
        Ok(())
    }

    /// The configuration a snapshot keeps.
    fn machine(&self) -> Machine {
        let config = self.config();
        Machine {
            memory_size: config.memory_size,
            vcpus: config.vcpus,
            smt: config.smt,
            pmem_size: config.pmem_size,
            pmem_rate_limiter: self
                .pmem_handle()
                .map_or(config.pmem_rate_limiter, PmemHandle::rate_limiter),
            balloon: config.balloon,
            balloon_stats_interval_s: self
                .balloon_handle()
                .and_then(|b| b.stats_interval())
                .map_or(0, |i| u32::try_from(i.as_secs()).unwrap_or(u32::MAX)),
            wait_for_memory: config.wait_for_memory,
            memory_wait_limit_ms: config
                .memory_wait_limit
                .map(|limit| u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)),
            guest: match &config.guest {
                GuestConfig::TestGuest(workload) => SavedGuest::TestGuest(workload.clone()),
                GuestConfig::Linux(_) | GuestConfig::RestoredLinux => SavedGuest::Linux,
            },
            // The API may have given a drive another image or limiter since the start.
            drives: self.drives().iter().map(BlockHandle::config).collect(),
            entropy: config.entropy,
            network_interfaces: self.network_interfaces_now(),
            vsock: config.vsock.clone(),
            mmds: config.mmds.as_ref().map(|mmds| mmds.config.clone()),
            hotplug: self.hotplug_handle().map(|handle| SavedHotplug {
                config: handle.config(),
                plugged: handle.plugged_blocks(),
            }),
        }
    }
}

/// The states a loaded VM's vCPUs and devices get instead of a boot.
#[derive(Debug)]
pub(super) struct ResumedStates {
    /// Each vCPU's.
    pub vcpus: Vec<KvmVcpuState>,
    /// The VM's.
    pub vm: KvmVmState,
    /// The serial port's.
    pub serial: SerialSnapshot,
    /// The i8042's (Linux).
    pub keyboard: Option<I8042Snapshot>,
    /// The VM generation id's (Linux): where a new id goes.
    pub vmgenid: Option<VmGenIdSnapshot>,
    /// The report device's (test guest).
    pub report: Option<ReportSnapshot>,
    /// Stay paused once loaded.
    pub paused: bool,
}

/// When the phases of a load ended, for the log.
#[derive(Debug)]
pub(super) struct LoadTiming {
    started: Instant,
    marks: Mutex<Vec<(&'static str, Instant)>>,
}

impl LoadTiming {
    fn new(started: Instant) -> Self {
        LoadTiming {
            started,
            marks: Mutex::new(Vec::with_capacity(8)),
        }
    }

    /// Records that phase `what` ended now.
    pub fn mark(&self, what: &'static str) {
        self.marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((what, Instant::now()));
    }

    /// Logs the load's time and its phases.
    pub fn log(&self) {
        let now = Instant::now();
        let marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        let mut phases = Vec::with_capacity(marks.len());
        let mut last = self.started;
        for (what, at) in marks.iter() {
            phases.push(format!("{what} {:?}", *at - last));
            last = *at;
        }
        phases.push(format!("start {:?}", now - last));
        log::info!(
            "snapshot loaded in {:?}: {}",
            now - self.started,
            phases.join(", ")
        );
    }
}

/// Where a copy snapshot's memory comes from on its load.
#[derive(Debug)]
enum MemoryFill {
    /// Its memory file (mapped), and the checksum the memory must have where the load
    /// verifies it.
    File(PathBuf, Option<u32>),
    /// A page-fault handler listening on this socket, which serves it from the memory file
    /// (Firecracker's Uffd backend).
    Handler(PathBuf),
}

/// A loaded snapshot on its way into a VM.
#[derive(Debug)]
pub(super) struct Resumption {
    states: ResumedStates,
    virtio: Vec<vmm_devices::virtio::state::MmioSnapshot>,
    balloon_stats_interval_s: u32,
    /// Where fresh guest memory's contents come from (a snapshot that copied them).
    memory_file: Option<MemoryFill>,
    /// The hot-pluggable memory's plugged blocks.
    hotplug: Option<SavedHotplug>,
    /// When the load's phases ended.
    timing: Arc<LoadTiming>,
}

impl Resumption {
    /// Plugs the hot-pluggable blocks the snapshot says were plugged (a chunk with a frame of
    /// the zone is plugged already), then loads fresh guest memory from the memory file the
    /// snapshot copied it into, if it did (by mapping it), or hands it to the page-fault
    /// handler that serves it; the handler's link must live as long as the VM.
    pub fn fill_memory(
        &self,
        memory: &GuestMemory,
    ) -> Result<Option<page_fault_handler::HandlerLink>, RunError> {
        if let Some(hotplug) = &self.hotplug {
            plug_saved(memory, hotplug).map_err(RunError::Snapshot)?;
        }
        match &self.memory_file {
            Some(MemoryFill::File(path, verify)) => {
                map_memory_file(memory, path, *verify).map_err(RunError::Snapshot)?;
                Ok(None)
            }
            Some(MemoryFill::Handler(socket)) => page_fault_handler::hand_over(memory, socket)
                .map(Some)
                .map_err(|e| RunError::Snapshot(e.into())),
            None => Ok(None),
        }
    }

    /// Gives the virtio devices their states (before the session exists).
    pub fn restore_devices(&self, devices: &Devices) -> Result<(), RunError> {
        devices.mmio.restore_states(&self.virtio)?;
        if let Some(balloon) = &devices.balloon {
            let interval = Duration::from_secs(self.balloon_stats_interval_s.into());
            if balloon.stats_interval() != Some(interval).filter(|i| !i.is_zero()) {
                balloon
                    .update(None, Some(interval))
                    .map_err(|e| RunError::Devices(DeviceError::Restore(e.to_string())))?;
            }
        }
        Ok(())
    }

    /// The vCPU and device states and the timing.
    pub fn into_parts(self) -> (ResumedStates, Arc<LoadTiming>) {
        (self.states, self.timing)
    }

    /// The load's timing.
    pub fn timing(&self) -> &LoadTiming {
        &self.timing
    }
}

/// Reads the snapshot of `params` and prepares the VM it describes: its configuration (with
/// `api_socket`), its frames (the zone's, checked against the snapshot; or a fresh pool, filled
/// from a memory file later) and what it resumes with. Nothing is changed when this fails.
pub(super) fn prepare(
    params: &SnapshotLoadParams,
    api_socket: Option<PathBuf>,
    started: Instant,
) -> Result<(VmConfig, Frames, Resumption), SnapshotError> {
    let timing = Arc::new(LoadTiming::new(started));
    params
        .check_supported()
        .map_err(SnapshotError::Unsupported)?;
    let (backend, memory_path) = params
        .memory_backend()
        .map_err(SnapshotError::Unsupported)?;
    let memory_path = memory_path.to_owned();
    let snapshot = file::read(&params.snapshot_path)?;
    snapshot
        .check()
        .map_err(|source| SnapshotError::Inconsistent {
            path: params.snapshot_path.clone(),
            source,
        })?;
    timing.mark("file");
    let VmSnapshot {
        machine,
        memory,
        vcpus,
        mut vm,
        devices,
    } = snapshot;
    if params.clock_realtime {
        vm.advance_clock_by_real_time()
            .map_err(|e| SnapshotError::Unsupported(e.to_string()))?;
    }
    let mut config = VmConfig {
        memory_size: machine.memory_size,
        backing: BackingKind::Anonymous,
        zone: None,
        pmem_size: machine.pmem_size,
        pmem_rate_limiter: machine.pmem_rate_limiter,
        hotplug: machine.hotplug.as_ref().map(|h| h.config),
        format_pool: false,
        wait_for_memory: machine.wait_for_memory,
        memory_wait_limit: machine
            .memory_wait_limit_ms
            .map(std::time::Duration::from_millis),
        reclaim: crate::config::ReclaimSettings::default(),
        scrub: Scrub::PunchHole,
        populate: Populate::Lazy,
        track_dirty_pages: params.tracks_dirty_pages(),
        vcpus: machine.vcpus,
        smt: machine.smt,
        guest: match machine.guest {
            SavedGuest::TestGuest(workload) => GuestConfig::TestGuest(workload),
            SavedGuest::Linux => GuestConfig::RestoredLinux,
        },
        api_socket,
        balloon: machine.balloon,
        drives: machine.drives,
        entropy: machine.entropy,
        network_interfaces: machine.network_interfaces,
        vsock: machine.vsock,
        // The vCPUs' saved CPUID and MSRs have the template's changes.
        cpu_template: None,
        mmds: machine.mmds.map(|config| vmm_devices::mmds::Mmds {
            config,
            store: Default::default(),
        }),
    };
    match (&mut config.vsock, &params.vsock_override) {
        (Some(vsock), Some(socket)) => vsock.uds_path.clone_from(&socket.uds_path),
        (None, Some(_)) => {
            return Err(SnapshotError::Unsupported(
                "vsock_override: the snapshot's VM has no vsock device".into(),
            ))
        }
        _ => {}
    }
    if let Some(vsock) = &config.vsock {
        vsock
            .check()
            .map_err(|e| SnapshotError::Unsupported(e.to_string()))?;
    }
    for taps in &params.network_overrides {
        let interface = config
            .network_interfaces
            .iter_mut()
            .find(|net| net.id == taps.iface_id)
            .ok_or_else(|| {
                SnapshotError::Unsupported(format!(
                    "network_overrides: the snapshot's VM has no interface {}",
                    taps.iface_id
                ))
            })?;
        interface.host_dev_name.clone_from(&taps.host_dev_name);
    }
    crate::config::check_network_interfaces(&config.network_interfaces)
        .map_err(|e| SnapshotError::Unsupported(e.to_string()))?;
    // The images stay where they were: each must still be there, as the snapshot's VM saw it.
    crate::config::check_drives(&config.drives).map_err(|e| {
        SnapshotError::Unsupported(format!("the snapshot's drives cannot be opened: {e}"))
    })?;
    let wrong = |why: String| SnapshotError::WrongMemory {
        path: memory_path.clone(),
        why,
    };
    let (frames, copy_from) = match memory {
        MemorySource::Zone { .. } if backend == MemoryBackendType::Uffd => {
            return Err(SnapshotError::Unsupported(
                "mem_backend Uffd: this snapshot's memory is its VM's frames in a zone, which \
                 no page-fault handler serves: load it with File, naming the zone"
                    .into(),
            ));
        }
        MemorySource::File { .. } if backend == MemoryBackendType::Uffd => {
            if machine.hotplug.is_some() {
                return Err(SnapshotError::Unsupported(
                    "mem_backend Uffd: a VM with hot-pluggable memory (virtio-mem) loads with File"
                        .into(),
                ));
            }
            let pool = memory::create_pool(&config)
                .map_err(|e| SnapshotError::State(format!("cannot create the frame pool: {e}")))?;
            // The handler's copies populate RAM: no pool frame is ever mapped into it.
            config.populate = Populate::Lazy;
            (
                Frames::Pool(pool),
                Some(MemoryFill::Handler(memory_path.clone())),
            )
        }
        MemorySource::Zone {
            zone_id,
            vm,
            vm_id,
            seal,
        } => {
            if params.clone_name.is_some() && machine.hotplug.is_some() {
                return Err(SnapshotError::Unsupported(
                    "clone_name: a VM with hot-pluggable memory (virtio-mem) cannot base clones"
                        .into(),
                ));
            }
            if params.keep_clone && params.clone_name.is_none() {
                return Err(SnapshotError::Unsupported(
                    "keep_clone: needs clone_name, the name of the kept clone".into(),
                ));
            }
            let target = ZoneTarget {
                path: memory_path.clone(),
                vm: params.clone_name.clone().unwrap_or_else(|| vm.clone()),
                ephemeral: params.clone_name.is_some() && !params.keep_clone,
                accept_damaged: params.accept_damaged,
            };
            config.zone = Some(target.clone());
            // Opened once: its identity checked, then the snapshot's VM attached.
            let cores = match (&params.clone_name, params.keep_clone) {
                (Some(_), false) => memory::CLONE_CORES,
                _ => config.vcpus + memory::SPARE_CORES,
            };
            let zone = memory::open_zone(&target, cores)?;
            if zone.id() != zone_id {
                return Err(wrong(format!(
                    "the snapshot's memory is in zone {zone_id:032x}, this is zone {:032x}",
                    zone.id()
                )));
            }
            let attached = match &params.clone_name {
                Some(clone) => zone
                    .attach_clone(&vm, clone)
                    .map_err(ZoneSetupError::Zone)?,
                None => memory::attach_vm(&zone, &config, &target)?,
            };
            // A clone is checked against its base: the snapshot's VM.
            let (found_id, found_seal) = match attached.base() {
                Some(base) => (base.id(), base.seal()),
                None => (attached.id(), attached.seal()),
            };
            if found_id != vm_id {
                return Err(wrong(format!(
                    "VM '{vm}' of this zone is another VM than the snapshot's (it was deleted \
                     and created again since)"
                )));
            }
            if found_seal != seal {
                return Err(wrong(format!(
                    "the memory of VM '{vm}' changed since the snapshot was taken (the VM ran \
                     again, or a later snapshot was taken): this snapshot no longer matches it"
                )));
            }
            let attached = match params.keep_clone {
                // Its frames copied, the kept clone is a VM of the zone, attached as any.
                true => {
                    let copied = zone.copy_vm(attached).map_err(ZoneSetupError::Zone)?;
                    log::info!(
                        "zone {}: kept clone '{}' of '{vm}': {copied} frames copied",
                        target.path.display(),
                        target.vm
                    );
                    memory::attach_vm(&zone, &config, &target)?
                }
                false => attached,
            };
            (Frames::Zone(attached), None)
        }
        MemorySource::File {
            regions,
            identity,
            checksum,
        } => {
            let expected: u64 = regions.iter().map(|(_, size)| size).sum();
            let file = host_file::open_input("mem_file_path", &memory_path)?;
            let found = file
                .metadata()
                .map_err(memory_file_error(&memory_path, "cannot open"))?
                .len();
            if found != expected + memory_file::TRAILER_LEN {
                return Err(wrong(format!(
                    "a memory file of {found} bytes; the snapshot's has {} ({expected} of \
                     memory and a trailer of {})",
                    expected + memory_file::TRAILER_LEN,
                    memory_file::TRAILER_LEN
                )));
            }
            let found = memory_file::read_identity(&file, expected)
                .map_err(memory_file_error(&memory_path, "cannot read"))?;
            if found != Some(identity) {
                return Err(wrong(
                    "this memory file belongs to another snapshot (its identity differs from \
                     the snapshot's)"
                        .into(),
                ));
            }
            if let Some(clone) = &params.clone_name {
                log::debug!(
                    "clone '{clone}': a copy snapshot's loads are clones whatever their names"
                );
            }
            let pool = memory::create_pool(&config)
                .map_err(|e| SnapshotError::State(format!("cannot create the frame pool: {e}")))?;
            // The file's page cache populates RAM: no pool frame until the guest gives a
            // chunk back and touches it again.
            config.populate = Populate::Lazy;
            let verify = params.verify_memory.then_some(checksum);
            (
                Frames::Pool(pool),
                Some(MemoryFill::File(memory_path.clone(), verify)),
            )
        }
    };
    let resumption = Resumption {
        states: ResumedStates {
            vcpus,
            vm,
            serial: devices.serial,
            keyboard: devices.keyboard,
            vmgenid: devices.vmgenid,
            report: devices.report,
            paused: !params.resume_vm,
        },
        virtio: devices.virtio,
        balloon_stats_interval_s: machine.balloon_stats_interval_s,
        memory_file: copy_from,
        hotplug: machine.hotplug,
        timing,
    };
    resumption.timing.mark("zone");
    Ok((config, frames, resumption))
}

/// Loads the snapshot of `params` and runs the VM until it ends, as `vmm run` does (its API on
/// `api_socket`, if given; a VM loaded without `resume_vm` waits there to be resumed).
pub fn load(
    params: &SnapshotLoadParams,
    api_socket: Option<PathBuf>,
) -> Result<RunOutcome, RunError> {
    let started = Instant::now();
    let kvm_vm = EarlyKvmVm::start();
    let (config, frames, resumption) =
        prepare(params, api_socket, started).map_err(RunError::Snapshot)?;
    super::run_resumed(config, frames, resumption, kvm_vm)
}
