//! A snapshot of a pool's allocator: its frames free and used, its trees.

use llfree::FRAME_SIZE;

use super::{FrameSize, Pool};

/// One 64 MiB tree of a pool's allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeUsage {
    /// The tree's index (its first frame is `index * 16384`).
    pub index: usize,
    /// Free 4 KiB frames in the tree.
    pub free_frames: usize,
    /// Whether some core has reserved the tree.
    pub reserved: bool,
}

/// A snapshot of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStats {
    /// The pool's (smallest) frame size.
    pub frame_size: FrameSize,
    /// Bytes of frame memory.
    pub total_bytes: u64,
    /// Bytes not allocated.
    pub free_bytes: u64,
    /// Bytes allocated to guests.
    pub used_bytes: u64,
    /// Entirely free 2 MiB frames.
    pub free_huge: usize,
    /// Entirely free, aligned 1 GiB frames.
    pub free_giant: usize,
    /// The allocator's trees and which of them are reserved by a core.
    pub trees: Vec<TreeUsage>,
}

impl PoolStats {
    pub(crate) fn collect(pool: &Pool) -> Self {
        let llfree = pool.allocator();
        let free_bytes = pool.free_frames() * FRAME_SIZE as u64;
        Self {
            frame_size: pool.frame_size(),
            total_bytes: pool.size(),
            free_bytes,
            used_bytes: pool.size() - free_bytes,
            free_huge: llfree.free_huge(),
            free_giant: llfree.free_giant(),
            trees: llfree
                .tree_stats()
                .map(|t| TreeUsage {
                    index: t.index,
                    free_frames: t.free,
                    reserved: t.reserved,
                })
                .collect(),
        }
    }
}
