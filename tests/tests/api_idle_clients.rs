//! End-to-end: idle and slow clients cannot starve the API of a real VMM. With 200, 1,000 and
//! 2,000 connections open (one in ten sending a byte every 100 ms, the others nothing), a
//! request on a new connection is answered within 100 ms: the server waits on all of them at
//! once with one thread and no buffer per idle connection.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e_tests::kvm_available;
use vmm_common::{get, Scratch, VmmRun};

/// Raises this process's soft limit of open files to its hard limit.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write a `struct rlimit`, which `limit` is.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

#[test]
fn a_request_is_answered_at_once_beside_thousands_of_idle_and_slow_connections() {
    let test = "a_request_is_answered_at_once_beside_thousands_of_idle_and_slow_connections";
    if !kvm_available(test) {
        return;
    }
    raise_open_file_limit();
    let scratch = Scratch::new("api-idle-clients");
    let socket = scratch.path("api.sock");
    let (vmm, api) = VmmRun::start_paused(
        &["--memory", "32M", "--workload", "write:2M+2M,checkpoint:1"],
        &socket,
    );
    for open in [200, 1000, 2000] {
        let connections: Vec<UnixStream> = (0..open)
            .map(|_| UnixStream::connect(&socket).unwrap())
            .collect();
        // One in ten sends its request a byte at a time.
        let request = b"GET /machine HTTP/1.1\r\n\r\n";
        let stop = AtomicBool::new(false);
        let worst = std::thread::scope(|s| {
            s.spawn(|| {
                for byte in request.iter().cycle().take(50) {
                    for mut slow in connections.iter().step_by(10) {
                        let _ = slow.write_all(std::slice::from_ref(byte));
                    }
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            let worst = (0..10)
                .map(|_| {
                    let asked = Instant::now();
                    assert_eq!(get(&api, "/machine")["state"], "Paused");
                    std::thread::sleep(Duration::from_millis(20));
                    asked.elapsed() - Duration::from_millis(20)
                })
                .max()
                .unwrap();
            stop.store(true, Ordering::Release);
            worst
        });
        eprintln!("{test}: {open} connections open: the slowest of 10 requests took {worst:?}");
        assert!(
            worst < Duration::from_millis(100),
            "{open} connections: {worst:?}"
        );
        drop(connections);
    }
    vmm.kill();
}
