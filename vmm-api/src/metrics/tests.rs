use super::*;

fn fresh_api() -> ApiMetrics {
    ApiMetrics {
        get: [const { Counter::new() }; GET_REQUESTS.len()],
        put: [const { Requests::new() }; PUT_REQUESTS.len()],
        patch: [const { Requests::new() }; PATCH_REQUESTS.len()],
    }
}

fn put(api: &ApiMetrics, name: &str) -> (u64, u64) {
    let i = PUT_REQUESTS.iter().position(|(_, n)| *n == name).unwrap();
    (api.put[i].count.get(), api.put[i].fails.get())
}

#[test]
fn requests_count_under_firecrackers_names_and_failures_by_status() {
    let api = fresh_api();
    api.count("PUT", "/drives/rootfs", 204);
    api.count("PUT", "/drives/rootfs", 400);
    api.count("PUT", "/actions", 204);
    api.count("PATCH", "/machine-config?x=1", 400);
    api.count("GET", "/", 200);
    api.count("GET", "/machine-config", 200);
    api.count("GET", "/balloon", 200);
    // Requests Firecracker does not count are not counted.
    api.count("PUT", "/balloon", 204);
    api.count("DELETE", "/drives/x", 405);
    assert_eq!(put(&api, "drive"), (2, 1));
    assert_eq!(put(&api, "actions"), (1, 0));
    assert_eq!(put(&api, "boot_source"), (0, 0));
    let patch = PATCH_REQUESTS
        .iter()
        .position(|(_, n)| *n == "machine_cfg")
        .unwrap();
    assert_eq!(
        (api.patch[patch].count.get(), api.patch[patch].fails.get()),
        (1, 1)
    );
    assert_eq!(api.get[0].get(), 1, "instance_info_count");
    assert_eq!(api.get[1].get(), 1, "machine_cfg_count");
    let total: u64 = api.put.iter().map(|r| r.count.get()).sum();
    assert_eq!(total, 3);
}

#[test]
fn durations_keep_the_shortest_the_longest_and_the_sum() {
    let durations = Durations::new();
    assert_eq!(
        durations.get(),
        (0, 0, 0),
        "nothing recorded reads as zeros"
    );
    for us in [30, 10, 20] {
        durations.record(Duration::from_micros(us));
    }
    assert_eq!(durations.get(), (10, 30, 60));
}

#[test]
fn latencies_keep_the_last_of_each_operation() {
    let latencies = Latencies {
        api_us: [const { AtomicU64::new(0) }; Operation::ALL.len()],
        vmm_us: [const { AtomicU64::new(0) }; Operation::ALL.len()],
    };
    latencies.record(Level::Api, Operation::PauseVm, Duration::from_micros(500));
    latencies.record(Level::Vmm, Operation::PauseVm, Duration::from_micros(300));
    latencies.record(Level::Api, Operation::PauseVm, Duration::from_micros(700));
    assert_eq!(latencies.get(Operation::PauseVm), (700, 300));
    // A failed operation leaves the last duration as it was.
    let failed: Result<(), ()> = latencies.time(Level::Vmm, Operation::PauseVm, || Err(()));
    assert!(failed.is_err());
    assert_eq!(latencies.get(Operation::PauseVm), (700, 300));
    assert_eq!(latencies.get(Operation::ResumeVm), (0, 0));
    let names: Vec<_> = Operation::ALL.iter().map(|o| o.name()).collect();
    assert_eq!(
        names,
        [
            "full_create_snapshot",
            "diff_create_snapshot",
            "load_snapshot",
            "pause_vm",
            "resume_vm"
        ]
    );
}
