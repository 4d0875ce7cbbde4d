//! End-to-end: the control API server on a real Unix socket, driven by the API client and by
//! raw (also malformed) HTTP, in front of an in-test `VmmControl`.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod api_common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use api_common::{serve, socket_path, TestVmm, PANIC_ON_PURPOSE};
use serde_json::Value;
use vmm_api::model::VmState;
use vmm_api::{ApiServer, ServerError};
use vmm_cli::{ApiClient, ApiResponse};

fn call(socket: &Path, method: &str, path: &str, body: Option<&str>) -> ApiResponse {
    ApiClient::new(socket)
        .request(method, path, body)
        .expect("request")
}

fn json(response: &ApiResponse) -> Value {
    serde_json::from_str(&response.body).expect("JSON body")
}

/// Sends `bytes` as they are, then ends what it sends (a kept connection then closes after
/// the answer), and returns the whole raw response.
fn raw(socket: &Path, bytes: &[u8]) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.write_all(bytes).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The status and fault message of a raw error response.
fn raw_fault(socket: &Path, bytes: &[u8]) -> (u16, String) {
    let response = raw(socket, bytes);
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").unwrap().1;
    let fault: Value = serde_json::from_str(body).unwrap();
    (status, fault["fault_message"].as_str().unwrap().to_owned())
}

#[test]
fn machine_and_memory_info() {
    let (server, _vmm) = serve("info", TestVmm::new());
    // GET / is Firecracker's instance info; GET /version its version.
    let instance = json(&call(server.path(), "GET", "/", None));
    assert_eq!(
        (instance["app_name"].as_str(), instance["state"].as_str()),
        (Some("llfree-vmm"), Some("Running"))
    );
    assert_eq!(instance["id"], "anonymous-instance");
    let version = json(&call(server.path(), "GET", "/version", None));
    assert!(version["firecracker_version"].is_string(), "{version}");
    for path in ["/machine", "/machine/"] {
        let response = call(server.path(), "GET", path, None);
        assert_eq!(response.status, 200, "{path}");
        let info = json(&response);
        assert_eq!(info["vcpu_count"], 2);
        assert_eq!(info["state"], "Running");
        assert_eq!(info["backing"], "hugetlb-2m");
        assert_eq!(info["populate"], "lazy");
    }
    let memory = json(&call(server.path(), "GET", "/memory", None));
    assert_eq!(memory["guest"]["populated_chunks"], 3);
    assert_eq!(memory["pool"]["free_2m_frames"], 125);
    assert_eq!(memory["pool"]["reservations"][0]["tree"], 0);
}

