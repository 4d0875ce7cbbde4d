//! CPUID filter tests: on a synthetic table shaped like this host's, and on real KVM.

use super::*;

fn entry(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function,
        index,
        eax: regs[0],
        ebx: regs[1],
        ecx: regs[2],
        edx: regs[3],
        ..Default::default()
    }
}

/// Leaves as PVM's KVM_GET_SUPPORTED_CPUID reports them on the development host (abridged).
fn supported() -> CpuId {
    CpuId::from_entries(&[
        entry(0x0, 0, [0x1c, 0x756e_6547, 0x6c65_746e, 0x4965_6e69]),
        entry(
            0x1,
            0,
            [
                0xc06f2,
                0x20800,
                0x8120_2000 | 0x3c,
                0x0f8b_fbff | (1 << 22),
            ],
        ),
        entry(0x4, 0, [0x400_0121, 0x2c0_003f, 0x3f, 0]),
        entry(0x4, 3, [0x400_4163, 0x4c0_003f, 0x33fff, 0]),
        entry(0x4, 4, [0, 0, 0, 0]),
        entry(0x6, 0, [0x4, 0, 0x8, 0]),
        entry(0xa, 0, [0x0760_3104, 0, 0, 0x603]),
        entry(0xb, 0, [0, 0, 0, 0]),
        entry(0x8000_0000, 0, [0x8000_0021, 0, 0, 0]),
        entry(0x8000_0002, 0, [0, 0, 0, 0]),
        entry(0x8000_0003, 0, [0, 0, 0, 0]),
        entry(0x8000_0004, 0, [0, 0, 0, 0]),
        entry(
            0x4000_0000,
            0,
            [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x4d],
        ),
    ])
    .unwrap()
}

fn find(cpuid: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
    *cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == function && e.index == index)
        .unwrap_or_else(|| panic!("leaf {function:#x}.{index} missing"))
}

#[test]
fn leaf_1_carries_apic_id_count_and_hypervisor_bit() {
    let topology = VcpuTopology {
        vcpu_id: 3,
        vcpu_count: 4,
        threads_per_core: 1,
    };
    let cpuid = vcpu_cpuid(&supported(), topology).unwrap();
    let leaf = find(&cpuid, 1, 0);
    assert_eq!(leaf.ebx >> 24, 3);
    assert_eq!((leaf.ebx >> 16) & 0xff, 4);
    assert_eq!((leaf.ebx >> 8) & 0xff, 8);
    assert_ne!(leaf.ecx & leaf1_ecx::HYPERVISOR, 0);
    assert_eq!(
        leaf.ecx & (leaf1_ecx::MONITOR | leaf1_ecx::VMX | leaf1_ecx::DTES64),
        0
    );
    assert_ne!(leaf.edx & leaf1_edx::HTT, 0);
    assert_eq!(leaf.edx & leaf1_edx::ACPI, 0);
    assert_eq!(leaf.eax, 0xc06f2, "family/model untouched");

    let single = vcpu_cpuid(
        &supported(),
        VcpuTopology {
            vcpu_id: 0,
            vcpu_count: 1,
            threads_per_core: 1,
        },
    )
    .unwrap();
    assert_eq!(find(&single, 1, 0).edx & leaf1_edx::HTT, 0);
}

#[test]
fn topology_leaf_describes_one_thread_per_core() {
    let cpuid = vcpu_cpuid(
        &supported(),
        VcpuTopology {
            vcpu_id: 2,
            vcpu_count: 3,
            threads_per_core: 1,
        },
    )
    .unwrap();
    let smt = find(&cpuid, 0xb, 0);
    let core = find(&cpuid, 0xb, 1);
    let end = find(&cpuid, 0xb, 2);
    assert_eq!((smt.eax, smt.ebx, smt.ecx, smt.edx), (0, 1, 0x100, 2));
    assert_eq!((core.eax, core.ebx, core.ecx, core.edx), (2, 3, 0x201, 2));
    assert_eq!((end.ebx, end.ecx & 0xff00), (0, 0));
    assert!(cpuid
        .as_slice()
        .iter()
        .filter(|e| e.function == 0xb)
        .all(|e| e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX != 0));
}

