//! Persistent zones: one host file that holds everything a VM's memory needs to outlive the VMM
//! process: a header, LLFree's persistent metadata, a directory of VMs (name, RAM layout,
//! persistent frame table, balloon piece bitmaps) and the frames (see `layout` for where).
//!
//! * Creation is crash-safe: the header says "being created" until the last step, and such a
//!   zone is never used ([`ZoneError::HalfCreated`]; `create` lays it out again).
//! * Every VM's frame table entry changes with one atomic store, ordered against the allocator:
//!   a frame is allocated, then published; unpublished, then freed.
//! * Opening a zone ([`Zone::open`]) recovers LLFree (deeply after a crash), finishes deletions
//!   cut short, and cross-checks every VM's frame table against the allocator: a frame allocated
//!   but referenced by no VM is scrubbed and freed (a crash between allocating and publishing,
//!   or unpublishing and freeing); a frame referenced but free is allocated again. Nothing is
//!   lost and nothing leaks.
//! * Several VMM processes use a zone at once (see `processes`): LLFree's state, both levels and
//!   the per-core slots, lives in the zone, and each process claims slots of its own. The first
//!   to open it recovers all of it as above; the others attach to it as it is and recover what
//!   dead processes left (their slots drained and their trees recounted, their VMs free to be
//!   attached again) while the rest go on. A VM is attached by one process at a time.
//! * A zone file may lie on any file system (tmpfs, hugetlbfs with 2 MiB or 1 GiB pages, a disk,
//!   a DAX file system with MAP_SYNC) or be a device DAX.
//! * What survives what: every store is in the file's pages at once, so a crash of the process
//!   loses nothing. A crash of the host keeps what was synced: layout changes are msynced, a
//!   guest's virtio-pmem flushes msync its memory; on DAX with MAP_SYNC every store is durable
//!   once it leaves the CPU caches (eADR platforms; LLFree's `clwb` mode is not used here).

mod copy;
mod directory;
mod layout;
mod map;
mod processes;
mod recovery;
mod vm_table;

pub use directory::{check_name, VmLayout, MAX_NAME, MAX_REGIONS};
pub use recovery::{RecoveryKind, RecoveryReport};

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use llfree::{Config, Init, InitError, LLFree, FRAME_SIZE};
use thiserror::Error;

use crate::pool::{BackingError, BackingFile, Frame, FrameSize, Member, Pool};
use crate::sys;
use directory::{DirectorySlot, SlotState};
use layout::{ZoneLayout, CREATING_MAGIC, MAGIC, PAGE, VERSION};
pub(crate) use map::ZoneWords;
use map::{ZoneMap, ZoneMetaRegion};
use processes::{OpenGuard, ProcessEntry, Table, MAX_PROCESSES, TABLE_OFFSET};
pub(crate) use vm_table::VmTable;
use vm_table::{Owner, DAMAGED, EMPTY};

/// The default number of VM slots of a new zone.
pub const DEFAULT_MAX_VMS: u64 = 16;

/// How many more looks a view of a zone that other processes use takes at frames that look
/// leaked or lost, and the pause before each: a frame must stay so for about half a second.
const SETTLE_LOOKS: usize = 10;
const SETTLE_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Errors of creating, opening and changing zones.
#[derive(Debug, Error)]
pub enum ZoneError {
    /// The file cannot be opened, locked or sized.
    #[error(transparent)]
    Backing(#[from] BackingError),
    /// The zone size is zero or not a multiple of the frame size.
    #[error(
        "zone size {} must be a non-zero multiple of the frame size ({frame})",
        size_text(*size)
    )]
    BadSize {
        /// The size asked for.
        size: u64,
        /// The frame size.
        frame: &'static str,
    },
    /// The slot count is out of range.
    #[error("a zone holds 1 to {max} VMs, not {0}", max = layout::MAX_VMS)]
    BadMaxVms(u64),
    /// The file system's pages are larger than the frames.
    #[error(
        "zone {path}: the file system's pages ({page} bytes) are larger than the frames ({frame})"
    )]
    PageSize {
        /// The zone file.
        path: PathBuf,
        /// Its page size.
        page: u64,
        /// The frame size.
        frame: &'static str,
    },
    /// `create` found a zone in the file.
    #[error("{0} already holds a zone (delete the file to create another)")]
    Exists(PathBuf),
    /// The file holds something else.
    #[error("{path} holds no zone (magic {magic:#018x})")]
    NotAZone {
        /// The file.
        path: PathBuf,
        /// The first word found.
        magic: u64,
    },
    /// There is no file (or device) at the path.
    #[error("zone {0} does not exist (create it with `vmm zone create`)")]
    Missing(PathBuf),
    /// The file is too short to hold even a zone's header.
    #[error("{0} holds no zone (it is empty or shorter than a zone's header)")]
    Empty(PathBuf),
    /// The zone's creation never finished.
    #[error(
        "{0}: the zone's creation never finished (the process creating it stopped); create it \
         again with `vmm zone create`"
    )]
    HalfCreated(PathBuf),
    /// Another layout version.
    #[error("{path}: zone version {found} is not supported (expected {VERSION})")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u64,
    },
    /// Recovery lost some of the VM's memory.
    #[error(
        "zone {path}: VM '{name}' is damaged: recovery could not find the memory of guest \
         physical {ranges} (its frame-table entries and their frames' owners were both \
         damaged); accept the loss with --accept-damaged (\"accept_damaged\": true in the \
         API), where the guest then reads zeroes, or delete the VM"
    )]
    Damaged {
        /// The VM.
        name: String,
        /// The zone file.
        path: PathBuf,
        /// The lost guest-physical ranges.
        ranges: String,
    },
    /// A directory slot is damaged (see `directory`): nothing is done to it, and no VM is
    /// created while it is there, until a person decides.
    #[error(
        "zone {path}: VM slot {slot} (recorded name '{name}') is damaged: {what}; its frames are \
         kept, and no VM is attached to it or created beside it until you decide: `vmm zone \
         inspect` shows it, `vmm zone accept-slot {path} {slot}` takes it as it reads, `vmm zone \
         delete-vm {path} --slot {slot}` deletes it"
    )]
    SlotDamaged {
        /// The zone file.
        path: PathBuf,
        /// The slot.
        slot: u64,
        /// Its name as recorded (perhaps damaged too).
        name: String,
        /// What is damaged.
        what: String,
    },
    /// `accept-slot` on a slot whose name or layout cannot be read, or that has no damage.
    #[error("zone {path}: VM slot {slot}: {why}")]
    CannotAccept {
        /// The zone file.
        path: PathBuf,
        /// The slot.
        slot: u64,
        /// Why.
        why: &'static str,
    },
    /// The zone's metadata is inconsistent.
    #[error("zone {path} is corrupted: {what}")]
    Corrupted {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The file or device is shorter than its zone.
    #[error("zone {path} needs {need} bytes, but the file or device holds {have} (truncated?)")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the zone needs.
        need: u64,
        /// Bytes the file has.
        have: u64,
    },
    /// Mapping, syncing or cleaning the zone failed.
    #[error("zone {path}: {what}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// LLFree refused the zone's metadata.
    #[error("zone {path}: allocator metadata: {source}")]
    Allocator {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: InitError,
    },
    /// A VM name is invalid.
    #[error("invalid VM name '{name}': {why}")]
    BadName {
        /// The name.
        name: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A VM's RAM does not fit the zone.
    #[error("VM '{name}' does not fit zone {path}: {why}")]
    BadLayout {
        /// The VM.
        name: String,
        /// The zone.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The VM exists with another RAM layout.
    #[error(
        "VM '{name}' in zone {path} has {recorded} MiB of guest memory (RAM and pmem) in {chunk} \
         chunks, not {requested} MiB: give the --memory and --pmem it was created with"
    )]
    LayoutMismatch {
        /// The VM.
        name: String,
        /// The zone.
        path: PathBuf,
        /// MiB recorded.
        recorded: u64,
        /// MiB requested.
        requested: u64,
        /// The chunk size.
        chunk: &'static str,
    },
    /// No such VM.
    #[error("zone {path} holds no VM named '{name}'")]
    NoSuchVm {
        /// The zone.
        path: PathBuf,
        /// The name.
        name: String,
    },
    /// Every slot is taken.
    #[error("zone {path} holds {max} VMs already (delete one with `vmm zone delete-vm`)")]
    Full {
        /// The zone.
        path: PathBuf,
        /// Its slots.
        max: u64,
    },
    /// The zone's process table is full.
    #[error("zone {}: {} processes have it open, the most it allows", .0.display(), processes::MAX_PROCESSES)]
    TooManyProcesses(PathBuf),
    /// The allocator has no run of free per-core slots this long.
    #[error("zone {}: no {cores} free allocator slots left (other VMMs hold the rest of its 256)", .path.display())]
    NoSlots {
        /// The zone.
        path: PathBuf,
        /// Slots asked for.
        cores: usize,
    },
    /// Other processes have the zone open (for what needs it alone).
    #[error("zone {} is open in processes {pids:?}: free frames are released only when no VMM uses it", .path.display())]
    OpenElsewhere {
        /// The zone.
        path: PathBuf,
        /// Their process ids.
        pids: Vec<u32>,
    },
    /// The VM is attached to a live process.
    #[error("VM '{name}' in zone {path} is in use by process {pid}")]
    VmInUse {
        /// The VM.
        name: String,
        /// The zone.
        path: PathBuf,
        /// The owner.
        pid: u32,
    },
    /// The VM is the base of clones whose processes live.
    #[error(
        "VM '{name}' in zone {path} is the base of running clones ({clones}): it loads or goes \
         only once they have ended"
    )]
    BaseInUse {
        /// The VM.
        name: String,
        /// The zone.
        path: PathBuf,
        /// The clones and their processes.
        clones: String,
    },
    /// The VM is a clone: it lives only while its process does, and bases no clone.
    #[error(
        "VM '{name}' in zone {path} is a clone of '{base}': it lives only while its process \
         does (load a clone of '{base}' instead)"
    )]
    IsClone {
        /// The VM.
        name: String,
        /// The zone.
        path: PathBuf,
        /// Its base.
        base: String,
    },
    /// The zone lies on a device DAX, which maps only shared: no clone maps it privately.
    #[error("zone {0} is a device DAX, which maps only shared: it bases no clones")]
    NoPrivateMappings(PathBuf),
    /// The zone ran out of frames while a kept clone was copied (the copy is deleted).
    #[error("zone {path} has no free frame left for the copy '{name}' of its base")]
    NoFrameForCopy {
        /// The zone.
        path: PathBuf,
        /// The copy.
        name: String,
    },
    /// A clone was asked for under a name the zone has already.
    #[error("zone {path} holds a VM named '{name}' already: each clone needs a name of its own")]
    NameTaken {
        /// The name.
        name: String,
        /// The zone.
        path: PathBuf,
    },
}

