//! The architectural state of a paused VM, as KVM holds it: per vCPU ([`KvmVcpuState`]) and per VM
//! ([`KvmVmState`]), read for a snapshot and written back in another process.
//!
//! The order of the writes follows Firecracker's and Cloud Hypervisor's: CPUID first (it
//! decides which XSAVE components and MSRs the vCPU has), then MP state, registers, special
//! registers (the APIC base among them), XSAVE, XCRs, debug registers, the LAPIC, the MSRs (the
//! TSC deadline after the LAPIC), and the pending events last.

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_msr_entry, kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
    CpuId, Msrs, KVM_CLOCK_REALTIME, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

/// Errors of reading or writing KVM state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A KVM ioctl failed.
    #[error("{what}: {source}")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// KVM read or wrote fewer MSRs than asked.
    #[error("{what}: KVM handled {done} of {asked} MSRs (stopped at {stopped:#x})")]
    Msrs {
        /// The ioctl.
        what: &'static str,
        /// MSRs handled.
        done: usize,
        /// MSRs asked for.
        asked: usize,
        /// The first MSR not handled.
        stopped: u32,
    },
    /// `clock_realtime` was asked for, and the saved kvmclock holds no real time.
    #[error(
        "clock_realtime: the snapshot's kvmclock holds no real time (its host's KVM gave none: \
         KVM_CLOCK_REALTIME needs a TSC clocksource)"
    )]
    NoRealTime,
    /// A saved table does not fit KVM's array types.
    #[error("{0}: too many entries")]
    TooMany(&'static str),
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> StateError {
    move |source| StateError::Kvm { what, source }
}

/// Everything KVM holds about one vCPU.
#[derive(Debug, Serialize, Deserialize)]
pub struct KvmVcpuState {
    /// The CPUID table the vCPU was given.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// Running, halted, waiting for SIPI.
    pub mp_state: kvm_mp_state,
    /// General-purpose registers, RIP and RFLAGS.
    pub regs: kvm_regs,
    /// Segments, control registers, EFER, the APIC base.
    pub sregs: kvm_sregs,
    /// FPU, SSE and AVX state.
    pub xsave: kvm_xsave,
    /// Extended control registers (XCR0).
    pub xcrs: kvm_xcrs,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
    /// The local APIC's registers.
    pub lapic: kvm_lapic_state,
    /// Model-specific registers: every one in KVM's save list that this vCPU has.
    pub msrs: Vec<kvm_msr_entry>,
    /// Pending exceptions, interrupts, NMIs and SMIs.
    pub events: kvm_vcpu_events,
}

/// Reads `indices` from `vcpu`, leaving out the ones this vCPU does not have (KVM stops at
/// such an MSR: the rest are read again without it).
fn read_msrs(vcpu: &VcpuFd, indices: &[u32]) -> Result<Vec<kvm_msr_entry>, StateError> {
    let mut saved = Vec::with_capacity(indices.len());
    let mut rest = indices;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|_| StateError::TooMany("MSRs"))?;
        let read = vcpu.get_msrs(&mut msrs).map_err(kvm_err("KVM_GET_MSRS"))?;
        saved.extend_from_slice(&msrs.as_slice()[..read]);
        // Skip the MSR KVM stopped at.
        rest = rest.get(read + 1..).unwrap_or_default();
    }
    Ok(saved)
}