#[test]
fn with_smt_each_core_has_two_threads_that_share_its_caches() {
    let mut leaves = supported().as_slice().to_vec();
    leaves.push(entry(0x8000_0008, 0, [0x3030, 0, 0, 0]));
    leaves.push(entry(0x8000_001e, 0, [0, 0, 0, 0]));
    let with_amd_leaves = CpuId::from_entries(&leaves).unwrap();
    let cpuid = vcpu_cpuid(
        &with_amd_leaves,
        VcpuTopology {
            vcpu_id: 3,
            vcpu_count: 4,
            threads_per_core: 2,
        },
    )
    .unwrap();
    let smt = find(&cpuid, 0xb, 0);
    let core = find(&cpuid, 0xb, 1);
    // One bit of the APIC ID numbers the thread, two the vCPUs of the package.
    assert_eq!((smt.eax, smt.ebx, smt.ecx, smt.edx), (1, 2, 0x100, 3));
    assert_eq!((core.eax, core.ebx, core.ecx, core.edx), (2, 4, 0x201, 3));
    let l1 = find(&cpuid, 4, 0);
    let l3 = find(&cpuid, 4, 3);
    // L1 shared by the 2 threads of a core, L3 by all 4; 2 cores in the package.
    assert_eq!(((l1.eax >> 14) & 0xfff, l1.eax >> 26), (1, 1));
    assert_eq!(((l3.eax >> 14) & 0xfff, l3.eax >> 26), (3, 1));
    let amd = find(&cpuid, 0x8000_001e, 0);
    assert_eq!(
        (amd.eax, amd.ebx, amd.ecx),
        (3, 0x101, 0),
        "vCPU 3: thread 1 of core 1"
    );
    assert_eq!(find(&cpuid, 0x8000_0008, 0).ecx, 0x2003);

    // On AMD, Linux reads the threads of a core from leaf 8000_001EH, with TOPOEXT only: SMT
    // announces both even where KVM offered neither.
    let mut amd = supported().as_slice().to_vec();
    amd[0].ebx = u32::from_le_bytes(*b"Auth");
    amd.push(entry(0x8000_0001, 0, [0, 0, 0, 0]));
    amd.iter_mut()
        .filter(|e| e.function == 0x8000_0000)
        .for_each(|e| e.eax = 0x8000_0008);
    let amd = CpuId::from_entries(&amd).unwrap();
    let topology = VcpuTopology {
        vcpu_id: 1,
        vcpu_count: 2,
        threads_per_core: 2,
    };
    let cpuid = vcpu_cpuid(&amd, topology).unwrap();
    assert_ne!(find(&cpuid, 0x8000_0001, 0).ecx & (1 << 22), 0, "TOPOEXT");
    assert!(find(&cpuid, 0x8000_0000, 0).eax >= 0x8000_001e);
    assert_eq!(
        find(&cpuid, 0x8000_001e, 0).ebx,
        0x100,
        "thread 1 of core 0"
    );
    // Without SMT, or on Intel, the table stays as KVM offered it.
    let cores = vcpu_cpuid(
        &amd,
        VcpuTopology {
            threads_per_core: 1,
            ..topology
        },
    )
    .unwrap();
    assert_eq!(find(&cores, 0x8000_0001, 0).ecx & (1 << 22), 0);
    let intel = vcpu_cpuid(&supported(), topology).unwrap();
    assert!(!intel.as_slice().iter().any(|e| e.function == 0x8000_001e));

    // One vCPU is one thread, SMT or not.
    let single = vcpu_cpuid(
        &with_amd_leaves,
        VcpuTopology {
            vcpu_id: 0,
            vcpu_count: 1,
            threads_per_core: 2,
        },
    )
    .unwrap();
    let smt = find(&single, 0xb, 0);
    assert_eq!((smt.eax, smt.ebx), (0, 1));
    assert_eq!(find(&single, 0x8000_001e, 0).ebx, 0);
}

#[test]
fn caches_pmu_and_brand_string() {
    let cpuid = vcpu_cpuid(
        &supported(),
        VcpuTopology {
            vcpu_id: 0,
            vcpu_count: 2,
            threads_per_core: 1,
        },
    )
    .unwrap();
    let l1 = find(&cpuid, 4, 0);
    let l3 = find(&cpuid, 4, 3);
    assert_eq!(((l1.eax >> 14) & 0xfff, l1.eax >> 26), (0, 1));
    assert_eq!(((l3.eax >> 14) & 0xfff, l3.eax >> 26), (1, 1));
    assert_eq!(
        l3.eax & 0x3fff,
        0x4163 & 0x3fff,
        "cache type and level kept"
    );
    assert_eq!(find(&cpuid, 4, 4).eax, 0);
    let pmu = find(&cpuid, 0xa, 0);
    assert_eq!(pmu.eax | pmu.edx, 0);
    assert_eq!(find(&cpuid, 6, 0).ecx & 0x8, 0);
    let brand = find(&cpuid, 0x8000_0002, 0);
    assert_ne!(brand.eax, 0, "brand string filled");
    assert_eq!(find(&cpuid, 0, 0).ebx, 0x756e_6547, "vendor kept");
}

#[test]
fn invalid_topologies_are_rejected() {
    for (vcpu_id, vcpu_count, threads_per_core) in [
        (0, 0, 1),
        (2, 2, 1),
        (0, 255, 1),
        (0, 3, 2),
        (0, 4, 3),
        (0, 4, 0),
    ] {
        assert!(matches!(
            vcpu_cpuid(
                &supported(),
                VcpuTopology {
                    vcpu_id,
                    vcpu_count,
                    threads_per_core,
                }
            ),
            Err(CpuidError::InvalidTopology { .. })
        ));
    }
}

#[test]
fn kvm_accepts_the_filtered_cpuid() {
    let Ok(kvm) = Kvm::new() else {
        eprintln!("SKIP: /dev/kvm is not available");
        return;
    };
    let supported = supported_cpuid(&kvm).unwrap();
    let vm = kvm.create_vm().unwrap();
    for vcpu_id in 0..2 {
        let vcpu = vm.create_vcpu(u64::from(vcpu_id)).unwrap();
        let topology = VcpuTopology {
            vcpu_id,
            vcpu_count: 2,
            threads_per_core: 1,
        };
        set_vcpu_cpuid(&vcpu, &supported, topology, None).unwrap();
        let back = vcpu.get_cpuid2(KVM_MAX_CPUID_ENTRIES).unwrap();
        let leaf = find(&back, 1, 0);
        assert_eq!(leaf.ebx >> 24, vcpu_id);
        assert_ne!(leaf.ecx & leaf1_ecx::HYPERVISOR, 0);
        // The TSC-deadline timer is offered exactly where KVM emulates it.
        assert_eq!(
            leaf.ecx & leaf1_ecx::TSC_DEADLINE != 0,
            kvm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer)
        );
    }
}
