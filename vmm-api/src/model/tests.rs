use guest_mem::{Backing, MemoryConfig, Pool, PoolConfig};
use vm_memory::GuestAddress;

use super::*;

#[test]
fn memory_info_reports_a_real_eager_guest_memory_and_its_pool() {
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 64 << 20)).expect("pool");
    let config = MemoryConfig {
        populate: Populate::Eager,
        ..MemoryConfig::new(vec![(GuestAddress(0), 16 << 20)], 2)
    };
    let memory = GuestMemory::new(pool, config).expect("guest memory");
    let info = MemoryInfo::collect(&memory, None);
    assert_eq!(info.guest.chunk_size_kib, 2048);
    assert_eq!((info.guest.chunks, info.guest.populated_chunks), (8, 8));
    assert_eq!(info.guest.populated_bytes, 16 << 20);
    assert_eq!(info.guest.faults, 0, "eager population takes no faults");
    assert_eq!(info.vcpus.len(), 2);
    assert_eq!(info.vcpus[1].core, memory.vcpu_core(1));
    assert_eq!(info.pool.total_bytes, 64 << 20);
    assert_eq!(info.pool.used_bytes, 16 << 20);
    assert_eq!(info.pool.free_4k_frames, (48 << 20) >> 12);
    assert_eq!(info.pool.used_4k_frames, (16 << 20) >> 12);
    assert_eq!(info.pool.free_2m_frames, 24);
    assert_eq!(info.pool.trees.len(), 1);
    // One 64 MiB tree means one reservation slot, which eager population (on the VMM's
    // core) has taken, and which the vCPUs' cores share.
    assert_eq!(info.pool.reservation_slots, 1);
    assert_eq!(
        info.pool.reservations,
        vec![CoreReservation { core: 0, tree: 0 }]
    );
    assert!(info.vcpus.iter().all(|v| v.reserved_tree == Some(0)));
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(json["pool"]["trees"][0]["free_4k_frames"], (48 << 20) >> 12);
}

#[test]
fn request_bodies_are_strict() {
    let parse = |text: &str| serde_json::from_str::<BalloonUpdate>(text);
    assert_eq!(
        parse(r#"{"amount_mib":5}"#).unwrap(),
        BalloonUpdate {
            amount_mib: Some(5),
            stats_polling_interval_s: None
        }
    );
    assert!(parse(r#"{"amount":5}"#).is_err());
    assert!(parse(r#"{"amount_mib":"5"}"#).is_err());
    assert!(serde_json::from_str::<VmStateRequest>(r#"{"state":"paused"}"#).is_err());
    assert!(serde_json::from_str::<ActionRequest>(r#"{}"#).is_err());
    let stats = serde_json::to_string(&BalloonStatistics::default()).unwrap();
    assert_eq!(
        stats,
        r#"{"target_pages":0,"actual_pages":0,"target_mib":0,"actual_mib":0,"clamped":false}"#
    );
}

#[test]
fn snapshot_bodies_take_firecracker_s_fields_and_refuse_what_is_not_supported() {
    let create: SnapshotCreateParams =
        serde_json::from_str(r#"{"snapshot_path":"/s","mem_file_path":"/m"}"#).unwrap();
    assert_eq!(create.snapshot_type, SnapshotType::Full);
    let diff = r#"{"snapshot_type":"Diff","snapshot_path":"/s","mem_file_path":"/m"}"#;
    let diff: SnapshotCreateParams = serde_json::from_str(diff).unwrap();
    assert_eq!(diff.snapshot_type, SnapshotType::Diff);
    assert!(serde_json::from_str::<SnapshotCreateParams>(r#"{"snapshot_path":"/s"}"#).is_err());

    let load = |text: &str| serde_json::from_str::<SnapshotLoadParams>(text).unwrap();
    let file = load(
        r#"{"snapshot_path":"/s","mem_backend":{"backend_type":"File","backend_path":"/z"},
            "resume_vm":true}"#,
    );
    let path = std::path::Path::new("/z");
    assert_eq!(file.memory_backend(), Ok((MemoryBackendType::File, path)));
    assert!(file.resume_vm && file.check_supported().is_ok());
    let deprecated = load(r#"{"snapshot_path":"/s","mem_file_path":"/z"}"#);
    assert_eq!(
        deprecated.memory_backend(),
        Ok((MemoryBackendType::File, path))
    );
    let uffd =
        load(r#"{"snapshot_path":"/s","mem_backend":{"backend_type":"Uffd","backend_path":"/u"}}"#);
    let socket = std::path::Path::new("/u");
    assert_eq!(uffd.memory_backend(), Ok((MemoryBackendType::Uffd, socket)));
    assert!(uffd.check_supported().is_ok());
    assert!(!deprecated.resume_vm);
    assert!(deprecated.uses_deprecated_fields() && !file.uses_deprecated_fields());
    // Dirty page tracking for diff snapshots, by its name or its deprecated one.
    for body in [
        r#"{"snapshot_path":"/s","mem_file_path":"/z","track_dirty_pages":true}"#,
        r#"{"snapshot_path":"/s","mem_file_path":"/z","enable_diff_snapshots":true}"#,
    ] {
        let tracking = load(body);
        assert!(tracking.tracks_dirty_pages() && tracking.check_supported().is_ok());
    }
    assert!(!file.tracks_dirty_pages());
    for (body, why) in [
        (
            r#"{"snapshot_path":"/s","mem_backend":{"backend_type":"Uffd","backend_path":"/u"},
                "verify_memory":true}"#,
            "page-fault handler",
        ),
        (
            r#"{"snapshot_path":"/s","mem_file_path":"/z",
                "mem_backend":{"backend_type":"File","backend_path":"/z"}}"#,
            "not both",
        ),
        (r#"{"snapshot_path":"/s"}"#, "missing"),
    ] {
        let refused = load(body).check_supported().unwrap_err();
        assert!(refused.contains(why), "{body}: {refused}");
    }
    assert!(serde_json::from_str::<SnapshotLoadParams>(r#"{"snapshot_path":"/s","x":1}"#).is_err());
}

#[test]
fn instance_info_and_version_are_firecracker_s() {
    let info = InstanceInfo::new("vm-7", VmState::NotStarted);
    assert_eq!(
        serde_json::to_value(&info).unwrap(),
        serde_json::json!({
            "app_name": "llfree-vmm",
            "id": "vm-7",
            "state": "Not started",
            "vmm_version": env!("CARGO_PKG_VERSION"),
        })
    );
    assert_eq!(
        InstanceState::from(VmState::Running),
        InstanceState::Running
    );
    assert_eq!(InstanceState::from(VmState::Stopped), InstanceState::Paused);
    let version = serde_json::to_value(VersionInfo::default()).unwrap();
    assert_eq!(version["firecracker_version"], env!("CARGO_PKG_VERSION"));
}
