//! End-to-end, real Linux (nested, see `linux_common`): the guest's virtio-net interface over a
//! tap, in a network namespace the test makes for itself (every packet stays there).
//!
//! Linux's virtio-net driver brings eth0 up; the guest pings the host side of the tap, fetches
//! a blob over HTTP from a server in this test (host to guest, checked by MD5), fetches it
//! again after `PATCH /network-interfaces/eth0` gave it a receive rate limiter (the transfer
//! takes as long as the limiter says), and serves random bytes the test fetches (guest to
//! host, checked by MD5); it reads its MMDS V2 document with a session token (and V1's without,
//! in a second VM, whose vCPUs a custom CPU template changed); and the Firecracker Go SDK boots
//! it with a network interface, vsock and MMDS V2 and reaches it through each. Each loop is
//! bounded: the server answers two requests, every wait has
//! a deadline.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use linux_common::{
    add_tap, cmdline, field, md5_of_file, pattern, private_network, start_networked, LinuxGuest,
    NetworkedVm, BOOT_TIMEOUT,
};
use serde_json::json;
use vmm_cli::ApiClient;
use vmm_common::{send, Scratch, VmmRun};

const TAP: &str = "tap0";
const HOST: &str = "10.0.2.1";
const GUEST: &str = "10.0.2.2";
const PORT: u16 = 8000;
/// The blob the guest fetches.
const BLOB_MIB: usize = 2;
/// The receive rate limiter of the second fetch: 512 KiB a second.
const LIMIT_BYTES_PER_S: usize = 512 << 10;
/// How long a transfer may take under QEMU/TCG.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);

/// Moves the calling test thread into a network namespace of its own with a tap at
/// 10.0.2.1/24, up.
fn private_tap() {
    private_network();
    add_tap(TAP, &format!("{HOST}/24"));
}

/// The MD5 of `bytes`, by busybox's md5sum (the guest's own tool).
fn md5(scratch: &Scratch, bytes: &[u8]) -> String {
    let path = scratch.path("md5-input");
    std::fs::write(&path, bytes).unwrap();
    md5_of_file(&path)
}

