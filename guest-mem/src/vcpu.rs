//! Which thread is which vCPU, and the errors their faults (and those of other threads: KVM's
//! asynchronous page fault workers, VMM threads) could not be resolved with.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::sys;

/// Why a memory fault of the guest (a vCPU's, or a kernel worker's for one) could not be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FaultError {
    /// The pool had no free frame for the chunk the guest touched.
    #[error("guest memory pool exhausted: no free frame for the chunk the guest touched")]
    PoolExhausted,
    /// Mapping the frame failed (e.g. the host ran out of huge pages).
    #[error("cannot map a pool frame for the chunk the guest touched")]
    MapFailed,
}

const NO_ERROR: u8 = 0;
const NO_TID: u32 = 0;
const NOT_BLOCKED: usize = 0;

/// Thread ids of vCPUs (lock-free lookup), their pending fault errors and the faults they are
/// blocked on (a vCPU waits on at most one fault at a time), and the pending fault error of
/// threads that are no vCPU.
#[derive(Debug)]
pub(crate) struct VcpuRegistry {
    tids: Box<[AtomicU32]>,
    errors: Box<[AtomicU8]>,
    other_error: AtomicU8,
    blocked: Box<[AtomicUsize]>,
    /// Per vCPU: when its current wait began, in nanoseconds from `epoch`.
    blocked_since: Box<[AtomicU64]>,
    epoch: Instant,
    event: EventFd,
    kick_signal: Option<i32>,
}

impl VcpuRegistry {
    pub fn new(vcpus: usize, kick_signal: Option<i32>) -> io::Result<Self> {
        Ok(Self {
            tids: (0..vcpus).map(|_| AtomicU32::new(NO_TID)).collect(),
            errors: (0..vcpus).map(|_| AtomicU8::new(NO_ERROR)).collect(),
            other_error: AtomicU8::new(NO_ERROR),
            blocked: (0..vcpus).map(|_| AtomicUsize::new(NOT_BLOCKED)).collect(),
            blocked_since: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            event: EventFd::new(EFD_NONBLOCK)?,
            kick_signal,
        })
    }

    pub fn len(&self) -> usize {
        self.tids.len()
    }

    /// Records the calling thread as vCPU `index`.
    pub fn register_current(&self, index: usize) -> bool {
        self.register(index, sys::gettid())
    }

