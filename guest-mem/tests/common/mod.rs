//! A minimal KVM harness for guest-mem's end-to-end tests: real vCPUs running a few
//! hand-assembled bytes of 32-bit protected-mode code (flat segments, no paging) that touch guest
//! memory.
#![allow(dead_code)]

pub mod hugepages;

use std::sync::Once;

use guest_mem::{FaultError, GuestMemory};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuExit, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

/// Where the touch program lives in guest memory.
pub const CODE: GuestAddress = GuestAddress(0x1000);
/// The port the program writes its result to.
const RESULT_PORT: u16 = 0x10;

/// The touch program. In: esi = first address, ecx = count, edx = stride, eax = marker.
/// For each address: ebx |= [esi]; [esi] = eax. Then out 0x10, ebx; hlt.
const TOUCH: [u8; 16] = [
    0x0B, 0x1E, // or ebx, [esi]
    0x89, 0x06, // mov [esi], eax
    0x01, 0xD6, // add esi, edx
    0x49, // dec ecx
    0x75, 0xF7, // jnz -9
    0x89, 0xD8, // mov eax, ebx
    0xE7, 0x10, // out 0x10, eax
    0xF4, // hlt
    0xF4, 0xF4,
];

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// One pass of the touch program.
#[derive(Debug, Clone, Copy)]
pub struct Touch {
    /// Guest address of the first dword.
    pub start: u64,
    /// How many dwords.
    pub count: u32,
    /// Bytes between them.
    pub stride: u32,
    /// The value written.
    pub marker: u32,
}

/// Touches `count` dwords `stride` bytes apart, the first at `start + 8`.
pub fn touch(start: u64, stride: u64, count: u32, marker: u32) -> Touch {
    Touch {
        start: start + 8,
        count,
        stride: stride as u32,
        marker,
    }
}

/// How a vCPU run ended, if not with the program's result.
#[derive(Debug, PartialEq, Eq)]
pub enum RunError {
    /// KVM_RUN was interrupted because a fault could not be resolved.
    Fault(FaultError),
    /// Anything else.
    Other(String),
}

/// A VM whose memslots are the regions of a guest memory.
pub struct Vm {
    pub fd: VmFd,
    _kvm: Kvm,
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// The signal guest-mem sends to a vCPU whose fault cannot be resolved (handler installed).
pub fn kick_signal() -> i32 {
    static INSTALL: Once = Once::new();
    let signal = vmm_sys_util::signal::SIGRTMIN();
    INSTALL.call_once(|| {
        vmm_sys_util::signal::register_signal_handler(signal, on_kick).expect("signal handler")
    });
    signal
}

impl Vm {
    /// A VM over `memory`, with the touch program loaded (through vm-memory). `None` (after a
    /// SKIP line) when KVM is not usable here.
    pub fn new(memory: &GuestMemory) -> Option<Self> {
        let kvm = match Kvm::new() {
            Ok(kvm) => kvm,
            Err(e) => {
                eprintln!("SKIP: /dev/kvm is not usable: {e}");
                return None;
            }
        };
        let fd = kvm.create_vm().expect("create VM");
        for (slot, region) in memory.iter().enumerate() {
            let mem = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.host_addr() as u64,
            };
            // SAFETY: the region's host range stays mapped as long as `memory`, which the tests
            // keep alive longer than the VM.
            unsafe { fd.set_user_memory_region(mem) }.expect("memslot");
        }
        memory.write_slice(&TOUCH, CODE).expect("load program");
        Some(Self { fd, _kvm: kvm })
    }

    /// Runs the touch program on a new vCPU `index`, on the calling thread (registered with
    /// `memory` as that vCPU). Returns the OR of the old values.
    pub fn run(&self, memory: &GuestMemory, index: usize, touch: Touch) -> Result<u32, RunError> {
        let other = |what: &str, e: &dyn std::fmt::Display| RunError::Other(format!("{what}: {e}"));
        memory
            .register_vcpu(index)
            .map_err(|e| other("register", &e))?;
        let mut vcpu = self
            .fd
            .create_vcpu(index as u64)
            .map_err(|e| other("create vCPU", &e))?;
        let mut sregs = vcpu.get_sregs().map_err(|e| other("get sregs", &e))?;
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
        vcpu.set_sregs(&sregs).map_err(|e| other("set sregs", &e))?;
        let regs = kvm_regs {
            rip: CODE.0,
            rflags: 2,
            rsi: touch.start,
            rcx: touch.count.into(),
            rdx: touch.stride.into(),
            rax: touch.marker.into(),
            ..Default::default()
        };
        vcpu.set_regs(&regs).map_err(|e| other("set regs", &e))?;
        let mut result = None;
        loop {
            match vcpu.run() {
                Ok(VcpuExit::IoOut(RESULT_PORT, data)) => {
                    result = Some(u32::from_le_bytes(data[..4].try_into().expect("4 bytes")));
                }
                Ok(VcpuExit::Hlt) => {
                    return result.ok_or_else(|| RunError::Other("halted early".into()));
                }
                Ok(VcpuExit::Intr) => {}
                Ok(exit) => return Err(RunError::Other(format!("unexpected exit {exit:?}"))),
                Err(e) if e.errno() == libc::EINTR => {
                    if let Some(error) = memory.take_fault_error(index) {
                        return Err(RunError::Fault(error));
                    }
                }
                Err(e) => return Err(other("KVM_RUN", &e)),
            }
        }
    }
}
