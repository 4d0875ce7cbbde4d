//! LLFree: a lock- and log-free page-frame allocator.
//!
//! Implements the design of Wrenger et al., "LLFree: Scalable and Optionally-Persistent Page-Frame
//! Allocation" (USENIX ATC'23), extended with 1 GiB giant frames as in Wrenger's thesis.
//!
//! * The **lower level** (`lower`) keeps, per 2 MiB child, a 512-bit bitfield (one cache line) and a
//!   16-bit child entry (free counter, huge flags). Every allocation and free is committed by one
//!   atomic change in one cache line, so the lower level alone is the crash-consistent state.
//! * The **upper level** (`upper`) groups 32 children into 64 MiB trees, each with a free counter
//!   and a reserved flag, and gives every core a reserved tree so that cores do not share cache lines.
//! * A thread that keeps a [`CoreCache`] (e.g. a vCPU thread) takes its core's frames in batches
//!   and counts them privately: one locked instruction less per operation than
//!   [`LLFree::get`], whose core any number of threads may share.
//! * Metadata lives on the heap ([`LLFree::new`]) or inside a caller-provided persistent region
//!   ([`LLFree::persistent`]), e.g. a `MAP_SHARED` file, hugetlbfs or DAX mapping, and can be
//!   recovered after a clean shutdown or after a crash ([`Init`]).
//!
//! Frames are numbered from 0 in units of 4 KiB. Supported orders are 0..=10 and
//! [`GIANT_ORDER`] (18, 1 GiB).

pub mod error;
pub use error::{Error, InitError};

#[cfg(test)]
#[macro_use]
mod stop_macro {
    /// A stop point for interleaving tests (see `stop`).
    macro_rules! stop {
        () => {
            $crate::stop::point()
        };
    }
}

#[cfg(not(test))]
#[macro_use]
mod stop_macro {
    /// A stop point for interleaving tests; nothing outside tests.
    macro_rules! stop {
        () => {};
    }
}

mod allocator;
mod flush;
mod lower;
mod meta;
pub mod region;
#[cfg(test)]
mod stop;
mod upper;

pub use allocator::{CoreCache, LLFree, SlotRecovery};
pub use meta::PERSISTENT_SLOTS;
pub use region::{FileRegion, HeapRegion, MetaRegion};

/// Size of a base frame; frame numbers count in this unit.
pub const FRAME_SIZE: usize = 4096;
/// Order of a 2 MiB huge frame.
pub const HUGE_ORDER: usize = 9;
/// The largest order below [`GIANT_ORDER`] (4 MiB).
pub const MAX_ORDER: usize = 10;
/// Order of a 1 GiB giant frame.
pub const GIANT_ORDER: usize = 18;
/// Frames per child (2 MiB).
pub const CHILD_FRAMES: usize = 1 << HUGE_ORDER;
/// Children per tree.
pub const TREE_CHILDREN: usize = 32;
/// Frames per tree (64 MiB).
pub const TREE_FRAMES: usize = CHILD_FRAMES * TREE_CHILDREN;
/// Largest zone: frame numbers must fit the 40-bit hint of the per-core data.
pub const MAX_FRAMES: usize = 1 << 40;

/// The id of a core: it selects a per-core reservation, which any number of threads may share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CoreId(pub usize);

/// A frame number: the index of a base frame ([`FRAME_SIZE`]) in the zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FrameId(pub usize);

/// The size of an allocation: `2^order` base frames, aligned to its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Order(pub usize);

impl Order {
    /// A base frame (4 KiB).
    pub const BASE: Order = Order(0);
    /// A huge frame (2 MiB).
    pub const HUGE: Order = Order(HUGE_ORDER);
    /// A giant frame (1 GiB).
    pub const GIANT: Order = Order(GIANT_ORDER);

    /// How many base frames an allocation of this order spans.
    pub fn frames(self) -> usize {
        1 << self.0
    }
}

/// Parameters of an allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Number of cores (per-core reservations); at most one per tree is used.
    pub cores: usize,
    /// Frames in the zone: a non-zero multiple of [`CHILD_FRAMES`].
    pub frames: usize,
    /// Reserve a tree after this many consecutive frees into it (0 disables reserve-on-free).
    pub reserve_on_free: u32,
    /// Trees with fewer free frames count as allocated (default 12.5 % of a tree).
    pub almost_allocated: usize,
    /// Trees with more free frames count as free (default 87.5 % of a tree).
    pub almost_free: usize,
    /// Write back every committed change of persistent metadata with `clwb` (ADR platforms).
    pub flush: bool,
    /// Persistent metadata shared by several processes at once: they claim per-core slots
    /// ([`LLFree::claim_slots`]), and the last of them marks the shutdown clean
    /// ([`LLFree::mark_clean`]).
    pub shared: bool,
}

impl Config {
    /// The default configuration for `cores` cores and `frames` frames.
    pub fn new(cores: usize, frames: usize) -> Self {
        Self {
            cores,
            frames,
            reserve_on_free: 4,
            almost_allocated: TREE_FRAMES / 8,
            almost_free: TREE_FRAMES - TREE_FRAMES / 8,
            flush: false,
            shared: false,
        }
    }

    fn validate(&self) -> Result<(), InitError> {
        if self.cores == 0 {
            return Err(InitError::Config("at least one core is needed"));
        }
        if self.frames == 0 || !self.frames.is_multiple_of(CHILD_FRAMES) {
            return Err(InitError::Config(
                "the zone must be a non-zero multiple of 512 frames (2 MiB)",
            ));
        }
        if self.frames >= MAX_FRAMES {
            return Err(InitError::Config("the zone is larger than 4 PiB"));
        }
        if self.almost_allocated > self.almost_free || self.almost_free > TREE_FRAMES {
            return Err(InitError::Config(
                "thresholds must satisfy almost_allocated <= almost_free <= TREE_FRAMES",
            ));
        }
        Ok(())
    }
}

/// How persistent metadata is initialised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// Format the region: all frames free.
    Fresh,
    /// Recover: after a clean shutdown the counters are validated only (fast); after a crash
    /// they are rebuilt from the bitfields.
    Recover,
    /// Recover and always rebuild the counters from the bitfields.
    RecoverDeep,
    /// Use the metadata as it is: other processes use it right now ([`Config::shared`]).
    Attach,
}

/// How an allocator came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Freshly initialised.
    Fresh,
    /// Recovered after a clean shutdown.
    Clean,
    /// Recovered by rebuilding counters from the bitfields (after a crash, or on request).
    Crash,
    /// Attached to metadata other processes use ([`Init::Attach`]).
    Attached,
}

/// The state of one aligned frame of some order ([`LLFree::frame_states`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameState {
    /// Entirely free.
    Free,
    /// Allocated as one frame of that order.
    Allocated,
    /// Partly allocated, or allocated as part of a larger frame or as smaller ones.
    Mixed,
}

/// Statistics of one tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeStats {
    /// Index of the tree.
    pub index: usize,
    /// Free frames.
    pub free: usize,
    /// Whether a core has reserved the tree.
    pub reserved: bool,
}
