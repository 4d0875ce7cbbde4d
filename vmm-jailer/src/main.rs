//! `vmm-jailer`: starts a VMM confined as Firecracker's jailer confines Firecracker, with its
//! flags. In order: check every value; build the root `<base>/<exec name>/<id>/root` (the
//! VMM copied in with its ELF interpreter and libraries, nodes of /dev/kvm, /dev/net/tun and
//! /dev/userfaultfd, a `run` directory for the API socket); set the resource limits; place
//! the process in its cgroups; enter a mount namespace whose root is that directory
//! (`pivot_root`, the old root detached; over an initramfs, a move and `chroot`); join the
//! network namespace; daemonize; start a PID namespace; become the uid/gid with no
//! capabilities and no_new_privs; exec the VMM with `--id <id>`, Firecracker's
//! `--start-time-us` and `--start-time-cpu-us` (and `--parent-cpu-time-us` after a fork into a
//! PID namespace), the arguments after `--` and an empty environment.

mod args;
mod cgroup;
mod libraries;
mod privileges;
mod root;

use std::ffi::CString;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use nix::sched::{setns, unshare, CloneFlags};
use nix::unistd::{dup2_stderr, dup2_stdin, dup2_stdout, execve, fork, setsid, ForkResult};
use nix::unistd::{Gid, Uid};
use thiserror::Error;

use args::{Args, ArgsError};
use root::Root;

/// Every way the jailer fails (it then exits with status 1 and says why on stderr).
#[derive(Debug, Error)]
enum JailError {
    /// A flag's value.
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The exec file's libraries.
    #[error(transparent)]
    Libraries(#[from] libraries::LibrariesError),
    /// The root.
    #[error(transparent)]
    Root(#[from] root::RootError),
    /// The cgroups.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    /// Limits, uid/gid, capabilities.
    #[error(transparent)]
    Privileges(#[from] privileges::PrivilegesError),
    /// A file the jailer opens before entering the root.
    #[error("cannot open {0}: {1}")]
    Open(String, #[source] std::io::Error),
    /// A namespace or process step.
    #[error("cannot {0}: {1}")]
    Process(&'static str, #[source] nix::Error),
    /// The network namespace could not be joined.
    #[error(
        "cannot join the network namespace {0} (--netns names one, e.g. /var/run/netns/NAME): {1}"
    )]
    Netns(String, #[source] nix::Error),
    /// An argument holds a NUL byte.
    #[error("an argument holds a NUL byte: {0:?}")]
    Argument(String),
}

fn main() -> ExitCode {
    let started_us = monotonic_us();
    let args = Args::parse();
    match jail(&args, started_us) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("vmm-jailer: error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every step; returns only on failure, or in the parent of `--new-pid-ns`.
/// `started_us`: the jailer's start on the monotonic clock, passed on to the VMM.
fn jail(args: &Args, started_us: u64) -> Result<(), JailError> {
    let plan = args.validate()?;
    close_inherited_files();
    let exec_name = &plan.exec_name;
    let (uid, gid) = (Uid::from_raw(args.uid), Gid::from_raw(args.gid));
    let root = Root::open(&args.chroot_base_dir, &[exec_name, &args.id], uid, gid)?;

    root.copy_in(&args.exec_file, Path::new(exec_name))?;
    for file in libraries::needed_by(&args.exec_file)? {
        root.copy_in(&file, file.strip_prefix("/").unwrap_or(&file))?;
    }
    root.make_devices()?;
    root.give_dir("run")?;
    root.give_dir("")?;

    privileges::set_limits(&plan.limits)?;
    cgroup::place(
        args.cgroup_version,
        &plan.cgroups,
        &plan.parent_cgroup,
        &args.id,
        std::process::id(),
    )?;
    // Non-blocking: a FIFO named instead of a namespace must not hold the jailer (setns then
    // refuses what is no namespace).
    let netns = match &args.netns {
        Some(path) => Some(
            File::options()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
                .map_err(|e| open_error(path, e))?,
        ),
        None => None,
    };
    let null = match args.daemonize {
        true => Some(
            File::options()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(|e| open_error(Path::new("/dev/null"), e))?,
        ),
        false => None,
    };

    root.enter()?;
    if let (Some(netns), Some(path)) = (netns, &args.netns) {
        setns(netns, CloneFlags::CLONE_NEWNET)
            .map_err(|e| JailError::Netns(path.display().to_string(), e))?;
    }
    if let Some(null) = null {
        setsid().map_err(|e| JailError::Process("start a session (setsid)", e))?;
        dup2_stdin(&null).map_err(|e| JailError::Process("redirect stdin", e))?;
        dup2_stdout(&null).map_err(|e| JailError::Process("redirect stdout", e))?;
        dup2_stderr(&null).map_err(|e| JailError::Process("redirect stderr", e))?;
    }
    let mut parent_cpu_us = None;
    if args.new_pid_ns {
        parent_cpu_us = Some(cpu_us());
        unshare(CloneFlags::CLONE_NEWPID)
            .map_err(|e| JailError::Process("unshare the PID namespace", e))?;
        // SAFETY: the jailer has one thread; the child only drops privileges and execs.
        match unsafe { fork() }.map_err(|e| JailError::Process("fork", e))? {
            ForkResult::Parent { child } => {
                let pid_file = format!("{exec_name}.pid");
                root::write_new(Path::new("/"), &pid_file, &child.to_string())?;
                return Ok(());
            }
            ForkResult::Child => {}
        }
    }
    privileges::drop_to(args.uid, args.gid)?;
    let mut times = vec![
        "--start-time-us".to_owned(),
        started_us.to_string(),
        "--start-time-cpu-us".to_owned(),
        cpu_us().to_string(),
    ];
    if let Some(parent) = parent_cpu_us {
        times.extend(["--parent-cpu-time-us".to_owned(), parent.to_string()]);
    }
    exec(exec_name, args, times)
}

/// The monotonic clock, in microseconds (the VMM's startup metrics count from it).
fn monotonic_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1000
    })
}

/// The CPU time this process used, in microseconds.
fn cpu_us() -> u64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).map_or(0, |u| {
        let total = u.user_time() + u.system_time();
        total.tv_sec() as u64 * 1_000_000 + total.tv_usec() as u64
    })
}

fn open_error(path: &Path, error: std::io::Error) -> JailError {
    JailError::Open(path.display().to_string(), error)
}

/// Closes every file descriptor above stderr that the jailer was started with.
fn close_inherited_files() {
    // SAFETY: close_range takes two numbers and flags and only closes descriptors; nothing
    // of this process holds one above 2 yet.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
}

/// Execs `/<exec_name> --id <id> <times> <vmm args>` with an empty environment.
fn exec(exec_name: &str, args: &Args, times: Vec<String>) -> Result<(), JailError> {
    let text = [format!("/{exec_name}"), "--id".into(), args.id.clone()]
        .into_iter()
        .chain(times)
        .chain(args.vmm_args.iter().cloned());
    let argv: Vec<CString> = text
        .map(|a| CString::new(a.clone()).map_err(|_| JailError::Argument(a)))
        .collect::<Result<_, _>>()?;
    let env: [CString; 0] = [];
    let error = execve(&argv[0], &argv, &env).unwrap_err();
    Err(JailError::Process("exec the VMM", error))
}
