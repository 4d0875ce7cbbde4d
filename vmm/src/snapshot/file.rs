//! The snapshot file: a 32-byte header, then the [`VmSnapshot`] in postcard's encoding.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "LLFVSNAP"
//!      8     4  version (3), little endian
//!     12     4  flags (0)
//!     16     8  payload length
//!     24     4  CRC32 of the payload
//!     28     4  CRC32 of bytes 0..28
//!     32     …  payload
//! ```
//!
//! A file is written beside its final name, synced and renamed over it (and the directory
//! synced): a crash leaves the old file or the new one, never half of one. Reading checks the
//! magic, version, length and both checksums before it decodes anything.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::VmSnapshot;
use crate::host_file::{self, HostFileError};

/// The file's first bytes.
pub const MAGIC: [u8; 8] = *b"LLFVSNAP";
/// The format version this VMM writes and reads.
pub const VERSION: u32 = 9;
/// Bytes of the header.
pub const HEADER_LEN: usize = 32;
/// The largest payload accepted (a VM of 254 vCPUs needs a few MiB).
pub const MAX_PAYLOAD: u64 = 64 << 20;

/// Errors of writing or reading a snapshot file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    /// The path is empty, or names something that is not a regular file.
    #[error(transparent)]
    Path(#[from] HostFileError),
    /// The file could not be written, read or synced.
    #[error("{}: {what}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The file does not start with the snapshot magic.
    #[error("{} is not an llfree-vmm snapshot (it starts with {found:02x?})", .path.display())]
    NotASnapshot {
        /// The file.
        path: PathBuf,
        /// Its first bytes.
        found: Vec<u8>,
    },
    /// The file is of another format version.
    #[error("{} is a snapshot of format version {found}; this VMM reads version {VERSION}", .path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The header or payload was damaged.
    #[error("{} is damaged: {what}", .path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
}

fn io_error<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(io::Error) -> SnapshotFileError + 'a {
    move |source| SnapshotFileError::Io {
        path: path.to_owned(),
        what,
        source,
    }
}

fn header(payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    header[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header[24..28].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    let crc = crc32fast::hash(&header[..28]);
    header[28..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Writes `snapshot` to `path`, replacing what is there only once the new file is complete and
/// synced.
pub fn write(path: &Path, snapshot: &VmSnapshot) -> Result<(), SnapshotFileError> {
    // Only a regular file is replaced: never a device, FIFO, socket or symbolic link.
    host_file::check_output("snapshot_path", path)?;
    let payload = postcard::to_stdvec(snapshot).map_err(|e| SnapshotFileError::Damaged {
        path: path.to_owned(),
        what: format!("cannot encode the snapshot: {e}"),
    })?;
    let name = path
        .file_name()
        .ok_or_else(|| io_error(path, "no file name")(io::ErrorKind::InvalidInput.into()))?;
    let mut temporary = path.to_owned();
    temporary.set_file_name(format!(
        ".{}.{}.partial",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)
            .map_err(io_error(path, "cannot create"))?;
        file.write_all(&header(&payload))
            .and_then(|()| file.write_all(&payload))
            .map_err(io_error(path, "cannot write"))?;
        file.sync_all().map_err(io_error(path, "cannot sync"))?;
        fs::rename(&temporary, path).map_err(io_error(path, "cannot rename into place"))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
        return written;
    }
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(directory)
        .and_then(|dir| dir.sync_all())
        .map_err(io_error(path, "cannot sync its directory"))
}

/// The format version of the snapshot at `path`, from its checked header (Firecracker's
/// `--describe-snapshot`): also of a version this VMM cannot load.
pub fn version(path: &Path) -> Result<u32, SnapshotFileError> {
    let mut file = host_file::open_input("snapshot_path", path)?;
    let header = read_header(path, &mut file)?;
    Ok(u32::from_le_bytes(
        header[8..12].try_into().expect("4 bytes"),
    ))
}

/// Reads the header of the snapshot file `file` at `path` and checks its magic, length and
/// checksum.
fn read_header(path: &Path, file: &mut std::fs::File) -> Result<Vec<u8>, SnapshotFileError> {
    let damaged = |what: String| SnapshotFileError::Damaged {
        path: path.to_owned(),
        what,
    };
    let mut header = Vec::with_capacity(HEADER_LEN);
    file.take(HEADER_LEN as u64)
        .read_to_end(&mut header)
        .map_err(io_error(path, "cannot read"))?;
    if !header.starts_with(&MAGIC) {
        return Err(SnapshotFileError::NotASnapshot {
            path: path.to_owned(),
            found: header.iter().take(8).copied().collect(),
        });
    }
    if header.len() < HEADER_LEN {
        return Err(damaged(format!(
            "truncated: {} bytes, the header alone has {HEADER_LEN}",
            header.len()
        )));
    }
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    if word(28) != crc32fast::hash(&header[..28]) {
        return Err(damaged("the header's checksum does not match".into()));
    }
    Ok(header)
}

/// Reads and checks the snapshot at `path`.
pub fn read(path: &Path) -> Result<VmSnapshot, SnapshotFileError> {
    let damaged = |what: String| SnapshotFileError::Damaged {
        path: path.to_owned(),
        what,
    };
    let mut file = host_file::open_input("snapshot_path", path)?;
    let header = read_header(path, &mut file)?;
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let version = word(8);
    if version != VERSION {
        return Err(SnapshotFileError::Version {
            path: path.to_owned(),
            found: version,
        });
    }
    let length = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
    if length > MAX_PAYLOAD {
        return Err(damaged(format!(
            "a payload of {length} bytes (at most {MAX_PAYLOAD})"
        )));
    }
    let mut payload = Vec::with_capacity(length as usize);
    (&mut file)
        .take(length + 1)
        .read_to_end(&mut payload)
        .map_err(io_error(path, "cannot read"))?;
    if payload.len() as u64 != length {
        return Err(damaged(format!(
            "{} bytes of payload where the header says {length}{}",
            payload.len().min(length as usize),
            if payload.len() as u64 > length {
                " (and more after them)"
            } else {
                " (truncated)"
            }
        )));
    }
    if word(24) != crc32fast::hash(&payload) {
        return Err(damaged("the payload's checksum does not match".into()));
    }
    postcard::from_bytes(&payload).map_err(|e| damaged(format!("cannot decode the payload: {e}")))
}
