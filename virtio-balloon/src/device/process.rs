//! The queue handlers: drain a queue, hand each chain to its parser, check every range against
//! guest RAM and apply it to the backend. Nothing here allocates.

use std::num::Wrapping;
use std::sync::atomic::Ordering;

use log::error;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemory};

use super::{Active, BalloonError, Record};
use crate::backend::{BalloonBackend, GuestNotifier, GuestRange};
use crate::page_report::read_reported_ranges;
use crate::pfn_list::read_pfn_runs;
use crate::queues::QueueRole;
use crate::spec::{BALLOON_PAGE_SIZE, FREE_PAGE_HINT_DONE};
use crate::stats::GuestStats;
use crate::violations::{Violation, Violations};
use crate::{BalloonCounters, MAX_CHAIN_DESCRIPTORS};

/// Applies the buffers of one queue to the backend and the record.
pub(super) struct Handler<'a, B> {
    pub backend: &'a B,
    pub record: &'a mut Record,
    /// The host's free page hinting command (the configuration space's).
    pub host_hint_cmd: u32,
    /// Set when the guest says it is through with a hinting run.
    pub guest_done_hinting: bool,
}

impl<B: BalloonBackend> Handler<'_, B> {
    /// Processes every available buffer of the queue playing `role`.
    pub fn process<M: GuestAddressSpace>(
        &mut self,
        active: &mut Active<M>,
        role: QueueRole,
    ) -> Result<(), BalloonError> {
        let index = active.layout.index(role).unwrap_or_default();
        let guard = active.memory.memory();
        let mem = &*guard;
        let Some(queue) = active.queues[role.slot()].as_mut() else {
            return Ok(());
        };
        let mut refused = 0;
        let used = match role {
            QueueRole::Inflate => drain(queue, mem, index, &mut refused, |chain| {
                self.record.counters.inflate_buffers += 1;
                self.apply_pfn_runs(mem, chain, inflate_range)
            }),
            QueueRole::Deflate => drain(queue, mem, index, &mut refused, |chain| {
                self.record.counters.deflate_buffers += 1;
                self.apply_pfn_runs(mem, chain, deflate_range)
            }),
            QueueRole::Reporting => drain(queue, mem, index, &mut refused, |chain| {
                self.record.counters.report_buffers += 1;
                self.report(chain)
            }),
            QueueRole::FreePageHint => drain(queue, mem, index, &mut refused, |chain| {
                self.record.counters.hint_buffers += 1;
                self.hint(mem, chain)
            }),
            QueueRole::Stats => {
                self.take_stats(queue, mem, index, &mut refused, &mut active.held_stats)
            }
        };
        self.record.violations.record(
            Violation::IndirectDescriptor,
            refused,
            format_args!("queue {index}: indirect descriptors were not offered"),
        );
        if used? {
            notify(queue, mem, active.notifier.as_ref(), index)?;
        }
        Ok(())
    }

    /// Applies every run of page frame numbers in `chain` to the backend with `apply_range`,
    /// page by page where a run is not all RAM.
    fn apply_pfn_runs<G: GuestMemory>(
        &mut self,
        mem: &G,
        chain: DescriptorChain<&G>,
        apply_range: fn(&B, &mut BalloonCounters, &mut Violations, GuestRange),
    ) {
        let Record {
            counters,
            violations,
            ..
        } = &mut *self.record;
        let backend = self.backend;
        read_pfn_runs(mem, chain, violations, |run, violations| {
            for_each_ram_part(backend, run, violations, |range, violations| {
                apply_range(backend, counters, violations, range)
            })
        });
    }

    fn report<G: GuestMemory>(&mut self, chain: DescriptorChain<&G>) {
        let Record {
            counters,
            violations,
            ..
        } = &mut *self.record;
        let backend = self.backend;
        read_reported_ranges(chain, violations, |range, violations| {
            // A reported range is free memory as a whole: one that strays outside RAM is
            // nonsense and dropped (checking its pages one by one would let 16 descriptor
            // bytes cost a million lookups).
            if !backend.is_ram(range) {
                violations.record(
                    Violation::OutsideRam,
                    1,
                    format_args!("reported range {range} is not all guest RAM"),
                );
                return;
            }
            counters.reported_ranges += 1;
            counters.reported_bytes += range.len;
            match backend.discard(range) {
                Ok(freed) => counters.report_freed_frames += freed,
                Err(e) => backend_failure(counters, "discard", range, &e),
            }
        });
    }

    /// A free page hinting buffer (virtio 1.2 §5.5.6.6): a device-readable 4-byte buffer is the
    /// guest's command (the run it hints for, or STOP when it is through); each device-writable
    /// one is a free range, discarded if the guest hints for the run the host has going (hints
    /// of an earlier run, or after the host ended it, are ignored: the guest may use those
    /// pages again).
    fn hint<G: GuestMemory>(&mut self, mem: &G, chain: DescriptorChain<&G>) {
        let Record {
            counters,
            violations,
            guest_hint_cmd,
            ..
        } = &mut *self.record;
        for (position, desc) in chain.enumerate() {
            if position == MAX_CHAIN_DESCRIPTORS {
                violations.record(Violation::ChainTooLong, 1, format_args!("hinting chain"));
                break;
            }
            if !desc.is_write_only() {
                if desc.len() != 4 {
                    violations.record(
                        Violation::Misaligned,
                        1,
                        format_args!("a {}-byte hinting command", desc.len()),
                    );
                    continue;
                }
                match mem.read_obj::<u32>(desc.addr()) {
                    Ok(cmd) => {
                        let cmd = u32::from_le(cmd);
                        *guest_hint_cmd = Some(cmd);
                        if cmd <= FREE_PAGE_HINT_DONE {
                            self.guest_done_hinting = true;
                        }
                    }
                    Err(_) => violations.record(
                        Violation::Unreadable,
                        1,
                        format_args!("hinting command at {:#x}", desc.addr().0),
                    ),
                }
                continue;
            }
            let run = self.host_hint_cmd;
            if run <= FREE_PAGE_HINT_DONE || *guest_hint_cmd != Some(run) {
                continue;
            }
            let range = GuestRange {
                addr: desc.addr(),
                len: u64::from(desc.len()),
            };
            let problem = if range.len == 0 {
                Some(Violation::ZeroLength)
            } else if !range.addr.0.is_multiple_of(BALLOON_PAGE_SIZE)
                || !range.len.is_multiple_of(BALLOON_PAGE_SIZE)
                || range.end().is_none()
            {
                Some(Violation::Misaligned)
            } else if !self.backend.is_ram(range) {
                Some(Violation::OutsideRam)
            } else {
                None
            };
            if let Some(kind) = problem {
                violations.record(kind, 1, format_args!("hinted range {range}"));
                continue;
            }
            counters.hinted_bytes += range.len;
            match self.backend.discard(range) {
                Ok(freed) => counters.hint_freed_frames += freed,
                Err(e) => backend_failure(counters, "discard", range, &e),
            }
        }
    }

    /// Parses new statistics buffers and holds the latest; one held before is returned at once
    /// (the driver should only ever give one).
    fn take_stats<G: GuestMemory>(
        &mut self,
        queue: &mut Queue,
        mem: &G,
        index: u16,
        refused: &mut u64,
        held: &mut Option<u16>,
    ) -> Result<bool, BalloonError> {
        for_each_avail(queue, mem, index, refused, |queue, chain| {
            let head = chain.head_index();
            let record = &mut *self.record;
            record.stats = GuestStats::read(mem, chain, &mut record.violations);
            record.counters.stats_updates += 1;
            let Some(previous) = held.replace(head) else {
                return Ok(false);
            };
            record.violations.record(
                Violation::ExtraStatsBuffer,
                1,
                format_args!("statistics buffer {head} while holding {previous}"),
            );
            queue
                .add_used(mem, previous, 0)
                .map_err(|source| BalloonError::Queue { index, source })?;
            Ok(true)
        })
    }
}