impl KvmVcpuState {
    /// Reads the state of `vcpu`, which must be out of `KVM_RUN` with no I/O left to complete
    /// (see [`crate::vm::vcpu`]). `msrs` lists the MSRs KVM asks VMMs to save
    /// (`KVM_GET_MSR_INDEX_LIST`).
    pub fn save(vcpu: &VcpuFd, msrs: &[u32]) -> Result<Self, StateError> {
        let cpuid = vcpu
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("KVM_GET_CPUID2"))?;
        Ok(KvmVcpuState {
            cpuid: cpuid.as_slice().to_vec(),
            mp_state: vcpu.get_mp_state().map_err(kvm_err("KVM_GET_MP_STATE"))?,
            regs: vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?,
            sregs: vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?,
            xsave: vcpu.get_xsave().map_err(kvm_err("KVM_GET_XSAVE"))?,
            xcrs: vcpu.get_xcrs().map_err(kvm_err("KVM_GET_XCRS"))?,
            debugregs: vcpu
                .get_debug_regs()
                .map_err(kvm_err("KVM_GET_DEBUGREGS"))?,
            lapic: vcpu.get_lapic().map_err(kvm_err("KVM_GET_LAPIC"))?,
            msrs: read_msrs(vcpu, msrs)?,
            events: vcpu
                .get_vcpu_events()
                .map_err(kvm_err("KVM_GET_VCPU_EVENTS"))?,
        })
    }

    /// Writes the state to `vcpu`, a fresh vCPU of a VM that has its irqchip.
    pub fn restore(&self, vcpu: &VcpuFd) -> Result<(), StateError> {
        let cpuid = CpuId::from_entries(&self.cpuid).map_err(|_| StateError::TooMany("CPUID"))?;
        vcpu.set_cpuid2(&cpuid).map_err(kvm_err("KVM_SET_CPUID2"))?;
        vcpu.set_mp_state(self.mp_state)
            .map_err(kvm_err("KVM_SET_MP_STATE"))?;
        vcpu.set_regs(&self.regs).map_err(kvm_err("KVM_SET_REGS"))?;
        vcpu.set_sregs(&self.sregs)
            .map_err(kvm_err("KVM_SET_SREGS"))?;
        // SAFETY: `self.xsave` is a whole `kvm_xsave` read by KVM_GET_XSAVE, which needs no
        // more room than the legacy 4 KiB structure.
        unsafe { vcpu.set_xsave(&self.xsave) }.map_err(kvm_err("KVM_SET_XSAVE"))?;
        vcpu.set_xcrs(&self.xcrs).map_err(kvm_err("KVM_SET_XCRS"))?;
        vcpu.set_debug_regs(&self.debugregs)
            .map_err(kvm_err("KVM_SET_DEBUGREGS"))?;
        vcpu.set_lapic(&self.lapic)
            .map_err(kvm_err("KVM_SET_LAPIC"))?;
        let msrs = Msrs::from_entries(&self.msrs).map_err(|_| StateError::TooMany("MSRs"))?;
        let written = vcpu.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
        if written != self.msrs.len() {
            return Err(StateError::Msrs {
                what: "KVM_SET_MSRS",
                done: written,
                asked: self.msrs.len(),
                stopped: self.msrs[written].index,
            });
        }
        vcpu.set_vcpu_events(&self.events)
            .map_err(kvm_err("KVM_SET_VCPU_EVENTS"))
    }
}

/// What KVM holds about the VM beyond its vCPUs: the in-kernel PICs and IOAPIC, the PIT and
/// the kvmclock.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvmVmState {
    /// Master PIC, slave PIC, IOAPIC.
    pub irqchips: Vec<kvm_irqchip>,
    /// The PIT's channels.
    pub pit: kvm_pit_state2,
    /// The kvmclock.
    pub clock: kvm_clock_data,
    /// Restore the kvmclock advanced by the real time since it was saved (Firecracker's
    /// `clock_realtime`; see [`Self::advance_clock_by_real_time`]); not part of a snapshot.
    #[serde(skip)]
    pub clock_realtime: bool,
}

const IRQCHIPS: [u32; 3] = [
    KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
    KVM_IRQCHIP_IOAPIC,
];

impl KvmVmState {
    /// Reads the state of `vm`, whose vCPUs are paused.
    pub fn save(vm: &VmFd) -> Result<Self, StateError> {
        let irqchips = IRQCHIPS
            .iter()
            .map(|&chip_id| {
                let mut chip = kvm_irqchip {
                    chip_id,
                    ..Default::default()
                };
                vm.get_irqchip(&mut chip)
                    .map_err(kvm_err("KVM_GET_IRQCHIP"))?;
                Ok(chip)
            })
            .collect::<Result<_, StateError>>()?;
        Ok(KvmVmState {
            irqchips,
            pit: vm.get_pit2().map_err(kvm_err("KVM_GET_PIT2"))?,
            clock: vm.get_clock().map_err(kvm_err("KVM_GET_CLOCK"))?,
            clock_realtime: false,
        })
    }

    /// Has the restore advance the kvmclock by the host's real time since the state was
    /// saved, as Firecracker's `clock_realtime` does: the guest sees the time the VM spent as
    /// a snapshot. Refused when the saved clock holds no real time (KVM gives it where the
    /// host's clocksource allows, `KVM_CLOCK_REALTIME`).
    pub fn advance_clock_by_real_time(&mut self) -> Result<(), StateError> {
        if self.clock.flags & KVM_CLOCK_REALTIME == 0 {
            return Err(StateError::NoRealTime);
        }
        self.clock_realtime = true;
        Ok(())
    }