/// Parameters of a new zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneConfig {
    /// Bytes of frames.
    pub size: u64,
    /// The frame size.
    pub frame_size: FrameSize,
    /// VM slots.
    pub max_vms: u64,
}

/// An open zone: its pool of frames and its VM directory. Share it with `Arc`.
#[derive(Debug)]
pub struct Zone {
    path: PathBuf,
    pool: Arc<Pool>,
    map: Arc<ZoneMap>,
    layout: ZoneLayout,
    /// This process's token in the zone (see `processes`).
    token: u64,
    recovery: RecoveryReport,
}

/// A process that has a zone open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneProcess {
    /// Its process id.
    pub pid: u32,
    /// Whether it is this process.
    pub this: bool,
}

/// A process's membership in a zone, which the zone's pool ends when it is dropped (after
/// every user of the pool): its allocator slots are given back, its table entry removed, and
/// the last process to leave marks the allocator shut down cleanly.
pub(crate) struct Membership {
    map: Arc<ZoneMap>,
    entry: ProcessEntry,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("entry", &self.entry)
            .finish_non_exhaustive()
    }
}

impl Member for Membership {
    /// Leaves the zone (see the type's docs).
    fn leave(&self, llfree: &LLFree, file: &std::fs::File) {
        let Ok(guard) = OpenGuard::lock(file) else {
            // The process exits soon: the kernel drops its locks, the next open recovers.
            return;
        };
        llfree.release_slots(self.entry.token);
        let table = Table::new(self.map.words(TABLE_OFFSET, MAX_PROCESSES as u64 * 2));
        let _ = table.remove(file, self.entry.index);
        if guard.alone().unwrap_or(false) {
            llfree.mark_clean();
        }
        let _ = guard.leave();
    }
}

/// A zone's frames and each VM's share ([`Zone::usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneUsage {
    /// Bytes of frames.
    pub frame_size: FrameSize,
    /// Frames for VMs.
    pub frames: u64,
    /// Free frames.
    pub free_frames: u64,
    /// Its VMs, by name.
    pub vms: Vec<VmInfo>,
}

/// One VM of a zone and its place in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmInfo {
    /// The name.
    pub name: String,
    /// Its identity, drawn at random when it was created.
    pub id: u64,
    /// Its RAM.
    pub layout: VmLayout,
    /// Chunks backed by a frame.
    pub frames: u64,
    /// 4 KiB pieces given to the balloon.
    pub given_away_pieces: u64,
    /// The process attached to it, if any.
    pub owner: Option<u32>,
    /// Since when (milliseconds since the Unix epoch) and for how many bytes the VM waits for
    /// memory, as its live VMM recorded.
    pub waiting: Option<(u64, u64)>,
    /// Guest-physical ranges (address, size) whose memory recovery lost (see
    /// [`ZoneError::Damaged`]).
    pub damaged: Vec<(u64, u64)>,
    /// The VM whose frames this one maps, where it is a clone (its `frames` are its own).
    pub clone_of: Option<String>,
}

/// A directory slot with damage, as `vmm zone inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedSlot {
    /// The slot.
    pub slot: u64,
    /// Its VM's name as recorded, if it reads as one (perhaps damaged too).
    pub name: Option<String>,
    /// What is damaged.
    pub what: String,
    /// The frames its table names, which stay allocated.
    pub frames: u64,
}

/// What `vmm zone inspect` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneInfo {
    /// The zone's identity.
    pub id: u128,
    /// Bytes of frames.
    pub size: u64,
    /// The frame size.
    pub frame_size: FrameSize,
    /// Frames (of the frame size).
    pub frames: u64,
    /// Free frames.
    pub free_frames: u64,
    /// VM slots.
    pub max_vms: u64,
    /// The VMs, by name.
    pub vms: Vec<VmInfo>,
    /// The slots with damage, which hold their frames until a person decides.
    pub damaged_slots: Vec<DamagedSlot>,
    /// What opening the zone recovered.
    pub recovery: RecoveryReport,
    /// Frames allocated that no VM references, now (after recovery: 0).
    pub leaked_frames: u64,
    /// Frames a VM references that the allocator counts free, now (after recovery: 0).
    pub lost_frames: u64,
    /// Whether the zone is mapped with MAP_SYNC (a file on a DAX file system): stores to its
    /// metadata and frames are durable without msync.
    pub map_sync: bool,
    /// The processes that have the zone open, this one included.
    pub processes: Vec<ZoneProcess>,
}

