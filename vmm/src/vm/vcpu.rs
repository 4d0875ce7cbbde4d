//! A vCPU and its run loop: one thread per vCPU enters `KVM_RUN`, dispatches port I/O and MMIO
//! exits to the device buses, and leaves on HLT, shutdown, errors or a stop request (a kick,
//! [`super::kick`], gets it out of `KVM_RUN`).

use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

use kvm_ioctls::{VcpuExit, VcpuFd};

use super::kick::{self, ClearKvmRun};
use super::run_control::{Checkpoint, StopReason, VcpuExitReason, VmControl};
use crate::arch::x86_64::state::KvmVcpuState;
use crate::seccomp::ThreadKind;
use vmm_api::metrics::METRICS;
use vmm_devices::Bus;

/// The device buses vCPUs dispatch exits to.
#[derive(Debug, Default)]
pub struct Buses {
    /// Port I/O bus (addresses are ports).
    pub pio: Bus,
    /// MMIO bus (addresses are guest physical addresses).
    pub mmio: Bus,
}

/// A vCPU of a [`crate::vm::Vm`], not yet running.
#[derive(Debug)]
pub struct Vcpu {
    index: usize,
    fd: VcpuFd,
    /// The MSRs its state includes, for snapshots.
    msrs_to_save: std::sync::Arc<[u32]>,
}

impl Vcpu {
    pub(crate) fn new(index: usize, fd: VcpuFd, msrs_to_save: std::sync::Arc<[u32]>) -> Self {
        Vcpu {
            index,
            fd,
            msrs_to_save,
        }
    }

    /// Index of this vCPU (also its KVM vCPU id and APIC id).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The KVM vCPU, to set CPUID, MSRs and registers before the VM starts.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// Prepares the calling thread to run this vCPU: installs the kick handler.
    pub(crate) fn prepare_thread() -> Result<(), vmm_sys_util::errno::Error> {
        kick::install_handler()
    }

    /// The run loop; returns when the vCPU stops. Asks `control` to stop the whole VM when the
    /// guest shut down or the vCPU failed.
    pub(crate) fn run(mut self, buses: &Buses, control: &VmControl) -> VcpuExitReason {
        // Locals drop before parameters: the pointer is cleared before `self.fd` unmaps
        // `kvm_run`, even when unwinding.
        let _clear = ClearKvmRun::set(self.index, self.fd.get_kvm_run());
        log::debug!("vCPU {}: running", self.index);
        let reason = self.run_loop(buses, control);
        log::debug!("vCPU {}: ended: {reason:?}", self.index);
        match &reason {
            VcpuExitReason::Shutdown => {
                log::info!("vCPU {}: shut down, {}", self.index, self.registers());
                control.request_stop(StopReason::GuestShutdown { vcpu: self.index })
            }
            VcpuExitReason::Failed(message) => {
                METRICS.vcpu.failures.inc();
                control.request_stop(StopReason::VcpuFailed {
                    vcpu: self.index,
                    message: message.clone(),
                })
            }
            VcpuExitReason::Stopped | VcpuExitReason::Halted => {}
        }
        reason
    }

    /// Where the vCPU stands, on one line (a triple fault's trace: the instruction, the stack,
    /// the last page fault's address and the paging registers).
    fn registers(&self) -> String {
        match (self.fd.get_regs(), self.fd.get_sregs()) {
            (Ok(regs), Ok(sregs)) => format!(
                "rip {:#x} rsp {:#x} rflags {:#x} cr0 {:#x} cr2 {:#x} cr3 {:#x} cr4 {:#x} efer \
                 {:#x} cs {:#x} idt {:#x}+{:#x}",
                regs.rip,
                regs.rsp,
                regs.rflags,
                sregs.cr0,
                sregs.cr2,
                sregs.cr3,
                sregs.cr4,
                sregs.efer,
                sregs.cs.selector,
                sregs.idt.base,
                sregs.idt.limit
            ),
            (Err(e), _) | (_, Err(e)) => format!("its registers unreadable: {e}"),
        }
    }

    /// Waits at the control's checkpoint while paused, reading the vCPU's state when asked to.
    /// Returns `false` when the vCPU must stop.
    fn checkpoint(&mut self, control: &VmControl) -> bool {
        loop {
            match control.vcpu_checkpoint(self.index) {
                Checkpoint::Run => return true,
                Checkpoint::Stop => return false,
                Checkpoint::Save => control.vcpu_saved(self.index, self.save_state()),
            }
        }
    }

    /// Completes the I/O of the last exit (KVM finishes an emulated instruction, such as a port
    /// read, on the next `KVM_RUN`: one with `immediate_exit` set does only that) and reads the
    /// vCPU's state.
    fn save_state(&mut self) -> Result<KvmVcpuState, String> {
        self.fd.set_kvm_immediate_exit(1);
        let completed = match self.fd.run() {
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Ok(()),
            Err(e) => Err(format!("completing its last I/O: KVM_RUN: {e}")),
            Ok(exit) => Err(format!("completing its last I/O: unexpected exit {exit:?}")),
        };
        self.fd.set_kvm_immediate_exit(0);
        completed?;
        KvmVcpuState::save(&self.fd, &self.msrs_to_save).map_err(|e| e.to_string())
    }

