//! Identity-mapped boot page tables for 64-bit mode.
//!
//! The tables map guest virtual address `x` to guest physical address `x` for `[0, end)` with
//! 2 MiB or 1 GiB leaf pages, so both Linux's 64-bit entry (which only needs the low 4 GiB) and
//! the built-in test guest (which touches all of RAM) can run with paging on. They occupy one
//! contiguous area of guest memory:
//!
//! ```text
//! start + 0x0000            PML4 (one page; entry n covers 512 GiB)
//! start + 0x1000            PDPT 0..p (one per 512 GiB; entry n covers 1 GiB)
//! start + 0x1000 * (1 + p)  PD 0..d (2 MiB pages only: one per GiB; entry n covers 2 MiB)
//! ```

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// Errors of page table set-up.
#[derive(Debug, thiserror::Error)]
pub enum PagingError {
    /// Nothing to map, or more than the 256 TiB four-level paging can map.
    #[error("cannot identity-map {0:#x} bytes: must be between 1 byte and 256 TiB")]
    InvalidSize(u64),
    /// The tables do not fit in the area reserved for them.
    #[error(
        "identity-mapping {mapped:#x} bytes needs {needed:#x} bytes of page tables, \
         but only {available:#x} are reserved"
    )]
    TooLarge {
        /// Bytes to map.
        mapped: u64,
        /// Bytes of page tables needed.
        needed: u64,
        /// Bytes reserved for page tables.
        available: u64,
    },
    /// The tables could not be written to guest memory.
    #[error("cannot write page tables to guest memory at {addr:#x}: {source}")]
    Write {
        /// Guest physical address of the failed write.
        addr: u64,
        /// The guest memory error.
        source: vm_memory::GuestMemoryError,
    },
}

/// Size of one page table.
pub const TABLE_SIZE: u64 = 0x1000;
const ENTRIES: u64 = 512;
const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
const PAGE_SIZE_BIT: u64 = 1 << 7;
const GIB: u64 = 1 << 30;
const PML4_SPAN: u64 = ENTRIES * GIB;
const MAX_MAPPED: u64 = ENTRIES * PML4_SPAN;

/// Leaf page size of the identity map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSize {
    /// 2 MiB pages (PD entries); works on every x86_64 CPU.
    Size2M,
    /// 1 GiB pages (PDPT entries); needs CPUID.80000001H:EDX.Page1GB in the guest's CPUID.
    Size1G,
}

/// Where the tables go and what they map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdentityMap {
    /// Guest physical address of the PML4; the value for CR3. 4 KiB aligned.
    pub start: GuestAddress,
    /// End (exclusive) of the mapped range, rounded up to a whole GiB.
    pub mapped_end: u64,
    /// Leaf page size.
    pub page_size: PageSize,
}

impl IdentityMap {
    /// Plans tables at `start` (4 KiB aligned) mapping `[0, end)`, using at most `max_size` bytes.
    pub fn new(
        start: GuestAddress,
        end: u64,
        page_size: PageSize,
        max_size: u64,
    ) -> Result<Self, PagingError> {
        if end == 0 || end > MAX_MAPPED || !start.0.is_multiple_of(TABLE_SIZE) {
            return Err(PagingError::InvalidSize(end));
        }
        let map = IdentityMap {
            start,
            mapped_end: end.div_ceil(GIB) * GIB,
            page_size,
        };
        if map.size() > max_size {
            return Err(PagingError::TooLarge {
                mapped: end,
                needed: map.size(),
                available: max_size,
            });
        }
        Ok(map)
    }

    /// Number of PDPTs (one per 512 GiB).
    pub fn pdpt_count(&self) -> u64 {
        self.mapped_end.div_ceil(PML4_SPAN)
    }

    /// Number of page directories (one per GiB with 2 MiB pages, none with 1 GiB pages).
    pub fn pd_count(&self) -> u64 {
        match self.page_size {
            PageSize::Size2M => self.mapped_end / GIB,
            PageSize::Size1G => 0,
        }
    }

    /// Total bytes of page tables.
    pub fn size(&self) -> u64 {
        (1 + self.pdpt_count() + self.pd_count()) * TABLE_SIZE
    }

    /// Builds the tables as they will lie in guest memory, entry by entry.
    pub fn build(&self) -> Vec<u64> {
        let mut tables = vec![0u64; (self.size() / 8) as usize];
        let pdpt_base = self.start.0 + TABLE_SIZE;
        let pd_base = pdpt_base + self.pdpt_count() * TABLE_SIZE;
        let (pml4, rest) = tables.split_at_mut(ENTRIES as usize);
        let (pdpts, pds) = rest.split_at_mut((self.pdpt_count() * ENTRIES) as usize);
        for (index, entry) in pml4.iter_mut().take(self.pdpt_count() as usize).enumerate() {
            *entry = (pdpt_base + index as u64 * TABLE_SIZE) | PRESENT | WRITABLE;
        }
        let gibs = self.mapped_end / GIB;
        for (gib, entry) in pdpts.iter_mut().take(gibs as usize).enumerate() {
            let gib = gib as u64;
            *entry = match self.page_size {
                PageSize::Size2M => (pd_base + gib * TABLE_SIZE) | PRESENT | WRITABLE,
                PageSize::Size1G => (gib * GIB) | PRESENT | WRITABLE | PAGE_SIZE_BIT,
            };
        }
        for (page, entry) in pds.iter_mut().enumerate() {
            *entry = ((page as u64) << 21) | PRESENT | WRITABLE | PAGE_SIZE_BIT;
        }
        tables
    }

