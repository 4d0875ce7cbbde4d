//! vm-memory's traits on guest memory, so that loaders, queues and devices use it directly.
//!
//! Every slice handed out covers populated chunks only: `get_slice` populates the chunks it spans
//! (with the VMM's core id) or fails with an error. It never leaves the caller to fault on an
//! unpopulated chunk, and a chunk discarded while a slice is in use is repopulated by the fault
//! handler, so VMM accesses never end in SIGSEGV or SIGBUS.

use std::io;
use std::mem::size_of;
use std::sync::atomic::Ordering;

use vm_memory::bitmap::{AtomicBitmap, Bitmap, BS};
use vm_memory::{
    AtomicAccess, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryRegion,
    GuestUsize, MemoryRegionAddress, ReadVolatile, VolatileSlice, WriteVolatile,
};

use crate::memory::GuestMemory;
use crate::region::GuestRegion;

type Result<T> = std::result::Result<T, GuestMemoryError>;

impl GuestRegion {
    /// Populates the chunks under `[offset, offset + count)`, which must lie in the region.
    fn prepare(&self, offset: MemoryRegionAddress, count: usize) -> Result<()> {
        let end = offset
            .0
            .checked_add(count as u64)
            .filter(|&end| end <= self.size())
            .ok_or(GuestMemoryError::InvalidBackendAddress)?;
        if count == 0 {
            return Ok(());
        }
        let chunk = self.chunk_size().bytes();
        let mut core = self.shared.pool.shared_core(self.shared.vmm_core);
        for index in offset.0 / chunk..=(end - 1) / chunk {
            self.populate(index as usize, &mut core)
                .map_err(|e| GuestMemoryError::IOError(io::Error::other(e)))?;
        }
        Ok(())
    }

    /// Bytes available from `offset` to the end, capped at `count`.
    fn available(&self, offset: MemoryRegionAddress, count: usize) -> Result<usize> {
        let left = self
            .size()
            .checked_sub(offset.0)
            .filter(|&left| left > 0 || count == 0)
            .ok_or(GuestMemoryError::InvalidBackendAddress)?;
        Ok(count.min(left as usize))
    }
}

impl GuestMemoryRegion for GuestRegion {
    /// What the VMM writes is marked here when dirty pages are tracked.
    type B = Option<AtomicBitmap>;

    fn len(&self) -> GuestUsize {
        self.size()
    }

    fn start_addr(&self) -> GuestAddress {
        self.start()
    }

    fn bitmap(&self) -> BS<'_, Self::B> {
        self.dirty.slice_at(0)
    }

    /// The host address, without populating (for memslots; touching it populates through the
    /// fault handler).
    fn get_host_address(&self, addr: MemoryRegionAddress) -> Result<*mut u8> {
        self.check_address(addr)
            .map(|addr| (self.host_addr() + addr.0 as usize) as *mut u8)
            .ok_or(GuestMemoryError::InvalidBackendAddress)
    }

    fn get_slice(
        &self,
        offset: MemoryRegionAddress,
        count: usize,
    ) -> Result<VolatileSlice<'_, BS<'_, Self::B>>> {
        self.prepare(offset, count)?;
        let dirty = self.dirty.slice_at(offset.0 as usize);
        // SAFETY: the range lies inside the region's mapping, which lives as long as `self`;
        // its chunks are populated, and a concurrent discard only swaps the memory behind it.
        Ok(unsafe {
            VolatileSlice::with_bitmap(
                (self.host_addr() + offset.0 as usize) as *mut u8,
                count,
                dirty,
                None,
            )
        })
    }

    fn is_hugetlbfs(&self) -> Option<bool> {
        Some(self.shared.pool.is_hugetlb())
    }
}

impl Bytes<MemoryRegionAddress> for GuestRegion {
    type E = GuestMemoryError;

    fn write(&self, buf: &[u8], addr: MemoryRegionAddress) -> Result<usize> {
        let count = self.available(addr, buf.len())?;
        Ok(self.get_slice(addr, count)?.write(&buf[..count], 0)?)
    }

    fn read(&self, buf: &mut [u8], addr: MemoryRegionAddress) -> Result<usize> {
        let count = self.available(addr, buf.len())?;
        Ok(self.get_slice(addr, count)?.read(&mut buf[..count], 0)?)
    }

