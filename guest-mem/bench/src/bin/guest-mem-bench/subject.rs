//! What is measured: guest RAM from a guest-mem pool (eager or lazy), or memory outside guest-mem
//! (plain anonymous memory, the baseline), with the huge pages a pool needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guest_mem::testing::HugePageReservation;
use guest_mem::{Backing, FrameSize, GuestMemory, MemoryConfig, Pool, PoolConfig, Populate, Scrub};
use vm_memory::GuestAddress;

use crate::host::{self, Mapping};
use crate::report::{Key, Report};
use crate::{GIB, MIB};

/// The kinds of pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Plain shared memory (a memfd with 4 KiB pages), 2 MiB frames.
    Anonymous,
    /// hugetlb with 2 MiB pages.
    Huge2M,
    /// hugetlb with 1 GiB pages.
    Huge1G,
}

impl PoolKind {
    /// Every kind.
    pub const ALL: [PoolKind; 3] = [PoolKind::Anonymous, PoolKind::Huge2M, PoolKind::Huge1G];

    /// The name used in the results.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Anonymous => "anon-pool",
            PoolKind::Huge2M => "hugetlb-2m",
            PoolKind::Huge1G => "hugetlb-1g",
        }
    }

    /// The frame (and chunk) size in bytes.
    pub fn frame(self) -> u64 {
        match self {
            PoolKind::Huge1G => FrameSize::Giant.bytes(),
            _ => FrameSize::Huge.bytes(),
        }
    }

    /// The stride that touches each frame once ("2m" or "1g").
    pub fn frame_stride(self) -> &'static str {
        match self {
            PoolKind::Huge1G => "1g",
            _ => "2m",
        }
    }

    /// The hugetlb page size in KiB and log2 of its bytes.
    pub fn huge_page(self) -> Option<(u64, u32)> {
        match self {
            PoolKind::Anonymous => None,
            PoolKind::Huge2M => Some((2048, 21)),
            PoolKind::Huge1G => Some((1 << 20, 30)),
        }
    }

    fn backing(self) -> Backing {
        match self {
            PoolKind::Anonymous => Backing::Anonymous,
            PoolKind::Huge2M => Backing::Hugetlb2M,
            PoolKind::Huge1G => Backing::Hugetlb1G,
        }
    }
}

/// Whether memory is measured cold (see [`warm_buddy`]).
static COLD: AtomicBool = AtomicBool::new(false);

/// Measures cold memory from now on: no warming (see [`warm_buddy`]).
pub fn measure_cold() {
    COLD.store(true, Ordering::Relaxed);
}

/// Reserves the huge pages for `bytes` of `kind` until dropped, and warms them (see [`warm_buddy`]);
/// `Err` is the reason to skip.
pub fn reserve(kind: PoolKind, bytes: u64) -> Result<Option<HugePageReservation>, String> {
    let Some((kb, shift)) = kind.huge_page() else {
        return Ok(None);
    };
    let pages = match HugePageReservation::reserve(kb, bytes >> shift) {
        // 1 GiB pages need 1 GiB of contiguous memory: compact it and try once more.
        Err(_) if kind == PoolKind::Huge1G => {
            let _ = std::fs::write("/proc/sys/vm/compact_memory", "1");
            HugePageReservation::reserve(kb, bytes >> shift)?
        }
        reserved => reserved?,
    };
    if !COLD.load(Ordering::Relaxed) {
        let (_file, map) = host::mapped_memfd(Some(shift), bytes).map_err(|e| e.to_string())?;
        host::populate_write(map.addr(), map.len()).map_err(|e| format!("warming: {e}"))?;
    }
    Ok(Some(pages))
}

/// Warms `size` bytes of the page allocator's memory, in 4 KiB pages or (with `thp`) 2 MiB
/// ones, for a measurement that is about to take them.
///
/// This host is itself a VM whose hypervisor backs its memory on first touch and takes freed
/// memory back (free page reporting, 2 MiB blocks, a few seconds after the free): touching
/// such memory first costs ~10 µs per 4 KiB more than the kernel's own work, which would blur
/// every comparison. So buddy memory of the same page size is touched and freed right before a
/// measurement (the allocator hands the same pages out again, well within the reporting delay),
/// and hugetlb pages once after their reservation (the hugetlb pool is not reported).
pub fn warm_buddy(size: u64, thp: bool) -> Result<(), String> {
    if COLD.load(Ordering::Relaxed) {
        return Ok(());
    }
    let map = host::plain_memory(size, 2 * MIB, thp).map_err(|e| e.to_string())?;
    host::populate_write(map.addr(), map.len()).map_err(|e| format!("warming: {e}"))
}

/// Warms what a pool of `kind` is about to take from the page allocator (see [`warm_buddy`]):
/// a plain pool takes 4 KiB pages, hugetlb pools were warmed when reserved.
pub fn warm_pool(kind: PoolKind, size: u64) -> Result<(), String> {
    match kind {
        PoolKind::Anonymous => warm_buddy(size, false),
        PoolKind::Huge2M | PoolKind::Huge1G => Ok(()),
    }
}

