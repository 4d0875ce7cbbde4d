//! Reserving hugetlb pages for a test and putting the old setting back.

use std::fs;
use std::sync::{Mutex, MutexGuard};

/// Serialises the tests of one binary that change the huge page pool.
static LOCK: Mutex<()> = Mutex::new(());

/// Huge pages reserved for a test; the old `nr_hugepages` comes back on drop.
pub struct HugePages {
    path: String,
    old: Option<u64>,
    _guard: MutexGuard<'static, ()>,
}

fn read(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn available(dir: &str) -> u64 {
    let free = read(&format!("{dir}/free_hugepages")).unwrap_or(0);
    free.saturating_sub(read(&format!("{dir}/resv_hugepages")).unwrap_or(0))
}

impl HugePages {
    /// Makes sure `count` pages of `kb` KiB are free, raising `nr_hugepages` if needed.
    /// `Err` says why not (the caller prints SKIP).
    pub fn reserve(kb: u64, count: u64) -> Result<Self, String> {
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let dir = format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB");
        let path = format!("{dir}/nr_hugepages");
        let old = read(&path).ok_or_else(|| format!("no {kb} kB huge pages on this kernel"))?;
        let free = available(&dir);
        if free >= count {
            return Ok(Self {
                path,
                old: None,
                _guard: guard,
            });
        }
        let want = old + count - free;
        fs::write(&path, want.to_string())
            .map_err(|e| format!("cannot raise {path} to {want}: {e}"))?;
        let pages = Self {
            path,
            old: Some(old),
            _guard: guard,
        };
        let got = available(&dir);
        if got < count {
            return Err(format!(
                "only {got} of {count} {kb} kB huge pages could be reserved"
            ));
        }
        Ok(pages)
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            let _ = fs::write(&self.path, old.to_string());
        }
    }
}
