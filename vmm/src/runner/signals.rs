//! SIGINT and SIGTERM as events: blocked while a VM runs and read from a signalfd by the event
//! loop, which stops the VM cleanly instead of the process dying with its guest half done.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use guest_mem::Population;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::progress::{population_advance, ProgressDisplay};
use crate::testguest::PROGRESS_INTERVAL;

/// The signals that stop the VM.
const STOP_SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// A signalfd that reads the stop signals.
#[derive(Debug)]
pub(super) struct SignalFd(OwnedFd);

impl SignalFd {
    /// Takes one pending stop signal, if any.
    pub fn take(&self) -> Option<libc::c_int> {
        let mut info = MaybeUninit::<libc::signalfd_siginfo>::uninit();
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reads at most `size` bytes into `info`, which has room for them.
        let read = unsafe { libc::read(self.0.as_raw_fd(), info.as_mut_ptr().cast(), size) };
        if read != size as isize {
            return None;
        }
        // SAFETY: the kernel filled the whole structure.
        Some(unsafe { info.assume_init() }.ssi_signo as libc::c_int)
    }
}

impl AsRawFd for SignalFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for SignalFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Reads the stop signals on a thread of its own while the VM is being set up (before the event
/// loop exists), so that Ctrl-C interrupts a long eager population; shows that population's
/// progress meanwhile.
pub(super) struct SignalWatch {
    /// Wakes the thread to end the watch.
    done: EventFd,
    thread: Option<JoinHandle<Option<libc::c_int>>>,
}

impl SignalWatch {
    /// Stops watching; returns the stop signal that came meanwhile, if one did.
    pub fn finish(mut self) -> Option<libc::c_int> {
        self.stop()
    }

    fn stop(&mut self) -> Option<libc::c_int> {
        let thread = self.thread.take()?;
        if self.done.write(1).is_err() {
            // The thread cannot be woken: leave it; it ends with the next stop signal.
            return None;
        }
        thread.join().ok().flatten()
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `signals` or `done` is readable, for at most `timeout_ms`.
fn wait_readable(signals: &SignalFd, done: &EventFd, timeout_ms: i32) {
    let mut fds = [signals.as_raw_fd(), done.as_raw_fd()].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: two valid pollfds whose fds outlive the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
}

/// The stop signals, blocked on the thread that created this (and inherited as blocked by the
/// threads it starts afterwards). Dropping it drops pending stop signals and unblocks them.
#[derive(Debug)]
pub(super) struct StopSignals {
    fd: Arc<SignalFd>,
    old_mask: libc::sigset_t,
}

/// The set of [`STOP_SIGNALS`].
fn stop_set() -> libc::sigset_t {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; sigaddset only sets bits of valid signals.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for signal in STOP_SIGNALS {
            libc::sigaddset(set.as_mut_ptr(), signal);
        }
        set.assume_init()
    }
}

impl StopSignals {
    /// Blocks SIGINT and SIGTERM and opens a signalfd for them.
    pub fn block() -> io::Result<Self> {
        let set = stop_set();
        let mut old_mask = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: both pointers are valid sigsets; `old_mask` is written by the call.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, old_mask.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: pthread_sigmask succeeded and filled `old_mask`.
        let old_mask = unsafe { old_mask.assume_init() };
        // SAFETY: `set` is a valid sigset; -1 asks for a new fd.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            let error = io::Error::last_os_error();
            restore_mask(&old_mask);
            return Err(error);
        }
        // SAFETY: `fd` is a fresh fd that nothing else owns.
        let fd = Arc::new(SignalFd(unsafe { OwnedFd::from_raw_fd(fd) }));
        Ok(StopSignals { fd, old_mask })
    }

    /// The signalfd, for the event loop.
    pub fn fd(&self) -> &Arc<SignalFd> {
        &self.fd
    }

    /// Watches for a stop signal until [`SignalWatch::finish`]: the first one cancels
    /// `population`. Every [`PROGRESS_INTERVAL`] that the population of `total` bytes is under
    /// way, prints its progress on stderr.
    pub fn watch(&self, population: Arc<Population>, total: u64) -> io::Result<SignalWatch> {
        let done = EventFd::new(EFD_NONBLOCK)?;
        let thread_done = done.try_clone()?;
        let fd = self.fd.clone();
        let interval_ms = PROGRESS_INTERVAL.as_millis() as i32;
        let thread = std::thread::Builder::new()
            .name("vmm-setup-signals".into())
            .spawn(move || {
                let display = ProgressDisplay::new();
                loop {
                    wait_readable(&fd, &thread_done, interval_ms);
                    if let Some(signal) = fd.take() {
                        population.cancel();
                        return Some(signal);
                    }
                    if thread_done.read().is_ok() {
                        return None;
                    }
                    let populated = population.populated_bytes();
                    if populated > 0 && populated < total {
                        display.show(&[population_advance(populated, total)]);
                    } else {
                        display.show(&[]);
                    }
                }
            })?;
        Ok(SignalWatch {
            done,
            thread: Some(thread),
        })
    }
}

fn restore_mask(mask: &libc::sigset_t) {
    // SAFETY: `mask` is a valid sigset; the old mask is not wanted.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        // A signal that came after the VM stopped was for this run: do not let it kill the
        // process once unblocked.
        while self.fd.take().is_some() {}
        restore_mask(&self.old_mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_stop_signal_is_read_from_the_signalfd() {
        let signals = StopSignals::block().unwrap();
        assert_eq!(signals.fd().take(), None);
        // SAFETY: raises SIGTERM on this thread, which blocks it.
        unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGTERM) };
        assert_eq!(signals.fd().take(), Some(libc::SIGTERM));
        // SAFETY: as above, with SIGINT.
        unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGINT) };
        drop(signals);
        // Pending signals were dropped before unblocking: the test process is still here.
    }
}