impl Zone {
    /// Creates a zone in `path` (a new or empty file, a zero-filled device, or a zone whose
    /// creation never finished). A file that holds a zone or anything else is refused
    /// untouched.
    pub fn create(path: &Path, config: &ZoneConfig) -> Result<(), ZoneError> {
        let frame = config.frame_size;
        if config.size == 0 || !config.size.is_multiple_of(frame.bytes()) {
            return Err(ZoneError::BadSize {
                size: config.size,
                frame: frame.name(),
            });
        }
        if config.max_vms == 0 || config.max_vms > layout::MAX_VMS {
            return Err(ZoneError::BadMaxVms(config.max_vms));
        }
        // Created exclusively: a file another process made meanwhile is opened as it is (and
        // refused if it holds a zone), and never removed.
        let file = BackingFile::open(path, true)?;
        let created = file.created();
        let result = Self::create_in(path, config, file);
        if let (Err(_), Some(created)) = (&result, created) {
            // Leave nothing behind of a zone that was never made.
            created.remove(path);
        }
        result
    }

    fn create_in(path: &Path, config: &ZoneConfig, file: BackingFile) -> Result<(), ZoneError> {
        let frame = config.frame_size;
        check_page_size(path, &file, frame)?;
        let io_err = |what| io_error(path, what);
        if file.had_contents {
            let first = ZoneMap::new(file.raw_fd(), file.page_size, false, file.durability)
                .map_err(io_err("cannot map the header"))?;
            match first.header().magic.load(Ordering::Acquire) {
                0 => {}
                CREATING_MAGIC => log::warn!(
                    "{}: the zone's creation never finished; creating it again",
                    path.display()
                ),
                MAGIC => return Err(ZoneError::Exists(path.to_owned())),
                magic => {
                    return Err(ZoneError::NotAZone {
                        path: path.to_owned(),
                        magic,
                    })
                }
            }
        }
        let frames = config.size / FRAME_SIZE as u64;
        let layout = ZoneLayout::new(frame, frames, config.max_vms, file.page_size);
        file.ensure_len(path, layout.total_len(), true)?;
        let map = Arc::new(
            ZoneMap::of_file(&file, layout.data_off).map_err(io_err("cannot map the metadata"))?,
        );
        let header = map.header();
        header.magic.store(CREATING_MAGIC, Ordering::Release);
        map.sync(0, PAGE)
            .map_err(io_err("cannot sync the header"))?;
        // The directory and the tables start zeroed; the frames start clean.
        let tables = layout.dir_off..layout.data_off;
        if file.can_punch && !file.hugetlb {
            sys::punch_hole(file.as_file(), tables.start, tables.end - tables.start)
                .map_err(io_err("cannot clear the directory"))?;
        } else {
            map.zero(tables.start, tables.end - tables.start);
        }
        let region = ZoneMetaRegion::new(Arc::clone(&map), layout);
        let llfree = LLFree::persistent(
            Config::new(1, frames as usize),
            Box::new(region),
            Init::Fresh,
        )
        .map_err(|source| ZoneError::Allocator {
            path: path.to_owned(),
            source,
        })?;
        let pool = Pool::assemble(llfree, file, layout.data_off, frame, 0..1, None);
        scrub_all(&pool, frames).map_err(io_err("cannot clean the frames"))?;
        layout.write(header);
        Table::new(map.words(TABLE_OFFSET, MAX_PROCESSES as u64 * 2)).clear();
        for word in &header.id {
            let id = sys::random_u64().map_err(io_err("cannot draw the zone's identity"))?;
            word.store(id, Ordering::Relaxed);
        }
        map.sync(0, layout.data_off)
            .map_err(io_err("cannot sync the metadata"))?;
        header.magic.store(MAGIC, Ordering::Release);
        map.sync(0, PAGE)
            .map_err(io_err("cannot sync the header"))?;
        // Only now: the pool holds the file's lock, which keeps other processes out until the
        // zone is complete; dropping it marks the allocator shut down cleanly.
        drop(pool);
        Ok(())
    }

    /// Opens the zone in `path` for a process that allocates with `cores` LLFree cores (claimed
    /// in the zone for this process): alone, it recovers the allocator, finishes interrupted
    /// deletions and cross-checks every VM's frame table (see the module docs); beside other
    /// processes, it attaches and recovers what dead ones left. Fails with a clear error on
    /// anything that is not a complete zone of this version, or whose metadata is inconsistent.
    pub fn open(path: &Path, cores: usize) -> Result<Arc<Self>, ZoneError> {
        let started = Instant::now();
        let file = BackingFile::open_shared(path).map_err(|e| match e {
            BackingError::File { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                ZoneError::Missing(path.to_owned())
            }
            e => e.into(),
        })?;
        // Reading a header past the end of the file would fault (SIGBUS).
        if file.len() < PAGE {
            return Err(ZoneError::Empty(path.to_owned()));
        }
        let io_err = |what| io_error(path, what);
        let first = ZoneMap::new(
            file.raw_fd(),
            file.page_size.max(PAGE),
            false,
            file.durability,
        )
        .map_err(io_err("cannot map the header"))?;
        let layout = read_header(path, first.header())?;
        drop(first);
        check_page_size(path, &file, layout.frame_size)?;
        if !layout.data_off.is_multiple_of(file.page_size) {
            return Err(corrupted(
                path,
                "its frames are not aligned to the file system's pages",
            ));
        }
        // A file or device shorter than its header says would fault (SIGBUS) on access.
        if file.len() < layout.total_len() {
            return Err(ZoneError::Truncated {
                path: path.to_owned(),
                need: layout.total_len(),
                have: file.len(),
            });
        }
        let map = Arc::new(
            ZoneMap::of_file(&file, layout.data_off).map_err(io_err("cannot map the metadata"))?,
        );
        let guard = OpenGuard::lock(file.as_file()).map_err(io_err("cannot lock"))?;
        let alone = guard.alone().map_err(io_err("cannot lock"))?;
        let region = ZoneMetaRegion::new(Arc::clone(&map), layout);
        let config = Config {
            shared: true,
            ..Config::new(1, layout.frames as usize)
        };
        let init = if alone { Init::Recover } else { Init::Attach };
        let llfree = LLFree::persistent(config, Box::new(region), init).map_err(|source| {
            ZoneError::Allocator {
                path: path.to_owned(),
                source,
            }
        })?;
        let kind = RecoveryKind::from(llfree.recovery());
        let table = Table::new(map.words(TABLE_OFFSET, MAX_PROCESSES as u64 * 2));
        if alone {
            table.clear();
        }
        let token = loop {
            let token = sys::random_u64().map_err(io_err("cannot draw a process token"))?
                & directory::MAX_CHECKED_VALUE;
            if token != 0 {
                break token;
            }
        };
        let entry = table
            .join(file.as_file(), token)
            .map_err(io_err("cannot lock"))?
            .ok_or_else(|| ZoneError::TooManyProcesses(path.to_owned()))?;
        let cores = cores.max(1);
        let Some(first_core) = llfree.claim_slots(token, cores) else {
            let _ = table.remove(file.as_file(), entry.index);
            return Err(ZoneError::NoSlots {
                path: path.to_owned(),
                cores,
            });
        };
        let membership = Membership {
            map: Arc::clone(&map),
            entry,
        };
        let pool = Pool::assemble(
            llfree,
            file,
            layout.data_off,
            layout.frame_size,
            first_core.0..first_core.0 + cores,
            Some(Box::new(membership)),
        );
        let mut zone = Self {
            path: path.to_owned(),
            pool,
            map,
            layout,
            token,
            recovery: RecoveryReport::default(),
        };
        let recovered = match alone {
            true => zone.recover()?,
            false => recovery::Recovered::default(),
        };
        let dead = zone.recover_dead_locked()?;
        guard.share().map_err(io_err("cannot lock"))?;
        drop(guard);
        zone.recovery = RecoveryReport {
            kind,
            leaked_frames: recovered.leaked,
            lost_frames: recovered.lost,
            repaired_entries: recovered.repair.repaired,
            damaged_chunks: recovered.repair.damaged,
            orphaned_frames: recovered.orphaned,
            dead_processes: dead,
            nanos: started.elapsed().as_nanos() as u64,
        };
        zone.recovery.record(zone.map.header());
        Ok(Arc::new(zone))
    }

