//! A KVM virtual machine: guest memory registered as memslots, an in-kernel irqchip and PIT, and
//! N vCPUs that run on their own threads once started.
//!
//! ```text
//! Vm::new(memory, vcpus)  -> configure vCPUs through Vm::vcpus() (CPUID, registers)
//! Vm::start(buses)        -> RunningVm, all vCPUs parked; read vcpu_tids() here
//! RunningVm::resume()     -> the guest runs; pause()/resume()/request_stop() via control()
//! RunningVm::wait()       -> joins the vCPU threads, returns the StopReason
//! ```
//!
//! The vCPUs start paused so that a lazy guest-memory backend can map each vCPU thread id to its
//! vCPU (and its allocator core) before the guest touches memory.

pub mod kick;
pub mod run_control;
#[cfg(test)]
mod tests;
pub mod vcpu;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kvm_bindings::{
    kvm_enable_cap, kvm_pit_config, kvm_userspace_memory_region, KVM_CAP_PMU_CAPABILITY,
    KVM_CAP_X86_USER_SPACE_MSR, KVM_MEM_LOG_DIRTY_PAGES, KVM_MSR_EXIT_REASON_FILTER,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use crate::arch::x86_64::state::{KvmVcpuState, KvmVmState};
use run_control::VcpuExitReason;
use run_control::{StopReason, VmControl};
use vcpu::{Buses, Vcpu};

/// Errors of VM creation and start.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// /dev/kvm could not be opened.
    #[error("cannot open /dev/kvm (is KVM available and accessible?): {0}")]
    KvmUnavailable(kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("{what} failed: {source}")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// The vCPU count is 0 or above what KVM supports.
    #[error("invalid vCPU count {requested}: must be between 1 and {max}")]
    InvalidVcpuCount {
        /// Requested vCPUs.
        requested: usize,
        /// KVM's (and our APIC id) limit.
        max: usize,
    },
    /// A guest memory region has no host mapping or is not page aligned.
    #[error("guest memory region at {guest_addr:#x} cannot be a KVM memslot: {reason}")]
    BadRegion {
        /// Guest physical start of the region.
        guest_addr: u64,
        /// Why.
        reason: &'static str,
    },
    /// More memory regions than KVM has memslots.
    #[error("{regions} guest memory regions, but KVM only has {max} memslots")]
    TooManyRegions {
        /// Regions of the guest memory.
        regions: usize,
        /// KVM's limit.
        max: usize,
    },
    /// A snapshot's state could not be given to the VM.
    #[error("cannot restore the VM's state: {0}")]
    Restore(String),
    /// A vCPU thread could not be started.
    #[error("cannot start vCPU thread {index}: {reason}")]
    VcpuThread {
        /// vCPU index.
        index: usize,
        /// What failed.
        reason: String,
    },
}

/// Guest physical address of the 3-page region KVM needs for the TSS on Intel (as Firecracker).
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// Highest vCPU count: xAPIC ids are 8 bits and 0xff is the broadcast id.
pub const MAX_VCPUS: usize = 254;
const HOST_PAGE_SIZE: u64 = 4096;

/// A KVM VM without memory, irqchip or vCPUs yet: what [`Vm::new`] starts from, made ahead of
/// time where that helps (on a thread while `vmm run` builds guest memory, or while a VMM waits
/// for its configuration or a snapshot).
///
/// On this host's KVM (PVM) the first memory slot set after the in-kernel irqchip was made
/// waits about 7.5 ms (a grace period the irqchip started: 0.03 ms of CPU; set 8 ms later, or
/// before the irqchip, it takes tens of microseconds), so [`Vm::with_kvm_vm`] sets the slots
/// first and makes the irqchip and PIT after them, before the vCPUs.
pub struct KvmVm {
    kvm: Kvm,
    fd: VmFd,
}

impl std::fmt::Debug for KvmVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvmVm").finish_non_exhaustive()
    }
}

impl KvmVm {
    /// Creates the VM and its TSS.
    pub fn new() -> Result<Self, VmError> {
        let kvm = Kvm::new().map_err(VmError::KvmUnavailable)?;
        let fd = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
        fd.set_tss_address(KVM_TSS_ADDRESS)
            .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
        Ok(KvmVm { kvm, fd })
    }
}

/// Makes the in-kernel irqchip (PIC, IOAPIC, LAPICs) and PIT of `fd`, which has no vCPU yet.
fn create_irqchip_and_pit(fd: &VmFd) -> Result<(), VmError> {
    fd.create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    fd.create_pit2(pit).map_err(kvm_err("KVM_CREATE_PIT2"))
}

