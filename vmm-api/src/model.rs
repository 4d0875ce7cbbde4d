//! The JSON bodies of the control API: what the VMM reports and what clients send.

use guest_mem::zone::Zone;
use guest_mem::{GuestMemory, Pool, Populate};
use serde::{Deserialize, Serialize};
use virtio_balloon::Violations;

use vmm_devices::pmem::PmemHandle;

mod cpu_template;
mod preboot;

pub use cpu_template::{CpuidLeafModifier, CpuidRegisterModifier, CustomCpuTemplate, MsrModifier};
pub use preboot::{
    Balloon, BootSource, CacheType, Drive, EntropyDevice, FullVmConfiguration, HugePages, IoEngine,
    LogLevel, Logger, MachineConfiguration, MachineConfigurationUpdate, MemoryHotplugConfig,
    MemoryHotplugSizeUpdate, MemoryHotplugStatus, Metrics, MmdsConfigRequest, NetworkInterface,
    PartialDrive, PartialNetworkInterface, PartialPmem, Pmem, SerialConfig, Vsock, ZoneAttachment,
    DEFAULT_MEM_SIZE_MIB, DEFAULT_VCPUS, MAX_METRICS_INTERVAL_MS, MIN_METRICS_INTERVAL_MS,
};

/// Run state of the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmState {
    /// The VM is being set up; its vCPUs have not run yet.
    NotStarted,
    /// The vCPUs run the guest.
    Running,
    /// The vCPUs are paused.
    Paused,
    /// The VM has stopped (or is stopping).
    Stopped,
}

/// When guest memory is populated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PopulateMode {
    /// All chunks before the guest starts.
    Eager,
    /// On first touch.
    Lazy,
    /// Frames mapped before the guest starts, pages filled at first touch.
    Mapped,
}

impl From<PopulateMode> for Populate {
    fn from(mode: PopulateMode) -> Self {
        match mode {
            PopulateMode::Eager => Populate::Eager,
            PopulateMode::Lazy => Populate::Lazy,
            PopulateMode::Mapped => Populate::Mapped,
        }
    }
}

impl From<Populate> for PopulateMode {
    fn from(populate: Populate) -> Self {
        match populate {
            Populate::Eager => PopulateMode::Eager,
            Populate::Lazy => PopulateMode::Lazy,
            Populate::Mapped => PopulateMode::Mapped,
        }
    }
}

/// `GET /machine`: the machine and its run state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// The VMM's version.
    pub vmm_version: String,
    /// Run state.
    pub state: VmState,
    /// Number of vCPUs.
    pub vcpu_count: usize,
    /// Guest RAM in MiB.
    pub mem_size_mib: u64,
    /// The backing as on the command line (`anon`, `hugetlb-2m`, `file:PATH`, ...), or
    /// `zone:PATH` for a VM in a persistent zone.
    pub backing: String,
    /// The VM's name in its zone (`vmm run --vm`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub zone_vm: Option<String>,
    /// Frame (and chunk) size of the pool, in KiB.
    pub frame_size_kib: u64,
    /// Eager, lazy or mapped-ahead population.
    pub populate: PopulateMode,
    /// `test-guest` or `linux`.
    pub guest: String,
    /// Whether a balloon device is configured.
    pub balloon: bool,
}