    /// The process table.
    fn processes_table(&self) -> Table<'_> {
        Table::new(self.map.words(TABLE_OFFSET, MAX_PROCESSES as u64 * 2))
    }

    /// Recovers what processes that died with the zone open left: the allocator slots they
    /// held (reservations drained, trees recounted) and their VMs (free to be attached again;
    /// their frames stay theirs). The other processes go on meanwhile. Returns how many dead
    /// processes there were.
    pub fn recover_dead_processes(&self) -> Result<u64, ZoneError> {
        let file = self.pool.backing_file().as_file();
        let _guard = OpenGuard::lock(file).map_err(self.io_err("cannot lock"))?;
        self.recover_dead_locked()
    }

    fn recover_dead_locked(&self) -> Result<u64, ZoneError> {
        let file = self.pool.backing_file().as_file();
        let table = self.processes_table();
        let dead: Vec<_> = table
            .entries(file)
            .map_err(self.io_err("cannot lock"))?
            .into_iter()
            .filter(|p| !p.alive && p.token != self.token)
            .collect();
        for process in &dead {
            let slots = self.pool.allocator().recover_slots(process.token);
            for index in 0..self.layout.max_vms {
                let slot = self.slot(index);
                let usage = self.slot_use(index);
                if !matches!(usage, recovery::SlotUse::Vm(_)) || slot.owner() != process.token {
                    continue;
                }
                match slot.ephemeral() {
                    true => {
                        self.finish_deletion(index, true);
                    }
                    false => slot.set_owner(0),
                }
            }
            table
                .remove(file, process.index)
                .map_err(self.io_err("cannot lock"))?;
            log::warn!(
                "zone {}: process {} died with the zone open: recovered its {} allocator slots \
                 ({} trees recounted, counter drift {}); its VMs can be attached again",
                self.path.display(),
                process.pid,
                slots.slots,
                slots.trees,
                slots.counter_drift
            );
        }
        Ok(dead.len() as u64)
    }

    /// The process id of the live process named by `token`, if it is one.
    fn live_pid(&self, token: u64) -> Option<u32> {
        match token {
            0 => return None,
            // This process's own lock is invisible to it.
            own if own == self.token => return Some(std::process::id()),
            _ => {}
        }
        let file = self.pool.backing_file().as_file();
        self.processes_table()
            .live(file, token)
            .ok()
            .flatten()
            .map(|process| process.pid)
    }

    /// The processes that have the zone open now, this one included.
    pub fn processes(&self) -> Result<Vec<ZoneProcess>, ZoneError> {
        let file = self.pool.backing_file().as_file();
        Ok(self
            .processes_table()
            .entries(file)
            .map_err(self.io_err("cannot lock"))?
            .into_iter()
            .filter(|p| p.alive || p.token == self.token)
            .map(|p| ZoneProcess {
                pid: p.pid,
                this: p.token == self.token,
            })
            .collect())
    }

    /// The zone file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pool of the zone's frames.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The frame size.
    pub fn frame_size(&self) -> FrameSize {
        self.layout.frame_size
    }

    /// What opening the zone recovered.
    pub fn recovery(&self) -> RecoveryReport {
        self.recovery
    }

    /// The zone's identity, drawn at random when it was created.
    pub fn id(&self) -> u128 {
        let [low, high] = &self.map.header().id;
        u128::from(low.load(Ordering::Relaxed)) | u128::from(high.load(Ordering::Relaxed)) << 64
    }

    fn slot(&self, index: u64) -> DirectorySlot<'_> {
        DirectorySlot::new(self.map.words(self.layout.dir_off + index * PAGE, PAGE / 8))
    }

    /// The frame-table words of slot `index` (one per chunk the zone allows).
    fn table_offset(&self, index: u64) -> u64 {
        self.layout.tables_off + index * self.layout.slot_tables
    }

    /// The piece-bitmap offset of slot `index`.
    fn pieces_offset(&self, index: u64) -> u64 {
        self.table_offset(index) + self.layout.vm_chunks() * 8
    }

    fn table(&self, index: u64) -> &[std::sync::atomic::AtomicU64] {
        self.map
            .words(self.table_offset(index), self.layout.vm_chunks())
    }

    /// The owner map: for every frame, the VM chunk it backs (see `vm_table`).
    fn owners(&self) -> &[std::sync::atomic::AtomicU64] {
        self.map
            .words(self.layout.owners_off, self.layout.vm_chunks())
    }

    /// The guest-physical ranges of the chunks of slot `index` (a VM of `layout`) that recovery
    /// marked damaged, adjacent ones merged.
    fn damaged_ranges(&self, index: u64, layout: &VmLayout) -> Vec<(u64, u64)> {
        let chunk_bytes = layout.chunk_size.bytes();
        let table = self.table(index);
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut chunk = 0;
        for &(start, size) in &layout.regions {
            for offset in (0..size).step_by(chunk_bytes as usize) {
                if table[chunk].load(Ordering::Acquire) == DAMAGED {
                    let address = start + offset;
                    match ranges.last_mut() {
                        Some((first, len)) if *first + *len == address => *len += chunk_bytes,
                        _ => ranges.push((address, chunk_bytes)),
                    }
                }
                chunk += 1;
            }
        }
        ranges
    }

    /// Accepts the loss of the memory that recovery could not find for the VM called `name`
    /// (see [`ZoneError::Damaged`]): its damaged chunks become unpopulated (the guest reads
    /// zeroes there). Returns the guest-physical ranges as (address, size): none when the zone
    /// has no VM of that name (yet).
    pub fn accept_damage(&self, name: &str) -> Result<Vec<(u64, u64)>, ZoneError> {
        let _guard = OpenGuard::lock(self.pool.backing_file().as_file())
            .map_err(self.io_err("cannot lock"))?;
        let Some(index) = self.find(name) else {
            return Ok(Vec::new());
        };
        let layout = self
            .slot(index)
            .layout(&self.layout)
            .expect("checked when opened");
        let ranges = self.damaged_ranges(index, &layout);
        for entry in self.table(index) {
            let _ = entry.compare_exchange(DAMAGED, EMPTY, Ordering::AcqRel, Ordering::Relaxed);
        }
        self.map
            .sync(self.table_offset(index), self.layout.vm_chunks() * 8)
            .map_err(self.io_err("cannot sync the VM's frame table"))?;
        Ok(ranges)
    }

    /// The slot index of the VM called `name` (its slot without damage).
    fn find(&self, name: &str) -> Option<u64> {
        (0..self.layout.max_vms).find(|&i| {
            matches!(self.slot_use(i), recovery::SlotUse::Vm(_))
                && self.slot(i).name().as_deref() == Some(name)
        })
    }

    /// The quarantined slots: the one whose recorded name is `name` first, if any.
    fn quarantined(&self, name: &str) -> Vec<u64> {
        let mut slots: Vec<u64> = (0..self.layout.max_vms)
            .filter(|&i| self.slot_use(i) == recovery::SlotUse::Quarantined)
            .collect();
        slots.sort_by_key(|&i| self.slot(i).name().as_deref() != Some(name));
        slots
    }

    /// The error of attaching or creating `name` beside quarantined slot `index`.
    fn slot_damaged(&self, index: u64) -> ZoneError {
        ZoneError::SlotDamaged {
            path: self.path.clone(),
            slot: index,
            name: self.slot(index).name().unwrap_or_default(),
            what: self.slot_damage(index),
        }
    }

    /// The persistent frame table of region `region` of the VM in slot `index`, of `layout`.
    fn vm_table(&self, index: u64, layout: &VmLayout, region: usize) -> VmTable {
        let chunks = layout.regions[region].1 / layout.chunk_size.bytes();
        let first = first_chunk(layout, region);
        VmTable::new(
            ZoneWords::new(
                Arc::clone(&self.map),
                self.table_offset(index) + first * 8,
                chunks,
            ),
            ZoneWords::new(
                Arc::clone(&self.map),
                self.layout.owners_off,
                self.layout.vm_chunks(),
            ),
            Owner {
                slot: index,
                chunk: first,
            },
            self.layout.frame_size.base_frames(),
        )
    }

    fn io_err(&self, what: &'static str) -> impl FnOnce(io::Error) -> ZoneError + '_ {
        io_error(&self.path, what)
    }

    /// Attaches this process to the VM called `name`, creating it with `layout` if the zone has
    /// none of that name; an existing VM must have the same layout.
    pub fn attach(self: &Arc<Self>, name: &str, layout: &VmLayout) -> Result<ZoneVm, ZoneError> {
        check_name(name).map_err(|why| ZoneError::BadName {
            name: name.to_owned(),
            why,
        })?;
        directory::check_layout(layout, &self.layout).map_err(|why| ZoneError::BadLayout {
            name: name.to_owned(),
            path: self.path.clone(),
            why,
        })?;
        // The directory changes one process at a time: two processes creating VMs would take
        // the same free slot.
        let _guard = OpenGuard::lock(self.pool.backing_file().as_file())
            .map_err(self.io_err("cannot lock"))?;
        let index = match self.find(name) {
            Some(index) => {
                let slot = self.slot(index);
                let recorded = slot.layout(&self.layout).expect("checked when opened");
                if recorded != *layout {
                    return Err(ZoneError::LayoutMismatch {
                        name: name.to_owned(),
                        path: self.path.clone(),
                        recorded: recorded.bytes() >> 20,
                        requested: layout.bytes() >> 20,
                        chunk: self.layout.frame_size.name(),
                    });
                }
                let damaged = self.damaged_ranges(index, &recorded);
                if !damaged.is_empty() {
                    return Err(ZoneError::Damaged {
                        name: name.to_owned(),
                        path: self.path.clone(),
                        ranges: format_ranges(&damaged),
                    });
                }
                let owner = slot.owner();
                if owner != 0 && owner != self.token {
                    if let Some(pid) = self.live_pid(owner) {
                        return Err(ZoneError::VmInUse {
                            name: name.to_owned(),
                            path: self.path.clone(),
                            pid,
                        });
                    }
                }
                self.check_no_clone_ties(index, name)?;
                index
            }
            // A VM of a damaged slot would start anew in another: no VM is created while one
            // is there.
            None => match self.quarantined(name).first() {
                Some(&index) => return Err(self.slot_damaged(index)),
                None => self.create_vm(name, layout, None)?,
            },
        };
        self.slot(index).set_owner(self.token);
        Ok(ZoneVm {
            zone: Arc::clone(self),
            index,
            name: name.to_owned(),
            layout: layout.clone(),
            base: None,
        })
    }

    /// Attaches this process to a new clone of VM `base`, called `name`: an ephemeral VM of
    /// the base's layout whose guest memory maps the base's frames privately (see
    /// [`CloneBase`]) and takes frames of its own only for what the base did not populate or
    /// its guest gave back. The base stays as it is: while a clone's process lives, the base
    /// is neither attached nor deleted ([`ZoneError::BaseInUse`]); a clone that ends or dies is
    /// deleted with its own frames, never the base's. The base must have no live process.
    pub fn attach_clone(self: &Arc<Self>, base: &str, name: &str) -> Result<ZoneVm, ZoneError> {
        check_name(name).map_err(|why| ZoneError::BadName {
            name: name.to_owned(),
            why,
        })?;
        // Only a device DAX cannot punch holes, and it maps only shared.
        if !self.pool.backing_file().can_punch {
            return Err(ZoneError::NoPrivateMappings(self.path.clone()));
        }
        let _guard = OpenGuard::lock(self.pool.backing_file().as_file())
            .map_err(self.io_err("cannot lock"))?;
        let base_index = self.find(base).ok_or_else(|| ZoneError::NoSuchVm {
            path: self.path.clone(),
            name: base.to_owned(),
        })?;
        let base_slot = self.slot(base_index);
        let layout = base_slot.layout(&self.layout).expect("checked when opened");
        if let Some(of) = base_slot.clone_base() {
            return Err(ZoneError::IsClone {
                name: base.to_owned(),
                path: self.path.clone(),
                base: self.slot(of).name().unwrap_or_else(|| format!("#{of}")),
            });
        }
        let damaged = self.damaged_ranges(base_index, &layout);
        if !damaged.is_empty() {
            return Err(ZoneError::Damaged {
                name: base.to_owned(),
                path: self.path.clone(),
                ranges: format_ranges(&damaged),
            });
        }
        if let Some(pid) = self.live_pid(base_slot.owner()) {
            return Err(ZoneError::VmInUse {
                name: base.to_owned(),
                path: self.path.clone(),
                pid,
            });
        }
        if self.find(name).is_some() || !self.quarantined(name).is_empty() {
            return Err(ZoneError::NameTaken {
                name: name.to_owned(),
                path: self.path.clone(),
            });
        }
        let index = self.create_vm(name, &layout, Some(base_index))?;
        Ok(ZoneVm {
            zone: Arc::clone(self),
            index,
            name: name.to_owned(),
            base: Some(CloneBase {
                index: base_index,
                name: base.to_owned(),
                id: base_slot.id(),
                seal: base_slot.seal(),
                layout: layout.clone(),
            }),
            layout,
        })
    }

    /// Refuses to attach or delete the VM of slot `index` where it is a clone, or the base
    /// of clones whose processes live.
    fn check_no_clone_ties(&self, index: u64, name: &str) -> Result<(), ZoneError> {
        if let Some(base) = self.slot(index).clone_base() {
            return Err(ZoneError::IsClone {
                name: name.to_owned(),
                path: self.path.clone(),
                base: self.slot(base).name().unwrap_or_else(|| format!("#{base}")),
            });
        }
        let clones: Vec<String> = (0..self.layout.max_vms)
            .filter(|&i| {
                matches!(self.slot_use(i), recovery::SlotUse::Vm(_))
                    && self.slot(i).clone_base() == Some(index)
            })
            .filter_map(|i| {
                let pid = self.live_pid(self.slot(i).owner())?;
                let clone = self.slot(i).name().unwrap_or_else(|| format!("#{i}"));
                Some(format!("'{clone}' in process {pid}"))
            })
            .collect();
        const NAMED: usize = 4;
        let named = match clones.len() {
            0 => return Ok(()),
            n if n > NAMED => format!("{} and {} more", clones[..NAMED].join(", "), n - NAMED),
            _ => clones.join(", "),
        };
        Err(ZoneError::BaseInUse {
            name: name.to_owned(),
            path: self.path.clone(),
            clones: named,
        })
    }

    /// Puts a new VM into a free slot: its tables are zeroed and its fields written (and
    /// synced) before it is published. A clone of the VM in slot `clone_of` is published
    /// ephemeral and owned by this process, so that it never outlives its process.
    fn create_vm(
        &self,
        name: &str,
        layout: &VmLayout,
        clone_of: Option<u64>,
    ) -> Result<u64, ZoneError> {
        let index = (0..self.layout.max_vms)
            .find(|&i| self.slot(i).state() == SlotState::Free && self.slot(i).damage().is_none())
            .ok_or(ZoneError::Full {
                path: self.path.clone(),
                max: self.layout.max_vms,
            })?;
        let slot = self.slot(index);
        slot.begin_creation();
        let tables = self.table_offset(index);
        self.map.zero(tables, self.layout.slot_tables);
        let id = sys::random_u64().map_err(self.io_err("cannot draw the VM's identity"))?;
        slot.write(name, layout, id);
        if let Some(base) = clone_of {
            slot.set_clone_of(base);
            slot.set_owner(self.token);
        }
        let sync = self.io_err("cannot sync the directory");
        self.map
            .sync(tables, self.layout.slot_tables)
            .and_then(|()| self.map.sync(self.layout.dir_off + index * PAGE, PAGE))
            .map_err(sync)?;
        slot.activate();
        self.map
            .sync(self.layout.dir_off + index * PAGE, PAGE)
            .map_err(self.io_err("cannot sync the directory"))?;
        Ok(index)
    }

    /// Deletes the VM called `name`: its frames are scrubbed and go back to the pool, its slot
    /// is freed. Returns how many frames it held.
    pub fn delete_vm(&self, name: &str) -> Result<u64, ZoneError> {
        let _guard = OpenGuard::lock(self.pool.backing_file().as_file())
            .map_err(self.io_err("cannot lock"))?;
        let damaged = self
            .quarantined(name)
            .into_iter()
            .find(|&i| self.slot(i).name().as_deref() == Some(name));
        let index = self
            .find(name)
            .or(damaged)
            .ok_or_else(|| ZoneError::NoSuchVm {
                path: self.path.clone(),
                name: name.to_owned(),
            })?;
        self.delete_locked(index, name)
    }

    /// Deletes the VM of directory slot `slot`, damaged or not (see [`Self::delete_vm`]).
    pub fn delete_slot(&self, slot: u64) -> Result<u64, ZoneError> {
        let _guard = OpenGuard::lock(self.pool.backing_file().as_file())
            .map_err(self.io_err("cannot lock"))?;
        let name = self.slot_name(slot)?;
        if self.slot_use(slot) == recovery::SlotUse::Unused {
            return Err(ZoneError::NoSuchVm {
                path: self.path.clone(),
                name: format!("#{slot}"),
            });
        }
        self.delete_locked(slot, &name)
    }

    /// The name slot `slot` records, for messages ("#N" where it reads as none).
    fn slot_name(&self, slot: u64) -> Result<String, ZoneError> {
        if slot >= self.layout.max_vms {
            return Err(ZoneError::NoSuchVm {
                path: self.path.clone(),
                name: format!("#{slot}"),
            });
        }
        Ok(self.slot(slot).name().unwrap_or_else(|| format!("#{slot}")))
    }

    fn delete_locked(&self, index: u64, name: &str) -> Result<u64, ZoneError> {
        let slot = self.slot(index);
        if let Some(pid) = self.live_pid(slot.owner()) {
            return Err(ZoneError::VmInUse {
                name: name.to_owned(),
                path: self.path.clone(),
                pid,
            });
        }
        if slot.clone_base().is_none() {
            self.check_no_clone_ties(index, name)?;
        }
        let quarantined = self.slot_use(index) == recovery::SlotUse::Quarantined;
        slot.mark_deleting();
        self.map
            .sync(self.layout.dir_off + index * PAGE, PAGE)
            .map_err(self.io_err("cannot sync the directory"))?;
        let mut frames = 0;
        if quarantined {
            // Its table may be what was damaged: the frames whose owners name it go too.
            frames += self.free_owned_by(index);
        }
        Ok(frames + self.finish_deletion(index, true))
    }

    /// Scrubs and frees every frame whose owner names slot `index` (being deleted); returns how
    /// many. Its table's entries for them are cleared.
    fn free_owned_by(&self, index: u64) -> u64 {
        let base = self.layout.frame_size.base_frames();
        let mut freed = 0;
        for (bit, owner) in self.owners().iter().enumerate() {
            let Some(named) = Owner::from_word(owner.load(Ordering::Acquire)) else {
                continue;
            };
            if named.slot != index {
                continue;
            }
            let frame = Frame {
                index: bit as u64 * base,
                size: self.layout.frame_size,
            };
            if let Some(entry) = self.table(index).get(named.chunk as usize) {
                entry.store(EMPTY, Ordering::Release);
            }
            let scrubbed = self.pool.scrub(frame).is_ok();
            owner.store(0, Ordering::Release);
            if scrubbed {
                let _ = self.pool.free(self.pool.own_core(), frame);
                freed += 1;
            }
        }
        freed
    }

    /// Takes damaged directory slot `slot` as it reads (see [`ZoneError::SlotDamaged`]): its
    /// record's checksum is written anew and every other damaged word reset to what a VM
    /// without a process has (no owner, no seal, not ephemeral); its VM can be attached again.
    /// Returns its name. Refused where its name or RAM layout cannot be read.
    pub fn accept_slot(&self, slot: u64) -> Result<String, ZoneError> {
        let _guard = OpenGuard::lock(self.pool.backing_file().as_file())
            .map_err(self.io_err("cannot lock"))?;
        let refuse = |why| ZoneError::CannotAccept {
            path: self.path.clone(),
            slot,
            why,
        };
        self.slot_name(slot)?;
        if self.slot_use(slot) != recovery::SlotUse::Quarantined {
            return Err(refuse("it has no damage"));
        }
        let entry = self.slot(slot);
        let (Some(name), Some(_)) = (entry.name(), entry.layout(&self.layout)) else {
            return Err(refuse(
                "its name or RAM layout cannot be read; delete it (`vmm zone delete-vm --slot`)",
            ));
        };
        entry.accept_as_read();
        self.map
            .sync(self.layout.dir_off + slot * PAGE, PAGE)
            .map_err(self.io_err("cannot sync the directory"))?;
        Ok(name)
    }

    /// Clears the frame table of slot `index` (being deleted), scrubbing each frame its owner
    /// confirms and freeing it with `free` (after a crash the cross-check frees them instead),
    /// then frees the slot. Returns how many entries referenced a frame.
    fn finish_deletion(&self, index: u64, free: bool) -> u64 {
        let mut frames = 0;
        let base = self.layout.frame_size.base_frames();
        let owners = self.owners();
        for (chunk, entry) in self.table(index).iter().enumerate() {
            let value = entry.load(Ordering::Acquire);
            let Some(frame) = vm_table::entry_frame(value, base, self.layout.frames) else {
                entry.store(EMPTY, Ordering::Release);
                continue;
            };
            frames += 1;
            let frame = Frame {
                index: frame,
                size: self.layout.frame_size,
            };
            let owner = &owners[(frame.index / base) as usize];
            let word = Owner {
                slot: index,
                chunk: chunk as u64,
            }
            .word();
            // Scrubbed first: a frame that holds data and that nobody names is damage (see
            // `recovery`). Only a frame whose owner confirms it: a damaged entry may name
            // another VM's. A frame that cannot be scrubbed stays; the next open frees it.
            let ours = owner.load(Ordering::Acquire) == word;
            let scrubbed = ours && self.pool.scrub(frame).is_ok();
            // The owner before the entry: a deletion cut short leaves no owner naming a freed
            // slot (which a new VM may take).
            if ours {
                owner.store(0, Ordering::Release);
            }
            entry.store(EMPTY, Ordering::Release);
            if scrubbed && free {
                let _ = self.pool.free(self.pool.own_core(), frame);
            }
        }
        self.map
            .zero(self.table_offset(index), self.layout.slot_tables);
        let slot = self.slot(index);
        slot.set_owner(0);
        slot.release();
        let _ = self.map.sync(self.layout.dir_off + index * PAGE, PAGE);
        frames
    }

    /// Releases the host memory of every free frame (punches it out of the file; on a device,
    /// nothing). Returns how many frames that were. Only while no other process has the zone
    /// open (one could allocate a frame between the check and the punch); new opens wait.
    pub fn release_free_frames(&self) -> Result<u64, ZoneError> {
        let file = self.pool.backing_file().as_file();
        let _guard = OpenGuard::lock(file).map_err(self.io_err("cannot lock"))?;
        let others: Vec<u32> = self
            .processes()?
            .iter()
            .filter(|p| !p.this)
            .map(|p| p.pid)
            .collect();
        if !others.is_empty() {
            return Err(ZoneError::OpenElsewhere {
                path: self.path.clone(),
                pids: others,
            });
        }
        if !self.pool.backing_file().can_punch {
            return Ok(0);
        }
        let size = self.layout.frame_size;
        let mut released = 0;
        for index in (0..self.layout.frames).step_by(size.base_frames() as usize) {
            let id = llfree::FrameId(index as usize);
            if self.pool.allocator().is_free(id, size.order()) {
                self.pool
                    .scrub(Frame { index, size })
                    .map_err(self.io_err("cannot release a free frame"))?;
                released += 1;
            }
        }
        Ok(released)
    }

    /// The spare bytes of the VMs attached to a live VMM, as their VMMs last recorded them
    /// ([`ZoneVm::set_spare`], each weighted as its VMM weighs it): what a reclaim policy
    /// shares a deficit by.
    pub fn spare_total(&self) -> u64 {
        (0..self.layout.max_vms)
            .filter(|&index| matches!(self.slot_use(index), recovery::SlotUse::Vm(_)))
            .map(|index| self.slot(index))
            .filter(|slot| self.live_pid(slot.owner()).is_some())
            .map(|slot| slot.spare())
            .fold(0, u64::saturating_add)
    }

    /// The frames [`Self::check`] finds leaked or lost, where other processes run VMs in the
    /// zone: only those found so on every look for a while. A frame on its way into or out of
    /// a VM (allocated, not yet published; unpublished, not yet freed) looks leaked for the
    /// moment its thread takes, which on a loaded host may be a scheduling slice or more.
    fn settled_check(&self, others: bool) -> Result<recovery::Check, ZoneError> {
        let mut check = self.check()?;
        for _ in 0..SETTLE_LOOKS {
            if !others || (check.leaked.is_empty() && check.lost.is_empty()) {
                break;
            }
            std::thread::sleep(SETTLE_PAUSE);
            let again = self.check()?;
            check.leaked.retain(|frame| again.leaked.contains(frame));
            check.lost.retain(|frame| again.lost.contains(frame));
        }
        Ok(check)
    }

    /// The zone's size, VMs, and the state of its frames. Where other processes run VMs in
    /// the zone, it is a view of a moving zone: a VM created or deleted meanwhile may be
    /// missing, and a frame counts as leaked or lost only if it stays so for about half a
    /// second (a frame on its way into or out of a VM looks leaked for a moment).
    pub fn info(&self) -> Result<ZoneInfo, ZoneError> {
        let processes = self.processes()?;
        let check = self.settled_check(processes.iter().any(|process| !process.this))?;
        let uses = self.slot_uses();
        let vms = self.vm_infos(&uses);
        let damaged_slots = (0..self.layout.max_vms)
            .filter(|&i| uses[i as usize] == recovery::SlotUse::Quarantined)
            .map(|i| DamagedSlot {
                slot: i,
                name: self.slot(i).name(),
                what: self.slot_damage(i),
                frames: self
                    .table(i)
                    .iter()
                    .filter(|e| {
                        let value = e.load(Ordering::Relaxed);
                        let base = self.layout.frame_size.base_frames();
                        vm_table::entry_frame(value, base, self.layout.frames).is_some()
                    })
                    .count() as u64,
            })
            .collect();
        Ok(ZoneInfo {
            id: self.id(),
            size: self.layout.data_len(),
            frame_size: self.layout.frame_size,
            frames: self.layout.vm_chunks(),
            free_frames: self.pool.free_frames() / self.layout.frame_size.base_frames(),
            max_vms: self.layout.max_vms,
            vms,
            damaged_slots,
            recovery: self.recovery,
            leaked_frames: check.leaked.len() as u64,
            lost_frames: check.lost.len() as u64,
            map_sync: self.pool.uses_map_sync(),
            processes,
        })
    }

    /// The VMs of the directory whose slots `uses` says hold one, by name.
    fn vm_infos(&self, uses: &[recovery::SlotUse]) -> Vec<VmInfo> {
        let pieces = self.layout.frame_size.base_frames();
        let mut vms: Vec<VmInfo> = (0..self.layout.max_vms)
            .filter(|&i| matches!(uses[i as usize], recovery::SlotUse::Vm(_)))
            .filter_map(|i| {
                let slot = self.slot(i);
                // Read again: another process may have deleted the VM, or made another in its
                // slot, since its use was read.
                let (Some(layout), Some(name)) = (slot.layout(&self.layout), slot.name()) else {
                    return None;
                };
                let chunks = layout.chunks();
                let owner = self.live_pid(slot.owner());
                let table = &self.table(i)[..chunks as usize];
                let bitmap = self.map.words(self.pieces_offset(i), chunks * pieces / 64);
                Some(VmInfo {
                    name,
                    id: slot.id(),
                    frames: table
                        .iter()
                        .filter(|e| !matches!(e.load(Ordering::Relaxed), EMPTY | DAMAGED))
                        .count() as u64,
                    damaged: self.damaged_ranges(i, &layout),
                    given_away_pieces: bitmap
                        .iter()
                        .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
                        .sum(),
                    owner,
                    waiting: slot.waiting().filter(|_| owner.is_some()),
                    clone_of: slot
                        .clone_base()
                        .map(|base| self.slot(base).name().unwrap_or_else(|| format!("#{base}"))),
                    layout,
                })
            })
            .collect();
        vms.sort_by(|a, b| a.name.cmp(&b.name));
        vms
    }

    /// The zone's frames and each VM's share, without the consistency check of [`Self::info`]:
    /// cheap enough to sample often (`GET /memory`), and like it a view of a moving zone.
    pub fn usage(&self) -> ZoneUsage {
        ZoneUsage {
            frame_size: self.layout.frame_size,
            frames: self.layout.vm_chunks(),
            free_frames: self.pool.free_frames() / self.layout.frame_size.base_frames(),
            vms: self.vm_infos(&self.slot_uses()),
        }
    }
}

