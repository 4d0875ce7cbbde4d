//! End-to-end: the VMM started as Firecracker is (`vmm --api-sock PATH --id ID`), configured and
//! booted through Firecracker's API: the curl sequence of Firecracker's getting-started guide
//! (logger, boot source with an initrd, a root drive, machine, metrics, InstanceStart, then
//! SendCtrlAltDel), Firecracker's answers to bad input before and after the start, and
//! `--config-file`. The guest is a minimal ELF kernel (`e2e_tests::CTRL_ALT_DEL_GUEST`): it prints its
//! command line and initrd and reboots on Ctrl-Alt-Del.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::process::Command;
use std::time::Duration;

use e2e_tests::{ctrl_alt_del_guest_files, kvm_available, private_network, tool_available};
use serde_json::{json, Value};
use vmm_cli::ApiClient;
use vmm_common::{get, send, Scratch, VmmRun};

const TIMEOUT: Duration = Duration::from_secs(60);
const INITRD: &str = "initrd: llfree-vmm\n";
const NOT_AFTER_START: &str =
    "The requested operation is not supported after starting the microVM.";
const NOT_BEFORE_START: &str =
    "The requested operation is not supported before starting the microVM.";

/// The guest's kernel, initrd and root drive in `scratch`.
fn guest_files(scratch: &Scratch) -> (String, String, String) {
    ctrl_alt_del_guest_files(scratch, INITRD)
}

/// `curl --unix-socket SOCKET -X METHOD [-d BODY] http://localhost/PATH`: status and body.
fn curl(socket: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut command = Command::new("curl");
    command.args([
        "-sS",
        "--unix-socket",
        socket,
        "-X",
        method,
        "-H",
        "Accept: application/json",
        "-H",
        "Content-Type: application/json",
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(body) = body {
        command.args(["-d", &body.to_string()]);
    }
    let output = command
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), body.to_owned())
}

#[test]
fn the_getting_started_curl_sequence_boots_the_guest_and_ctrl_alt_del_ends_it() {
    let test = "the_getting_started_curl_sequence";
    if !kvm_available(test) || !tool_available(test, "curl", "--version") {
        return;
    }
    let scratch = Scratch::new("fc-guide");
    let (kernel, initrd, rootfs) = guest_files(&scratch);
    let (socket, log, metrics) = (
        scratch.path("firecracker.socket"),
        scratch.path("firecracker.log"),
        scratch.path("metrics.json"),
    );
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket, "--id", "guide_vm"]);
    let api = vmm.api(&socket);
    // Before PUT /machine-config: Firecracker's defaults.
    let defaults = get(&api, "/machine-config");
    assert_eq!(
        (&defaults["vcpu_count"], &defaults["mem_size_mib"]),
        (&json!(1), &json!(128))
    );
    assert_eq!(get(&api, "/")["state"], "Not started");
    // curl asking for two resources sends both on one connection, which the API keeps.
    let both = Command::new("curl")
        .args(["-sv", "--unix-socket", &socket])
        .args([
            "http://localhost/version",
            "http://localhost/machine-config",
        ])
        .output()
        .expect("run curl");
    let (out, err) = (
        String::from_utf8_lossy(&both.stdout),
        String::from_utf8_lossy(&both.stderr),
    );
    assert!(
        out.contains("firecracker_version") && out.contains("vcpu_count"),
        "{out}"
    );
    assert!(
        err.contains("Re-using existing connection") && !err.contains("Connection: close"),
        "{err}"
    );
    let put = |path: &str, body: Value| {
        let (status, answer) = curl(&socket, "PUT", path, Some(&body));
        assert_eq!(status, 204, "PUT {path}: {answer}");
    };
    put(
        "/logger",
        json!({"log_path": log, "level": "Debug", "show_level": true, "show_log_origin": true}),
    );
    put(
        "/boot-source",
        json!({"kernel_image_path": kernel, "initrd_path": initrd,
               "boot_args": "console=ttyS0 reboot=k panic=1 pci=off"}),
    );
    put(
        "/drives/rootfs",
        json!({"drive_id": "rootfs", "path_on_host": rootfs, "is_root_device": true,
               "is_read_only": false}),
    );
    put(
        "/machine-config",
        // Any number of MiB, as Firecracker takes it.
        json!({"vcpu_count": 2, "mem_size_mib": 65}),
    );
    put("/metrics", json!({"metrics_path": metrics}));
    put("/actions", json!({"action_type": "InstanceStart"}));

    // The kernel got its command line (with its root drive and virtio-blk device) and initrd;
    // every console line says whose it is (`--id`).
    vmm.wait_for_line(INITRD.trim(), TIMEOUT);
    let console = vmm.stdout_so_far();
    assert!(
        console.starts_with(
            "[guide_vm] console=ttyS0 reboot=k panic=1 pci=off root=/dev/vda rw \
             virtio_mmio.device=4K@0xc0000000:5\n"
        ),
        "{console}"
    );
    let info = get(&api, "/");
    assert_eq!(
        (&info["app_name"], &info["id"], &info["state"]),
        (&json!("llfree-vmm"), &json!("guide_vm"), &json!("Running"))
    );
    let config = get(&api, "/vm/config");
    assert_eq!(config["drives"][0]["drive_id"], "rootfs");
    assert_eq!(config["drives"][0]["is_root_device"], true);
    assert_eq!(config["machine-config"]["vcpu_count"], 2);
    assert_eq!(config["boot-source"]["initrd_path"], json!(initrd));
    assert_eq!(config["logger"]["level"], "Debug");
    assert_eq!(config["metrics"]["metrics_path"], json!(metrics));
    assert_eq!(get(&api, "/machine-config")["mem_size_mib"], 65);
    // FlushMetrics writes a line in Firecracker's schema: what happened since the last line
    // (here: since the start), with the drive's counters, ours under "llfree".
    put("/actions", json!({"action_type": "FlushMetrics"}));
    let last_line = || -> Value {
        let lines = std::fs::read_to_string(&metrics).unwrap();
        serde_json::from_str(lines.lines().last().unwrap()).unwrap()
    };
    let line = last_line();
    assert_eq!(line["llfree"]["state"], "Running");
    assert!(line["utc_timestamp_ms"].as_u64().unwrap() > 0);
    let put_requests = &line["put_api_requests"];
    for (field, count) in [
        ("boot_source_count", 1),
        ("drive_count", 1),
        ("machine_cfg_count", 1),
        ("metrics_count", 1),
        ("logger_count", 1),
        // InstanceStart; the FlushMetrics that writes the line is counted in the next.
        ("actions_count", 1),
        ("drive_fails", 0),
    ] {
        assert_eq!(put_requests[field], count, "{field}: {line:#}");
    }
    // GET / twice (before and after the start), GET /machine-config three times.
    assert_eq!(line["get_api_requests"]["instance_info_count"], 2);
    assert_eq!(line["get_api_requests"]["machine_cfg_count"], 3);
    assert_eq!(line["get_api_requests"]["vmm_version_count"], 1);
    assert_eq!(line["block_rootfs"]["execute_fails"], 0);
    assert_eq!(
        line["block_rootfs"]["read_count"], 0,
        "this guest reads no drive"
    );
    assert_eq!(
        line["block"]["read_count"],
        line["block_rootfs"]["read_count"]
    );
    assert!(
        line["vcpu"]["exit_io_out"].as_u64().unwrap() > 0,
        "the serial console"
    );
    assert!(line["uart"]["write_count"].as_u64().unwrap() > 0);
    assert!(
        line["api_server"]["process_startup_time_us"]
            .as_u64()
            .unwrap()
            > 0
    );
    put("/actions", json!({"action_type": "FlushMetrics"}));
    let line = last_line();
    assert_eq!(line["put_api_requests"]["boot_source_count"], 0, "{line:#}");
    assert_eq!(
        line["put_api_requests"]["actions_count"], 1,
        "the first flush"
    );
    // The log went to the file, with levels.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("INFO") || logged.contains("DEBUG"),
        "{logged}"
    );
    // Every line starts with a UTC timestamp and the instance id; API requests are logged.
    let first = logged.lines().next().unwrap_or_default();
    let (stamp, rest) = first.split_once(' ').unwrap_or_default();
    assert!(
        stamp.len() == 24 && stamp.as_bytes()[10] == b'T' && stamp.ends_with('Z'),
        "{first}"
    );
    assert!(rest.starts_with("[guide_vm] "), "{first}");
    assert!(
        logged
            .lines()
            .any(|line| line.contains("API: PUT /boot-source: 204 in ")),
        "{logged}"
    );

    put("/actions", json!({"action_type": "SendCtrlAltDel"}));
    let run = vmm.wait(TIMEOUT);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(
        run.stderr
            .contains("the guest reset the VM through the i8042 keyboard controller"),
        "{run:#?}"
    );
}