/// Guest memory counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestMemoryInfo {
    /// Chunk size in KiB (the pool's frame size).
    pub chunk_size_kib: u64,
    /// Chunks of all RAM regions.
    pub chunks: usize,
    /// Chunks backed by a pool frame now.
    pub populated_chunks: usize,
    /// Bytes backed by pool frames now.
    pub populated_bytes: u64,
    /// Chunks mapped privately from a copy snapshot's memory file (no pool frame: the file's
    /// page cache, shared with every VM loaded from it, until the guest writes), or, in a
    /// clone, from its base's frames in the zone (shared with the base and its other clones).
    pub file_backed_chunks: usize,
    /// The zone VM whose frames this VM maps, where it is a clone.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub clone_of: Option<String>,
    /// userfaultfd faults resolved with a new frame.
    pub faults: u64,
    /// Faults that found the pool exhausted.
    pub exhausted_faults: u64,
    /// vCPUs waiting for a frame now (`--wait-for-memory`).
    pub waiting_vcpus: usize,
    /// Faults of other threads waiting for a frame now: KVM's asynchronous page fault
    /// workers, which resolve most faults of a guest running with interrupts on.
    pub waiting_other_faults: usize,
    /// Chunks whose frame went back to the pool by a discard (balloon, free page reporting).
    pub discarded_chunks: u64,
    /// Chunks whose frame, recorded in a zone (a VM taken up again: restart, snapshot load),
    /// was mapped before anything touched it.
    pub mapped_ahead_chunks: u64,
    /// 4 KiB pages given away by the balloon and not reclaimed yet.
    pub given_away_4k_pages: u64,
    /// Where the time of resolving faults goes, in the VMM's fault handler threads.
    pub fault_latency: FaultLatencyInfo,
}

/// Latencies of populating chunks (see [`guest_mem::FaultLatency`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultLatencyInfo {
    /// From reading a fault's message to waking its thread (allocation, mapping, wake-up).
    pub handling: LatencyInfo,
    /// Mapping a frame over a chunk (`mmap`), for every population.
    pub map: LatencyInfo,
    /// Waking the faulting thread (`UFFDIO_WAKE`).
    pub wake: LatencyInfo,
}

/// Count, mean, median, 99th percentile and maximum of latencies, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyInfo {
    /// How many were recorded.
    pub count: u64,
    /// Their mean.
    pub mean_ns: u64,
    /// Their median.
    pub p50_ns: u64,
    /// Their 99th percentile.
    pub p99_ns: u64,
    /// The largest.
    pub max_ns: u64,
}

impl From<guest_mem::LatencySummary> for LatencyInfo {
    fn from(summary: guest_mem::LatencySummary) -> Self {
        Self {
            count: summary.count,
            mean_ns: summary.mean_ns,
            p50_ns: summary.p50_ns,
            p99_ns: summary.p99_ns,
            max_ns: summary.max_ns,
        }
    }
}

/// One vCPU's view of the pool: its LLFree core and its faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuMemoryInfo {
    /// vCPU index.
    pub vcpu: usize,
    /// The LLFree core its faults allocate with.
    pub core: usize,
    /// Faults it resolved.
    pub faults: u64,
    /// The tree its core's reservation slot holds, if any.
    pub reserved_tree: Option<usize>,
    /// How long it has waited for a frame of guest memory (its pool or zone exhausted), in
    /// milliseconds; absent when it does not wait. It waits for one chunk (`chunk_size_kib`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub waiting_ms: Option<u64>,
}

/// A per-core reservation of the pool's allocator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreReservation {
    /// The reservation slot: a core id modulo [`PoolInfo::reservation_slots`] (vCPUs of every
    /// guest, VMM and device cores map onto the slots).
    pub core: usize,
    /// The tree it has reserved.
    pub tree: usize,
}

/// One 64 MiB tree of the pool's allocator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeInfo {
    /// Tree index.
    pub index: usize,
    /// Free 4 KiB frames in it (16384 when the whole 64 MiB tree is free).
    pub free_4k_frames: usize,
    /// Whether a core has reserved it.
    pub reserved: bool,
}