/// One VM of a zone, attached to this process; detached when dropped.
#[derive(Debug)]
pub struct ZoneVm {
    zone: Arc<Zone>,
    index: u64,
    name: String,
    layout: VmLayout,
    base: Option<CloneBase>,
}

/// The base of a clone ([`Zone::attach_clone`]): a VM of the zone, attached to no process,
/// whose frames the clone's guest memory maps privately. Reads share the base's frames with
/// the base and every other clone; a write copies the page into memory of the clone's process
/// (the kernel's copy-on-write of a private mapping, 4 KiB on a file or tmpfs zone, the frame
/// on hugetlbfs), so the base's frames never change.
#[derive(Debug, Clone)]
pub struct CloneBase {
    index: u64,
    name: String,
    id: u64,
    seal: u64,
    layout: VmLayout,
}

impl CloneBase {
    /// The base's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The base's identity.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The base's seal when the clone was made (0: none).
    pub fn seal(&self) -> u64 {
        self.seal
    }
}

impl ZoneVm {
    /// The zone.
    pub fn zone(&self) -> &Arc<Zone> {
        &self.zone
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The VM's RAM layout.
    pub fn layout(&self) -> &VmLayout {
        &self.layout
    }

    /// The VM's identity: drawn at random when it was created in the zone.
    pub fn id(&self) -> u64 {
        self.zone.slot(self.index).id()
    }

    /// The seal of the VM's memory, 0 for none: a snapshot that left the memory in the zone
    /// seals it, and the memory is the snapshot's as long as the seal is there.
    pub fn seal(&self) -> u64 {
        self.zone.slot(self.index).seal()
    }

    /// Seals the VM's memory with a new random seal, durably (the zone's directory is synced),
    /// and returns it.
    pub fn seal_memory(&self) -> Result<u64, ZoneError> {
        let seal = loop {
            let seal = sys::random_u64()
                .map_err(self.zone.io_err("cannot draw the memory's seal"))?
                & directory::MAX_CHECKED_VALUE;
            if seal != 0 {
                break seal;
            }
        };
        self.set_seal(seal)?;
        Ok(seal)
    }

    /// Breaks the seal, as the guest is about to change the memory, durably; nothing to do
    /// when there is none.
    pub fn break_seal(&self) -> Result<(), ZoneError> {
        self.set_seal(0)
    }

    fn set_seal(&self, seal: u64) -> Result<(), ZoneError> {
        let slot = self.zone.slot(self.index);
        if slot.seal() == seal {
            return Ok(());
        }
        slot.set_seal(seal);
        self.zone
            .map
            .sync(self.zone.layout.dir_off + self.index * PAGE, PAGE)
            .map_err(self.zone.io_err("cannot sync the directory"))
    }

    /// The persistent frame table of region `region`.
    pub(crate) fn table(&self, region: usize) -> VmTable {
        self.zone.vm_table(self.index, &self.layout, region)
    }

    /// The base whose frames this VM maps, if it is a clone.
    pub fn base(&self) -> Option<&CloneBase> {
        self.base.as_ref()
    }

    /// The base's frame table of region `region`, read only, if this VM is a clone.
    pub(crate) fn base_table(&self, region: usize) -> Option<VmTable> {
        let base = self.base.as_ref()?;
        Some(self.zone.vm_table(base.index, &base.layout, region))
    }

    /// The balloon piece bitmaps of region `region` (one bit per 4 KiB piece).
    pub(crate) fn piece_words(&self, region: usize) -> ZoneWords {
        let pieces = self.layout.chunk_size.base_frames();
        let chunks = self.layout.regions[region].1 / self.layout.chunk_size.bytes();
        ZoneWords::new(
            Arc::clone(&self.zone.map),
            self.zone.pieces_offset(self.index) + first_chunk(&self.layout, region) * pieces / 8,
            chunks * pieces / 64,
        )
    }
}

impl ZoneVm {
    /// Records that the VM waits for memory, since when (milliseconds since the Unix epoch) and
    /// for how many bytes, or (`None`) that it no longer does: `vmm zone inspect` shows it.
    pub fn set_waiting(&self, waiting: Option<(u64, u64)>) {
        self.zone.slot(self.index).set_waiting(waiting);
    }