    /// Writes the state to `vm`, a fresh VM with its irqchip and PIT, before its vCPUs run.
    pub fn restore(&self, vm: &VmFd) -> Result<(), StateError> {
        for chip in &self.irqchips {
            vm.set_irqchip(chip).map_err(kvm_err("KVM_SET_IRQCHIP"))?;
        }
        vm.set_pit2(&self.pit).map_err(kvm_err("KVM_SET_PIT2"))?;
        // The clock goes on from where it stood, or (clock_realtime) from there advanced by the
        // real time since: KVM adds what its host's real time moved since `realtime`.
        let clock = match self.clock_realtime {
            true => kvm_clock_data {
                clock: self.clock.clock,
                flags: KVM_CLOCK_REALTIME,
                realtime: self.clock.realtime,
                ..Default::default()
            },
            false => kvm_clock_data {
                clock: self.clock.clock,
                ..Default::default()
            },
        };
        vm.set_clock(&clock).map_err(kvm_err("KVM_SET_CLOCK"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_ioctls::Kvm;

    #[test]
    fn a_vcpu_and_its_vm_read_back_what_was_written_into_a_fresh_one() {
        let Ok(kvm) = Kvm::new() else {
            eprintln!("SKIP: a_vcpu_and_its_vm_read_back: /dev/kvm is not available");
            return;
        };
        let new_vm = || {
            let vm = kvm.create_vm().unwrap();
            vm.create_irq_chip().unwrap();
            vm.create_pit2(Default::default()).unwrap();
            let vcpu = vm.create_vcpu(0).unwrap();
            let cpuid = super::super::cpuid::supported_cpuid(&kvm).unwrap();
            vcpu.set_cpuid2(&cpuid).unwrap();
            (vm, vcpu)
        };
        let (vm, vcpu) = new_vm();
        let mut regs = vcpu.get_regs().unwrap();
        regs.rax = 0x1234_5678;
        regs.rip = 0x10_0000;
        vcpu.set_regs(&regs).unwrap();
        let msrs = kvm.get_msr_index_list().unwrap().as_slice().to_vec();
        let state = KvmVcpuState::save(&vcpu, &msrs).unwrap();
        assert!(!state.msrs.is_empty() && !state.cpuid.is_empty());
        let vm_state = KvmVmState::save(&vm).unwrap();
        assert_eq!(vm_state.irqchips.len(), 3);

        let bytes = postcard::to_stdvec(&state).unwrap();
        let back: KvmVcpuState = postcard::from_bytes(&bytes).unwrap();
        let (other_vm, other) = new_vm();
        back.restore(&other).unwrap();
        vm_state.restore(&other_vm).unwrap();
        let restored = other.get_regs().unwrap();
        assert_eq!((restored.rax, restored.rip), (0x1234_5678, 0x10_0000));
        assert_eq!(other.get_sregs().unwrap().apic_base, state.sregs.apic_base);
    }

    #[test]
    fn a_clock_restored_with_real_time_advances_by_the_time_the_state_lay() {
        let Ok(kvm) = Kvm::new() else {
            eprintln!("SKIP: a_clock_restored_with_real_time: /dev/kvm is not available");
            return;
        };
        let new_vm = || {
            let vm = kvm.create_vm().unwrap();
            vm.create_irq_chip().unwrap();
            vm.create_pit2(Default::default()).unwrap();
            vm
        };
        let mut state = KvmVmState::save(&new_vm()).unwrap();
        // A state whose host gave no real time is refused, and restores as it stood.
        let mut without = state.clone();
        without.clock.flags &= !KVM_CLOCK_REALTIME;
        assert!(matches!(
            without.advance_clock_by_real_time(),
            Err(StateError::NoRealTime)
        ));
        if state.clock.flags & KVM_CLOCK_REALTIME == 0 {
            eprintln!("SKIP: a_clock_restored_with_real_time: this host's KVM gives no real time");
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let still = new_vm();
        state.restore(&still).unwrap();
        let stood = still.get_clock().unwrap().clock - state.clock.clock;
        state.advance_clock_by_real_time().unwrap();
        let advanced = new_vm();
        state.restore(&advanced).unwrap();
        let moved = advanced.get_clock().unwrap().clock - state.clock.clock;
        assert!(stood < 200_000_000, "the clock moved {stood} ns unasked");
        assert!(
            moved >= 300_000_000,
            "the clock moved {moved} ns, not the 300 ms it lay"
        );
    }
}
