//! Booting a Linux kernel: load kernel, initrd and command line (with the virtio-mmio devices),
//! set up the vCPUs for the 64-bit boot protocol as Firecracker does, wire the console and the
//! devices, and run until the guest resets or powers off.
//!
//! vCPU 0 enters the kernel in long mode (RIP = entry, RSI = zero page); the others wait for
//! INIT/SIPI in their in-kernel LAPICs, as on real hardware.
//!
//! Every Linux guest has a VM generation id, described in its ACPI tables: a new id before it
//! boots and on every load of a snapshot, the loaded guest notified of it once it runs again.

use std::sync::Arc;

use guest_mem::GuestMemory;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::console::Console;
use super::restore::ResumedStates;
use super::session::Session;
use super::{DeviceError, ResetCause, RunError, RunOutcome, StopCause};
use crate::arch::x86_64::acpi::{write_acpi_tables, AcpiDevices};
use crate::arch::x86_64::cpu_template::CpuTemplate;
use crate::arch::x86_64::cpuid::threads_per_core;
use crate::arch::x86_64::cpuid::{set_vcpu_cpuid, supported_cpuid, VcpuTopology};
use crate::arch::x86_64::lapic::setup_lint_pins;
use crate::arch::x86_64::mptable::write_mptable;
use crate::arch::x86_64::msr::setup_boot_msrs;
use crate::arch::x86_64::regs::{setup_long_mode, setup_pvh, EntryPoint};
use crate::arch::x86_64::{
    host_has_hardware_virtualization, write_boot_tables, write_pvh_tables, BootLayout,
    MIN_IDENTITY_MAPPED,
};
use crate::boot::{add_kernel_arg, load_linux, BootEntry, LinuxBoot, LinuxBootConfig};
use crate::build::devices::VirtioMmioDevices;
use crate::config::LinuxConfig;
use crate::layout::{
    BOOT_STACK_POINTER, SERIAL_IRQ, SERIAL_PORT_BASE, SERIAL_PORT_SIZE, VMGENID_GSI, VMGENID_START,
};
use crate::vm::run_control::StopReason;
use crate::vm::vcpu::Buses;
use crate::vm::{KvmVm, Vm};
use vmm_devices::i8042::{I8042Device, I8042_IRQ, I8042_PORT_BASE, I8042_PORT_SIZE};
use vmm_devices::vmgenid::VmGenId;
use vmm_devices::BusDevice;

