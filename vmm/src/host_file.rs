//! Files the VMM reads or writes at paths a user or an API client names (snapshots, memory
//! files): any of them may be a device, a FIFO, a socket or a symbolic link. Inputs are opened
//! without blocking and read only when they are regular files; outputs are written only where
//! nothing is, or a regular file is: nothing else is ever replaced, truncated or waited on.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a named path cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HostFileError {
    /// The path is empty.
    #[error("{what}: the path is empty")]
    Empty {
        /// What the path is for, e.g. "snapshot_path".
        what: &'static str,
    },
    /// The path names something that is not a regular file.
    #[error("{what} {}: {kind}, not a regular file", .path.display())]
    NotRegular {
        /// What the path is for.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What it is, e.g. "a FIFO".
        kind: &'static str,
    },
    /// The directory an output would be made in is missing, or no directory.
    #[error("{what} {}: the directory {} {why}", .path.display(), .dir.display())]
    NoDirectory {
        /// What the path is for.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// "does not exist", "is not a directory".
        why: &'static str,
    },
    /// The file cannot be opened or inspected.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        /// What the path is for.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// What a file of type `file_type` is, when it is not a regular file.
fn irregular(file_type: std::fs::FileType) -> Option<&'static str> {
    Some(if file_type.is_file() {
        return None;
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else {
        "not a plain file"
    })
}

fn check_named(what: &'static str, path: &Path) -> Result<(), HostFileError> {
    if path.as_os_str().is_empty() {
        return Err(HostFileError::Empty { what });
    }
    Ok(())
}

/// Opens the regular file at `path` (`what` it is for, in errors) for reading, without
/// blocking (a FIFO is refused, not waited on) and without following a final symbolic link.
pub fn open_input(what: &'static str, path: &Path) -> Result<File, HostFileError> {
    check_named(what, path)?;
    let io_error = |source| HostFileError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    // What is there, named before opening it (a socket cannot even be opened).
    let meta = std::fs::symlink_metadata(path).map_err(io_error)?;
    check_regular(what, path, meta.file_type())?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_error)?;
    // What was opened, which may have been put there since.
    check_regular(what, path, file.metadata().map_err(io_error)?.file_type())?;
    Ok(file)
}

fn check_regular(
    what: &'static str,
    path: &Path,
    file_type: std::fs::FileType,
) -> Result<(), HostFileError> {
    match irregular(file_type) {
        Some(kind) => Err(HostFileError::NotRegular {
            what,
            path: path.to_owned(),
            kind,
        }),
        None => Ok(()),
    }
}

/// Checks that `path` may be written as an output (`what` it is for, in errors): nothing is
/// there, in a directory that exists, or a regular file is (which the output replaces).
pub fn check_output(what: &'static str, path: &Path) -> Result<(), HostFileError> {
    check_named(what, path)?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) => check_regular(what, path, meta.file_type()),
        // Missing, or under something that is no directory.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            let dir = match path.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            let why = match std::fs::metadata(dir) {
                Ok(meta) if meta.is_dir() => return Ok(()),
                Ok(_) => "is not a directory",
                Err(e) if e.kind() == io::ErrorKind::NotFound => "does not exist",
                Err(e) if e.kind() == io::ErrorKind::NotADirectory => "is not a directory",
                Err(source) => {
                    return Err(HostFileError::Io {
                        what,
                        path: dir.to_owned(),
                        source,
                    })
                }
            };
            Err(HostFileError::NoDirectory {
                what,
                path: path.to_owned(),
                dir: dir.to_owned(),
                why,
            })
        }
        Err(source) => Err(HostFileError::Io {
            what,
            path: path.to_owned(),
            source,
        }),
    }
}

/// Creates the output file `path` (see [`check_output`]), or empties the regular file there:
/// opened without blocking and without following a final symbolic link, and truncated only
/// once it is known to be a regular file.
pub fn create_output(what: &'static str, path: &Path) -> Result<File, HostFileError> {
    let file = open_output_keeping(what, path)?;
    file.set_len(0).map_err(|source| HostFileError::Io {
        what,
        path: path.to_owned(),
        source,
    })?;
    Ok(file)
}

/// Opens the output at `path` (`what` it is for, in errors) as [`create_output`] does, but keeps
/// what it holds: a memory file that a diff snapshot updates in place, or the base a diff is
/// merged onto.
pub fn open_output_keeping(what: &'static str, path: &Path) -> Result<File, HostFileError> {
    check_output(what, path)?;
    let io_error = |source| HostFileError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_error)?;
    check_regular(what, path, file.metadata().map_err(io_error)?.file_type())?;
    Ok(file)
}

