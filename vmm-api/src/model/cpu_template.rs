//! Firecracker's custom CPU template (`PUT /cpu-config`, a machine configuration's
//! `cpu_config`) as JSON: CPUID and MSR changes given as bitmaps; the VMM checks and applies
//! them.

use serde::{Deserialize, Serialize};

/// One register's change in a CPUID leaf.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidRegisterModifier {
    /// `eax`, `ebx`, `ecx` or `edx`.
    pub register: String,
    /// The bits (32).
    pub bitmap: String,
}

/// The changes to one CPUID leaf and subleaf.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidLeafModifier {
    /// The leaf.
    pub leaf: String,
    /// The subleaf.
    pub subleaf: String,
    /// KVM's flags of the entry (1: the subleaf matters).
    pub flags: u32,
    /// The registers' changes.
    pub modifiers: Vec<CpuidRegisterModifier>,
}

/// The change to one MSR.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsrModifier {
    /// The MSR's address.
    pub addr: String,
    /// The bits (64).
    pub bitmap: String,
}

/// Firecracker's `CpuConfig` (a custom CPU template).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomCpuTemplate {
    /// KVM capabilities the VM needs ("N"), or that need not be checked ("!N").
    #[serde(default)]
    pub kvm_capabilities: Vec<String>,
    /// CPUID changes.
    #[serde(default)]
    pub cpuid_modifiers: Vec<CpuidLeafModifier>,
    /// MSR changes.
    #[serde(default)]
    pub msr_modifiers: Vec<MsrModifier>,
    /// aarch64 only: refused unless empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reg_modifiers: Vec<serde_json::Value>,
    /// aarch64 only: refused unless empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vcpu_features: Vec<serde_json::Value>,
}
