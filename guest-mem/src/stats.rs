//! Counters of guest memories (a pool's: `pool::stats`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::latency::{LatencyHistogram, LatencySummary};

/// A snapshot of one guest memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryStats {
    /// Chunks of all regions.
    pub chunks: usize,
    /// Chunks backed by a pool frame now.
    pub populated_chunks: usize,
    /// Bytes backed by pool frames now.
    pub populated_bytes: u64,
    /// Chunks mapped privately from a copy snapshot's memory file (no pool frame; what the
    /// guest has not written is the file's page cache, shared with other VMs loaded from it).
    pub file_backed_chunks: usize,
    /// userfaultfd faults resolved with a new frame.
    pub faults: u64,
    /// Faults resolved per vCPU (index = vCPU index).
    pub vcpu_faults: Vec<u64>,
    /// Faults that found the pool exhausted.
    pub exhausted: u64,
    /// vCPUs that wait for a frame now (see [`crate::GuestMemory::release_faults`]).
    pub waiting_vcpus: usize,
    /// Faults of other threads that wait for a frame now: KVM's asynchronous page fault
    /// workers (most faults of a guest running with interrupts on), VMM threads.
    pub waiting_other_faults: usize,
    /// Chunks whose frame went back to the pool by a discard.
    pub discarded_chunks: u64,
    /// Chunks whose recorded frame (a VM in a zone taken up again) a fault handler mapped
    /// before anything touched them.
    pub mapped_ahead_chunks: u64,
    /// 4 KiB pieces given away (balloon) and not reclaimed yet.
    pub given_away_pieces: u64,
    /// Where the time of populating chunks goes.
    pub fault_latency: FaultLatency,
}

/// Latencies of populating chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultLatency {
    /// userfaultfd faults resolved with a new frame, from reading the fault message to
    /// UFFDIO_WAKE returning (frame allocation, mapping and wake-up; faults read in one batch
    /// include the handling of those before them).
    pub handling: LatencySummary,
    /// `mmap(MAP_FIXED)` of a frame over a chunk, for every population (faults, eager
    /// population, VMM accesses).
    pub map: LatencySummary,
    /// The UFFDIO_WAKE ioctl after resolving a fault.
    pub wake: LatencySummary,
}

/// Event counters of a guest memory, updated lock-free.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub faults: AtomicU64,
    pub exhausted: AtomicU64,
    pub discarded_chunks: AtomicU64,
    pub mapped_ahead_chunks: AtomicU64,
    /// Chunks a balloon deflation could not give frames to (mapping failed).
    pub repopulate_failures: AtomicU64,
    pub vcpu_faults: Box<[AtomicU64]>,
    pub fault_handling: LatencyHistogram,
    pub frame_map: LatencyHistogram,
    pub fault_wake: LatencyHistogram,
}

impl Counters {
    pub fn new(vcpus: usize) -> Self {
        Self {
            vcpu_faults: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            ..Self::default()
        }
    }

    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn read(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub fn fault_latency(&self) -> FaultLatency {
        FaultLatency {
            handling: self.fault_handling.summary(),
            map: self.frame_map.summary(),
            wake: self.fault_wake.summary(),
        }
    }
}