/// Opens the log or metrics output at `path` (`what` it is for, in errors), as Firecracker
/// takes them: a named pipe, opened without waiting for a reader (writes to a full pipe fail
/// with `WouldBlock` instead of blocking), or a regular file, created if missing and appended
/// to. Anything else (a device, a socket, a directory, a final symbolic link) is refused.
pub fn open_appending(what: &'static str, path: &Path) -> Result<File, HostFileError> {
    check_named(what, path)?;
    let io_error = |source| HostFileError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    let fifo = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_fifo() => true,
        Ok(meta) => {
            check_regular(what, path, meta.file_type())?;
            false
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(source) => return Err(io_error(source)),
    };
    let mut options = OpenOptions::new();
    if fifo {
        // Read and write: opening a pipe without a reader neither blocks nor fails.
        options.read(true).write(true);
    } else {
        options.create(true).append(true);
    }
    let file = options
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_error)?;
    // What was opened, which may have been put there since the look.
    let file_type = file.metadata().map_err(io_error)?.file_type();
    if !file_type.is_fifo() {
        check_regular(what, path, file_type)?;
    }
    Ok(file)
}

/// Whether `a` and `b` name the same file (device and inode); false if either is missing.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_in_a_missing_directory_or_under_a_file_is_refused() {
        let missing = Path::new("/nonexistent-llfree-vmm/snap");
        let err = check_output("snapshot_path", missing).unwrap_err();
        assert!(
            matches!(
                err,
                HostFileError::NoDirectory {
                    why: "does not exist",
                    ..
                }
            ),
            "{err}"
        );
        let under_a_file = Path::new("/etc/hostname/snap");
        let err = check_output("snapshot_path", under_a_file).unwrap_err();
        assert!(
            matches!(
                err,
                HostFileError::NoDirectory {
                    why: "is not a directory",
                    ..
                }
            ),
            "{err}"
        );
        check_output("snapshot_path", Path::new("relative-new-file")).unwrap();
    }

    /// A scratch directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("host-file-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mkfifo(path: &Path) {
        let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `name` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn inputs_must_be_regular_files_and_are_never_waited_on() {
        let scratch = Scratch::new("input");
        let fifo = scratch.0.join("fifo");
        mkfifo(&fifo);
        let err = open_input("snapshot_path", &fifo).unwrap_err();
        assert!(
            err.to_string().ends_with("a FIFO, not a regular file"),
            "{err}"
        );
        let err = open_input("snapshot_path", Path::new("/dev/zero")).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        let err = open_input("snapshot_path", &scratch.0).unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
        let link = scratch.0.join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let err = open_input("snapshot_path", &link).unwrap_err();
        assert!(err.to_string().contains("a symbolic link"), "{err}");
        let err = open_input("mem_file_path", Path::new("")).unwrap_err();
        assert_eq!(err.to_string(), "mem_file_path: the path is empty");
        let regular = scratch.0.join("file");
        std::fs::write(&regular, b"data").unwrap();
        assert!(open_input("snapshot_path", &regular).is_ok());
    }

    #[test]
    fn outputs_replace_only_regular_files() {
        let scratch = Scratch::new("output");
        let fifo = scratch.0.join("fifo");
        mkfifo(&fifo);
        assert!(create_output("snapshot_path", &fifo).is_err());
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        let err = check_output("mem_file_path", Path::new("/dev/null")).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        let new = scratch.0.join("new");
        check_output("snapshot_path", &new).unwrap();
        std::fs::write(&new, b"old contents").unwrap();
        let file = create_output("mem_file_path", &new).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 0, "emptied");
        let err = create_output("mem_file_path", Path::new("")).unwrap_err();
        assert_eq!(err.to_string(), "mem_file_path: the path is empty");
    }

    #[test]
    fn log_and_metrics_outputs_are_pipes_or_regular_files_appended_to() {
        use std::io::Write;
        let scratch = Scratch::new("appending");
        let fifo = scratch.0.join("fifo");
        mkfifo(&fifo);
        // No reader: neither waits nor fails.
        let mut pipe = open_appending("metrics_path", &fifo).unwrap();
        pipe.write_all(b"line\n").unwrap();
        let file = scratch.0.join("file");
        std::fs::write(&file, b"kept\n").unwrap();
        open_appending("log_path", &file)
            .unwrap()
            .write_all(b"added\n")
            .unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"kept\nadded\n");
        let created = scratch.0.join("created");
        open_appending("log_path", &created).unwrap();
        assert!(created.is_file());
        for (path, kind) in [
            (Path::new("/dev/null"), "a character device"),
            (scratch.0.as_path(), "a directory"),
        ] {
            let err = open_appending("log_path", path).unwrap_err();
            assert!(err.to_string().contains(kind), "{err}");
        }
        let link = scratch.0.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = open_appending("metrics_path", &link).unwrap_err();
        assert!(err.to_string().contains("a symbolic link"), "{err}");
    }
}
