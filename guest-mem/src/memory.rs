//! A guest's physical memory: regions of chunks backed by frames of a shared pool.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use crate::fault::FaultHandlers;
use crate::pool::{CoreFrames, Frame, FrameSize, Pool};
use crate::region::Inner;
use crate::region::{GuestRegion, RegionError};
use crate::shared::SharedState;
use crate::stats::{Counters, MemoryStats};
use crate::sys::uffd::{Uffd, UffdError};
use crate::vcpu::{FaultError, VcpuRegistry};
use crate::zone::ZoneVm;

/// When chunks get their frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Populate {
    /// Every chunk at creation, with all its pages faulted in (allocated and zeroed by the
    /// kernel): the guest never waits for the host.
    Eager,
    /// On first touch, through userfaultfd, with the toucher's core id.
    #[default]
    Lazy,
    /// Every chunk at creation, mapped without touching a page: the host kernel allocates and
    /// zeroes pages at the guest's first touches, with no round trip through userfaultfd (as
    /// for memory that is not a pool's). Nothing is overcommitted; a chunk discarded later (the
    /// balloon, free page reporting) gets its next frame lazily.
    Mapped,
}

/// Eager population seen from another thread: how far it is, and a way to stop it.
#[derive(Debug, Default)]
pub struct Population {
    cancelled: AtomicBool,
    populated_bytes: AtomicU64,
}

impl Population {
    /// Asks the population to stop before its next chunk.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    /// Bytes of guest memory populated so far.
    pub fn populated_bytes(&self) -> u64 {
        self.populated_bytes.load(Ordering::Relaxed)
    }
}

/// Parameters of a guest memory.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// RAM regions as (guest address, size), sorted and not overlapping; both multiples of the
    /// chunk size.
    pub ranges: Vec<(GuestAddress, u64)>,
    /// Hot-pluggable memory (virtio-mem) as (guest address, size), after the ranges and a
    /// multiple of the chunk size like them: a last region whose chunks start unplugged
    /// ([`GuestMemory::plug`]).
    pub hotplug: Option<(GuestAddress, u64)>,
    /// The chunk size; `None` takes the pool's frame size.
    pub chunk_size: Option<FrameSize>,
    /// Eager or lazy population.
    pub populate: Populate,
    /// The number of vCPUs (each gets its own core id in the pool).
    pub vcpus: usize,
    /// Fault handler threads.
    pub fault_threads: usize,
    /// Signal sent to a vCPU thread whose fault cannot be resolved (the VMM must have a handler
    /// installed for it): where KVM waits on userfaultfd interruptibly, KVM_RUN returns EINTR.
    /// Either way the fault stays pending until a frame is free or [`GuestMemory::release_faults`].
    pub kick_signal: Option<i32>,
    /// Called by each fault handler thread whenever it wakes, before it reads what woke it:
    /// where the VMM confines the thread (e.g. stacks a seccomp filter of its own once the
    /// process is locked down). It must be cheap once it has nothing left to do.
    pub confine_handler: Option<fn()>,
    /// Tracks the 4 KiB pages the VMM writes or gives back, for diff snapshots
    /// ([`GuestMemory::take_dirty_pages`]); the guest's own writes are KVM's to log.
    pub track_dirty_pages: bool,
}

impl MemoryConfig {
    /// Lazy memory of `ranges` for `vcpus` vCPUs, pool-sized chunks, one fault thread.
    pub fn new(ranges: Vec<(GuestAddress, u64)>, vcpus: usize) -> Self {
        Self {
            ranges,
            hotplug: None,
            chunk_size: None,
            populate: Populate::Lazy,
            vcpus,
            fault_threads: 1,
            kick_signal: None,
            confine_handler: None,
            track_dirty_pages: false,
        }
    }
}

/// Guest RAM handed to a page-fault handler of another process (Firecracker's Uffd backend):
/// the userfaultfd its faults arrive on, and where each region lies in this process and in the
/// memory file the handler serves it from.
#[derive(Debug)]
pub struct HandlerMemory {
    uffd: Uffd,
    regions: Vec<HandlerRegion>,
}

