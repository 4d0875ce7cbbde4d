//! Owned host virtual ranges and the fixed-address mappings placed inside them.

use std::io;
use std::os::fd::RawFd;
use std::ptr;

/// The base page size.
const PAGE: usize = 4096;

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

/// mmap(2) of `len` bytes with `prot` and `flags` at `addr` (null: a kernel-chosen address);
/// returns the mapping's address.
///
/// # Safety
/// With MAP_FIXED, `[addr, addr + len)` must be owned by the caller and hold nothing that anyone
/// still relies on; without it, `addr` must be null.
unsafe fn mmap(
    addr: *mut libc::c_void,
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: RawFd,
    offset: u64,
) -> io::Result<usize> {
    // SAFETY: forwarded from the caller; a new mapping touches no memory outside its range.
    let got = unsafe { libc::mmap(addr, len, prot, flags, fd, offset as libc::off_t) };
    if got == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(got as usize)
}

/// Read and write access.
const READ_WRITE: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;
/// Private anonymous memory without swap reservation.
const ANONYMOUS: libc::c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
/// Shared anonymous memory (an object of its own per mapping) without swap reservation.
const SHARED_ANONYMOUS: libc::c_int = libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;

// A mapping is never empty: mmap refuses a length of 0.
#[allow(clippy::len_without_is_empty)]
impl Mapping {
    /// Maps `len` bytes of private anonymous read/write memory (no swap reservation) whose start
    /// is a multiple of `align` (a power of two): for tests and benchmarks.
    #[cfg(any(test, feature = "testing"))]
    pub fn anonymous(len: usize, align: usize) -> io::Result<Self> {
        let map = Self::reserve_aligned(len, align, 0)?;
        let flags = ANONYMOUS | libc::MAP_FIXED;
        // SAFETY: the range was just reserved by `map` and holds nothing; MAP_FIXED replaces
        // only that range.
        unsafe { mmap(map.addr as *mut _, map.len, READ_WRITE, flags, -1, 0) }?;
        Ok(map)
    }

    /// Maps `len` bytes of placeholder memory (see [`map_placeholder`]) whose start is a
    /// multiple of `align` (a power of two).
    pub fn placeholder(len: usize, align: usize) -> io::Result<Self> {
        let map = Self::reserve_aligned(len, align, 0)?;
        // SAFETY: the range was just reserved by `map` and holds nothing.
        unsafe { map_placeholder(map.addr, map.len) }?;
        Ok(map)
    }

    /// Reserves `len` bytes of inaccessible address space whose start is congruent to `phase`
    /// modulo `align` (a power of two).
    pub fn reserve_aligned(len: usize, align: usize, phase: usize) -> io::Result<Self> {
        let span = len
            .checked_add(align)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: a fresh mapping at a kernel-chosen address.
        let raw = unsafe { mmap(ptr::null_mut(), span, libc::PROT_NONE, ANONYMOUS, -1, 0) }?;
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
        Self::map_shared_file(fd, offset, len, 0)
    }

    /// A shared file mapping (PROT_READ|PROT_WRITE, kernel-chosen address) with MAP_SYNC, for a
    /// file on a DAX file system: what is stored to it is durable without msync once it leaves
    /// the CPU caches. Fails with EOPNOTSUPP elsewhere.
    pub fn shared_file_sync(fd: RawFd, offset: u64, len: usize) -> io::Result<Self> {
        Self::map_shared_file(fd, offset, len, libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC)
    }

    /// Like a shared file mapping (PROT_READ|PROT_WRITE, kernel-chosen address), with every page
    /// of the range mapped by the mmap call itself (MAP_POPULATE: pages in the file are mapped in
    /// batches, missing ones allocated), so that writing all of it takes no page fault.
    pub fn shared_file_populated(fd: RawFd, offset: u64, len: usize) -> io::Result<Self> {
        Self::map_shared_file(fd, offset, len, libc::MAP_POPULATE)
    }

    fn map_shared_file(fd: RawFd, offset: u64, len: usize, flags: libc::c_int) -> io::Result<Self> {
        let flags = libc::MAP_SHARED | flags;
        // SAFETY: a fresh mapping at a kernel-chosen address.
        let addr = unsafe { mmap(ptr::null_mut(), len, READ_WRITE, flags, fd, offset) }?;
        Ok(Self { addr, len })
    }

