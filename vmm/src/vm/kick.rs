//! Kicking a vCPU thread out of `KVM_RUN`: `kick_thread` sends it [`kick_signal`], whose
//! handler sets `immediate_exit` in that thread's own `kvm_run` (found through a thread-local
//! pointer), so a kick that lands just before `KVM_RUN` is not lost: `KVM_RUN` returns `EINTR`
//! at once and the run loop looks at the pending request. Also which vCPU the calling thread
//! runs.

use std::cell::Cell;
use std::sync::Once;

use kvm_bindings::kvm_run;

thread_local! {
    /// The `kvm_run` of the vCPU this thread runs, for the kick signal handler.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
    /// Index of the vCPU this thread runs.
    static VCPU_INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The signal that kicks vCPU threads out of `KVM_RUN`: the first real-time signal.
pub fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

extern "C" fn handle_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only async-signal-safe work: one thread-local read and one volatile store.
    let run = KVM_RUN.with(Cell::get);
    if !run.is_null() {
        // SAFETY: `run` points at this thread's mapped `kvm_run`; the pointer is cleared before
        // the mapping goes away, and a signal handler runs on the thread it interrupts.
        unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

/// Installs the kick signal handler once per process.
pub(super) fn install_handler() -> Result<(), vmm_sys_util::errno::Error> {
    static INSTALL: Once = Once::new();
    let mut result = Ok(());
    INSTALL.call_once(|| {
        result = vmm_sys_util::signal::register_signal_handler(kick_signal(), handle_kick);
    });
    result
}

/// Sends the kick signal to a vCPU thread.
pub(crate) fn kick_thread(thread: libc::pthread_t) {
    // SAFETY: `thread` is a vCPU thread that has not been joined (the caller checks it has not
    // ended under the control lock), and the kick signal has a handler.
    unsafe { libc::pthread_kill(thread, kick_signal()) };
}

/// The index of the vCPU the calling thread runs, if it is a vCPU thread.
pub fn current_vcpu_index() -> Option<usize> {
    VCPU_INDEX.with(Cell::get)
}

/// Notes the vCPU the calling thread runs and its `kvm_run`; clears the pointer when dropped.
pub(super) struct ClearKvmRun;

impl ClearKvmRun {
    /// Notes that this thread runs vCPU `index`, whose `kvm_run` is at `run`.
    pub(super) fn set(index: usize, run: *mut kvm_run) -> Self {
        VCPU_INDEX.with(|i| i.set(Some(index)));
        KVM_RUN.with(|r| r.set(run));
        ClearKvmRun
    }
}

impl Drop for ClearKvmRun {
    fn drop(&mut self) {
        KVM_RUN.with(|r| r.set(std::ptr::null_mut()));
    }
}
