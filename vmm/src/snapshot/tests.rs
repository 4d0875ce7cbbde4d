//! Snapshot files: what is written is read back, and damaged, truncated, foreign or
//! inconsistent files are refused with an error (never a panic).

use std::path::PathBuf;

use proptest::prelude::*;

use super::file::{self, SnapshotFileError, HEADER_LEN};
use super::*;
use vmm_devices::virtio::state::{DeviceState, InterruptSnapshot};

/// A file in the temporary directory, removed when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("llfree-snapshot-{name}-{}", std::process::id()));
        TempPath(path)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn vcpu_state() -> KvmVcpuState {
    KvmVcpuState {
        cpuid: vec![Default::default(); 3],
        mp_state: Default::default(),
        regs: kvm_bindings::kvm_regs {
            rip: 0x10_0000,
            ..Default::default()
        },
        sregs: Default::default(),
        xsave: Default::default(),
        xcrs: Default::default(),
        debugregs: Default::default(),
        lapic: Default::default(),
        msrs: vec![Default::default(); 2],
        events: Default::default(),
    }
}

/// A 2-vCPU test guest with a balloon, its memory in a zone.
fn snapshot() -> VmSnapshot {
    VmSnapshot {
        machine: Machine {
            hotplug: None,
            memory_size: 64 << 20,
            vcpus: 2,
            smt: false,
            pmem_size: None,
            pmem_rate_limiter: Default::default(),
            balloon: Some(BalloonDeviceConfig::default()),
            balloon_stats_interval_s: 0,
            wait_for_memory: false,
            memory_wait_limit_ms: None,
            guest: SavedGuest::TestGuest(Workload::new().write(2 << 20, 4 << 20, 7)),
            drives: Vec::new(),
            entropy: None,
            network_interfaces: Vec::new(),
            vsock: None,
            mmds: None,
        },
        memory: MemorySource::Zone {
            zone_id: 0x1234,
            vm: "vm".into(),
            vm_id: 9,
            seal: 77,
        },
        vcpus: vec![vcpu_state(), vcpu_state()],
        vm: KvmVmState {
            irqchips: vec![Default::default(); 3],
            pit: Default::default(),
            clock: Default::default(),
            clock_realtime: false,
        },
        devices: DeviceStates {
            serial: SerialSnapshot {
                baud_divisor: [12, 0],
                interrupt_enable: 0,
                interrupt_identification: 1,
                line_control: 3,
                line_status: 0x60,
                modem_control: 8,
                modem_status: 0xb0,
                scratch: 0,
                in_buffer: Vec::new(),
            },
            keyboard: None,
            vmgenid: None,
            report: Some(ReportSnapshot {
                vcpus: vec![Default::default(); 2],
                exited: 0,
                protocol_errors: 0,
            }),
            virtio: vec![MmioSnapshot {
                device_type: 5,
                device_status: 0,
                device_features_sel: 0,
                driver_features_sel: 0,
                driver_features: 0,
                queue_sel: 0,
                queues: Vec::new(),
                activated: false,
                interrupt: InterruptSnapshot {
                    status: 0,
                    config_generation: 0,
                    needs_reset: false,
                },
                device: DeviceState::Plain,
            }],
        },
    }
}

fn written(name: &str) -> (TempPath, Vec<u8>) {
    let path = TempPath::new(name);
    file::write(&path.0, &snapshot()).unwrap();
    let bytes = std::fs::read(&path.0).unwrap();
    (path, bytes)
}

#[test]
fn a_written_snapshot_reads_back_and_leaves_no_partial_file() {
    let (path, bytes) = written("roundtrip");
    let back = file::read(&path.0).unwrap();
    back.check().unwrap();
    assert_eq!(back.machine, snapshot().machine);
    assert_eq!(back.memory, snapshot().memory);
    assert_eq!(back.devices, snapshot().devices);
    assert_eq!(back.vcpus[1].regs.rip, 0x10_0000);
    assert_eq!(&bytes[..8], b"LLFVSNAP");
    let dir = path.0.parent().unwrap();
    let partial = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name().to_string_lossy().contains("roundtrip")
                && e.file_name().to_string_lossy().ends_with(".partial")
        });
    assert!(!partial);
}

