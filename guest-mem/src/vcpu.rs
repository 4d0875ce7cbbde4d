//! Which thread is which vCPU, and the errors their faults could not be resolved with.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::sys;

/// Why a vCPU's memory fault could not be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FaultError {
    /// The pool had no free frame for the chunk the vCPU touched.
    #[error("guest memory pool exhausted: no free frame for the chunk the vCPU touched")]
    PoolExhausted,
    /// Mapping the frame failed (e.g. the host ran out of huge pages).
    #[error("cannot map a pool frame for the chunk the vCPU touched")]
    MapFailed,
}

const NO_ERROR: u8 = 0;
const NO_TID: u32 = 0;

/// Thread ids of vCPUs (lock-free lookup) and their pending fault errors.
#[derive(Debug)]
pub(crate) struct VcpuRegistry {
    tids: Box<[AtomicU32]>,
    errors: Box<[AtomicU8]>,
    event: EventFd,
    kick_signal: Option<i32>,
}

impl VcpuRegistry {
    pub fn new(vcpus: usize, kick_signal: Option<i32>) -> io::Result<Self> {
        Ok(Self {
            tids: (0..vcpus).map(|_| AtomicU32::new(NO_TID)).collect(),
            errors: (0..vcpus).map(|_| AtomicU8::new(NO_ERROR)).collect(),
            event: EventFd::new(EFD_NONBLOCK)?,
            kick_signal,
        })
    }

    pub fn len(&self) -> usize {
        self.tids.len()
    }

    /// Records the calling thread as vCPU `index`.
    pub fn register_current(&self, index: usize) -> bool {
        match self.tids.get(index) {
            Some(slot) => {
                slot.store(sys::gettid(), Ordering::Release);
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
        let code = match error {
            FaultError::PoolExhausted => 1,
            FaultError::MapFailed => 2,
        };
        self.errors[index].store(code, Ordering::Release);
        // An eventfd write fails only when its counter would overflow; it is readable then.
        let _ = self.event.write(1);
        if let Some(signal) = self.kick_signal {
            // The thread may have exited; then there is nobody to tell.
            let _ = sys::tgkill(tid, signal);
        }
    }

    /// Takes the pending error of vCPU `index`.
    pub fn take_error(&self, index: usize) -> Option<FaultError> {
        match self.errors.get(index)?.swap(NO_ERROR, Ordering::AcqRel) {
            1 => Some(FaultError::PoolExhausted),
            2 => Some(FaultError::MapFailed),
            _ => None,
        }
    }

    /// Readable when some vCPU has a pending error.
    pub fn event(&self) -> &EventFd {
        &self.event
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
        reg.report(1, sys::gettid(), FaultError::PoolExhausted);
        assert_eq!(reg.event().read().expect("event"), 1);
        assert_eq!(reg.take_error(1), Some(FaultError::PoolExhausted));
        assert_eq!(reg.take_error(1), None);
    }
}