    /// Records thread `tid` as vCPU `index`.
    pub fn register(&self, index: usize, tid: u32) -> bool {
        match self.tids.get(index) {
            Some(slot) => {
                slot.store(tid, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// The vCPU index of thread `tid`.
    pub fn index_of(&self, tid: u32) -> Option<usize> {
        self.tids
            .iter()
            .position(|slot| slot.load(Ordering::Acquire) == tid)
    }

    /// Records `error` for vCPU `index` (thread `tid`), signals the event and kicks the thread so
    /// that its KVM_RUN returns EINTR instead of waiting on the fault.
    pub fn report(&self, index: usize, tid: u32, error: FaultError) {
        self.errors[index].store(error_code(error), Ordering::Release);
        self.signal_event();
        if let Some(signal) = self.kick_signal {
            // The thread may have exited; then there is nobody to tell.
            let _ = sys::tgkill(tid, signal);
        }
    }

    /// Records `error` for a fault of a thread that is no vCPU (KVM's asynchronous page fault
    /// worker resolving a guest fault, a VMM thread) and signals the event.
    pub fn report_other(&self, error: FaultError) {
        self.other_error.store(error_code(error), Ordering::Release);
        self.signal_event();
    }

    fn signal_event(&self) {
        // An eventfd write fails only when its counter would overflow; it is readable then.
        let _ = self.event.write(1);
    }

    /// Records that vCPU `index` waits on an unresolved fault at host address `addr`. Returns
    /// whether this is a new wait, i.e. the vCPU was not already known to wait on `addr`: the
    /// kernel delivers the same fault again whenever the wait is interrupted (a kick does that),
    /// and such a repeat must not be reported as another error.
    pub fn block(&self, index: usize, addr: usize) -> bool {
        let nanos = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let previous = self.blocked[index].swap(addr, Ordering::AcqRel);
        if previous == NOT_BLOCKED {
            self.blocked_since[index].store(nanos, Ordering::Release);
        }
        previous != addr
    }

    /// How long vCPU `index` has waited on an unresolved fault, if it does.
    pub fn waited(&self, index: usize) -> Option<Duration> {
        self.blocked_on(index)?;
        let since = Duration::from_nanos(self.blocked_since[index].load(Ordering::Acquire));
        Some(self.epoch.elapsed().saturating_sub(since))
    }

    /// The address vCPU `index` is blocked on, if any.
    pub fn blocked_on(&self, index: usize) -> Option<usize> {
        match self.blocked[index].load(Ordering::Acquire) {
            NOT_BLOCKED => None,
            addr => Some(addr),
        }
    }

    /// Ends vCPU `index`'s wait on `addr`, if it still waits on that address (its fault has been
    /// resolved).
    pub fn resolve(&self, index: usize, addr: usize) {
        let _ = self.blocked[index].compare_exchange(
            addr,
            NOT_BLOCKED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Ends vCPU `index`'s wait on `addr` (giving up on its fault); returns whether it waited
    /// on that address, i.e. whether the caller is the one to answer the fault.
    pub fn take_blocked_on(&self, index: usize, addr: usize) -> bool {
        self.blocked[index]
            .compare_exchange(addr, NOT_BLOCKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether some vCPU waits on an unresolved fault.
    pub fn any_blocked(&self) -> bool {
        self.blocked
            .iter()
            .any(|slot| slot.load(Ordering::Acquire) != NOT_BLOCKED)
    }

    /// How many vCPUs wait on an unresolved fault.
    pub fn blocked_count(&self) -> usize {
        self.blocked
            .iter()
            .filter(|slot| slot.load(Ordering::Acquire) != NOT_BLOCKED)
            .count()
    }

    /// Takes the pending error of vCPU `index`.
    pub fn take_error(&self, index: usize) -> Option<FaultError> {
        error_of(self.errors.get(index)?.swap(NO_ERROR, Ordering::AcqRel))
    }

    /// Takes the pending error of the threads that are no vCPU.
    pub fn take_other_error(&self) -> Option<FaultError> {
        error_of(self.other_error.swap(NO_ERROR, Ordering::AcqRel))
    }

    /// Readable when some vCPU has a pending error.
    pub fn event(&self) -> &EventFd {
        &self.event
    }
}

fn error_code(error: FaultError) -> u8 {
    match error {
        FaultError::PoolExhausted => 1,
        FaultError::MapFailed => 2,
    }
}

fn error_of(code: u8) -> Option<FaultError> {
    match code {
        1 => Some(FaultError::PoolExhausted),
        2 => Some(FaultError::MapFailed),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_maps_threads_to_vcpus_and_keeps_errors_until_taken() {
        let reg = VcpuRegistry::new(2, None).expect("eventfd");
        assert!(reg.register_current(1));
        assert!(!reg.register_current(2));
        assert_eq!(reg.index_of(sys::gettid()), Some(1));
        assert_eq!(reg.index_of(1), None);
        assert!(reg.register(0, 4242));
        assert_eq!(reg.index_of(4242), Some(0));
        reg.report(1, sys::gettid(), FaultError::PoolExhausted);
        assert_eq!(reg.event().read().expect("event"), 1);
        assert_eq!(reg.take_error(1), Some(FaultError::PoolExhausted));
        assert_eq!(reg.take_error(1), None);
        reg.report_other(FaultError::MapFailed);
        assert_eq!(reg.event().read().expect("event"), 1);
        assert_eq!(reg.take_error(0), None, "not a vCPU's error");
        assert_eq!(reg.take_other_error(), Some(FaultError::MapFailed));
        assert_eq!(reg.take_other_error(), None);
        assert!(!reg.any_blocked());
        assert!(reg.block(0, 0x1000));
        assert!(reg.any_blocked());
        assert_eq!(reg.blocked_count(), 1);
        assert!(!reg.take_blocked_on(0, 0x2000), "waits on another address");
        assert!(reg.take_blocked_on(0, 0x1000));
        assert!(!reg.take_blocked_on(0, 0x1000), "taken once");
        assert_eq!(reg.blocked_count(), 0);
    }

    #[test]
    fn a_fault_delivered_again_is_the_same_wait_until_resolved() {
        let reg = VcpuRegistry::new(1, None).expect("eventfd");
        assert!(reg.block(0, 0x20_0000), "a new wait");
        assert!(!reg.block(0, 0x20_0000), "the same fault again");
        assert_eq!(reg.blocked_on(0), Some(0x20_0000));
        reg.resolve(0, 0x40_0000);
        assert_eq!(
            reg.blocked_on(0),
            Some(0x20_0000),
            "another address resolves nothing"
        );
        reg.resolve(0, 0x20_0000);
        assert_eq!(reg.blocked_on(0), None);
        assert!(!reg.any_blocked());
        assert!(reg.block(0, 0x20_0000), "blocked again later: a new wait");
        assert!(reg.block(0, 0x40_0000), "a different address: a new wait");
    }
}
