//! End-to-end: the virtio-balloon as a user of the command line sees it. `vmm run --balloon ...
//! --api-socket S --workload ...` pauses at workload checkpoints; between them the test sets the
//! target with `vmm balloon set` and the API (`PUT`/`PATCH /balloon`), the test guest inflates to
//! it (`balloon-target`), and `GET /balloon`, `GET /memory` and `GET /balloon/statistics` show
//! the balloon's size, the frames back in the pool and the guest's statistics. Bad input is
//! refused: API requests with 400 and a fault message, `--balloon` options with exit status 2.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use e2e_tests::kvm_available;
use serde_json::Value;
use vmm_cli::ApiClient;
use vmm_common::{client, get, send, wait_for_state, Finished, Scratch, VmmRun};

const MIB: u64 = 1 << 20;
/// 4 KiB frames in a 2 MiB chunk.
const CHUNK_FRAMES: u64 = 512;

/// Sends a request as curl would (the body as it is, JSON or not) that must be refused with
/// 400; returns its fault message.
fn refused(socket: &str, method: &str, path: &str, body: &str) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let what = format!("{method} {path} {body}: {response}");
    assert!(response.starts_with("HTTP/1.1 400 "), "{what}");
    let (_, body) = response.split_once("\r\n\r\n").expect(&what);
    let fault: Value = serde_json::from_str(body).expect(&what);
    fault["fault_message"].as_str().expect(&what).to_owned()
}

/// `GET /memory`'s pool counters: free 4 KiB frames and free 2 MiB frames.
fn pool_free(api: &ApiClient) -> (u64, u64) {
    let memory = get(api, "/memory");
    let pool = &memory["pool"];
    (
        pool["free_4k_frames"].as_u64().unwrap(),
        pool["free_2m_frames"].as_u64().unwrap(),
    )
}