#[test]
fn every_truncation_is_refused() {
    let (path, bytes) = written("truncated");
    for len in (0..bytes.len())
        .step_by(97)
        .chain([HEADER_LEN - 1, HEADER_LEN, bytes.len() - 1])
    {
        std::fs::write(&path.0, &bytes[..len]).unwrap();
        let error = file::read(&path.0).unwrap_err();
        assert!(
            matches!(
                error,
                SnapshotFileError::Damaged { .. } | SnapshotFileError::NotASnapshot { .. }
            ),
            "{len}: {error}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    std::fs::write(&path.0, &longer).unwrap();
    assert!(file::read(&path.0)
        .unwrap_err()
        .to_string()
        .contains("more after them"));
}

#[test]
fn foreign_files_and_other_versions_are_named_as_such() {
    let (path, mut bytes) = written("foreign");
    std::fs::write(&path.0, b"\x7fELF\x02\x01\x01\0 not a snapshot at all").unwrap();
    assert!(matches!(
        file::read(&path.0),
        Err(SnapshotFileError::NotASnapshot { .. })
    ));
    bytes[8] = 2;
    let crc = crc32fast::hash(&bytes[..28]);
    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path.0, &bytes).unwrap();
    assert!(matches!(
        file::read(&path.0),
        Err(SnapshotFileError::Version { found: 2, .. })
    ));
    assert!(matches!(
        file::read(&path.0.with_extension("missing")),
        Err(SnapshotFileError::Path(
            crate::host_file::HostFileError::Io { .. }
        ))
    ));
}

#[test]
fn inconsistent_contents_are_refused() {
    let mut lost_vcpu = snapshot();
    lost_vcpu.vcpus.pop();
    let mut no_report = snapshot();
    no_report.devices.report = None;
    let mut extra_device = snapshot();
    extra_device.machine.balloon = None;
    let mut bad_memory = snapshot();
    bad_memory.machine.memory_size = 3;
    let mut bad_regions = snapshot();
    bad_regions.memory = MemorySource::File {
        regions: vec![(0, 1 << 20)],
        identity: 1,
        checksum: 0,
    };
    let mut copied_pmem = snapshot();
    copied_pmem.machine.pmem_size = Some(2 << 20);
    copied_pmem.machine.balloon = None;
    copied_pmem.memory = MemorySource::File {
        regions: vec![(0, 64 << 20)],
        identity: 1,
        checksum: 0,
    };
    for bad in [
        lost_vcpu,
        no_report,
        extra_device,
        bad_memory,
        bad_regions,
        copied_pmem,
    ] {
        assert!(bad.check().is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any damaged byte is caught by a checksum.
    #[test]
    fn a_flipped_byte_is_refused(at in any::<prop::sample::Index>(), flip in 1u8..) {
        let (path, mut bytes) = written("flipped");
        let at = at.index(bytes.len());
        bytes[at] ^= flip;
        std::fs::write(&path.0, &bytes).unwrap();
        prop_assert!(file::read(&path.0).is_err());
    }

    /// A payload with valid checksums but any content decodes or fails, never panics.
    #[test]
    fn forged_payloads_never_panic(payload in prop::collection::vec(any::<u8>(), 0..4096)) {
        let (path, bytes) = written("forged");
        let mut forged = bytes[..HEADER_LEN].to_vec();
        forged[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        forged[24..28].copy_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        let crc = crc32fast::hash(&forged[..28]);
        forged[28..32].copy_from_slice(&crc.to_le_bytes());
        forged.extend_from_slice(&payload);
        std::fs::write(&path.0, &forged).unwrap();
        if let Ok(snapshot) = file::read(&path.0) {
            let _ = snapshot.check();
        }
    }
}
