//! Optional CPU pinning of the vCPU thread (the calling thread) and of guest-mem's fault handler
//! threads: on one CPU, or on two.
//!
//! Where the two sides run decides what a fault costs: across CPUs, the handler's mmap needs a
//! TLB-shootdown IPI and its wake-up an IPI to the vCPU's CPU, and on this host (itself a VM)
//! every IPI is trapped by the outer hypervisor.

use std::fs;
use std::io;
use std::mem;
use std::sync::atomic::{AtomicU8, Ordering};

use clap::ValueEnum;

/// Where the threads run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[repr(u8)]
pub enum Pinning {
    /// Wherever the scheduler puts them.
    None,
    /// vCPU and fault handlers on CPU 0.
    Same,
    /// vCPU on CPU 0, fault handlers on CPU 1.
    Split,
}

static MODE: AtomicU8 = AtomicU8::new(Pinning::None as u8);

/// Pins threads by `mode` from now on.
pub fn set(mode: Pinning) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

fn mode() -> Pinning {
    match MODE.load(Ordering::Relaxed) {
        1 => Pinning::Same,
        2 => Pinning::Split,
        _ => Pinning::None,
    }
}

/// What the results' case names get appended.
pub fn suffix() -> &'static str {
    match mode() {
        Pinning::None => "",
        Pinning::Same => "+same-cpu",
        Pinning::Split => "+split-cpu",
    }
}

fn set_affinity(tid: libc::pid_t, cpu: usize) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    // SAFETY: `cpu` is 0 or 1, inside the set.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, mem::size_of_val(&set), &set) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Pins the calling thread (the vCPU) and every fault handler thread of the process, by the
/// mode set; call after creating guest memory (which starts its handlers).
pub fn pin_threads() -> Result<(), String> {
    let handler_cpu = match mode() {
        Pinning::None => return Ok(()),
        Pinning::Same => 0,
        Pinning::Split => 1,
    };
    let err = |e: io::Error| format!("pinning: {e}");
    set_affinity(0, 0).map_err(err)?;
    for task in fs::read_dir("/proc/self/task").map_err(err)? {
        let path = task.map_err(err)?.path();
        let comm = fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.starts_with("guest-mem-fault") {
            continue;
        }
        let tid = path
            .file_name()
            .and_then(|n| n.to_str()?.parse().ok())
            .ok_or_else(|| format!("bad task entry {}", path.display()))?;
        set_affinity(tid, handler_cpu).map_err(err)?;
    }
    Ok(())
}
