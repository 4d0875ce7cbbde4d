//! The host side of the built-in test guest (the test-guest crate: a tiny freestanding 64-bit
//! program that runs memory workloads and reports the results, and its protocol): workloads
//! ([`Workload`]), the report device ([`GuestReport`]), and [`run`], which boots it in a fresh VM.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use vm_memory::{GuestAddress, GuestMemoryMmap};
//! use vmm::testguest::{self, Workload};
//! let memory = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)])?);
//! let workload = Workload::new().write(2 << 20, 62 << 20, 0x5a5a).verify(2 << 20, 62 << 20, 0x5a5a);
//! let report = testguest::run(memory, 2, &workload)?;
//! assert!(report.success(), "{report:?}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod image;
pub mod report;
pub mod spec;
pub mod workload;

pub use test_guest::{protocol, IMAGE};

pub use report::{
    exit_code, CheckpointHook, GuestProgress, GuestReport, HintingHook, Mismatch, ReportSnapshot,
    StepReport, VcpuReport,
};
pub use spec::{WorkloadSpec, WorkloadSpecError, DEFAULT_PATTERN, DEFAULT_WORKLOAD};
pub use workload::{Workload, WorkloadError};

use std::io::Cursor;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_ioctls::VmFd;
use linux_loader::loader::{Elf, KernelLoader};
use vm_memory::{Address, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::x86_64::cpu_template::CpuTemplate;
use crate::arch::x86_64::cpuid::threads_per_core;
use crate::arch::x86_64::cpuid::{set_vcpu_cpuid, supported_cpuid, VcpuTopology};
use crate::arch::x86_64::paging::{IdentityMap, PageSize};
use crate::arch::x86_64::regs::{setup_long_mode, EntryPoint};
use crate::arch::x86_64::state::{KvmVcpuState, KvmVmState};
use crate::arch::x86_64::{cpuid_has_1g_pages, write_boot_tables, BootLayout};
use crate::layout::{
    BOOT_GDT_START, BOOT_IDT_START, SERIAL_IRQ, SERIAL_PORT_BASE, SERIAL_PORT_SIZE,
};
use crate::vm::run_control::RunControlError;
use crate::vm::vcpu::Buses;
use crate::vm::{KvmVm, RunningVm, Vm, VmError};
use protocol::{
    DESCRIPTOR_ADDR, IMAGE_START, MAX_VCPUS, PAGE_TABLES_END, PAGE_TABLES_START, REPORT_MMIO_BASE,
    REPORT_MMIO_SIZE, STACKS_START, STACK_SIZE, WORKLOAD_MIN_ADDR,
};
pub use report::ReportDevice;
use vmm_devices::serial::{SerialDevice, SerialOutput, SerialSnapshot, SharedBuffer};

/// Errors of setting up a test guest run (the guest's own outcome is in the [`GuestReport`]).
#[derive(Debug, thiserror::Error)]
pub enum TestGuestError {
    /// The workload is invalid for this memory and vCPU count.
    #[error("invalid workload: {0}")]
    Workload(#[from] WorkloadError),
    /// Guest memory does not start at 0 or is too small for the guest's own structures.
    #[error("the test guest needs guest RAM covering [0, {WORKLOAD_MIN_ADDR:#x})")]
    MemoryTooSmall,
    /// The vCPU count is outside what the test guest supports.
    #[error("the test guest runs on 1 to {MAX_VCPUS} vCPUs, not {0}")]
    BadVcpuCount(usize),
    /// More RAM than the guest's page tables can map.
    #[error(
        "the built-in test guest can use at most {} GiB of RAM on this host (its page tables \
         map RAM with {}), not {}",
        .max >> 30,
        match .page_size {
            PageSize::Size2M => "2 MiB pages: KVM offers no 1 GiB pages here",
            PageSize::Size1G => "1 GiB pages",
        },
        vmm_devices::size::format_size(*.memory)
    )]
    MemoryTooLarge {
        /// The RAM asked for.
        memory: u64,
        /// The most it can map.
        max: u64,
        /// The page size the host allows.
        page_size: PageSize,
    },
    /// The VM could not be created or started.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// Loading the guest image failed.
    #[error("cannot load the test guest image: {0}")]
    Load(linux_loader::loader::Error),
    /// Writing boot tables or setting vCPU registers failed.
    #[error("cannot set up the vCPUs: {0}")]
    Setup(String),
    /// Creating or wiring a device failed.
    #[error("cannot set up the devices: {0}")]
    Devices(String),
}

/// A start hook: sees the started VM (vCPU thread ids, run control) before the guest runs.
pub type StartHook = Box<dyn FnOnce(&RunningVm) + Send>;