    /// Records the bytes the VM's guest could give back (its free memory as its balloon
    /// statistics tell, less a margin), weighted as its VMM weighs it against the other VMs,
    /// for the reclaim policies of every VMM on the zone.
    pub fn set_spare(&self, bytes: u64) {
        self.zone.slot(self.index).set_spare(bytes);
    }

    /// Makes the VM ephemeral: it is deleted (its frames freed) when this process detaches it,
    /// leaves or dies, instead of keeping its memory for a restart.
    pub fn make_ephemeral(&self) -> Result<(), ZoneError> {
        let slot = self.zone.slot(self.index);
        slot.set_ephemeral();
        self.zone
            .map
            .sync(self.zone.layout.dir_off + self.index * PAGE, PAGE)
            .map_err(self.zone.io_err("cannot sync the directory"))
    }

    /// Whether the VM is ephemeral.
    pub fn is_ephemeral(&self) -> bool {
        self.zone.slot(self.index).ephemeral()
    }
}

impl Drop for ZoneVm {
    /// Detaches the VM; an ephemeral one is deleted (guest memory, which drops this last, has
    /// unmapped its frames by now).
    fn drop(&mut self) {
        let slot = self.zone.slot(self.index);
        if let Some(damage) = slot.damage() {
            log::error!(
                "zone {}: VM '{}' (slot {}) was damaged while attached: {damage}; left as it is \
                 for a person to decide (`vmm zone inspect`)",
                self.zone.path.display(),
                self.name,
                self.index
            );
            return;
        }
        if !slot.ephemeral() {
            slot.set_owner(0);
            return;
        }
        let file = self.zone.pool.backing_file().as_file();
        match OpenGuard::lock(file) {
            Ok(_guard) => {
                self.zone.finish_deletion(self.index, true);
            }
            // The next open deletes it (its owner is gone by then).
            Err(e) => log::warn!("zone: cannot delete ephemeral VM '{}' now: {e}", self.name),
        }
    }
}

/// The first chunk of region `region` in the tables of a VM of `layout`.
fn first_chunk(layout: &VmLayout, region: usize) -> u64 {
    let chunk = layout.chunk_size.bytes();
    layout.regions[..region]
        .iter()
        .map(|(_, size)| size / chunk)
        .sum()
}

/// `bytes` as a person reads it: "3 MiB", "1 GiB", else "3145729 bytes".
fn size_text(bytes: u64) -> String {
    match bytes {
        0 => "0".into(),
        b if b.is_multiple_of(1 << 30) => format!("{} GiB", b >> 30),
        b if b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b => format!("{b} bytes"),
    }
}

/// Guest-physical ranges as "0x…–0x… (N MiB), …".
pub fn format_ranges(ranges: &[(u64, u64)]) -> String {
    ranges
        .iter()
        .map(|&(start, len)| format!("{start:#x}-{:#x} ({} MiB)", start + len, len >> 20))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads and checks the header of a zone.
fn read_header(path: &Path, header: &layout::ZoneHeader) -> Result<ZoneLayout, ZoneError> {
    match header.magic.load(Ordering::Acquire) {
        MAGIC => {}
        CREATING_MAGIC => return Err(ZoneError::HalfCreated(path.to_owned())),
        magic => {
            return Err(ZoneError::NotAZone {
                path: path.to_owned(),
                magic,
            })
        }
    }
    let version = header.version.load(Ordering::Relaxed);
    if version != VERSION {
        return Err(ZoneError::Version {
            path: path.to_owned(),
            found: version,
        });
    }
    ZoneLayout::read(header).map_err(|what| corrupted(path, what))
}

/// Frames must be whole pages of the file system (hugetlbfs).
fn check_page_size(path: &Path, file: &BackingFile, frame: FrameSize) -> Result<(), ZoneError> {
    if file.page_size > frame.bytes() {
        return Err(ZoneError::PageSize {
            path: path.to_owned(),
            page: file.page_size,
            frame: frame.name(),
        });
    }
    Ok(())
}

/// The error of `what` failing on the zone in `path`.
fn io_error<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> ZoneError + 'a {
    move |source| ZoneError::Io {
        path: path.to_owned(),
        what,
        source,
    }
}

fn corrupted(path: &Path, what: impl Into<String>) -> ZoneError {
    ZoneError::Corrupted {
        path: path.to_owned(),
        what: what.into(),
    }
}

/// Cleans every frame of a new zone (a file may hold old data).
fn scrub_all(pool: &Pool, frames: u64) -> io::Result<()> {
    if pool.backing_file().can_punch {
        return pool.punch(0, frames);
    }
    let size = pool.frame_size();
    (0..frames)
        .step_by(size.base_frames() as usize)
        .try_for_each(|index| pool.scrub(Frame { index, size }))
}
