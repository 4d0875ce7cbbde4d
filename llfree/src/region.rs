//! Memory regions that hold the allocator's lower-level metadata.
//!
//! Volatile allocators keep their metadata in a [`HeapRegion`]. Persistent allocators take any
//! [`MetaRegion`], typically a [`FileRegion`]: a `MAP_SHARED` mapping of a file, a hugetlbfs file
//! or a DAX device, whose contents outlive the process.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// Alignment every region must have: one cache line.
pub const REGION_ALIGN: usize = 64;

/// Memory that holds LLFree metadata.
///
/// # Safety
///
/// Implementors guarantee that `as_ptr()` points to `len()` bytes that stay valid, writable and
/// at the same address for as long as the value lives, and that nothing outside the allocator
/// accesses those bytes while an allocator uses them.
pub unsafe trait MetaRegion: Send + Sync {
    /// Start of the region.
    fn as_ptr(&self) -> *mut u8;
    /// Length of the region in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Zeroed, cache-line aligned heap memory for volatile metadata.
#[derive(Debug)]
pub struct HeapRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl HeapRegion {
    /// Allocates `len` zeroed bytes aligned to [`REGION_ALIGN`].
    pub fn new(len: usize) -> io::Result<Self> {
        let layout = Layout::from_size_align(len.max(REGION_ALIGN), REGION_ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(io::ErrorKind::OutOfMemory)?;
        Ok(Self { ptr, layout })
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated with `layout` by `alloc_zeroed` and is freed only here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the heap block is owned by the value, stays put until drop, and is only handed to one
// allocator; the allocator accesses it through atomics only.
unsafe impl MetaRegion for HeapRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

// SAFETY: the pointer is uniquely owned; all accesses through the allocator are atomic.
unsafe impl Send for HeapRegion {}
// SAFETY: see `Send`.
unsafe impl Sync for HeapRegion {}

/// A `MAP_SHARED` mapping of a file range, for persistent metadata.
#[derive(Debug)]
pub struct FileRegion {
    ptr: NonNull<u8>,
    len: usize,
}

impl FileRegion {
    /// Maps `len` bytes of `file` starting at `offset` (a multiple of the page size) shared and
    /// writable, prefaulting the pages. The file must already be at least `offset + len` bytes
    /// long.
    pub fn map(file: &File, offset: u64, len: usize) -> io::Result<Self> {
        Self::map_with(file, offset, len, libc::MAP_SHARED)
    }

    /// Like [`FileRegion::map`], with `MAP_SYNC`: for a file on a DAX file system, the metadata
    /// is written to persistent memory directly (no page cache), so a committed change survives
    /// a power failure once it leaves the CPU cache. Fails with `EOPNOTSUPP` where the file
    /// system does not support it.
    pub fn map_sync(file: &File, offset: u64, len: usize) -> io::Result<Self> {
        Self::map_with(
            file,
            offset,
            len,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
        )
    }

    fn map_with(file: &File, offset: u64, len: usize, flags: libc::c_int) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map an empty metadata region",
            ));
        }
        // Device DAX and other character devices report no length; the kernel checks the range.
        let metadata = file.metadata()?;
        let file_len = if metadata.is_file() {
            metadata.len()
        } else {
            u64::MAX
        };
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > file_len)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("metadata range {offset}+{len} exceeds the file size {file_len}"),
            ));
        }
        let offset = libc::off_t::try_from(offset)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a fresh shared mapping chosen by the kernel; the arguments were checked above
        // and the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags | libc::MAP_POPULATE,
                file.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).ok_or(io::ErrorKind::AddrNotAvailable)?;
        Ok(Self { ptr, len })
    }
}

impl Drop for FileRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`, which nobody uses any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping is owned by the value, stays at its address until drop and is accessed
// through atomics only.
unsafe impl MetaRegion for FileRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: the mapping is process-wide; all accesses through the allocator are atomic.
unsafe impl Send for FileRegion {}
// SAFETY: see `Send`.
unsafe impl Sync for FileRegion {}

/// An unnamed temporary file of `len` bytes (`O_TMPFILE`), for tests.
#[cfg(test)]
pub(crate) fn temp_file(len: u64) -> File {
    use std::os::unix::fs::OpenOptionsExt;
    let file = File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(std::env::temp_dir())
        .unwrap();
    file.set_len(len).unwrap();
    file
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn heap_region_is_zeroed_and_aligned() {
        let region = HeapRegion::new(4096).unwrap();
        assert_eq!(region.as_ptr() as usize % REGION_ALIGN, 0);
        // SAFETY: the region is 4096 bytes long and owned by this test.
        let bytes = unsafe { std::slice::from_raw_parts(region.as_ptr(), region.len()) };
        assert!(bytes.iter().all(|b| *b == 0));
    }

    #[test]
    fn file_region_is_shared_with_the_file() {
        let mut file = temp_file(0);
        file.write_all(&[0u8; 8192]).unwrap();
        {
            let region = FileRegion::map(&file, 4096, 4096).unwrap();
            // SAFETY: the region is 4096 bytes long and owned by this test.
            unsafe { region.as_ptr().write(0xab) };
        }
        let region = FileRegion::map(&file, 4096, 4096).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { region.as_ptr().read() }, 0xab);
    }

    #[test]
    fn file_region_rejects_ranges_past_the_end() {
        let file = temp_file(4096);
        let err = FileRegion::map(&file, 0, 8192).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(FileRegion::map(&file, 0, 0).is_err());
    }

    #[test]
    fn map_sync_needs_dax() {
        let file = temp_file(4096);
        match FileRegion::map_sync(&file, 0, 4096) {
            Ok(_) => eprintln!("note: the temp directory is on a DAX file system"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP)),
        }
    }
}
