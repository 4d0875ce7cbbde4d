//! Test helpers: a backend that records every call and models per-chunk bitmaps, a notifier that
//! counts interrupts, and a driver that writes real split rings into a `GuestMemoryMmap`.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::backend::{BalloonBackend, GuestNotifier, GuestRange, Inflated};
use crate::spec::BALLOON_PAGE_SIZE;

/// Chunk (host frame) size the recording backend models.
pub const CHUNK: u64 = 2 << 20;
/// Pages per chunk.
pub const CHUNK_PAGES: u64 = CHUNK / BALLOON_PAGE_SIZE;
/// Guest RAM of the tests: two regions around a hole that stands for MMIO.
pub const RAM: [(u64, u64); 2] = [(0, 16 << 20), (32 << 20, 16 << 20)];
/// Where the driver puts its buffers.
pub const BUFFERS: u64 = 1 << 20;
/// Where the first queue's rings start; each queue gets 64 KiB.
const QUEUES: u64 = 0x1_0000;

/// A backend call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendCall {
    /// `inflate(range)`.
    Inflate(GuestRange),
    /// `deflate(range)`.
    Deflate(GuestRange),
    /// `discard(range)`.
    Discard(GuestRange),
    /// `deflate_all()`.
    DeflateAll,
}

#[derive(Debug, Default)]
struct BackendState {
    calls: Vec<BackendCall>,
    given_away: BTreeSet<u64>,
}

/// A backend over [`RAM`] that records calls and panics on any range that is not aligned,
/// non-empty RAM: the device must never hand out anything else.
#[derive(Debug, Default)]
pub struct RecordingBackend {
    state: Mutex<BackendState>,
    /// When set, every operation fails.
    pub failing: AtomicBool,
}

impl RecordingBackend {
    /// The calls so far.
    pub fn calls(&self) -> Vec<BackendCall> {
        self.state.lock().unwrap().calls.clone()
    }

    /// Whether page `pfn` is given away.
    pub fn is_given_away(&self, pfn: u64) -> bool {
        self.state.lock().unwrap().given_away.contains(&pfn)
    }

    fn check(&self, range: GuestRange) -> io::Result<()> {
        assert!(
            range.len > 0
                && range.addr.0.is_multiple_of(BALLOON_PAGE_SIZE)
                && range.len.is_multiple_of(BALLOON_PAGE_SIZE),
            "device passed an unaligned or empty range {range}"
        );
        assert!(
            self.is_ram(range),
            "device passed {range}, which is not RAM"
        );
        if self.failing.load(Ordering::Relaxed) {
            return Err(io::Error::other("injected failure"));
        }
        Ok(())
    }

    fn pfns(range: GuestRange) -> std::ops::Range<u64> {
        let first = range.addr.0 / BALLOON_PAGE_SIZE;
        first..first + range.pages()
    }
}

impl BalloonBackend for RecordingBackend {
    type Error = io::Error;

    fn is_ram(&self, range: GuestRange) -> bool {
        let Some(end) = range.end() else { return false };
        RAM.iter()
            .any(|&(start, len)| range.addr.0 >= start && end <= start + len)
    }

    fn inflate(&self, range: GuestRange) -> io::Result<Inflated> {
        self.check(range)?;
        let mut state = self.state.lock().unwrap();
        state.calls.push(BackendCall::Inflate(range));
        let mut done = Inflated::default();
        for pfn in Self::pfns(range) {
            done.new_pages += u64::from(state.given_away.insert(pfn));
        }
        let chunks = range.addr.0 / CHUNK..range.end().unwrap().div_ceil(CHUNK);
        for chunk in chunks {
            let pages = chunk * CHUNK_PAGES..(chunk + 1) * CHUNK_PAGES;
            if state.given_away.range(pages).count() as u64 == CHUNK_PAGES {
                done.freed_frames += 1;
            }
        }
        Ok(done)
    }

    fn deflate(&self, range: GuestRange) -> io::Result<u64> {
        self.check(range)?;
        let mut state = self.state.lock().unwrap();
        state.calls.push(BackendCall::Deflate(range));
        Ok(Self::pfns(range)
            .map(|pfn| u64::from(state.given_away.remove(&pfn)))
            .sum())
    }

    fn discard(&self, range: GuestRange) -> io::Result<u64> {
        self.check(range)?;
        self.state
            .lock()
            .unwrap()
            .calls
            .push(BackendCall::Discard(range));
        let first_whole = range.addr.0.div_ceil(CHUNK);
        let end_whole = range.end().unwrap() / CHUNK;
        Ok(end_whole.saturating_sub(first_whole))
    }

    fn deflate_all(&self) -> io::Result<u64> {
        let mut state = self.state.lock().unwrap();
        state.calls.push(BackendCall::DeflateAll);
        let pages = state.given_away.len() as u64;
        state.given_away.clear();
        Ok(pages)
    }
}

/// Counts interrupts.
#[derive(Debug, Default)]
pub struct CountingNotifier {
    used: [AtomicU64; 4],
    config: AtomicU64,
    needs_reset: AtomicU64,
}

impl CountingNotifier {
    /// Used-buffer interrupts of queue `index` so far.
    pub fn used(&self, index: u16) -> u64 {
        self.used[usize::from(index)].load(Ordering::Relaxed)
    }

    /// Configuration change interrupts so far.
    pub fn config(&self) -> u64 {
        self.config.load(Ordering::Relaxed)
    }

