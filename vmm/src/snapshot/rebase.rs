//! Merging a diff snapshot's memory file onto its base's, as Firecracker's `rebase-snap` does:
//! every part of the diff file that holds data (its dirty pages, and its trailer with the diff
//! snapshot's identity) is written over the base at the same offset; the holes between leave
//! the base as it is. The base then is the diff snapshot's memory file.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::memory_file::{self, TRAILER_LEN};
use crate::host_file::{self, HostFileError};

/// Bytes copied at a time.
const COPY_BUFFER: usize = 1 << 20;

/// Why a diff cannot be merged onto a base.
#[derive(Debug, thiserror::Error)]
pub enum RebaseError {
    /// A path cannot be used.
    #[error(transparent)]
    Path(#[from] HostFileError),
    /// A file is no snapshot memory file (no trailer), or the two do not fit together.
    #[error("{}: {why}", .path.display())]
    NotMemoryFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Reading or writing failed.
    #[error("{}: cannot {what}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// What a merge wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebased {
    /// Bytes of the diff written over the base.
    pub bytes: u64,
    /// Runs of data they came in.
    pub runs: u64,
}

/// The memory bytes before the trailer of the memory file `file` at `path`, checked.
fn memory_len(file: &File, path: &Path) -> Result<u64, RebaseError> {
    let io_err = |what| {
        move |source| RebaseError::Io {
            path: path.to_owned(),
            what,
            source,
        }
    };
    let len = file.metadata().map_err(io_err("read its size"))?.len();
    let not_ours = |why: &str| RebaseError::NotMemoryFile {
        path: path.to_owned(),
        why: why.to_owned(),
    };
    let memory = len
        .checked_sub(TRAILER_LEN)
        .ok_or_else(|| not_ours("too short for a snapshot memory file"))?;
    match memory_file::read_identity(file, memory).map_err(io_err("read its trailer"))? {
        Some(_) => Ok(memory),
        None => Err(not_ours(
            "is no snapshot memory file (it has no trailer with a snapshot's identity)",
        )),
    }
}

/// The next run of data in `file` at or after `offset`, as `[start, end)`, or `None` past the
/// last (`SEEK_DATA`, `SEEK_HOLE`).
fn next_data(file: &File, offset: u64) -> io::Result<Option<(u64, u64)>> {
    let seek = |from: u64, whence| {
        // SAFETY: lseek on a descriptor this function borrows; it moves nothing but the offset.
        let at = unsafe { libc::lseek(file.as_raw_fd(), from as libc::off_t, whence) };
        match at {
            -1 => Err(io::Error::last_os_error()),
            at => Ok(at as u64),
        }
    };
    let start = match seek(offset, libc::SEEK_DATA) {
        Ok(start) => start,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some((start, seek(start, libc::SEEK_HOLE)?)))
}

/// Writes every run of data of the diff memory file at `diff_path` over the base memory file at
/// `base_path` (the same VM's, of the same size), then makes the base durable.
pub fn rebase(base_path: &Path, diff_path: &Path) -> Result<Rebased, RebaseError> {
    let diff = host_file::open_input("diff_file", diff_path)?;
    if !base_path.exists() {
        return Err(RebaseError::NotMemoryFile {
            path: base_path.to_owned(),
            why: "does not exist".into(),
        });
    }
    let base = host_file::open_output_keeping("base_file", base_path)?;
    if host_file::same_file(base_path, diff_path) {
        return Err(RebaseError::NotMemoryFile {
            path: diff_path.to_owned(),
            why: "is the base file too".into(),
        });
    }
    let (base_len, diff_len) = (memory_len(&base, base_path)?, memory_len(&diff, diff_path)?);
    if base_len != diff_len {
        return Err(RebaseError::NotMemoryFile {
            path: diff_path.to_owned(),
            why: format!(
                "holds {diff_len} bytes of memory, the base {base_len}: they are not snapshots \
                 of one VM"
            ),
        });
    }
    let io_err = |path: &Path, what| {
        let path = path.to_owned();
        move |source| RebaseError::Io { path, what, source }
    };
    let mut buffer = vec![0u8; COPY_BUFFER];
    let mut done = Rebased { bytes: 0, runs: 0 };
    let mut offset = 0;
    while let Some((start, end)) =
        next_data(&diff, offset).map_err(io_err(diff_path, "find its data"))?
    {
        let mut at = start;
        while at < end {
            let part = &mut buffer[..(end - at).min(COPY_BUFFER as u64) as usize];
            diff.read_exact_at(part, at)
                .map_err(io_err(diff_path, "read"))?;
            base.write_all_at(part, at)
                .map_err(io_err(base_path, "write"))?;
            at += part.len() as u64;
        }
        done.bytes += end - start;
        done.runs += 1;
        offset = end;
    }
    base.sync_all().map_err(io_err(base_path, "sync"))?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory_file(dir: &Path, name: &str, pages: &[(u64, u8)], identity: u64) -> PathBuf {
        let path = dir.join(name);
        let file = File::create(&path).unwrap();
        let len = 64 << 12;
        file.set_len(len + TRAILER_LEN).unwrap();
        for &(page, byte) in pages {
            file.write_all_at(&[byte; 4096], page << 12).unwrap();
        }
        memory_file::write_trailer(&file, len, identity).unwrap();
        path
    }

    #[test]
    fn the_diff_s_data_and_trailer_go_over_the_base_and_its_holes_leave_it() {
        let dir = std::env::temp_dir().join(format!("llfree-rebase-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = memory_file(&dir, "base", &[(0, 1), (1, 1), (5, 1)], 7);
        let diff = memory_file(&dir, "diff", &[(1, 2), (40, 3), (41, 3)], 9);
        let rebased = rebase(&base, &diff).unwrap();
        let merged = std::fs::read(&base).unwrap();
        let page = |n: usize| merged[n << 12];
        assert_eq!(
            (page(0), page(1), page(5), page(40), page(41), page(2)),
            (1, 2, 1, 3, 3, 0)
        );
        let file = File::open(&base).unwrap();
        assert_eq!(
            memory_file::read_identity(&file, 64 << 12).unwrap(),
            Some(9)
        );
        // Three runs: page 1, pages 40-41, the trailer (a file system may round them up).
        assert!(
            rebased.runs >= 2 && rebased.bytes >= 4 * 4096,
            "{rebased:?}"
        );
        // Files that do not fit together are refused and left alone.
        let other = dir.join("other");
        std::fs::write(&other, vec![0u8; 8192]).unwrap();
        let refused = rebase(&base, &other).unwrap_err().to_string();
        assert!(refused.contains("no snapshot memory file"), "{refused}");
        assert!(rebase(&base, &base).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
