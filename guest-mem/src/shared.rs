//! The state a guest memory's regions and its fault handler threads share: the pool, the
//! userfaultfd, the vCPU registry and the counters ([`SharedState`]; the regions themselves, which
//! the memory and the handlers keep alive together, are `region::Inner`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::pool::Pool;
use crate::stats::Counters;
use crate::sys::uffd::Uffd;
use crate::vcpu::VcpuRegistry;
use crate::zone::ZoneVm;

/// State shared by the regions and the fault handler threads.
#[derive(Debug)]
pub(crate) struct SharedState {
    pub pool: Arc<Pool>,
    pub uffd: Uffd,
    pub vcpus: VcpuRegistry,
    /// Faults of threads that are no vCPU (KVM's asynchronous page fault workers, VMM threads)
    /// that wait for a frame: their addresses, retried with the vCPUs' (see `fault`).
    pub waiting_others: Mutex<Vec<usize>>,
    /// Whether `waiting_others` holds any, read without its lock on the handlers' poll path.
    pub others_wait: AtomicBool,
    /// Set for good when the VM stops ([`crate::GuestMemory::release_faults`]): a fault the
    /// pool cannot serve gets the zero page at once instead of waiting. Changed only with
    /// `waiting_others` locked, so that no fault starts waiting after the release.
    pub released: AtomicBool,
    /// Set while the VM is paused: a vCPU that waits for a frame keeps waiting even when one is
    /// free (it counts as paused), until the resume ([`crate::GuestMemory::hold_waiting_vcpus`]).
    pub held: AtomicBool,
    /// Resolutions of a waiting vCPU's fault under way, which a hold waits out.
    pub resolving_held: AtomicUsize,
    pub counters: Counters,
    pub core_base: usize,
    pub vmm_core: usize,
    /// The VM in a zone whose memory this is (its persistent tables live there); detached
    /// when the memory goes.
    pub zone_vm: Option<ZoneVm>,
}

impl SharedState {
    /// Whether the faults have been released (see `released`).
    pub fn released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Starts resolving the fault a vCPU waits on, unless the waits are held; the caller then
    /// ends with [`Self::end_blocked_resolution`].
    pub fn begin_blocked_resolution(&self) -> bool {
        self.resolving_held.fetch_add(1, Ordering::SeqCst);
        if self.held.load(Ordering::SeqCst) {
            self.resolving_held.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Ends what [`Self::begin_blocked_resolution`] started.
    pub fn end_blocked_resolution(&self) {
        self.resolving_held.fetch_sub(1, Ordering::SeqCst);
    }

    /// The addresses other threads wait on (see `waiting_others`).
    pub fn lock_waiting_others(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.waiting_others
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