/// Gives the held statistics buffer back, which asks the driver for new statistics.
pub(super) fn return_stats_buffer<M: GuestAddressSpace>(
    active: &mut Active<M>,
) -> Result<bool, BalloonError> {
    let Some(index) = active.layout.index(QueueRole::Stats) else {
        return Ok(false);
    };
    let guard = active.memory.memory();
    let mem = &*guard;
    let (Some(queue), Some(head)) = (
        active.queues[QueueRole::Stats.slot()].as_mut(),
        active.held_stats.take(),
    ) else {
        return Ok(false);
    };
    queue
        .add_used(mem, head, 0)
        .map_err(|source| BalloonError::Queue { index, source })?;
    notify(queue, mem, active.notifier.as_ref(), index)?;
    Ok(true)
}

/// Pops the available chains one by one. A chain the driver published but whose ring entry
/// cannot be read (the ring went bad after activation) is an error rather than the end, so that a
/// driver cannot make the device spin on it.
struct AvailChains {
    index: u16,
    published: Wrapping<u16>,
}

impl AvailChains {
    fn new<G: GuestMemory>(queue: &Queue, mem: &G, index: u16) -> Result<Self, BalloonError> {
        let published = queue
            .avail_idx(mem, Ordering::Acquire)
            .map_err(|source| BalloonError::Queue { index, source })?;
        Ok(Self { index, published })
    }

