//! The userfaultfd fault handler threads of a guest memory.
//!
//! A fault is resolved without any global lock: the chunk is claimed with one compare-and-swap
//! of its frame-table entry, a frame is allocated with the faulting vCPU's own LLFree core id
//! (so each vCPU fills its own reserved tree), mapped over the chunk, and the waiters are woken.
//! A handler thread allocates through its own cache of the vCPU's core
//! ([`crate::pool::CoreFrames`]), taken the first time it serves that vCPU unless another
//! handler thread took it first (then the shared path).
//!
//! When the pool is exhausted, the vCPU's error is recorded, the VMM's event is signalled and the
//! vCPU thread is kicked (on hardware KVM its KVM_RUN returns EINTR). The fault stays pending and
//! is retried every [`RETRY_MS`] until a frame is free (overcommit: another guest may give memory
//! back) or the VM stops ([`crate::GuestMemory::release_faults`]). Each wait is reported
//! once: the kick interrupts the vCPU's wait in the kernel, which then delivers the same fault
//! again, and that repeat only joins the wait.
//!
//! Where a zone records frames for the VM (a restart, a snapshot load), the first handler
//! thread maps them ahead of the guest's touches while no fault is pending (see
//! `region::recorded`), [`MAP_AHEAD_BATCH`] chunks at a time.
//!
//! A fault of a thread that is no vCPU (KVM's asynchronous page fault worker, which resolves
//! most faults of a guest running with interrupts on, or a VMM thread) waits the same way and
//! is reported as the VM's error. Such a wait must end when the VM stops: destroying a KVM VM
//! waits for its asynchronous page fault workers, so a worker left waiting here would leave the
//! VMM in uninterruptible sleep for ever, deaf even to SIGKILL.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::pool::CoreFrames;
use crate::region::Inner;
use crate::region::{GuestRegion, RegionError};
use crate::shared::SharedState;
use crate::stats::Counters;
use crate::sys::uffd::UffdFault;
use crate::sys::{wait_readable, Readiness};
use crate::vcpu::FaultError;

const PAGE: usize = 4096;
/// How often blocked faults are retried.
pub const RETRY_MS: i32 = 5;
/// The most chunks the first handler thread maps ahead (see [`MapAhead`]) before it looks for
/// faults again.
const MAP_AHEAD_BATCH: usize = 64;

/// Running handler threads; stopped and joined on drop.
#[derive(Debug)]
pub(crate) struct FaultHandlers {
    stop: Arc<EventFd>,
    threads: Vec<JoinHandle<()>>,
}

impl FaultHandlers {
    /// Starts `count` threads serving the faults of `inner`, each calling `confine` whenever
    /// it wakes (see [`crate::MemoryConfig::confine_handler`]).
    pub fn spawn(inner: &Arc<Inner>, count: usize, confine: Option<fn()>) -> io::Result<Self> {
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let mut handlers = Self {
            stop,
            threads: Vec::with_capacity(count),
        };
        // One thread maps recorded frames ahead, between faults, where a zone has some.
        let recorded = inner.regions.iter().any(|r| r.table().is_persistent());
        for i in 0..count {
            let (inner, stop) = (Arc::clone(inner), Arc::clone(&handlers.stop));
            let ahead = MapAhead::new(i == 0 && recorded);
            let thread = std::thread::Builder::new()
                .name(format!("guest-mem-fault-{i}"))
                .spawn(move || serve(&inner, &stop, confine, ahead))?;
            handlers.threads.push(thread);
        }
        Ok(handlers)
    }
}

