//! End-to-end: `vmm run` as a real process. Help, usage and host errors (one line on stderr,
//! documented exit statuses), and runs of the built-in test guest with the API in use.
//!
//! Runs need KVM; without it they print SKIP.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e_tests::{kvm_available, tool_available};
use vmm_common::{get, send, vmm_binary, Finished, Scratch, VmmRun};

/// Runs `vmm ARGS` to its end.
fn vmm(args: &[&str]) -> Finished {
    Command::new(vmm_binary())
        .args(args)
        .output()
        .expect("run vmm")
        .into()
}

#[test]
fn help_explains_every_flag_and_the_exit_statuses() {
    let help = vmm(&["run", "--help"]);
    assert_eq!(help.code, Some(0), "{help:#?}");
    let text = help.stdout;
    for flag in [
        "--memory",
        "--backing",
        "--populate",
        "--vcpus",
        "--kernel",
        "--initrd",
        "--cmdline",
        "--api-socket",
        "--workload",
        "--balloon",
        "hugetlb-1g",
        "dax:PATH",
        "deflate_on_oom",
    ] {
        assert!(text.contains(flag), "{flag} missing from vmm run --help");
    }
    for status in [
        "  0  success",
        "  2  usage",
        "  3  host unsupported",
        "  4  runtime",
    ] {
        assert!(text.contains(status), "{status} missing");
    }
    let top = vmm(&["--help"]).stdout;
    for command in [
        "run",
        "api",
        "info",
        "memory",
        "pause",
        "resume",
        "shutdown",
        "balloon",
        "guest-image",
    ] {
        assert!(
            top.contains(&format!("\n  {command} ")),
            "{command} missing from vmm --help"
        );
    }
}

#[test]
fn usage_errors_are_one_line_with_status_2() {
    let cases: [(&[&str], &str); 13] = [
        (&[], "requires a subcommand"),
        (&["run", "--memory", "lots"], "'lots' is not a size"),
        (
            &["run", "--memory", "5000K"],
            "must be a whole number of MiB",
        ),
        (
            &["run", "--memory", "3M"],
            "must be between 4 MiB and 1 TiB",
        ),
        (&["run", "--backing", "tmpfs"], "unknown backing 'tmpfs'"),
        (&["run", "--populate", "later"], "invalid value 'later'"),
        (
            &["run", "--vcpus", "255"],
            "--vcpus 255: must be between 1 and 254",
        ),
        (&["run", "--vcpus", "65"], "at most 64 vCPUs"),
        (
            &["run", "--vcpus", "3", "--smt"],
            "--vcpus 3: with --smt, the vCPU count must be 1 or even",
        ),
        (&["run", "--initrd", "/boot/initrd"], "--kernel <PATH>"),
        (
            &["run", "--balloon", "size=64M,inflate=on"],
            "unknown balloon option 'inflate'",
        ),
        (&["run", "--workload", "write:all,"], "empty workload step"),
        (
            &["run", "--frobnicate"],
            "unexpected argument '--frobnicate'",
        ),
    ];
    for (args, text) in cases {
        vmm(args).assert_fails(2, text);
    }
}

#[test]
fn missing_files_are_usage_errors() {
    let scratch = Scratch::new("missing-files");
    let kernel = scratch.path("vmlinux");
    vmm(&["run", "--kernel", &kernel]).assert_fails(2, "No such file or directory");
    std::fs::write(&kernel, b"not really a kernel").unwrap();
    let initrd = scratch.path("initrd");
    vmm(&["run", "--kernel", &kernel, "--initrd", &initrd]).assert_fails(2, "--initrd");
    let dax = format!("dax:{}", scratch.path("dax0.0"));
    vmm(&["run", "--backing", &dax]).assert_fails(2, "--backing dax:");
    let pool = format!("file:{}", scratch.path("no/dir/pool"));
    vmm(&["run", "--backing", &pool]).assert_fails(2, "its directory does not exist");
    let socket = scratch.path("no/dir/api.sock");
    vmm(&["run", "--api-socket", &socket]).assert_fails(2, "--api-socket");
    // A missing zone is said the same way wherever it is named.
    let zone = scratch.path("zone");
    let missing = format!("zone {zone} does not exist (create it with `vmm zone create`)");
    vmm(&["run", "--zone", &zone, "--vm", "a"]).assert_fails(2, &missing);
    for command in ["inspect", "gc"] {
        vmm(&["zone", command, &zone]).assert_fails(2, &missing);
    }
    vmm(&["zone", "delete-vm", &zone, "a"]).assert_fails(2, &missing);
}

