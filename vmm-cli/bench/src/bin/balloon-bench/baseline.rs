//! The baseline: what QEMU and Firecracker do with a balloon page or a reported range of
//! private anonymous guest memory, `madvise(MADV_DONTNEED)`, on 4 KiB pieces (QEMU's inflate)
//! or on whole ranges (Firecracker's inflate of contiguous pages, both VMMs' free page
//! reporting).

use std::time::{Duration, Instant};

use crate::{HUGE, PAGE};

/// Private anonymous memory, with or without transparent huge pages.
pub struct Anonymous {
    mapping: *mut libc::c_void,
    len: usize,
    addr: *mut u8,
    size: usize,
}

impl Anonymous {
    pub fn new(size: u64, thp: bool) -> Result<Self, String> {
        let size = size as usize;
        // Over-allocate by one huge page so that the used part is 2 MiB aligned, as THP needs.
        let len = size + HUGE as usize;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let addr = (raw as usize).next_multiple_of(HUGE as usize) as *mut u8;
        let advice = if thp {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        // SAFETY: advice on our own mapping.
        if unsafe { libc::madvise(raw, len, advice) } != 0 {
            return Err(format!("madvise: {}", std::io::Error::last_os_error()));
        }
        Ok(Self {
            mapping: raw,
            len,
            addr,
            size,
        })
    }

    /// Makes every 4 KiB page resident.
    fn touch(&self) {
        for offset in (0..self.size).step_by(PAGE as usize) {
            // SAFETY: inside our mapping.
            unsafe { self.addr.add(offset).write_volatile(1) };
        }
    }

    /// Discards all of the memory with `madvise(MADV_DONTNEED)` calls of `piece` bytes, after
    /// touching it; returns the time of the calls.
    pub fn discard(&self, piece: u64) -> Result<Duration, String> {
        self.touch();
        let started = Instant::now();
        for offset in (0..self.size).step_by(piece as usize) {
            self.dontneed(offset, piece as usize)?;
        }
        Ok(started.elapsed())
    }

    /// Latency of discarding one touched 2 MiB range, in pieces of `piece` bytes.
    pub fn discard_latency(&self, piece: u64, samples: usize) -> Result<Vec<Duration>, String> {
        (0..samples)
            .map(|_| {
                for offset in (0..HUGE as usize).step_by(PAGE as usize) {
                    // SAFETY: inside our mapping.
                    unsafe { self.addr.add(offset).write_volatile(1) };
                }
                let started = Instant::now();
                for offset in (0..HUGE as usize).step_by(piece as usize) {
                    self.dontneed(offset, piece as usize)?;
                }
                Ok(started.elapsed())
            })
            .collect()
    }

    fn dontneed(&self, offset: usize, len: usize) -> Result<(), String> {
        // SAFETY: a range of our own mapping, whose contents nobody needs any more.
        let rc = unsafe { libc::madvise(self.addr.add(offset).cast(), len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(format!("madvise: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Anonymous {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, which nothing uses any more.
        unsafe { libc::munmap(self.mapping, self.len) };
    }
}
