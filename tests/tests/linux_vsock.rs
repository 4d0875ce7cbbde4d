//! End-to-end, real Linux (nested, see `linux_common`): Firecracker's hybrid vsock with Linux's
//! virtio-vsock driver and `vsock-tool` (tests/src/bin) in the guest.
//!
//! The guest sends 4 MiB to a listener of this test at `<uds_path>_5001` (both sides check the
//! CRC); the test connects through `uds_path` (`CONNECT 5000`), pushes 4 MiB into the guest's
//! sink and echoes bytes. Then the VM is paused, snapshotted into a memory file and killed; a
//! new VMM process loads it with `vsock_override` (a new socket), and the echo and the guest's
//! send work again there: the guest heard of the transport reset and kept its listener.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use e2e_tests::vsock_pattern;
use linux_common::{cmdline, field, LinuxGuest, BOOT_TIMEOUT};
use vmm_common::{send, wait_for_state, Scratch, VmmRun};

const GUEST_PORT: u32 = 5000;
const HOST_PORT: u32 = 5001;
const TIMEOUT: Duration = Duration::from_secs(300);

/// The CRC of `mib` MiB of the shared sequence.
fn pattern_crc(mib: u64) -> String {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0;
    while at < mib << 20 {
        vsock_pattern(at, &mut buf);
        hasher.update(&buf);
        at += buf.len() as u64;
    }
    format!("{:08x}", hasher.finalize())
}

