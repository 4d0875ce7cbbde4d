//! `vmm-bench seccomp`: what the built-in seccomp filters add to one system call, on a thread
//! without filters, then with the process's filter (every thread: fault handlers, the event
//! loop), then with a vCPU's stacked on it. Calls that fail at once (a bad file descriptor)
//! leave the filter's part: `read` (near the start of the lists), `fallocate` (near their end)
//! and `ioctl` (every KVM_RUN).

use std::time::{Duration, Instant};

use vmm::seccomp::{install_built_in, ThreadKind};

use super::Args;

/// Calls per measurement.
const CALLS: u32 = 200_000;

/// The time of one failing call of each kind.
fn measure() -> [(&'static str, Duration); 3] {
    let time = |call: &dyn Fn() -> libc::c_long| {
        let started = Instant::now();
        for _ in 0..CALLS {
            std::hint::black_box(call());
        }
        started.elapsed() / CALLS
    };
    [
        ("read", time(&read_bad_fd)),
        ("fallocate", time(&fallocate_bad_fd)),
        ("ioctl", time(&kvm_run_bad_fd)),
    ]
}

fn read_bad_fd() -> libc::c_long {
    let mut byte = 0u8;
    // SAFETY: a read of at most one byte into `byte`; fd -1 makes it fail with EBADF.
    unsafe { libc::syscall(libc::SYS_read, -1, std::ptr::addr_of_mut!(byte), 1) }
}

fn fallocate_bad_fd() -> libc::c_long {
    // SAFETY: fallocate of fd -1 fails with EBADF and touches no memory.
    unsafe { libc::syscall(libc::SYS_fallocate, -1, 0, 0, 4096) }
}

fn kvm_run_bad_fd() -> libc::c_long {
    // SAFETY: KVM_RUN (_IO(0xAE, 0x80)) on fd -1 fails with EBADF and touches no memory.
    unsafe { libc::syscall(libc::SYS_ioctl, -1, 0xAE80, 0) }
}

/// Measures `--runs` rounds on a thread of its own (the filters stay on that thread).
pub fn seccomp(args: &Args) -> Result<(), String> {
    let runs = args.runs;
    std::thread::spawn(move || -> Result<(), String> {
        println!("seccomp: ns per failing call ({CALLS} calls), without filters / with the process's / with a vCPU's too:");
        let mut rows: Vec<[Vec<Duration>; 3]> = vec![Default::default(); 3];
        let stages = [None, Some(ThreadKind::Vmm), Some(ThreadKind::Vcpu)];
        // Filters cannot be taken off: each stage runs its rounds, then stacks the next.
        for (stage, kind) in stages.iter().enumerate() {
            if let Some(kind) = kind {
                install_built_in(*kind).map_err(|e| e.to_string())?;
            }
            for _ in 0..runs {
                for (row, (_, time)) in rows.iter_mut().zip(measure()) {
                    row[stage].push(time);
                }
            }
        }
        let names = ["read", "fallocate", "ioctl"];
        for (name, row) in names.iter().zip(&rows) {
            let median = |times: &Vec<Duration>| {
                let mut times = times.clone();
                times.sort();
                times[times.len() / 2].as_secs_f64() * 1e9
            };
            let [none, process, vcpu] = [median(&row[0]), median(&row[1]), median(&row[2])];
            println!(
                "  {name:<9} {none:6.1} / {process:6.1} (+{:.1}) / {vcpu:6.1} (+{:.1})",
                process - none,
                vcpu - none
            );
        }
        Ok(())
    })
    .join()
    .map_err(|_| "the measuring thread panicked".to_string())?
}