/// The frame pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    /// The pool's frame size in KiB.
    pub frame_size_kib: u64,
    /// Bytes of frame memory.
    pub total_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Bytes allocated to guests.
    pub used_bytes: u64,
    /// Free memory in 4 KiB frames (the allocator's base unit).
    pub free_4k_frames: u64,
    /// Allocated memory in 4 KiB frames.
    pub used_4k_frames: u64,
    /// Entirely free, aligned 2 MiB frames.
    pub free_2m_frames: usize,
    /// Entirely free, aligned 1 GiB frames.
    pub free_1g_frames: usize,
    /// Reservation slots of the allocator: one per pool core, at most one per 64 MiB tree.
    /// The pool has a core per vCPU, one for the VMM (eager population, device accesses) and
    /// one for the balloon, so 2 vCPUs give 4 slots (fewer in a pool of fewer trees, where
    /// cores share slots: core id modulo this).
    pub reservation_slots: usize,
    /// The reserved tree of every slot that holds one.
    pub reservations: Vec<CoreReservation>,
    /// Every tree of the allocator.
    pub trees: Vec<TreeInfo>,
}

impl PoolInfo {
    /// Collects the counters and reservations of `pool`.
    pub fn collect(pool: &Pool) -> Self {
        let stats = pool.stats();
        PoolInfo {
            frame_size_kib: stats.frame_size.bytes() >> 10,
            total_bytes: stats.total_bytes,
            free_bytes: stats.free_bytes,
            used_bytes: stats.used_bytes,
            free_4k_frames: stats.free_bytes >> 12,
            used_4k_frames: stats.used_bytes >> 12,
            free_2m_frames: stats.free_huge,
            free_1g_frames: stats.free_giant,
            reservation_slots: pool.allocator().cores(),
            reservations: pool
                .allocator()
                .reservations()
                .enumerate()
                .filter_map(|(core, tree)| tree.map(|tree| CoreReservation { core, tree }))
                .collect(),
            trees: stats
                .trees
                .iter()
                .map(|t| TreeInfo {
                    index: t.index,
                    free_4k_frames: t.free_frames,
                    reserved: t.reserved,
                })
                .collect(),
        }
    }
}

/// `GET /memory`: guest memory, its vCPUs' cores and the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryInfo {
    /// Guest memory counters.
    pub guest: GuestMemoryInfo,
    /// Per vCPU: core and faults.
    pub vcpus: Vec<VcpuMemoryInfo>,
    /// The pool the guest's frames come from.
    pub pool: PoolInfo,
    /// The virtio-pmem device's memory, if the VM has one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pmem: Option<PmemInfo>,
    /// The persistent zone the VM lives in, with every VM's share of it (a VM in a zone only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub zone: Option<ZoneMemoryInfo>,
}

/// A zone's frames in `GET /memory`: what a sampler of an overcommit experiment reads, without
/// the consistency check of `vmm zone inspect`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneMemoryInfo {
    /// The zone's frame size in KiB.
    pub frame_size_kib: u64,
    /// Frames for VMs.
    pub frames: u64,
    /// Free frames.
    pub free_frames: u64,
    /// Every VM of the zone, by name.
    pub vms: Vec<ZoneVmMemoryInfo>,
}

/// One VM's share of its zone in `GET /memory`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneVmMemoryInfo {
    /// Its name.
    pub name: String,
    /// Its frames (chunks backed by one).
    pub frames: u64,
    /// 4 KiB pages its balloon gave back.
    pub given_away_4k_pages: u64,
    /// The process running it, if any.
    pub pid: Option<u32>,
    /// The bytes it waits for, as its VMM recorded (none when it does not wait).
    pub waiting_bytes: Option<u64>,
    /// The VM whose frames it maps, where it is a clone (its `frames` are its own).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub clone_of: Option<String>,
}

impl ZoneMemoryInfo {
    /// Reads the usage of `zone`.
    pub fn collect(zone: &Zone) -> Self {
        let usage = zone.usage();
        ZoneMemoryInfo {
            frame_size_kib: usage.frame_size.bytes() >> 10,
            frames: usage.frames,
            free_frames: usage.free_frames,
            vms: usage
                .vms
                .into_iter()
                .map(|vm| ZoneVmMemoryInfo {
                    name: vm.name,
                    frames: vm.frames,
                    given_away_4k_pages: vm.given_away_pieces,
                    pid: vm.owner,
                    waiting_bytes: vm.waiting.map(|(_, bytes)| bytes),
                    clone_of: vm.clone_of,
                })
                .collect(),
        }
    }
}

