use super::*;

fn line(previous: &mut HashMap<String, u64>, build: impl FnOnce(&mut MetricsLine<'_>)) -> Value {
    let mut line = MetricsLine {
        previous,
        object: Map::new(),
    };
    build(&mut line);
    Value::Object(line.object)
}

#[test]
fn counters_say_what_happened_since_the_previous_line_and_values_what_is() {
    let mut previous = HashMap::new();
    let durations = Durations::default();
    durations.record(Duration::from_micros(5));
    let mut build = |reads: u64, durations: &Durations| {
        let previous_line = |line: &mut MetricsLine<'_>| {
            line.section("block_root")
                .count("read_count", reads)
                .value("latest_us", 7)
                .durations("exit_agg", durations)
                .done();
        };
        line(&mut previous, previous_line)
    };
    let first = build(10, &durations);
    durations.record(Duration::from_micros(9));
    let second = build(13, &durations);
    let third = build(13, &durations);
    assert_eq!(first["block_root"]["read_count"], 10);
    assert_eq!(second["block_root"]["read_count"], 3);
    assert_eq!(third["block_root"]["read_count"], 0);
    assert_eq!(third["block_root"]["latest_us"], 7);
    assert_eq!(first["block_root"]["exit_agg"]["sum_us"], 5);
    assert_eq!(
        second["block_root"]["exit_agg"],
        json!({ "min_us": 5, "max_us": 9, "sum_us": 9 })
    );
}

#[test]
fn a_line_before_the_vm_starts_has_firecrackers_sections() {
    let mut previous = HashMap::new();
    let line = line(&mut previous, |line| {
        add_process(line);
        add_devices(line, None);
    });
    for section in [
        "api_server",
        "get_api_requests",
        "put_api_requests",
        "patch_api_requests",
        "deprecated_api",
        "latencies_us",
        "logger",
        "vcpu",
        "vmm",
        "i8042",
        "uart",
    ] {
        assert!(line[section].is_object(), "{section}: {line:#}");
    }
    for field in [
        "actions_count",
        "actions_fails",
        "boot_source_count",
        "drive_fails",
        "machine_cfg_count",
        "metrics_count",
    ] {
        assert!(line["put_api_requests"][field].is_u64(), "{field}");
    }
    assert!(line["latencies_us"]["vmm_load_snapshot"].is_u64());
    assert!(line["vcpu"]["exit_mmio_write_agg"]["max_us"].is_u64());
    assert!(line["i8042"]["reset_count"].is_u64());
    assert!(line.get("block").is_none(), "no drives, no block section");
}