/// Answers `connections` guest connections on `listener` (the guest's `send`): reads to the
/// end and answers with the length and CRC, on a thread of its own.
fn sink(listener: UnixListener, connections: usize) {
    std::thread::spawn(move || {
        for _ in 0..connections {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            stream.set_read_timeout(Some(TIMEOUT)).unwrap();
            let mut hasher = crc32fast::Hasher::new();
            let mut buf = vec![0u8; 64 << 10];
            let mut len = 0u64;
            while let Ok(n @ 1..) = stream.read(&mut buf) {
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            let _ = writeln!(stream, "len={len} crc={:08x}", hasher.finalize());
        }
    });
}

/// A connection to the guest's port through the device's socket `uds`.
fn connect(uds: &str, port: u32) -> (UnixStream, String) {
    let mut stream = UnixStream::connect(uds).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    writeln!(stream, "CONNECT {port}").unwrap();
    let mut line = String::new();
    BufReader::new(stream.try_clone().unwrap())
        .read_line(&mut line)
        .unwrap();
    (stream, line)
}

/// Echoes `text` through the guest's echo: what came back.
fn try_echo(uds: &str, text: &[u8]) -> std::io::Result<Vec<u8>> {
    let (mut stream, ok) = connect(uds, GUEST_PORT);
    if !ok.starts_with("OK ") {
        return Err(std::io::Error::other(format!(
            "the handshake answered {ok:?}"
        )));
    }
    let mut back = vec![0u8; text.len()];
    stream.write_all(b"echo\n")?;
    stream.write_all(text)?;
    stream.read_exact(&mut back)?;
    Ok(back)
}

/// Echoes `text` through the guest's echo; what came back, or a panic with the VMM's log and
/// console.
fn echo(uds: &str, text: &[u8], vmm: &VmmRun) -> Vec<u8> {
    let result = try_echo(uds, text);
    if let Err(e) = &result {
        panic!(
            "echo: {e}; the VMM's log: {}; the console: {}",
            vmm.stderr_so_far(),
            vmm.stdout_so_far()
        );
    }
    result.unwrap_or_default()
}

/// Asserts that a "vsock-sent" line reports `mib` MiB with the right CRC, as the host saw it.
fn assert_sent(line: &str, mib: u64) {
    let crc = pattern_crc(mib);
    assert_eq!(field(line, "crc"), Some(crc.as_str()), "{line}");
    let reply = field(line, "reply").unwrap_or_default();
    assert_eq!(reply, format!("len={},crc={crc}", mib << 20), "{line}");
}

#[test]
fn linux_talks_to_host_programs_over_vsock_both_ways_before_and_after_a_snapshot() {
    let test = "linux_talks_to_host_programs_over_vsock_both_ways_before_and_after_a_snapshot";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    // A short directory: a Unix socket's path is at most 107 bytes.
    let scratch = Scratch::new("l-vsock");
    let (uds, socket) = (scratch.path("v.sock"), scratch.path("api.sock"));
    sink(UnixListener::bind(format!("{uds}_{HOST_PORT}")).unwrap(), 1);
    let vsock = format!("cid=3,uds={uds}");
    let cmdline = cmdline(&format!(
        "llfree.test=vsock llfree.port={GUEST_PORT} llfree.hostport={HOST_PORT} llfree.mib=4"
    ));
    let mut vmm = VmmRun::start(&guest.args(&[
        "--memory",
        "128M",
        "--vsock",
        &vsock,
        "--api-socket",
        &socket,
        "--cmdline",
        &cmdline,
    ]));
    let api = vmm.api(&socket);
    vmm.wait_for_line("LLFREE-L2 vsock-listening", BOOT_TIMEOUT);

    // Guest to host: 4 MiB, both sides agree on the CRC.
    let sent = vmm.wait_for_line("LLFREE-L2 vsock-sent", TIMEOUT);
    eprintln!("{test}: {sent}");
    assert_sent(&sent, 4);

    // Host to guest: 4 MiB into the guest's sink; an echo.
    let (mut stream, ok) = connect(&uds, GUEST_PORT);
    assert!(ok.starts_with("OK "), "{ok:?}");
    stream.write_all(b"sink\n").unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for at in (0..4u64 << 20).step_by(buf.len()) {
        vsock_pattern(at, &mut buf);
        stream.write_all(&buf).unwrap();
    }
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert_eq!(
        reply.trim(),
        format!("len={} crc={}", 4 << 20, pattern_crc(4))
    );
    assert_eq!(
        echo(&uds, b"before the snapshot", &vmm),
        b"before the snapshot"
    );

    // A snapshot into a memory file; the VMM dies; a new one loads it on another socket.
    vmm.wait_for_line("LLFREE-L2 vsock-wait-go", TIMEOUT);
    send(&api, "PATCH", "/vm", r#"{"state":"Paused"}"#);
    let (snapshot, memory) = (scratch.path("vm.snap"), scratch.path("vm.mem"));
    send(
        &api,
        "PUT",
        "/snapshot/create",
        &format!(
            r#"{{"snapshot_type":"Full","snapshot_path":"{snapshot}","mem_file_path":"{memory}"}}"#
        ),
    );
    vmm.kill();
    let (uds2, socket2) = (scratch.path("v2.sock"), scratch.path("api2.sock"));
    sink(
        UnixListener::bind(format!("{uds2}_{HOST_PORT}")).unwrap(),
        1,
    );
    let mut loaded = VmmRun::start_command(&["--api-sock", &socket2]);
    let api = loaded.api(&socket2);
    send(
        &api,
        "PUT",
        "/snapshot/load",
        &format!(
            r#"{{"snapshot_path":"{snapshot}","mem_backend":{{"backend_type":"File","backend_path":"{memory}"}},"vsock_override":{{"uds_path":"{uds2}"}},"resume_vm":true}}"#
        ),
    );
    wait_for_state(&api, "Running");
    // The guest handles the transport-reset event in a work item of its own: a connection it
    // accepted just before that is reset too (as under Firecracker). A later one stays.
    let echoed = (0..3)
        .find_map(|attempt| {
            std::thread::sleep(Duration::from_secs(attempt));
            try_echo(&uds2, b"after the restore").ok()
        })
        .unwrap_or_else(|| echo(&uds2, b"after the restore", &loaded));
    assert_eq!(echoed, b"after the restore");
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    let again = loaded.wait_for_line("LLFREE-L2 vsock-sent", TIMEOUT);
    eprintln!("{test}: {again}");
    assert_sent(&again, 1);
    loaded.wait_for_line("LLFREE-L2 idle", TIMEOUT);
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    // A Firecracker-style VMM ends with 0 when its guest resets.
    let done = loaded.wait(Duration::from_secs(120));
    assert_eq!(done.code, Some(0), "{done:#?}");
}
