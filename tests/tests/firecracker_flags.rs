//! End-to-end: Firecracker's command line. A VMM started with every flag of Firecracker's
//! that a client library may pass serves the API, with what those flags set: the logger and
//! the metrics from the start, the MMDS's document, the API's body limit and the MMDS store's; the snapshot format
//! flags print versions as Firecracker's do; `--no-api` needs `--config-file`. Without
//! `--api-sock` the API is on Firecracker's default socket, and `--no-api` serves none even with
//! `--api-sock`.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::time::{Duration, Instant};

use e2e_tests::{ctrl_alt_del_guest_files, kvm_available};
use vmm_common::{client, send, Scratch, VmmRun};

/// Waits (at most 10 s) until `path` holds text that `accept` takes; returns it.
fn wait_for_file(path: &str, accept: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if accept(&text) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_flag_a_firecracker_client_passes_is_taken_with_its_meaning() {
    let scratch = Scratch::new("firecracker-flags");
    let (socket, log, metrics, metadata) = (
        scratch.path("api.sock"),
        scratch.path("fc.log"),
        scratch.path("fc.metrics"),
        scratch.path("metadata.json"),
    );
    std::fs::write(&metadata, r#"{"latest":{"meta-data":{"ami-id":"ami-1"}}}"#).unwrap();
    let mut vmm = VmmRun::start_command(&[
        "--api-sock",
        &socket,
        "--id",
        "flags-test",
        "--log-path",
        &log,
        "--level",
        "debug",
        "--show-level",
        "--show-log-origin",
        "--metrics-path",
        &metrics,
        "--boot-timer",
        "--http-api-max-payload-size",
        "2000",
        "--mmds-size-limit",
        "1000",
        "--enable-pci",
        "--metadata",
        &metadata,
        "--start-time-us",
        "1",
        "--start-time-cpu-us",
        "1",
    ]);
    let api = vmm.api(&socket);
    // The logger writes Firecracker's lines into the file: the instance id, the level, the
    // origin.
    let logged = wait_for_file(&log, |text| text.contains("[flags-test]"));
    assert!(logged.contains("[flags-test]"), "{logged}");
    assert!(
        logged.contains("INFO") || logged.contains("DEBUG"),
        "{logged}"
    );
    assert!(logged.contains(".rs:"), "no origin: {logged}");
    // The metrics go to their file on a flush.
    send(&api, "PUT", "/actions", r#"{"action_type":"FlushMetrics"}"#);
    let flushed = wait_for_file(&metrics, |text| text.contains("\"api_server\""));
    assert!(flushed.contains("\"api_server\""), "{flushed}");
    // The MMDS holds the --metadata document.
    let mmds = vmm_common::get(&api, "/mmds");
    assert_eq!(mmds["latest"]["meta-data"]["ami-id"], "ami-1", "{mmds}");
    // Bodies over the API's limit are refused, and documents over the MMDS store's.
    let big = format!(r#"{{"k":"{}"}}"#, "x".repeat(3000));
    let refused = api.request("PUT", "/mmds", Some(&big)).unwrap();
    assert!(
        refused.status == 413 || refused.status == 400,
        "{}: {}",
        refused.status,
        refused.body
    );
    assert!(refused.body.contains("2000"), "{}", refused.body);
    let over_store = format!(r#"{{"k":"{}"}}"#, "x".repeat(1500));
    let refused = api.request("PUT", "/mmds", Some(&over_store)).unwrap();
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.body.contains("1000"), "{}", refused.body);
    send(&api, "PUT", "/mmds", r#"{"k":"small"}"#);
    let stderr = vmm.stderr_so_far();
    assert!(
        stderr.contains("--boot-timer") && stderr.contains("--enable-pci"),
        "{stderr}"
    );
    let ended = vmm.kill();
    assert_eq!(ended.code, None, "{ended:#?}");
}

#[test]
fn the_snapshot_format_flags_print_versions_and_no_api_needs_a_config_file() {
    let version = client(&["--snapshot-version"]);
    assert_eq!(version.code, Some(0), "{version:#?}");
    assert!(version.stdout.trim().starts_with('v'), "{version:#?}");
    let scratch = Scratch::new("firecracker-flags-snapshot");
    let not_a_snapshot = scratch.path("not.snap");
    std::fs::write(&not_a_snapshot, b"hello").unwrap();
    let refused = client(&["--describe-snapshot", &not_a_snapshot]);
    assert_eq!(refused.code, Some(2), "{refused:#?}");
    assert!(refused.stderr.contains("not.snap"), "{refused:#?}");
    let no_api = client(&["--no-api"]);
    assert_eq!(no_api.code, Some(2), "{no_api:#?}");
    assert!(no_api.stderr.contains("--config-file"), "{no_api:#?}");
    if !kvm_available("describe_snapshot") {
        return;
    }
    let (snapshot, memory, socket) = (
        scratch.path("vm.snap"),
        scratch.path("vm.mem"),
        scratch.path("api.sock"),
    );
    let args = ["--memory", "32M", "--workload", "write:all,checkpoint:1"];
    let (vm, api) = VmmRun::start_paused(&args, &socket);
    let body = format!(r#"{{"snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#);
    send(&api, "PUT", "/snapshot/create", &body);
    vm.kill();
    let described = client(&["--describe-snapshot", &snapshot]);
    assert_eq!(described.code, Some(0), "{described:#?}");
    assert_eq!(described.stdout, version.stdout, "{described:#?}");
}

#[test]
fn the_api_defaults_to_firecrackers_socket_and_no_api_serves_none() {
    let test = "the_api_defaults_to_firecrackers_socket_and_no_api_serves_none";
    if !kvm_available(test) {
        return;
    }
    let default = vmm_cli::DEFAULT_API_SOCK;
    if std::path::Path::new(default).exists() {
        eprintln!("SKIP: {test}: {default} exists (another VMM of Firecracker's kind?)");
        return;
    }
    // Any flag but a subcommand: the API is on Firecracker's default socket.
    let mut vmm = VmmRun::start_command(&["--id", "default-socket"]);
    let api = vmm.api(default);
    assert_eq!(vmm_common::get(&api, "/")["id"], "default-socket");
    drop(api);
    vmm.kill();
    let _ = std::fs::remove_file(default);

    // --no-api: a configuration file boots the guest, and no socket is served, not even the
    // one --api-sock names.
    let scratch = Scratch::new("firecracker-flags-no-api");
    let (kernel, ..) = ctrl_alt_del_guest_files(&scratch, "initrd\n");
    let (socket, file) = (scratch.path("api.sock"), scratch.path("vm.json"));
    let config = format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}", "boot_args": "console=ttyS0"}},
            "machine-config": {{"vcpu_count": 1, "mem_size_mib": 32}}}}"#
    );
    std::fs::write(&file, config).unwrap();
    let mut vmm =
        VmmRun::start_command(&["--no-api", "--api-sock", &socket, "--config-file", &file]);
    vmm.wait_for_line("console=ttyS0", Duration::from_secs(60));
    assert!(vmm.running(), "{}", vmm.stderr_so_far());
    assert!(!std::path::Path::new(&socket).exists());
    assert!(!std::path::Path::new(default).exists());
    vmm.kill();
}
