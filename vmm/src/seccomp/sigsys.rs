//! What a denied system call does: the kernel sends the thread SIGSYS, whose handler writes a
//! line to stderr naming the thread and the call, counts it and ends the process with
//! [`BAD_SYSCALL_EXIT_STATUS`]. It does only what a signal handler may: no allocation, no lock;
//! its calls (`write`, `exit_group`, and `prctl` where the thread's name is not noted) must be
//! allowed by every filter, or the kernel ends the process with SIGSYS itself.
//!
//! Where the VMM has socket files ([`vmm_devices::socket_files`]), the process ends through its exit
//! watcher instead, a thread under the process filter alone that the handler wakes: it removes
//! them (the thread that made the call may not be allowed to) and exits. Should it not within
//! about a second (the handler counts the time stamp counter, which takes no system call), or
//! should the watcher itself be denied a call, the handler exits.

use std::cell::Cell;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use vmm_sys_util::eventfd::EventFd;

use vmm_api::metrics::METRICS;

/// The exit status of a VMM that made a system call its filter denies (Firecracker's).
pub const BAD_SYSCALL_EXIT_STATUS: i32 = 148;

thread_local! {
    /// Whether the calling thread is the exit watcher.
    static IS_EXIT_WATCHER: Cell<bool> = const { Cell::new(false) };
    /// The calling thread's name, as the kernel knows it (NUL-padded), once it stacked a filter
    /// that may deny asking for it.
    static THREAD_NAME: Cell<[u8; 16]> = const { Cell::new([0; 16]) };
}

/// Notes the calling thread's name for the handler, before the thread stacks a filter.
pub(super) fn note_thread_name() {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into `name`.
    if unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } == 0 {
        THREAD_NAME.set(name);
    }
}

/// Time stamp counter ticks the handler waits for the exit watcher: about a second at 2-4 GHz.
const WATCHER_WAIT_TICKS: u64 = 3_000_000_000;

/// The exit watcher's eventfd, -1 before it runs.
static EXIT_WATCHER: AtomicI32 = AtomicI32::new(-1);

/// Starts the exit watcher: it waits on an eventfd the handler writes to, then removes the
/// socket files and ends the process.
fn start_exit_watcher() -> io::Result<()> {
    let event = EventFd::new(libc::EFD_CLOEXEC)?;
    let fd = event.as_raw_fd();
    std::thread::Builder::new()
        .name("vmm-exit".into())
        .spawn(move || {
            // First, so that the handler knows this thread should a filter deny it even its
            // next call.
            IS_EXIT_WATCHER.set(true);
            // Process-directed signals (SIGINT, SIGTERM) are for the threads that wait for
            // them: blocked here, whichever thread started this one. SIGSYS is not: a denied
            // call with SIGSYS blocked makes the kernel kill the process without the handler's
            // line, and the filters may be installed before this thread first waits.
            // SAFETY: a full signal set, initialised by sigfillset, less SIGSYS, blocked on
            // this thread.
            unsafe {
                let mut all = std::mem::zeroed::<libc::sigset_t>();
                libc::sigfillset(&mut all);
                libc::sigdelset(&mut all, libc::SIGSYS);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
            loop {
                if event.read().is_ok() {
                    vmm_devices::socket_files::remove_all();
                    // SAFETY: ends the process, as the handler would.
                    unsafe { libc::_exit(BAD_SYSCALL_EXIT_STATUS) };
                }
            }
        })?;
    EXIT_WATCHER.store(fd, Ordering::Release);
    Ok(())
}

/// Installs the handler for the whole process, and its exit watcher.
pub(super) fn install_handler() -> io::Result<()> {
    start_exit_watcher()?;
    // SAFETY: an all-zero sigaction is valid (no flags, empty mask), and the handler is
    // filled in below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handle as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO;
    // SAFETY: the action is a valid sigaction and the handler has the SA_SIGINFO signature.
    match unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The system call number of a SIGSYS's `siginfo_t`: its `_sigsys` fields follow the three
/// leading ints and their padding (`void *_call_addr` at byte 16, `int _syscall` at 24).
const SYSCALL_OFFSET: usize = 24;

extern "C" fn handle(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo_t for SIGSYS, whose `_syscall` lies at
    // SYSCALL_OFFSET (x86_64).
    let call = unsafe {
        info.cast::<u8>()
            .add(SYSCALL_OFFSET)
            .cast::<i32>()
            .read_unaligned()
    };
    METRICS.seccomp_faults.inc();
    // A thread that stacked a filter of its own noted its name; another one asks for it (every
    // built-in filter allows PR_GET_NAME).
    let mut name = THREAD_NAME.get();
    if name[0] == 0 {
        // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into `name`.
        unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    }
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let mut line = ReportLine::default();
    line.push(b"vmm: seccomp: thread '");
    line.push(&name[..name_len]);
    line.push(b"' made system call ");
    line.push_number(call);
    line.push(b", which its filter denies: the VMM stops (exit status 148)\n");
    // SAFETY: `line` holds `len` initialised bytes; write is async-signal-safe.
    unsafe { libc::write(2, line.bytes.as_ptr().cast(), line.len) };
    let watcher = EXIT_WATCHER.load(Ordering::Acquire);
    if watcher >= 0 && vmm_devices::socket_files::any() && !IS_EXIT_WATCHER.get() {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes to the watcher's eventfd; async-signal-safe.
        unsafe { libc::write(watcher, one.as_ptr().cast(), one.len()) };
        // SAFETY: reading the time stamp counter has no precondition.
        let start = unsafe { core::arch::x86_64::_rdtsc() };
        // SAFETY: as above.
        while unsafe { core::arch::x86_64::_rdtsc() }.wrapping_sub(start) < WATCHER_WAIT_TICKS {
            std::hint::spin_loop();
        }
    }
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(BAD_SYSCALL_EXIT_STATUS) };
}

/// A line built without allocating.
struct ReportLine {
    bytes: [u8; 160],
    len: usize,
}

impl Default for ReportLine {
    fn default() -> Self {
        Self {
            bytes: [0; 160],
            len: 0,
        }
    }
}

impl ReportLine {
    fn push(&mut self, text: &[u8]) {
        let room = self.bytes.len() - self.len;
        let take = text.len().min(room);
        self.bytes[self.len..self.len + take].copy_from_slice(&text[..take]);
        self.len += take;
    }

    fn push_number(&mut self, number: i32) {
        let mut digits = [0u8; 11];
        let mut at = digits.len();
        let mut rest = number.unsigned_abs();
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if number < 0 {
            self.push(b"-");
        }
        self.push(&digits[at..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_holds_numbers_and_stops_at_its_end() {
        let mut line = ReportLine::default();
        line.push(b"call ");
        line.push_number(0);
        line.push(b" ");
        line.push_number(435);
        line.push(b" ");
        line.push_number(-7);
        assert_eq!(&line.bytes[..line.len], b"call 0 435 -7");
        line.push(&[b'x'; 200]);
        assert_eq!(line.len, 160);
    }
}