/// Answers `requests` HTTP GETs on `listener` with `body`, on a thread of its own.
fn serve(listener: TcpListener, body: Vec<u8>, requests: usize) {
    std::thread::spawn(move || {
        for _ in 0..requests {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            stream.set_read_timeout(Some(TRANSFER_TIMEOUT)).unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 512];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
                match stream.read(&mut buf) {
                    Ok(n @ 1..) => request.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            let header = format!(
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(header.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
}

/// `GET /path` from the guest's httpd; the body.
fn fetch_from_guest(path: &str) -> Vec<u8> {
    let address: SocketAddr = format!("{GUEST}:8080").parse().unwrap();
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(60)).unwrap();
    stream.set_read_timeout(Some(TRANSFER_TIMEOUT)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let at = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP response");
    assert!(
        response.starts_with(b"HTTP/1.") && response.get(8..13) == Some(b" 200 "),
        "{:?}",
        &response[..at]
    );
    response.split_off(at + 4)
}

/// The MMDS document's instance id.
const INSTANCE_ID: &str = "i-0llfree";

/// Configures the VM of `guest` with `cmdline` through `api` as Firecracker's users do: eth0
/// on the tap, MMDS `version` holding the instance id; then starts it.
fn configure(api: &ApiClient, guest: &LinuxGuest, cmdline: &str, version: &str) {
    let vm = NetworkedVm {
        cmdline,
        tap: TAP,
        mac: "06:00:0a:00:02:02",
        mmds_version: version,
        mmds: json!({"latest": {"meta-data": {"instance-id": INSTANCE_ID}}}),
    };
    start_networked(api, guest, vm);
}

#[test]
fn linux_reads_its_mmds_v1_document_without_a_token_on_vcpus_a_cpu_template_changed() {
    let test = "linux_reads_its_mmds_v1_document_without_a_token_on_vcpus_a_cpu_template_changed";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new(test);
    private_tap();
    let socket = scratch.path("api.sock");
    let cmdline = cmdline(&format!(
        "llfree.test=mmds llfree.mmds=v1 llfree.ip={GUEST}"
    ));
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    // A custom CPU template clears CPUID.1:ECX.AES[bit 25] on every vCPU.
    let template = json!({"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
        "modifiers": [{"register": "ecx", "bitmap": "0bxxxxxx0xxxxxxxxxxxxxxxxxxxxxxxxx"}]}]});
    send(&api, "PUT", "/cpu-config", &template.to_string());
    configure(&api, &guest, &cmdline, "V1");
    let mmds = vmm.wait_for_line("LLFREE-L2 mmds", BOOT_TIMEOUT);
    eprintln!("{test}: {mmds}");
    assert_eq!(field(&mmds, "instance-id"), Some(INSTANCE_ID), "{mmds}");
    assert_eq!(
        field(&mmds, "aes"),
        Some("0"),
        "the template's change: {mmds}"
    );
    // The document changes while the VM runs, as the API's GET shows.
    send(
        &api,
        "PATCH",
        "/mmds",
        r#"{"latest":{"meta-data":{"ami-id":"ami-1"}}}"#,
    );
    let document = vmm_common::get(&api, "/mmds");
    assert_eq!(document["latest"]["meta-data"]["ami-id"], "ami-1");
    assert_eq!(document["latest"]["meta-data"]["instance-id"], INSTANCE_ID);
    vmm.wait_for_line("LLFREE-L2 idle", BOOT_TIMEOUT);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    // A Firecracker-style VMM ends with 0 when its guest resets.
    let done = vmm.wait(Duration::from_secs(120));
    assert_eq!(done.code, Some(0), "{done:#?}");
}

#[test]
fn the_firecracker_go_sdk_boots_linux_with_a_network_interface_vsock_and_mmds_and_reaches_it() {
    let test = "the_firecracker_go_sdk_boots_linux_with_a_network_interface_vsock_and_mmds";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let Some(sdk) = std::env::var("LLFREE_VMM_FC_SDK")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file())
    else {
        eprintln!(
            "SKIP: {test}: LLFREE_VMM_FC_SDK names no program; tests/linux-nested/run.sh builds it"
        );
        return;
    };
    // A short directory: the vsock socket's path is at most 107 bytes.
    let scratch = Scratch::new("l-sdk-net");
    private_tap();
    let dir = scratch.path("run");
    std::fs::create_dir(&dir).unwrap();
    let boot_args = cmdline("llfree.test=sdk-net llfree.mmds=v2");
    let args = [
        "-vmm",
        e2e_tests::vmm_binary(),
        "-kernel",
        &guest.kernel,
        "-initrd",
        &guest.initrd,
        "-dir",
        &dir,
        "-mem-mib",
        "128",
        "-boot-args",
        &boot_args,
        "-tap",
        TAP,
    ];
    // Under emulation a request takes longer than the SDK's 500 ms.
    let timeouts = [
        ("FIRECRACKER_GO_SDK_REQUEST_TIMEOUT_MILLISECONDS", "120000"),
        ("FIRECRACKER_GO_SDK_INIT_TIMEOUT_SECONDS", "120"),
    ];
    e2e_tests::run_sdk_program(&sdk, &args, &timeouts);
}

#[test]
fn linux_exchanges_tcp_with_the_host_through_its_tap_both_ways_and_under_a_rate_limiter() {
    let test =
        "linux_exchanges_tcp_with_the_host_through_its_tap_both_ways_and_under_a_rate_limiter";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new(test);
    private_tap();
    let data = pattern(BLOB_MIB << 20, 0x2545_f491_4f6c_dd1d);
    let data_md5 = md5(&scratch, &data);
    serve(TcpListener::bind((HOST, PORT)).unwrap(), data, 2);
    let socket = scratch.path("api.sock");
    let cmdline = cmdline(&format!(
        "llfree.test=net llfree.go=cad llfree.mmds=v2 llfree.ip={GUEST} llfree.host={HOST} \
         llfree.port={PORT} llfree.mib=2"
    ));
    // Firecracker's way: the API configures the VM, MMDS V2 on its interface, and the
    // document, then starts it.
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    configure(&api, &guest, &cmdline, "V2");
    vmm.wait_for_line("LLFREE-L2 ready", BOOT_TIMEOUT);
    let up = vmm.wait_for_line("LLFREE-L2 net-up", TRANSFER_TIMEOUT);
    eprintln!("{test}: {up}");
    // MMDS V2: the document with a token; without one, refused.
    let mmds = vmm.wait_for_line("LLFREE-L2 mmds", TRANSFER_TIMEOUT);
    eprintln!("{test}: {mmds}");
    assert_eq!(field(&mmds, "instance-id"), Some(INSTANCE_ID), "{mmds}");
    assert_ne!(field(&mmds, "without-token"), Some(INSTANCE_ID), "{mmds}");
    // Without a CPU template the guest has AES (the other test's template takes it away).
    assert_eq!(field(&mmds, "aes"), Some("1"), "{mmds}");
    let ping = vmm.wait_for_line("LLFREE-L2 ping", TRANSFER_TIMEOUT);
    assert!(ping.contains("ping ok"), "{}", vmm.stdout_so_far());

    // Host to guest, at full speed.
    let first = vmm.wait_for_line("LLFREE-L2 received round=1", TRANSFER_TIMEOUT);
    eprintln!("{test}: {first}");
    assert_eq!(field(&first, "md5"), Some(data_md5.as_str()), "{first}");
    assert_eq!(field(&first, "kib"), Some("2048"), "{first}");

    // Again, under a receive limiter of 512 KiB/s: the first 512 KiB pass at once (the bucket
    // starts full), the other 1.5 MiB take at least three seconds.
    vmm.wait_for_line("LLFREE-L2 wait-go", TRANSFER_TIMEOUT);
    let limiter = format!(
        r#"{{"iface_id":"eth0","rx_rate_limiter":{{"bandwidth":{{"size":{LIMIT_BYTES_PER_S},"refill_time":1000}}}}}}"#
    );
    send(&api, "PATCH", "/network-interfaces/eth0", &limiter);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    let second = vmm.wait_for_line("LLFREE-L2 received round=2", TRANSFER_TIMEOUT);
    eprintln!("{test}: {second}");
    assert_eq!(field(&second, "md5"), Some(data_md5.as_str()), "{second}");
    let limited: f64 = field(&second, "seconds").unwrap().parse().unwrap();
    let floor = ((BLOB_MIB << 20) - LIMIT_BYTES_PER_S) as f64 / LIMIT_BYTES_PER_S as f64;
    assert!(
        limited >= floor * 0.9,
        "{second}: the limiter lets 512 KiB/s through, so at least {floor} s"
    );

    // Guest to host.
    let serving = vmm.wait_for_line("LLFREE-L2 serving", TRANSFER_TIMEOUT);
    eprintln!("{test}: {serving}");
    let out = fetch_from_guest("/out");
    assert_eq!(out.len(), 2 << 20);
    assert_eq!(Some(md5(&scratch, &out).as_str()), field(&serving, "md5"));

    vmm.wait_for_line("LLFREE-L2 idle", TRANSFER_TIMEOUT);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    // A Firecracker-style VMM ends with 0 when its guest resets.
    let done = vmm.wait(Duration::from_secs(120));
    assert_eq!(done.code, Some(0), "{done:#?}");
}