/// A devices hook: adds devices to the buses (e.g. virtio-mmio transports) and wires their
/// interrupts and notifications on the VM (irqfds, ioeventfds) before the vCPUs start.
pub type DevicesHook = Box<dyn FnOnce(&VmFd, &mut Buses) -> Result<(), String> + Send>;

/// A progress hook: called about every [`PROGRESS_INTERVAL`] while the guest runs.
pub type ProgressHook = Box<dyn FnMut(&GuestProgress) + Send>;

/// A devices-ready hook: sees the test guest's own devices once they exist (e.g. to save
/// their state for a snapshot later).
pub type DevicesReadyHook = Box<dyn FnOnce(&TestGuestDevices) + Send>;

/// The devices every test guest VM has.
#[derive(Debug, Clone)]
pub struct TestGuestDevices {
    /// The serial port.
    pub serial: Arc<SerialDevice>,
    /// The report device.
    pub report: Arc<ReportDevice>,
}

/// A test guest VM as a snapshot left it: instead of booting, its vCPUs, VM and devices get
/// these states (its memory must be the snapshot's).
#[derive(Debug)]
pub struct TestGuestResumption {
    /// Each vCPU's state.
    pub vcpus: Vec<KvmVcpuState>,
    /// The VM's state.
    pub vm: KvmVmState,
    /// The serial port's.
    pub serial: SerialSnapshot,
    /// The report device's.
    pub report: ReportSnapshot,
}

/// How often [`RunOptions::on_progress`] is called.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// Options of [`run_with`].
pub struct RunOptions {
    /// Longest the guest may run before it is stopped and the report marked timed out;
    /// [`Duration::MAX`] for no limit.
    pub timeout: Duration,
    /// Called once the vCPU threads exist and before the guest runs, e.g. to map fault threads
    /// to vCPUs ([`RunningVm::vcpu_tids`]) or to keep its [`RunningVm::control`].
    pub on_start: Option<StartHook>,
    /// Called at every checkpoint step.
    pub on_checkpoint: Option<CheckpointHook>,
    /// Called when a hint step asks for a free page hinting run.
    pub on_hinting_run: Option<HintingHook>,
    /// Called about every [`PROGRESS_INTERVAL`] with how far the guest is.
    pub on_progress: Option<ProgressHook>,
    /// Where the guest's serial output goes as it is written; `None` collects it in
    /// [`GuestReport::serial_output`] (which stays empty otherwise).
    pub serial_output: Option<SerialOutput>,
    /// Called after the serial port and the report device are on the buses.
    pub add_devices: Option<DevicesHook>,
    /// Called with the serial port and the report device once they exist.
    pub on_devices: Option<DevicesReadyHook>,
    /// Resume a VM from a snapshot instead of booting the guest.
    pub resumption: Option<TestGuestResumption>,
    /// The KVM VM to build on, made ahead of time; a new one otherwise.
    pub kvm_vm: Option<KvmVm>,
    /// The vCPUs are the two threads of each core (SMT), not a core each.
    pub smt: bool,
    /// Changes to every vCPU's CPUID and MSRs (Firecracker's custom CPU template).
    pub cpu_template: Option<CpuTemplate>,
    /// Leave the vCPUs paused after `on_start`: the caller lets them run through the control it
    /// kept (a VMM whose API must be able to pause the guest from its first instruction on).
    pub start_paused: bool,
    /// KVM logs the pages the guest writes (for diff snapshots, [`crate::vm::dirty_pages`]).
    pub log_dirty_pages: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            timeout: Duration::from_secs(60),
            on_start: None,
            on_checkpoint: None,
            on_hinting_run: None,
            on_progress: None,
            serial_output: None,
            add_devices: None,
            on_devices: None,
            resumption: None,
            kvm_vm: None,
            smt: false,
            cpu_template: None,
            start_paused: false,
            log_dirty_pages: false,
        }
    }
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Boots the test guest on `vcpus` vCPUs over `memory`, runs `workload` and reports.
pub fn run<M>(
    memory: Arc<M>,
    vcpus: usize,
    workload: &Workload,
) -> Result<GuestReport, TestGuestError>
where
    M: GuestMemoryBackend + Send + Sync + 'static,
{
    run_with(memory, vcpus, workload, RunOptions::default())
}