/// A VM whose vCPUs have not started yet.
pub struct Vm<M> {
    // Field order is drop order: the VM and vCPU fds go before the memory they map.
    vcpus: Vec<Vcpu>,
    fd: Arc<VmFd>,
    kvm: Kvm,
    memory: Arc<M>,
}

impl<M> std::fmt::Debug for Vm<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("vcpus", &self.vcpus.len())
            .finish()
    }
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// The AMD (K7) performance counter MSRs: event selects 0xc0010000-3, counters 0xc0010004-7.
const K7_PMU_MSRS: (u32, u32) = (0xc001_0000, 8);

/// Whether the AMD counter MSRs are to be filtered (see [`filter_pmu_msrs`]): where KVM has
/// no virtual PMU (a host without performance counters, e.g. a nested one) and has MSR filters.
fn needs_pmu_filter(kvm: &Kvm) -> bool {
    // KVM answers 0 for the PMU capability where it has no virtual PMU (or, before Linux 5.18,
    // does not know the capability: such a guest loses the AMD legacy counters).
    kvm.check_extension_raw(KVM_CAP_PMU_CAPABILITY.into()) == 0
        && kvm.check_extension(Cap::X86UserSpaceMsr)
        && kvm.check_extension(Cap::X86MsrFilter)
}

/// Has KVM hand accesses to the AMD counter MSRs to the vCPU loop, which reads them as 0 and
/// drops writes quietly: KVM does the same but logs every write in the host's kernel log
/// (Linux's PMU check writes 0xc0010007 at every boot of an AMD guest).
fn filter_pmu_msrs(fd: &VmFd) -> Result<(), VmError> {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_X86_USER_SPACE_MSR,
        ..Default::default()
    };
    cap.args[0] = u64::from(KVM_MSR_EXIT_REASON_FILTER);
    fd.enable_cap(&cap)
        .map_err(kvm_err("KVM_ENABLE_CAP(X86_USER_SPACE_MSR)"))?;
    // One bit per MSR, 0: denied, that is, handed to the vCPU loop.
    let denied = [0u8; 1];
    let range = MsrFilterRange {
        flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
        base: K7_PMU_MSRS.0,
        msr_count: K7_PMU_MSRS.1,
        bitmap: &denied,
    };
    fd.set_msr_filter(MsrFilterDefaultAction::ALLOW, &[range])
        .map_err(kvm_err("KVM_X86_SET_MSR_FILTER"))
}

