//! A spin-locked binary buddy allocator modelled on Linux's page allocator.
//!
//! * One zone lock protects per-order free lists (orders 0..=[`MAX_ORDER`]) threaded through a
//!   64-byte frame descriptor array (`page`), with buddy merging on free (`zone`).
//! * Order-0 frames go through per-CPU lists (`pcp`) with Linux's batch/high scheme; each list
//!   has its own (normally uncontended) lock, as in Linux 6.0, so that [`Buddy::drain`] and the
//!   out-of-memory path can empty other CPUs' lists (`drain_all_pages`).
//! * A double free or an order mismatch is detected by one compare-and-swap on the frame's state.

mod page;
mod pcp;
mod zone;

use crate::frame_alloc::{check_frame, AllocError, FrameAllocator};
use crate::spin::SpinLock;
use page::{page_array, state_allocated, Page, STATE_NONE, STATE_PCP};
use pcp::PerCpuPages;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use zone::FreeAreas;

/// The largest order (4 MiB blocks), as Linux's `MAX_ORDER - 1` on x86.
pub const MAX_ORDER: usize = 10;

const HUGE_ORDER: usize = 9;

/// Tunables of the buddy allocator.
#[derive(Debug, Clone, Copy)]
pub struct BuddyConfig {
    /// Number of per-CPU lists.
    pub cores: usize,
    /// Frames moved between the zone and a per-CPU list at once (Linux: 63 on large zones).
    pub pcp_batch: usize,
    /// A per-CPU list holding this many frames gives a batch back (Linux: 6 × batch).
    pub pcp_high: usize,
    /// Whether order-0 frames go through the per-CPU lists at all.
    pub pcp: bool,
}

impl BuddyConfig {
    /// Linux's defaults for a large zone with `cores` CPUs.
    pub fn new(cores: usize) -> Self {
        Self {
            cores,
            pcp_batch: 63,
            pcp_high: 6 * 63,
            pcp: true,
        }
    }

    /// The plain spin-locked buddy allocator: every order goes to the zone's free lists.
    pub fn without_pcp(cores: usize) -> Self {
        Self {
            pcp: false,
            ..Self::new(cores)
        }
    }
}

#[repr(align(64))]
struct PaddedPcp(SpinLock<PerCpuPages>);

/// The buddy allocator; see the [module docs](self).
pub struct Buddy {
    pages: Box<[Page]>,
    zone: SpinLock<FreeAreas>,
    pcps: Box<[PaddedPcp]>,
    batch: usize,
    high: usize,
    pcp: bool,
}

impl std::fmt::Debug for Buddy {
    /// The size and settings, not the page array.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buddy")
            .field("frames", &self.pages.len())
            .field("cpus", &self.pcps.len())
            .field("pcp", &self.pcp)
            .field("batch", &self.batch)
            .field("high", &self.high)
            .finish_non_exhaustive()
    }
}

impl Buddy {
    /// Creates a zone of `frames` free frames.
    pub fn new(config: BuddyConfig, frames: usize) -> Result<Self, AllocError> {
        let invalid = |reason| Err(AllocError::Zone { frames, reason });
        if frames == 0 || frames >= page::NIL as usize {
            return invalid("the buddy allocator manages 1 to 2^32 - 2 frames");
        }
        if config.cores == 0 || config.pcp_batch == 0 || config.pcp_high < config.pcp_batch {
            return invalid("needs at least one core and 0 < pcp_batch <= pcp_high");
        }
        let pages = page_array(frames);
        let zone = SpinLock::new(FreeAreas::new(&pages));
        Ok(Self {
            pages,
            zone,
            pcps: (0..config.cores)
                .map(|_| PaddedPcp(SpinLock::new(PerCpuPages::default())))
                .collect(),
            batch: config.pcp_batch,
            high: config.pcp_high,
            pcp: config.pcp,
        })
    }