fn nr_hugepages(kib: u64) -> Option<u64> {
    let path = format!("/sys/kernel/mm/hugepages/hugepages-{kib}kB/nr_hugepages");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn too_few_huge_pages_is_host_unsupported() {
    if !kvm_available("too_few_huge_pages_is_host_unsupported") {
        return;
    }
    for (backing, kib, unit) in [
        ("hugetlb-2m", 2048, 2u64 << 20),
        ("hugetlb-1g", 1_048_576, 1 << 30),
    ] {
        // One page more than the host has at all, and at least the 4 MiB minimum of RAM.
        let pages = (nr_hugepages(kib).unwrap_or(0) + 1).max((4 << 20) / unit);
        let memory = format!("{}M", (pages * unit) >> 20);
        let output = vmm(&["run", "--backing", backing, "--memory", &memory]);
        output.assert_fails(3, "huge pages");
        assert!(output.stderr.starts_with("error: host unsupported: "));
    }
}

#[test]
fn no_kvm_is_host_unsupported() {
    // Hide /dev/kvm from one vmm process: a private mount namespace with an empty /dev.
    let script = r#"mount -t tmpfs none /dev && exec "$0" run --memory 64M"#;
    let output = Command::new("unshare")
        .args(["--mount", "sh", "-c", script, vmm_binary()])
        .output()
        .map(Finished::from);
    let output = match output {
        Ok(output) if !output.stderr.contains("unshare:") && !output.stderr.contains("mount:") => {
            output
        }
        Ok(output) => {
            eprintln!(
                "SKIP: no_kvm_is_host_unsupported: cannot hide /dev: {}",
                output.stderr.trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("SKIP: no_kvm_is_host_unsupported: no unshare: {e}");
            return;
        }
    };
    output.assert_fails(3, "host unsupported: cannot open /dev/kvm");
}

#[test]
fn the_test_guest_runs_its_workload_on_two_vcpus() {
    let test = "the_test_guest_runs_its_workload_on_two_vcpus";
    if !kvm_available(test) {
        return;
    }
    for populate in ["lazy", "eager"] {
        let run = VmmRun::run(&["--memory", "64M", "--vcpus", "2", "--populate", populate]);
        assert_eq!(run.code, Some(0), "--populate {populate}: {}", run.stderr);
    }
}

#[test]
fn a_file_backed_guest_runs() {
    let test = "a_file_backed_guest_runs";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("file-backing");
    let backing = format!("file:{}", scratch.path("pool"));
    let run = VmmRun::run(&["--memory", "32M", "--backing", &backing]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[test]
fn a_failed_verification_exits_with_1() {
    let test = "a_failed_verification_exits_with_1";
    if !kvm_available(test) {
        return;
    }
    let workload = "write:2M+1M:0x1111,verify:2M+1M:0x2222";
    let run = VmmRun::run(&["--memory", "16M", "--workload", workload]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

#[test]
fn the_api_pauses_inspects_and_shuts_down_a_running_guest() {
    let test = "the_api_pauses_inspects_and_shuts_down_a_running_guest";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("api-run");
    let socket = scratch.path("api.sock");
    // Long enough to be caught running: four passes over 1 GiB.
    let workload = "write:all,verify:all,write:all:7,verify:all:7";
    let mut process = VmmRun::start(&[
        "--memory",
        "1G",
        "--vcpus",
        "2",
        "--api-socket",
        &socket,
        "--workload",
        workload,
    ]);
    let client = process.api(&socket);
    let get = |path: &str| get(&client, path);
    let info = get("/machine");
    assert_eq!(
        (info["vcpu_count"].as_u64(), info["mem_size_mib"].as_u64()),
        (Some(2), Some(1024))
    );
    assert_eq!(info["guest"], "test-guest");
    send(&client, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    assert_eq!(get("/machine")["state"], "Paused");
    let memory = get("/memory");
    assert_eq!(memory["guest"]["chunks"], 512);
    assert_eq!(memory["vcpus"].as_array().unwrap().len(), 2);
    let populated = memory["guest"]["populated_bytes"].as_u64().unwrap();
    assert!(populated <= memory["pool"]["used_bytes"].as_u64().unwrap());
    send(&client, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let balloon = client.request("GET", "/balloon", None).unwrap();
    assert_eq!(
        balloon.fault_message().as_deref(),
        Some("balloon not configured")
    );
    send(&client, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    // A requested shutdown ends the run with its own status and a line saying so.
    let run = process.wait(Duration::from_secs(30));
    assert_eq!(run.code, Some(6), "{}", run.stderr);
    assert!(
        run.stderr.starts_with("stopped: an API shutdown request"),
        "{}",
        run.stderr
    );
    assert!(
        !Path::new(&socket).exists(),
        "the API socket is removed at exit"
    );
}

#[test]
fn long_population_and_long_steps_show_progress() {
    if !kvm_available("long_population_and_long_steps_show_progress") {
        return;
    }
    // Eager population of 4 GiB and three writes of 1 GiB take a few seconds each here, well
    // over the second after which progress shows (2 GiB populated in 0.9-1.7 s on warm host
    // memory, too close to it).
    let run = VmmRun::run(&[
        "--memory",
        "4G",
        "--populate",
        "eager",
        "--workload",
        "write:2M+1G*3",
    ]);
    run.assert_success();
    assert_eq!(
        run.stdout,
        "llfree-vmm test guest: 1 vCPU, 1 step\nstep 1: ok\ntest guest: done\n"
    );
    let progress: Vec<&str> = run
        .stderr
        .lines()
        .filter(|line| line.starts_with("progress: "))
        .collect();
    let population = progress
        .iter()
        .filter(|line| line.starts_with("progress: populating guest memory: "))
        .filter(|line| line.ends_with(" of 4.0 GiB"));
    let steps = progress
        .iter()
        .filter(|line| line.starts_with("progress: step 1 (write): "))
        .filter(|line| line.ends_with(" of 3.0 GiB"));
    assert!(population.count() >= 1, "{run:#?}");
    assert!(steps.count() >= 1, "{run:#?}");
}

/// On a terminal the same progress is a bar updated in place, with its percentage, rate and
/// time left, and the console's lines still come whole (the bar lifted for each).
#[test]
fn on_a_terminal_progress_is_a_bar_updated_in_place() {
    let test = "on_a_terminal_progress_is_a_bar_updated_in_place";
    if !kvm_available(test) || !tool_available(test, "script", "--version") {
        return;
    }
    // `script` gives the VMM a pseudo-terminal and copies what it shows to its own stdout.
    let command = format!(
        "{} run --memory 2G --workload 'write:2M+1G*3'",
        vmm_binary()
    );
    let shown: Finished = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .output()
        .expect("run script")
        .into();
    assert_eq!(shown.code, Some(0), "{shown:#?}");
    let screen = shown.stdout.replace('\r', "\n");
    assert!(screen.contains("step 1 (write): ["), "{screen}");
    // Its rate and time left count from its second position on: on a host fast enough to
    // write the 3 GiB in about two updates there is none to show.
    let positions: std::collections::HashSet<&str> = screen
        .lines()
        .filter_map(|line| line.split("step 1 (write): [").nth(1))
        .filter_map(|bar| bar.split("% of").next())
        .collect();
    if positions.len() >= 2 {
        assert!(screen.contains("% of 3.00 GiB, "), "no rate: {screen}");
        assert!(screen.contains(" s left"), "no time left: {screen}");
    }
    assert!(
        !screen.contains("progress: "),
        "plain lines on a terminal: {screen}"
    );
    for line in ["step 1: ok", "test guest: done"] {
        assert!(
            screen.lines().any(|l| l.ends_with(line)),
            "{line}: {screen}"
        );
    }
}

/// A snapshot that copies guest memory shows the copy's progress once it takes more than a
/// second.
#[test]
fn a_long_memory_copy_shows_its_progress() {
    if !kvm_available("a_long_memory_copy_shows_its_progress") {
        return;
    }
    let scratch = Scratch::new("copy-progress");
    let socket = scratch.path("api.sock");
    let mut run = VmmRun::start(&[
        "--memory",
        "1G",
        "--workload",
        "write:all,checkpoint:1",
        "--api-socket",
        &socket,
    ]);
    let api = run.api(&socket);
    vmm_common::wait_for_state(&api, "Paused");
    let started = std::time::Instant::now();
    let snapshot = scratch.path("snap");
    let memory = scratch.path("mem");
    let created = vmm(&[
        "snapshot",
        "create",
        "--socket",
        &socket,
        "--snapshot-path",
        &snapshot,
        "--mem-file-path",
        &memory,
    ]);
    let took = started.elapsed();
    assert_eq!(created.code, Some(0), "{created:#?}");
    send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    let ended = run.wait(Duration::from_secs(30));
    let copying = ended
        .stderr
        .lines()
        .filter(|line| line.starts_with("progress: copying guest memory into "))
        .count();
    if took >= Duration::from_secs(2) {
        assert!(
            copying >= 1,
            "a copy of {took:?} without progress: {ended:#?}"
        );
    } else {
        eprintln!(
            "SKIP: a_long_memory_copy_shows_its_progress: the copy took {took:?}, under the 2 s \
             that would show progress on this host"
        );
    }
}

/// Three VMMs named by `--vm` writing to one pipe (stdout and stderr, as on one terminal):
/// every line is whole and starts with its VMM's name, the console's, the log's and the final
/// status alike.
#[test]
fn named_vmms_on_one_output_write_whole_lines_each_with_its_name() {
    if !kvm_available("named_vmms_on_one_output_write_whole_lines_each_with_its_name") {
        return;
    }
    let scratch = Scratch::new("named-lines");
    let zone = scratch.path("zone");
    vmm(&["zone", "create", &zone, "--size", "256M"]).assert_success();
    // Each guest writes and checks its memory four times, breaking its balloon's queue once
    // (a warning in the log); VM c's last check fails on purpose (its error line).
    let script = r#"
        for vm in a b c; do
            steps=write:all,verify:all,break-balloon,write:all,verify:all
            [ "$vm" = c ] && steps=$steps,verify:all:0x77
            "$0" run --zone "$1" --vm "$vm" --ephemeral --memory 64M --balloon size=0 \
                --workload "$steps" &
        done
        wait
    "#;
    let output: Finished = Command::new("sh")
        .args(["-c", &format!("({script}) 2>&1"), vmm_binary(), &zone])
        .output()
        .expect("run sh")
        .into();
    let lines: Vec<&str> = output.stdout.lines().collect();
    for name in ["a", "b", "c"] {
        let own = |text: &str| {
            lines
                .iter()
                .any(|line| line.starts_with(&format!("[{name}] ")) && line.contains(text))
        };
        assert!(own("test guest: 1 vCPU"), "{name}: {output:#?}");
        assert!(own("step 5: ok"), "{name}: {output:#?}");
        assert!(own("warning: "), "{name}'s log: {output:#?}");
    }
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("[c] error: ") && line.contains("verif")),
        "{output:#?}"
    );
    let foreign: Vec<&&str> = lines
        .iter()
        .filter(|line| !["[a] ", "[b] ", "[c] "].iter().any(|p| line.starts_with(p)))
        .collect();
    assert!(foreign.is_empty(), "lines without a name: {foreign:#?}");
}

/// `--log-level debug` says what the VMM does: the zone's recovery and attachment, guest
/// memory, device activation and the vCPUs; the default level says none of it.
#[test]
fn debug_logging_says_what_the_vmm_does() {
    if !kvm_available("debug_logging_says_what_the_vmm_does") {
        return;
    }
    let scratch = Scratch::new("debug-log");
    let zone = scratch.path("zone");
    vmm(&["zone", "create", &zone, "--size", "64M"]).assert_success();
    let run = |level: &str| {
        vmm(&[
            "run",
            "--zone",
            &zone,
            "--vm",
            "dbg",
            "--memory",
            "32M",
            "--balloon",
            "size=0",
            "--log-level",
            level,
            "--workload",
            "write:all,inflate:2M",
        ])
    };
    let quiet = run("warn");
    quiet.assert_success();
    let debug = run("debug");
    assert_eq!(debug.code, Some(0), "{debug:#?}");
    for said in [
        "debug: vmm::build::memory: zone ",
        "recovery in ",
        "attached to VM 'dbg' (32 MiB in frames of 2 MiB)",
        "guest memory: 32 MiB in 1 region(s), populated lazily",
        "activated by its driver (features ",
        "vCPU 0: running",
        "vCPU 0: ended",
    ] {
        assert!(debug.stderr.contains(said), "no {said:?}: {debug:#?}");
    }
}

#[test]
fn a_vm_with_an_entropy_device_runs_and_its_config_shows_it() {
    let test = "a_vm_with_an_entropy_device_runs_and_its_config_shows_it";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("entropy-run");
    let socket = scratch.path("api.sock");
    let mut run = VmmRun::start(&[
        "--memory",
        "64M",
        "--entropy",
        "--api-socket",
        &socket,
        "--workload",
        "write:all,checkpoint:1,verify:all",
    ]);
    let api = run.api(&socket);
    vmm_common::wait_for_state(&api, "Paused");
    assert_eq!(get(&api, "/vm/config")["entropy"], serde_json::json!({}));
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    assert_eq!(run.wait(Duration::from_secs(120)).code, Some(0));
}

#[test]
fn hot_pluggable_memory_is_set_and_shown_from_the_command_line() {
    let test = "hot_pluggable_memory_is_set_and_shown_from_the_command_line";
    if !kvm_available(test) {
        return;
    }
    let refused = vmm(&["run", "--memory", "64M", "--hotplug", "total=256M,block=1M"]);
    assert_eq!(refused.code, Some(2), "{refused:#?}");
    assert!(
        refused
            .stderr
            .contains("--hotplug: block size 1 MiB: must be a power of two of at least 2 MiB"),
        "{refused:#?}"
    );
    let scratch = Scratch::new("hotplug-run");
    let socket = scratch.path("api.sock");
    let mut run = VmmRun::start(&[
        "--memory",
        "64M",
        "--hotplug",
        "total=256M",
        "--api-socket",
        &socket,
        "--workload",
        "write:all,checkpoint:1,verify:all",
    ]);
    let api = run.api(&socket);
    vmm_common::wait_for_state(&api, "Paused");
    let set = vmm_common::client(&["hotplug", "set", "128M", "-s", &socket]);
    assert_eq!(set.code, Some(0), "{set:#?}");
    assert!(set.stdout.contains("requested 128 MiB"), "{set:#?}");
    let shown = vmm_common::client(&["hotplug", "get", "-s", &socket]);
    assert_eq!(shown.code, Some(0), "{shown:#?}");
    for line in [
        "plugged    0 MiB",
        "requested  128 MiB",
        "total      256 MiB",
    ] {
        assert!(shown.stdout.contains(line), "{line}: {shown:#?}");
    }
    let too_much = vmm_common::client(&["hotplug", "set", "1G", "-s", &socket]);
    assert_eq!(too_much.code, Some(5), "the API refused: {too_much:#?}");
    assert!(
        too_much.stderr.contains("up to the total (256 MiB)"),
        "{too_much:#?}"
    );
    assert_eq!(
        get(&api, "/vm/config")["memory-hotplug"]["total_size_mib"],
        256
    );
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    assert_eq!(run.wait(Duration::from_secs(120)).code, Some(0));
}