/// Resumes the VM and waits for its next checkpoint.
fn resume_to_next_checkpoint(api: &ApiClient) {
    send(api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    wait_for_state(api, "Paused");
}

/// `vmm balloon --socket S ARGS`.
fn balloon_command(socket: &str, args: &[&str]) -> Finished {
    let mut command = vec!["balloon", "--socket", socket];
    command.extend(args);
    client(&command)
}

#[test]
fn the_guest_inflates_to_the_target_set_from_the_command_line_and_frames_return_to_the_pool() {
    let test = "the_guest_inflates_to_the_target_set_from_the_command_line";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("balloon-cli");
    let socket = scratch.path("api.sock");
    // 256 MiB: the balloon takes its pages from 256 MiB downwards, so 100 MiB of it are 50
    // whole 2 MiB chunks. After the last target (0), the deflated pages read zero and the
    // pages below the balloon kept what the guest wrote.
    let mut vmm = VmmRun::start(&[
        "--memory",
        "256M",
        "--balloon",
        "size=0,deflate_on_oom=on,free_page_reporting=on,stats_polling_interval_s=1",
        "--api-socket",
        &socket,
        "--workload",
        "write:all,checkpoint:1,balloon-target,checkpoint:2,answer-stats,checkpoint:3,\
         balloon-target,verify-zero:156M+100M,verify:2M+154M",
    ]);
    let api = vmm.api(&socket);
    wait_for_state(&api, "Paused");
    let balloon = get(&api, "/balloon");
    assert_eq!(
        balloon,
        serde_json::json!({
            "amount_mib": 0,
            "actual_mib": 0,
            "deflate_on_oom": true,
            "free_page_reporting": true,
            "free_page_hinting": false,
            "stats_polling_interval_s": 1,
            "needs_reset": false,
            "driver_violations": serde_json::to_value(virtio_balloon::Violations::default()).unwrap(),
        })
    );
    let (free_before, huge_before) = pool_free(&api);

    // Refused: above RAM, negative, not JSON, unknown or missing fields; nothing changes.
    let above = balloon_command(&socket, &["set", "257"]);
    above.assert_fails(
        5,
        "PATCH /balloon: 400 balloon target of 257 MiB exceeds the guest's 256 MiB of RAM",
    );
    let message = refused(&socket, "PATCH", "/balloon", r#"{"amount_mib": 4096}"#);
    assert!(message.contains("exceeds the guest's 256 MiB"), "{message}");
    const BAD_JSON: &str = "An error occurred when deserializing the json body of a request";
    let message = refused(&socket, "PATCH", "/balloon", r#"{"amount_mib": -1}"#);
    assert!(message.starts_with(BAD_JSON), "{message}");
    let message = refused(&socket, "PATCH", "/balloon", "64 MiB please");
    assert!(message.starts_with(BAD_JSON), "{message}");
    // As in Firecracker: the balloon's configuration is set before the start only.
    let full = r#"{"amount_mib": 8, "deflate_on_oom": true}"#;
    let message = refused(&socket, "PUT", "/balloon", full);
    assert!(
        message.contains("not supported after starting"),
        "{message}"
    );
    let message = refused(
        &socket,
        "PATCH",
        "/balloon",
        r#"{"amount_mib": 8, "pages": 1}"#,
    );
    assert!(message.contains("unknown field `pages`"), "{message}");
    let message = refused(&socket, "PATCH", "/balloon", "{}");
    assert!(message.contains("needs amount_mib"), "{message}");
    let message = refused(
        &socket,
        "PATCH",
        "/balloon/statistics",
        r#"{"stats_polling_interval_s": -5}"#,
    );
    assert!(message.starts_with(BAD_JSON), "{message}");
    assert_eq!(get(&api, "/balloon")["amount_mib"], 0, "nothing changed");

    let set = balloon_command(&socket, &["set", "100"]);
    set.assert_success();
    assert_eq!(get(&api, "/balloon")["amount_mib"], 100);
    assert_eq!(get(&api, "/balloon")["actual_mib"], 0, "not inflated yet");

    // Checkpoint 2: the guest inflated to the target.
    resume_to_next_checkpoint(&api);
    let balloon = get(&api, "/balloon");
    assert_eq!(
        (&balloon["amount_mib"], &balloon["actual_mib"]),
        (&Value::from(100), &Value::from(100)),
        "{balloon:#}"
    );
    let shown = balloon_command(&socket, &["get"]);
    assert_eq!(shown.code, Some(0), "{shown:#?}");
    assert!(
        shown
            .stdout
            .starts_with("target      100 MiB, the guest gave 100 MiB\n"),
        "{shown:#?}"
    );
    let shown = balloon_command(&socket, &["get", "--json"]);
    let shown: Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(shown["actual_mib"], 100);
    let (free_after, huge_after) = pool_free(&api);
    assert_eq!(
        free_after - free_before,
        50 * CHUNK_FRAMES,
        "50 whole chunks"
    );
    assert_eq!(huge_after - huge_before, 50, "as whole 2 MiB frames");
    let memory = get(&api, "/memory");
    assert_eq!(memory["guest"]["given_away_4k_pages"], 100 * 256);

    // Checkpoint 3: the guest answered a statistics request (the device asks every second).
    resume_to_next_checkpoint(&api);
    let area = 256 * MIB - 2 * MIB;
    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let stats = get(&api, "/balloon/statistics");
        if stats["free_memory"] == area - 100 * MIB {
            break stats;
        }
        assert!(Instant::now() < deadline, "no fresh statistics: {stats:#}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(stats["total_memory"], 256 * MIB);
    assert_eq!(stats["available_memory"], area - 100 * MIB);
    assert_eq!(
        (&stats["actual_pages"], &stats["target_mib"]),
        (&Value::from(100 * 256), &Value::from(100))
    );
    let shown = balloon_command(&socket, &["stats", "--json"]);
    assert_eq!(shown.code, Some(0), "{shown:#?}");
    assert!(shown.stdout.contains("\"free_memory\""), "{shown:#?}");
    let shown = balloon_command(&socket, &["stats"]);
    assert!(
        shown
            .stdout
            .contains("target 100 MiB, the guest gave 100 MiB\n"),
        "{shown:#?}"
    );
    // The interval changes; statistics are not turned off after the start (Firecracker's rule).
    let message = refused(
        &socket,
        "PATCH",
        "/balloon/statistics",
        r#"{"stats_polling_interval_s":0}"#,
    );
    assert!(message.contains("cannot be enabled/disabled"), "{message}");
    send(
        &api,
        "PATCH",
        "/balloon/statistics",
        r#"{"stats_polling_interval_s":2}"#,
    );
    assert_eq!(get(&api, "/balloon")["stats_polling_interval_s"], 2);
    send(&api, "PATCH", "/balloon", r#"{"amount_mib":0}"#);

    // The guest deflates to 0 and checks its memory.
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let run = vmm.wait(Duration::from_secs(120));
    run.assert_success();
    assert!(run.stdout.contains("test guest: done"), "{run:#?}");
}

#[test]
fn a_hint_step_gives_the_hinted_frames_back_in_a_run_it_asks_the_vmm_for() {
    if !kvm_available("a_hint_step_gives_the_hinted_frames_back") {
        return;
    }
    let scratch = Scratch::new("balloon-hint-step");
    let socket = scratch.path("api.sock");
    let (vmm, api) = VmmRun::start_paused(
        &[
            "--memory",
            "128M",
            "--balloon",
            "free_page_hinting=on",
            "--workload",
            "write:2M+64M,checkpoint:1,hint:2M+64M,checkpoint:2,verify-zero:2M+64M,\
             write:2M+64M:7,verify:2M+64M:7",
        ],
        &socket,
    );
    let before = pool_free(&api).1;
    assert_eq!(
        get(&api, "/balloon/hinting/status"),
        serde_json::json!({"host_cmd": 0})
    );
    resume_to_next_checkpoint(&api);
    // The guest asked for a run, hinted, said STOP; the run ended by itself (acknowledged on
    // stop) and the 32 hinted chunks are back in the pool.
    assert_eq!(
        get(&api, "/balloon/hinting/status"),
        serde_json::json!({"host_cmd": 1, "guest_cmd": 0})
    );
    assert_eq!(pool_free(&api).1 - before, 32);
    assert_eq!(get(&api, "/memory")["guest"]["discarded_chunks"], 32);
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    let run = vmm.wait(Duration::from_secs(120));
    run.assert_success();
    // Without free_page_hinting=on the step is refused before the VM starts.
    let refused = VmmRun::run(&[
        "--memory",
        "64M",
        "--balloon",
        "size=0",
        "--workload",
        "hint:2M+16M",
    ]);
    assert_eq!(refused.code, Some(2), "{refused:#?}");
    assert!(
        refused
            .stderr
            .contains("needs --balloon free_page_hinting=on"),
        "{refused:#?}"
    );
}

#[test]
fn bad_balloon_options_and_balloon_steps_without_a_balloon_exit_with_status_2() {
    let cases: [(&[&str], &str); 9] = [
        (
            &["--balloon", "size=1X"],
            "balloon option size: '1X' is not a size",
        ),
        (&["--balloon", "size=4097"], "4097"),
        (&["--balloon", "deflate_on_oom=maybe"], "expected on or off"),
        (
            &["--balloon", "stats_polling_interval_s=-1"],
            "stats_polling_interval_s",
        ),
        (&["--balloon", "size=64M,size=64M"], "size"),
        (&["--balloon", ""], "no balloon options given"),
        (
            &["--memory", "64M", "--balloon", "size=128M"],
            "--balloon size=128 MiB: larger than guest RAM (64 MiB)",
        ),
        (
            &["--workload", "inflate:4M"],
            "workload step 'inflate:4M' drives the balloon: add --balloon",
        ),
        (
            &["--balloon", "size=0", "--workload", "report:2M+2M"],
            "workload step 'report:2M+2M' needs --balloon free_page_reporting=on",
        ),
    ];
    for (args, text) in cases {
        let mut run = vec!["run"];
        run.extend(args);
        client(&run).assert_fails(2, text);
    }
}

#[test]
fn a_balloon_step_the_driver_cannot_do_fails_the_guest_with_the_reason() {
    if !kvm_available("a_balloon_step_the_driver_cannot_do_fails_the_guest_with_the_reason") {
        return;
    }
    let run = VmmRun::run(&[
        "--memory",
        "64M",
        "--balloon",
        "size=0",
        "--workload",
        "inflate:8M,deflate:12M",
    ]);
    run.assert_fails(
        1,
        "the guest failed: step 2 (deflate): the balloon driver failed: the balloon holds 2048 \
         pages: it cannot deflate by more",
    );
    // The balloon probe the VMM adds is not one of the user's steps.
    assert!(
        run.stdout
            .starts_with("llfree-vmm test guest: 1 vCPU, 2 steps\nstep 1: ok\nballoon error 5"),
        "{run:#?}"
    );
}
