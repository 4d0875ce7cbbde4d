//! The host memory zone under a pool: a memfd (plain or hugetlb) or a file / DAX device.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::sys::{self, mmap};

/// The kind of host memory a pool is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// Plain shared memory (a memfd without huge pages); needs no set-up. Frames are 2 MiB.
    Anonymous,
    /// hugetlb memory with 2 MiB pages (a memfd, no mount needed). Frames are 2 MiB.
    Hugetlb2M,
    /// hugetlb memory with 1 GiB pages (a memfd, no mount needed). Frames are 1 GiB.
    Hugetlb1G,
    /// A file or a DAX device (persistent). The allocator's metadata lives in a header at the
    /// start of the same file, before the frame area. Frames are 2 MiB.
    File {
        /// The path of the file or device.
        path: PathBuf,
        /// Format the file even if it holds a pool already (its old contents are lost).
        format: bool,
    },
}

/// Errors of setting up the backing memory.
#[derive(Debug, Error)]
pub enum BackingError {
    /// The kernel has no huge pages of this size.
    #[error("{size} huge pages are not supported by this kernel (no {dir})")]
    HugePagesUnsupported {
        /// "2 MiB" or "1 GiB".
        size: &'static str,
        /// The sysfs directory that is missing.
        dir: String,
    },
    /// Too few free huge pages.
    #[error("not enough {size} huge pages: need {need}, free {free} (raise {dir}/nr_hugepages)")]
    NotEnoughHugePages {
        /// "2 MiB" or "1 GiB".
        size: &'static str,
        /// Pages needed.
        need: u64,
        /// Pages free and unreserved.
        free: u64,
        /// The sysfs directory of this page size.
        dir: String,
    },
    /// memfd_create or ftruncate failed.
    #[error("cannot create the pool's memfd: {0}")]
    Memfd(#[source] io::Error),
    /// Opening, sizing or inspecting the file failed.
    #[error("pool file {path}: {source}")]
    File {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Another process (a VMM) holds the pool file or zone.
    #[error(
        "{0} is in use by another process (a pool file serves one VMM at a time; a zone is \
         shared by many, each VM attached to one VMM)"
    )]
    InUse(PathBuf),
    /// The device is smaller than the pool needs.
    #[error("pool device {path} holds {have} bytes, but the pool needs {need}")]
    DeviceTooSmall {
        /// The path.
        path: PathBuf,
        /// Bytes needed (header and frames).
        need: u64,
        /// Bytes the device has.
        have: u64,
    },
    /// A file holding a pool is shorter than its pool: it was truncated.
    #[error("pool file {path} holds {have} bytes, but its pool needs {need} (truncated?)")]
    FileTooSmall {
        /// The path.
        path: PathBuf,
        /// Bytes needed (header and frames).
        need: u64,
        /// Bytes the file has.
        have: u64,
    },
}

/// An open backing: the fd whose offsets are frames, and what it is.
#[derive(Debug)]
pub struct BackingFile {
    file: File,
    /// Whether the memory is hugetlb.
    pub hugetlb: bool,
    /// Whether mappings may use MAP_SYNC (the file is on DAX).
    pub map_sync: bool,
    /// How stores through its mappings are made durable.
    pub durability: mmap::Durability,
    /// Whether holes can be punched (false for device DAX).
    pub can_punch: bool,
    /// Whether this is a device, or a file that already existed with contents.
    pub had_contents: bool,
    /// The file, if this open created it (exclusively: nobody else made it meanwhile).
    created: Option<CreatedFile>,
    /// The size of the pages the memory is made of (4 KiB; a hugetlb page size).
    pub page_size: u64,
    /// Bytes the file or device held when opened (the memfd's size).
    len: u64,
    /// Whether this is a block or character device, whose size cannot change.
    device: bool,
    /// Keeps the huge page reservation of a hugetlb memfd.
    _reservation: Option<mmap::Mapping>,
}