    /// Maps a shared file range with no access, only to take the file's huge page reservation.
    pub fn reserve_file(fd: RawFd, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address.
        let addr = unsafe {
            mmap(
                ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        }?;
        Ok(Self { addr, len })
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

/// Replaces `[addr, addr + len)` with a placeholder: fresh shared anonymous read/write memory
/// (an object of its own), which reads as zeros until written and on which userfaultfd is
/// registered where guest memory waits for its frames.
///
/// Shared, not private: a fault on shared anonymous memory reaches userfaultfd before the kernel
/// allocates anything for it, a page table included, so mapping a frame over the range later
/// unmaps nothing and flushes no other CPU's TLB. On private anonymous memory the fault first
/// installs a page table (freeing it again when the frame replaces the range sends a
/// TLB-shootdown IPI to every CPU the process runs on, a vCPU's included), or where transparent
/// huge pages are always on, allocates and zeroes a 2 MiB page that it then drops.
///
/// # Safety
/// The range must be owned by the caller (part of one of its `Mapping`s) and hold nothing that
/// anyone still relies on.
pub unsafe fn map_placeholder(addr: usize, len: usize) -> io::Result<()> {
    let flags = SHARED_ANONYMOUS | libc::MAP_FIXED;
    // SAFETY: the caller owns the range (see above); MAP_FIXED replaces only that range.
    unsafe { mmap(addr as *mut _, len, READ_WRITE, flags, -1, 0) }.map(drop)
}

/// Replaces `[addr, addr + len)` with an inaccessible reservation (PROT_NONE): neither the
/// guest (KVM fails the access) nor this process can touch it, and no fault reaches
/// userfaultfd.
///
/// # Safety
/// As for [`map_placeholder`].
pub unsafe fn map_inaccessible(addr: usize, len: usize) -> io::Result<()> {
    let flags = ANONYMOUS | libc::MAP_FIXED;
    // SAFETY: the caller owns the range (see above); MAP_FIXED replaces only that range.
    unsafe { mmap(addr as *mut _, len, libc::PROT_NONE, flags, -1, 0) }.map(drop)
}

/// Drops the pages of placeholder `[addr, addr + len)` and what backs them (MADV_REMOVE): it
/// reads as zero again, or faults to userfaultfd where it is registered.
///
/// # Safety
/// As for [`map_placeholder`], and the range is a placeholder.
pub unsafe fn drop_pages(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range, whose contents nobody relies on.
    if unsafe { libc::madvise(addr as *mut _, len, libc::MADV_REMOVE) } < 0 {
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
    unsafe { mmap(addr as *mut _, len, READ_WRITE, flags, fd, offset) }.map(drop)
}

/// Maps `len` bytes of `fd` at `offset` over `[addr, addr + len)`, private, read/write: reads
/// share the file's page cache with every other private mapping of it, a write copies the page
/// into memory of this process's own (the file never changes). With `reserve`, the memory for
/// those copies is reserved now (a hugetlbfs file: the mapping fails while the huge page pool
/// cannot hold them all, where a later copy without a page would kill the process).
///
/// # Safety
/// As for [`map_placeholder`].
pub unsafe fn map_private_fixed(
    addr: usize,
    len: usize,
    fd: RawFd,
    offset: u64,
    reserve: bool,
) -> io::Result<()> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_FIXED;
    if !reserve {
        flags |= libc::MAP_NORESERVE;
    }
    // SAFETY: the caller owns the range; MAP_FIXED replaces only that range.
    unsafe { mmap(addr as *mut _, len, READ_WRITE, flags, fd, offset) }.map(drop)
}

/// Maps fresh private anonymous memory (no swap reservation; of 2 MiB huge pages with `huge`)
/// over `[addr, addr + len)`.
///
/// # Safety
/// As for [`map_placeholder`].
pub unsafe fn map_anonymous_fixed(addr: usize, len: usize, huge: bool) -> io::Result<()> {
    let mut flags = ANONYMOUS | libc::MAP_FIXED;
    if huge {
        flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
    }
    // SAFETY: the caller owns the range; MAP_FIXED replaces only that range.
    unsafe { mmap(addr as *mut _, len, READ_WRITE, flags, -1, 0) }.map(drop)
}

/// Drops the private copies of `[addr, addr + len)` of a private file mapping (MADV_DONTNEED):
/// the range reads as the file again, and its written pages' memory goes back to the host.
///
/// # Safety
/// The range must be part of a private file mapping of the caller's whose written contents
/// nobody relies on.
pub unsafe fn drop_private_copies(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range, whose written contents nobody relies on.
    if unsafe { libc::madvise(addr as *mut _, len, libc::MADV_DONTNEED) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Faults `[addr, addr + len)` in for writing, keeping its contents, so that later accesses find
/// every page allocated, zeroed and mapped: MADV_POPULATE_WRITE (Linux 5.14), or where the kernel
/// does not know it (EINVAL), a write of one byte per 4 KiB page that stores what is there.
///
/// # Safety
/// The range must be mapped read/write, nobody may write to it meanwhile, and its pages must be
/// allocatable (a hugetlb pool's pages are reserved, memfds have no size limit): where the kernel
/// cannot allocate one, the fallback's write ends in SIGBUS, where MADV_POPULATE_WRITE returns an
/// error.
pub unsafe fn prefault(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller's range is mapped; the advice changes no contents.
    let rc = unsafe { libc::madvise(addr as *mut _, len, libc::MADV_POPULATE_WRITE) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EINVAL) {
        return Err(err);
    }
    // SAFETY: forwarded from the caller.
    unsafe { touch_pages(addr, len) };
    Ok(())
}

/// Writes to every 4 KiB page of `[addr, addr + len)` without changing it: its first byte is
/// read and written back (volatile accesses, which the compiler keeps; an atomic no-op such as
/// `fetch_or(0)` may be turned into a load, which faults nothing in for writing).
///
/// # Safety
/// As for [`prefault`], and nobody else writes to the range meanwhile.
unsafe fn touch_pages(addr: usize, len: usize) {
    for page in (addr..addr + len).step_by(PAGE) {
        let byte = page as *mut u8;
        // SAFETY: the byte lies in the caller's read/write range, which nobody else writes.
        unsafe { byte.write_volatile(byte.read_volatile()) };
    }
}

/// How stores through a shared mapping of a file are made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// msync writes the mapped pages back (a file in the page cache or on a DAX file system).
    Msync,
    /// A device DAX: a store is on the device once it left the CPU caches, and msync is refused
    /// (a character device has no fsync), so the cache lines are flushed.
    FlushCaches,
}

/// Makes the stores to `[addr, addr + len)` (a shared mapping of a file) durable, `how` the
/// file needs it.
pub fn sync(addr: usize, len: usize, how: Durability) -> io::Result<()> {
    match how {
        Durability::Msync => msync(addr, len),
        Durability::FlushCaches => {
            flush_caches(addr, len);
            Ok(())
        }
    }
}

/// Flushes the CPU cache lines of `[addr, addr + len)` to memory (clflush, then a store fence).
fn flush_caches(addr: usize, len: usize) {
    const LINE: usize = 64;
    for line in (addr & !(LINE - 1)..addr + len).step_by(LINE) {
        // SAFETY: clflush reads no data and changes none; the line lies in the caller's mapping.
        unsafe { std::arch::x86_64::_mm_clflush(line as *const u8) };
    }
    // SAFETY: a store fence has no operands.
    unsafe { std::arch::x86_64::_mm_sfence() };
}

/// Writes the pages of `[addr, addr + len)` (widened to whole 4 KiB pages) back to the file they
/// map (msync with MS_SYNC); private pages have nothing to write.
fn msync(addr: usize, len: usize) -> io::Result<()> {
    let start = addr & !(PAGE - 1);
    let end = (addr + len).next_multiple_of(PAGE);
    // SAFETY: msync changes no memory; a range that is not mapped fails with ENOMEM.
    if unsafe { libc::msync(start as *mut _, end - start, libc::MS_SYNC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` can be mapped with MAP_SYNC (a file on a DAX file system or a DAX device).
pub fn supports_map_sync(fd: RawFd, offset: u64, len: usize) -> bool {
    let flags = libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC;
    // SAFETY: a fresh mapping at a kernel-chosen address.
    match unsafe { mmap(ptr::null_mut(), len, READ_WRITE, flags, fd, offset) } {
        Ok(addr) => {
            // SAFETY: the mapping was created just above and is not used.
            unsafe { libc::munmap(addr as *mut _, len) };
            true
        }
        Err(_) => false,
    }
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

    /// Pages of `[addr, addr + len)` that are resident and mapped (mincore).
    fn resident(addr: usize, len: usize) -> usize {
        let mut pages = vec![0u8; len / PAGE];
        // SAFETY: `pages` has one byte per page of the range.
        let rc = unsafe { libc::mincore(addr as *mut _, len, pages.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
        pages.iter().filter(|&&p| p & 1 != 0).count()
    }

    /// A fresh memfd of `pages` pages, mapped shared, with `marker` written to page 5.
    fn memfd_map(pages: usize, marker: u8) -> (std::fs::File, Mapping) {
        let file = std::fs::File::from(crate::sys::memfd(c"prefault", None).expect("memfd"));
        file.set_len((pages * PAGE) as u64).expect("size");
        let map = Mapping::shared_file(std::os::fd::AsRawFd::as_raw_fd(&file), 0, pages * PAGE)
            .expect("mmap");
        // SAFETY: page 5 lies inside `map`.
        unsafe { ((map.addr() + 5 * PAGE + 7) as *mut u8).write_volatile(marker) };
        assert_eq!(resident(map.addr(), map.len()), 1);
        (file, map)
    }

    /// The byte [`memfd_map`] wrote the marker to.
    fn marker(map: &Mapping) -> u8 {
        // SAFETY: page 5 lies inside `map`.
        unsafe { ((map.addr() + 5 * PAGE + 7) as *const u8).read_volatile() }
    }

    #[test]
    fn prefault_maps_every_page_and_keeps_contents() {
        let (_file, map) = memfd_map(64, 0xA5);
        // SAFETY: `map` is a read/write shared memfd mapping.
        unsafe { prefault(map.addr(), map.len()) }.expect("prefault");
        assert_eq!(resident(map.addr(), map.len()), 64);
        assert_eq!(marker(&map), 0xA5);
    }

    #[test]
    fn touching_pages_maps_every_page_and_keeps_contents() {
        let (_file, map) = memfd_map(64, 0x5A);
        // SAFETY: as above.
        unsafe { touch_pages(map.addr(), map.len()) };
        assert_eq!(resident(map.addr(), map.len()), 64);
        assert_eq!(marker(&map), 0x5A);
    }

    #[test]
    fn a_populated_shared_mapping_has_every_page_mapped_at_once() {
        let (file, _map) = memfd_map(64, 0x3C);
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let view = Mapping::shared_file_populated(fd, 0, 64 * PAGE).expect("mmap");
        assert_eq!(resident(view.addr(), view.len()), 64);
        assert_eq!(marker(&view), 0x3C, "the file's contents");
    }

    #[test]
    fn a_dropped_placeholder_page_faults_to_userfaultfd_again() {
        use crate::sys::uffd::{Uffd, UffdFault};
        let m = Mapping::placeholder(2 * PAGE, PAGE).expect("placeholder");
        let page = m.addr() + PAGE;
        // A page that appeared before the registration (a guest writing the chunk meanwhile).
        // SAFETY: `page` lies inside `m`.
        unsafe { (page as *mut u8).write_volatile(9) };
        let uffd = Uffd::new().expect("userfaultfd");
        uffd.register(m.addr(), m.len()).expect("register");
        // SAFETY: `m` is a placeholder that only this test uses.
        unsafe { drop_pages(m.addr(), m.len()) }.expect("drop");
        let toucher = std::thread::spawn(move || {
            // SAFETY: the page lies in `m`, which outlives the thread (joined below).
            unsafe { (page as *const u8).read_volatile() }
        });
        let mut faults = [UffdFault {
            address: 0,
            tid: 0,
            write: false,
        }; 1];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while uffd.read_faults(&mut faults).expect("read") == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the dropped page came back without a fault"
            );
            std::thread::yield_now();
        }
        assert_eq!(faults[0].address, page);
        uffd.zero_page(page).expect("zeropage");
        assert_eq!(toucher.join().expect("join"), 0, "the old page is gone");
    }

    #[test]
    fn placeholder_replaces_a_range_with_zeroed_memory() {
        let m = Mapping::anonymous(3 * 4096, 4096).expect("mmap");
        let p = (m.addr() + 4096) as *mut u8;
        // SAFETY: `p` lies inside `m`.
        unsafe { p.write_volatile(7) };
        // SAFETY: the middle page belongs to `m` and nothing refers to it.
        unsafe { map_placeholder(m.addr() + 4096, 4096) }.expect("placeholder");
        // SAFETY: `p` lies inside `m`, which is mapped again.
        assert_eq!(unsafe { p.read_volatile() }, 0);
    }
}