/// [`run`] with options: timeout and hooks.
pub fn run_with<M>(
    memory: Arc<M>,
    vcpus: usize,
    workload: &Workload,
    options: RunOptions,
) -> Result<GuestReport, TestGuestError>
where
    M: GuestMemoryBackend + Send + Sync + 'static,
{
    if vcpus == 0 || vcpus > MAX_VCPUS as usize {
        return Err(TestGuestError::BadVcpuCount(vcpus));
    }
    if !memory.check_range(GuestAddress(0), WORKLOAD_MIN_ADDR as usize) {
        return Err(TestGuestError::MemoryTooSmall);
    }
    workload.validate(memory.as_ref(), vcpus)?;
    let kvm_vm = match options.kvm_vm {
        Some(kvm_vm) => kvm_vm,
        None => KvmVm::new()?,
    };
    let mut vm = Vm::with_kvm_vm(kvm_vm, memory.clone(), vcpus, options.log_dirty_pages)?;
    match &options.resumption {
        None => {
            let entry = load_image(memory.as_ref())?;
            workload.write_descriptor(memory.as_ref(), vcpus)?;
            if let Some(template) = &options.cpu_template {
                template
                    .check_capabilities(vm.kvm())
                    .map_err(|e| TestGuestError::Setup(e.to_string()))?;
            }
            setup_vcpus(
                &vm,
                entry,
                threads_per_core(options.smt),
                options.cpu_template.as_ref(),
            )?;
        }
        Some(resumption) => vm
            .restore(&resumption.vcpus, &resumption.vm)
            .map_err(|e| TestGuestError::Setup(e.to_string()))?,
    }

    let serial_output = SharedBuffer::new();
    let serial_irq =
        EventFd::new(EFD_NONBLOCK).map_err(|e| TestGuestError::Devices(e.to_string()))?;
    let serial_writer = options
        .serial_output
        .unwrap_or_else(|| Box::new(serial_output.clone()));
    let serial = Arc::new(
        SerialDevice::new(serial_irq, serial_writer)
            .map_err(|e| TestGuestError::Devices(e.to_string()))?,
    );
    vm.fd()
        .register_irqfd(serial.irq_evt(), SERIAL_IRQ)
        .map_err(|e| TestGuestError::Devices(format!("KVM_IRQFD: {e}")))?;
    let reports = Arc::new(
        ReportDevice::new(vcpus, workload.steps().len(), options.on_checkpoint)
            .with_hinting_hook(options.on_hinting_run),
    );
    if let Some(resumption) = &options.resumption {
        let restore_error = |e: &dyn std::fmt::Display| TestGuestError::Devices(e.to_string());
        serial
            .restore_state(&resumption.serial)
            .map_err(|e| restore_error(&e))?;
        reports
            .restore_state(&resumption.report)
            .map_err(|e| restore_error(&e))?;
    }
    if let Some(on_devices) = options.on_devices {
        on_devices(&TestGuestDevices {
            serial: serial.clone(),
            report: reports.clone(),
        });
    }
    let mut buses = Buses::default();
    let devices_err = |e: vmm_devices::BusError| TestGuestError::Devices(e.to_string());
    buses
        .pio
        .insert(serial, SERIAL_PORT_BASE, SERIAL_PORT_SIZE)
        .map_err(devices_err)?;
    buses
        .mmio
        .insert(reports.clone(), REPORT_MMIO_BASE, REPORT_MMIO_SIZE)
        .map_err(devices_err)?;
    if let Some(add_devices) = options.add_devices {
        add_devices(vm.fd(), &mut buses).map_err(TestGuestError::Devices)?;
    }

    let running = vm.start(Arc::new(buses))?;
    reports.set_control(running.control().clone());
    if let Some(on_start) = options.on_start {
        on_start(&running);
    }
    let started = Instant::now();
    if !options.start_paused {
        match running.resume() {
            // Stopped by its owner (e.g. from the start hook) before it ran: the report says so.
            Ok(()) | Err(RunControlError::Stopped) => {}
            Err(e) => return Err(TestGuestError::Setup(e.to_string())),
        }
    }
    // A timeout too long to be a deadline is no limit.
    let deadline = started.checked_add(options.timeout);
    if let Some(mut on_progress) = options.on_progress {
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let slice = left.map_or(PROGRESS_INTERVAL, |left| left.min(PROGRESS_INTERVAL));
            if running.control().wait_for_exit(Some(slice)) || left.is_some_and(|l| l <= slice) {
                break;
            }
            on_progress(&reports.progress());
        }
    }
    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let (stop_reason, timed_out) = running.wait_timeout(left);
    let elapsed = started.elapsed();
    let (vcpu_reports, protocol_errors) = reports.reports();
    Ok(GuestReport {
        stop_reason,
        timed_out,
        vcpus: vcpu_reports,
        protocol_errors,
        serial_output: String::from_utf8_lossy(&serial_output.contents()).into_owned(),
        elapsed,
    })
}

