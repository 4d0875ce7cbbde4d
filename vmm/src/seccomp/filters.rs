//! The built-in filters: the system calls each thread kind makes (found by tracing every
//! end-to-end test, per thread), with their arguments checked where that is cheap and
//! matters: sockets only of the Unix domain, new threads but no new processes, `prctl` only to
//! name a thread.

use std::collections::BTreeMap;

use seccompiler::{
    BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

use super::search;
use super::ThreadKind;

/// What every thread does: memory (the allocator, thread stacks), locks, time, randomness
/// (hash maps), signals (vCPU kicks), logging to stderr and file descriptors it holds, thread
/// start and end.
const COMMON: &[i64] = &[
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_tgkill,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigaction,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // Installing a filter (which can only take calls away): a thread stacks its kind's.
    libc::SYS_seccomp,
    // Allowed here, answered ENOSYS by the process filter's companion (its flags cannot be
    // checked): glibc then creates the thread with clone, whose flags are.
    libc::SYS_clone3,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_ctl,
    libc::SYS_fcntl,
    libc::SYS_lseek,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    libc::SYS_kill,
];

/// New kernel objects without a name (no file, no socket): what a device made active by its
/// driver creates (on the vCPU thread that wrote its status), and the rest of the process.
const ANONYMOUS: &[i64] = &[
    libc::SYS_eventfd2,
    libc::SYS_timerfd_create,
    libc::SYS_epoll_create1,
    libc::SYS_pipe2,
    libc::SYS_dup,
    libc::SYS_dup3,
];

/// What the API server and its request threads do besides: accept connections, and answer
/// requests that write snapshots and files (a snapshot, a memory file, the metrics and log
/// files) or change the VM's memory and devices.
const API: &[i64] = &[
    // Any request: the API reads VM state (snapshots), sets taps and rate limiters up.
    libc::SYS_ioctl,
    libc::SYS_accept4,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_openat,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_fstatfs,
    libc::SYS_ftruncate,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_msync,
    libc::SYS_flock,
    libc::SYS_getrusage,
    libc::SYS_prlimit64,
    libc::SYS_uname,
];

/// What the event loop does besides: the devices' host sides (vsock's connections to and from
/// Unix sockets, a pmem flush), nothing that names a file.
const DEVICES: &[i64] = &[
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_msync,
];

/// What a thread does with an asynchronous drive's io_uring (restricted to reads, writes and
/// syncs of the drive's image): the event loop submits and collects; an API request thread waits
/// for what is in flight before a snapshot or a media change, a vCPU thread before its driver's
/// reset of the drive.
const RINGS: &[i64] = &[libc::SYS_io_uring_enter];

/// What only the rest of the process does: set the VM up, open, map and create (zones, pools,
/// userfaultfd, timers, devices' host sides: taps, vsock's Unix sockets).
const VMM_ONLY: &[i64] = &[
    // File system metadata (setup runs under this filter too).
    libc::SYS_getcwd,
    libc::SYS_readlink,
    libc::SYS_statfs,
    libc::SYS_mkdir,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_sysinfo,
    libc::SYS_access,
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_memfd_create,
    libc::SYS_userfaultfd,
    // An asynchronous drive's io_uring and its completion eventfd.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_register,
    libc::SYS_signalfd4,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_connect,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_socketpair,
    libc::SYS_mkdirat,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_arch_prctl,
    libc::SYS_set_tid_address,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
];

/// Calls that a thread whose filter names no file fails with EACCES instead of being stopped:
/// the C library makes them on its own, and copes with the failure.
///
/// glibc's allocator is the one part of the process that any thread runs without asking for
/// it, and every call it makes is in [`COMMON`] (`brk`, `mmap`, `munmap`, `mremap`,
/// `mprotect`, `madvise`, `sched_getaffinity` for its arena count, `writev` and the signal
/// calls of its fatal-error report) but one: the first time a thread's arena gives memory back
/// to the kernel (`free` shrinking a heap, e.g. after hundreds of connections were dropped),
/// it opens `/proc/sys/vm/overcommit_memory` to learn how. Refused, it takes the safe way
/// (`madvise(MADV_DONTNEED)`) and never asks again; stopped, a host client that opened and
/// dropped enough connections would end the VMM. A refused open is as safe as a stopped one:
/// nothing is opened.
const FAIL_QUIETLY: &[i64] = &[libc::SYS_open, libc::SYS_openat];

/// The action of a call in [`FAIL_QUIETLY`].
pub(super) const EACCES: u32 = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
}