/// Boots `linux` over the session's memory (or, with no kernel, resumes the guest of a
/// snapshot from its `resumed` states) in `kvm_vm` (or a new KVM VM) and runs it to its end.
pub(super) fn run(
    session: &Arc<Session>,
    linux: Option<&LinuxConfig>,
    devices: VirtioMmioDevices,
    console: Console,
    resumed: Option<ResumedStates>,
    kvm_vm: Option<KvmVm>,
) -> Result<RunOutcome, RunError> {
    let memory = session.memory().clone();
    let kvm_vm = match kvm_vm {
        Some(kvm_vm) => kvm_vm,
        None => KvmVm::new()?,
    };
    let mut vm = Vm::with_kvm_vm(
        kvm_vm,
        memory.clone(),
        session.config().vcpus,
        memory.tracks_dirty_pages(),
    )?;
    // A loaded guest's id goes where its snapshot's tables say (the snapshot's check makes a
    // Linux guest's snapshot name it); a booting one's where the layout puts it.
    let vmgenid = match &resumed {
        Some(resumed) => {
            let saved = resumed.vmgenid.as_ref().ok_or_else(|| {
                DeviceError::Restore("the snapshot has no VM generation id".into())
            })?;
            VmGenId::restore(saved)
        }
        None => VmGenId::new(VMGENID_START, VMGENID_GSI),
    }
    .map_err(DeviceError::from)?;
    match (linux, &resumed) {
        (_, Some(resumed)) => vm.restore(&resumed.vcpus, &resumed.vm)?,
        (Some(linux), None) => boot(session, &vm, linux, &devices, &vmgenid)?,
        (None, None) => {
            return Err(RunError::VcpuSetup(
                "a Linux guest needs a kernel or a snapshot".into(),
            ))
        }
    }
    if !host_has_hardware_virtualization() {
        log::warn!(
            "this host's CPU has no hardware virtualization (no vmx or svm flag in /proc/cpuinfo: \
             KVM is a software one, such as PVM): a stock Linux kernel does not boot here and \
             may spin without output (Ctrl-C stops it; see docs/linux-guests.md)"
        );
    }

    let mut buses = Buses::default();
    let serial = console.serial();
    let keyboard = Arc::new(I8042Device::new(
        EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?,
    ));
    if let Some(resumed) = &resumed {
        serial
            .restore_state(&resumed.serial)
            .map_err(DeviceError::Serial)?;
        let saved = resumed
            .keyboard
            .as_ref()
            .ok_or_else(|| DeviceError::Restore("the snapshot has no state of the i8042".into()))?;
        keyboard
            .restore_state(saved)
            .map_err(|e| DeviceError::Restore(e.to_string()))?;
    }
    session.attach_serial(serial.clone());
    let serial_ports = (SERIAL_PORT_BASE, SERIAL_PORT_SIZE);
    attach_pio(
        &vm,
        &mut buses,
        serial.clone(),
        serial_ports,
        serial.irq_evt(),
        SERIAL_IRQ,
    )?;
    let keyboard_ports = (I8042_PORT_BASE, I8042_PORT_SIZE);
    attach_pio(
        &vm,
        &mut buses,
        keyboard.clone(),
        keyboard_ports,
        keyboard.irq_evt(),
        I8042_IRQ,
    )?;
    devices.attach(vm.fd(), &mut buses)?;
    vmgenid
        .new_generation(vm.memory().as_ref())
        .map_err(DeviceError::from)?;
    register_irq(&vm, vmgenid.irq_evt(), vmgenid.gsi())?;

    let running = vm.start(Arc::new(buses))?;
    keyboard.connect_reset(running.control().clone());
    session.attach_keyboard(keyboard);
    // A loaded guest learns of its new id through the event device's interrupt (it waits in
    // the IOAPIC while the VM stays paused); a booting one reads it when its driver binds.
    if resumed.is_some() {
        vmgenid.notify_guest().map_err(DeviceError::from)?;
    }
    session.attach_vmgenid(Arc::new(vmgenid));
    session.start_guest(&running, resumed.is_some_and(|r| r.paused));
    match running.wait() {
        StopReason::Requested => Ok(RunOutcome::Stopped(
            session.stop_cause().unwrap_or(StopCause::Api),
        )),
        // A reset (Linux reboots through the i8042 with reboot=k, by a triple fault with
        // reboot=t, and so on panic=N) ends the VM: a microVM does not restart.
        StopReason::GuestShutdown { vcpu } => {
            Ok(RunOutcome::GuestReset(ResetCause::TripleFault { vcpu }))
        }
        StopReason::GuestReset => Ok(RunOutcome::GuestReset(ResetCause::Keyboard)),
        StopReason::AllHalted => Ok(RunOutcome::Success),
        StopReason::GuestExit(status) => Ok(RunOutcome::GuestFailure(format!(
            "the guest exited with status {status}"
        ))),
        StopReason::VcpuFailed { message, .. } => Err(RunError::VcpuFailed(message)),
    }
}

/// Loads kernel, initrd and command line (naming the virtio devices) and sets the vCPUs up
/// for the kernel's entry.
fn boot(
    session: &Session,
    vm: &Vm<GuestMemory>,
    linux: &LinuxConfig,
    devices: &VirtioMmioDevices,
    vmgenid: &VmGenId,
) -> Result<(), RunError> {
    let entries = devices.entries();
    // A root drive is the first virtio-blk disk, or its partition by PARTUUID.
    let cmdline = match session.config().drives.iter().find(|drive| drive.root) {
        Some(root) => add_kernel_arg(Some(&linux.cmdline), &root.root_cmdline()),
        None => linux.cmdline.clone(),
    };
    let ram: Vec<(u64, u64)> = session
        .config()
        .ram_regions()
        .iter()
        .map(|region| (region.start, region.size))
        .collect();
    let boot = load_linux(
        vm.memory().as_ref(),
        &LinuxBootConfig {
            kernel: &linux.kernel,
            initrd: linux.initrd.as_deref(),
            cmdline: Some(&cmdline),
            virtio_devices: &entries,
            ram: &ram,
        },
    )
    .map_err(|source| RunError::Boot {
        kernel: linux.kernel.clone(),
        source,
    })?;
    let template = session
        .config()
        .cpu_template
        .as_ref()
        .map(CpuTemplate::try_from)
        .transpose()
        .map_err(|e| RunError::VcpuSetup(e.to_string()))?;
    if let Some(template) = &template {
        template
            .check_capabilities(vm.kvm())
            .map_err(|e| RunError::VcpuSetup(e.to_string()))?;
    }
    let acpi_devices = AcpiDevices {
        vmgenid_address: vmgenid.address(),
        ged_gsi: vmgenid.gsi(),
    };
    setup_vcpus(
        vm,
        &boot,
        &acpi_devices,
        threads_per_core(session.config().smt),
        template.as_ref(),
    )
}

