//! Firecracker's static CPU template for AMD hosts, `T2A` (machine-config's `cpu_template`,
//! deprecated in Firecracker but still answered there): the guest sees the instruction set of
//! an Intel Cascade Lake T2 instance (`T2CL`), so that it can move between the two. Expressed
//! as a custom template ([`CustomCpuTemplate`]), which is how it is applied.
//!
//! Each row names a CPUID register, the bits the template decides (`mask`) and their values;
//! the features behind them (AMD APM / Intel SDM names) are in the comments.

use super::{CpuidLeafModifier, CpuidRegisterModifier, CustomCpuTemplate};

/// One register's change: the bits of `mask` take `value`'s.
struct Row {
    leaf: u32,
    subleaf: u32,
    /// KVM's `KVM_CPUID_FLAG_SIGNIFCANT_INDEX` where the subleaf matters.
    flags: u32,
    register: &'static str,
    mask: u32,
    value: u32,
}

const T2A: [Row; 11] = [
    // Leaf 1 EAX, the signature: family 6, model 0x3f, stepping 2 (stepping, model, family,
    // type, extended model and family decided; bits 14-15 and 28-31 are reserved).
    Row {
        leaf: 0x1,
        subleaf: 0,
        flags: 0,
        register: "eax",
        mask: 0x0fff_3fff,
        value: 0x0003_06f2,
    },
    // Leaf 1 ECX, off: DTES64, MONITOR, DS-CPL, VMX, SMX, EIST, TM2, CNXT-ID, SDBG, xTPR, PDCM,
    // DCA.
    Row {
        leaf: 0x1,
        subleaf: 0,
        flags: 0,
        register: "ecx",
        mask: 0x0004_cdfc,
        value: 0,
    },
    // Leaf 1 EDX: MCE and MTRR on; PSN, DS, ACPI, SS, TM, IA-64 and PBE off.
    Row {
        leaf: 0x1,
        subleaf: 0,
        flags: 0,
        register: "edx",
        mask: 0xe864_1080,
        value: 0x0000_1080,
    },
    // Leaf 7.0 EBX: ERMS on; off: SGX, HLE, RTM, PQM, MPX, PQE, AVX512F/DQ, RDSEED, ADX,
    // AVX512_IFMA, bit 22, CLFLUSHOPT, CLWB, PT, AVX512PF/ER/CD, SHA, AVX512BW/VL.
    Row {
        leaf: 0x7,
        subleaf: 0,
        flags: 1,
        register: "ebx",
        mask: 0xffef_da14,
        value: 0x0000_0200,
    },
    // Leaf 7.0 ECX, off: AVX512_VBMI, UMIP, PKU, OSPKE, AVX512_VBMI2, GFNI, VAES, VPCLMULQDQ,
    // AVX512_VNNI, AVX512_BITALG, AVX512_VPOPCNTDQ, LA57, RDPID, SGX_LC.
    Row {
        leaf: 0x7,
        subleaf: 0,
        flags: 1,
        register: "ecx",
        mask: 0x4041_5f5e,
        value: 0,
    },
    // Leaf 7.0 EDX, off: AVX512_4VNNIW, AVX512_4FMAPS, FSRM, AVX512_VP2INTERSECT.
    Row {
        leaf: 0x7,
        subleaf: 0,
        flags: 1,
        register: "edx",
        mask: 0x0000_011c,
        value: 0,
    },
    // Leaf 0xd.0 EAX (XSAVE state components), off: MPX (3-4), AVX-512 (5-7), PKRU (9).
    Row {
        leaf: 0xd,
        subleaf: 0,
        flags: 1,
        register: "eax",
        mask: 0x0000_02f8,
        value: 0,
    },
    // Leaf 0xd.1 EAX, off: XSAVEC, XGETBV with ECX=1, XSAVES.
    Row {
        leaf: 0xd,
        subleaf: 1,
        flags: 1,
        register: "eax",
        mask: 0x0000_000e,
        value: 0,
    },
    // Leaf 0x8000_0001 ECX, off: SVM, SSE4A, MisAlignSse, 3DNowPrefetch, MONITORX.
    Row {
        leaf: 0x8000_0001,
        subleaf: 0,
        flags: 0,
        register: "ecx",
        mask: 0x2000_01c4,
        value: 0,
    },
    // Leaf 0x8000_0001 EDX, off: MmxExt, FFXSR, 1 GiB pages.
    Row {
        leaf: 0x8000_0001,
        subleaf: 0,
        flags: 0,
        register: "edx",
        mask: 0x0640_0000,
        value: 0,
    },
    // Leaf 0x8000_0008 EBX: CLZERO and WBNOINVD off; RstrFpErrPtrs, IbrsPreferred,
    // IbrsSameMode and EferLmsleUnsupported on.
    Row {
        leaf: 0x8000_0008,
        subleaf: 0,
        flags: 0,
        register: "ebx",
        mask: 0x001c_0205,
        value: 0x001c_0004,
    },
];

/// A custom template's bitmap (`0b` and 32 of `0`, `1`, `x`) for `mask` and `value`.
fn bitmap(mask: u32, value: u32) -> String {
    let bits = (0..32)
        .rev()
        .map(|bit| match (mask >> bit & 1, value >> bit & 1) {
            (0, _) => 'x',
            (_, 0) => '0',
            _ => '1',
        });
    "0b".chars().chain(bits).collect()
}

/// The `T2A` template.
pub fn t2a() -> CustomCpuTemplate {
    let mut cpuid_modifiers: Vec<CpuidLeafModifier> = Vec::new();
    for row in &T2A {
        let modifier = CpuidRegisterModifier {
            register: row.register.to_owned(),
            bitmap: bitmap(row.mask, row.value),
        };
        let (leaf, subleaf) = (format!("{:#x}", row.leaf), format!("{:#x}", row.subleaf));
        match cpuid_modifiers
            .iter_mut()
            .find(|m| m.leaf == leaf && m.subleaf == subleaf)
        {
            Some(existing) => existing.modifiers.push(modifier),
            None => cpuid_modifiers.push(CpuidLeafModifier {
                leaf,
                subleaf,
                flags: row.flags,
                modifiers: vec![modifier],
            }),
        }
    }
    CustomCpuTemplate {
        cpuid_modifiers,
        ..CustomCpuTemplate::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::cpu_template::{Bitmap, CpuTemplate};

    #[test]
    fn t2a_parses_as_a_custom_template_with_its_rows() {
        let template = t2a();
        assert!(CpuTemplate::try_from(&template).is_ok());
        assert_eq!(template.cpuid_modifiers.len(), 6);
        let leaf1 = &template.cpuid_modifiers[0];
        assert_eq!((leaf1.leaf.as_str(), leaf1.modifiers.len()), ("0x1", 3));
        let signature = Bitmap::parse(&leaf1.modifiers[0].bitmap, 32).unwrap();
        assert_eq!(signature.apply(0x00a0_0f11), 0x0003_06f2);
        assert_eq!(bitmap(0b110, 0b010), format!("0b{}01x", "x".repeat(29)));
    }
}
