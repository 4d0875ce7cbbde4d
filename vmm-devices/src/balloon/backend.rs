//! The balloon's memory backend over guest-mem: inflation gives 4 KiB pieces away in per-chunk
//! bitmaps (a chunk given away entirely frees its frame), deflation takes them back (a chunk
//! without a frame gets one at once, before the guest reuses it), reported
//! ranges are discarded. Frames go back to the pool through the balloon's own LLFree core id and
//! its cache, one tree at a time, and not into a vCPU's reservation.

use std::cell::RefCell;
use std::sync::Arc;

use guest_mem::{CoreFrames, GuestMemory, MemoryError};
use virtio_balloon::{BalloonBackend, GuestRange, Inflated};

/// A [`BalloonBackend`] over a guest-mem [`GuestMemory`].
#[derive(Debug)]
pub struct GuestMemBackend {
    memory: Arc<GuestMemory>,
    /// The device's calls come one at a time, from whichever thread runs the device.
    core: RefCell<CoreFrames>,
}

impl GuestMemBackend {
    /// A backend over `memory` that frees with a core id of its own, claimed from the pool,
    /// through the core's cache.
    pub fn new(memory: Arc<GuestMemory>) -> Self {
        let pool = memory.pool();
        let core = RefCell::new(pool.core_frames(pool.claim_cores(1)));
        Self { memory, core }
    }

    /// The LLFree core id that the balloon frees frames with.
    pub fn core(&self) -> usize {
        self.core.borrow().core()
    }

    /// The guest memory.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.memory
    }
}

impl BalloonBackend for GuestMemBackend {
    type Error = MemoryError;

    fn is_ram(&self, range: GuestRange) -> bool {
        self.memory.is_ram(range.addr, range.len)
    }

    fn inflate(&self, range: GuestRange) -> Result<Inflated, MemoryError> {
        let done =
            self.memory
                .release_pieces(range.addr, range.len, &mut self.core.borrow_mut())?;
        Ok(Inflated {
            new_pages: done.pieces as u64,
            freed_frames: done.freed_chunks as u64,
        })
    }

    fn deflate(&self, range: GuestRange) -> Result<u64, MemoryError> {
        let reclaimed =
            self.memory
                .reclaim_pieces(range.addr, range.len, &mut self.core.borrow_mut())?;
        Ok(reclaimed.pieces as u64)
    }

    fn discard(&self, range: GuestRange) -> Result<u64, MemoryError> {
        Ok(self
            .memory
            .discard(range.addr, range.len, &mut self.core.borrow_mut())?
            .freed_chunks as u64)
    }

    fn deflate_all(&self) -> Result<u64, MemoryError> {
        Ok(self.memory.reclaim_all_pieces() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// The VMM's MMIO gap, between the two RAM regions of a large VM.
    const MMIO_GAP_START: u64 = 0xc000_0000;
    const MMIO_GAP_END: u64 = 0x1_0000_0000;
    use guest_mem::{Backing, MemoryConfig, Pool, PoolConfig, Populate};
    use vm_memory::{Bytes, GuestAddress};

    const MIB: u64 = 1 << 20;

    /// 8 MiB at 0 and 4 MiB at 4 GiB, above the MMIO gap, eagerly populated from a 16 MiB pool.
    fn backend() -> GuestMemBackend {
        let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 16 * MIB)).unwrap();
        let ranges = vec![
            (GuestAddress(0), 8 * MIB),
            (GuestAddress(MMIO_GAP_END), 4 * MIB),
        ];
        let config = MemoryConfig {
            populate: Populate::Eager,
            ..MemoryConfig::new(ranges, 1)
        };
        GuestMemBackend::new(Arc::new(GuestMemory::new(pool, config).unwrap()))
    }

    fn range(addr: u64, len: u64) -> GuestRange {
        GuestRange {
            addr: GuestAddress(addr),
            len,
        }
    }