/// The ioctls of a vCPU thread: running the vCPU and reading its state (a snapshot's), what
/// logging asks of a terminal, and what a device made active by its driver on the vCPU thread
/// does (a socket made non-blocking, a tap's offloads and header size).
fn vcpu_ioctls() -> [libc::c_ulong; 17] {
    use kvm_bindings::{
        kvm_cpuid2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msrs, kvm_regs, kvm_sregs,
        kvm_vcpu_events, kvm_xcrs, kvm_xsave, KVMIO,
    };
    use vmm_sys_util::ioctl::{ioctl_expr, _IOC_NONE, _IOC_READ, _IOC_WRITE};
    fn size<T>() -> u32 {
        std::mem::size_of::<T>() as u32
    }
    let read = |nr, size| ioctl_expr(_IOC_READ, KVMIO, nr, size);
    let read_write = |nr, size| ioctl_expr(_IOC_READ | _IOC_WRITE, KVMIO, nr, size);
    let tun = |nr| ioctl_expr(_IOC_WRITE, u32::from(b'T'), nr, size::<libc::c_int>());
    [
        ioctl_expr(_IOC_NONE, KVMIO, 0x80, 0),  // KVM_RUN
        read(0x81, size::<kvm_regs>()),         // KVM_GET_REGS
        read(0x83, size::<kvm_sregs>()),        // KVM_GET_SREGS
        read_write(0x88, size::<kvm_msrs>()),   // KVM_GET_MSRS
        read(0x8e, size::<kvm_lapic_state>()),  // KVM_GET_LAPIC
        read_write(0x91, size::<kvm_cpuid2>()), // KVM_GET_CPUID2
        read(0x98, size::<kvm_mp_state>()),     // KVM_GET_MP_STATE
        read(0x9f, size::<kvm_vcpu_events>()),  // KVM_GET_VCPU_EVENTS
        read(0xa1, size::<kvm_debugregs>()),    // KVM_GET_DEBUGREGS
        read(0xa4, size::<kvm_xsave>()),        // KVM_GET_XSAVE
        read(0xa6, size::<kvm_xcrs>()),         // KVM_GET_XCRS
        read(0xcf, size::<kvm_xsave>()),        // KVM_GET_XSAVE2
        libc::TCGETS,
        libc::TIOCGWINSZ,
        libc::FIONBIO,
        tun(208), // TUNSETOFFLOAD
        tun(216), // TUNSETVNETHDRSZ
    ]
}

/// The ioctls of the event loop: a chunk the balloon or an unplug gave back registered with
/// userfaultfd again (guest-mem's handler requests), a socket made non-blocking, what logging
/// asks of a terminal.
fn devices_ioctls() -> [libc::c_ulong; 6] {
    let [register, wake, zeropage] = guest_mem::fault_handler_ioctls();
    [
        register,
        wake,
        zeropage,
        libc::FIONBIO,
        libc::TCGETS,
        libc::TIOCGWINSZ,
    ]
}

/// The calls whose arguments are checked: `clone` only for a thread and `prctl` only to name
/// one, read its name (the SIGSYS handler) or give up privileges (before a filter is stacked),
/// for every kind; `socket` only in the Unix domain (the process); `ioctl` only with the
/// requests of [`vcpu_ioctls`] (a vCPU) or userfaultfd's of a fault handler.
fn checked_rules(
    kind: ThreadKind,
    rules: &mut BTreeMap<i64, Vec<SeccompRule>>,
) -> Result<(), BackendError> {
    let thread = libc::CLONE_THREAD as u64;
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![condition(
            0,
            SeccompCmpOp::MaskedEq(thread),
            thread,
        )?])?],
    );
    let prctl = [
        libc::PR_SET_NAME,
        libc::PR_GET_NAME,
        libc::PR_SET_NO_NEW_PRIVS,
    ]
    .into_iter()
    .map(|option| SeccompRule::new(vec![condition(0, SeccompCmpOp::Eq, option as u64)?]))
    .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_prctl, prctl);
    if matches!(kind, ThreadKind::Vmm | ThreadKind::Devices) {
        let unix = condition(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?;
        rules.insert(libc::SYS_socket, vec![SeccompRule::new(vec![unix])?]);
    }
    let ioctls: &[libc::c_ulong] = match kind {
        ThreadKind::Vcpu => &vcpu_ioctls(),
        ThreadKind::Fault => &guest_mem::fault_handler_ioctls(),
        ThreadKind::Devices => &devices_ioctls(),
        ThreadKind::Vmm | ThreadKind::Api => &[],
    };
    if !ioctls.is_empty() {
        let allowed = ioctls
            .iter()
            .map(|&request| SeccompRule::new(vec![condition(1, SeccompCmpOp::Eq, request)?]))
            .collect::<Result<_, _>>()?;
        rules.insert(libc::SYS_ioctl, allowed);
    }
    Ok(())
}