/// A virtio-pmem device's memory in `GET /memory`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmemInfo {
    /// Guest physical address of its first byte.
    pub guest_address: u64,
    /// Its size in MiB.
    pub size_mib: u64,
    /// Flush requests of the guest, each answered after the memory was written back.
    pub flushes: u64,
}

impl MemoryInfo {
    /// Collects the counters of `memory`, its pool and the VM's virtio-pmem device `pmem`.
    pub fn collect(memory: &GuestMemory, pmem: Option<&PmemHandle>) -> Self {
        let stats = memory.stats();
        let pool = PoolInfo::collect(memory.pool());
        let chunk_size = memory
            .regions()
            .first()
            .map_or(memory.pool().frame_size(), |r| r.chunk_size());
        MemoryInfo {
            guest: GuestMemoryInfo {
                chunk_size_kib: chunk_size.bytes() >> 10,
                chunks: stats.chunks,
                populated_chunks: stats.populated_chunks,
                populated_bytes: stats.populated_bytes,
                file_backed_chunks: stats.file_backed_chunks,
                clone_of: memory
                    .zone_vm()
                    .and_then(|vm| vm.base())
                    .map(|base| base.name().to_owned()),
                faults: stats.faults,
                exhausted_faults: stats.exhausted,
                waiting_vcpus: stats.waiting_vcpus,
                waiting_other_faults: stats.waiting_other_faults,
                discarded_chunks: stats.discarded_chunks,
                mapped_ahead_chunks: stats.mapped_ahead_chunks,
                given_away_4k_pages: stats.given_away_pieces,
                fault_latency: FaultLatencyInfo {
                    handling: stats.fault_latency.handling.into(),
                    map: stats.fault_latency.map.into(),
                    wake: stats.fault_latency.wake.into(),
                },
            },
            vcpus: stats
                .vcpu_faults
                .iter()
                .enumerate()
                .map(|(vcpu, faults)| {
                    let core = memory.vcpu_core(vcpu);
                    VcpuMemoryInfo {
                        vcpu,
                        core,
                        faults: *faults,
                        reserved_tree: pool
                            .reservations
                            .iter()
                            .find(|r| r.core == core % pool.reservation_slots.max(1))
                            .map(|r| r.tree),
                        waiting_ms: memory
                            .vcpu_waited(vcpu)
                            .map(|waited| u64::try_from(waited.as_millis()).unwrap_or(u64::MAX)),
                    }
                })
                .collect(),
            pool,
            pmem: pmem.map(|pmem| PmemInfo {
                guest_address: pmem.start,
                size_mib: pmem.size >> 20,
                flushes: pmem.flushes(),
            }),
            zone: memory
                .zone_vm()
                .map(|vm| ZoneMemoryInfo::collect(vm.zone())),
        }
    }
}

/// `GET /balloon`: the balloon's configuration, target and size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonInfo {
    /// Target size in MiB.
    pub amount_mib: u64,
    /// Size the guest has reached, in MiB.
    pub actual_mib: u64,
    /// Whether the guest may deflate on OOM.
    pub deflate_on_oom: bool,
    /// Whether free page reporting is on.
    pub free_page_reporting: bool,
    /// Whether free page hinting is on.
    pub free_page_hinting: bool,
    /// Seconds between statistics requests; 0: none.
    pub stats_polling_interval_s: u32,
    /// Whether the device stopped on a broken queue and waits for the driver to reset it
    /// (its status shows DEVICE_NEEDS_RESET).
    pub needs_reset: bool,
    /// Invalid driver input the device ignored since it was created, per kind.
    pub driver_violations: Violations,
}

