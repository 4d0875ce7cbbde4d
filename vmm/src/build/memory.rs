//! The frame pool and the guest memory of a VM, as configured: a pool of its own, a pool shared
//! with other VMs of the process, or a VM in a persistent zone.

use std::sync::Arc;

use guest_mem::zone::{VmLayout, Zone, ZoneError, ZoneVm};
use guest_mem::{
    FrameSize, GuestMemory, MemoryConfig, MemoryError, Pool, PoolConfig, PoolError, Population,
};
use vm_memory::GuestAddress;

use crate::config::{format_size, VmConfig, ZoneTarget};
use crate::vm::kick::kick_signal;

/// Where a VM's frames come from.
#[derive(Debug)]
pub(crate) enum Frames {
    /// A pool (its own or shared).
    Pool(Arc<Pool>),
    /// Its VM in a zone, attached to this process.
    Zone(ZoneVm),
}

/// Errors of opening a zone for a VM.
#[derive(Debug, thiserror::Error)]
pub enum ZoneSetupError {
    /// The zone could not be opened or the VM not attached.
    #[error(transparent)]
    Zone(#[from] ZoneError),
    /// Guest RAM or pmem is not made of whole frames of the zone.
    #[error("{setting} {size}: must be a multiple of the zone's frame size ({frame})")]
    Misaligned {
        /// The setting: memory or pmem.
        setting: &'static str,
        /// Its size.
        size: String,
        /// The zone's frame size.
        frame: &'static str,
    },
}

/// Opens the zone of `target` (recovering it after a crash) and attaches this process to its VM,
/// creating the VM with `config`'s RAM if the zone has none of that name.
pub(crate) fn attach_zone(
    config: &VmConfig,
    target: &ZoneTarget,
) -> Result<ZoneVm, ZoneSetupError> {
    let cores = config.vcpus + SPARE_CORES;
    attach_vm(&open_zone(target, cores)?, config, target)
}

/// Opens the zone of `target` for a process that allocates with `cores` of the zone's
/// allocator slots (recovering it after a crash), and says what its recovery did.
pub(crate) fn open_zone(target: &ZoneTarget, cores: usize) -> Result<Arc<Zone>, ZoneSetupError> {
    let zone = Zone::open(&target.path, cores)?;
    let recovery = zone.recovery();
    log::debug!(
        "zone {}: opened ({} recovery in {} µs: {} leaked and {} lost frames, {} dead processes, \
         {} repaired entries, {} damaged chunks)",
        target.path.display(),
        recovery.kind.name(),
        recovery.nanos / 1000,
        recovery.leaked_frames,
        recovery.lost_frames,
        recovery.dead_processes,
        recovery.repaired_entries,
        recovery.damaged_chunks
    );
    if recovery.leaked_frames + recovery.lost_frames > 0 {
        log::warn!(
            "zone {}: recovered after a crash: freed {} leaked frames, took back {} lost ones",
            target.path.display(),
            recovery.leaked_frames,
            recovery.lost_frames
        );
    }
    if recovery.repaired_entries + recovery.damaged_chunks + recovery.orphaned_frames > 0 {
        log::warn!(
            "zone {}: its metadata was damaged: recovery repaired {} frame-table entries or \
             owners, marked {} chunks of memory lost, and found {} frames of data nobody named",
            target.path.display(),
            recovery.repaired_entries,
            recovery.damaged_chunks,
            recovery.orphaned_frames
        );
    }
    Ok(zone)
}

/// Attaches this process to the VM of `target` in `zone`, creating it with `config`'s RAM if the
/// zone has none of that name.
pub(crate) fn attach_vm(
    zone: &Arc<Zone>,
    config: &VmConfig,
    target: &ZoneTarget,
) -> Result<ZoneVm, ZoneSetupError> {
    if target.accept_damaged {
        let lost = zone.accept_damage(&target.vm)?;
        if !lost.is_empty() {
            log::warn!(
                "zone {}: VM '{}' attached with its lost memory (now zeroes) accepted: {}",
                target.path.display(),
                target.vm,
                guest_mem::zone::format_ranges(&lost)
            );
        }
    }
    let frame = zone.frame_size();
    // RAM is any number of MiB (its last frame partly used); the devices' memory is whole
    // frames.
    for (setting, size) in [
        ("pmem", config.pmem_size),
        ("hotplug", config.hotplug.map(|h| h.total_size)),
    ] {
        if let Some(size) = size.filter(|size| !size.is_multiple_of(frame.bytes())) {
            return Err(ZoneSetupError::Misaligned {
                setting,
                size: format_size(size),
                frame: frame.name(),
            });
        }
    }
    let layout = VmLayout {
        chunk_size: frame,
        regions: config
            .memory_regions(frame)
            .iter()
            .chain(&config.hotplug_region())
            .map(|region| (region.start, region.size))
            .collect(),
    };
    let vm = zone.attach(&target.vm, &layout)?;
    if target.ephemeral {
        vm.make_ephemeral()?;
    }
    log::debug!(
        "zone {}: attached to VM '{}' ({} in frames of {}{})",
        target.path.display(),
        target.vm,
        format_size(config.memory_size),
        frame.name(),
        if target.ephemeral { ", ephemeral" } else { "" }
    );
    Ok(vm)
}

/// Pool cores besides one per vCPU: the VMM's own (eager population, loaders, device
/// accesses) and one for each device that allocates or frees frames (the balloon, virtio-mem).
pub const SPARE_CORES: usize = 3;
/// The zone's allocator slots a clone takes: one, which its threads share (they allocate only
/// what the base had not populated), so that a zone's 256 slots serve as many clones as it
/// takes processes.
pub const CLONE_CORES: usize = 1;
/// Most userfaultfd handler threads; a VM gets one per vCPU up to this.
const MAX_FAULT_THREADS: usize = 4;

/// Creates the pool: guest RAM's size and the hot-pluggable memory's of the configured
/// backing, one core per vCPU plus [`SPARE_CORES`].
pub(crate) fn create_pool(config: &VmConfig) -> Result<Arc<Pool>, PoolError> {
    let hotplug = config.hotplug.map_or(0, |h| h.total_size);
    let frame = config.backing.frame_size();
    note_partial_frame(config, frame);
    let pool = Pool::new(PoolConfig {
        backing: config.backing.pool_backing(config.format_pool),
        size: config.backed_memory_size(frame) + hotplug,
        cores: config.vcpus + SPARE_CORES,
        scrub: config.scrub,
    })?;
    log::debug!(
        "pool: {} of {} backing in frames of {}, {} allocator cores",
        format_size(config.memory_size),
        config.backing,
        config.backing.frame_size().name(),
        config.vcpus + SPARE_CORES
    );
    Ok(pool)
}

/// Says when guest RAM ends inside a frame: the host backs the whole frame, the guest sees its
/// RAM (a debug note on 2 MiB frames, a warning on 1 GiB ones, where most of it may lie unused).
fn note_partial_frame(config: &VmConfig, frame: FrameSize) {
    let backed = config.backed_memory_size(frame);
    if backed == config.memory_size {
        return;
    }
    let level = match frame {
        FrameSize::Huge => log::Level::Debug,
        FrameSize::Giant => log::Level::Warn,
    };
    log::log!(
        level,
        "memory {}: its last {} frame is partly used; the host backs {}",
        format_size(config.memory_size),
        frame.name(),
        format_size(backed)
    );
}

/// Creates guest memory over the RAM regions of the layout, in chunks of the pool's frame size,
/// populated eagerly or lazily. Faults that cannot be served kick the vCPU out of `KVM_RUN`.
/// Eager population counts its progress in `population` and stops once it is cancelled. A VM in
/// a zone that boots afresh (`boot`) takes its old balloon back; one resumed from a snapshot
/// keeps it.
pub(crate) fn create_memory(
    config: &VmConfig,
    frames: Frames,
    population: &Population,
    boot: bool,
) -> Result<GuestMemory, MemoryError> {
    let frame = match &frames {
        Frames::Pool(pool) => pool.frame_size(),
        Frames::Zone(vm) => vm.layout().chunk_size,
    };
    let regions = config.memory_regions(frame);
    let fault_threads = config.vcpus.clamp(1, MAX_FAULT_THREADS);
    log::debug!(
        "guest memory: {} in {} region(s), populated {}, {fault_threads} fault thread(s)",
        format_size(regions.iter().map(|r| r.size).sum()),
        regions.len(),
        match config.populate {
            guest_mem::Populate::Eager => "eagerly",
            guest_mem::Populate::Lazy => "lazily",
            guest_mem::Populate::Mapped => "mapped ahead",
        },
    );
    let ranges = regions
        .iter()
        .map(|region| (GuestAddress(region.start), region.size))
        .collect();
    let memory_config = |chunk_size| MemoryConfig {
        ranges,
        hotplug: config
            .hotplug_region()
            .map(|region| (GuestAddress(region.start), region.size)),
        chunk_size: Some(chunk_size),
        populate: config.populate,
        vcpus: config.vcpus,
        fault_threads,
        kick_signal: Some(kick_signal()),
        confine_handler: Some(crate::seccomp::confine_fault_handler),
        track_dirty_pages: config.track_dirty_pages,
    };
    match frames {
        Frames::Pool(pool) => GuestMemory::new_watched(pool, memory_config(frame), population),
        Frames::Zone(vm) => {
            let memory = GuestMemory::new_in_zone(vm, memory_config(frame), population)?;
            if !boot {
                return Ok(memory);
            }
            // The guest boots afresh with an empty balloon: pages its previous life gave away
            // are its own again (a chunk it gave away entirely has no frame and gets a fresh
            // one on its next touch). Left marked, they would let a later inflation of the
            // chunk's other pages free a frame the new guest uses.
            let reclaimed = memory.reclaim_all_pieces();
            if reclaimed > 0 {
                log::info!(
                    "the guest boots afresh: took back {reclaimed} pages of its old balloon"
                );
            }
            Ok(memory)
        }
    }
}
