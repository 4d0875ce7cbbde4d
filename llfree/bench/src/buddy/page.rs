//! The frame descriptor array (like Linux's `struct page` array) and intrusive frame lists.
//!
//! Every frame has a 64-byte descriptor holding its list links and its state. All fields are
//! atomics accessed with `Relaxed` ordering: the list that holds a frame is protected by its
//! owner's lock (zone or per-CPU list), which orders the accesses; the atomics only make the
//! unlocked state checks well defined.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Marks the end of a list.
pub const NIL: u32 = u32::MAX;

/// The frame is in no list and not allocated as a head (inside a block, or being freed).
pub const STATE_NONE: u32 = 0;
/// The frame is cached in a per-CPU list.
pub const STATE_PCP: u32 = 1;
const KIND_BUDDY: u32 = 1 << 8;
const KIND_ALLOCATED: u32 = 2 << 8;

/// The state of the head of a free block of `order` in the zone's free lists.
pub const fn state_buddy(order: usize) -> u32 {
    KIND_BUDDY | order as u32
}

/// The state of the head of a block of `order` handed out by the allocator.
pub const fn state_allocated(order: usize) -> u32 {
    KIND_ALLOCATED | order as u32
}

/// The descriptor of one frame, one cache line like Linux's `struct page`.
#[repr(align(64))]
#[derive(Default)]
pub struct Page {
    next: AtomicU32,
    prev: AtomicU32,
    /// One of the `STATE_*` values or [`state_buddy`] / [`state_allocated`].
    pub state: AtomicU32,
}

/// Allocates the descriptors of a zone, all in [`STATE_NONE`] and unlinked.
pub fn page_array(frames: usize) -> Box<[Page]> {
    (0..frames).map(|_| Page::default()).collect()
}

/// An intrusive doubly linked list of frames whose links live in the [`Page`] array.
pub struct FrameList {
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for FrameList {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl FrameList {
    /// The number of frames (blocks) in the list.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Inserts `frame` at the front.
    pub fn push_front(&mut self, pages: &[Page], frame: u32) {
        let page = &pages[frame as usize];
        page.prev.store(NIL, Relaxed);
        page.next.store(self.head, Relaxed);
        match self.head {
            NIL => self.tail = frame,
            head => pages[head as usize].prev.store(frame, Relaxed),
        }
        self.head = frame;
        self.len += 1;
    }

    /// Inserts `frame` at the back.
    pub fn push_back(&mut self, pages: &[Page], frame: u32) {
        let page = &pages[frame as usize];
        page.next.store(NIL, Relaxed);
        page.prev.store(self.tail, Relaxed);
        match self.tail {
            NIL => self.head = frame,
            tail => pages[tail as usize].next.store(frame, Relaxed),
        }
        self.tail = frame;
        self.len += 1;
    }

    /// Removes and returns the front frame.
    pub fn pop_front(&mut self, pages: &[Page]) -> Option<u32> {
        let frame = self.head;
        (frame != NIL).then(|| {
            self.remove(pages, frame);
            frame
        })
    }

    /// Removes and returns the back frame.
    pub fn pop_back(&mut self, pages: &[Page]) -> Option<u32> {
        let frame = self.tail;
        (frame != NIL).then(|| {
            self.remove(pages, frame);
            frame
        })
    }

    /// Unlinks `frame`, which must be in this list.
    pub fn remove(&mut self, pages: &[Page], frame: u32) {
        let page = &pages[frame as usize];
        let (prev, next) = (page.prev.load(Relaxed), page.next.load(Relaxed));
        match prev {
            NIL => self.head = next,
            prev => pages[prev as usize].next.store(next, Relaxed),
        }
        match next {
            NIL => self.tail = prev,
            next => pages[next as usize].prev.store(prev, Relaxed),
        }
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(list: &mut FrameList, pages: &[Page]) -> Vec<u32> {
        std::iter::from_fn(|| list.pop_front(pages)).collect()
    }

    #[test]
    fn page_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Page>(), 64);
    }

    #[test]
    fn push_pop_remove_keep_order() {
        let pages = page_array(8);
        let mut list = FrameList::default();
        list.push_back(&pages, 1);
        list.push_back(&pages, 2);
        list.push_front(&pages, 0);
        list.push_back(&pages, 3);
        assert_eq!(list.len(), 4);
        list.remove(&pages, 2);
        assert_eq!(list.pop_back(&pages), Some(3));
        assert_eq!(collect(&mut list, &pages), vec![0, 1]);
        assert!(list.is_empty());
        assert_eq!(list.pop_back(&pages), None);
    }

    #[test]
    fn remove_head_and_tail() {
        let pages = page_array(4);
        let mut list = FrameList::default();
        for frame in 0..4 {
            list.push_back(&pages, frame);
        }
        list.remove(&pages, 0);
        list.remove(&pages, 3);
        assert_eq!(collect(&mut list, &pages), vec![1, 2]);
    }
}
