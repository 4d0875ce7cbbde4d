//! Local APIC set-up for booting Linux, as Firecracker does: LINT0 delivers the legacy PIC's
//! interrupts (ExtINT) and LINT1 delivers NMIs, the wiring of the virtual-wire mode the kernel
//! expects from the BIOS.

use kvm_bindings::kvm_lapic_state;
use kvm_ioctls::VcpuFd;

/// Errors of LAPIC set-up.
#[derive(Debug, thiserror::Error)]
pub enum LapicError {
    /// KVM_GET_LAPIC failed.
    #[error("KVM_GET_LAPIC failed: {0}")]
    Get(kvm_ioctls::Error),
    /// KVM_SET_LAPIC failed.
    #[error("KVM_SET_LAPIC failed: {0}")]
    Set(kvm_ioctls::Error),
}

/// Offset of the LVT LINT0 register in the LAPIC register page.
const LVT_LINT0: usize = 0x350;
/// Offset of the LVT LINT1 register.
const LVT_LINT1: usize = 0x360;
/// Delivery mode field of an LVT register (bits 8-10).
const DELIVERY_MODE_MASK: u32 = 0x700;
/// Delivery mode NMI.
const DELIVERY_MODE_NMI: u32 = 0x4 << 8;
/// Delivery mode ExtINT.
const DELIVERY_MODE_EXTINT: u32 = 0x7 << 8;

fn read_register(state: &kvm_lapic_state, offset: usize) -> u32 {
    let bytes = &state.regs[offset..offset + 4];
    u32::from_le_bytes([
        bytes[0] as u8,
        bytes[1] as u8,
        bytes[2] as u8,
        bytes[3] as u8,
    ])
}

fn write_register(state: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (slot, byte) in state.regs[offset..offset + 4]
        .iter_mut()
        .zip(value.to_le_bytes())
    {
        *slot = byte as libc::c_char;
    }
}

/// Sets LINT0 to ExtINT and LINT1 to NMI in `state`, keeping their other bits.
pub fn wire_lint_pins(state: &mut kvm_lapic_state) {
    for (offset, mode) in [
        (LVT_LINT0, DELIVERY_MODE_EXTINT),
        (LVT_LINT1, DELIVERY_MODE_NMI),
    ] {
        let value = read_register(state, offset);
        write_register(state, offset, (value & !DELIVERY_MODE_MASK) | mode);
    }
}

/// Wires the LINT pins of `vcpu`'s in-kernel LAPIC (see [`wire_lint_pins`]).
pub fn setup_lint_pins(vcpu: &VcpuFd) -> Result<(), LapicError> {
    let mut state = vcpu.get_lapic().map_err(LapicError::Get)?;
    wire_lint_pins(&mut state);
    vcpu.set_lapic(&state).map_err(LapicError::Set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_delivery_modes_and_keeps_other_bits() {
        let mut state = kvm_lapic_state::default();
        write_register(&mut state, LVT_LINT0, 0x1_0000 | 0x700 | 0x31);
        write_register(&mut state, LVT_LINT1, 0x1_0000);
        wire_lint_pins(&mut state);
        assert_eq!(read_register(&state, LVT_LINT0), 0x1_0000 | 0x700 | 0x31);
        assert_eq!(read_register(&state, LVT_LINT1), 0x1_0000 | 0x400);
        assert_eq!(read_register(&state, 0x340), 0, "neighbours untouched");
    }

    #[test]
    fn works_on_a_kvm_vcpu() {
        if !std::path::Path::new("/dev/kvm").exists() {
            eprintln!("SKIP: works_on_a_kvm_vcpu: /dev/kvm is absent");
            return;
        }
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        setup_lint_pins(&vcpu).unwrap();
        let state = vcpu.get_lapic().unwrap();
        assert_eq!(
            read_register(&state, LVT_LINT0) & DELIVERY_MODE_MASK,
            DELIVERY_MODE_EXTINT
        );
        assert_eq!(
            read_register(&state, LVT_LINT1) & DELIVERY_MODE_MASK,
            DELIVERY_MODE_NMI
        );
    }
}
