//! Guest physical memory made of LLFree-managed host frames, populated eagerly or lazily per vCPU.
//!
//! * A [`Pool`] is one LLFree allocator over one host memory zone (plain memory, hugetlb with
//!   2 MiB or 1 GiB pages, or a persistent file / DAX device), shared by guests through `Arc`.
//! * A [`GuestMemory`] is a guest's RAM: regions, each one contiguous host virtual range made of
//!   chunks the size of a pool frame. A chunk is unpopulated (an anonymous placeholder registered
//!   with userfaultfd) or mapped onto exactly one pool frame with `MAP_FIXED | MAP_SHARED`.
//! * Lazy population: a fault is resolved by a handler thread that allocates with the faulting
//!   vCPU's own core id ([`GuestMemory::register_vcpu`]), maps the frame and wakes the vCPU.
//! * Discards return whole chunks' frames to the pool, scrubbed ([`Scrub`]); partial discards
//!   are counted in per-chunk bitmaps until the chunk is entirely given away.
//! * [`GuestMemory`] implements vm-memory's `GuestMemoryBackend`, so loaders, virtio queues and
//!   devices use it directly; their accesses populate first and never fault fatally.
//! * A [`zone::Zone`] is a persistent pool in one file with a directory of VMs: the memory of a
//!   VM in a zone ([`GuestMemory::new_in_zone`]) outlives the process, crashes included.

mod access;
mod dirty;
mod discard;
mod fault;
mod frame_table;
mod latency;
mod memory;
mod pieces;
pub mod pool;
mod region;
mod shared;
pub mod stats;
mod sys;
#[cfg(feature = "testing")]
pub mod testing;
mod vcpu;
pub mod zone;

pub use discard::{DiscardStats, Reclaimed};
pub use latency::LatencySummary;
pub use memory::{
    GuestMemory, HandlerMemory, HandlerRegion, MemoryConfig, MemoryError, Populate, Population,
    Snapshot,
};
pub use pool::{
    Backing, CoreFrames, Frame, FrameSize, Pool, PoolConfig, PoolError, PoolStats, Scrub, TreeUsage,
};
pub use region::{GuestRegion, RegionError};
pub use stats::{FaultLatency, MemoryStats};
pub use sys::uffd::handler_ioctls as fault_handler_ioctls;
pub use sys::{gettid, random_u64, wait_readable, Readiness};
pub use vcpu::FaultError;