    fn next<'m, G: GuestMemory>(
        &mut self,
        queue: &mut Queue,
        mem: &'m G,
    ) -> Result<Option<DescriptorChain<&'m G>>, BalloonError> {
        if Wrapping(queue.next_avail()) == self.published {
            return Ok(None);
        }
        let index = self.index;
        let mut chains = queue
            .iter(mem)
            .map_err(|source| BalloonError::Queue { index, source })?;
        chains
            .next()
            .map(Some)
            .ok_or(BalloonError::UnreadableRing(index))
    }
}

/// Hands every available chain of queue `index` to `handle` and puts it in the used ring
/// (nothing is ever written into the buffers, so the used length is 0). Returns whether any
/// chain was used.
fn drain<G: GuestMemory>(
    queue: &mut Queue,
    mem: &G,
    index: u16,
    refused: &mut u64,
    mut handle: impl FnMut(DescriptorChain<&G>),
) -> Result<bool, BalloonError> {
    for_each_avail(queue, mem, index, refused, |queue, chain| {
        let head = chain.head_index();
        handle(chain);
        queue
            .add_used(mem, head, 0)
            .map_err(|source| BalloonError::Queue { index, source })?;
        Ok(true)
    })
}

/// Hands every available chain of queue `index` to `handle` until the driver adds no more
/// (notifications are off while chains are taken, so that none is missed when they come back
/// on). `handle` returns whether it put a buffer in the used ring; so does this, for any chain.
/// A chain with an indirect descriptor is put in the used ring unread and counted in `refused`:
/// the device does not offer VIRTIO_RING_F_INDIRECT_DESC (virtio-queue would follow it).
fn for_each_avail<'m, G: GuestMemory>(
    queue: &mut Queue,
    mem: &'m G,
    index: u16,
    refused: &mut u64,
    mut handle: impl FnMut(&mut Queue, DescriptorChain<&'m G>) -> Result<bool, BalloonError>,
) -> Result<bool, BalloonError> {
    let ring = |source| BalloonError::Queue { index, source };
    let mut used = false;
    loop {
        queue.disable_notification(mem).map_err(ring)?;
        let mut chains = AvailChains::new(queue, mem, index)?;
        while let Some(chain) = chains.next(queue, mem)? {
            let head = chain.head_index();
            if uses_indirect(queue, mem, head) {
                *refused += 1;
                queue.add_used(mem, head, 0).map_err(ring)?;
                used = true;
                continue;
            }
            used |= handle(queue, chain)?;
        }
        if !queue.enable_notification(mem).map_err(ring)? {
            return Ok(used);
        }
    }
}