impl<M: GuestMemoryBackend + Send + Sync + 'static> Vm<M> {
    /// Creates a VM over `memory` (one memslot per region) with `vcpu_count` vCPUs, an in-kernel
    /// irqchip (PIC, IOAPIC, LAPICs) and PIT.
    pub fn new(memory: Arc<M>, vcpu_count: usize) -> Result<Self, VmError> {
        Self::with_kvm_vm(KvmVm::new()?, memory, vcpu_count, false)
    }

    /// [`Self::new`] on a KVM VM made earlier (see [`KvmVm`]); with `log_dirty_pages`, KVM
    /// logs the pages the guest writes in every memslot ([`dirty_pages`]).
    pub fn with_kvm_vm(
        vm: KvmVm,
        memory: Arc<M>,
        vcpu_count: usize,
        log_dirty_pages: bool,
    ) -> Result<Self, VmError> {
        let KvmVm { kvm, fd } = vm;
        let max = kvm.get_max_vcpus().min(MAX_VCPUS);
        if vcpu_count == 0 || vcpu_count > max {
            return Err(VmError::InvalidVcpuCount {
                requested: vcpu_count,
                max,
            });
        }
        // First, while the VM has no memory slot: then KVM installs the filter at once (after the
        // slots, it waits for a grace period of theirs: about 15 ms on this host).
        if needs_pmu_filter(&kvm) {
            filter_pmu_msrs(&fd)?;
        }
        register_memslots(&kvm, &fd, memory.as_ref(), log_dirty_pages)?;
        // After the slots: made before them, the irqchip would have the first slot wait for a
        // grace period (see [`KvmVm`]).
        create_irqchip_and_pit(&fd)?;
        let msrs_to_save: Arc<[u32]> = kvm
            .get_msr_index_list()
            .map_err(kvm_err("KVM_GET_MSR_INDEX_LIST"))?
            .as_slice()
            .into();
        let vcpus = (0..vcpu_count)
            .map(|index| {
                let vcpu_fd = fd
                    .create_vcpu(index as u64)
                    .map_err(kvm_err("KVM_CREATE_VCPU"))?;
                Ok(Vcpu::new(index, vcpu_fd, msrs_to_save.clone()))
            })
            .collect::<Result<Vec<_>, VmError>>()?;
        Ok(Vm {
            vcpus,
            fd: Arc::new(fd),
            kvm,
            memory,
        })
    }

    /// The KVM system handle (supported CPUID, MSR lists).
    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    /// The KVM VM (irq lines, irqfds, ioeventfds).
    pub fn fd(&self) -> &Arc<VmFd> {
        &self.fd
    }

    /// The guest memory.
    pub fn memory(&self) -> &Arc<M> {
        &self.memory
    }

    /// The vCPUs, to configure before [`Self::start`].
    pub fn vcpus(&self) -> &[Vcpu] {
        &self.vcpus
    }

    /// Gives the VM and its vCPUs the states a snapshot saved, instead of setting them up for
    /// a boot.
    pub fn restore(&mut self, vcpus: &[KvmVcpuState], vm: &KvmVmState) -> Result<(), VmError> {
        if vcpus.len() != self.vcpus.len() {
            return Err(VmError::Restore(format!(
                "{} vCPU states for {} vCPUs",
                vcpus.len(),
                self.vcpus.len()
            )));
        }
        vm.restore(&self.fd)
            .map_err(|e| VmError::Restore(e.to_string()))?;
        for (vcpu, state) in self.vcpus.iter().zip(vcpus) {
            state
                .restore(vcpu.fd())
                .map_err(|e| VmError::Restore(format!("vCPU {}: {e}", vcpu.index())))?;
        }
        Ok(())
    }

    /// Starts one thread per vCPU. The vCPUs wait, paused, until [`RunningVm::resume`]; their
    /// thread ids are known when this returns.
    pub fn start(self, buses: Arc<Buses>) -> Result<RunningVm, VmError> {
        let count = self.vcpus.len();
        let control = Arc::new(VmControl::new(count));
        let (tid_sender, tid_receiver) = std::sync::mpsc::channel();
        let mut threads = Vec::with_capacity(count);
        for vcpu in self.vcpus {
            let index = vcpu.index();
            let (buses, memory) = (buses.clone(), self.memory.clone());
            let thread_control = control.clone();
            let tid_sender = tid_sender.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || {
                    let mut exit = ExitGuard {
                        control: &thread_control,
                        index,
                        reason: VcpuExitReason::Failed(format!("vCPU {index} thread panicked")),
                    };
                    let ready = Vcpu::prepare_thread().map_err(|e| e.to_string());
                    let failed = ready.is_err();
                    // The receiver lives until every thread has reported; dropping the sender
                    // lets it see the end of the reports.
                    let _ = tid_sender.send((index, guest_mem::gettid(), ready));
                    drop(tid_sender);
                    exit.reason = if failed {
                        VcpuExitReason::Failed(format!("vCPU {index}: no kick signal handler"))
                    } else {
                        vcpu.run(&buses, exit.control)
                    };
                    let reason = exit.reason.clone();
                    drop(exit);
                    // The memory outlives the vCPU fd, which `run` consumed.
                    drop(memory);
                    reason
                });
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    let running = RunningVm::new(control, threads, Vec::new(), self.fd);
                    running.control.request_stop(StopReason::Requested);
                    drop(running);
                    return Err(VmError::VcpuThread {
                        index,
                        reason: e.to_string(),
                    });
                }
            }
        }
        drop(tid_sender);
        let mut tids = vec![0; count];
        let mut failure = None;
        for (index, tid, ready) in tid_receiver.iter() {
            tids[index] = tid;
            if let Err(reason) = ready {
                failure.get_or_insert(VmError::VcpuThread { index, reason });
            }
        }
        let running = RunningVm::new(control, threads, tids, self.fd);
        if let Some(error) = failure {
            running.control.request_stop(StopReason::Requested);
            return Err(error);
        }
        Ok(running)
    }
}

/// Reports a vCPU thread's end to the run control, also when the thread panics.
struct ExitGuard<'a> {
    control: &'a VmControl,
    index: usize,
    reason: VcpuExitReason,
}

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        self.control.vcpu_exited(self.index, self.reason.clone());
    }
}

/// The pages the guest wrote in each region of `memory` since the last call (KVM's dirty log
/// of its memslot, which the call clears): a bitmap per region, a bit per 4 KiB page from the
/// region's start, 64 to a word. The VM's memslots log dirty pages ([`Vm::with_kvm_vm`]).
pub fn dirty_pages<M: GuestMemoryBackend>(fd: &VmFd, memory: &M) -> Result<Vec<Vec<u64>>, VmError> {
    memory
        .iter()
        .enumerate()
        .map(|(slot, region)| {
            fd.get_dirty_log(slot as u32, region.len() as usize)
                .map_err(kvm_err("KVM_GET_DIRTY_LOG"))
        })
        .collect()
}