    /// Writes the tables to guest memory and returns the value for CR3.
    pub fn write<M: GuestMemoryBackend>(&self, mem: &M) -> Result<u64, PagingError> {
        let bytes: Vec<u8> = self.build().iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.write_slice(&bytes, self.start)
            .map_err(|source| PagingError::Write {
                addr: self.start.0,
                source,
            })?;
        Ok(self.start.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    const START: GuestAddress = GuestAddress(0x9000);

    /// Walks the tables as the MMU would and returns the physical address `virt` maps to.
    fn translate(map: &IdentityMap, tables: &[u64], virt: u64) -> Option<u64> {
        let entry_at = |table: u64, index: u64| {
            let word = (table - map.start.0) / 8 + index;
            tables.get(word as usize).copied()
        };
        let pml4e = entry_at(map.start.0, (virt >> 39) & 511)?;
        if pml4e & PRESENT == 0 {
            return None;
        }
        let pdpte = entry_at(pml4e & !0xfff, (virt >> 30) & 511)?;
        if pdpte & PRESENT == 0 {
            return None;
        }
        if pdpte & PAGE_SIZE_BIT != 0 {
            return Some((pdpte & !0xfff & !(GIB - 1)) | (virt & (GIB - 1)));
        }
        let pde = entry_at(pdpte & !0xfff, (virt >> 21) & 511)?;
        assert_ne!(pde & PAGE_SIZE_BIT, 0, "PDs must hold 2 MiB leaves");
        (pde & PRESENT != 0).then_some((pde & !0x1f_ffff) | (virt & 0x1f_ffff))
    }

    #[test]
    fn four_gib_with_2m_pages_needs_six_tables() {
        let map = IdentityMap::new(START, 4 * GIB, PageSize::Size2M, 0x10000).unwrap();
        assert_eq!(
            (map.pdpt_count(), map.pd_count(), map.size()),
            (1, 4, 6 * TABLE_SIZE)
        );
        let tables = map.build();
        assert_eq!(tables[0], 0xa000 | 3);
        assert_eq!(tables[512], 0xb000 | 3);
        assert_eq!(tables[515], 0xe000 | 3);
        assert_eq!(tables[516], 0, "no fifth GiB");
        assert_eq!(tables[1024], 0x83);
        assert_eq!(tables[1025], 0x20_0000 | 0x83);
    }

    #[test]
    fn translates_every_gib_identically_and_nothing_beyond() {
        for page_size in [PageSize::Size2M, PageSize::Size1G] {
            let map = IdentityMap::new(START, 5 * GIB + 1, page_size, 1 << 20).unwrap();
            assert_eq!(map.mapped_end, 6 * GIB);
            let tables = map.build();
            for virt in [
                0,
                0x1234,
                0x20_0000,
                0xfee0_0000,
                4 * GIB + 0x5678,
                6 * GIB - 8,
            ] {
                assert_eq!(
                    translate(&map, &tables, virt),
                    Some(virt),
                    "{page_size:?} {virt:#x}"
                );
            }
            assert_eq!(translate(&map, &tables, 6 * GIB), None);
        }
    }

    #[test]
    fn more_than_512_gib_uses_several_pdpts() {
        let map = IdentityMap::new(START, 513 * GIB, PageSize::Size1G, 1 << 20).unwrap();
        assert_eq!((map.pdpt_count(), map.pd_count()), (2, 0));
        let tables = map.build();
        assert_eq!(
            translate(&map, &tables, 512 * GIB + 0x42),
            Some(512 * GIB + 0x42)
        );
        assert_eq!(translate(&map, &tables, 513 * GIB), None);
    }

    #[test]
    fn rejects_bad_sizes_and_small_areas() {
        assert!(matches!(
            IdentityMap::new(START, 0, PageSize::Size2M, 1 << 20),
            Err(PagingError::InvalidSize(0))
        ));
        assert!(IdentityMap::new(START, MAX_MAPPED + 1, PageSize::Size1G, u64::MAX).is_err());
        assert!(IdentityMap::new(GuestAddress(0x9008), GIB, PageSize::Size1G, 1 << 20).is_err());
        let err = IdentityMap::new(START, 64 * GIB, PageSize::Size2M, 0x10000).unwrap_err();
        assert!(
            matches!(
                err,
                PagingError::TooLarge {
                    needed: 0x42000,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn writes_tables_and_returns_cr3() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let map = IdentityMap::new(START, GIB, PageSize::Size2M, 0x10000).unwrap();
        assert_eq!(map.write(&mem).unwrap(), 0x9000);
        let pde: u64 = mem.read_obj(GuestAddress(0xb000 + 8)).unwrap();
        assert_eq!(pde, 0x20_0083);
        let beyond = IdentityMap::new(GuestAddress(0xff000), GIB, PageSize::Size2M, 1 << 20);
        assert!(beyond.unwrap().write(&mem).is_err());
    }
}