/// Boots the guest files' kernel (`console=ttyS0`) through `api` of `vmm` and waits until it
/// printed its command line, which must name one virtio-mmio device: the guest is told of a
/// device as of every virtio-mmio one.
fn boot_with_one_virtio_device(api: &ApiClient, vmm: &mut VmmRun, kernel: &str, initrd: &str) {
    let boot_source = json!({"kernel_image_path": kernel, "initrd_path": initrd,
                             "boot_args": "console=ttyS0"});
    send(api, "PUT", "/boot-source", &boot_source.to_string());
    send(api, "PUT", "/actions", r#"{"action_type":"InstanceStart"}"#);
    vmm.wait_for_line(INITRD.trim(), TIMEOUT);
    let console = vmm.stdout_so_far();
    assert!(
        console.starts_with("console=ttyS0 virtio_mmio.device=4K@0xc0000000:5\n"),
        "{console}"
    );
}

/// Sends `method path body` and expects Firecracker's 400 with `message` in its fault.
fn refused(api: &ApiClient, method: &str, path: &str, body: Option<&str>, message: &str) {
    let response = api.request(method, path, body).unwrap();
    assert_eq!(response.status, 400, "{method} {path}: {}", response.body);
    let fault = response.fault_message().unwrap();
    assert!(fault.contains(message), "{method} {path}: {fault}");
}

#[test]
fn bad_input_before_and_after_the_start_gets_firecrackers_answers() {
    let test = "bad_input_before_and_after_the_start";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("fc-errors");
    let (kernel, _, rootfs) = guest_files(&scratch);
    let socket = scratch.path("api.sock");
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let boot = format!(r#"{{"kernel_image_path":"{kernel}"}}"#);
    let drive = format!(
        r#"{{"drive_id":"rootfs","path_on_host":"{rootfs}","is_root_device":true,"is_read_only":true}}"#
    );
    // Before the start: what needs a VM, a start without a kernel, bad values and fields.
    for (method, path, body, message) in [
        (
            "PATCH",
            "/vm",
            Some(r#"{"state":"Paused"}"#),
            NOT_BEFORE_START,
        ),
        ("GET", "/balloon/statistics", None, NOT_BEFORE_START),
        (
            "PUT",
            "/actions",
            Some(r#"{"action_type":"SendCtrlAltDel"}"#),
            NOT_BEFORE_START,
        ),
        (
            "PUT",
            "/snapshot/create",
            Some(r#"{"snapshot_path":"/s","mem_file_path":"/m"}"#),
            NOT_BEFORE_START,
        ),
        ("GET", "/balloon", None, "balloon not configured"),
        (
            "PUT",
            "/actions",
            Some(r#"{"action_type":"InstanceStart"}"#),
            "Missing kernel configuration",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":0,"mem_size_mib":64}"#),
            "vcpus 0",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":1,"mem_size_mib":0}"#),
            "memory 0 bytes",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":1,"mem_size_mib":65,"huge_pages":"2M"}"#),
            "The memory size (MiB) is either 0, or not a multiple of the configured page size.",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":3,"mem_size_mib":64,"smt":true}"#),
            "The vCPU number can only be 1 or an even number when hyperthreading is enabled.",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":1}"#),
            "missing field `mem_size_mib`",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":1,"mem_size_mib":64,"x":1}"#),
            "unknown field `x`",
        ),
        (
            "PATCH",
            "/machine-config",
            Some("{}"),
            "Empty PATCH request.",
        ),
        (
            "PUT",
            "/boot-source",
            Some(r#"{"kernel_image_path":"/no/such/kernel"}"#),
            "kernel /no/such/kernel",
        ),
        (
            "PUT",
            "/drives/other",
            Some(drive.as_str()),
            "does not match the id from the body",
        ),
        (
            "PUT",
            "/drives/rootfs",
            Some(
                r#"{"drive_id":"rootfs","is_root_device":false,"path_on_host":"/nope","is_read_only":false}"#,
            ),
            "/nope",
        ),
        (
            "PUT",
            "/balloon",
            Some(r#"{"amount_mib":512,"deflate_on_oom":false}"#),
            "too large",
        ),
        (
            "PUT",
            "/balloon",
            Some(r#"{"amount_mib":8}"#),
            "missing field `deflate_on_oom`",
        ),
        (
            "PUT",
            "/logger",
            Some(r#"{"level":"Loud"}"#),
            "unknown log level",
        ),
        (
            "PUT",
            "/metrics",
            Some(r#"{"metrics_path":"/no/such/dir/m"}"#),
            "Metrics error",
        ),
        (
            "PUT",
            "/metrics",
            Some(r#"{"metrics_path":"/dev/null"}"#),
            "metrics_path /dev/null: a character device, not a regular file",
        ),
        (
            "PUT",
            "/pmem/pmem0",
            Some(r#"{"id":"pmem0","path_on_host":"/z","size_mib":2}"#),
            "zone",
        ),
        (
            "DELETE",
            "/drives/rootfs",
            None,
            "Invalid request method and/or path: DELETE /drives/rootfs.",
        ),
        (
            "PATCH",
            "/drives/rootfs",
            Some(r#"{"drive_id":"rootfs","path_on_host":"/tmp"}"#),
            NOT_BEFORE_START,
        ),
        (
            "PATCH",
            "/pmem/pmem0",
            Some(r#"{"id":"pmem0"}"#),
            NOT_BEFORE_START,
        ),
    ] {
        refused(&api, method, path, body, message);
    }
    // Every resource: a method it does not take, and a field it does not know.
    for (path, wrong_method) in [
        ("/", "PUT"),
        ("/version", "PATCH"),
        ("/machine-config", "DELETE"),
        ("/boot-source", "GET"),
        ("/drives/rootfs", "GET"),
        ("/pmem/pmem0", "GET"),
        ("/logger", "GET"),
        ("/metrics", "PATCH"),
        ("/actions", "GET"),
        ("/vm", "PUT"),
        ("/vm/config", "PUT"),
        ("/balloon/hinting/status", "PATCH"),
        ("/balloon/hinting/start", "GET"),
        ("/snapshot/create", "PATCH"),
        ("/snapshot/load", "GET"),
        ("/network-interfaces/eth0", "GET"),
        ("/vsock", "GET"),
        ("/mmds", "DELETE"),
    ] {
        let body = (wrong_method != "GET").then_some("{}");
        let expected = format!("Invalid request method and/or path: {wrong_method} {path}.");
        refused(&api, wrong_method, path, body, &expected);
    }
    // Firecracker routes these on their first segment: PUT /balloon/statistics is PUT
    // /balloon, GET /mmds/config is GET /mmds.
    refused(
        &api,
        "PUT",
        "/balloon/statistics",
        Some("{}"),
        "missing field `amount_mib`",
    );
    let mmds = api.request("GET", "/mmds/config", None).unwrap();
    assert!(
        !mmds.body.contains("Invalid request method and/or path"),
        "{}",
        mmds.body
    );
    for (method, path) in [
        ("PUT", "/machine-config"),
        ("PATCH", "/machine-config"),
        ("PUT", "/boot-source"),
        ("PUT", "/drives/rootfs"),
        ("PATCH", "/drives/rootfs"),
        ("PUT", "/pmem/pmem0"),
        ("PATCH", "/pmem/pmem0"),
        ("PUT", "/logger"),
        ("PUT", "/metrics"),
        ("PUT", "/actions"),
        ("PATCH", "/vm"),
        ("PUT", "/balloon"),
        ("PATCH", "/balloon"),
        ("PATCH", "/balloon/statistics"),
        ("PUT", "/snapshot/create"),
        ("PUT", "/snapshot/load"),
        ("PUT", "/network-interfaces/eth0"),
        ("PATCH", "/network-interfaces/eth0"),
        ("PUT", "/vsock"),
        ("PUT", "/mmds/config"),
    ] {
        refused(
            &api,
            method,
            path,
            Some(r#"{"bogus":1}"#),
            "unknown field `bogus`",
        );
    }
    // Configured, a snapshot is not loaded any more; the machine keeps its last good values.
    send(
        &api,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count":1,"mem_size_mib":32}"#,
    );
    send(&api, "PATCH", "/machine-config", r#"{"mem_size_mib":64}"#);
    send(&api, "PUT", "/boot-source", &boot);
    send(&api, "PUT", "/drives/rootfs", &drive);
    send(
        &api,
        "PUT",
        "/balloon",
        r#"{"amount_mib":8,"deflate_on_oom":true}"#,
    );
    // As Firecracker's: a balloon is updated once the VM runs.
    for (path, body) in [
        ("/balloon", r#"{"amount_mib":16}"#),
        ("/balloon/statistics", r#"{"stats_polling_interval_s":1}"#),
    ] {
        refused(&api, "PATCH", path, Some(body), NOT_BEFORE_START);
    }
    assert_eq!(get(&api, "/balloon")["amount_mib"], 8);
    assert_eq!(get(&api, "/machine-config")["mem_size_mib"], 64);
    let load =
        r#"{"snapshot_path":"/s","mem_backend":{"backend_type":"File","backend_path":"/m"}}"#;
    refused(
        &api,
        "PUT",
        "/snapshot/load",
        Some(load),
        "not allowed after configuring",
    );
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"InstanceStart"}"#,
    );
    // No initrd: the kernel prints its command line and waits.
    vmm.wait_for_line("root=/dev/vda ro", TIMEOUT);

    // After the start: every pre-boot request is refused, statistics stay off.
    for (method, path, body) in [
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":1,"mem_size_mib":64}"#),
        ),
        ("PATCH", "/machine-config", Some(r#"{"mem_size_mib":32}"#)),
        ("PUT", "/boot-source", Some(boot.as_str())),
        ("PUT", "/drives/rootfs", Some(drive.as_str())),
        (
            "PUT",
            "/balloon",
            Some(r#"{"amount_mib":8,"deflate_on_oom":true}"#),
        ),
        ("PUT", "/logger", Some(r#"{"level":"Info"}"#)),
        ("PUT", "/metrics", Some(r#"{"metrics_path":"/tmp/m"}"#)),
        (
            "PUT",
            "/actions",
            Some(r#"{"action_type":"InstanceStart"}"#),
        ),
        ("PUT", "/snapshot/load", Some(load)),
    ] {
        refused(&api, method, path, body, NOT_AFTER_START);
    }
    refused(
        &api,
        "GET",
        "/balloon/statistics",
        None,
        "stats are disabled",
    );
    refused(
        &api,
        "PATCH",
        "/balloon/statistics",
        Some(r#"{"stats_polling_interval_s":1}"#),
        "cannot be enabled/disabled",
    );
    refused(
        &api,
        "PATCH",
        "/balloon",
        Some(r#"{"amount_mib":65}"#),
        "exceeds",
    );
    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    assert_eq!(get(&api, "/")["state"], "Paused");
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    assert_eq!(vmm.wait(TIMEOUT).code, Some(0));
}

#[test]
fn a_config_file_boots_at_once() {
    let test = "a_config_file_boots_at_once";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("fc-config-file");
    let (kernel, initrd, rootfs) = guest_files(&scratch);
    let (socket, file) = (scratch.path("api.sock"), scratch.path("vm.json"));
    let metrics = scratch.path("metrics.json");
    let config = json!({
        "metrics": {"metrics_path": metrics},
        "boot-source": {"kernel_image_path": kernel, "initrd_path": initrd,
                        "boot_args": "console=ttyS0 -- init"},
        "drives": [{"drive_id": "data", "path_on_host": rootfs, "is_root_device": false,
                    "is_read_only": true, "io_engine": "Async",
                    "rate_limiter": {"ops": {"size": 1000, "refill_time": 1000}}}],
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 32, "huge_pages": "None"},
        "balloon": {"amount_mib": 4, "deflate_on_oom": false, "stats_polling_interval_s": 1,
                    "free_page_hinting": true},
        "network-interfaces": []
    });
    std::fs::write(&file, config.to_string()).unwrap();
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket, "--config-file", &file]);
    vmm.wait_for_line(INITRD.trim(), TIMEOUT);
    // The balloon and the drive take their slots; init arguments stay last.
    assert!(
        vmm.stdout_so_far().starts_with(
            "console=ttyS0 virtio_mmio.device=4K@0xc0000000:5 \
             virtio_mmio.device=4K@0xc0001000:6 -- init\n"
        ),
        "{}",
        vmm.stdout_so_far()
    );
    let api = vmm.api(&socket);
    let shown = get(&api, "/vm/config");
    assert_eq!(shown["balloon"]["amount_mib"], 4);
    assert_eq!(shown["drives"][0]["is_read_only"], true);
    // Its io_uring was set up under the VMM's seccomp filter.
    assert_eq!(shown["drives"][0]["io_engine"], "Async");
    assert_eq!(
        shown["drives"][0]["rate_limiter"]["ops"]["size"], 1000,
        "{shown:#}"
    );
    assert_eq!(get(&api, "/balloon/statistics")["target_mib"], 4);
    // Free page hinting is on, but the test guest's driver does not take part: a run cannot
    // start (Linux's can: tests/tests/linux_balloon.rs).
    assert_eq!(get(&api, "/balloon")["free_page_hinting"], true);
    assert_eq!(get(&api, "/balloon/hinting/status"), json!({"host_cmd": 0}));
    for path in ["/balloon/hinting/start", "/balloon/hinting/stop"] {
        refused(
            &api,
            "PATCH",
            path,
            None,
            "not running with free page hinting",
        );
    }
    refused(
        &api,
        "PATCH",
        "/balloon/hinting/start",
        Some(r#"{"acknowledge_on_stop":"yes"}"#),
        "expected a boolean",
    );
    // Another image for the drive (a media change), and another limiter; what cannot be an
    // image (a named pipe, a directory), or a drive the VM does not have, is refused.
    let media = scratch.path("media.img");
    std::fs::write(&media, vec![0x5a; 1 << 20]).unwrap();
    let fifo = scratch.path("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for (path, body, message) in [
        (
            "/drives/data",
            json!({"drive_id": "data", "path_on_host": fifo}),
            "neither a regular file nor a block device",
        ),
        (
            "/drives/data",
            json!({"drive_id": "data", "path_on_host": scratch.path("")}),
            "neither a regular file nor a block device",
        ),
        (
            "/drives/other",
            json!({"drive_id": "other", "path_on_host": media}),
            "Invalid block ID: other",
        ),
        (
            "/drives/data",
            json!({"drive_id": "other"}),
            "does not match",
        ),
        (
            "/pmem/pmem0",
            json!({"id": "pmem0", "rate_limiter": {}}),
            "Invalid pmem ID: pmem0",
        ),
    ] {
        refused(&api, "PATCH", path, Some(&body.to_string()), message);
    }
    send(
        &api,
        "PATCH",
        "/drives/data",
        &json!({"drive_id": "data", "path_on_host": media,
                "rate_limiter": {"bandwidth": {"size": 1048576, "refill_time": 100}}})
        .to_string(),
    );
    let shown = get(&api, "/vm/config");
    assert_eq!(
        shown["drives"][0]["path_on_host"],
        json!(media),
        "{shown:#}"
    );
    assert_eq!(
        shown["drives"][0]["rate_limiter"],
        json!({"bandwidth": {"size": 1048576, "one_time_burst": null, "refill_time": 100},
               "ops": null}),
        "{shown:#}"
    );
    // The metrics have the balloon's and the drive's sections.
    send(&api, "PUT", "/actions", r#"{"action_type":"FlushMetrics"}"#);
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let line: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert!(line["balloon"]["inflate_count"].is_u64(), "{line:#}");
    assert_eq!(line["block_data"]["execute_fails"], 0, "{line:#}");
    assert_eq!(
        line["block_data"]["rate_limiter_throttled_events"], 0,
        "{line:#}"
    );
    assert_eq!(line["llfree"]["balloon"]["target_mib"], 4, "{line:#}");
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    assert_eq!(vmm.wait(TIMEOUT).code, Some(0));

    // A file with what this host cannot have (an aarch64 CPU template), or bad JSON, is
    // refused with status 2 or 1.
    std::fs::write(
        &file,
        r#"{"cpu-config": {"vcpu_features": [{"index": 0, "bitmap": "0b1"}]}}"#,
    )
    .unwrap();
    let run = VmmRun::start_command(&["--no-api", "--config-file", &file]).wait(TIMEOUT);
    assert!(run.stderr.contains("aarch64"), "{run:#?}");
    assert_ne!(run.code, Some(0));
    std::fs::write(&file, "{").unwrap();
    let run = VmmRun::start_command(&["--no-api", "--config-file", &file]).wait(TIMEOUT);
    run.assert_fails(2, "--config-file");
}

#[test]
fn metrics_go_to_a_pipe_without_waiting_and_are_written_every_minute() {
    let test = "metrics_go_to_a_pipe_without_waiting_and_are_written_every_minute";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("fc-metrics");
    let (socket, fifo) = (scratch.path("api.sock"), scratch.path("metrics.fifo"));
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    // Nobody reads the pipe yet: configuring and flushing neither wait nor fail.
    send(
        &api,
        "PUT",
        "/metrics",
        &json!({ "metrics_path": fifo }).to_string(),
    );
    let started = std::time::Instant::now();
    send(&api, "PUT", "/actions", r#"{"action_type":"FlushMetrics"}"#);
    let mut pipe = std::io::BufReader::new(std::fs::File::open(&fifo).unwrap());
    let mut read_line = || {
        let mut text = String::new();
        std::io::BufRead::read_line(&mut pipe, &mut text).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()
    };
    let first = read_line();
    assert_eq!(first["llfree"]["state"], "Not started");
    assert_eq!(first["put_api_requests"]["metrics_count"], 1, "{first:#}");
    // The next line comes by itself, a minute after the VMM started.
    let second = read_line();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(50) && waited < Duration::from_secs(180),
        "the periodic line came after {waited:?}"
    );
    assert_eq!(second["put_api_requests"]["metrics_count"], 0, "{second:#}");
    assert_eq!(second["put_api_requests"]["actions_count"], 1, "the flush");
    eprintln!("{test}: the periodic line came {waited:.1?} after the first");
    // Metrics are configured once.
    let again = api
        .request(
            "PUT",
            "/metrics",
            Some(&json!({ "metrics_path": fifo }).to_string()),
        )
        .unwrap();
    assert_eq!(again.status, 400);
    assert!(
        again
            .body
            .contains("Reinitialization of metrics not allowed"),
        "{}",
        again.body
    );
    send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    vmm.wait(TIMEOUT);
}

#[test]
fn metrics_come_at_the_interval_asked_for() {
    let test = "metrics_come_at_the_interval_asked_for";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("fc-metrics-interval");
    let (socket, file) = (scratch.path("api.sock"), scratch.path("metrics.json"));
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    // Out of range: refused, and nothing is configured.
    let refused = api
        .request(
            "PUT",
            "/metrics",
            Some(&json!({ "metrics_path": file, "flush_interval_ms": 10 }).to_string()),
        )
        .unwrap();
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused.body.contains("flush_interval_ms 10"),
        "{}",
        refused.body
    );
    send(
        &api,
        "PUT",
        "/metrics",
        &json!({ "metrics_path": file, "flush_interval_ms": 200 }).to_string(),
    );
    // Lines come by themselves, long before Firecracker's minute.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let lines = loop {
        let lines = std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .count();
        if lines >= 3 || std::time::Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(lines >= 3, "{lines} lines in 30 s at 200 ms");
    send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    vmm.wait(TIMEOUT);
}

#[test]
fn an_entropy_device_is_configured_as_firecracker_configures_one() {
    let test = "an_entropy_device_is_configured_as_firecracker_configures_one";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("fc-entropy");
    let (kernel, initrd, _) = guest_files(&scratch);
    let socket = scratch.path("api.sock");
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    // A malformed rate limiter is refused; a good one is kept, as the configuration shows.
    let malformed = api
        .request(
            "PUT",
            "/entropy",
            Some(r#"{"rate_limiter":{"bandwidth":{"size":1000}}}"#),
        )
        .unwrap();
    assert_eq!(malformed.status, 400);
    assert!(malformed.body.contains("refill_time"), "{}", malformed.body);
    let limiter = json!({"bandwidth": {"size": 1000, "one_time_burst": null, "refill_time": 100},
                         "ops": null});
    send(
        &api,
        "PUT",
        "/entropy",
        &json!({ "rate_limiter": limiter }).to_string(),
    );
    let boot_source = json!({"kernel_image_path": kernel, "initrd_path": initrd,
                             "boot_args": "console=ttyS0"});
    send(&api, "PUT", "/boot-source", &boot_source.to_string());
    assert_eq!(
        get(&api, "/vm/config")["entropy"],
        json!({ "rate_limiter": limiter })
    );
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"InstanceStart"}"#,
    );
    // The guest is told of the device as of every virtio-mmio one.
    vmm.wait_for_line(INITRD.trim(), TIMEOUT);
    let console = vmm.stdout_so_far();
    assert!(
        console.starts_with("console=ttyS0 virtio_mmio.device=4K@0xc0000000:5\n"),
        "{console}"
    );
    let flushed = api
        .request(
            "PUT",
            "/actions",
            Some(r#"{"action_type":"SendCtrlAltDel"}"#),
        )
        .unwrap();
    assert_eq!(flushed.status, 204);
    assert_eq!(vmm.wait(TIMEOUT).code, Some(0));
}

#[test]
fn a_network_interface_is_configured_patched_and_counted_as_firecracker_s() {
    let test = "a_network_interface_is_configured_patched_and_counted_as_firecracker_s";
    if !kvm_available(test) || !private_network(test, &["tap0"]) {
        return;
    }
    let scratch = Scratch::new("fc-net");
    let (kernel, initrd, _) = guest_files(&scratch);
    let (socket, metrics) = (scratch.path("api.sock"), scratch.path("metrics.json"));
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let interface = json!({"iface_id": "eth0", "host_dev_name": "tap0",
                           "guest_mac": "06:00:ac:10:00:02",
                           "rx_rate_limiter": {"bandwidth": {"size": 1048576, "refill_time": 100}}});
    for (path, body, message) in [
        (
            "/network-interfaces/eth1",
            interface.to_string(),
            "does not match",
        ),
        (
            "/network-interfaces/eth0",
            json!({"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:ac"})
                .to_string(),
            "MAC address",
        ),
        (
            "/network-interfaces/eth0",
            json!({"iface_id": "eth0", "host_dev_name": "../tap0"}).to_string(),
            "not an interface name",
        ),
        (
            "/network-interfaces/eth0",
            json!({"iface_id": "eth0", "host_dev_name": "tap0", "mtu": 40}).to_string(),
            "mtu 40",
        ),
    ] {
        refused(&api, "PUT", path, Some(&body), message);
    }
    refused(
        &api,
        "PATCH",
        "/network-interfaces/eth0",
        Some(r#"{"iface_id":"eth0"}"#),
        NOT_BEFORE_START,
    );
    send(
        &api,
        "PUT",
        "/network-interfaces/eth0",
        &interface.to_string(),
    );
    send(
        &api,
        "PUT",
        "/metrics",
        &json!({ "metrics_path": metrics }).to_string(),
    );
    boot_with_one_virtio_device(&api, &mut vmm, &kernel, &initrd);
    let shown = get(&api, "/vm/config");
    let mut expected = interface.clone();
    expected["rx_rate_limiter"]["bandwidth"]["one_time_burst"] = Value::Null;
    expected["rx_rate_limiter"]["ops"] = Value::Null;
    assert_eq!(shown["network-interfaces"], json!([expected]));
    // After the start: new limiters, for an interface the VM has.
    send(
        &api,
        "PATCH",
        "/network-interfaces/eth0",
        r#"{"iface_id":"eth0","tx_rate_limiter":{"ops":{"size":100,"refill_time":1000}}}"#,
    );
    refused(
        &api,
        "PATCH",
        "/network-interfaces/eth1",
        Some(r#"{"iface_id":"eth1"}"#),
        "not found: eth1",
    );
    refused(
        &api,
        "PUT",
        "/network-interfaces/eth0",
        Some(&interface.to_string()),
        NOT_AFTER_START,
    );
    send(&api, "PUT", "/actions", r#"{"action_type":"FlushMetrics"}"#);
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let line: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    for section in ["net", "net_eth0"] {
        assert_eq!(line[section]["tx_malformed_frames"], 0, "{line}");
    }
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    assert_eq!(vmm.wait(TIMEOUT).code, Some(0));
}

#[test]
fn vsock_mmds_and_cpu_templates_are_configured_as_firecracker_configures_them() {
    let test = "vsock_mmds_and_cpu_templates_are_configured_as_firecracker_configures_them";
    if !kvm_available(test) || !private_network(test, &["tap0"]) {
        return;
    }
    let scratch = Scratch::new("fc-vsock-mmds");
    let (kernel, initrd, _) = guest_files(&scratch);
    let (socket, uds) = (scratch.path("api.sock"), scratch.path("v.sock"));
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    // vsock: the CID and a path nothing is at.
    let taken = scratch.path("taken");
    std::fs::write(&taken, b"keep").unwrap();
    let nowhere = scratch.path("missing/v.sock");
    for (body, message) in [
        (json!({"guest_cid": 2, "uds_path": uds}), "guest_cid 2"),
        (json!({"guest_cid": 3, "uds_path": taken}), "already"),
        // As Firecracker, which binds the socket at once: refused now, not at InstanceStart.
        (
            json!({"guest_cid": 3, "uds_path": nowhere}),
            "does not exist",
        ),
    ] {
        refused(&api, "PUT", "/vsock", Some(&body.to_string()), message);
    }
    assert_eq!(std::fs::read(&taken).unwrap(), b"keep", "left alone");
    send(
        &api,
        "PUT",
        "/vsock",
        &json!({"guest_cid": 3, "uds_path": uds, "vsock_id": "vsock0"}).to_string(),
    );
    // A custom CPU template is checked when it comes; static templates as Firecracker answers
    // them on an AMD host.
    for (body, message) in [
        (
            json!({"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0", "flags": 0,
                "modifiers": [{"register": "ecx", "bitmap": "0b2"}]}]}),
            "bitmap",
        ),
        (
            json!({"msr_modifiers": [{"addr": "zz", "bitmap": "0b1"}]}),
            "not a number",
        ),
        (
            json!({"vcpu_features": [{"index": 0, "bitmap": "0b1"}]}),
            "aarch64",
        ),
    ] {
        refused(&api, "PUT", "/cpu-config", Some(&body.to_string()), message);
    }
    refused(
        &api,
        "PATCH",
        "/machine-config",
        Some(r#"{"cpu_template":"T2"}"#),
        "not supported on this CPU vendor",
    );
    // T2A, AMD's, is taken; a custom template given after it is the VM's (the last one wins).
    send(
        &api,
        "PATCH",
        "/machine-config",
        r#"{"cpu_template":"T2A"}"#,
    );
    assert_eq!(get(&api, "/machine-config")["cpu_template"], "T2A");
    let template = json!({"kvm_capabilities": ["!56"],
        "cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
            "modifiers": [{"register": "ecx", "bitmap": "0bxxxxxx0xxxxxxxxxxxxxxxxxxxxxxxxx"}]}],
        "msr_modifiers": [{"addr": "0xc0000103", "bitmap": "0b101"}]});
    send(&api, "PUT", "/cpu-config", &template.to_string());
    assert_ne!(get(&api, "/machine-config")["cpu_template"], "T2A");
    // MMDS: the document before the start; its configuration names an interface that exists.
    assert_eq!(get(&api, "/mmds"), json!({}));
    refused(
        &api,
        "PATCH",
        "/mmds",
        Some(r#"{"a":1}"#),
        "not initialized",
    );
    send(
        &api,
        "PUT",
        "/mmds",
        r#"{"latest":{"meta-data":{"ami-id":"ami-1"}}}"#,
    );
    send(
        &api,
        "PATCH",
        "/mmds",
        r#"{"latest":{"meta-data":{"n":"2"}}}"#,
    );
    assert_eq!(
        get(&api, "/mmds"),
        json!({"latest": {"meta-data": {"ami-id": "ami-1", "n": "2"}}})
    );
    let big = json!({ "big": "x".repeat(60000) }).to_string();
    refused(&api, "PUT", "/mmds", Some(&big), "limit");
    refused(
        &api,
        "PUT",
        "/mmds/config",
        Some(r#"{"network_interfaces":["eth0"]}"#),
        "does not correspond",
    );
    send(
        &api,
        "PUT",
        "/network-interfaces/eth0",
        r#"{"iface_id":"eth0","host_dev_name":"tap0"}"#,
    );
    refused(
        &api,
        "PUT",
        "/mmds/config",
        Some(r#"{"network_interfaces":["eth0"],"ipv4_address":"10.0.0.1"}"#),
        "link-local",
    );
    send(
        &api,
        "PUT",
        "/mmds/config",
        r#"{"version":"V2","network_interfaces":["eth0"]}"#,
    );
    let boot_source = json!({"kernel_image_path": kernel, "initrd_path": initrd,
                             "boot_args": "console=ttyS0"});
    send(&api, "PUT", "/boot-source", &boot_source.to_string());
    let shown = get(&api, "/vm/config");
    assert_eq!(shown["vsock"]["guest_cid"], 3);
    assert_eq!(shown["mmds-config"]["version"], "V2");
    assert_eq!(shown["cpu-config"], template);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"InstanceStart"}"#,
    );
    vmm.wait_for_line(INITRD.trim(), TIMEOUT);
    // The device's socket is there, and the document is the VM's now.
    assert!(std::path::Path::new(&uds).exists());
    send(
        &api,
        "PATCH",
        "/mmds",
        r#"{"latest":{"meta-data":{"n":null}}}"#,
    );
    assert_eq!(
        get(&api, "/mmds"),
        json!({"latest": {"meta-data": {"ami-id": "ami-1"}}})
    );
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    assert_eq!(vmm.wait(TIMEOUT).code, Some(0));
    assert!(
        !std::path::Path::new(&uds).exists(),
        "the VMM removes its socket"
    );
    // A VM with T2A's CPUID boots and ends as any other.
    let stdout = boot_and_end(&scratch, "t2a", |api| {
        send(
            api,
            "PUT",
            "/machine-config",
            r#"{"vcpu_count":2,"mem_size_mib":128,"cpu_template":"T2A"}"#,
        );
    });
    assert!(stdout.contains(INITRD.trim()), "{stdout}");
}

/// Boots the Ctrl-Alt-Del guest of `scratch` through `socket` after `configure` (more pre-boot
/// requests), and ends it; returns what the VMM printed on stdout.
fn boot_and_end(scratch: &Scratch, name: &str, configure: impl FnOnce(&ApiClient)) -> String {
    let (kernel, initrd, _) = guest_files(scratch);
    let socket = scratch.path(&format!("{name}.sock"));
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let boot_source = json!({"kernel_image_path": kernel, "initrd_path": initrd,
                             "boot_args": "console=ttyS0"});
    send(&api, "PUT", "/boot-source", &boot_source.to_string());
    configure(&api);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"InstanceStart"}"#,
    );
    // The guest prints, then waits for Ctrl-Alt-Del; its output may be elsewhere.
    std::thread::sleep(Duration::from_millis(500));
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    let done = vmm.wait(TIMEOUT);
    assert_eq!(done.code, Some(0), "{done:#?}");
    done.stdout
}

#[test]
fn the_serial_console_goes_to_a_file_or_a_pipe_and_a_rate_limiter_caps_it() {
    let test = "the_serial_console_goes_to_a_file_or_a_pipe_and_a_rate_limiter_caps_it";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("fc-serial");
    // A file: the guest's output is there, not on stdout.
    let file = scratch.path("console.log");
    let stdout = boot_and_end(&scratch, "file", |api| {
        send(
            api,
            "PUT",
            "/serial",
            &json!({ "serial_out_path": file }).to_string(),
        );
    });
    let console = std::fs::read_to_string(&file).unwrap();
    assert!(console.contains(INITRD.trim()), "{console:?}");
    assert!(!stdout.contains(INITRD.trim()), "{stdout}");
    // A pipe nobody reads: the guest runs and ends as ever.
    let fifo = scratch.path("console.fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    boot_and_end(&scratch, "fifo", |api| {
        send(
            api,
            "PUT",
            "/serial",
            &json!({ "serial_out_path": fifo }).to_string(),
        );
    });
    // 8 bytes an hour: the rest is dropped and counted.
    let limited = scratch.path("limited.log");
    let metrics = scratch.path("metrics.json");
    boot_and_end(&scratch, "limited", |api| {
        let serial = json!({ "serial_out_path": limited,
                             "rate_limiter": {"size": 8, "refill_time": 3_600_000} });
        send(api, "PUT", "/serial", &serial.to_string());
        send(
            api,
            "PUT",
            "/metrics",
            &json!({ "metrics_path": metrics }).to_string(),
        );
    });
    assert_eq!(std::fs::metadata(&limited).unwrap().len(), 8);
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let last: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    let dropped = last["uart"]["rate_limiter_dropped_bytes"].as_u64().unwrap();
    assert!(dropped > 20, "{last:#}");
    // Only a pipe or a regular file.
    let socket = scratch.path("refuse.sock");
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let refused = api
        .request("PUT", "/serial", Some(r#"{"serial_out_path":"/dev/null"}"#))
        .unwrap();
    assert_eq!(refused.status, 400);
    assert!(
        refused.body.contains("a character device"),
        "{}",
        refused.body
    );
    send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    vmm.wait(TIMEOUT);
}

#[test]
fn memory_hotplug_is_configured_and_resized_as_firecracker_s() {
    let test = "memory_hotplug_is_configured_and_resized_as_firecracker_s";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("fc-hotplug");
    let (kernel, initrd, _) = guest_files(&scratch);
    let socket = scratch.path("api.sock");
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let patch = r#"{"requested_size_mib":128}"#;
    refused(
        &api,
        "GET",
        "/hotplug/memory",
        None,
        "memory hotplug not configured",
    );
    refused(
        &api,
        "PATCH",
        "/hotplug/memory",
        Some(patch),
        NOT_BEFORE_START,
    );
    for (body, message) in [
        (
            r#"{"total_size_mib":256,"block_size_mib":3}"#,
            "block size 3 MiB",
        ),
        (
            r#"{"total_size_mib":256,"slot_size_mib":64}"#,
            "slot size 64 MiB",
        ),
        (r#"{"total_size_mib":100}"#, "total size 100 MiB"),
        (r#"{"total_size_mib":0}"#, "total size 0"),
        (r#"{"total_size_mib":18446744073709551615}"#, "overflows"),
        (r#"{"total_size_mib":256,"color":"red"}"#, "unknown field"),
    ] {
        refused(&api, "PUT", "/hotplug/memory", Some(body), message);
    }
    send(&api, "PUT", "/hotplug/memory", r#"{"total_size_mib":256}"#);
    let status = json!({"total_size_mib": 256, "slot_size_mib": 128, "block_size_mib": 2,
                        "plugged_size_mib": 0, "requested_size_mib": 0});
    assert_eq!(get(&api, "/hotplug/memory"), status);
    assert_eq!(
        get(&api, "/vm/config")["memory-hotplug"],
        json!({"total_size_mib": 256, "slot_size_mib": 128, "block_size_mib": 2})
    );
    boot_with_one_virtio_device(&api, &mut vmm, &kernel, &initrd);
    refused(
        &api,
        "PUT",
        "/hotplug/memory",
        Some(r#"{"total_size_mib":128}"#),
        NOT_AFTER_START,
    );
    // A new requested size; this guest has no driver, so nothing is plugged.
    send(&api, "PATCH", "/hotplug/memory", patch);
    let status = get(&api, "/hotplug/memory");
    assert_eq!(
        (
            status["requested_size_mib"].as_u64(),
            status["plugged_size_mib"].as_u64()
        ),
        (Some(128), Some(0))
    );
    for bad in [
        r#"{"requested_size_mib":129}"#,
        r#"{"requested_size_mib":512}"#,
    ] {
        refused(
            &api,
            "PATCH",
            "/hotplug/memory",
            Some(bad),
            "multiple of the block size",
        );
    }
    refused(
        &api,
        "PATCH",
        "/hotplug/memory",
        Some(r#"{"requested_size_mib":18446744073709551615}"#),
        "overflows",
    );
    // Its frames are in the pool beside RAM's (128 MiB of RAM by default).
    let pool = &get(&api, "/memory")["pool"];
    assert_eq!(
        pool["total_bytes"].as_u64(),
        Some((128 + 256) << 20),
        "{pool}"
    );
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    assert_eq!(vmm.wait(TIMEOUT).code, Some(0));
}
