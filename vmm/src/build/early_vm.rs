//! [`EarlyKvmVm`]: the KVM VM of a run made ahead of time, on a thread of its own, while the
//! VMM waits for its configuration or snapshot (or loads the snapshot's file), so that a start or
//! load only fills it (see [`KvmVm`]).

use std::thread::JoinHandle;

use crate::vm::{KvmVm, VmError};

/// A KVM VM being made on a thread of its own.
#[derive(Debug)]
pub(crate) struct EarlyKvmVm(JoinHandle<Result<KvmVm, VmError>>);

impl EarlyKvmVm {
    /// Starts making one; `None` if no thread could be started (the run makes its own then).
    pub fn start() -> Option<Self> {
        std::thread::Builder::new()
            .name("vmm-kvm-vm".into())
            .spawn(KvmVm::new)
            .ok()
            .map(EarlyKvmVm)
    }

    /// The VM, once made; `None` if making it failed (the run makes a new one then).
    pub fn take(self) -> Option<KvmVm> {
        self.0
            .join()
            .ok()?
            .inspect_err(|e| log::warn!("the VM made ahead of time failed ({e})"))
            .ok()
    }
}
