//! The processes that have a zone open at the same time, and how they find out about each other.
//!
//! Each open zone is one entry of a table in the header page (process id and a random token)
//! plus an exclusive open-file-description lock (`F_OFD_SETLK`) on a byte of its own, far past
//! the file's end; the kernel drops the lock when the process dies, however it dies, so an
//! entry whose byte is not locked belongs to a dead process. The token names the process in the
//! zone: it owns the allocator's per-core slots it claimed and the VMs it attached.
//!
//! Two more bytes order the openers: whoever opens or closes holds the *open* byte exclusively
//! for the few microseconds that takes, and every open zone holds the *present* byte shared. An
//! opener that can lock the present byte exclusively is alone: it recovers the whole zone. The
//! others attach to the allocator as it is and recover only what dead processes left.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{fcntl, FcntlArg};

/// Entries of the process table: at most this many processes have a zone open at once.
pub const MAX_PROCESSES: usize = 128;
/// Offset of the table in the header page (after the header's fields).
pub const TABLE_OFFSET: u64 = 1024;
/// Words per entry: process id, token.
const ENTRY_WORDS: usize = 2;
/// Lock bytes lie far beyond any zone file's end (advisory locks may).
const LOCK_BASE: i64 = 1 << 50;
/// Held exclusively while a process opens or closes the zone.
const OPEN_BYTE: i64 = LOCK_BASE;
/// Held shared by every process that has the zone open.
const PRESENT_BYTE: i64 = LOCK_BASE + 1;
/// Entry `i` of the table is alive while byte `PROCESS_BYTES + i` is locked.
const PROCESS_BYTES: i64 = LOCK_BASE + 64;

/// A lock on one byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// Shared (read).
    Shared,
    /// Exclusive (write).
    Exclusive,
    /// Released.
    Unlocked,
}

fn flock(byte: i64, lock: Lock) -> libc::flock {
    // SAFETY: `flock` is a plain C struct; all zero is a valid value that is then filled in.
    let mut flock: libc::flock = unsafe { std::mem::zeroed() };
    flock.l_type = match lock {
        Lock::Shared => libc::F_RDLCK,
        Lock::Exclusive => libc::F_WRLCK,
        Lock::Unlocked => libc::F_UNLCK,
    } as libc::c_short;
    flock.l_whence = libc::SEEK_SET as libc::c_short;
    flock.l_start = byte;
    flock.l_len = 1;
    flock
}

/// Sets `lock` on `byte` of `file`'s open file description, waiting for others' locks with
/// `wait`. Returns `false` when it would have to wait and `wait` is not set.
fn set(file: &File, byte: i64, lock: Lock, wait: bool) -> io::Result<bool> {
    let request = flock(byte, lock);
    let arg = match wait {
        true => FcntlArg::F_OFD_SETLKW(&request),
        false => FcntlArg::F_OFD_SETLK(&request),
    };
    match fcntl(file, arg) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) if !wait => Ok(false),
        Err(errno) => Err(io::Error::from(errno)),
    }
}

/// Whether another open file description holds a lock on `byte` of `file`.
fn locked_by_others(file: &File, byte: i64) -> io::Result<bool> {
    let mut probe = flock(byte, Lock::Exclusive);
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe)).map_err(io::Error::from)?;
    Ok(probe.l_type != libc::F_UNLCK as libc::c_short)
}

/// Holds the open byte exclusively until dropped: opens and closes of the zone one at a time.
/// Its file is a duplicate of the zone's descriptor: the same open file description, whose
/// locks these are.
#[derive(Debug)]
pub struct OpenGuard(File);

impl OpenGuard {
    /// Waits for the open byte.
    pub fn lock(file: &File) -> io::Result<Self> {
        let file = file.try_clone()?;
        set(&file, OPEN_BYTE, Lock::Exclusive, true)?;
        Ok(OpenGuard(file))
    }

    /// Whether no other process has the zone open: then this one takes the present byte
    /// exclusively, and must [`OpenGuard::share`] it once it has recovered the zone.
    pub fn alone(&self) -> io::Result<bool> {
        set(&self.0, PRESENT_BYTE, Lock::Exclusive, false)
    }

    /// Holds the present byte shared: the zone is open here.
    pub fn share(&self) -> io::Result<()> {
        set(&self.0, PRESENT_BYTE, Lock::Shared, true).map(|_| ())
    }

    /// Gives up the present byte (closing).
    pub fn leave(&self) -> io::Result<()> {
        set(&self.0, PRESENT_BYTE, Lock::Unlocked, false).map(|_| ())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        // Closing a duplicate does not release an OFD lock: unlock explicitly.
        let _ = set(&self.0, OPEN_BYTE, Lock::Unlocked, false);
    }
}

/// This process's entry in a zone's process table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEntry {
    /// Index in the table.
    pub index: usize,
    /// The token that names the process in the zone (non-zero).
    pub token: u64,
}

