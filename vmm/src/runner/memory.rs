//! The frame pool and the guest memory of a VM, as configured.

use std::sync::Arc;

use guest_mem::{GuestMemory, MemoryConfig, MemoryError, Pool, PoolConfig, PoolError, Population};
use vm_memory::GuestAddress;

use crate::config::VmConfig;
use crate::vcpu::kick_signal;

/// Pool cores besides one per vCPU: the VMM's own (eager population, loaders, device
/// accesses) and one for a device that frees frames (the balloon).
pub const SPARE_CORES: usize = 2;
/// Most userfaultfd handler threads; a VM gets one per vCPU up to this.
const MAX_FAULT_THREADS: usize = 4;

/// Creates the pool: guest RAM's size of the configured backing, one core per vCPU plus
/// [`SPARE_CORES`].
pub(super) fn create_pool(config: &VmConfig) -> Result<Arc<Pool>, PoolError> {
    Pool::new(PoolConfig {
        backing: config.backing.pool_backing(config.format_pool),
        size: config.memory_size,
        cores: config.vcpus + SPARE_CORES,
        scrub: config.scrub,
    })
}

/// Creates guest memory over the RAM regions of the layout, in chunks of the pool's frame size,
/// populated eagerly or lazily. Faults that cannot be served kick the vCPU out of `KVM_RUN`.
/// Eager population counts its progress in `population` and stops once it is cancelled.
pub(super) fn create_memory(
    config: &VmConfig,
    pool: Arc<Pool>,
    population: &Population,
) -> Result<GuestMemory, MemoryError> {
    let ranges = config
        .ram_regions()
        .iter()
        .map(|region| (GuestAddress(region.start), region.size))
        .collect();
    GuestMemory::new_watched(
        pool,
        MemoryConfig {
            ranges,
            chunk_size: Some(config.backing.frame_size()),
            populate: config.populate,
            vcpus: config.vcpus,
            fault_threads: config.vcpus.clamp(1, MAX_FAULT_THREADS),
            kick_signal: Some(kick_signal()),
        },
        population,
    )
}