impl BackingFile {
    /// Creates a memfd of `size` bytes; hugetlb pages are checked and reserved.
    pub fn memfd(backing: &Backing, size: u64) -> Result<Self, BackingError> {
        let huge = match backing {
            Backing::Hugetlb2M => Some((21u32, "2 MiB", 2048u64)),
            Backing::Hugetlb1G => Some((30u32, "1 GiB", 1_048_576u64)),
            _ => None,
        };
        if let Some((shift, name, kb)) = huge {
            check_huge_pages(name, kb, size >> shift)?;
        }
        let fd = sys::memfd(c"llfree-pool", huge.map(|h| h.0)).map_err(BackingError::Memfd)?;
        let file = File::from(fd);
        file.set_len(size).map_err(BackingError::Memfd)?;
        let reservation = match huge {
            Some((shift, name, kb)) => Some(
                mmap::Mapping::reserve_file(file.as_raw_fd(), size as usize).map_err(
                    |e| match e.raw_os_error() {
                        Some(libc::ENOMEM) => not_enough(name, kb, size >> shift),
                        _ => BackingError::Memfd(e),
                    },
                )?,
            ),
            None => None,
        };
        Ok(Self {
            file,
            hugetlb: huge.is_some(),
            map_sync: false,
            durability: mmap::Durability::Msync,
            can_punch: true,
            had_contents: false,
            created: None,
            page_size: huge.map_or(4096, |h| 1 << h.0),
            len: size,
            device: false,
            _reservation: reservation,
        })
    }

    /// Opens a file or device, creating an absent file (empty) with `create`, and takes an
    /// exclusive advisory lock (flock) on it for as long as this lives: a second process on the
    /// same pool is refused at once. Nothing in it is changed: the caller checks what it holds
    /// first, then sizes it with [`BackingFile::ensure_len`]. A file on hugetlbfs is hugetlb
    /// memory of that mount's page size.
    pub fn open(path: &Path, create: bool) -> Result<Self, BackingError> {
        Self::open_with(path, create, true)
    }

    /// Opens an existing file or device as [`BackingFile::open`] does, without the lock: for a
    /// zone, which several processes use at once (they coordinate with byte-range locks).
    pub fn open_shared(path: &Path) -> Result<Self, BackingError> {
        Self::open_with(path, false, false)
    }

    fn open_with(path: &Path, create: bool, lock: bool) -> Result<Self, BackingError> {
        let err = |source| BackingError::File {
            path: path.to_owned(),
            source,
        };
        let open = |exclusive: bool| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(exclusive)
                .open(path)
        };
        // Created exclusively, or opened as it is: whoever made the file is the only one who
        // may remove it (see `CreatedFile::remove`).
        let (file, created) = match create.then(|| open(true)) {
            Some(Ok(file)) => (file, true),
            Some(Err(e)) if e.kind() != io::ErrorKind::AlreadyExists => return Err(err(e)),
            _ => (open(false).map_err(err)?, false),
        };
        match if lock { file.try_lock() } else { Ok(()) } {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(BackingError::InUse(path.to_owned()))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(err(e)),
        }
        let meta = file.metadata().map_err(err)?;
        let device = meta.file_type().is_char_device() || meta.file_type().is_block_device();
        let len = if device {
            device_size(&file, &meta).map_err(err)?
        } else {
            meta.len()
        };
        let hugetlb_page = hugetlbfs_page_size(&file).map_err(err)?;
        // A device DAX maps only whole pages of its alignment.
        let dax_align = match meta.file_type().is_char_device() {
            true => Some(dax_alignment(&meta).map_err(err)?),
            false => None,
        };
        let page_size = hugetlb_page.or(dax_align).unwrap_or(4096);
        let map_sync = hugetlb_page.is_none()
            && mmap::supports_map_sync(file.as_raw_fd(), 0, page_size as usize);
        Ok(Self {
            file,
            hugetlb: hugetlb_page.is_some(),
            page_size,
            map_sync,
            durability: match meta.file_type().is_char_device() {
                true => mmap::Durability::FlushCaches,
                false => mmap::Durability::Msync,
            },
            can_punch: !meta.file_type().is_char_device(),
            had_contents: device || len > 0,
            created: created.then(|| CreatedFile {
                dev: meta.dev(),
                ino: meta.ino(),
            }),
            len,
            device,
            _reservation: None,
        })
    }

    /// Makes sure the file or device at `path` (this one) holds `need` bytes. Only a `fresh`
    /// file (new, empty, or being formatted) is grown; a device, or a file whose pool is being
    /// recovered, must hold them already.
    pub fn ensure_len(&self, path: &Path, need: u64, fresh: bool) -> Result<(), BackingError> {
        if self.len >= need {
            return Ok(());
        }
        let (path, have) = (path.to_owned(), self.len);
        match (self.device, fresh) {
            (true, _) => Err(BackingError::DeviceTooSmall { path, need, have }),
            (false, true) => self
                .file
                .set_len(need)
                .map_err(|source| BackingError::File { path, source }),
            (false, false) => Err(BackingError::FileTooSmall { path, need, have }),
        }
    }

    /// Bytes the file or device held when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The file, if this open created it (see [`CreatedFile::remove`]).
    pub fn created(&self) -> Option<CreatedFile> {
        self.created
    }

    /// The raw fd, for mmap and fallocate.
    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The file.
    pub fn as_file(&self) -> &File {
        &self.file
    }
}