/// A process in the table, as [`Table::entries`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Index in the table.
    pub index: usize,
    /// Its process id.
    pub pid: u32,
    /// Its token.
    pub token: u64,
    /// Whether it still runs (its byte is locked).
    pub alive: bool,
}

/// The process table in the header page.
#[derive(Debug, Clone, Copy)]
pub struct Table<'a> {
    words: &'a [AtomicU64],
}

impl<'a> Table<'a> {
    /// The table over `words` (at least [`MAX_PROCESSES`] entries).
    pub fn new(words: &'a [AtomicU64]) -> Self {
        debug_assert!(words.len() >= MAX_PROCESSES * ENTRY_WORDS);
        Self { words }
    }

    fn pid(&self, index: usize) -> u64 {
        self.words[index * ENTRY_WORDS].load(Ordering::Acquire)
    }

    fn token(&self, index: usize) -> u64 {
        self.words[index * ENTRY_WORDS + 1].load(Ordering::Acquire)
    }

    /// Empties every entry (the opener is alone).
    pub fn clear(&self) {
        for word in self.words.iter().take(MAX_PROCESSES * ENTRY_WORDS) {
            word.store(0, Ordering::Release);
        }
    }

    /// The processes the table holds, alive or dead (as seen through `file`).
    pub fn entries(&self, file: &File) -> io::Result<Vec<Process>> {
        let mut processes = Vec::new();
        for index in 0..MAX_PROCESSES {
            let token = self.token(index);
            if token == 0 {
                continue;
            }
            processes.push(Process {
                index,
                pid: u32::try_from(self.pid(index)).unwrap_or(0),
                token,
                alive: locked_by_others(file, PROCESS_BYTES + index as i64)?,
            });
        }
        Ok(processes)
    }

    /// The live process named by `token`, if any.
    pub fn live(&self, file: &File, token: u64) -> io::Result<Option<Process>> {
        Ok(self
            .entries(file)?
            .into_iter()
            .find(|p| p.token == token && p.alive))
    }

    /// Takes a free entry for this process with a new `token` and locks its byte; `None` when
    /// the table is full. Called under the open byte.
    pub fn join(&self, file: &File, token: u64) -> io::Result<Option<ProcessEntry>> {
        let Some(index) = (0..MAX_PROCESSES).find(|&i| self.token(i) == 0) else {
            return Ok(None);
        };
        if !set(file, PROCESS_BYTES + index as i64, Lock::Exclusive, false)? {
            return Err(io::Error::other(format!(
                "process table entry {index} is free but its byte is locked"
            )));
        }
        self.words[index * ENTRY_WORDS].store(u64::from(std::process::id()), Ordering::Release);
        self.words[index * ENTRY_WORDS + 1].store(token, Ordering::Release);
        Ok(Some(ProcessEntry { index, token }))
    }

    /// Empties `entry` and unlocks its byte (a process leaving, or a dead one's entry once its
    /// part of the zone was recovered; its byte is not locked then).
    pub fn remove(&self, file: &File, index: usize) -> io::Result<()> {
        self.words[index * ENTRY_WORDS + 1].store(0, Ordering::Release);
        self.words[index * ENTRY_WORDS].store(0, Ordering::Release);
        set(file, PROCESS_BYTES + index as i64, Lock::Unlocked, false).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file() -> File {
        use std::os::unix::fs::OpenOptionsExt;
        File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(std::env::temp_dir())
            .unwrap()
    }

    #[test]
    fn locks_of_another_open_file_description_are_seen_and_released_with_it() {
        let file = temp_file();
        // Another open of the same file: what a second process has.
        let other = File::options()
            .read(true)
            .write(true)
            .open(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&file)
            ))
            .unwrap();
        let words: Vec<AtomicU64> = (0..MAX_PROCESSES * ENTRY_WORDS)
            .map(|_| AtomicU64::new(0))
            .collect();
        let table = Table::new(&words);
        {
            let first = OpenGuard::lock(&file).unwrap();
            assert!(first.alone().unwrap());
            first.share().unwrap();
        }
        let entry = table.join(&file, 77).unwrap().unwrap();
        assert_eq!(
            entry,
            ProcessEntry {
                index: 0,
                token: 77
            }
        );
        {
            let second = OpenGuard::lock(&other).unwrap();
            assert!(!second.alone().unwrap(), "the first holds the present byte");
            second.share().unwrap();
        }
        let seen = table.entries(&other).unwrap();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].alive && seen[0].pid == std::process::id());
        assert_eq!(table.live(&other, 77).unwrap().map(|p| p.index), Some(0));
        assert_eq!(table.live(&other, 78).unwrap(), None);
        // The first "dies": closing its file description drops its locks.
        drop(file);
        assert!(!table.entries(&other).unwrap()[0].alive);
        let guard = OpenGuard::lock(&other).unwrap();
        assert!(guard.alone().unwrap(), "only the second is left");
        table.remove(&other, 0).unwrap();
        assert!(table.entries(&other).unwrap().is_empty());
    }
}
