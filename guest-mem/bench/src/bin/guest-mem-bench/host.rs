//! Host memory outside guest-mem, for the baselines and the step-by-step measurements: plain
//! anonymous memory and raw memfds, on guest-mem's own mapping helpers.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

pub use guest_mem::testing::Mapping;

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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

/// A memfd of `len` bytes, mapped shared and read/write; `huge_shift` asks for hugetlb pages
/// of `1 << huge_shift` bytes.
pub fn mapped_memfd(huge_shift: Option<u32>, len: u64) -> io::Result<(File, Mapping)> {
    let file = File::from(guest_mem::testing::memfd(c"guest-mem-bench", huge_shift)?);
    file.set_len(len)?;
    let map = Mapping::shared_file(file.as_raw_fd(), 0, len as usize)?;
    Ok((file, map))
}

/// `len` bytes of private anonymous memory aligned to `align`, with transparent huge pages
/// (`thp`) or without.
pub fn plain_memory(len: u64, align: u64, thp: bool) -> io::Result<Mapping> {
    let map = Mapping::anonymous(len as usize, align as usize)?;
    let advice = match thp {
        true => libc::MADV_HUGEPAGE,
        false => libc::MADV_NOHUGEPAGE,
    };
    madvise(map.addr(), map.len(), advice)?;
    Ok(map)
}

/// fallocate `mode` over `[offset, offset + len)` of the file `fd`.
pub fn fallocate(fd: RawFd, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate only reads its integer arguments.
    check(unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) })
}
