//! Host memory outside guest-mem: plain anonymous memory (the baseline) and raw memfds for the
//! step-by-step measurements.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

/// A mapping owned by the benchmark, unmapped on drop.
#[derive(Debug)]
pub struct HostMap {
    addr: usize,
    len: usize,
}

fn check_map(addr: *mut libc::c_void) -> io::Result<usize> {
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(addr as usize)
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl HostMap {
    /// `len` bytes of private anonymous memory, aligned to `align` (a power of two).
    pub fn anonymous(len: usize, align: usize) -> io::Result<Self> {
        let span = len + align;
        // SAFETY: a fresh mapping at a kernel-chosen address touches no existing memory.
        let raw = check_map(unsafe {
            libc::mmap(
                ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        })?;
        let addr = raw.next_multiple_of(align);
        // SAFETY: both trimmed pieces lie inside the mapping made above and are unused.
        unsafe {
            if addr > raw {
                libc::munmap(raw as *mut _, addr - raw);
            }
            if raw + span > addr + len {
                libc::munmap((addr + len) as *mut _, raw + span - addr - len);
            }
        }
        Ok(Self { addr, len })
    }

    /// All of `file` (`len` bytes), shared, at a kernel-chosen address.
    pub fn shared(file: &File, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address touches no existing memory.
        let addr = check_map(unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        })?;
        Ok(Self { addr, len })
    }

    /// The first address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Maps `len` bytes of `file` at `offset` over `[addr, addr + len)` of this mapping.
    pub fn map_file_at(&self, addr: usize, len: usize, file: &File, offset: u64) -> io::Result<()> {
        assert!(addr >= self.addr && addr + len <= self.addr + self.len);
        // SAFETY: the range lies inside this mapping, which the benchmark owns; MAP_FIXED
        // replaces only that range.
        check_map(unsafe {
            libc::mmap(
                addr as *mut _,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                offset as libc::off_t,
            )
        })
        .map(drop)
    }

    /// Replaces `[addr, addr + len)` of this mapping with fresh anonymous memory.
    pub fn map_anonymous_at(&self, addr: usize, len: usize) -> io::Result<()> {
        assert!(addr >= self.addr && addr + len <= self.addr + self.len);
        // SAFETY: as in `map_file_at`.
        check_map(unsafe {
            libc::mmap(
                addr as *mut _,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        })
        .map(drop)
    }
}

impl Drop for HostMap {
    fn drop(&mut self) {
        // SAFETY: the range is owned by this value and nothing refers to it any more.
        unsafe { libc::munmap(self.addr as *mut _, self.len) };
    }
}

/// madvise over `[addr, addr + len)`.
pub fn madvise(addr: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: madvise only changes how the kernel handles the range; the advice values used
    // (huge page hints, populate, DONTNEED on memory the caller gave up) keep it valid.
    check(unsafe { libc::madvise(addr as *mut _, len, advice) })
}

/// Makes the kernel allocate (and zero) every page of `[addr, addr + len)` for writing.
pub fn populate_write(addr: usize, len: usize) -> io::Result<()> {
    madvise(addr, len, libc::MADV_POPULATE_WRITE)
}

/// A memfd of `len` bytes; `huge_shift` asks for hugetlb pages of `1 << huge_shift` bytes.
pub fn memfd(huge_shift: Option<u32>, len: u64) -> io::Result<File> {
    let mut flags = libc::MFD_CLOEXEC;
    if let Some(shift) = huge_shift {
        flags |= libc::MFD_HUGETLB | (shift << libc::MFD_HUGE_SHIFT);
    }
    // SAFETY: the name is a valid C string; the call returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"guest-mem-bench".as_ptr(), flags) };
    check(fd)?;
    // SAFETY: `fd` is a fresh fd that nothing else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(len)?;
    Ok(file)
}

/// fallocate `mode` over `[offset, offset + len)` of `file`.
pub fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate only reads its integer arguments.
    check(unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })
}

/// Frees the pages of `[offset, offset + len)` of `file`.
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate(
        file,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        offset,
        len,
    )
}
