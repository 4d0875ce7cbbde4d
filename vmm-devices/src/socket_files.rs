//! The Unix socket files the VMM made (the API socket, vsock's), removed however it ends: as
//! their owner drops them on a clean exit or an error, and by [`remove_all`] when a denied
//! system call ends the process at once (the seccomp module's exit watcher).
//!
//! Only the VMM's own socket is removed: one that another process put at the path since (its
//! device and inode differ) stays.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Longest Unix socket path (`sun_path` holds 108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A socket file the VMM made, removed when this is dropped.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    key: u64,
    files: &'static FileTable,
}

/// A registered file: its key, path and (device, inode).
type FileEntry = (u64, PathBuf, (u64, u64));
/// The files in charge.
type FileTable = Mutex<Vec<FileEntry>>;

static FILES: FileTable = Mutex::new(Vec::new());
static NEXT_KEY: AtomicU64 = AtomicU64::new(0);
/// The files in [`FILES`], readable without its lock (a signal handler asks).
static IN_CHARGE: AtomicUsize = AtomicUsize::new(0);

/// Whether any socket file is in charge (lock-free and async-signal-safe).
pub fn any() -> bool {
    IN_CHARGE.load(Ordering::Acquire) > 0
}

/// A file's (device, inode), its links not followed.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

/// Removes `path` if it is still the file of `identity`.
fn remove_if_ours(path: &Path, identity_then: (u64, u64)) {
    if identity(path) == Some(identity_then) {
        let _ = std::fs::remove_file(path);
    }
}

impl SocketFile {
    /// Takes charge of the socket just bound at `path`.
    pub fn adopt(path: &Path) -> Self {
        Self::adopt_in(&FILES, path)
    }

    fn adopt_in(files: &'static FileTable, path: &Path) -> Self {
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        if let Some(id) = identity(path) {
            lock(files).push((key, path.to_owned(), id));
            IN_CHARGE.fetch_add(1, Ordering::AcqRel);
        }
        SocketFile {
            path: path.to_owned(),
            key,
            files,
        }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let mut files = lock(self.files);
        if let Some(at) = files.iter().position(|(key, _, _)| *key == self.key) {
            let (_, path, id) = files.swap_remove(at);
            IN_CHARGE.fetch_sub(1, Ordering::AcqRel);
            drop(files);
            remove_if_ours(&path, id);
        }
    }
}

fn lock(files: &FileTable) -> std::sync::MutexGuard<'_, Vec<FileEntry>> {
    files
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes every socket file still in charge, for a process about to end without running its
/// destructors. Gives up (returns false) if the list stays locked for a second: the thread
/// that stopped the process may hold it.
pub fn remove_all() -> bool {
    remove_all_in(&FILES)
}

fn remove_all_in(files: &FileTable) -> bool {
    for _ in 0..1000 {
        let entries = match files.try_lock() {
            Ok(entries) => entries,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
        };
        for (_, path, id) in entries.iter() {
            remove_if_ours(path, *id);
        }
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("socket-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_dropped_file_goes_and_one_put_there_since_stays() {
        let dir = scratch("drop");
        let path = dir.join("a.sock");
        let listener = UnixListener::bind(&path).unwrap();
        drop(SocketFile::adopt(&path));
        assert!(!path.exists());
        drop(listener);
        // Another process's socket at the path since.
        let ours = UnixListener::bind(&path).unwrap();
        let file = SocketFile::adopt(&path);
        std::fs::remove_file(&path).unwrap();
        let _theirs = UnixListener::bind(&path).unwrap();
        drop(file);
        assert!(path.exists());
        drop(ours);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn remove_all_removes_every_file_in_charge() {
        let dir = scratch("all");
        let paths: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("{i}.sock"))).collect();
        let _listeners: Vec<UnixListener> = paths
            .iter()
            .map(|p| UnixListener::bind(p).unwrap())
            .collect();
        // A list of their own: the process's holds other tests' sockets.
        static TEST_FILES: FileTable = Mutex::new(Vec::new());
        let files: Vec<SocketFile> = paths
            .iter()
            .map(|p| SocketFile::adopt_in(&TEST_FILES, p))
            .collect();
        assert!(remove_all_in(&TEST_FILES));
        assert!(paths.iter().all(|p| !p.exists()));
        // Their owners' drops find nothing left to do.
        drop(files);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