/// A file this process created (its device and inode): what a failed set-up may remove, and
/// nothing else, e.g. not a file another process created at the same path meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedFile {
    dev: u64,
    ino: u64,
}

impl CreatedFile {
    /// Removes the file from `path`, if `path` still names it.
    pub fn remove(self, path: &Path) {
        let same = fs::symlink_metadata(path)
            .is_ok_and(|there| there.dev() == self.dev && there.ino() == self.ino);
        if same {
            let _ = fs::remove_file(path);
        }
    }
}

/// The page size of the hugetlbfs mount `file` lies on; `None` for other file systems.
fn hugetlbfs_page_size(file: &File) -> io::Result<Option<u64>> {
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    // SAFETY: statfs is plain data, valid when zeroed; fstatfs fills it.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `file` is an open fd and `stat` a writable statfs.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((stat.f_type as i64 == HUGETLBFS_MAGIC).then_some(stat.f_bsize as u64))
}

fn huge_dir(kb: u64) -> String {
    format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB")
}

fn read_count(dir: &str, name: &str) -> Option<u64> {
    fs::read_to_string(format!("{dir}/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether this process sees the kernel's memory settings in sysfs: not in a jail that
/// mounted no sysfs, where huge pages are taken without counting them first.
pub fn sysfs_visible() -> bool {
    Path::new("/sys/kernel/mm").is_dir()
}

/// Free huge pages of `kb` KiB that nobody has reserved yet.
pub fn available_huge_pages(kb: u64) -> Option<u64> {
    let dir = huge_dir(kb);
    let free = read_count(&dir, "free_hugepages")?;
    let resv = read_count(&dir, "resv_hugepages").unwrap_or(0);
    Some(free.saturating_sub(resv))
}

fn not_enough(size: &'static str, kb: u64, need: u64) -> BackingError {
    BackingError::NotEnoughHugePages {
        size,
        need,
        free: available_huge_pages(kb).unwrap_or(0),
        dir: huge_dir(kb),
    }
}

fn check_huge_pages(size: &'static str, kb: u64, need: u64) -> Result<(), BackingError> {
    if !sysfs_visible() {
        // No sysfs to ask (a jail): the mapping itself says whether the pages are there.
        return Ok(());
    }
    let dir = huge_dir(kb);
    if !Path::new(&dir).is_dir() {
        return Err(BackingError::HugePagesUnsupported { size, dir });
    }
    match available_huge_pages(kb) {
        Some(free) if free >= need => Ok(()),
        _ => Err(not_enough(size, kb, need)),
    }
}

/// The alignment of a DAX character device (from sysfs): every mapping of it starts and ends
/// on a multiple of it.
fn dax_alignment(meta: &fs::Metadata) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let text = fs::read_to_string(format!("/sys/dev/char/{major}:{minor}/align"))?;
    match text.trim().parse::<u64>() {
        Ok(align) if align.is_power_of_two() && align >= 4096 => Ok(align),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad DAX alignment in sysfs",
        )),
    }
}

/// The size of a block device (BLKGETSIZE64) or a DAX character device (from sysfs).
fn device_size(file: &File, meta: &fs::Metadata) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    if meta.file_type().is_block_device() {
        const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
        let mut size = 0u64;
        // SAFETY: BLKGETSIZE64 writes one u64 into `size`.
        if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size) } < 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(size);
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let text = fs::read_to_string(format!("/sys/dev/char/{major}:{minor}/size"))?;
    text.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad size in sysfs"))
}