/// One region of [`HandlerMemory`], as Firecracker's `GuestRegionUffdMapping` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandlerRegion {
    /// Where the region starts in this process.
    pub host_addr: u64,
    /// Its bytes.
    pub size: u64,
    /// Where its contents start in the memory file (the regions one after the other).
    pub offset: u64,
    /// The page size the handler resolves faults in.
    pub page_size: u64,
}

impl HandlerMemory {
    /// The userfaultfd the handler reads the faults from (the VMM keeps its own copy open for
    /// as long as the memory lives).
    pub fn uffd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.uffd.as_raw_fd()
    }

    /// The regions, in guest address order.
    pub fn regions(&self) -> &[HandlerRegion] {
        &self.regions
    }
}

/// Errors of creating and changing guest memory.
#[derive(Debug, Error)]
pub enum MemoryError {
    /// Eager population was cancelled ([`GuestMemory::new_watched`]).
    #[error("eager population was cancelled")]
    Cancelled,
    /// No RAM region was given.
    #[error("guest memory needs at least one region")]
    NoRegions,
    /// A region is empty, not chunk-aligned, overlaps its predecessor or wraps.
    #[error("bad RAM region at {start:#x}, size {size:#x}: {why} ({chunk} chunks)")]
    BadRegion {
        /// Its guest address.
        start: u64,
        /// Its size.
        size: u64,
        /// What is wrong.
        why: &'static str,
        /// The chunk size.
        chunk: &'static str,
    },
    /// The chunk size is smaller than the pool's frames.
    #[error("chunk size {chunk} is smaller than the pool's frames ({pool})")]
    ChunkTooSmall {
        /// The chunk size asked for.
        chunk: &'static str,
        /// The pool's frame size.
        pool: &'static str,
    },
    /// No fault handler thread.
    #[error("at least one fault handler thread is needed")]
    NoFaultThreads,
    /// The userfaultfd could not be set up.
    #[error(transparent)]
    Uffd(#[from] UffdError),
    /// A thread or eventfd could not be created.
    #[error("cannot start the fault handlers: {0}")]
    Handlers(#[source] io::Error),
    /// A region operation failed.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// A guest range is empty or not 4 KiB aligned.
    #[error("guest range {addr:#x}+{len:#x} is empty or not 4 KiB aligned")]
    Unaligned {
        /// Its start.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A guest range is not all RAM.
    #[error("guest range {addr:#x}+{len:#x} is not RAM")]
    NotRam {
        /// Its start.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A vCPU index is out of range.
    #[error("vCPU {index} does not exist (the memory has {vcpus} vCPUs)")]
    NoSuchVcpu {
        /// The index.
        index: usize,
        /// vCPUs configured.
        vcpus: usize,
    },
    /// A snapshot does not fit the configuration or the pool.
    #[error("frame table snapshot does not fit: {0}")]
    Snapshot(String),
    /// The RAM ranges or chunk size differ from the layout of the VM in its zone.
    #[error("the RAM ranges differ from VM '{0}' in the zone")]
    ZoneLayout(String),
    /// A range to plug or unplug is not whole chunks of the hot-pluggable memory.
    #[error("guest range {addr:#x}+{len:#x} is not whole chunks of hot-pluggable memory")]
    NotHotplug {
        /// Its start.
        addr: u64,
        /// Its length.
        len: u64,
    },
}

impl MemoryConfig {
    /// Every region: the RAM ranges, then the hot-pluggable memory.
    pub fn regions(&self) -> Vec<(GuestAddress, u64)> {
        self.ranges.iter().copied().chain(self.hotplug).collect()
    }
}

/// The frames of a detached guest memory, to map them again later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The chunk size.
    pub chunk_size: FrameSize,
    /// Per region: its guest address and the frame (first 4 KiB frame number) of every chunk.
    pub regions: Vec<(GuestAddress, Vec<Option<u64>>)>,
}

/// A guest's physical memory. Implements vm-memory's `GuestMemoryBackend`.
#[derive(Debug)]
pub struct GuestMemory {
    // Declared first: dropped (stopped and joined) before the regions go.
    handlers: FaultHandlers,
    pub(crate) inner: Arc<Inner>,
}

impl GuestMemory {
    /// Creates guest memory on `pool`.
    pub fn new(pool: Arc<Pool>, config: MemoryConfig) -> Result<Self, MemoryError> {
        Self::new_watched(pool, config, &Population::default())
    }

    /// [`GuestMemory::new`], where eager population counts its progress in `population` and
    /// gives up with [`MemoryError::Cancelled`] once it is cancelled (checked before every
    /// chunk), handing every frame it took back to the pool.
    pub fn new_watched(
        pool: Arc<Pool>,
        config: MemoryConfig,
        population: &Population,
    ) -> Result<Self, MemoryError> {
        let memory = Self::build(pool, &config)?;
        memory.populate_ahead(config.populate, population)?;
        Ok(memory)
    }

    /// Creates guest memory whose chunks are mapped onto the frames of `snapshot` (taken with
    /// [`GuestMemory::detach`], possibly before the pool was closed and recovered).
    pub fn restore(
        pool: Arc<Pool>,
        config: MemoryConfig,
        snapshot: &Snapshot,
    ) -> Result<Self, MemoryError> {
        let memory = Self::build(Arc::clone(&pool), &config)?;
        let bad = |why: String| MemoryError::Snapshot(why);
        if snapshot.regions.len() != memory.inner.regions.len() {
            return Err(bad("the number of regions differs".into()));
        }
        let mut seen = HashSet::new();
        for (region, (start, frames)) in memory.inner.regions.iter().zip(&snapshot.regions) {
            if region.start() != *start
                || region.chunk_size() != snapshot.chunk_size
                || region.table().len() != frames.len()
            {
                return Err(bad(format!("region {:#x} differs", start.0)));
            }
            for (chunk, index) in frames.iter().enumerate() {
                let Some(index) = *index else { continue };
                let frame = Frame {
                    index,
                    size: snapshot.chunk_size,
                };
                if !seen.insert(index) || !pool.is_allocated(frame) {
                    return Err(bad(format!("frame {index} is not allocated or used twice")));
                }
                region.adopt(chunk, frame)?;
            }
        }
        memory.populate_ahead(config.populate, &Population::default())?;
        Ok(memory)
    }

    /// Creates the guest memory of `vm`, a VM in a zone, on the zone's pool: the frames the VM
    /// had (before a crash or a restart of the VMM) are mapped again when their chunks are first
    /// touched (or now, with eager population); new ones are recorded in the zone. The ranges
    /// and chunk size of `config` must be the VM's layout.
    pub fn new_in_zone(
        vm: ZoneVm,
        config: MemoryConfig,
        population: &Population,
    ) -> Result<Self, MemoryError> {
        let layout = vm.layout();
        let ranges: Vec<_> = config.regions().iter().map(|(a, s)| (a.0, *s)).collect();
        if ranges != layout.regions || config.chunk_size.is_some_and(|c| c != layout.chunk_size) {
            return Err(MemoryError::ZoneLayout(vm.name().to_owned()));
        }
        let pool = Arc::clone(vm.zone().pool());
        let memory = Self::build_with(pool, &config, Some(vm))?;
        memory.map_clone_base()?;
        memory.populate_ahead(config.populate, population)?;
        Ok(memory)
    }

    /// A clone's RAM (not its hot-pluggable memory) mapped privately from its base's frames
    /// (see [`crate::zone::CloneBase`]); nothing for a VM that is no clone.
    fn map_clone_base(&self) -> Result<(), MemoryError> {
        let Some(vm) = self.zone_vm() else {
            return Ok(());
        };
        let mut mapped = 0;
        for (i, region) in self.inner.regions.iter().enumerate() {
            if region.is_hotplug() {
                continue;
            }
            if let Some(base) = vm.base_table(i) {
                mapped += region.map_base(&base)?;
            }
        }
        if let Some(base) = vm.base() {
            log::debug!(
                "zone VM '{}': {mapped} chunks mapped from its base '{}'",
                vm.name(),
                base.name()
            );
        }
        Ok(())
    }

    fn build(pool: Arc<Pool>, config: &MemoryConfig) -> Result<Self, MemoryError> {
        Self::build_with(pool, config, None)
    }

    fn build_with(
        pool: Arc<Pool>,
        config: &MemoryConfig,
        zone_vm: Option<ZoneVm>,
    ) -> Result<Self, MemoryError> {
        let chunk = config.chunk_size.unwrap_or(pool.frame_size());
        if chunk < pool.frame_size() {
            return Err(MemoryError::ChunkTooSmall {
                chunk: chunk.name(),
                pool: pool.frame_size().name(),
            });
        }
        check_ranges(&config.regions(), chunk)?;
        if config.fault_threads == 0 {
            return Err(MemoryError::NoFaultThreads);
        }
        let core_base = pool.claim_cores(config.vcpus + 1);
        let shared = Arc::new(SharedState {
            vmm_core: core_base + config.vcpus,
            core_base,
            pool,
            uffd: Uffd::new()?,
            vcpus: VcpuRegistry::new(config.vcpus, config.kick_signal)
                .map_err(MemoryError::Handlers)?,
            waiting_others: Mutex::new(Vec::new()),
            others_wait: AtomicBool::new(false),
            released: AtomicBool::new(false),
            held: AtomicBool::new(false),
            resolving_held: AtomicUsize::new(0),
            counters: Counters::new(config.vcpus),
            zone_vm,
        });
        let regions = config
            .regions()
            .into_iter()
            .enumerate()
            .map(|(i, (start, size))| {
                let persistent = shared
                    .zone_vm
                    .as_ref()
                    .map(|vm| (vm.table(i), vm.piece_words(i)));
                let hotplug = i == config.ranges.len();
                GuestRegion::new(
                    start,
                    size,
                    chunk,
                    Arc::clone(&shared),
                    persistent,
                    hotplug,
                    config.track_dirty_pages,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let inner = Arc::new(Inner { regions, shared });
        let handlers = FaultHandlers::spawn(&inner, config.fault_threads, config.confine_handler)
            .map_err(MemoryError::Handlers)?;
        Ok(Self { handlers, inner })
    }

    /// What `populate` does when the memory is made: eager population, mapping every chunk
    /// ahead, or nothing (lazy).
    fn populate_ahead(
        &self,
        populate: Populate,
        population: &Population,
    ) -> Result<(), MemoryError> {
        match populate {
            Populate::Eager => self.populate_all(population),
            Populate::Mapped => self.map_all(),
            Populate::Lazy => Ok(()),
        }
    }

    /// The VMM's own core, through its cache unless a thread holds it: the frames of eager and
    /// mapped-ahead population come from there.
    fn vmm_core_frames(&self) -> CoreFrames {
        self.inner
            .shared
            .pool
            .core_frames(self.inner.shared.vmm_core)
    }

    /// Maps every chunk's frame without touching a page ([`Populate::Mapped`]): the frames a
    /// zone recorded for the VM, fresh ones from the VMM's core for the others.
    fn map_all(&self) -> Result<(), MemoryError> {
        let mut core = self.vmm_core_frames();
        for region in &self.inner.regions {
            region.map_recorded(&mut 0, usize::MAX)?;
            region.map_fresh_frames(&mut core)?;
        }
        Ok(())
    }

    fn populate_all(&self, population: &Population) -> Result<(), MemoryError> {
        let mut core = self.vmm_core_frames();
        for region in &self.inner.regions {
            for chunk in 0..region.table().len() {
                if population.cancelled.load(Ordering::Acquire) {
                    return Err(MemoryError::Cancelled);
                }
                if !region.is_plugged(chunk) {
                    continue;
                }
                region.populate_and_prefault(chunk, &mut core)?;
                population
                    .populated_bytes
                    .fetch_add(region.chunk_size().bytes(), Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Maps the RAM regions (not hot-pluggable memory) privately from `file`, one after the
    /// other from its start, as a copy snapshot's memory file holds them: nothing is copied,
    /// every VM loaded from the file shares its page cache until its guest writes a page (a
    /// write copies that page into memory of this process's own; the file never changes). The
    /// regions must be unpopulated. Returns where hot-pluggable memory starts in the file.
    pub fn map_file(&self, file: &std::fs::File) -> Result<u64, MemoryError> {
        use std::os::fd::AsRawFd;
        let mut offset = 0;
        for region in self.inner.regions.iter().filter(|r| !r.is_hotplug()) {
            region.map_file(file.as_raw_fd(), offset)?;
            offset += region.size();
        }
        Ok(offset)
    }

    /// Hands the RAM regions to a page-fault handler of another process (Firecracker's Uffd
    /// backend): each becomes fresh private anonymous memory registered with a new
    /// userfaultfd, whose faults (the guest's and the VMM's alike) the handler resolves, e.g.
    /// from a memory file that holds the regions one after the other. The regions must be
    /// unpopulated, and there must be no hot-pluggable memory (its chunks are pool frames).
    pub fn map_for_handler(&self) -> Result<HandlerMemory, MemoryError> {
        if self.hotplug_region().is_some() {
            return Err(MemoryError::Region(RegionError::MapForHandler {
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "hot-pluggable memory cannot be served by a page-fault handler",
                ),
            }));
        }
        let uffd = Uffd::for_handler()?;
        let mut regions = Vec::with_capacity(self.inner.regions.len());
        let mut offset = 0;
        for region in self.inner.regions.iter() {
            let page_size = region.map_for_handler(&uffd)?;
            regions.push(HandlerRegion {
                host_addr: region.host_addr() as u64,
                size: region.size(),
                offset,
                page_size,
            });
            offset += region.size();
        }
        Ok(HandlerMemory { uffd, regions })
    }

    /// The regions, in guest address order.
    pub fn regions(&self) -> &[GuestRegion] {
        &self.inner.regions
    }

    /// The hot-pluggable memory, if it has some.
    pub fn hotplug_region(&self) -> Option<&GuestRegion> {
        self.inner.regions.last().filter(|r| r.is_hotplug())
    }

    /// The chunks of hot-pluggable memory that `[addr, addr + len)` covers exactly.
    fn hotplug_chunks(
        &self,
        addr: GuestAddress,
        len: u64,
    ) -> Result<(&GuestRegion, std::ops::Range<usize>), MemoryError> {
        let bad = || MemoryError::NotHotplug { addr: addr.0, len };
        let region = self.hotplug_region().ok_or_else(bad)?;
        let chunk = region.chunk_size().bytes();
        let offset = addr.0.checked_sub(region.start().0).ok_or_else(bad)?;
        let end = offset.checked_add(len).ok_or_else(bad)?;
        if len == 0 || !offset.is_multiple_of(chunk) || !len.is_multiple_of(chunk) {
            return Err(bad());
        }
        if end > region.size() {
            return Err(bad());
        }
        Ok((region, (offset / chunk) as usize..(end / chunk) as usize))
    }

    /// Checks that `core` is one of this memory's pool: frames of another pool's core would
    /// go to the wrong allocator (a caller's mistake, not a guest's).
    pub(crate) fn check_core(&self, core: &CoreFrames) {
        assert!(
            core.is_of(&self.inner.shared.pool),
            "core {} belongs to another pool",
            core.core()
        );
    }

    /// Plugs `[addr, addr + len)`, whole unplugged chunks of the hot-pluggable memory: each
    /// gets a frame allocated with `core` (recorded in the zone, for a VM in one) and the guest
    /// may use it. All or nothing: if a chunk is plugged already or the pool runs out, the
    /// chunks this call plugged are unplugged again and the error returned.
    pub fn plug(
        &self,
        addr: GuestAddress,
        len: u64,
        core: &mut CoreFrames,
    ) -> Result<(), MemoryError> {
        self.check_core(core);
        let (region, chunks) = self.hotplug_chunks(addr, len)?;
        if let Some(chunk) = chunks.clone().find(|&c| region.is_plugged(c)) {
            return Err(RegionError::Plugged { chunk }.into());
        }
        Ok(region.plug(chunks, core)?)
    }

    /// Unplugs `[addr, addr + len)`, whole plugged chunks of the hot-pluggable memory: each
    /// becomes inaccessible (to the guest and to device accesses) and its frame, scrubbed, goes
    /// back to the pool with `core`. Returns how many frames went back. Fails before changing
    /// anything if a chunk is not plugged.
    pub fn unplug(
        &self,
        addr: GuestAddress,
        len: u64,
        core: &mut CoreFrames,
    ) -> Result<usize, MemoryError> {
        self.check_core(core);
        let (region, chunks) = self.hotplug_chunks(addr, len)?;
        if let Some(chunk) = chunks.clone().find(|&c| !region.is_plugged(c)) {
            return Err(RegionError::Unplugged { chunk }.into());
        }
        region.mark_dirty(addr.0 - region.start().0, len);
        Ok(region.unplug(chunks, core)?)
    }

    /// How many chunks of `[addr, addr + len)` (whole chunks of the hot-pluggable memory) are
    /// plugged.
    pub fn plugged_chunks(&self, addr: GuestAddress, len: u64) -> Result<usize, MemoryError> {
        let (region, chunks) = self.hotplug_chunks(addr, len)?;
        Ok(chunks.filter(|&c| region.is_plugged(c)).count())
    }

    /// The VM in a zone whose memory this is, if it is one.
    pub fn zone_vm(&self) -> Option<&ZoneVm> {
        self.inner.shared.zone_vm.as_ref()
    }

    /// The pool the frames come from.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.inner.shared.pool
    }

    /// Records the calling thread as vCPU `index`: its faults allocate with that vCPU's core.
    pub fn register_vcpu(&self, index: usize) -> Result<(), MemoryError> {
        let vcpus = &self.inner.shared.vcpus;
        if !vcpus.register_current(index) {
            return Err(MemoryError::NoSuchVcpu {
                index,
                vcpus: vcpus.len(),
            });
        }
        Ok(())
    }

    /// Records thread `tid` (a kernel thread id of this process) as vCPU `index`, for a VMM
    /// that starts its vCPU threads elsewhere and learns their ids: like [`Self::register_vcpu`]
    /// called on that thread. Register before the vCPU first touches guest memory.
    pub fn register_vcpu_tid(&self, index: usize, tid: u32) -> Result<(), MemoryError> {
        let vcpus = &self.inner.shared.vcpus;
        if !vcpus.register(index, tid) {
            return Err(MemoryError::NoSuchVcpu {
                index,
                vcpus: vcpus.len(),
            });
        }
        Ok(())
    }

    /// The pool core id that vCPU `index` allocates with.
    pub fn vcpu_core(&self, index: usize) -> usize {
        self.inner.shared.core_base + index
    }

    /// The pool core id of VMM-side population (vm-memory accesses, eager population).
    pub fn vmm_core(&self) -> usize {
        self.inner.shared.vmm_core
    }

    /// Takes the error that stopped vCPU `index`'s last fault (check after KVM_RUN gives EINTR).
    pub fn take_fault_error(&self, index: usize) -> Option<FaultError> {
        self.inner.shared.vcpus.take_error(index)
    }

    /// Takes the error of the last fault of a thread that is no vCPU (KVM's asynchronous page
    /// fault worker, which resolves most faults of a guest running with interrupts on, or a
    /// VMM thread): such a fault waits for a frame like a vCPU's, and reports here.
    pub fn take_other_fault_error(&self) -> Option<FaultError> {
        self.inner.shared.vcpus.take_other_error()
    }

    /// Call when the VM stops for good: every fault that waits for a frame, and from now on
    /// every fault the pool cannot serve at once, is answered with the shared zero page at the
    /// faulting address (outside the pool), so that no vCPU, no VMM thread and no kernel worker
    /// stays blocked. KVM destroys a VM only once its asynchronous page fault workers are done:
    /// one left waiting here would leave the VMM in uninterruptible sleep, deaf even to SIGKILL.
    /// Returns how many waits it ended.
    pub fn release_faults(&self) -> usize {
        crate::fault::release(&self.inner.shared)
    }

    /// Holds the waits of vCPUs for a frame (the VM is being paused): a vCPU that waits keeps
    /// waiting, even once a frame is free, until [`Self::release_held_vcpus`]. Such a vCPU is
    /// blocked in the kernel, where no kick reaches it (KVM's fault path waits for userfaultfd
    /// uninterruptibly on many kernels), and counts as paused ([`Self::vcpu_held`]). Returns
    /// once no resolution of a waiting vCPU's fault is under way.
    pub fn hold_waiting_vcpus(&self) {
        let shared = &self.inner.shared;
        shared.held.store(true, Ordering::SeqCst);
        while shared.resolving_held.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }

    /// Ends [`Self::hold_waiting_vcpus`]: waiting vCPUs get frames again as they come.
    pub fn release_held_vcpus(&self) {
        self.inner.shared.held.store(false, Ordering::SeqCst);
    }

    /// Whether vCPU `index` waits for a frame (its fault found the pool exhausted).
    pub fn vcpu_waits(&self, index: usize) -> bool {
        self.vcpu_waited(index).is_some()
    }

    /// How long vCPU `index` has waited for a frame, if it does.
    pub fn vcpu_waited(&self, index: usize) -> Option<std::time::Duration> {
        let vcpus = &self.inner.shared.vcpus;
        (index < vcpus.len()).then(|| vcpus.waited(index)).flatten()
    }

    /// Whether a fault of a thread that is no vCPU waits for a frame.
    pub fn other_fault_waits(&self) -> bool {
        self.inner.shared.others_wait.load(Ordering::Acquire)
    }

    /// Whether vCPU `index` waits for a frame while the waits are held (it is as paused).
    pub fn vcpu_held(&self, index: usize) -> bool {
        let shared = &self.inner.shared;
        shared.held.load(Ordering::SeqCst)
            && index < shared.vcpus.len()
            && shared.vcpus.blocked_on(index).is_some()
    }

    /// Readable when some vCPU has a fault error pending.
    pub fn fault_event(&self) -> &EventFd {
        self.inner.shared.vcpus.event()
    }

    /// The frame behind guest address `addr`, if populated.
    pub fn frame_at(&self, addr: GuestAddress) -> Option<Frame> {
        let region = self.locate_guest(addr)?;
        region.frame_at(addr.0 - region.start().0)
    }

    /// Whether the chunk holding guest address `addr` may hold data: it has a pool frame, or it
    /// is mapped from a memory file. An unpopulated chunk reads as zero.
    pub fn holds_data(&self, addr: GuestAddress) -> bool {
        let Some(region) = self.locate_guest(addr) else {
            return false;
        };
        let offset = addr.0 - region.start().0;
        region.frame_at(offset).is_some() || region.is_file_backed(offset)
    }

    /// Whether every byte of `[addr, addr + len)` is guest RAM: a non-empty range inside the
    /// regions (it may span adjacent ones). The one answer to "is this RAM" for devices and
    /// for this crate's discards.
    pub fn is_ram(&self, addr: GuestAddress, len: u64) -> bool {
        let Some(end) = addr.0.checked_add(len).filter(|_| len > 0) else {
            return false;
        };
        let mut at = addr.0;
        while at < end {
            let Some(region) = self.locate_guest(GuestAddress(at)) else {
                return false;
            };
            at = (region.start().0 + region.size()).min(end);
        }
        true
    }

    pub(crate) fn locate_guest(&self, addr: GuestAddress) -> Option<&GuestRegion> {
        self.inner
            .regions
            .iter()
            .find(|r| addr.0 >= r.start().0 && addr.0 - r.start().0 < r.size())
    }

    /// Writes the contents of `[addr, addr + len)` back to the backing (msync): for a file or a
    /// zone on a disk or DAX file system, they survive a host crash from now on (a flush of a
    /// virtio-pmem device). Unpopulated parts have nothing to write.
    pub fn sync(&self, addr: GuestAddress, len: u64) -> Result<(), MemoryError> {
        if !self.is_ram(addr, len) {
            return Err(MemoryError::NotRam { addr: addr.0, len });
        }
        let mut at = addr.0;
        let end = addr.0 + len;
        while at < end {
            let region = self.locate_guest(GuestAddress(at)).expect("checked above");
            let offset = at - region.start().0;
            let part = (region.size() - offset).min(end - at);
            region.sync(offset, part).map_err(RegionError::Sync)?;
            at += part;
        }
        Ok(())
    }

    /// Counters of this guest memory.
    pub fn stats(&self) -> MemoryStats {
        let counters = &self.inner.shared.counters;
        let regions = &self.inner.regions;
        let populated_bytes = regions
            .iter()
            .map(|r| r.table().populated() as u64 * r.chunk_size().bytes())
            .sum();
        MemoryStats {
            chunks: regions.iter().map(|r| r.table().len()).sum(),
            populated_chunks: regions.iter().map(|r| r.table().populated()).sum(),
            file_backed_chunks: regions.iter().map(|r| r.table().file_backed()).sum(),
            populated_bytes,
            faults: Counters::read(&counters.faults),
            vcpu_faults: counters.vcpu_faults.iter().map(Counters::read).collect(),
            exhausted: Counters::read(&counters.exhausted),
            waiting_vcpus: self.inner.shared.vcpus.blocked_count(),
            waiting_other_faults: self.inner.shared.lock_waiting_others().len(),
            discarded_chunks: Counters::read(&counters.discarded_chunks),
            mapped_ahead_chunks: Counters::read(&counters.mapped_ahead_chunks),
            given_away_pieces: regions
                .iter()
                .flat_map(|r| (0..r.table().len()).map(|c| r.pieces().count(c) as u64))
                .sum(),
            fault_latency: counters.fault_latency(),
        }
    }

    /// Stops the memory and unmaps it, but keeps its frames allocated in the pool; returns them
    /// so that [`GuestMemory::restore`] can map them again (e.g. after a persistent pool was
    /// closed and reopened).
    pub fn detach(self) -> Snapshot {
        let GuestMemory { handlers, inner } = self;
        drop(handlers);
        Snapshot {
            chunk_size: inner.regions[0].chunk_size(),
            regions: inner
                .regions
                .iter()
                .map(|r| (r.start(), r.take_frames()))
                .collect(),
        }
    }
}

fn check_ranges(ranges: &[(GuestAddress, u64)], chunk: FrameSize) -> Result<(), MemoryError> {
    if ranges.is_empty() {
        return Err(MemoryError::NoRegions);
    }
    let mut previous_end = 0;
    for (i, &(start, size)) in ranges.iter().enumerate() {
        let why = if size == 0 {
            Some("empty")
        } else if !start.0.is_multiple_of(chunk.bytes()) || !size.is_multiple_of(chunk.bytes()) {
            Some("not a multiple of the chunk size")
        } else if start.0.checked_add(size).is_none() {
            Some("wraps around the address space")
        } else if i > 0 && start.0 < previous_end {
            Some("overlaps or precedes the region before it")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(MemoryError::BadRegion {
                start: start.0,
                size,
                why,
                chunk: chunk.name(),
            });
        }
        previous_end = start.0 + size;
    }
    Ok(())
}