    fn write_slice(&self, buf: &[u8], addr: MemoryRegionAddress) -> Result<()> {
        Ok(self.get_slice(addr, buf.len())?.write_slice(buf, 0)?)
    }

    fn read_slice(&self, buf: &mut [u8], addr: MemoryRegionAddress) -> Result<()> {
        Ok(self.get_slice(addr, buf.len())?.read_slice(buf, 0)?)
    }

    fn read_volatile_from<F: ReadVolatile>(
        &self,
        addr: MemoryRegionAddress,
        src: &mut F,
        count: usize,
    ) -> Result<usize> {
        let count = self.available(addr, count)?;
        Ok(self
            .get_slice(addr, count)?
            .read_volatile_from(0, src, count)?)
    }

    fn read_exact_volatile_from<F: ReadVolatile>(
        &self,
        addr: MemoryRegionAddress,
        src: &mut F,
        count: usize,
    ) -> Result<()> {
        Ok(self
            .get_slice(addr, count)?
            .read_exact_volatile_from(0, src, count)?)
    }

    fn write_volatile_to<F: WriteVolatile>(
        &self,
        addr: MemoryRegionAddress,
        dst: &mut F,
        count: usize,
    ) -> Result<usize> {
        let count = self.available(addr, count)?;
        Ok(self
            .get_slice(addr, count)?
            .write_volatile_to(0, dst, count)?)
    }

    fn write_all_volatile_to<F: WriteVolatile>(
        &self,
        addr: MemoryRegionAddress,
        dst: &mut F,
        count: usize,
    ) -> Result<()> {
        Ok(self
            .get_slice(addr, count)?
            .write_all_volatile_to(0, dst, count)?)
    }

    fn store<T: AtomicAccess>(
        &self,
        val: T,
        addr: MemoryRegionAddress,
        order: Ordering,
    ) -> Result<()> {
        Ok(self.get_slice(addr, size_of::<T>())?.store(val, 0, order)?)
    }

    fn load<T: AtomicAccess>(&self, addr: MemoryRegionAddress, order: Ordering) -> Result<T> {
        Ok(self.get_slice(addr, size_of::<T>())?.load(0, order)?)
    }
}

impl GuestMemoryBackend for GuestMemory {
    type R = GuestRegion;

    fn iter(&self) -> impl Iterator<Item = &GuestRegion> {
        self.regions().iter()
    }

    /// Whether `[base, base + len)` is all RAM, without populating it (the default goes
    /// through `get_slices`, which would populate the whole range and defeat lazy population).
    fn check_range(&self, base: GuestAddress, len: usize) -> bool {
        let (mut addr, mut left) = (base, len as u64);
        while left > 0 {
            let Some(region) = self.find_region(addr) else {
                return false;
            };
            let step = left.min(region.size() - (addr.0 - region.start().0));
            addr = GuestAddress(addr.0 + step);
            left -= step;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{MemoryConfig, Pool, PoolConfig};

    const MIB: u64 = 1 << 20;

    #[test]
    fn check_range_looks_at_the_regions_and_populates_nothing() {
        let pool = Pool::new(PoolConfig::new(crate::Backing::Anonymous, 64 * MIB)).expect("pool");
        let ranges = vec![
            (GuestAddress(0), 16 * MIB),
            (GuestAddress(16 * MIB), 8 * MIB),
            (GuestAddress(32 * MIB), 16 * MIB),
        ];
        let memory =
            GuestMemory::new(Arc::clone(&pool), MemoryConfig::new(ranges, 1)).expect("memory");
        let mib = |n: u64| (n * MIB) as usize;
        assert!(
            memory.check_range(GuestAddress(0), mib(24)),
            "adjacent regions"
        );
        assert!(memory.check_range(GuestAddress(40 * MIB), mib(8)));
        assert!(memory.check_range(GuestAddress(60 * MIB), 0));
        assert!(
            !memory.check_range(GuestAddress(20 * MIB), mib(8)),
            "a hole"
        );
        assert!(
            !memory.check_range(GuestAddress(47 * MIB), mib(2)),
            "past the end"
        );
        assert!(!memory.check_range(GuestAddress(u64::MAX), 2));
        assert_eq!(memory.stats().populated_chunks, 0);
        assert_eq!(pool.stats().used_bytes, 0);
    }
}