impl Drop for FaultHandlers {
    fn drop(&mut self) {
        // Level-triggered: one write stops every thread.
        let _ = self.stop.write(1);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The cores a handler thread allocates with: per vCPU its core, taken on the first fault the
/// thread serves for that vCPU, with the core's cache unless another handler thread holds it
/// (then the shared path), given back when the thread ends; then the VMM's core, on the shared
/// path (threads that are no vCPU fault rarely: a cache would keep a batch of frames from other
/// VMs for nothing).
struct HandlerCores(Vec<Option<CoreFrames>>);

impl HandlerCores {
    fn new(vcpus: usize) -> Self {
        Self((0..=vcpus).map(|_| None).collect())
    }

    /// This thread's frames of vCPU `vcpu`'s core (`None`: the VMM's core).
    fn of(&mut self, shared: &SharedState, vcpu: Option<usize>) -> &mut CoreFrames {
        let index = vcpu.unwrap_or(shared.vcpus.len());
        self.0[index].get_or_insert_with(|| match vcpu {
            Some(i) => shared.pool.core_frames(shared.core_base + i),
            None => shared.pool.shared_core(shared.vmm_core),
        })
    }
}

/// Where a handler thread stands in mapping the frames a zone records for the VM ahead of
/// the guest's touches (see `region::recorded`): the next region and chunk to look at.
struct MapAhead {
    region: usize,
    chunk: usize,
}

impl MapAhead {
    /// A cursor at the start, or (`active` false) one that has nothing to do.
    fn new(active: bool) -> Self {
        Self {
            region: if active { 0 } else { usize::MAX },
            chunk: 0,
        }
    }

    fn done(&self, inner: &Inner) -> bool {
        self.region >= inner.regions.len()
    }

    /// Maps up to [`MAP_AHEAD_BATCH`] recorded frames. After an error it stops: the rest is
    /// mapped by the guest's faults, as without it.
    fn step(&mut self, inner: &Inner) {
        let counter = &inner.shared.counters.mapped_ahead_chunks;
        while let Some(region) = inner.regions.get(self.region) {
            match region.map_recorded(&mut self.chunk, MAP_AHEAD_BATCH) {
                Ok(mapped) => {
                    counter.fetch_add(mapped as u64, Ordering::Relaxed);
                    if self.chunk >= region.table().len() {
                        self.region += 1;
                        self.chunk = 0;
                    }
                    if mapped > 0 {
                        return;
                    }
                }
                Err(e) => {
                    log::warn!("guest memory: mapping recorded frames ahead stopped: {e}");
                    self.region = usize::MAX;
                    return;
                }
            }
        }
    }
}

fn serve(inner: &Inner, stop: &EventFd, confine: Option<fn()>, mut ahead: MapAhead) {
    let mut cores = HandlerCores::new(inner.shared.vcpus.len());
    let uffd = &inner.shared.uffd;
    let mut faults = [UffdFault {
        address: 0,
        tid: 0,
        write: false,
    }; 16];
    loop {
        let blocked =
            inner.shared.vcpus.any_blocked() || inner.shared.others_wait.load(Ordering::Acquire);
        let timeout = match (blocked, ahead.done(inner)) {
            (true, _) => RETRY_MS,
            // Faults first: mapping ahead goes on only while none is pending.
            (false, false) => 0,
            (false, true) => -1,
        };
        let readiness = wait_readable(uffd, stop, timeout);
        if let Some(confine) = confine {
            confine();
        }
        match readiness {
            Ok(Readiness::Readable) => {}
            Ok(Readiness::TimedOut) => {
                if blocked {
                    retry_blocked(inner, &mut cores);
                }
                ahead.step(inner);
                continue;
            }
            Ok(Readiness::Stopped) | Err(_) => return,
        }
        // Another handler may have taken the messages: then nothing is read.
        let Ok(n) = uffd.read_faults(&mut faults) else {
            return;
        };
        let read_at = Instant::now();
        for fault in &faults[..n] {
            handle(inner, fault, read_at, &mut cores);
        }
    }
}

/// Retries the faults vCPUs and other threads are blocked on.
fn retry_blocked(inner: &Inner, cores: &mut HandlerCores) {
    let shared = &inner.shared;
    if shared.others_wait.load(Ordering::Acquire) {
        let mut others = shared.lock_waiting_others();
        others.retain(|&addr| {
            let Some((region, chunk)) = inner.locate(addr) else {
                return false;
            };
            resolve(shared, region, chunk, None, cores.of(shared, None), addr).is_err()
        });
        shared
            .others_wait
            .store(!others.is_empty(), Ordering::Release);
    }
    for index in 0..shared.vcpus.len() {
        let Some(addr) = shared.vcpus.blocked_on(index) else {
            continue;
        };
        let Some((region, chunk)) = inner.locate(addr) else {
            // Only guest memory is registered: nothing to wait for.
            shared.vcpus.resolve(index, addr);
            continue;
        };
        // The VM is paused: the vCPU keeps waiting (see `SharedState::held`).
        if !shared.begin_blocked_resolution() {
            return;
        }
        // Still no frame: the vCPU keeps waiting, and its error has been reported already.
        let _ = resolve(
            shared,
            region,
            chunk,
            Some(index),
            cores.of(shared, Some(index)),
            addr,
        );
        shared.end_blocked_resolution();
    }
}

/// Populates `chunk` of `region` for the fault of `vcpu` (none: a thread that is no vCPU) at
/// `addr` with the calling thread's frames of the vCPU's core (the VMM's), ends that vCPU's
/// wait on it and wakes the waiters. Returns when the waiters were woken (for the wake latency)
/// and whether this call mapped a new frame.
fn resolve(
    shared: &SharedState,
    region: &GuestRegion,
    chunk: usize,
    vcpu: Option<usize>,
    core: &mut CoreFrames,
    addr: usize,
) -> Result<(Instant, bool), RegionError> {
    let fresh = region.populate(chunk, core)?;
    let counters = &shared.counters;
    if fresh {
        Counters::bump(&counters.faults);
        if let Some(i) = vcpu {
            Counters::bump(&counters.vcpu_faults[i]);
        }
    }
    if let Some(i) = vcpu {
        // Before the wake: once woken, the vCPU may block on this address again (after a
        // discard), and that wait must not be ended here.
        shared.vcpus.resolve(i, addr);
    }
    let (start, len) = region.chunk_range(chunk);
    let waking = Instant::now();
    // Fails only if the range is gone, i.e. the memory is being torn down.
    let _ = shared.uffd.wake(start, len);
    let woken = Instant::now();
    counters.fault_wake.record(woken - waking);
    Ok((woken, fresh))
}

/// Resolves one fault read at `read_at`: populate the chunk with the faulting vCPU's core, then
/// wake.
fn handle(inner: &Inner, fault: &UffdFault, read_at: Instant, cores: &mut HandlerCores) {
    let shared = &inner.shared;
    let Some((region, chunk)) = inner.locate(fault.address) else {
        // Not guest memory (cannot happen: only regions are registered); do not leave it hanging.
        answer_with_zero_page(shared, fault.address);
        return;
    };
    let vcpu = shared.vcpus.index_of(fault.tid);
    // A vCPU that waits already (the kernel delivers its fault anew when its wait is
    // interrupted) waits on while the VM is paused (see `SharedState::held`).
    let waits = vcpu.is_some_and(|i| shared.vcpus.blocked_on(i).is_some());
    if waits && !shared.begin_blocked_resolution() {
        return;
    }
    let result = resolve(
        shared,
        region,
        chunk,
        vcpu,
        cores.of(shared, vcpu),
        fault.address,
    );
    if waits {
        shared.end_blocked_resolution();
    }
    let error = match result {
        Ok((woken, fresh)) => {
            if fresh {
                shared.counters.fault_handling.record(woken - read_at);
            }
            return;
        }
        Err(RegionError::Unplugged { .. }) => {
            // Unplugged while the fault was on its way: the retry meets the inaccessible
            // chunk (KVM fails the access) and takes no frame.
            let (start, len) = region.chunk_range(chunk);
            let _ = shared.uffd.wake(start, len);
            return;
        }
        Err(error) => error,
    };
    let error = match error {
        RegionError::Exhausted(_) => FaultError::PoolExhausted,
        _ => FaultError::MapFailed,
    };
    let Some(i) = vcpu else {
        // Not a vCPU: KVM resolving a guest fault asynchronously (its async page fault worker)
        // or a VMM thread that raced with a discard. It waits for a frame like a vCPU, and is
        // retried with them: the zero page would let its write make an anonymous page outside
        // the pool. Once the VM stops it gets the zero page (under the lock, see `released`).
        let mut others = shared.lock_waiting_others();
        if shared.released() {
            drop(others);
            answer_with_zero_page(shared, fault.address);
            return;
        }
        if !others.contains(&fault.address) {
            if error == FaultError::PoolExhausted {
                Counters::bump(&shared.counters.exhausted);
            }
            others.push(fault.address);
            shared.others_wait.store(true, Ordering::Release);
            drop(others);
            shared.vcpus.report_other(error);
        }
        return;
    };
    // The vCPU waits for a frame (see the module docs). A fault it already waits on is not
    // reported again: the kernel delivers it anew whenever the wait is interrupted, e.g. by the
    // kick that comes with the report.
    if !shared.vcpus.block(i, fault.address) {
        return;
    }
    // A frame freed, or the chunk populated by someone else, between the failed attempt and
    // the wait being recorded would otherwise be noticed only by the next retry, and the error
    // would be reported for nothing. Not while the VM is paused: the vCPU waits on.
    if shared.begin_blocked_resolution() {
        let core = cores.of(shared, vcpu);
        let resolved = resolve(shared, region, chunk, vcpu, core, fault.address).is_ok();
        shared.end_blocked_resolution();
        if resolved {
            return;
        }
    }
    // The VM stopped while this wait was being recorded (the release may not have seen it).
    if shared.released() {
        release_vcpu(shared, i, fault.address);
        return;
    }
    if error == FaultError::PoolExhausted {
        Counters::bump(&shared.counters.exhausted);
    }
    shared.vcpus.report(i, fault.tid, error);
}

/// Ends vCPU `index`'s wait on `addr` with the zero page, unless it no longer waits on it.
fn release_vcpu(shared: &SharedState, index: usize, addr: usize) -> bool {
    shared.vcpus.take_blocked_on(index, addr) && answer_with_zero_page(shared, addr)
}

/// Answers the fault at `addr` with the shared zero page (outside the pool); false if that
/// failed (the memory is being torn down).
fn answer_with_zero_page(shared: &SharedState, addr: usize) -> bool {
    shared.uffd.zero_page(addr & !(PAGE - 1)).is_ok()
}

/// Ends every wait for a frame, now and from now on, with the zero page; returns how many
/// waits it ended (see [`crate::GuestMemory::release_faults`]).
pub(crate) fn release(shared: &SharedState) -> usize {
    let others = {
        let mut waiting = shared.lock_waiting_others();
        shared.released.store(true, Ordering::SeqCst);
        shared.others_wait.store(false, Ordering::Release);
        std::mem::take(&mut *waiting)
    };
    let others = others
        .into_iter()
        .filter(|&addr| answer_with_zero_page(shared, addr))
        .count();
    let vcpus = (0..shared.vcpus.len())
        .filter(|&index| {
            shared
                .vcpus
                .blocked_on(index)
                .is_some_and(|addr| release_vcpu(shared, index, addr))
        })
        .count();
    others + vcpus
}
