//! `vmm-bench seccomp`: what the built-in seccomp filters add to one system call, on a thread
//! without filters, then with the process's filter (every thread), then with a vCPU's stacked
//! on it; and on other threads the same with a fault handler's and the event loop's instead
//! of a vCPU's. Calls that fail at once (a bad file descriptor) leave the filter's part: `read`
//! (near the start of the lists; the event loop's read of a queue's notification), `fallocate`
//! (near their end) and `ioctl` (a vCPU's every KVM_RUN; a fault handler's UFFDIO_WAKE after
//! each fault; the event loop's UFFDIO_REGISTER of a chunk the balloon gave back). First, what
//! installing each kind's filters takes (the process's is on the way to the API's first
//! answer and to the guest's start, a vCPU's on the way to its first KVM_RUN).

use std::time::{Duration, Instant};

use vmm::seccomp::{install_built_in, ThreadKind};

use super::Args;

/// Calls per measurement.
const CALLS: u32 = 200_000;

/// The time of one failing call of each kind, the ioctl with `request`.
fn measure(request: libc::c_ulong) -> [Duration; 3] {
    let time = |call: &dyn Fn() -> libc::c_long| {
        let started = Instant::now();
        for _ in 0..CALLS {
            std::hint::black_box(call());
        }
        started.elapsed() / CALLS
    };
    [
        time(&read_bad_fd),
        time(&fallocate_bad_fd),
        time(&|| ioctl_bad_fd(request)),
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

fn ioctl_bad_fd(request: libc::c_ulong) -> libc::c_long {
    // SAFETY: an ioctl on fd -1 fails with EBADF and touches no memory.
    unsafe { libc::syscall(libc::SYS_ioctl, -1, request, 0) }
}

/// KVM_RUN, `_IO(0xAE, 0x80)`.
const KVM_RUN: libc::c_ulong = 0xAE80;

/// Measures `--runs` rounds on a thread of its own (the filters stay on that thread) per
/// stacked kind: a vCPU's, a fault handler's, then the event loop's.
pub fn seccomp(args: &Args) -> Result<(), String> {
    install_times(args.runs)?;
    println!("seccomp: ns per failing call ({CALLS} calls), without filters / with the process's / with the thread kind's too:");
    let [register, wake, _] = guest_mem::fault_handler_ioctls();
    for (kind, ioctl, request) in [
        (ThreadKind::Vcpu, "KVM_RUN", KVM_RUN),
        (ThreadKind::Fault, "UFFDIO_WAKE", wake),
        (ThreadKind::Devices, "UFFDIO_REGISTER", register),
    ] {
        println!("  {}:", kind.name());
        let runs = args.runs;
        let rows = std::thread::spawn(move || stages(kind, request, runs))
            .join()
            .map_err(|_| "the measuring thread panicked".to_string())??;
        let names = ["read", "fallocate", ioctl];
        for (name, row) in names.iter().zip(&rows) {
            let median = |times: &Vec<Duration>| {
                let mut times = times.clone();
                times.sort();
                times[times.len() / 2].as_secs_f64() * 1e9
            };
            let [none, process, own] = [median(&row[0]), median(&row[1]), median(&row[2])];
            println!(
                "    {name:<15} {none:6.1} / {process:6.1} (+{:.1}) / {own:6.1} (+{:.1})",
                process - none,
                own - none
            );
        }
    }
    Ok(())
}

/// The time to install each kind's built-in filters on a new thread, alone and stacked on the
/// process's (as a VMM's threads stack them); median of `runs`, in µs.
fn install_times(runs: usize) -> Result<(), String> {
    println!("seccomp: µs to install a kind's filters on a new thread, alone / on the process's (median of {runs}):");
    for kind in ThreadKind::ALL {
        let median = |stacked: bool| -> Result<f64, String> {
            let mut times = Vec::with_capacity(runs);
            for _ in 0..runs {
                let time = std::thread::spawn(move || {
                    if stacked {
                        install_built_in(ThreadKind::Vmm)?;
                    }
                    let started = Instant::now();
                    install_built_in(kind)?;
                    Ok::<_, vmm::seccomp::SeccompError>(started.elapsed())
                })
                .join()
                .map_err(|_| "the installing thread panicked".to_string())?
                .map_err(|e| e.to_string())?;
                times.push(time);
            }
            times.sort();
            Ok(times[times.len() / 2].as_secs_f64() * 1e6)
        };
        let alone = median(false)?;
        if kind == ThreadKind::Vmm {
            println!("  {:<8} {alone:6.1}", kind.name());
        } else {
            println!("  {:<8} {alone:6.1} / {:6.1}", kind.name(), median(true)?);
        }
    }
    Ok(())
}

/// On the calling thread: `runs` rounds without filters, with the process's, then with
/// `kind`'s stacked; per call (read, fallocate, ioctl `request`) and stage, the times.
fn stages(
    kind: ThreadKind,
    request: libc::c_ulong,
    runs: usize,
) -> Result<Vec<[Vec<Duration>; 3]>, String> {
    let mut rows: Vec<[Vec<Duration>; 3]> = vec![Default::default(); 3];
    // Filters cannot be taken off: each stage runs its rounds, then stacks the next.
    for (stage, kind) in [None, Some(ThreadKind::Vmm), Some(kind)].iter().enumerate() {
        if let Some(kind) = kind {
            install_built_in(*kind).map_err(|e| e.to_string())?;
        }
        for _ in 0..runs {
            for (row, time) in rows.iter_mut().zip(measure(request)) {
                row[stage].push(time);
            }
        }
    }
    Ok(rows)
}