/// Reserves the huge pages for `max` bytes of `kind` or, for 1 GiB pages, for as many whole
/// pages below that as can be had; returns them and the bytes reserved.
fn reserve_most(kind: PoolKind, max: u64) -> Result<(Option<HugePageReservation>, u64), String> {
    let mut size = max;
    loop {
        match reserve(kind, size) {
            Ok(pages) => return Ok((pages, size)),
            Err(why) if kind != PoolKind::Huge1G || size <= kind.frame() => return Err(why),
            Err(_) => size -= kind.frame(),
        }
    }
}

/// Like [`reserve_most`]; where no pages can be had, notes `skipped` (the case at `max` bytes)
/// in `report` and returns `None`.
pub fn reserve_or_skip(
    report: &mut Report,
    skipped: &Key,
    kind: PoolKind,
    max: u64,
) -> Option<(Option<HugePageReservation>, u64)> {
    reserve_most(kind, max)
        .inspect_err(|why| report.skip(skipped, why))
        .ok()
}

/// A pool of `size` bytes of `kind` scrubbing by `scrub` (the caller holds its huge pages, see
/// [`reserve`]); `Err` is the reason to skip.
pub fn pool(kind: PoolKind, size: u64, scrub: Scrub) -> Result<Arc<Pool>, String> {
    let mut config = PoolConfig::new(kind.backing(), size);
    config.cores = 8;
    config.scrub = scrub;
    Pool::new(config).map_err(|e| e.to_string())
}

/// Guest memory of `size` bytes at guest address 0 for one vCPU, populated by `populate`.
pub fn memory(pool: &Arc<Pool>, size: u64, populate: Populate) -> Result<GuestMemory, String> {
    let mut config = MemoryConfig::new(vec![(GuestAddress(0), size)], 1);
    config.populate = populate;
    GuestMemory::new(Arc::clone(pool), config).map_err(|e| e.to_string())
}

/// How pool memory is populated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PopulateMode {
    /// Every chunk mapped and faulted in at creation (the kernel allocates and zeroes before
    /// the guest runs).
    Eager,
    /// Chunks mapped on first touch, through userfaultfd.
    Lazy,
}

/// One kind of guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A guest-mem pool.
    Pool(PoolKind, PopulateMode),
    /// Plain private anonymous memory, with or without transparent huge pages.
    Plain {
        /// MADV_HUGEPAGE (else MADV_NOHUGEPAGE).
        thp: bool,
        /// MADV_POPULATE_WRITE before the guest runs.
        prefault: bool,
    },
}

impl Subject {
    /// The name used in the results.
    pub fn name(self) -> String {
        match self {
            Subject::Pool(kind, mode) => {
                let mode = match mode {
                    PopulateMode::Eager => "eager",
                    PopulateMode::Lazy => "lazy",
                };
                format!("{}/{mode}", kind.name())
            }
            Subject::Plain { thp, prefault } => {
                let pages = if thp { "thp" } else { "4k" };
                let mode = if prefault { "/prefault" } else { "" };
                format!("plain-anon-{pages}{mode}")
            }
        }
    }
}

/// Guest RAM at guest address 0 and what keeps it alive.
pub enum Ram {
    /// Pool memory.
    Pool(GuestMemory),
    /// Memory outside guest-mem: plain anonymous memory, or a mapped memfd.
    Plain(Mapping),
}

impl Ram {
    /// Builds `size` bytes of `subject` (the caller holds the huge pages); returns it and the
    /// time spent before a guest can run on it (pool creation excluded). `Err` is the reason
    /// to skip.
    pub fn build(subject: Subject, size: u64) -> Result<(Self, Duration), String> {
        match subject {
            Subject::Pool(kind, mode) => {
                warm_pool(kind, size)?;
                let pool = pool(kind, size, Scrub::PunchHole)?;
                let populate = match mode {
                    PopulateMode::Lazy => Populate::Lazy,
                    PopulateMode::Eager => Populate::Eager,
                };
                let started = Instant::now();
                let memory = memory(&pool, size, populate)?;
                Ok((Ram::Pool(memory), started.elapsed()))
            }
            Subject::Plain { thp, prefault } => {
                warm_buddy(size, thp)?;
                let started = Instant::now();
                let align = if size >= GIB { GIB } else { 2 * MIB };
                let map = host::plain_memory(size, align, thp).map_err(|e| e.to_string())?;
                if prefault {
                    host::populate_write(map.addr(), map.len()).map_err(|e| e.to_string())?;
                }
                Ok((Ram::Plain(map), started.elapsed()))
            }
        }
    }

    /// The host address of guest address 0.
    pub fn host_addr(&self) -> usize {
        match self {
            Ram::Pool(memory) => memory.regions()[0].host_addr(),
            Ram::Plain(map) => map.addr(),
        }
    }

    /// The size in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Ram::Pool(memory) => memory.regions()[0].size(),
            Ram::Plain(map) => map.len() as u64,
        }
    }

    /// The guest memory, for pool RAM.
    pub fn memory(&self) -> Option<&GuestMemory> {
        match self {
            Ram::Pool(memory) => Some(memory),
            Ram::Plain(_) => None,
        }
    }
}
