//! Benchmarks of the LLFree page-frame allocator against classic baselines.
//!
//! Every allocator implements [`FrameAllocator`], so one harness drives them all in the same run:
//! the paper's bulk, rand and repeat benchmarks (LLFree, ATC'23, §5.1), the fragmentation
//! benchmark (§5.6) and the recovery benchmark (§5.7).

mod affinity;
pub mod alloc_kind;
pub mod buddy;
mod core_claim;
pub mod frag;
pub mod frame_alloc;
mod frame_links;
pub mod harness;
pub mod list_cas;
pub mod list_local;
pub mod list_locked;
pub mod llfree_alloc;
pub mod recover;
pub mod report;
pub mod rng;
pub mod spin;
pub mod svg_plot;
#[cfg(test)]
mod testing;
pub mod units;

pub use frame_alloc::{AllocError, FrameAllocator};
