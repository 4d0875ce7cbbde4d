//! The buddy free areas of a zone: one free list per order, splitting and merging as in Linux's
//! `__rmqueue_smallest` / `expand` / `__free_one_page`. Callers hold the zone lock.

use super::page::{state_allocated, state_buddy, FrameList, Page, STATE_NONE};
use super::MAX_ORDER;
use std::sync::atomic::Ordering::Relaxed;

/// The free lists of one zone, indexed by order.
#[derive(Default)]
pub struct FreeAreas {
    lists: [FrameList; MAX_ORDER + 1],
}

impl FreeAreas {
    /// Creates the free lists of a zone of `pages.len()` frames, all free, each block as large
    /// and as aligned as possible.
    pub fn new(pages: &[Page]) -> Self {
        let mut areas = Self::default();
        let mut frame = 0;
        while frame < pages.len() {
            let order = (0..=MAX_ORDER)
                .rev()
                .find(|&o| frame % (1 << o) == 0 && frame + (1 << o) <= pages.len())
                .unwrap_or(0);
            areas.add(pages, frame, order, true);
            frame += 1 << order;
        }
        areas
    }

    /// Allocates a block of `order`, splitting a larger one if needed, and marks it allocated.
    pub fn alloc(&mut self, pages: &[Page], order: usize) -> Option<usize> {
        let found = (order..=MAX_ORDER).find(|&o| !self.lists[o].is_empty())?;
        let frame = self.lists[found].pop_front(pages)? as usize;
        // Give the upper halves back, as Linux's `expand`.
        for half in (order..found).rev() {
            self.add(pages, frame + (1 << half), half, false);
        }
        pages[frame].state.store(state_allocated(order), Relaxed);
        Some(frame)
    }

    /// Frees the block of `order` at `frame` (whose state the caller has already taken away from
    /// allocated) and merges it with its free buddies.
    pub fn free(&mut self, pages: &[Page], mut frame: usize, mut order: usize) {
        while order < MAX_ORDER {
            let buddy = frame ^ (1 << order);
            if !self.is_free_block(pages, buddy, order) {
                break;
            }
            self.lists[order].remove(pages, buddy as u32);
            pages[buddy].state.store(STATE_NONE, Relaxed);
            frame &= buddy;
            order += 1;
        }
        let to_tail = self.merge_likely(pages, frame, order);
        self.add(pages, frame, order, to_tail);
    }

    /// Free blocks of exactly `order`.
    pub fn free_blocks(&self, order: usize) -> usize {
        self.lists[order].len()
    }

    /// Free base frames in all lists.
    pub fn free_frames(&self) -> usize {
        (0..=MAX_ORDER).map(|o| self.lists[o].len() << o).sum()
    }

    fn add(&mut self, pages: &[Page], frame: usize, order: usize, to_tail: bool) {
        pages[frame].state.store(state_buddy(order), Relaxed);
        if to_tail {
            self.lists[order].push_back(pages, frame as u32);
        } else {
            self.lists[order].push_front(pages, frame as u32);
        }
    }

    fn is_free_block(&self, pages: &[Page], frame: usize, order: usize) -> bool {
        frame < pages.len() && pages[frame].state.load(Relaxed) == state_buddy(order)
    }

    /// Linux's `buddy_merge_likely`: queue a block at the tail when its buddy's buddy one order up
    /// is free, so that it stays free longer and can merge soon.
    fn merge_likely(&self, pages: &[Page], frame: usize, order: usize) -> bool {
        if order + 2 > MAX_ORDER {
            return false;
        }
        let higher = frame & !((1 << (order + 1)) - 1);
        self.is_free_block(pages, higher ^ (1 << (order + 1)), order + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::page::page_array;
    use super::*;

    #[test]
    fn splits_and_merges_back_to_max_order() {
        let pages = page_array(1 << MAX_ORDER);
        let mut areas = FreeAreas::new(&pages);
        assert_eq!(areas.free_blocks(MAX_ORDER), 1);
        let a = areas.alloc(&pages, 0).unwrap();
        let b = areas.alloc(&pages, 0).unwrap();
        let c = areas.alloc(&pages, 3).unwrap();
        assert_eq!((a, b, c), (0, 1, 8));
        assert_eq!(areas.free_frames(), (1 << MAX_ORDER) - 10);
        for (frame, order) in [(b, 0), (c, 3), (a, 0)] {
            pages[frame].state.store(STATE_NONE, Relaxed);
            areas.free(&pages, frame, order);
        }
        assert_eq!(areas.free_blocks(MAX_ORDER), 1);
        assert_eq!(areas.free_frames(), 1 << MAX_ORDER);
    }

    #[test]
    fn odd_zone_sizes_use_aligned_blocks() {
        let frames = (1 << MAX_ORDER) + 512 + 3;
        let pages = page_array(frames);
        let mut areas = FreeAreas::new(&pages);
        assert_eq!(areas.free_blocks(MAX_ORDER), 1);
        assert_eq!(areas.free_blocks(9), 1);
        assert_eq!(areas.free_blocks(1), 1);
        assert_eq!(areas.free_blocks(0), 1);
        assert_eq!(areas.free_frames(), frames);
        // The last single frame has no buddy inside the zone and must not merge past the end.
        let mut got = Vec::new();
        while let Some(frame) = areas.alloc(&pages, 0) {
            got.push(frame);
        }
        assert_eq!(got.len(), frames);
        for frame in got {
            pages[frame].state.store(STATE_NONE, Relaxed);
            areas.free(&pages, frame, 0);
        }
        assert_eq!(areas.free_frames(), frames);
        assert_eq!(areas.free_blocks(MAX_ORDER), 1);
        assert_eq!(areas.free_blocks(9), 1);
    }
}