/// Whether the chain starting at descriptor `head` has a descriptor that refers to an indirect
/// table. Walks the chain as virtio-queue does, at most one queue size of descriptors.
fn uses_indirect<G: GuestMemory>(queue: &Queue, mem: &G, head: u16) -> bool {
    let table = GuestAddress(queue.desc_table());
    let size = queue.size();
    let mut next = head;
    for _ in 0..size {
        if next >= size {
            return false;
        }
        let addr = table
            .0
            .checked_add(u64::from(next) * size_of::<Descriptor>() as u64);
        let Some(Ok(desc)) = addr.map(|a| mem.read_obj::<Descriptor>(GuestAddress(a))) else {
            return false;
        };
        if desc.refers_to_indirect_table() {
            return true;
        }
        if !desc.has_next() {
            return false;
        }
        next = desc.next();
    }
    false
}

/// Raises the used-buffer interrupt of queue `index` if the driver wants one.
fn notify<G: GuestMemory>(
    queue: &mut Queue,
    mem: &G,
    notifier: &dyn GuestNotifier,
    index: u16,
) -> Result<(), BalloonError> {
    let wanted = queue
        .needs_notification(mem)
        .map_err(|source| BalloonError::Queue { index, source })?;
    if wanted {
        notifier.queue_used(index).map_err(BalloonError::Notify)?;
    }
    Ok(())
}

/// Calls `apply` with a run of pages if it is all RAM; otherwise with each of its pages that is,
/// the others counted as violations. The per-page work is bounded by the page frame numbers the
/// guest wrote, one per page.
fn for_each_ram_part<B: BalloonBackend>(
    backend: &B,
    range: GuestRange,
    violations: &mut Violations,
    mut apply: impl FnMut(GuestRange, &mut Violations),
) {
    if range.end().is_some() && backend.is_ram(range) {
        apply(range, violations);
        return;
    }
    let first = range.addr.0 >> crate::spec::VIRTIO_BALLOON_PFN_SHIFT;
    for pfn in first..first + range.pages() {
        let page = GuestRange::from_pfns(pfn, 1);
        if page.end().is_some() && backend.is_ram(page) {
            apply(page, violations);
        } else {
            violations.record(
                Violation::OutsideRam,
                1,
                format_args!("page {:#x} is not guest RAM", page.addr.0),
            );
        }
    }
}

/// Gives a range of RAM pages away.
fn inflate_range<B: BalloonBackend>(
    backend: &B,
    counters: &mut BalloonCounters,
    violations: &mut Violations,
    range: GuestRange,
) {
    match backend.inflate(range) {
        Ok(done) => {
            counters.inflated_pages += done.new_pages;
            counters.inflate_freed_frames += done.freed_frames;
            violations.record(
                Violation::DuplicateInflation,
                range.pages().saturating_sub(done.new_pages),
                format_args!("pages of {range} are inflated already"),
            );
        }
        Err(e) => backend_failure(counters, "inflate", range, &e),
    }
}

/// Takes a range of RAM pages back.
fn deflate_range<B: BalloonBackend>(
    backend: &B,
    counters: &mut BalloonCounters,
    violations: &mut Violations,
    range: GuestRange,
) {
    match backend.deflate(range) {
        Ok(reclaimed) => {
            counters.deflated_pages += reclaimed;
            counters.inflated_pages = counters.inflated_pages.saturating_sub(reclaimed);
            violations.record(
                Violation::NotInflated,
                range.pages().saturating_sub(reclaimed),
                format_args!("pages of {range} were not inflated"),
            );
        }
        Err(e) => backend_failure(counters, "deflate", range, &e),
    }
}

/// Counts a host-side backend failure and logs it (at powers of two, like violations).
fn backend_failure(
    counters: &mut BalloonCounters,
    what: &str,
    range: GuestRange,
    e: &dyn std::error::Error,
) {
    counters.backend_errors += 1;
    if counters.backend_errors.is_power_of_two() {
        error!(
            "virtio-balloon: {what} of {range} failed ({} failures so far): {e}",
            counters.backend_errors
        );
    }
}