    /// Allocatable 2 MiB frames: free blocks of order 9 and up (per-CPU lists not counted).
    pub fn free_huge(&self) -> usize {
        let zone = self.zone.lock();
        (HUGE_ORDER..=MAX_ORDER)
            .map(|o| zone.free_blocks(o) << (o - HUGE_ORDER))
            .sum()
    }

    /// Writes the number of free base frames of every 2 MiB block into `counts` (one entry per
    /// block, the last one possibly partial). Meant for a quiescent allocator.
    pub fn count_free_per_huge(&self, counts: &mut [u16]) {
        counts.fill(0);
        let _zone = self.zone.lock();
        let mut frame = 0;
        while frame < self.pages.len() {
            let state = self.pages[frame].state.load(Relaxed);
            let run = match state {
                STATE_PCP => 1,
                _ => (0..=MAX_ORDER)
                    .find(|&o| state == page::state_buddy(o))
                    .map_or(0, |o| 1 << o),
            };
            for block_frame in (frame..frame + run).step_by(1 << HUGE_ORDER) {
                counts[block_frame >> HUGE_ORDER] += run.min(1 << HUGE_ORDER) as u16;
            }
            frame += run.max(1);
        }
    }

    fn pcp(&self, core: usize) -> &SpinLock<PerCpuPages> {
        &self.pcps[core % self.pcps.len()].0
    }

    fn get_pcp(&self, core: usize) -> Option<usize> {
        let mut pcp = self.pcp(core).lock();
        if pcp.is_empty() {
            pcp.refill(&self.pages, &mut self.zone.lock(), self.batch);
        }
        pcp.pop(&self.pages)
    }

    fn try_get(&self, core: usize, order: usize) -> Option<usize> {
        if order == 0 && self.pcp {
            self.get_pcp(core)
        } else {
            self.zone.lock().alloc(&self.pages, order)
        }
    }
}

impl FrameAllocator for Buddy {
    fn name(&self) -> &'static str {
        if self.pcp {
            "buddy-pcp"
        } else {
            "buddy"
        }
    }

    fn supports_order(&self, order: usize) -> bool {
        order <= MAX_ORDER
    }

    fn get(&self, core: usize, order: usize) -> Result<usize, AllocError> {
        if order > MAX_ORDER {
            return Err(AllocError::Frame(llfree::Error::InvalidOrder(order)));
        }
        if let Some(frame) = self.try_get(core, order) {
            return Ok(frame);
        }
        // Slow path, as Linux's `drain_all_pages`: the frames may sit in per-CPU lists.
        (0..self.pcps.len()).for_each(|c| self.drain(c));
        self.try_get(core, order)
            .ok_or(AllocError::Frame(llfree::Error::Memory { order }))
    }

    fn put(&self, core: usize, frame: usize, order: usize) -> Result<(), AllocError> {
        if order > MAX_ORDER {
            return Err(AllocError::Frame(llfree::Error::InvalidOrder(order)));
        }
        check_frame(frame, order, self.pages.len())?;
        self.pages[frame]
            .state
            .compare_exchange(state_allocated(order), STATE_NONE, Acquire, Relaxed)
            .map_err(|_| AllocError::Frame(llfree::Error::NotAllocated { frame, order }))?;
        if order == 0 && self.pcp {
            let mut pcp = self.pcp(core).lock();
            pcp.push(&self.pages, frame);
            if pcp.len() >= self.high {
                pcp.release(&self.pages, &mut self.zone.lock(), self.batch);
            }
        } else {
            self.zone.lock().free(&self.pages, frame, order);
        }
        Ok(())
    }

    fn drain(&self, core: usize) {
        let mut pcp = self.pcp(core).lock();
        if !pcp.is_empty() {
            let count = pcp.len();
            pcp.release(&self.pages, &mut self.zone.lock(), count);
        }
    }

    fn free_frames(&self) -> usize {
        let cached: usize = self.pcps.iter().map(|pcp| pcp.0.lock().len()).sum();
        self.zone.lock().free_frames() + cached
    }

    fn frames(&self) -> usize {
        self.pages.len()
    }
}

#[cfg(test)]
mod tests;
