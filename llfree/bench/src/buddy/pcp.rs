//! Per-CPU page lists for order 0, as Linux's `per_cpu_pages`: frames are taken from the zone in
//! batches (`rmqueue_bulk`) and given back in batches once the list exceeds its high mark
//! (`free_pcppages_bulk`, coldest frames first).

use super::page::{state_allocated, FrameList, Page, STATE_PCP};
use super::zone::FreeAreas;
use std::sync::atomic::Ordering::Relaxed;

/// The cached order-0 frames of one CPU. Callers hold this list's lock.
#[derive(Default)]
pub struct PerCpuPages {
    list: FrameList,
}

impl PerCpuPages {
    /// Frames cached in this list.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Takes the hottest cached frame and marks it allocated.
    pub fn pop(&mut self, pages: &[Page]) -> Option<usize> {
        let frame = self.list.pop_front(pages)? as usize;
        pages[frame].state.store(state_allocated(0), Relaxed);
        Some(frame)
    }

    /// Caches a freed frame as the hottest one.
    pub fn push(&mut self, pages: &[Page], frame: usize) {
        pages[frame].state.store(STATE_PCP, Relaxed);
        self.list.push_front(pages, frame as u32);
    }

    /// Moves up to `batch` frames from the zone into this list; returns how many were moved.
    pub fn refill(&mut self, pages: &[Page], zone: &mut FreeAreas, batch: usize) -> usize {
        for moved in 0..batch {
            let Some(frame) = zone.alloc(pages, 0) else {
                return moved;
            };
            pages[frame].state.store(STATE_PCP, Relaxed);
            self.list.push_back(pages, frame as u32);
        }
        batch
    }

    /// Gives up to `count` of the coldest frames back to the zone.
    pub fn release(&mut self, pages: &[Page], zone: &mut FreeAreas, count: usize) {
        for _ in 0..count {
            let Some(frame) = self.list.pop_back(pages) else {
                return;
            };
            zone.free(pages, frame as usize, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::page::page_array;
    use super::*;

    #[test]
    fn refill_and_release_in_batches() {
        let pages = page_array(1024);
        let mut zone = FreeAreas::new(&pages);
        let mut pcp = PerCpuPages::default();
        assert_eq!(pcp.refill(&pages, &mut zone, 63), 63);
        assert_eq!(zone.free_frames(), 1024 - 63);
        let frame = pcp.pop(&pages).unwrap();
        assert_eq!(pages[frame].state.load(Relaxed), state_allocated(0));
        pcp.push(&pages, frame);
        pcp.release(&pages, &mut zone, 100);
        assert!(pcp.is_empty());
        assert_eq!(zone.free_frames(), 1024);
        assert_eq!(zone.free_blocks(10), 1);
    }

    #[test]
    fn refill_stops_when_the_zone_is_empty() {
        let pages = page_array(16);
        let mut zone = FreeAreas::new(&pages);
        let mut pcp = PerCpuPages::default();
        assert_eq!(pcp.refill(&pages, &mut zone, 63), 16);
        assert_eq!(pcp.len(), 16);
    }
}
