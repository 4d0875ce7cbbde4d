//! Thin wrappers around the Linux system calls guest memory needs.

pub mod mmap;
pub mod uffd;

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use vmm_sys_util::fallocate::{fallocate, FallocateMode};

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
pub fn punch_hole(file: &impl AsRawFd, offset: u64, len: u64) -> io::Result<()> {
    fallocate(file, FallocateMode::PunchHole, true, offset, len).map_err(io::Error::from)
}

/// A random u64 from the kernel (getrandom), for identities that must differ between objects.
pub fn random_u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(bytes))
}

/// The kernel thread id of the calling thread, as userfaultfd reports it.
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

/// What [`wait_readable`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// The fd is readable.
    Readable,
    /// The stop event was signalled (it stays signalled: every waiter sees it).
    Stopped,
    /// The timeout passed first.
    TimedOut,
}

/// Waits until `fd` is readable or `stop` is signalled, at most `timeout_ms` milliseconds (-1:
/// no limit); a signal interrupting the wait restarts it. The loop of a service thread that a
/// level-triggered eventfd stops.
pub fn wait_readable(
    fd: &impl AsRawFd,
    stop: &impl AsRawFd,
    timeout_ms: i32,
) -> io::Result<Readiness> {
    loop {
        let mut fds = [fd.as_raw_fd(), stop.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: `fds` is an array of two valid pollfd structures whose fds outlive the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        return Ok(if fds[1].revents != 0 {
            Readiness::Stopped
        } else if ready == 0 {
            Readiness::TimedOut
        } else {
            Readiness::Readable
        });
    }
}
