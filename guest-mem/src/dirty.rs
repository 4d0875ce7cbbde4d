//! Dirty page tracking of what the VMM itself does to guest memory, for diff snapshots: its
//! writes (through vm-memory, whose slices mark the region's bitmap, or into buffers it marks
//! as it hands them to the host) and what it gives back (the guest then reads zeros). The
//! guest's own writes are KVM's dirty log; a diff snapshot takes the union of both.

use crate::memory::GuestMemory;
use crate::region::GuestRegion;

impl GuestRegion {
    /// Marks `[offset, offset + len)` of the region dirty, where dirty pages are tracked.
    pub(crate) fn mark_dirty(&self, offset: u64, len: u64) {
        if let Some(dirty) = &self.dirty {
            dirty.set_addr_range(offset as usize, len as usize);
        }
    }
}

impl GuestMemory {
    /// Whether the memory tracks the VMM's dirty pages (`MemoryConfig::track_dirty_pages`).
    pub fn tracks_dirty_pages(&self) -> bool {
        self.regions().iter().any(|region| region.dirty.is_some())
    }

    /// The 4 KiB pages the VMM dirtied since the last call, one bitmap per region (a bit per
    /// page from the region's start, 64 to a word; empty where nothing is tracked); the bits
    /// are cleared.
    pub fn take_dirty_pages(&self) -> Vec<Vec<u64>> {
        self.regions()
            .iter()
            .map(|region| {
                region
                    .dirty
                    .as_ref()
                    .map_or_else(Vec::new, |dirty| dirty.get_and_reset())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryConfig;
    use crate::pool::{Backing, Pool, PoolConfig};
    use vm_memory::{Bytes, GuestAddress};

    fn memory(track: bool) -> GuestMemory {
        let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 8 << 20)).unwrap();
        let config = MemoryConfig {
            track_dirty_pages: track,
            ..MemoryConfig::new(vec![(GuestAddress(0), 8 << 20)], 1)
        };
        GuestMemory::new(pool, config).unwrap()
    }

    #[test]
    fn the_vmm_s_writes_and_give_backs_are_dirty_once() {
        let memory = memory(true);
        assert!(memory.tracks_dirty_pages());
        memory.write_slice(&[1; 10], GuestAddress(0x3ffc)).unwrap();
        memory.write_obj(7u64, GuestAddress(5 << 20)).unwrap();
        let mut core = memory.pool().shared_core(0);
        memory
            .discard(GuestAddress(2 << 20), 8 << 10, &mut core)
            .unwrap();
        let dirty = memory.take_dirty_pages();
        let pages: Vec<usize> = (0..2048)
            .filter(|&page| dirty[0][page / 64] & (1 << (page % 64)) != 0)
            .collect();
        // 0x3ffc..0x4006 spans pages 3 and 4; the discard pages 512 and 513; the u64 page 1280.
        assert_eq!(pages, vec![3, 4, 512, 513, 1280]);
        assert!(memory.take_dirty_pages()[0].iter().all(|&word| word == 0));
        // Reads dirty nothing.
        let mut buffer = [0u8; 64];
        memory.read_slice(&mut buffer, GuestAddress(0)).unwrap();
        assert!(memory.take_dirty_pages()[0].iter().all(|&word| word == 0));
    }

    #[test]
    fn untracked_memory_has_no_bitmaps() {
        let memory = memory(false);
        memory.write_slice(&[1; 10], GuestAddress(0)).unwrap();
        assert!(!memory.tracks_dirty_pages());
        assert_eq!(memory.take_dirty_pages(), vec![Vec::<u64>::new()]);
    }
}