/// The filter of `kind`: its calls allowed, those of [`FAIL_QUIETLY`] it does not allow failed
/// with EACCES, every other one traps. A search finds the call among the rules (see
/// [`search`]); seccompiler compiles the rules that check arguments.
pub fn program(kind: ThreadKind) -> Result<BpfProgram, BackendError> {
    let rules = rules(kind)?;
    let failing = FAIL_QUIETLY
        .iter()
        .filter(|call| !rules.contains_key(call))
        .map(|&call| (call, search::Rule::Fail(EACCES)));
    let calls: Vec<(i64, search::Rule)> = rules
        .iter()
        .map(|(&call, checks)| {
            let rule = if checks.is_empty() {
                search::Rule::Allow
            } else {
                search::Rule::Checked
            };
            (call, rule)
        })
        .chain(failing)
        .collect();
    let checked = rules
        .into_iter()
        .filter(|(_, checks)| !checks.is_empty())
        .collect();
    Ok(search::in_front_of(
        compile(checked)?,
        &calls,
        SeccompAction::Trap.into(),
        SeccompAction::Allow.into(),
    ))
}

/// The rules of `kind`: per call, none where it is allowed whatever its arguments.
fn rules(kind: ThreadKind) -> Result<BTreeMap<i64, Vec<SeccompRule>>, BackendError> {
    let lists: &[&[i64]] = match kind {
        ThreadKind::Vmm => &[COMMON, ANONYMOUS, API, RINGS, VMM_ONLY],
        ThreadKind::Api => &[COMMON, ANONYMOUS, API, RINGS],
        ThreadKind::Vcpu => &[COMMON, ANONYMOUS, RINGS],
        ThreadKind::Fault => &[COMMON],
        ThreadKind::Devices => &[COMMON, ANONYMOUS, RINGS, DEVICES],
    };
    let mut rules = lists
        .iter()
        .flat_map(|list| list.iter())
        .map(|&call| (call, Vec::new()))
        .collect();
    checked_rules(kind, &mut rules)?;
    Ok(rules)
}

/// `rules` compiled by seccompiler: matches allowed, every other call traps.
fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<BpfProgram, BackendError> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Trap,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )?;
    filter.try_into()
}