/// Puts `device` on the port I/O bus at `(base, size)`, its interrupt `irq` raised through
/// `irq_evt`.
fn attach_pio(
    vm: &Vm<GuestMemory>,
    buses: &mut Buses,
    device: Arc<dyn BusDevice>,
    (base, size): (u64, u64),
    irq_evt: &EventFd,
    irq: u32,
) -> Result<(), DeviceError> {
    register_irq(vm, irq_evt, irq)?;
    buses
        .pio
        .insert(device, base, size)
        .map_err(DeviceError::Bus)
}

/// Has KVM raise GSI `irq` whenever `irq_evt` is written.
fn register_irq(vm: &Vm<GuestMemory>, irq_evt: &EventFd, irq: u32) -> Result<(), DeviceError> {
    vm.fd()
        .register_irqfd(irq_evt, irq)
        .map_err(|source| DeviceError::Kvm {
            what: "KVM_IRQFD",
            source,
        })
}

/// The MP table and the ACPI tables (the vCPUs, `acpi_devices`); CPUID, MSRs and LAPIC for
/// every vCPU; long mode (or the 32-bit protected mode of a PVH entry) at
/// the kernel's entry for vCPU 0.
fn setup_vcpus(
    vm: &Vm<GuestMemory>,
    boot: &LinuxBoot,
    acpi_devices: &AcpiDevices,
    threads_per_core: u32,
    template: Option<&CpuTemplate>,
) -> Result<(), RunError> {
    let setup = |e: &dyn std::fmt::Display| RunError::VcpuSetup(e.to_string());
    write_mptable(vm.memory().as_ref(), vm.vcpus().len()).map_err(|e| setup(&e))?;
    write_acpi_tables(vm.memory().as_ref(), vm.vcpus().len(), acpi_devices)
        .map_err(|e| setup(&e))?;
    let cpuid = supported_cpuid(vm.kvm()).map_err(|e| setup(&e))?;
    // Linux builds its own page tables: the boot map covers the low 4 GiB with 2 MiB pages. A
    // PVH entry starts without paging.
    let tables = match boot.entry {
        BootEntry::Linux64 { .. } => write_boot_tables(
            vm.memory().as_ref(),
            &BootLayout::linux(),
            MIN_IDENTITY_MAPPED,
        ),
        BootEntry::Pvh { .. } => write_pvh_tables(vm.memory().as_ref(), &BootLayout::linux()),
    }
    .map_err(|e| setup(&e))?;
    let count = vm.vcpus().len() as u32;
    for vcpu in vm.vcpus() {
        let topology = VcpuTopology {
            vcpu_id: vcpu.index() as u32,
            vcpu_count: count,
            threads_per_core,
        };
        set_vcpu_cpuid(vcpu.fd(), &cpuid, topology, template).map_err(|e| setup(&e))?;
        setup_boot_msrs(vcpu.fd()).map_err(|e| setup(&e))?;
        if let Some(template) = template {
            template.apply_msrs(vcpu.fd()).map_err(|e| setup(&e))?;
        }
        setup_lint_pins(vcpu.fd()).map_err(|e| setup(&e))?;
        if vcpu.index() != 0 {
            continue;
        }
        match boot.entry {
            BootEntry::Linux64 { rip, zero_page } => {
                let entry = EntryPoint {
                    rip: rip.0,
                    rsp: BOOT_STACK_POINTER,
                    rdi: 0,
                    rsi: zero_page.0,
                };
                setup_long_mode(vcpu.fd(), &tables, &entry)
            }
            BootEntry::Pvh { rip, start_info } => {
                setup_pvh(vcpu.fd(), &tables, rip.0, start_info.0)
            }
        }
        .map_err(|e| setup(&e))?;
    }
    Ok(())
}
