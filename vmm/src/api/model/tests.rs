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
fn machine_info_follows_the_config() {
    let config = VmConfig {
        populate: Populate::Eager,
        ..VmConfig::test_guest(1 << 30, 3)
    };
    let info = MachineInfo::new(&config, guest_mem::FrameSize::Huge, VmState::Paused);
    assert_eq!((info.vcpu_count, info.mem_size_mib), (3, 1024));
    assert_eq!((info.backing.as_str(), info.frame_size_kib), ("anon", 2048));
    assert_eq!((info.guest.as_str(), info.balloon), ("test-guest", false));
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(json["state"], "Paused");
    assert_eq!(json["populate"], "eager");
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
