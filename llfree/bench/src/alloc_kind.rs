//! The allocators selectable on the command line, and their construction.

use crate::buddy::{Buddy, BuddyConfig};
use crate::frame_alloc::{AllocError, FrameAllocator};
use crate::list_cas::ListCas;
use crate::list_local::ListLocal;
use crate::list_locked::ListLocked;
use crate::llfree_alloc::LLFreeAlloc;
use llfree::InitError;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// One of the benchmarked allocators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllocKind {
    /// LLFree with volatile metadata, threads allocating through their core's cache.
    LLFree,
    /// LLFree with volatile metadata, every thread on the shared `get`/`put`.
    LLFreeShared,
    /// LLFree with volatile metadata, gets through the core's cache, puts shared (guest memory's
    /// path).
    LLFreeVm,
    /// The spin-locked buddy allocator with per-order free lists.
    Buddy,
    /// The buddy allocator with Linux-like per-CPU lists for order 0.
    BuddyPcp,
    /// One spin-locked global list.
    ListLocked,
    /// One lock-free global list.
    ListCas,
    /// Per-core lists only.
    ListLocal,
}

impl AllocKind {
    /// Every allocator, in the order of the default command line.
    pub const ALL: [AllocKind; 8] = [
        AllocKind::LLFree,
        AllocKind::LLFreeShared,
        AllocKind::LLFreeVm,
        AllocKind::Buddy,
        AllocKind::BuddyPcp,
        AllocKind::ListLocked,
        AllocKind::ListCas,
        AllocKind::ListLocal,
    ];

    /// The name used on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            AllocKind::LLFree => "llfree",
            AllocKind::LLFreeShared => "llfree-shared",
            AllocKind::LLFreeVm => "llfree-vm",
            AllocKind::Buddy => "buddy",
            AllocKind::BuddyPcp => "buddy-pcp",
            AllocKind::ListLocked => "list-locked",
            AllocKind::ListCas => "list-cas",
            AllocKind::ListLocal => "list-local",
        }
    }

    /// Whether the allocator supports `order` (as [`FrameAllocator::supports_order`]).
    pub fn supports_order(self, order: usize) -> bool {
        match self {
            AllocKind::LLFree | AllocKind::LLFreeShared | AllocKind::LLFreeVm => {
                order <= llfree::MAX_ORDER || order == llfree::GIANT_ORDER
            }
            AllocKind::Buddy | AllocKind::BuddyPcp => order <= crate::buddy::MAX_ORDER,
            AllocKind::ListLocked | AllocKind::ListCas | AllocKind::ListLocal => order == 0,
        }
    }

    /// Creates the allocator for `cores` cores over a zone of `frames` free frames.
    pub fn create(
        self,
        cores: usize,
        frames: usize,
    ) -> Result<Box<dyn FrameAllocator>, CreateError> {
        Ok(match self {
            AllocKind::LLFree => Box::new(LLFreeAlloc::new(cores, frames)?),
            AllocKind::LLFreeShared => Box::new(LLFreeAlloc::shared(cores, frames)?),
            AllocKind::LLFreeVm => Box::new(LLFreeAlloc::vm_path(cores, frames)?),
            AllocKind::Buddy => Box::new(Buddy::new(BuddyConfig::without_pcp(cores), frames)?),
            AllocKind::BuddyPcp => Box::new(Buddy::new(BuddyConfig::new(cores), frames)?),
            AllocKind::ListLocked => Box::new(ListLocked::new(frames)?),
            AllocKind::ListCas => Box::new(ListCas::new(frames)?),
            AllocKind::ListLocal => Box::new(ListLocal::new(cores, frames)?),
        })
    }
}

/// An allocator could not be created.
#[derive(Debug, Error)]
pub enum CreateError {
    /// A baseline rejected the zone.
    #[error(transparent)]
    Baseline(#[from] AllocError),
    /// LLFree rejected the configuration.
    #[error("llfree: {0}")]
    LLFree(#[from] InitError),
    /// The allocator cannot run this benchmark.
    #[error("{alloc} does not support {bench}")]
    Unsupported {
        /// The allocator.
        alloc: AllocKind,
        /// The benchmark.
        bench: &'static str,
    },
}

impl fmt::Display for AllocKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AllocKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown allocator {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_create() {
        for kind in AllocKind::ALL {
            assert_eq!(kind.name().parse::<AllocKind>(), Ok(kind));
            let alloc = kind.create(2, 1024).unwrap();
            assert_eq!(alloc.name(), kind.name());
            assert_eq!(alloc.free_frames(), 1024);
            for order in 0..=20 {
                assert_eq!(kind.supports_order(order), alloc.supports_order(order));
            }
        }
        assert!("slab".parse::<AllocKind>().unwrap_err().contains("buddy"));
    }
}