    /// Needs-reset notifications so far (each also counts as a configuration change).
    pub fn needs_reset_count(&self) -> u64 {
        self.needs_reset.load(Ordering::Relaxed)
    }
}

impl GuestNotifier for CountingNotifier {
    fn queue_used(&self, index: u16) -> io::Result<()> {
        self.used[usize::from(index)].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn config_changed(&self) -> io::Result<()> {
        self.config.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn needs_reset(&self) -> io::Result<()> {
        self.needs_reset.fetch_add(1, Ordering::Relaxed);
        self.config_changed()
    }
}

/// The tests' guest memory: [`RAM`] as a `GuestMemoryMmap`.
pub fn guest_memory() -> Arc<GuestMemoryMmap> {
    let ranges: Vec<_> = RAM
        .iter()
        .map(|&(a, l)| (GuestAddress(a), l as usize))
        .collect();
    Arc::new(GuestMemoryMmap::from_ranges(&ranges).unwrap())
}

/// One buffer of a chain: address, length and whether the device may write it.
pub type Buffer = (u64, u32, bool);

struct DriverQueue<'a> {
    mock: MockSplitQueue<'a, GuestMemoryMmap>,
    size: u16,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

/// The driver side of the queues, writing real descriptor tables and rings.
pub struct Driver<'a> {
    mem: &'a GuestMemoryMmap,
    queues: Vec<DriverQueue<'a>>,
}

impl<'a> Driver<'a> {
    /// `count` queues of `size` entries.
    pub fn new(mem: &'a GuestMemoryMmap, count: u16, size: u16) -> Self {
        let queues = (0..u64::from(count))
            .map(|i| DriverQueue {
                mock: MockSplitQueue::create(mem, GuestAddress(QUEUES * (i + 1)), size),
                size,
                next_desc: 0,
                avail_idx: 0,
                used_seen: 0,
            })
            .collect();
        Self { mem, queues }
    }

    /// The device side of the queues, as a transport hands them over.
    pub fn device_queues(&self) -> Vec<(u16, Queue)> {
        let queue = |q: &DriverQueue<'_>| q.mock.create_queue::<Queue>().unwrap();
        (0..).zip(self.queues.iter().map(queue)).collect()
    }

    /// Writes `pfns` as le32 at `addr`; returns the byte length.
    pub fn write_pfns(&self, addr: u64, pfns: &[u32]) -> u32 {
        let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.mem.write_slice(&bytes, GuestAddress(addr)).unwrap();
        bytes.len() as u32
    }

    /// Writes `bytes` at `addr`.
    pub fn write(&self, addr: u64, bytes: &[u8]) {
        self.mem.write_slice(bytes, GuestAddress(addr)).unwrap();
    }

    /// Makes a chain of `buffers` available on queue `index`; returns its head.
    pub fn add_chain(&mut self, index: u16, buffers: &[Buffer]) -> u16 {
        let q = &mut self.queues[usize::from(index)];
        let head = q.next_desc;
        for (i, &(addr, len, writable)) in buffers.iter().enumerate() {
            let at = q.next_desc;
            q.next_desc = (q.next_desc + 1) % q.size;
            let last = i + 1 == buffers.len();
            let flags = if last { 0 } else { VRING_DESC_F_NEXT }
                | if writable { VRING_DESC_F_WRITE } else { 0 };
            let desc = Descriptor::new(addr, len, flags as u16, q.next_desc);
            q.mock
                .desc_table()
                .store(at, RawDescriptor::from(desc))
                .unwrap();
        }
        self.publish(index, &[head]);
        head
    }

    /// Writes raw descriptors at table positions and makes `heads` available, unchecked.
    pub fn add_raw(&mut self, index: u16, table: &[(u16, Descriptor)], heads: &[u16]) {
        let q = &self.queues[usize::from(index)];
        for &(at, desc) in table {
            q.mock
                .desc_table()
                .store(at % q.size, RawDescriptor::from(desc))
                .unwrap();
        }
        self.publish(index, heads);
    }

    fn publish(&mut self, index: u16, heads: &[u16]) {
        let q = &mut self.queues[usize::from(index)];
        for &head in heads {
            let slot = usize::from(q.avail_idx % q.size);
            q.mock.avail().ring().ref_at(slot).unwrap().store(head);
            q.avail_idx = q.avail_idx.wrapping_add(1);
        }
        q.mock.avail().idx().store(q.avail_idx);
    }

    /// Moves the available index by `delta` without writing ring entries (hostile).
    pub fn bump_avail_idx(&mut self, index: u16, delta: u16) {
        let q = &mut self.queues[usize::from(index)];
        q.avail_idx = q.avail_idx.wrapping_add(delta);
        q.mock.avail().idx().store(q.avail_idx);
    }

    /// The heads the device put in the used ring since the last call.
    pub fn take_used(&mut self, index: u16) -> Vec<u16> {
        let q = &mut self.queues[usize::from(index)];
        let idx = q.mock.used().idx().load();
        let mut heads = Vec::new();
        while q.used_seen != idx {
            let slot = usize::from(q.used_seen % q.size);
            let elem = q.mock.used().ring().ref_at(slot).unwrap().load();
            assert_eq!(elem.len(), 0, "the balloon never writes into buffers");
            heads.push(elem.id() as u16);
            q.used_seen = q.used_seen.wrapping_add(1);
        }
        heads
    }
}