#[test]
fn pause_resume_and_shutdown_change_the_state() {
    let (server, vmm) = serve("state", TestVmm::new());
    let socket = server.path();
    let paused = call(socket, "PATCH", "/vm", Some(r#"{"state":"Paused"}"#));
    assert_eq!((paused.status, paused.body.as_str()), (204, ""));
    assert_eq!(
        json(&call(socket, "GET", "/machine", None))["state"],
        "Paused"
    );
    assert_eq!(
        call(socket, "PATCH", "/vm", Some(r#"{"state":"Resumed"}"#)).status,
        204
    );
    assert_eq!(vmm.state(), VmState::Running);
    let shutdown = call(
        socket,
        "PUT",
        "/actions",
        Some(r#"{"action_type":"Shutdown"}"#),
    );
    assert_eq!(shutdown.status, 204);
    assert_eq!(vmm.shutdowns.load(Ordering::SeqCst), 1);
    // The VMM refuses what does not fit its state: 400 with its reason.
    let refused = call(socket, "PATCH", "/vm", Some(r#"{"state":"Resumed"}"#));
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.fault_message().as_deref(),
        Some("the VM has stopped")
    );
}

#[test]
fn balloon_resources_answer_400_until_a_balloon_exists() {
    let (server, _vmm) = serve("no-balloon", TestVmm::new());
    let requests = [
        ("GET", "/balloon", None),
        ("PATCH", "/balloon", Some(r#"{"amount_mib":64}"#)),
        ("GET", "/balloon/statistics", None),
        (
            "PATCH",
            "/balloon/statistics",
            Some(r#"{"stats_polling_interval_s":1}"#),
        ),
    ];
    for (method, path, body) in requests {
        let response = call(server.path(), method, path, body);
        assert_eq!(response.status, 400, "{method} {path}");
        assert_eq!(
            response.fault_message().as_deref(),
            Some("balloon not configured")
        );
    }
    // A balloon is created before the start only, as in Firecracker.
    let late = call(
        server.path(),
        "PUT",
        "/balloon",
        Some(r#"{"amount_mib":64,"deflate_on_oom":false}"#),
    );
    assert_eq!(
        (late.status, late.fault_message().as_deref()),
        (
            400,
            Some("The requested operation is not supported after starting the microVM.")
        )
    );
}

#[test]
fn balloon_target_and_statistics() {
    let (server, _vmm) = serve("balloon", TestVmm::with_balloon());
    let socket = server.path();
    assert_eq!(
        call(socket, "PATCH", "/balloon", Some(r#"{"amount_mib":64}"#)).status,
        204
    );
    assert_eq!(
        json(&call(socket, "GET", "/balloon", None))["amount_mib"],
        64
    );
    let patch = r#"{"amount_mib":32,"stats_polling_interval_s":2}"#;
    assert_eq!(call(socket, "PATCH", "/balloon", Some(patch)).status, 204);
    let balloon = json(&call(socket, "GET", "/balloon", None));
    assert_eq!(
        (
            balloon["amount_mib"].as_u64(),
            balloon["stats_polling_interval_s"].as_u64()
        ),
        (Some(32), Some(2))
    );
    let interval = r#"{"stats_polling_interval_s":5}"#;
    assert_eq!(
        call(socket, "PATCH", "/balloon/statistics", Some(interval)).status,
        204
    );
    let stats = json(&call(socket, "GET", "/balloon/statistics", None));
    assert_eq!(stats["target_mib"], 32);
    assert_eq!(stats["free_memory"], 100 << 20);
    assert!(
        stats.get("swap_in").is_none(),
        "unreported statistics are left out"
    );
    let too_big = call(socket, "PATCH", "/balloon", Some(r#"{"amount_mib":1024}"#));
    assert_eq!(too_big.status, 400);
    assert!(too_big
        .fault_message()
        .unwrap()
        .contains("exceeds guest RAM"));
    let empty = call(socket, "PATCH", "/balloon", Some("{}"));
    assert_eq!(
        empty.fault_message().as_deref(),
        Some("PATCH /balloon needs amount_mib or stats_polling_interval_s")
    );
}

#[test]
fn unknown_paths_wrong_methods_and_bad_bodies() {
    let (server, _vmm) = serve("errors", TestVmm::new());
    let socket = server.path();
    // Unknown paths and wrong methods: Firecracker's 400.
    for (request, method_and_path) in [
        (&b"GET /snapshot HTTP/1.1\r\n\r\n"[..], "GET /snapshot"),
        (b"DELETE /balloon HTTP/1.1\r\n\r\n", "DELETE /balloon"),
        (b"GET /vm HTTP/1.1\r\n\r\n", "GET /vm"),
        (b"GET /drives/a/b HTTP/1.1\r\n\r\n", "GET /drives/a/b"),
        (
            b"PUT /memory HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            "PUT /memory",
        ),
    ] {
        let (status, fault) = raw_fault(socket, request);
        assert_eq!(
            (status, fault),
            (
                400,
                format!("Invalid request method and/or path: {method_and_path}.")
            )
        );
    }
    let (status, fault) = raw_fault(
        socket,
        b"PUT /drives/ HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!((status, fault.as_str()), (400, "The ID cannot be empty."));
    let (status, fault) = raw_fault(
        socket,
        b"PUT /drives/a-b HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!(
        (status, fault.as_str()),
        (
            400,
            "API Resource IDs can only contain alphanumeric characters and underscores."
        )
    );
    let cases = [
        (
            "PATCH",
            "/vm",
            Some(r#"{"state":"Frozen"}"#),
            "An error occurred when deserializing the json body of a request: unknown variant `Frozen`",
        ),
        (
            "PATCH",
            "/vm",
            Some(r#"{"state":"Paused","extra":1}"#),
            "An error occurred when deserializing the json body of a request: unknown field `extra`",
        ),
        (
            "PUT",
            "/actions",
            Some(r#"{"action_type":"Reboot"}"#),
            "An error occurred when deserializing the json body of a request: unknown variant",
        ),
        (
            "PUT",
            "/actions",
            Some(r#"{"action_type":"SendCtrlAltDel"}"#),
            "the VM has no keyboard controller (only Linux guests have an i8042)",
        ),
        (
            "PUT",
            "/balloon",
            Some(r#"{"amount_mib":-1}"#),
            "An error occurred when deserializing the json body of a request: invalid value",
        ),
        (
            "PUT",
            "/balloon",
            Some("[]"),
            "An error occurred when deserializing the json body of a request",
        ),
        (
            "GET",
            "/machine?verbose=1",
            None,
            "query strings are not supported",
        ),
    ];
    for (method, path, body, message) in cases {
        let response = call(socket, method, path, body);
        assert_eq!(response.status, 400, "{method} {path} {body:?}");
        let fault = response.fault_message().unwrap();
        assert!(fault.starts_with(message), "{fault}");
    }
    let (status, fault) = raw_fault(socket, b"PATCH /vm HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert_eq!((status, fault.as_str()), (400, "Empty PATCH request."));
    let (status, fault) = raw_fault(
        socket,
        b"PATCH /vm HTTP/1.1\r\nContent-Length: 4\r\n\r\n{\xff}x",
    );
    assert_eq!(status, 400, "{fault}");
    let (status, fault) = raw_fault(
        socket,
        b"GET /memory HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!(
        (status, fault.as_str()),
        (400, "GET request cannot have a body.")
    );
}

#[test]
fn malformed_and_oversized_requests_get_json_faults() {
    let (server, _vmm) = serve("malformed", TestVmm::new());
    let socket = server.path();
    let mut huge = b"GET / HTTP/1.1\r\nX: ".to_vec();
    huge.extend(vec![b'a'; 10_000]);
    huge.extend_from_slice(b"\r\n\r\n");
    let cases: [(&[u8], u16, &str); 7] = [
        (
            b"hello\r\n\r\n",
            400,
            "malformed request: the request line is not",
        ),
        (b"\x00\x01\x02\r\n\r\n", 400, "malformed request"),
        (
            b"GET / HTTP/2\r\n\r\n",
            505,
            "HTTP version HTTP/2 not supported",
        ),
        (
            b"PUT /actions HTTP/1.1\r\n\r\n",
            400,
            "the request has no body",
        ),
        (
            b"PUT /balloon HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n",
            413,
            "body of 100000000 bytes exceeds",
        ),
        (&huge, 431, "request line and headers exceed 8192 bytes"),
        (
            b"PUT /vm HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "malformed request: Transfer-Encoding is not supported",
        ),
    ];
    for (bytes, status, message) in cases {
        let (got, fault) = raw_fault(socket, bytes);
        assert_eq!(got, status, "{fault}");
        assert!(fault.starts_with(message), "{fault}");
    }
    // The server still works.
    assert_eq!(call(socket, "GET", "/", None).status, 200);
}

#[test]
fn a_stalled_client_times_out_and_others_are_served_after_it() {
    let (server, _vmm) = serve("stall", TestVmm::new());
    let socket = server.path().to_owned();
    let started = Instant::now();
    let mut stalled = UnixStream::connect(&socket).unwrap();
    stalled.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let mut response = String::new();
    stalled.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.1 408 Request Timeout"),
        "{response}"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    // Clients that vanish mid-request do not hurt either.
    drop(UnixStream::connect(&socket).unwrap());
    let mut half = UnixStream::connect(&socket).unwrap();
    half.write_all(b"PATCH /vm HTTP/1.1\r\nContent-Length: 50\r\n\r\n{")
        .unwrap();
    drop(half);
    assert_eq!(call(&socket, "GET", "/", None).status, 200);
}

#[test]
fn concurrent_clients_all_get_answers() {
    let (server, _vmm) = serve("concurrent", TestVmm::new());
    let socket = server.path().to_owned();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                for _ in 0..25 {
                    assert_eq!(call(&socket, "GET", "/memory", None).status, 200);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn a_panicking_vmm_gives_500_and_the_server_lives_on() {
    // The panic is the test's own: its message and backtrace would only look like a failure.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        if message != Some(PANIC_ON_PURPOSE) {
            report(info);
        }
    }));
    let vmm = TestVmm {
        panic_on_memory: true,
        ..TestVmm::new()
    };
    let (server, _vmm) = serve("panic", vmm);
    let response = call(server.path(), "GET", "/memory", None);
    assert_eq!(response.status, 500);
    assert!(response
        .fault_message()
        .unwrap()
        .starts_with("internal error"));
    assert_eq!(call(server.path(), "GET", "/machine", None).status, 200);
}

#[test]
fn socket_lifecycle_stale_live_and_foreign_paths() {
    let path = socket_path("lifecycle");
    // A stale socket (bound, nobody listening) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let server = ApiServer::start(&path, std::sync::Arc::new(TestVmm::new())).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only the owner may control the VM");
    // A live one is not taken over.
    let err = ApiServer::start(&path, std::sync::Arc::new(TestVmm::new())).unwrap_err();
    assert!(matches!(err, ServerError::InUse(_)), "{err}");
    assert_eq!(call(&path, "GET", "/", None).status, 200);
    drop(server);
    assert!(
        !path.exists(),
        "the socket is removed when the server stops"
    );
    // A file that is not a socket is left alone.
    std::fs::write(&path, b"data").unwrap();
    let err = ApiServer::start(&path, std::sync::Arc::new(TestVmm::new())).unwrap_err();
    assert!(matches!(err, ServerError::NotASocket(_)), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
    std::fs::remove_file(&path).unwrap();
}

/// Reads one response from a kept connection: its head and its Content-Length bytes of body.
fn read_response(stream: &mut UnixStream) -> (String, String) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).unwrap(),
            1,
            "closed mid-head: {head:?}"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    (head, String::from_utf8(body).unwrap())
}

#[test]
fn a_client_sends_request_after_request_on_one_connection_until_it_closes_it() {
    let (server, _vmm) = serve("keep-alive", TestVmm::new());
    let mut stream = UnixStream::connect(server.path()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for (request, status) in [
        (&b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"[..], "200"),
        (b"GET /version HTTP/1.1\r\n\r\n", "200"),
        (b"PATCH /vm HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", "400"),
        (
            b"PATCH /vm HTTP/1.1\r\nContent-Length: 18\r\n\r\n{\"state\":\"Paused\"}",
            "204",
        ),
    ] {
        stream.write_all(request).unwrap();
        let (head, body) = read_response(&mut stream);
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{head}{body}"
        );
        assert!(!head.contains("Connection: close"), "{head}");
    }
    // The last request says it closes: the answer says so and the connection ends.
    stream
        .write_all(b"GET /machine-config HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (head, _) = read_response(&mut stream);
    assert!(head.contains("Connection: close"), "{head}");
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    // HTTP/1.0 closes after one answer unless it asks to keep the connection.
    let mut old = UnixStream::connect(server.path()).unwrap();
    old.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut whole = String::new();
    old.read_to_string(&mut whole).unwrap();
    assert!(whole.starts_with("HTTP/1.1 200 "), "{whole}");
}

#[test]
fn an_idle_kept_connection_makes_room_for_a_new_one_at_the_limit() {
    let (server, _vmm) = serve("keep-alive-limit", TestVmm::new());
    let socket = server.path();
    let mut kept = UnixStream::connect(socket).unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    read_response(&mut kept);
    // Fill the server up with new connections that send nothing yet.
    let fresh: Vec<UnixStream> = (1..vmm_api::server::MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(socket).unwrap())
        .collect();
    // One more: the idle kept connection closes for it, and it is served.
    let mut newcomer = UnixStream::connect(socket).unwrap();
    newcomer
        .write_all(b"GET /version HTTP/1.1\r\n\r\n")
        .unwrap();
    newcomer
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (head, _) = read_response(&mut newcomer);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    kept.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "the kept connection was closed");
    drop(fresh);
}

#[test]
fn requests_firecracker_routes_on_their_first_segment_are_taken_with_any_path_after_it() {
    let (server, _vmm) = serve("first-segment", TestVmm::new());
    let socket = server.path();
    // Firecracker's parser routes these on their first path segment and ignores the rest.
    assert_eq!(call(socket, "GET", "/version/anything", None).status, 200);
    assert_eq!(
        call(socket, "GET", "/machine-config/x/y/z", None).status,
        200
    );
    let vsock = r#"{"guest_cid":3,"uds_path":"/tmp/first-segment.vsock","vsock_id":"vsock0"}"#;
    let request = format!(
        "PUT /vsock/vsock0 HTTP/1.1\r\nContent-Length: {}\r\n\r\n{vsock}",
        vsock.len()
    );
    let response = raw(socket, request.as_bytes());
    assert!(
        !response.contains("Invalid request method and/or path"),
        "{response}"
    );
    // The deprecated vsock_id is answered with Firecracker's Deprecation header.
    assert!(response.contains("\r\nDeprecation: true\r\n"), "{response}");
    // So are snapshot loads with the deprecated mem_file_path or enable_diff_snapshots.
    for load in [
        r#"{"snapshot_path":"/s","mem_file_path":"/m"}"#,
        r#"{"snapshot_path":"/s","mem_backend":{"backend_type":"File","backend_path":"/m"},"enable_diff_snapshots":true}"#,
    ] {
        let request = format!(
            "PUT /snapshot/load HTTP/1.1\r\nContent-Length: {}\r\n\r\n{load}",
            load.len()
        );
        let response = raw(socket, request.as_bytes());
        assert!(response.contains("\r\nDeprecation: true\r\n"), "{response}");
    }
    // Routes that take an id still refuse a longer path.
    let (status, fault) = raw_fault(socket, b"GET /drives/a/b HTTP/1.1\r\n\r\n");
    assert_eq!(status, 400, "{fault}");
}
