//! Firecracker's custom CPU templates (`PUT /cpu-config`, x86_64): bit-level changes to CPUID
//! leaves and MSRs applied to every vCPU, and KVM capabilities the VM needs.
//!
//! A bitmap is `0b` then up to 32 (CPUID) or 64 (MSR) characters, most significant first:
//! `0` clears the bit, `1` sets it, `x` keeps what the VMM would give; `_` may separate
//! groups. Missing leading characters are `x`.

mod static_templates;

pub use static_templates::t2a;

use kvm_bindings::{kvm_cpuid_entry2, kvm_msr_entry, CpuId, Msrs, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};
use kvm_ioctls::{Kvm, VcpuFd};
use vmm_api::model::{CpuidLeafModifier, CpuidRegisterModifier, CustomCpuTemplate};

/// Errors of a template.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// A number (leaf, subleaf, MSR, capability) is not one.
    #[error("{0:?} is not a number (decimal, 0x hex or 0b binary)")]
    Number(String),
    /// A bitmap is malformed.
    #[error("bitmap {0:?}: expected 0b and at most {1} characters of 0, 1, x (and _)")]
    Bitmap(String, usize),
    /// A register name is not eax, ebx, ecx or edx.
    #[error("register {0:?}: expected eax, ebx, ecx or edx")]
    Register(String),
    /// An aarch64 field on x86_64.
    #[error("{0} are for aarch64; this is an x86_64 host")]
    WrongArch(&'static str),
    /// KVM lacks a capability the template needs.
    #[error("KVM does not have capability {0}, which the CPU template needs")]
    MissingCapability(u32),
    /// The CPUID table is full.
    #[error("the CPU template adds more CPUID leaves than KVM takes")]
    TooManyLeaves,
    /// KVM refused an MSR.
    #[error("KVM refused MSR {0:#x} of the CPU template")]
    Msr(u32),
}

/// Bits to change: where `mask` is set, the result takes `value`'s bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bitmap {
    /// The bits that change.
    pub mask: u64,
    /// Their new values.
    pub value: u64,
}

impl Bitmap {
    /// Parses `text` of at most `width` bits.
    pub fn parse(text: &str, width: usize) -> Result<Self, TemplateError> {
        let bad = || TemplateError::Bitmap(text.to_owned(), width);
        let digits = text.strip_prefix("0b").ok_or_else(bad)?;
        let (mut mask, mut value, mut count) = (0u64, 0u64, 0usize);
        for c in digits.chars().filter(|&c| c != '_') {
            count += 1;
            if count > width {
                return Err(bad());
            }
            mask <<= 1;
            value <<= 1;
            match c {
                '0' => mask |= 1,
                '1' => {
                    mask |= 1;
                    value |= 1;
                }
                'x' | 'X' => {}
                _ => return Err(bad()),
            }
        }
        Ok(Bitmap { mask, value })
    }

    /// `old` changed by the bitmap.
    pub fn apply(self, old: u64) -> u64 {
        (old & !self.mask) | (self.value & self.mask)
    }
}

/// A decimal, `0x` hexadecimal or `0b` binary number.
fn number(text: &str) -> Result<u64, TemplateError> {
    let bad = || TemplateError::Number(text.to_owned());
    let text = text.trim();
    let parsed = if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        u64::from_str_radix(&hex.replace('_', ""), 16)
    } else if let Some(binary) = text.strip_prefix("0b") {
        u64::from_str_radix(&binary.replace('_', ""), 2)
    } else {
        text.parse()
    };
    parsed.map_err(|_| bad())
}

fn number32(text: &str) -> Result<u32, TemplateError> {
    u32::try_from(number(text)?).map_err(|_| TemplateError::Number(text.to_owned()))
}

/// One CPUID leaf's changes, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LeafChange {
    leaf: u32,
    subleaf: u32,
    flags: u32,
    /// (register: 0 eax to 3 edx, bitmap).
    registers: Vec<(usize, Bitmap)>,
}

/// A template checked once: numbers and bitmaps parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTemplate {
    capabilities: Vec<u32>,
    cpuid: Vec<LeafChange>,
    msrs: Vec<(u32, Bitmap)>,
}

impl TryFrom<&CustomCpuTemplate> for CpuTemplate {
    type Error = TemplateError;