/// Registers every region of `memory` as a memslot (slot `n` for region `n`), logging the
/// guest's writes with `log_dirty_pages`.
fn register_memslots<M: GuestMemoryBackend>(
    kvm: &Kvm,
    fd: &VmFd,
    memory: &M,
    log_dirty_pages: bool,
) -> Result<(), VmError> {
    let max = kvm.get_nr_memslots();
    if memory.num_regions() > max {
        return Err(VmError::TooManyRegions {
            regions: memory.num_regions(),
            max,
        });
    }
    for (slot, region) in memory.iter().enumerate() {
        let guest_addr = region.start_addr().0;
        let bad = |reason| VmError::BadRegion { guest_addr, reason };
        let host = region
            .get_host_address(MemoryRegionAddress(0))
            .map_err(|_| bad("it has no host mapping"))? as u64;
        if !guest_addr.is_multiple_of(HOST_PAGE_SIZE)
            || !host.is_multiple_of(HOST_PAGE_SIZE)
            || !region.len().is_multiple_of(HOST_PAGE_SIZE)
        {
            return Err(bad("start, host address and size must be 4 KiB aligned"));
        }
        let slot_region = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: if log_dirty_pages {
                KVM_MEM_LOG_DIRTY_PAGES
            } else {
                0
            },
            guest_phys_addr: guest_addr,
            memory_size: region.len(),
            userspace_addr: host,
        };
        // SAFETY: the region is a host mapping of `region.len()` bytes owned by `memory`, which
        // the Vm (and every vCPU thread) keeps alive longer than the VM fd that uses it.
        unsafe { fd.set_user_memory_region(slot_region) }
            .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// A VM whose vCPU threads have started. Dropping it stops and joins them.
pub struct RunningVm {
    control: Arc<VmControl>,
    threads: Vec<JoinHandle<VcpuExitReason>>,
    tids: Vec<u32>,
    fd: Arc<VmFd>,
}

impl std::fmt::Debug for RunningVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningVm")
            .field("tids", &self.tids)
            .field("control", &self.control)
            .finish()
    }
}

impl RunningVm {
    fn new(
        control: Arc<VmControl>,
        threads: Vec<JoinHandle<VcpuExitReason>>,
        tids: Vec<u32>,
        fd: Arc<VmFd>,
    ) -> Self {
        use std::os::unix::thread::JoinHandleExt;
        control.set_threads(threads.iter().map(|t| t.as_pthread_t()).collect());
        RunningVm {
            control,
            threads,
            tids,
            fd,
        }
    }

    /// Kernel thread id of each vCPU thread, by vCPU index.
    pub fn vcpu_tids(&self) -> &[u32] {
        &self.tids
    }

    /// The vCPU index of a thread id, if it is one of this VM's vCPU threads.
    pub fn vcpu_of_tid(&self, tid: u32) -> Option<usize> {
        self.tids.iter().position(|t| *t == tid)
    }

    /// Run control, shareable with devices and the API.
    pub fn control(&self) -> &Arc<VmControl> {
        &self.control
    }

    /// The KVM VM.
    pub fn fd(&self) -> &Arc<VmFd> {
        &self.fd
    }

    /// Lets the vCPUs run (they start paused).
    pub fn resume(&self) -> Result<(), run_control::RunControlError> {
        self.control.resume()
    }

    /// Waits until all vCPUs have ended, for at most `timeout`; on timeout, stops them with
    /// [`StopReason::Requested`]. Returns why the VM stopped and whether it timed out.
    pub fn wait_timeout(mut self, timeout: Option<Duration>) -> (StopReason, bool) {
        let finished = self.control.wait_for_exit(timeout);
        if !finished {
            self.control.request_stop(StopReason::Requested);
        }
        self.join();
        let reason = self.control.stop_reason().unwrap_or(StopReason::Requested);
        (reason, !finished)
    }

    /// Waits until all vCPUs have ended and returns why the VM stopped.
    pub fn wait(self) -> StopReason {
        self.wait_timeout(None).0
    }

    fn join(&mut self) {
        for thread in self.threads.drain(..) {
            // A panicking vCPU thread has already been recorded as ended or will be stopped.
            let _ = thread.join();
        }
    }
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.control.request_stop(StopReason::Requested);
            self.join();
        }
    }
}
