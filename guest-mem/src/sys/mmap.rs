//! Owned host virtual ranges and the fixed-address mappings placed inside them.

use std::io;
use std::os::fd::RawFd;
use std::ptr;

/// An owned range of host virtual memory, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

// SAFETY: a `Mapping` is only an address range; access to the memory is synchronised by its users.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the address and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of private anonymous read/write memory (no swap reservation).
    #[cfg(test)]
    pub fn anonymous(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address touches no existing memory.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            addr: addr as usize,
            len,
        })
    }

    /// Reserves `len` bytes of inaccessible address space whose start is congruent to `phase`
    /// modulo `align` (a power of two).
    pub fn reserve_aligned(len: usize, align: usize, phase: usize) -> io::Result<Self> {
        let span = len
            .checked_add(align)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: a fresh PROT_NONE mapping at a kernel-chosen address touches no existing memory.
        let raw = unsafe {
            libc::mmap(
                ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let raw = raw as usize;
        let start = raw + (phase.wrapping_sub(raw) & (align - 1));
        // SAFETY: both trimmed pieces lie inside the reservation made above and are unused.
        unsafe {
            if start > raw {
                libc::munmap(raw as *mut _, start - raw);
            }
            let end = start + len;
            if raw + span > end {
                libc::munmap(end as *mut _, raw + span - end);
            }
        }
        Ok(Self { addr: start, len })
    }

    /// Maps a shared file range of `len` bytes at file offset `offset`, PROT_READ|PROT_WRITE, at a
    /// kernel-chosen address.
    pub fn shared_file(fd: RawFd, offset: u64, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address touches no existing memory.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                offset as libc::off_t,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            addr: addr as usize,
            len,
        })
    }

    /// Maps a shared file range with no access, only to take the file's huge page reservation.
    pub fn reserve_file(fd: RawFd, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address touches no existing memory.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            addr: addr as usize,
            len,
        })
    }

    /// The first address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range is owned by this value and nothing refers to it any more.
        unsafe { libc::munmap(self.addr as *mut _, self.len) };
    }
}

/// Replaces `[addr, addr + len)` with fresh private anonymous read/write memory.
///
/// # Safety
/// The range must be owned by the caller (part of one of its `Mapping`s) and hold nothing that
/// anyone still relies on.
pub unsafe fn map_placeholder(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range (see above); MAP_FIXED replaces only that range.
    let got = unsafe {
        libc::mmap(
            addr as *mut _,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps `len` bytes of `fd` at `offset` over `[addr, addr + len)`, shared, read/write.
///
/// With `sync`, asks for MAP_SYNC (DAX); the caller has checked that the file supports it.
///
/// # Safety
/// As for [`map_placeholder`].
pub unsafe fn map_shared_fixed(
    addr: usize,
    len: usize,
    fd: RawFd,
    offset: u64,
    sync: bool,
) -> io::Result<()> {
    let flags = if sync {
        libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC | libc::MAP_FIXED
    } else {
        libc::MAP_SHARED | libc::MAP_FIXED
    };
    // SAFETY: the caller owns the range; MAP_FIXED replaces only that range.
    let got = unsafe {
        libc::mmap(
            addr as *mut _,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            offset as libc::off_t,
        )
    };
    if got == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` can be mapped with MAP_SYNC (a file on a DAX file system or a DAX device).
pub fn supports_map_sync(fd: RawFd, offset: u64, len: usize) -> bool {
    // SAFETY: a fresh mapping at a kernel-chosen address, unmapped right away.
    let addr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
            fd,
            offset as libc::off_t,
        )
    };
    if addr == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the mapping was created just above and is not used.
    unsafe { libc::munmap(addr, len) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_has_the_requested_phase() {
        let align = 1 << 30;
        let phase = 3 << 21;
        let m = Mapping::reserve_aligned(8 << 20, align, phase).expect("reserve");
        assert_eq!(m.addr() % align, phase);
        assert_eq!(m.len(), 8 << 20);
    }

    #[test]
    fn placeholder_replaces_a_range_with_zeroed_memory() {
        let m = Mapping::anonymous(3 * 4096).expect("mmap");
        let p = (m.addr() + 4096) as *mut u8;
        // SAFETY: `p` lies inside `m`.
        unsafe { p.write_volatile(7) };
        // SAFETY: the middle page belongs to `m` and nothing refers to it.
        unsafe { map_placeholder(m.addr() + 4096, 4096) }.expect("placeholder");
        // SAFETY: `p` lies inside `m`, which is mapped again.
        assert_eq!(unsafe { p.read_volatile() }, 0);
    }
}
