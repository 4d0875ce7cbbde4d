//! End-to-end overcommit with real Linux: two Linux guests of 256 MiB each share one pool of
//! 344 MiB (`vmm::runner::run_on`, both in this process): room for all of the writer's RAM
//! beside what the first keeps once it has reported its file, not beside the file as well. The
//! first writes 160 MiB into tmpfs and holds it; the second (`--wait-for-memory`) then writes
//! 160 MiB too: the two need more than the pool, which runs dry, and the writer waits. Only
//! then is the first told to delete its file (Ctrl-Alt-Del through its API), and Linux's free
//! page reporting gives the frames back: both finish their workload, by construction whatever
//! the host's speed. (Through KVM's asynchronous page faults, the writer's faults also come from
//! kernel worker threads, which wait for frames like its vCPU.) (The guest is `linux_common`'s;
//! SKIP where it cannot boot, run for real by tests/linux-nested/run.sh.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Parser;
use guest_mem::{Backing, Pool, PoolConfig, Scrub};
use linux_common::{cmdline, LinuxGuest, BOOT_TIMEOUT};
use vmm::config::VmConfig;
use vmm::runner::{run_on, ResetCause, RunOutcome, SPARE_CORES};
use vmm_cli::{ApiClient, Cli, Command};
use vmm_devices::serial::SharedBuffer;

const MIB: u64 = 1 << 20;

/// The VM configuration of `vmm run ARGS`.
fn config(args: &[&str]) -> VmConfig {
    let cli = Cli::try_parse_from(["vmm", "run"].iter().chain(args)).unwrap();
    let Some(Command::Run(args)) = cli.command else {
        panic!("not run")
    };
    VmConfig::try_from(*args).unwrap()
}

/// A VM running on its own thread over `pool`, its console in a buffer.
struct PoolGuest {
    console: SharedBuffer,
    thread: JoinHandle<Result<RunOutcome, String>>,
}

impl PoolGuest {
    fn start(pool: &Arc<Pool>, config: VmConfig) -> Self {
        let console = SharedBuffer::new();
        let (pool, output) = (pool.clone(), console.clone());
        let thread = std::thread::spawn(move || {
            run_on(config, pool, Box::new(output)).map_err(|e| e.to_string())
        });
        PoolGuest { console, thread }
    }

    fn printed(&self, text: &str) -> bool {
        String::from_utf8_lossy(&self.console.contents()).contains(text)
    }

    /// Waits until the console shows `text`; panics with the console on timeout or an end.
    fn wait_for(&self, text: &str) {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        while !self.printed(text) {
            assert!(
                Instant::now() < deadline && !self.thread.is_finished(),
                "no {text:?}: {}",
                String::from_utf8_lossy(&self.console.contents())
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn two_linux_guests_overcommit_one_pool_and_finish_because_one_reports() {
    let test = "two_linux_guests_overcommit_one_pool_and_finish_because_one_reports";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let pool = Pool::new(PoolConfig {
        backing: Backing::Anonymous,
        size: 344 * MIB,
        cores: 2 * (1 + SPARE_CORES),
        scrub: Scrub::PunchHole,
    })
    .unwrap();
    let socket = std::env::temp_dir().join(format!("vmm-overcommit-{}.sock", std::process::id()));
    let socket = socket.to_str().unwrap().to_owned();
    let holder_cmdline = cmdline("llfree.test=fill llfree.mib=160 llfree.hold=cad");
    let holder = PoolGuest::start(
        &pool,
        config(&guest.args(&[
            "--memory",
            "256M",
            "--balloon",
            "free_page_reporting=on",
            "--cmdline",
            &holder_cmdline,
            "--api-socket",
            &socket,
        ])),
    );
    holder.wait_for("LLFREE-L2 filled");
    let writer_cmdline = cmdline("llfree.test=rounds llfree.rounds=1 llfree.mib=160");
    let started = Instant::now();
    let writer = PoolGuest::start(
        &pool,
        config(&guest.args(&[
            "--memory",
            "256M",
            "--wait-for-memory",
            "--cmdline",
            &writer_cmdline,
        ])),
    );
    // The writer must run the pool dry and wait; then the holder frees its file, and the
    // writer goes on once that memory is back in the pool.
    let deadline = Instant::now() + 2 * BOOT_TIMEOUT;
    while pool.stats().free_bytes >= 2 * MIB {
        assert!(
            !writer.thread.is_finished(),
            "the writer ended before the pool ran dry: {}",
            String::from_utf8_lossy(&writer.console.contents())
        );
        assert!(Instant::now() < deadline, "the pool never ran dry");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dry_after = started.elapsed();
    let api = ApiClient::new(&socket);
    let response = api
        .request(
            "PUT",
            "/actions",
            Some(r#"{"action_type":"SendCtrlAltDel"}"#),
        )
        .unwrap();
    assert_eq!(response.status, 204, "{}", response.body);
    holder.wait_for("LLFREE-L2 freed");
    while !writer.thread.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the writer never finished: {}",
            String::from_utf8_lossy(&writer.console.contents())
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        writer.printed("LLFREE-L2 rounds-done"),
        "{:?}: {}",
        writer.thread.join().unwrap(),
        String::from_utf8_lossy(&writer.console.contents())
    );
    eprintln!(
        "{test}: writer: {}",
        String::from_utf8_lossy(&writer.console.contents())
            .lines()
            .filter(|l| l.contains("LLFREE-L2") || l.contains("Out of memory"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let outcome = writer.thread.join().unwrap();
    assert_eq!(
        outcome,
        Ok(RunOutcome::GuestReset(ResetCause::Keyboard)),
        "the writer rebooted when done"
    );
    // What let the writer go on: chunks the holder reported free (memory its boot left free,
    // then its file once freed) went back to the pool.
    let memory = api.request("GET", "/memory", None).unwrap().body;
    let memory: serde_json::Value = serde_json::from_str(&memory).unwrap();
    let reported = memory["guest"]["discarded_chunks"].as_u64().unwrap();
    assert!(reported > 0, "{memory:#}");
    eprintln!(
        "{test}: the pool ran dry {dry_after:.1?} after the writer's start, the writer finished \
         after {:.1?}; the holder reported {reported} chunks free",
        started.elapsed()
    );
    let response = api
        .request("PUT", "/actions", Some(r#"{"action_type":"Shutdown"}"#))
        .unwrap();
    assert_eq!(response.status, 204, "{}", response.body);
    let outcome = holder.thread.join().unwrap();
    assert_eq!(
        outcome,
        Ok(RunOutcome::Stopped(vmm::runner::StopCause::Api))
    );
}
