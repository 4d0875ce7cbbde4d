//! Thin wrappers around the Linux system calls guest memory needs.

pub mod mmap;
pub mod uffd;

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Creates a memfd; `huge_shift` asks for hugetlb pages of `1 << huge_shift` bytes.
pub fn memfd(name: &CStr, huge_shift: Option<u32>) -> io::Result<OwnedFd> {
    let mut flags = libc::MFD_CLOEXEC;
    if let Some(shift) = huge_shift {
        flags |= libc::MFD_HUGETLB | (shift << libc::MFD_HUGE_SHIFT);
    }
    // SAFETY: `name` is a valid C string; the call returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Frees the file blocks of `[offset, offset + len)`, keeping the file size.
pub fn punch_hole(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate only reads its integer arguments.
    let rc = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel thread id of the calling thread.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Sends `signal` to thread `tid` of this process.
pub fn tgkill(tid: u32, signal: i32) -> io::Result<()> {
    // SAFETY: tgkill only reads its integer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::pid_t, signal) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
