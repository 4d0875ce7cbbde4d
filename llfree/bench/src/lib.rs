//! Benchmarks of the LLFree page-frame allocator against classic baselines.
//!
//! Every allocator implements [`FrameAllocator`], so one harness drives them all in the same run:
//! the paper's bulk, rand and repeat benchmarks (LLFree, ATC'23, §5.1), the fragmentation
//! benchmark (§5.6) and the recovery benchmark (§5.7).

pub mod frame_alloc;
pub mod spin;

pub use frame_alloc::{AllocError, FrameAllocator};
