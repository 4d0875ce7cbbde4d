//! The human views against JSON as the API sends it.

use serde_json::json;

use super::*;

#[test]
fn machine_starts_with_the_state() {
    let text = machine(&json!({
        "backing": "anon", "balloon": true, "frame_size_kib": 2048, "guest": "test-guest",
        "mem_size_mib": 256, "populate": "lazy", "state": "Paused", "vcpu_count": 2,
        "vmm_version": "0.1.0"
    }));
    assert_eq!(
        text,
        "state    Paused\n\
         vcpus    2\n\
         memory   256 MiB, anon backing, frames of 2 MiB, populated lazily (on first touch)\n\
         guest    test-guest\n\
         balloon  yes\n\
         version  0.1.0\n"
    );
    let mapped = machine(&json!({"mem_size_mib": 64, "populate": "mapped", "state": "Running"}));
    assert_eq!(
        mapped,
        "state   Running\nmemory  64 MiB, frames mapped at the start, pages on first touch\n"
    );
}

#[test]
fn memory_is_a_few_lines_that_explain_the_fault_count() {
    let tree = |index: u64, free: u64, reserved: bool| json!({"index": index, "free_4k_frames": free, "reserved": reserved});
    let text = memory(&json!({
        "guest": {"chunk_size_kib": 2048, "chunks": 128, "discarded_chunks": 0,
                  "exhausted_faults": 0, "faults": 127, "populated_bytes": 268435456u64,
                  "populated_chunks": 128, "waiting_other_faults": 0, "waiting_vcpus": 1},
        "pool": {"frame_size_kib": 2048, "free_bytes": 2097152, "total_bytes": 270532608u64,
                 "trees": [tree(0, 0, false), tree(1, 512, true), tree(2, 16384, false)]},
        "vcpus": [{"vcpu": 0, "core": 0, "faults": 63, "reserved_tree": null},
                  {"vcpu": 1, "core": 1, "faults": 64, "reserved_tree": 1, "waiting_ms": 120}],
        "pmem": null
    }));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "guest    256 MiB in 128 chunks of 2 MiB: 128 populated (256 MiB), 0 discarded",
            "faults   127 vCPU faults populated chunks; the VMM populated the other 1 (the \
             guest's image, eager population, device accesses)",
            "waiting  1 vCPU and 0 other faults wait for memory",
            "pool     256 MiB used of 258 MiB, 2 MiB free (frames of 2 MiB)",
            "trees    3 trees of 64 MiB: 1 full, 1 partly used, 1 free; 1 reserved by a core",
            "vCPU 0   63 faults, no tree reserved",
            "vCPU 1   64 faults, reserves tree 1, waiting for memory for 120 ms",
        ]
    );
}

#[test]
fn memory_of_a_zone_vm_shows_every_vm_s_share() {
    let text = memory(&json!({
        "zone": {"frame_size_kib": 2048, "frames": 80, "free_frames": 16,
                 "vms": [{"name": "hungry", "frames": 32, "given_away_4k_pages": 0,
                          "pid": 7, "waiting_bytes": 8388608},
                         {"name": "idle", "frames": 32, "given_away_4k_pages": 512,
                          "pid": null, "waiting_bytes": null}]}
    }));
    assert_eq!(
        text,
        "zone  32 MiB free of 160 MiB; 2 VMs: hungry 64 MiB (waits for 8 MiB), idle 64 MiB\n"
    );
}

#[test]
fn balloon_shows_only_violations_that_happened() {
    let mut get = json!({
        "actual_mib": 16, "amount_mib": 16, "deflate_on_oom": false,
        "driver_violations": {"chain_too_long": 0, "misaligned": 0, "outside_ram": 0},
        "free_page_reporting": true, "needs_reset": false, "stats_polling_interval_s": 1
    });
    assert_eq!(
        balloon(&get),
        "target      16 MiB, the guest gave 16 MiB\n\
         options     free page reporting\n\
         statistics  every 1 s\n"
    );
    get["driver_violations"]["outside_ram"] = json!(3);
    get["needs_reset"] = json!(true);
    let text = balloon(&get);
    assert!(text.contains("violations  outside_ram 3\n"), "{text}");
    assert!(text.contains("waits for the guest to reset it"), "{text}");
}

#[test]
fn balloon_statistics_in_mib_and_counts() {
    let text = balloon_stats(&json!({
        "actual_mib": 16, "actual_pages": 4096, "available_memory": 249561088u64,
        "clamped": false, "free_memory": 250000000u64, "target_mib": 16,
        "target_pages": 4096, "total_memory": 268435456u64, "major_faults": 2
    }));
    assert_eq!(
        text,
        "balloon       target 16 MiB, the guest gave 16 MiB\n\
         total         256 MiB\n\
         free          238.4 MiB\n\
         available     238 MiB\n\
         major faults  2\n"
    );
    let silent = balloon_stats(&json!({"target_mib": 0, "actual_mib": 0}));
    assert!(
        silent.contains("has reported no statistics yet"),
        "{silent}"
    );
}