/// `PATCH /balloon/hinting/start`: Firecracker's `BalloonStartCmd` (the body may be left out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonStartCmd {
    /// End the run by itself once the guest is through (default true, as Firecracker).
    #[serde(default = "default_true")]
    pub acknowledge_on_stop: bool,
}

impl Default for BalloonStartCmd {
    fn default() -> Self {
        BalloonStartCmd {
            acknowledge_on_stop: true,
        }
    }
}

fn default_true() -> bool {
    true
}

/// `GET /balloon/hinting/status`: Firecracker's `BalloonHintingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonHintingStatus {
    /// The host's last command: the run's id, 0 (none yet) or 1 (the run is over).
    pub host_cmd: u32,
    /// The guest's last command: the run it hints for, or 0 once it is through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_cmd: Option<u32>,
}

/// `GET /balloon/statistics`: target and actual size, and the guest's memory statistics (each
/// present once the guest has reported it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonStatistics {
    /// Target in 4 KiB pages.
    pub target_pages: u64,
    /// Actual size in 4 KiB pages.
    pub actual_pages: u64,
    /// Target in MiB.
    pub target_mib: u64,
    /// Actual size in MiB.
    pub actual_mib: u64,
    /// Bytes swapped in (VIRTIO_BALLOON_S_SWAP_IN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    /// Bytes swapped out (VIRTIO_BALLOON_S_SWAP_OUT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    /// Major page faults (VIRTIO_BALLOON_S_MAJFLT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Minor page faults (VIRTIO_BALLOON_S_MINFLT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    /// Free memory in bytes (VIRTIO_BALLOON_S_MEMFREE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    /// Total memory in bytes (VIRTIO_BALLOON_S_MEMTOT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Available memory in bytes (VIRTIO_BALLOON_S_AVAIL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    /// Disk caches in bytes (VIRTIO_BALLOON_S_CACHES).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    /// Successful hugetlb allocations (VIRTIO_BALLOON_S_HTLB_PGALLOC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugetlb_allocations: Option<u64>,
    /// Failed hugetlb allocations (VIRTIO_BALLOON_S_HTLB_PGFAIL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugetlb_failures: Option<u64>,
    /// Whether the guest wrote a size larger than its RAM (the balloon's actual size, or a
    /// memory statistic); such values are shown as the RAM size.
    #[serde(default)]
    pub clamped: bool,
}

/// A balloon change after the start: `PATCH /balloon` (target; the interval is an extension),
/// `PATCH /balloon/statistics` (polling interval).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonUpdate {
    /// New target in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_mib: Option<u64>,
    /// New statistics polling interval in seconds (0 stops polling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats_polling_interval_s: Option<u32>,
}

/// `PATCH /balloon/statistics`: the new polling interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatsUpdate {
    /// Seconds between statistics requests (0 stops polling).
    pub stats_polling_interval_s: u32,
}

/// `PATCH /vm`: the state to move the VM to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmStateRequest {
    /// The new state.
    pub state: RequestedState,
}

/// A state `PATCH /vm` can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestedState {
    /// Pause all vCPUs.
    Paused,
    /// Let paused vCPUs run.
    Resumed,
}

/// `PUT /actions`: an action on the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// The action.
    pub action_type: ActionType,
}

/// Actions of `PUT /actions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActionType {
    /// Boot the configured VM (a VMM started as `vmm --api-sock PATH`).
    InstanceStart,
    /// Write the metrics to the metrics file (`PUT /metrics`) now.
    FlushMetrics,
    /// Extension: stop the VM from the host side; the vCPUs leave the guest and the VMM exits.
    Shutdown,
    /// Press Ctrl-Alt-Del on the guest's keyboard (an i8042, Linux guests only): Linux sends
    /// SIGINT to its init, which usually reboots, and a reboot ends `vmm run`.
    SendCtrlAltDel,
}