    fn run_loop(&mut self, buses: &Buses, control: &VmControl) -> VcpuExitReason {
        // A vCPU starts paused: past this first checkpoint (or with the VM resumed before the
        // thread got here) the VM has started, after the process's lock-down. The vCPU's own
        // filter goes on now, once, outside the KVM_RUN loop.
        if control.is_pending() && !self.checkpoint(control) {
            return VcpuExitReason::Stopped;
        }
        if let Err(e) = crate::seccomp::enter(ThreadKind::Vcpu) {
            return VcpuExitReason::Failed(format!("vCPU {}: {e}", self.index));
        }
        loop {
            if control.is_pending() && !self.checkpoint(control) {
                return VcpuExitReason::Stopped;
            }
            match self.fd.run() {
                Ok(VcpuExit::InternalError) => {
                    return VcpuExitReason::Failed(self.internal_error_message())
                }
                Ok(exit) => {
                    if let Some(reason) = Self::handle_exit(self.index, exit, buses) {
                        return reason;
                    }
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.set_kvm_immediate_exit(0);
                    // Order the reset before the next look at the pending flag: a kick sent
                    // after this point either sets `immediate_exit` again or is seen there.
                    fence(Ordering::SeqCst);
                }
                Err(e) if e.errno() == libc::EFAULT => {
                    return VcpuExitReason::Failed(format!(
                        "vCPU {}: guest memory access failed (KVM_RUN: {e}); \
                         is guest memory exhausted or unmapped?",
                        self.index
                    ))
                }
                Err(e) => {
                    return VcpuExitReason::Failed(format!("vCPU {}: KVM_RUN: {e}", self.index))
                }
            }
        }
    }

    /// Describes a `KVM_EXIT_INTERNAL_ERROR`: sub-error, its data words (for an emulation
    /// failure: the instruction bytes) and the guest RIP.
    fn internal_error_message(&mut self) -> String {
        // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal` member of the union is the valid one.
        let internal = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal };
        let words = internal.data.len().min(internal.ndata as usize);
        let rip = self.fd.get_regs().map(|r| r.rip).unwrap_or_default();
        let data = &internal.data[..words];
        if internal.suberror == kvm_bindings::KVM_INTERNAL_ERROR_EMULATION {
            return format!(
                "vCPU {}: KVM cannot emulate the instruction at RIP {rip:#x} (data {data:x?}); \
                 the guest cannot go on",
                self.index
            );
        }
        format!(
            "vCPU {}: KVM internal error {} at RIP {rip:#x}, data {data:x?}",
            self.index, internal.suberror
        )
    }

    /// Handles one exit; `Some` ends the run loop.
    fn handle_exit(index: usize, exit: VcpuExit<'_>, buses: &Buses) -> Option<VcpuExitReason> {
        let metrics = &METRICS.vcpu;
        match exit {
            VcpuExit::IoIn(port, data) => {
                let started = Instant::now();
                if let Err(e) = buses.pio.read(u64::from(port), data) {
                    log::trace!("vCPU {index}: port read: {e}");
                    data.fill(0xff);
                }
                metrics.exit_io_in.inc();
                metrics.exit_io_in_agg.record(started.elapsed());
            }
            VcpuExit::IoOut(port, data) => {
                let started = Instant::now();
                if let Err(e) = buses.pio.write(u64::from(port), data) {
                    log::trace!("vCPU {index}: port write: {e}");
                }
                metrics.exit_io_out.inc();
                metrics.exit_io_out_agg.record(started.elapsed());
            }
            VcpuExit::MmioRead(addr, data) => {
                let started = Instant::now();
                if let Err(e) = buses.mmio.read(addr, data) {
                    log::debug!("vCPU {index}: MMIO read: {e}");
                    data.fill(0xff);
                }
                metrics.exit_mmio_read.inc();
                metrics.exit_mmio_read_agg.record(started.elapsed());
            }
            VcpuExit::MmioWrite(addr, data) => {
                let started = Instant::now();
                if let Err(e) = buses.mmio.write(addr, data) {
                    log::debug!("vCPU {index}: MMIO write: {e}");
                }
                metrics.exit_mmio_write.inc();
                metrics.exit_mmio_write_agg.record(started.elapsed());
            }
            VcpuExit::Hlt => return Some(VcpuExitReason::Halted),
            VcpuExit::Shutdown | VcpuExit::SystemEvent(..) => {
                return Some(VcpuExitReason::Shutdown)
            }
            VcpuExit::FailEntry(reason, cpu) => {
                return Some(VcpuExitReason::Failed(format!(
                    "vCPU {index}: entry failed (hardware reason {reason:#x}, host CPU {cpu})"
                )))
            }
            VcpuExit::MemoryFault { gpa, size, .. } => {
                return Some(VcpuExitReason::Failed(format!(
                    "vCPU {index}: guest memory fault at {gpa:#x}+{size:#x}"
                )))
            }
            // Only the MSR filter of `vm::filter_pmu_msrs` sends accesses here: the AMD
            // counters read as 0 and drop writes, as KVM does with them, without a log line each.
            VcpuExit::X86Rdmsr(msr) => *msr.data = 0,
            VcpuExit::X86Wrmsr(_) => {}
            VcpuExit::Intr => {}
            other => {
                return Some(VcpuExitReason::Failed(format!(
                    "vCPU {index}: unexpected exit {other:?}"
                )))
            }
        }
        None
    }
}