/// The companion of the process filter: `clone3`, whose flags live in memory that a filter
/// cannot read, fails with ENOSYS (glibc falls back to `clone`); everything else is left to
/// the other filters.
pub fn clone3_enosys() -> Result<BpfProgram, BackendError> {
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )?;
    filter.try_into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_builds() {
        for kind in ThreadKind::ALL {
            assert!(!program(kind).unwrap().is_empty(), "{kind:?}");
        }
        assert!(!clone3_enosys().unwrap().is_empty());
    }

    /// How a child process that installs `kind`'s filter and then makes `call` ends: `None`
    /// if the call returned (the child exits 0), else the signal that ended it.
    fn killed_by(kind: ThreadKind, call: impl FnOnce()) -> Option<i32> {
        // Built before the fork: the child only installs it and calls.
        let filter = program(kind).unwrap();
        // SAFETY: the child makes only system calls (no allocation, no lock) and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let status = match seccompiler::apply_filter(&filter) {
                Ok(()) => {
                    call();
                    0
                }
                Err(_) => 3,
            };
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(status) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked, writing its status into `status`.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if libc::WIFSIGNALED(status) {
            return Some(libc::WTERMSIG(status));
        }
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child failed to install, or its call did not fail as it should"
        );
        None
    }

    fn ioctl_bad_fd(request: libc::c_ulong) {
        // SAFETY: an ioctl on no file descriptor: EBADF if the filter lets it through.
        unsafe { libc::ioctl(-1, request, 0) };
    }

    /// Opens a file as glibc's allocator does, and ends the child with status 9 unless the
    /// open failed with EACCES.
    fn open_fails_with_eacces() {
        for path in [c"/proc/sys/vm/overcommit_memory", c"/etc/hostname"] {
            // SAFETY: NUL-terminated path; the file, if opened, is closed by `_exit`.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
            let error = std::io::Error::last_os_error().raw_os_error();
            if fd >= 0 || error != Some(libc::EACCES) {
                // SAFETY: ends the child without running the parent's exit handlers.
                unsafe { libc::_exit(9) };
            }
        }
    }

    fn eventfd() {
        // SAFETY: an eventfd, closed by `_exit`.
        unsafe { libc::eventfd(0, 0) };
    }

    /// KVM_RUN, KVM_SET_USER_MEMORY_REGION, KVM_CREATE_VCPU.
    const KVM_IOCTLS: [libc::c_ulong; 3] = [0xae80, 0x4020_ae46, 0xae41];

    /// How a child that makes a socket of `domain` under `kind`'s filter ends.
    fn socket_killed(kind: ThreadKind, domain: i32) -> Option<i32> {
        killed_by(kind, move || socket_of(domain))
    }

    fn socket_of(domain: i32) {
        // SAFETY: plain system call; the socket is closed by `_exit`.
        unsafe { libc::socket(domain, libc::SOCK_STREAM, 0) };
    }

    #[test]
    fn the_process_filter_stops_network_sockets_and_exec_and_lets_unix_sockets_be() {
        let sigsys = Some(libc::SIGSYS);
        assert_eq!(socket_killed(ThreadKind::Vmm, libc::AF_INET), sigsys);
        assert_eq!(socket_killed(ThreadKind::Vmm, libc::AF_INET6), sigsys);
        assert_eq!(socket_killed(ThreadKind::Vmm, libc::AF_NETLINK), sigsys);
        assert_eq!(socket_killed(ThreadKind::Vmm, libc::AF_UNIX), None);
        let exec = || {
            let path = c"/bin/true";
            let argv = [path.as_ptr(), std::ptr::null()];
            let envp = [std::ptr::null()];
            // SAFETY: NUL-terminated path and argument and environment arrays.
            unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        };
        assert_eq!(killed_by(ThreadKind::Vmm, exec), sigsys);
    }

    #[test]
    fn a_fault_handler_makes_userfaultfd_s_ioctls_and_opens_and_runs_nothing() {
        let sigsys = Some(libc::SIGSYS);
        for request in guest_mem::fault_handler_ioctls() {
            let ioctl = move || ioctl_bad_fd(request);
            assert_eq!(killed_by(ThreadKind::Fault, ioctl), None);
        }
        for request in KVM_IOCTLS {
            let ioctl = move || ioctl_bad_fd(request);
            assert_eq!(killed_by(ThreadKind::Fault, ioctl), sigsys);
        }
        assert_eq!(killed_by(ThreadKind::Fault, open_fails_with_eacces), None);
        assert_eq!(killed_by(ThreadKind::Vcpu, open_fails_with_eacces), None);
        assert_eq!(socket_killed(ThreadKind::Fault, libc::AF_UNIX), sigsys);
        assert_eq!(killed_by(ThreadKind::Fault, eventfd), sigsys);
    }

    #[test]
    fn the_event_loop_reaches_unix_sockets_and_userfaultfd_and_names_no_file() {
        let sigsys = Some(libc::SIGSYS);
        for request in devices_ioctls() {
            let ioctl = move || ioctl_bad_fd(request);
            assert_eq!(killed_by(ThreadKind::Devices, ioctl), None);
        }
        // TUNSETIFF (a tap is set up before the guest runs) and the VM's.
        for request in KVM_IOCTLS.into_iter().chain([0x4004_54ca]) {
            let ioctl = move || ioctl_bad_fd(request);
            assert_eq!(killed_by(ThreadKind::Devices, ioctl), sigsys);
        }
        assert_eq!(socket_killed(ThreadKind::Devices, libc::AF_UNIX), None);
        assert_eq!(socket_killed(ThreadKind::Devices, libc::AF_INET), sigsys);
        assert_eq!(killed_by(ThreadKind::Devices, open_fails_with_eacces), None);
        let unlink = || {
            // SAFETY: NUL-terminated path of a file that does not exist.
            unsafe { libc::unlink(c"/nonexistent/llfree-vmm".as_ptr()) };
        };
        assert_eq!(killed_by(ThreadKind::Devices, unlink), sigsys);
        let memfd = || {
            // SAFETY: a memory file, closed by `_exit`.
            unsafe { libc::memfd_create(c"x".as_ptr(), 0) };
        };
        assert_eq!(killed_by(ThreadKind::Devices, memfd), sigsys);
        assert_eq!(killed_by(ThreadKind::Devices, eventfd), None);
    }

    /// Argument vectors that reach each checked rule's either side.
    fn argument_vectors() -> Vec<[u64; 6]> {
        let high = 1 << 32;
        let mut firsts = vec![
            0,
            libc::CLONE_THREAD as u64,
            (libc::CLONE_THREAD | libc::CLONE_VM) as u64,
            libc::CLONE_VM as u64,
            libc::AF_UNIX as u64,
            high | libc::AF_UNIX as u64,
            libc::AF_INET as u64,
        ];
        firsts.extend(
            [
                libc::PR_SET_NAME,
                libc::PR_GET_NAME,
                libc::PR_SET_NO_NEW_PRIVS,
                libc::PR_SET_SECCOMP,
            ]
            .map(|option| option as u64),
        );
        let mut vectors: Vec<[u64; 6]> = firsts.into_iter().map(|a| [a, 0, 0, 0, 0, 0]).collect();
        let requests = vcpu_ioctls()
            .into_iter()
            .chain(devices_ioctls())
            .chain(guest_mem::fault_handler_ioctls())
            .chain(KVM_IOCTLS);
        for request in requests {
            vectors.push([0, request, 0, 0, 0, 0]);
            vectors.push([0, high | request, 0, 0, 0, 0]);
        }
        vectors
    }

    #[test]
    fn the_search_decides_every_call_as_the_compiled_filter_does() {
        use search::tests::{run, Call};
        let vectors = argument_vectors();
        for kind in ThreadKind::ALL {
            let rules = rules(kind).unwrap();
            let fails_quietly = |nr: u32| {
                FAIL_QUIETLY.contains(&i64::from(nr)) && !rules.contains_key(&i64::from(nr))
            };
            let compiled = compile(rules.clone()).unwrap();
            let searched = program(kind).unwrap();
            for nr in (0..=500).chain([0x4000_0000, 0x4000_0001, 0x4000_0010]) {
                for args in &vectors {
                    let call = Call::x86_64(nr, *args);
                    let expected = match fails_quietly(nr) {
                        true => EACCES,
                        false => run(&compiled, &call).0,
                    };
                    assert_eq!(
                        run(&searched, &call).0,
                        expected,
                        "{kind:?}: call {nr} with {args:x?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_call_without_a_rule_is_refused_in_a_few_instructions() {
        use search::tests::{run, Call};
        let execve = Call::x86_64(libc::SYS_execve as u32, [0; 6]);
        let compiled = compile(rules(ThreadKind::Vmm).unwrap()).unwrap();
        let (action, searched_steps) = run(&program(ThreadKind::Vmm).unwrap(), &execve);
        assert_eq!(action, libc::SECCOMP_RET_TRAP);
        let (_, compiled_steps) = run(&compiled, &execve);
        assert!(
            searched_steps <= 20 && compiled_steps > 100,
            "{searched_steps} instructions, {compiled_steps} without the search"
        );
    }

    #[test]
    fn the_vcpu_ioctls_are_the_kernel_s_numbers() {
        let ioctls = vcpu_ioctls();
        // KVM_RUN, KVM_GET_REGS, KVM_GET_SREGS, KVM_GET_MSRS, TUNSETOFFLOAD, TUNSETVNETHDRSZ
        // as the kernel's headers define them.
        for number in [
            0xae80,
            0x8090_ae81,
            0x8138_ae83,
            0xc008_ae88,
            0x4004_54d0,
            0x4004_54d8,
        ] {
            assert!(ioctls.contains(&number), "{number:#x} missing: {ioctls:x?}");
        }
    }

    #[test]
    fn the_lists_do_not_repeat_a_call() {
        let mut all: Vec<i64> = [COMMON, ANONYMOUS, API, RINGS, VMM_ONLY].concat();
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count);
        // The event loop's own calls are the process's: its filter only narrows.
        assert!(DEVICES.iter().all(|call| all.contains(call)));
    }
}