/// The body of every error response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// What went wrong.
    pub fault_message: String,
}

#[cfg(test)]
mod tests;

/// The kind of snapshot asked for (Firecracker's `snapshot_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotType {
    /// Everything: this VMM's only kind.
    #[default]
    Full,
    /// Only what changed since the last one (refused: a VM in a zone copies nothing at all).
    Diff,
}

impl SnapshotType {
    /// The operation whose duration Firecracker's metrics report for a snapshot of this type.
    pub fn operation(self) -> crate::metrics::Operation {
        match self {
            SnapshotType::Full => crate::metrics::Operation::FullCreateSnapshot,
            SnapshotType::Diff => crate::metrics::Operation::DiffCreateSnapshot,
        }
    }
}

/// `PUT /snapshot/create` (Firecracker's `SnapshotCreateParams`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreateParams {
    /// Where the VM's state goes.
    pub snapshot_path: std::path::PathBuf,
    /// Where its memory goes: the VM's own zone (nothing is copied) or a file that gets a copy.
    pub mem_file_path: std::path::PathBuf,
    /// Full (the default) or Diff.
    #[serde(default)]
    pub snapshot_type: SnapshotType,
    /// The snapshot format version older Firecracker clients send (ignored: this VMM writes
    /// its own format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// How guest memory is loaded (Firecracker's `MemoryBackend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemoryBackendType {
    /// From a file: the VM's zone, or a memory file.
    File,
    /// Through a page-fault handler process listening on a Unix socket (a copy snapshot's
    /// memory, which the handler reads from the memory file itself).
    Uffd,
}

/// Firecracker's `MemoryBackend`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryBackend {
    /// File or Uffd.
    pub backend_type: MemoryBackendType,
    /// The file (or the handler's socket).
    pub backend_path: std::path::PathBuf,
}

/// Firecracker's `NetworkOverride`: the tap a loaded VM's interface uses instead of its old one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkOverride {
    /// The interface.
    pub iface_id: String,
    /// Its new tap device.
    pub host_dev_name: String,
}

/// Firecracker's `VsockOverride`: the socket a loaded VM's vsock device listens on instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockOverride {
    /// The new socket path.
    pub uds_path: std::path::PathBuf,
}

/// `PUT /snapshot/load` (Firecracker's `SnapshotLoadParams`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotLoadParams {
    /// The VM's state.
    pub snapshot_path: std::path::PathBuf,
    /// The memory (deprecated in Firecracker): exactly one of this and `mem_backend`.
    #[serde(default)]
    pub mem_file_path: Option<std::path::PathBuf>,
    /// The memory.
    #[serde(default)]
    pub mem_backend: Option<MemoryBackend>,
    /// Let the VM run once loaded (otherwise it waits, paused, for `PATCH /vm`).
    #[serde(default)]
    pub resume_vm: bool,
    /// Dirty page tracking for diff snapshots (deprecated name).
    #[serde(default)]
    pub enable_diff_snapshots: bool,
    /// Dirty page tracking for diff snapshots (refused when true).
    #[serde(default)]
    pub track_dirty_pages: bool,
    /// New taps for the VM's interfaces, by id.
    #[serde(default)]
    pub network_overrides: Vec<NetworkOverride>,
    /// A new socket path for the VM's vsock device.
    #[serde(default)]
    pub vsock_override: Option<VsockOverride>,
    /// Advance kvmclock by the real time since the snapshot was taken (Firecracker's; refused
    /// where the snapshot's host gave no real time with its clock).
    #[serde(default)]
    pub clock_realtime: bool,
    /// This VMM's: load a VM whose zone memory recovery found damaged, accepting that the lost
    /// ranges read as zeroes.
    #[serde(default)]
    pub accept_damaged: bool,
    /// This VMM's: check a memory file's contents against the snapshot's checksum before the
    /// VM runs (which reads all of it; a load maps the file and reads nothing otherwise).
    #[serde(default)]
    pub verify_memory: bool,
    /// This VMM's: load a zone snapshot as a new clone of this name, an ephemeral VM of the
    /// zone that maps the snapshot's frames privately and leaves them as they are.
    #[serde(default)]
    pub clone_name: Option<String>,
    /// This VMM's: with `clone_name`, keep the clone: its frames copied from the base's into
    /// its own, a VM of the zone that outlives its VMM (and a crash) like any other.
    #[serde(default)]
    pub keep_clone: bool,
}