    #[test]
    fn ram_is_the_regions_and_never_the_gap() {
        let backend = backend();
        assert!(backend.is_ram(range(0, 8 * MIB)));
        assert!(backend.is_ram(range(MMIO_GAP_END, 4 * MIB)));
        assert!(backend.is_ram(range(7 * MIB, 4096)));
        assert!(
            !backend.is_ram(range(7 * MIB, 2 * MIB)),
            "runs past the end"
        );
        assert!(!backend.is_ram(range(8 * MIB, 4096)), "the hole");
        assert!(!backend.is_ram(range(MMIO_GAP_START, 4096)), "MMIO");
        assert!(
            !backend.is_ram(range(0, MMIO_GAP_END + MIB)),
            "across the gap"
        );
        assert!(!backend.is_ram(range(MMIO_GAP_END + 4 * MIB, 4096)));
        assert!(!backend.is_ram(range(u64::MAX - 0xfff, 0x2000)), "wraps");
        assert!(!backend.is_ram(range(0, 0)));
    }

    #[test]
    fn inflation_frees_whole_chunks_and_deflation_takes_pages_back() {
        let backend = backend();
        let memory = backend.memory().clone();
        let pool = memory.pool().clone();
        let free = || pool.stats().free_bytes;
        assert_eq!(free(), 4 * MIB);
        memory.write_obj(0x5a5a_u64, GuestAddress(2 * MIB)).unwrap();

        // Half a chunk keeps its frame; the other half frees it, once.
        let first = backend.inflate(range(2 * MIB, MIB)).unwrap();
        assert_eq!((first.new_pages, first.freed_frames), (256, 0));
        assert_eq!(free(), 4 * MIB);
        let second = backend.inflate(range(2 * MIB, 2 * MIB)).unwrap();
        assert_eq!((second.new_pages, second.freed_frames), (256, 1));
        assert_eq!(free(), 6 * MIB);
        assert_eq!(memory.frame_at(GuestAddress(2 * MIB)), None);
        let again = backend.inflate(range(2 * MIB, 4096)).unwrap();
        assert_eq!(again, Inflated::default(), "duplicate inflation");

        assert_eq!(backend.deflate(range(2 * MIB, 4 * MIB)).unwrap(), 512);
        assert_eq!(backend.deflate(range(2 * MIB, 4096)).unwrap(), 0);
        // A touch repopulates from the pool, with zeroes.
        assert_eq!(memory.read_obj::<u64>(GuestAddress(2 * MIB)).unwrap(), 0);
        assert_eq!(free(), 4 * MIB);
    }

    #[test]
    fn reported_ranges_free_their_whole_chunks_and_reset_deflates_everything() {
        let backend = backend();
        let pool = backend.memory().pool().clone();
        assert_eq!(backend.discard(range(2 * MIB, 6 * MIB)).unwrap(), 3);
        assert_eq!(backend.discard(range(MMIO_GAP_END, MIB)).unwrap(), 0);
        assert_eq!(pool.stats().free_bytes, 10 * MIB);

        backend.inflate(range(0, 4096)).unwrap();
        backend.inflate(range(MMIO_GAP_END, 8192)).unwrap();
        assert_eq!(backend.deflate_all().unwrap(), 3);
        assert_eq!(backend.deflate_all().unwrap(), 0);
        assert!(matches!(
            backend.inflate(range(8 * MIB, 4096)),
            Err(MemoryError::NotRam { .. })
        ));
    }

    #[test]
    fn each_balloon_claims_its_own_core() {
        // 256 MiB: four LLFree trees, so four cores (a smaller pool has a single one).
        let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 256 * MIB)).unwrap();
        let config = MemoryConfig::new(vec![(GuestAddress(0), 8 * MIB)], 1);
        let memory = Arc::new(GuestMemory::new(pool, config).unwrap());
        let a = GuestMemBackend::new(memory.clone());
        let b = GuestMemBackend::new(memory);
        assert_ne!(a.core(), b.core());
        assert_ne!(a.core(), a.memory().vmm_core());
    }
}
