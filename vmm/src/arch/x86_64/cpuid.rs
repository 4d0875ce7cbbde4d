//! Guest CPUID: what KVM supports, filtered per vCPU as Firecracker does.
//!
//! Starting from `KVM_GET_SUPPORTED_CPUID` (host vendor, features KVM can virtualize), each vCPU
//! gets its APIC ID and a topology of one package of cores with one thread each, or two with
//! SMT (Firecracker's `smt`, vCPUs 2n and 2n+1 the threads of core n), the
//! hypervisor bit, no PMU, and no features a VM cannot offer (MONITOR, VMX, thermal/power
//! management, debug store). An empty brand string is filled with the host's.

use kvm_bindings::{
    kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{Cap, Kvm, VcpuFd};

use super::cpu_template::CpuTemplate;

/// Errors of CPUID set-up.
#[derive(Debug, thiserror::Error)]
pub enum CpuidError {
    /// `KVM_GET_SUPPORTED_CPUID` failed.
    #[error("KVM_GET_SUPPORTED_CPUID: {0}")]
    GetSupported(#[source] kvm_ioctls::Error),
    /// `KVM_SET_CPUID2` failed.
    #[error("KVM_SET_CPUID2: {0}")]
    Set(#[source] kvm_ioctls::Error),
    /// The CPU template could not be applied.
    #[error(transparent)]
    Template(#[from] super::cpu_template::TemplateError),
    /// Rewriting the topology leaves overflowed the CPUID table.
    #[error("too many CPUID entries")]
    TooManyEntries,
    /// The vCPU ID or count cannot be expressed in 8-bit APIC IDs, or the vCPUs do not make
    /// whole cores.
    #[error(
        "vCPU {vcpu_id} of {vcpu_count} with {threads_per_core} thread(s) per core: need \
         1..=254 vCPUs, id < count, 1 or 2 threads per core and a count of 1 or a multiple of them"
    )]
    InvalidTopology {
        /// vCPU index.
        vcpu_id: u32,
        /// Number of vCPUs.
        vcpu_count: u32,
        /// Threads per core.
        threads_per_core: u32,
    },
}

/// Which vCPU a CPUID table is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VcpuTopology {
    /// Index of this vCPU; also its APIC ID.
    pub vcpu_id: u32,
    /// Number of vCPUs in the VM.
    pub vcpu_count: u32,
    /// Threads per core: 1, or 2 with SMT (a VM of one vCPU has one thread whatever this says).
    pub threads_per_core: u32,
}

/// Threads per core of a VM: 2 with SMT.
pub fn threads_per_core(smt: bool) -> u32 {
    if smt {
        2
    } else {
        1
    }
}

impl VcpuTopology {
    /// Threads per core as the guest sees them.
    fn threads(self) -> u32 {
        if self.vcpu_count == 1 {
            1
        } else {
            self.threads_per_core
        }
    }
}

/// Bits in CPUID.1:ECX.
mod leaf1_ecx {
    pub const DTES64: u32 = 1 << 2;
    pub const MONITOR: u32 = 1 << 3;
    pub const DS_CPL: u32 = 1 << 4;
    pub const VMX: u32 = 1 << 5;
    pub const SMX: u32 = 1 << 6;
    pub const EST: u32 = 1 << 7;
    pub const TM2: u32 = 1 << 8;
    pub const CNXT_ID: u32 = 1 << 10;
    pub const SDBG: u32 = 1 << 11;
    pub const XTPR: u32 = 1 << 14;
    pub const PDCM: u32 = 1 << 15;
    pub const TSC_DEADLINE: u32 = 1 << 24;
    pub const HYPERVISOR: u32 = 1 << 31;
}

/// Bits in CPUID.1:EDX.
mod leaf1_edx {
    pub const DS: u32 = 1 << 21;
    pub const ACPI: u32 = 1 << 22;
    pub const HTT: u32 = 1 << 28;
    pub const TM: u32 = 1 << 29;
    pub const PBE: u32 = 1 << 31;
}

/// CLFLUSH line size in 8-byte units (64 bytes).
const CLFLUSH_LINE_SIZE: u32 = 8;
/// Level types in CPUID.0BH/1FH:ECX[15:8].
const LEVEL_TYPE_SMT: u32 = 1;
const LEVEL_TYPE_CORE: u32 = 2;
/// Used when neither KVM nor the host has a brand string.
const DEFAULT_BRAND: &[u8] = b"llfree-vmm virtual CPU";

/// Fetches what KVM can offer a guest, the TSC-deadline timer included where KVM emulates
/// it (KVM leaves its CPUID bit to the VMM, as it depends on the in-kernel LAPIC, which every
/// VM here has; Firecracker sets it the same way): Linux then programs its timer with one MSR
/// write instead of the LAPIC's one-shot count.
pub fn supported_cpuid(kvm: &Kvm) -> Result<CpuId, CpuidError> {
    let mut cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(CpuidError::GetSupported)?;
    if kvm.check_extension(Cap::TscDeadlineTimer) {
        for entry in cpuid.as_mut_slice() {
            if entry.function == 0x1 {
                entry.ecx |= leaf1_ecx::TSC_DEADLINE;
            }
        }
    }
    Ok(cpuid)
}

/// Returns `supported` filtered for one vCPU.
pub fn vcpu_cpuid(supported: &CpuId, topology: VcpuTopology) -> Result<CpuId, CpuidError> {
    let VcpuTopology {
        vcpu_id,
        vcpu_count,
        threads_per_core,
    } = topology;
    if vcpu_count == 0
        || vcpu_count > 254
        || vcpu_id >= vcpu_count
        || !(1..=2).contains(&threads_per_core)
        || (vcpu_count > 1 && !vcpu_count.is_multiple_of(threads_per_core))
    {
        return Err(CpuidError::InvalidTopology {
            vcpu_id,
            vcpu_count,
            threads_per_core,
        });
    }
    let mut entries: Vec<kvm_cpuid_entry2> = supported.as_slice().to_vec();
    if topology.threads() > 1 && is_amd(&entries) {
        announce_amd_topology(&mut entries);
    }
    let max_basic = entries
        .iter()
        .find(|e| e.function == 0)
        .map_or(0, |e| e.eax);
    for entry in &mut entries {
        match entry.function {
            0x1 => filter_leaf_1(entry, topology),
            0x4 => filter_cache_leaf(entry, topology),
            0x8000_0008 => filter_core_count_leaf(entry, topology),
            AMD_TOPOLOGY_LEAF => filter_amd_topology_leaf(entry, topology),
            0x6 => entry.ecx &= !(1 << 3), // no energy-performance bias MSR
            0xa => clear(entry),           // no PMU
            _ => {}
        }
    }
    for leaf in [0xb, 0x1f] {
        if max_basic >= leaf && entries.iter().any(|e| e.function == leaf) {
            entries.retain(|e| e.function != leaf);
            entries.extend(topology_leaf(leaf, topology));
        }
    }
    fill_brand_string(&mut entries, &host_brand_string());
    CpuId::from_entries(&entries).map_err(|_| CpuidError::TooManyEntries)
}

/// "Auth" of "AuthenticAMD" in CPUID.0:EBX.
const AMD_VENDOR_EBX: u32 = u32::from_le_bytes(*b"Auth");
/// CPUID.8000_0001H:ECX: the topology extensions (leaves 8000_001DH and 8000_001EH).
const TOPOEXT: u32 = 1 << 22;
/// AMD's extended topology leaf: the extended APIC ID, the core and its threads.
const AMD_TOPOLOGY_LEAF: u32 = 0x8000_001e;

fn is_amd(entries: &[kvm_cpuid_entry2]) -> bool {
    entries
        .iter()
        .any(|e| e.function == 0 && e.ebx == AMD_VENDOR_EBX)
}

/// On AMD, Linux counts the threads of a core from leaf 8000_001EH only, and reads it only
/// with TOPOEXT: set the bit, and have the leaf (filled in by [`filter_amd_topology_leaf`])
/// within the extended range, as Firecracker does.
fn announce_amd_topology(entries: &mut Vec<kvm_cpuid_entry2>) {
    for entry in entries.iter_mut() {
        match entry.function {
            0x8000_0000 => entry.eax = entry.eax.max(AMD_TOPOLOGY_LEAF),
            0x8000_0001 => entry.ecx |= TOPOEXT,
            _ => {}
        }
    }
    if !entries.iter().any(|e| e.function == AMD_TOPOLOGY_LEAF) {
        entries.push(kvm_cpuid_entry2 {
            function: AMD_TOPOLOGY_LEAF,
            ..Default::default()
        });
    }
}

/// Filters and sets the CPUID of `vcpu`, changed by `template` if given.
pub fn set_vcpu_cpuid(
    vcpu: &VcpuFd,
    supported: &CpuId,
    topology: VcpuTopology,
    template: Option<&CpuTemplate>,
) -> Result<(), CpuidError> {
    let mut cpuid = vcpu_cpuid(supported, topology)?;
    if let Some(template) = template {
        template
            .apply_cpuid(&mut cpuid)
            .map_err(CpuidError::Template)?;
    }
    vcpu.set_cpuid2(&cpuid).map_err(CpuidError::Set)
}

fn clear(entry: &mut kvm_cpuid_entry2) {
    entry.eax = 0;
    entry.ebx = 0;
    entry.ecx = 0;
    entry.edx = 0;
}

fn filter_leaf_1(entry: &mut kvm_cpuid_entry2, topology: VcpuTopology) {
    use leaf1_ecx::*;
    use leaf1_edx::*;
    entry.ebx = (topology.vcpu_id << 24) | (CLFLUSH_LINE_SIZE << 8);
    if topology.vcpu_count > 1 {
        entry.ebx |= topology.vcpu_count << 16;
        entry.edx |= HTT;
    } else {
        entry.edx &= !HTT;
    }
    entry.ecx &=
        !(DTES64 | MONITOR | DS_CPL | VMX | SMX | EST | TM2 | CNXT_ID | SDBG | XTPR | PDCM);
    entry.ecx |= HYPERVISOR;
    entry.edx &= !(DS | ACPI | TM | PBE);
}

/// Deterministic cache parameters (CPUID.4): L1/L2 per core (shared by its threads), L3
/// shared by all vCPUs.
fn filter_cache_leaf(entry: &mut kvm_cpuid_entry2, topology: VcpuTopology) {
    if entry.eax & 0x1f == 0 {
        return; // no more caches
    }
    let level = (entry.eax >> 5) & 0x7;
    let sharing = match level {
        3.. => topology.vcpu_count - 1,
        _ => topology.threads() - 1,
    };
    let cores = (topology.vcpu_count / topology.threads() - 1).min(63);
    entry.eax = (entry.eax & 0x3fff) | (sharing.min(0xfff) << 14) | (cores << 26);
}

/// Bits of an APIC ID that number `count` things.
fn id_bits(count: u32) -> u32 {
    u32::BITS - (count - 1).leading_zeros()
}

/// AMD's processor capacity (CPUID.8000_0008H:ECX): the vCPUs of the package and the bits of
/// their APIC IDs.
fn filter_core_count_leaf(entry: &mut kvm_cpuid_entry2, topology: VcpuTopology) {
    entry.ecx = (id_bits(topology.vcpu_count) << 12) | (topology.vcpu_count - 1);
}

/// AMD's extended topology (CPUID.8000_001EH): the extended APIC ID, the core and its threads,
/// one node.
fn filter_amd_topology_leaf(entry: &mut kvm_cpuid_entry2, topology: VcpuTopology) {
    let threads = topology.threads();
    entry.eax = topology.vcpu_id;
    entry.ebx = ((threads - 1) << 8) | (topology.vcpu_id / threads);
    entry.ecx = 0;
    entry.edx = 0;
}

/// Extended topology (CPUID.0BH / 1FH): SMT level of the threads of a core, core level of all
/// vCPUs.
fn topology_leaf(function: u32, topology: VcpuTopology) -> [kvm_cpuid_entry2; 3] {
    let threads = topology.threads();
    let thread_shift = id_bits(threads);
    let core_shift = id_bits(topology.vcpu_count);
    let entry = |index: u32, eax: u32, ebx: u32, level_type: u32| kvm_cpuid_entry2 {
        function,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        eax,
        ebx,
        ecx: index | (level_type << 8),
        edx: topology.vcpu_id,
        ..Default::default()
    };
    [
        entry(0, thread_shift, threads, LEVEL_TYPE_SMT),
        entry(1, core_shift, topology.vcpu_count, LEVEL_TYPE_CORE),
        entry(2, 0, 0, 0),
    ]
}

/// Fills leaves 0x8000_0002..4 with `brand` if KVM left them empty.
fn fill_brand_string(entries: &mut [kvm_cpuid_entry2], brand: &[u8; 48]) {
    let brand_leaves = 0x8000_0002..=0x8000_0004;
    let empty = entries
        .iter()
        .filter(|e| brand_leaves.contains(&e.function))
        .all(|e| e.eax | e.ebx | e.ecx | e.edx == 0);
    if !empty {
        return;
    }
    for entry in entries
        .iter_mut()
        .filter(|e| brand_leaves.contains(&e.function))
    {
        let start = (entry.function - 0x8000_0002) as usize * 16;
        let word = |i: usize| {
            let at = start + i * 4;
            u32::from_le_bytes([brand[at], brand[at + 1], brand[at + 2], brand[at + 3]])
        };
        entry.eax = word(0);
        entry.ebx = word(1);
        entry.ecx = word(2);
        entry.edx = word(3);
    }
}

/// The host CPU's brand string, or [`DEFAULT_BRAND`] if it has none.
fn host_brand_string() -> [u8; 48] {
    let mut brand = [0u8; 48];
    let max_extended = std::arch::x86_64::__cpuid(0x8000_0000).eax;
    if max_extended >= 0x8000_0004 {
        for (i, leaf) in (0x8000_0002u32..=0x8000_0004).enumerate() {
            let r = std::arch::x86_64::__cpuid(leaf);
            for (j, reg) in [r.eax, r.ebx, r.ecx, r.edx].iter().enumerate() {
                let at = i * 16 + j * 4;
                brand[at..at + 4].copy_from_slice(&reg.to_le_bytes());
            }
        }
    }
    if brand.iter().all(|b| *b == 0) {
        brand[..DEFAULT_BRAND.len()].copy_from_slice(DEFAULT_BRAND);
    }
    brand
}

#[cfg(test)]
mod tests;