    fn try_from(template: &CustomCpuTemplate) -> Result<Self, TemplateError> {
        if !template.reg_modifiers.is_empty() {
            return Err(TemplateError::WrongArch("reg_modifiers"));
        }
        if !template.vcpu_features.is_empty() {
            return Err(TemplateError::WrongArch("vcpu_features"));
        }
        let capabilities = template
            .kvm_capabilities
            .iter()
            .filter(|cap| !cap.starts_with('!'))
            .map(|cap| number32(cap))
            .collect::<Result<_, _>>()?;
        for cap in &template.kvm_capabilities {
            if let Some(removed) = cap.strip_prefix('!') {
                number32(removed)?;
            }
        }
        let cpuid = template
            .cpuid_modifiers
            .iter()
            .map(|leaf| {
                let registers = leaf
                    .modifiers
                    .iter()
                    .map(|m| {
                        let index = match m.register.as_str() {
                            "eax" => 0,
                            "ebx" => 1,
                            "ecx" => 2,
                            "edx" => 3,
                            other => return Err(TemplateError::Register(other.to_owned())),
                        };
                        Ok((index, Bitmap::parse(&m.bitmap, 32)?))
                    })
                    .collect::<Result<_, _>>()?;
                Ok(LeafChange {
                    leaf: number32(&leaf.leaf)?,
                    subleaf: number32(&leaf.subleaf)?,
                    flags: leaf.flags,
                    registers,
                })
            })
            .collect::<Result<_, TemplateError>>()?;
        let msrs = template
            .msr_modifiers
            .iter()
            .map(|m| Ok((number32(&m.addr)?, Bitmap::parse(&m.bitmap, 64)?)))
            .collect::<Result<_, TemplateError>>()?;
        Ok(CpuTemplate {
            capabilities,
            cpuid,
            msrs,
        })
    }
}

impl CpuTemplate {
    /// Checks that KVM has the capabilities the template needs.
    pub fn check_capabilities(&self, kvm: &Kvm) -> Result<(), TemplateError> {
        for &cap in &self.capabilities {
            if kvm.check_extension_raw(cap.into()) <= 0 {
                return Err(TemplateError::MissingCapability(cap));
            }
        }
        Ok(())
    }

    /// Changes `cpuid` as the template says; a leaf it lacks is added (its other registers 0).
    pub fn apply_cpuid(&self, cpuid: &mut CpuId) -> Result<(), TemplateError> {
        let mut entries = cpuid.as_slice().to_vec();
        for LeafChange {
            leaf,
            subleaf,
            flags,
            registers,
        } in &self.cpuid
        {
            let matches = |e: &kvm_cpuid_entry2| {
                e.function == *leaf
                    && (e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX == 0 || e.index == *subleaf)
            };
            let at = match entries.iter().position(matches) {
                Some(at) => at,
                None => {
                    entries.push(kvm_cpuid_entry2 {
                        function: *leaf,
                        index: *subleaf,
                        flags: *flags,
                        ..Default::default()
                    });
                    entries.len() - 1
                }
            };
            let entry = &mut entries[at];
            for &(register, bitmap) in registers {
                let slot = match register {
                    0 => &mut entry.eax,
                    1 => &mut entry.ebx,
                    2 => &mut entry.ecx,
                    _ => &mut entry.edx,
                };
                // The bitmap has 32 bits at most: no truncation.
                *slot = bitmap.apply(u64::from(*slot)) as u32;
            }
        }
        *cpuid = CpuId::from_entries(&entries).map_err(|_| TemplateError::TooManyLeaves)?;
        Ok(())
    }

