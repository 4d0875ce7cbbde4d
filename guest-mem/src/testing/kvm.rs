//! A minimal KVM VM whose vCPUs run the touch programs.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::program::{Touch, PROGRAMS, RESULT_PORT, STEPPED, STEP_PORT};
use crate::{FaultError, GuestMemory};

/// Where [`TouchVm::new`] loads the programs in guest memory.
pub const CODE: GuestAddress = GuestAddress(0x1000);

/// Errors of setting up a VM.
#[derive(Debug, Error)]
pub enum KvmError {
    /// /dev/kvm cannot be opened or refuses to create a VM: KVM is not usable here.
    #[error("/dev/kvm is not usable: {0}")]
    Unavailable(#[source] kvm_ioctls::Error),
    /// A KVM call failed.
    #[error("{what}: {source}")]
    Call {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The programs could not be written to guest memory.
    #[error("cannot load the guest program: {0}")]
    Load(#[source] vm_memory::GuestMemoryError),
}

/// How a vCPU run ended, if not with the program's result.
#[derive(Debug, PartialEq, Eq)]
pub enum TouchError {
    /// KVM_RUN was interrupted because a fault could not be resolved.
    Fault(FaultError),
    /// Anything else.
    Other(String),
}

fn call(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmError {
    move |source| KvmError::Call { what, source }
}

/// A VM whose vCPUs run the touch programs.
#[derive(Debug)]
pub struct TouchVm {
    fd: VmFd,
    code: u64,
    _kvm: Kvm,
}

impl TouchVm {
    /// A VM with no memory yet, whose programs the caller loads at guest address `code`
    /// (from [`PROGRAMS`]).
    pub fn empty(code: u64) -> Result<Self, KvmError> {
        let kvm = Kvm::new().map_err(KvmError::Unavailable)?;
        let fd = kvm.create_vm().map_err(KvmError::Unavailable)?;
        Ok(Self {
            fd,
            code,
            _kvm: kvm,
        })
    }

    /// A VM whose memory slots are the regions of `memory`, with the programs loaded at
    /// [`CODE`] (through vm-memory, which populates that chunk).
    pub fn new(memory: &GuestMemory) -> Result<Self, KvmError> {
        let vm = Self::empty(CODE.0)?;
        for (slot, region) in memory.iter().enumerate() {
            // SAFETY: the region's host range stays mapped as long as `memory`, which callers
            // keep alive longer than the VM.
            unsafe {
                vm.add_memory(
                    slot as u32,
                    region.start_addr().0,
                    region.host_addr(),
                    region.len(),
                )
            }?;
        }
        memory
            .write_slice(&PROGRAMS, CODE)
            .map_err(KvmError::Load)?;
        Ok(vm)
    }

    /// Adds memory slot `slot`: guest `[guest, guest + len)` is host `[host, host + len)`.
    ///
    /// # Safety
    /// The host range must stay mapped (read/write) as long as the VM exists.
    pub unsafe fn add_memory(
        &self,
        slot: u32,
        guest: u64,
        host: usize,
        len: u64,
    ) -> Result<(), KvmError> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: guest,
            memory_size: len,
            userspace_addr: host as u64,
        };
        // SAFETY: the caller keeps the host range mapped while the VM exists.
        unsafe { self.fd.set_user_memory_region(region) }.map_err(call("memory slot"))
    }

    /// Creates vCPU `index` in 32-bit protected mode with flat segments.
    pub fn create_vcpu(&self, index: usize) -> Result<TouchVcpu, KvmError> {
        let fd = self
            .fd
            .create_vcpu(index as u64)
            .map_err(call("create vCPU"))?;
        let mut sregs = fd.get_sregs().map_err(call("get sregs"))?;
        let code = kvm_segment {
            base: 0,
            limit: 0xffff_ffff,
            selector: 0x8,
            type_: 0xb,
            present: 1,
            db: 1,
            s: 1,
            g: 1,
            ..Default::default()
        };
        let data = kvm_segment {
            selector: 0x10,
            type_: 0x3,
            ..code
        };
        sregs.cs = code;
        (sregs.ds, sregs.es, sregs.ss, sregs.fs, sregs.gs) = (data, data, data, data, data);
        sregs.cr0 |= 1;
        fd.set_sregs(&sregs).map_err(call("set sregs"))?;
        Ok(TouchVcpu {
            fd,
            index,
            code: self.code,
        })
    }

    /// Registers the calling thread as vCPU `index` of `memory` and creates that vCPU.
    pub fn vcpu_of(&self, memory: &GuestMemory, index: usize) -> Result<TouchVcpu, TouchError> {
        memory
            .register_vcpu(index)
            .map_err(|e| TouchError::Other(format!("register: {e}")))?;
        self.create_vcpu(index)
            .map_err(|e| TouchError::Other(e.to_string()))
    }

    /// Registers the calling thread as vCPU `index` of `memory`, creates that vCPU and runs
    /// `touch` on it. Returns the OR of the old values.
    pub fn run(&self, memory: &GuestMemory, index: usize, touch: Touch) -> Result<u32, TouchError> {
        self.vcpu_of(memory, index)?.run(touch, Some(memory))
    }
}

/// A vCPU that runs the touch programs, on the thread that calls its methods.
#[derive(Debug)]
pub struct TouchVcpu {
    fd: VcpuFd,
    index: usize,
    code: u64,
}

impl TouchVcpu {
    /// Runs the plain program over `touch`; returns the OR of the old values. A fault of
    /// `memory` that cannot be resolved ends the run with [`TouchError::Fault`].
    pub fn run(&mut self, touch: Touch, memory: Option<&GuestMemory>) -> Result<u32, TouchError> {
        self.execute(0, touch, memory, &mut || {})
    }

    /// Runs the stepped program over `touch`, calling `each` when the guest has done a touch.
    pub fn run_stepped(
        &mut self,
        touch: Touch,
        memory: Option<&GuestMemory>,
        each: &mut dyn FnMut(),
    ) -> Result<u32, TouchError> {
        self.execute(STEPPED, touch, memory, each)
    }

    fn execute(
        &mut self,
        entry: u64,
        touch: Touch,
        memory: Option<&GuestMemory>,
        each: &mut dyn FnMut(),
    ) -> Result<u32, TouchError> {
        let other =
            |what: &str, e: &dyn std::fmt::Display| TouchError::Other(format!("{what}: {e}"));
        let regs = kvm_regs {
            rip: self.code + entry,
            rflags: 2,
            rsi: touch.start,
            rcx: touch.count.into(),
            rdx: touch.stride.into(),
            rax: touch.marker.into(),
            ..Default::default()
        };
        self.fd.set_regs(&regs).map_err(|e| other("set regs", &e))?;
        let mut result = None;
        loop {
            match self.fd.run() {
                Ok(VcpuExit::IoOut(STEP_PORT, _)) => each(),
                Ok(VcpuExit::IoOut(RESULT_PORT, data)) => {
                    let bytes = data.get(..4).and_then(|b| b.try_into().ok());
                    result = bytes.map(u32::from_le_bytes);
                }
                Ok(VcpuExit::Hlt) => {
                    return result.ok_or_else(|| TouchError::Other("halted early".into()));
                }
                Ok(VcpuExit::Intr) => {}
                Ok(exit) => return Err(TouchError::Other(format!("unexpected exit {exit:?}"))),
                Err(e) if e.errno() == libc::EINTR => {
                    if let Some(error) = memory.and_then(|m| m.take_fault_error(self.index)) {
                        return Err(TouchError::Fault(error));
                    }
                }
                Err(e) => return Err(other("KVM_RUN", &e)),
            }
        }
    }
}