/// The leaf page size of the guest's page tables: 1 GiB where the CPUID KVM offers has them.
fn page_size(cpuid: &kvm_bindings::CpuId) -> PageSize {
    if cpuid_has_1g_pages(cpuid) {
        PageSize::Size1G
    } else {
        PageSize::Size2M
    }
}

/// Whether the guest's page tables, with `page_size` leaves, can map `memory_size` bytes of RAM
/// laid out around the MMIO gap.
fn tables_fit(memory_size: u64, page_size: PageSize) -> bool {
    let ram_end = crate::layout::ram_regions(memory_size)
        .last()
        .map_or(0, |region| region.end());
    IdentityMap::new(
        GuestAddress(PAGE_TABLES_START),
        ram_end,
        page_size,
        PAGE_TABLES_END - PAGE_TABLES_START,
    )
    .is_ok()
}

/// Checks that the test guest can use `memory_size` bytes of RAM on this host, before anything
/// is allocated: its page tables must map all of RAM, and without 1 GiB pages they cannot map
/// much more than 100 GiB.
pub fn check_memory_size(memory_size: u64) -> Result<(), TestGuestError> {
    let kvm = kvm_ioctls::Kvm::new().map_err(|e| TestGuestError::Vm(VmError::KvmUnavailable(e)))?;
    let cpuid = supported_cpuid(&kvm).map_err(|e| TestGuestError::Setup(e.to_string()))?;
    let page_size = page_size(&cpuid);
    if tables_fit(memory_size, page_size) {
        return Ok(());
    }
    let max = (1..=crate::layout::MAX_MEMORY >> 30)
        .rev()
        .map(|gib| gib << 30)
        .find(|&size| tables_fit(size, page_size))
        .unwrap_or(0);
    Err(TestGuestError::MemoryTooLarge {
        memory: memory_size,
        max,
        page_size,
    })
}

/// Loads the guest image and returns its entry point.
fn load_image<M: GuestMemoryBackend>(memory: &M) -> Result<GuestAddress, TestGuestError> {
    let loaded = Elf::load(
        memory,
        None,
        &mut Cursor::new(IMAGE),
        Some(GuestAddress(IMAGE_START)),
    )
    .map_err(TestGuestError::Load)?;
    Ok(loaded.kernel_load)
}

/// Writes GDT and page tables and puts every vCPU at `entry` in 64-bit mode.
fn setup_vcpus<M>(
    vm: &Vm<M>,
    entry: GuestAddress,
    threads_per_core: u32,
    template: Option<&CpuTemplate>,
) -> Result<(), TestGuestError>
where
    M: GuestMemoryBackend + Send + Sync + 'static,
{
    let setup_err = |e: &dyn std::fmt::Display| TestGuestError::Setup(e.to_string());
    let cpuid = supported_cpuid(vm.kvm()).map_err(|e| setup_err(&e))?;
    let layout = BootLayout {
        gdt: GuestAddress(BOOT_GDT_START),
        idt: GuestAddress(BOOT_IDT_START),
        page_tables: GuestAddress(PAGE_TABLES_START),
        page_tables_max_size: PAGE_TABLES_END - PAGE_TABLES_START,
        page_size: page_size(&cpuid),
    };
    let ram_end = vm.memory().last_addr().unchecked_add(1).raw_value();
    let tables =
        write_boot_tables(vm.memory().as_ref(), &layout, ram_end).map_err(|e| setup_err(&e))?;
    for vcpu in vm.vcpus() {
        let topology = VcpuTopology {
            vcpu_id: vcpu.index() as u32,
            vcpu_count: vm.vcpus().len() as u32,
            threads_per_core,
        };
        set_vcpu_cpuid(vcpu.fd(), &cpuid, topology, template).map_err(|e| setup_err(&e))?;
        if let Some(template) = template {
            template.apply_msrs(vcpu.fd()).map_err(|e| setup_err(&e))?;
        }
        let index = vcpu.index() as u64;
        let entry = EntryPoint {
            rip: entry.raw_value(),
            rsp: STACKS_START + (index + 1) * STACK_SIZE,
            rdi: index,
            rsi: DESCRIPTOR_ADDR,
        };
        setup_long_mode(vcpu.fd(), &tables, &entry).map_err(|e| setup_err(&e))?;
        // With the in-kernel LAPIC, vCPUs other than 0 wait for INIT/SIPI; the test guest
        // starts them all at once.
        let runnable = kvm_bindings::kvm_mp_state {
            mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
        };
        vcpu.fd()
            .set_mp_state(runnable)
            .map_err(|e| setup_err(&e))?;
    }
    Ok(())
}