    /// Changes the MSRs of `vcpu` as the template says.
    pub fn apply_msrs(&self, vcpu: &VcpuFd) -> Result<(), TemplateError> {
        for &(addr, bitmap) in &self.msrs {
            let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
                index: addr,
                ..Default::default()
            }])
            .map_err(|_| TemplateError::Msr(addr))?;
            let read = vcpu
                .get_msrs(&mut msrs)
                .map_err(|_| TemplateError::Msr(addr))?;
            let old = if read == 1 {
                msrs.as_slice()[0].data
            } else {
                0
            };
            let new = Msrs::from_entries(&[kvm_msr_entry {
                index: addr,
                data: bitmap.apply(old),
                ..Default::default()
            }])
            .map_err(|_| TemplateError::Msr(addr))?;
            if vcpu.set_msrs(&new).map_err(|_| TemplateError::Msr(addr))? != 1 {
                return Err(TemplateError::Msr(addr));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(json: &str) -> Result<CpuTemplate, TemplateError> {
        let custom: CustomCpuTemplate = serde_json::from_str(json).unwrap();
        CpuTemplate::try_from(&custom)
    }

    #[test]
    fn bitmaps_set_clear_and_keep_bits() {
        let bitmap = Bitmap::parse("0b1x0_x", 32).unwrap();
        assert_eq!(bitmap.mask, 0b1010);
        assert_eq!(bitmap.value, 0b1000);
        assert_eq!(bitmap.apply(0b0111), 0b1101);
        assert!(Bitmap::parse(&format!("0b{}", "x".repeat(33)), 32).is_err());
        assert!(Bitmap::parse(&format!("0b{}", "1".repeat(64)), 64).is_ok());
        assert!(Bitmap::parse("0b102", 32).is_err());
        assert!(Bitmap::parse("102", 32).is_err());
    }

    #[test]
    fn a_template_changes_the_leaves_it_names_and_adds_missing_ones() {
        let parsed = template(
            r#"{"kvm_capabilities": ["!56", "1"],
                "cpuid_modifiers": [
                  {"leaf": "0x1", "subleaf": "0", "flags": 0,
                   "modifiers": [{"register": "ecx", "bitmap": "0b0xxxxx1"}]},
                  {"leaf": "0x40000010", "subleaf": "0b0", "flags": 1,
                   "modifiers": [{"register": "eax", "bitmap": "0b1010"}]}],
                "msr_modifiers": [{"addr": "0x10a", "bitmap": "0b1"}]}"#,
        )
        .unwrap();
        let mut cpuid = CpuId::from_entries(&[kvm_cpuid_entry2 {
            function: 1,
            ecx: 0xffff_ff40,
            ..Default::default()
        }])
        .unwrap();
        parsed.apply_cpuid(&mut cpuid).unwrap();
        let entries = cpuid.as_slice();
        assert_eq!(entries[0].ecx, 0xffff_ff01);
        assert_eq!(entries[1].function, 0x4000_0010);
        assert_eq!(entries[1].eax, 0b1010);
        assert_eq!(parsed.msrs, vec![(0x10a, Bitmap { mask: 1, value: 1 })]);
        assert_eq!(parsed.capabilities, vec![1]);
        for bad in [
            r#"{"cpuid_modifiers": [{"leaf": "zz", "subleaf": "0", "flags": 0, "modifiers": []}]}"#,
            r#"{"cpuid_modifiers": [{"leaf": "1", "subleaf": "0", "flags": 0,
                "modifiers": [{"register": "r8", "bitmap": "0b1"}]}]}"#,
            r#"{"msr_modifiers": [{"addr": "0x1_0000_0000", "bitmap": "0b1"}]}"#,
            r#"{"kvm_capabilities": ["!x"]}"#,
            r#"{"vcpu_features": [{"index": 0, "bitmap": "0b1"}]}"#,
        ] {
            assert!(template(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kvm_capabilities_are_checked_and_msrs_written_on_a_real_vcpu() {
        let Ok(kvm) = Kvm::new() else {
            eprintln!("SKIP: no /dev/kvm");
            return;
        };
        // KVM_CAP_IRQCHIP (0) is everywhere; 100000 nowhere.
        template(r#"{"kvm_capabilities": ["0"]}"#)
            .unwrap()
            .check_capabilities(&kvm)
            .unwrap();
        assert_eq!(
            template(r#"{"kvm_capabilities": ["100000"]}"#)
                .unwrap()
                .check_capabilities(&kvm),
            Err(TemplateError::MissingCapability(100000))
        );
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        // IA32_TSC_AUX (0xc0000103) takes any 32-bit value.
        let parsed =
            template(r#"{"msr_modifiers": [{"addr": "0xc0000103", "bitmap": "0b101"}]}"#).unwrap();
        parsed.apply_msrs(&vcpu).unwrap();
        let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
            index: 0xc000_0103,
            ..Default::default()
        }])
        .unwrap();
        vcpu.get_msrs(&mut msrs).unwrap();
        assert_eq!(msrs.as_slice()[0].data & 0b111, 0b101);
    }
}
