//! Reserving hugetlb pages through sysfs and putting the old setting back: on drop, and from a
//! signal handler with [`restore_huge_pages_now`].

use std::ffi::CString;
use std::fs;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Serialises the users of one huge page size within a process (2 MiB, 1 GiB).
static LOCKS: [Mutex<()>; 2] = [Mutex::new(()), Mutex::new(())];

/// A setting to write back: the path and the old value, ready for raw system calls.
struct OldSetting {
    path: CString,
    value: Vec<u8>,
}

/// The settings raised now, one slot per page size, for [`restore_huge_pages_now`].
static RAISED: [AtomicPtr<OldSetting>; 2] = [
    AtomicPtr::new(ptr::null_mut()),
    AtomicPtr::new(ptr::null_mut()),
];

/// Huge pages reserved for a test or benchmark; the old `nr_hugepages` comes back on drop.
#[derive(Debug)]
pub struct HugePageReservation {
    slot: usize,
    _guard: MutexGuard<'static, ()>,
}

fn read(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn available(dir: &str) -> u64 {
    let free = read(&format!("{dir}/free_hugepages")).unwrap_or(0);
    free.saturating_sub(read(&format!("{dir}/resv_hugepages")).unwrap_or(0))
}

impl HugePageReservation {
    /// Makes sure `count` pages of `kb` KiB (2048 or 1048576) are free and unreserved, raising
    /// `nr_hugepages` if needed. `Err` says why not (the caller prints SKIP).
    pub fn reserve(kb: u64, count: u64) -> Result<Self, String> {
        let slot = usize::from(kb != 2048);
        let guard = LOCKS[slot].lock().unwrap_or_else(|e| e.into_inner());
        let dir = format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB");
        let path = format!("{dir}/nr_hugepages");
        let old = read(&path).ok_or_else(|| format!("no {kb} kB huge pages on this kernel"))?;
        let pages = Self {
            slot,
            _guard: guard,
        };
        let free = available(&dir);
        if free >= count {
            return Ok(pages);
        }
        let setting = OldSetting {
            path: CString::new(path.clone()).map_err(|e| e.to_string())?,
            value: old.to_string().into_bytes(),
        };
        RAISED[slot].store(Box::into_raw(Box::new(setting)), Ordering::SeqCst);
        let want = old + count - free;
        fs::write(&path, want.to_string())
            .map_err(|e| format!("cannot raise {path} to {want}: {e}"))?;
        let got = available(&dir);
        if got < count {
            return Err(format!(
                "only {got} of {count} {kb} kB huge pages could be reserved"
            ));
        }
        Ok(pages)
    }
}

impl Drop for HugePageReservation {
    fn drop(&mut self) {
        let setting = RAISED[self.slot].swap(ptr::null_mut(), Ordering::SeqCst);
        if !setting.is_null() {
            // SAFETY: the pointer came from `Box::into_raw` in `reserve` and was just taken out
            // of the slot, so nobody else frees it.
            let setting = unsafe { Box::from_raw(setting) };
            write_back(&setting);
        }
    }
}

/// Writes an old setting back with raw system calls (async-signal-safe).
fn write_back(setting: &OldSetting) {
    // SAFETY: `path` is a valid C string; open only reads it.
    let fd = unsafe { libc::open(setting.path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: `value` is valid for its length; `fd` is the descriptor opened above.
        unsafe {
            libc::write(fd, setting.value.as_ptr().cast(), setting.value.len());
            libc::close(fd);
        }
    }
}

/// Puts back every `nr_hugepages` raised by a live [`HugePageReservation`], without allocating or taking
/// locks, so that a signal handler may call it just before the process exits.
pub fn restore_huge_pages_now() {
    for slot in &RAISED {
        let setting = slot.swap(ptr::null_mut(), Ordering::SeqCst);
        // SAFETY: a non-null pointer came from `Box::into_raw` and was just taken out of the
        // slot; it is only read (and leaked: the process is about to exit).
        if let Some(setting) = unsafe { setting.as_ref() } {
            write_back(setting);
        }
    }
}