impl SnapshotLoadParams {
    /// Where the memory comes from: a file (the VM's zone, or a copy snapshot's memory file)
    /// or a page-fault handler's socket; or why the request cannot be served.
    pub fn memory_backend(&self) -> Result<(MemoryBackendType, &std::path::Path), String> {
        match (&self.mem_file_path, &self.mem_backend) {
            (Some(path), None) => Ok((MemoryBackendType::File, path)),
            (None, Some(backend)) => Ok((backend.backend_type, &backend.backend_path)),
            (Some(_), Some(_)) => Err("give either mem_backend or mem_file_path, not both".into()),
            (None, None) => Err("mem_backend (or mem_file_path) is missing".into()),
        }
    }

    /// Whether the loaded VM tracks dirty pages for diff snapshots (`track_dirty_pages`, or
    /// its deprecated name `enable_diff_snapshots`).
    pub fn tracks_dirty_pages(&self) -> bool {
        self.track_dirty_pages || self.enable_diff_snapshots
    }

    /// Whether the request uses a field Firecracker deprecates (`mem_file_path`,
    /// `enable_diff_snapshots`).
    pub fn uses_deprecated_fields(&self) -> bool {
        self.mem_file_path.is_some() || self.enable_diff_snapshots
    }

    /// Refuses the options this VMM does not have.
    pub fn check_supported(&self) -> Result<(), String> {
        let (backend, _) = self.memory_backend()?;
        if backend == MemoryBackendType::Uffd && self.verify_memory {
            return Err(
                "verify_memory: a page-fault handler (mem_backend Uffd) serves the \
                        memory, which this VMM does not read before the VM runs"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The instance id a VMM reports when it was given none (Firecracker's default).
pub const DEFAULT_INSTANCE_ID: &str = "anonymous-instance";

/// Run state as Firecracker spells it in [`InstanceInfo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InstanceState {
    /// No VM has run yet.
    #[serde(rename = "Not started")]
    NotStarted,
    /// The vCPUs run the guest.
    Running,
    /// The vCPUs are paused (or, for the moment before the VMM exits, stopped).
    Paused,
}

impl From<VmState> for InstanceState {
    fn from(state: VmState) -> Self {
        match state {
            VmState::NotStarted => InstanceState::NotStarted,
            VmState::Running => InstanceState::Running,
            VmState::Paused | VmState::Stopped => InstanceState::Paused,
        }
    }
}

/// `GET /`: Firecracker's `InstanceInfo` (this VMM's own machine view is `GET /machine`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceInfo {
    /// The application: "llfree-vmm".
    pub app_name: String,
    /// The instance id (`vmm --api-sock PATH --id ID`; a VM in a zone: its name).
    pub id: String,
    /// The run state.
    pub state: InstanceState,
    /// This VMM's version.
    pub vmm_version: String,
}

impl InstanceInfo {
    /// The info of instance `id` in `state`.
    pub fn new(id: &str, state: VmState) -> Self {
        InstanceInfo {
            app_name: "llfree-vmm".into(),
            id: id.to_owned(),
            state: state.into(),
            vmm_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// `GET /version`: Firecracker's `FirecrackerVersion`, with this VMM's version in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// This VMM's version (the field's name is Firecracker's).
    pub firecracker_version: String,
}

impl Default for VersionInfo {
    fn default() -> Self {
        VersionInfo {
            firecracker_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}
