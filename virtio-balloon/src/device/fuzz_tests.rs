//! The fuzz harness of the queue parsing, as property tests that run in `cargo test`.
//!
//! A hostile driver writes random descriptor tables (random addresses, lengths, flags, links
//! and indirect tables), random available rings and indices, random page frame numbers and
//! statistics into real split rings in guest memory, and pokes the device with notifications,
//! statistics requests, targets, config writes and resets. The device must never panic, and the
//! recording backend panics if it is ever asked about a range that is not aligned, non-empty
//! guest RAM. `PROPTEST_CASES` raises the number of cases for longer fuzzing runs.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use virtio_queue::desc::split::Descriptor;
use vm_memory::GuestMemoryMmap;

use super::*;
use crate::testing::{guest_memory, CountingNotifier, Driver, RecordingBackend, BUFFERS, RAM};

const QUEUE_SIZE: u16 = 16;
const RAM_END: u64 = RAM[1].0 + RAM[1].1;

/// Addresses a driver could write: buffers, RAM, the hole, past the end, anything.
fn address() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..0x4000u64).prop_map(|o| BUFFERS + o),
        (0..RAM_END / 4096).prop_map(|p| p * 4096),
        0..RAM_END + 0x10_0000,
        (0..16u64).prop_map(|o| u64::MAX - o * 4096),
        any::<u64>(),
    ]
}

fn length() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        1..64u32,
        (1..1100u32).prop_map(|n| n * 4096),
        Just(0x20_0000),
        Just(0x40_0000),
        any::<u32>(),
    ]
}

fn descriptor() -> impl Strategy<Value = Descriptor> {
    (address(), length(), 0..8u16, 0..QUEUE_SIZE + 4)
        .prop_map(|(addr, len, flags, next)| Descriptor::new(addr, len, flags, next))
}

/// Page frame numbers: in RAM, in the hole, around the ends, anything.
fn pfn() -> impl Strategy<Value = u32> {
    prop_oneof![
        (0..(RAM_END / 4096) as u32),
        ((RAM[0].1 / 4096) as u32..(RAM[1].0 / 4096) as u32),
        Just(u32::MAX),
        any::<u32>(),
    ]
}

#[derive(Debug, Clone)]
enum FuzzAction {
    /// Write descriptors at table positions, make `heads` available on `queue` and maybe
    /// notify it.
    Post {
        queue: u16,
        table: Vec<(u16, Descriptor)>,
        heads: Vec<u16>,
        kick: bool,
    },
    /// Write page frame numbers (or anything) into the buffer area.
    Fill {
        offset: u64,
        pfns: Vec<u32>,
    },
    Notify(u16),
    BumpAvail {
        queue: u16,
        delta: u16,
    },
    RequestStats,
    SetTarget(u64),
    WriteConfig {
        offset: u64,
        data: Vec<u8>,
    },
    ResetAndReactivate,
}

/// Lists of page frame numbers, mostly runs of consecutive ones as drivers send them.
fn pfn_list(runs: std::ops::Range<usize>) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec((pfn(), 1..600u32), runs).prop_map(|runs| {
        runs.into_iter()
            .flat_map(|(first, count)| (0..count).map(move |i| first.wrapping_add(i)))
            .take(1024)
            .collect()
    })
}

/// A chain that is mostly what a driver would send: linked descriptors from table position
/// `start`, device-readable page frame buffers or device-writable page-aligned ranges, with the
/// odd wrong flag, length or address.
fn plausible_chain() -> impl Strategy<Value = (Vec<(u16, Descriptor)>, Vec<u16>)> {
    let buffer = prop_oneof![
        3 => ((0..0x400u64), (1..1024u32)).prop_map(|(o, n)| (BUFFERS + o * 4, n * 4, false)),
        3 => ((0..RAM_END / 0x20_0000), (1..3u32))
            .prop_map(|(c, n)| (c * 0x20_0000, n * 0x20_0000, true)),
        2 => ((0..RAM_END / 4096), (1..64u32)).prop_map(|(p, n)| (p * 4096, n * 4096, true)),
        1 => (address(), length(), any::<bool>()),
    ];
    (0..QUEUE_SIZE, prop::collection::vec(buffer, 1..5)).prop_map(|(start, buffers)| {
        let count = buffers.len() as u16;
        let table = buffers
            .into_iter()
            .enumerate()
            .map(|(i, (addr, len, writable))| {
                let at = (start + i as u16) % QUEUE_SIZE;
                let next = (at + 1) % QUEUE_SIZE;
                let more = if i as u16 + 1 < count { 1 } else { 0 };
                let flags = more | if writable { 2 } else { 0 };
                (at, Descriptor::new(addr, len, flags, next))
            })
            .collect();
        (table, vec![start])
    })
}

fn action() -> impl Strategy<Value = FuzzAction> {
    let queue = 0..5u16;
    let raw = (
        prop::collection::vec((0..QUEUE_SIZE, descriptor()), 0..12),
        prop::collection::vec(0..QUEUE_SIZE + 2, 0..6),
    );
    prop_oneof![
        2 => (queue.clone(), raw, any::<bool>())
            .prop_map(|(queue, (table, heads), kick)| FuzzAction::Post { queue, table, heads, kick }),
        6 => (queue.clone(), plausible_chain(), prop::bool::weighted(0.8))
            .prop_map(|(queue, (table, heads), kick)| FuzzAction::Post { queue, table, heads, kick }),
        3 => ((0..0x400u64), pfn_list(0..4))
            .prop_map(|(offset, pfns)| FuzzAction::Fill { offset: offset * 4, pfns }),
        2 => (0..6u16).prop_map(FuzzAction::Notify),
        1 => (queue, any::<u16>()).prop_map(|(queue, delta)| FuzzAction::BumpAvail { queue, delta }),
        1 => Just(FuzzAction::RequestStats),
        1 => any::<u64>().prop_map(|mib| FuzzAction::SetTarget(mib % (1 << 25))),
        1 => (0..24u64, prop::collection::vec(any::<u8>(), 0..8))
            .prop_map(|(offset, data)| FuzzAction::WriteConfig { offset, data }),
        1 => Just(FuzzAction::ResetAndReactivate),
    ]
}

struct Harness<'a> {
    mem: &'a Arc<GuestMemoryMmap>,
    balloon: VirtioBalloon<Arc<GuestMemoryMmap>, RecordingBackend>,
    driver: Driver<'a>,
    acked: u64,
    queues: u16,
}

impl<'a> Harness<'a> {
    fn new(mem: &'a Arc<GuestMemoryMmap>, config: BalloonConfig, ack_mask: u64) -> Self {
        let balloon = VirtioBalloon::new(config, RecordingBackend::default()).unwrap();
        let acked = balloon.device_features() & ack_mask;
        let queues = QueueLayout::new(acked).len() as u16;
        let mut harness = Self {
            mem,
            balloon,
            driver: Driver::new(mem, queues, QUEUE_SIZE),
            acked,
            queues,
        };
        harness.activate();
        harness
    }

    fn activate(&mut self) {
        self.driver = Driver::new(self.mem, self.queues, QUEUE_SIZE);
        let notifier = Arc::new(CountingNotifier::default());
        let queues = self.driver.device_queues();
        self.balloon
            .activate(self.mem.clone(), self.acked, queues, notifier)
            .unwrap();
    }

    fn run(&mut self, action: FuzzAction) {
        match action {
            FuzzAction::Post {
                queue,
                table,
                heads,
                kick,
            } => {
                if queue < self.queues {
                    self.driver.add_raw(queue, &table, &heads);
                }
                if kick {
                    self.run(FuzzAction::Notify(queue));
                }
            }
            FuzzAction::Fill { offset, pfns } => {
                self.driver.write_pfns(BUFFERS + offset, &pfns);
            }
            FuzzAction::Notify(queue) => {
                // Broken rings are an expected outcome; panics are not.
                let _ = self.balloon.process_queue(queue);
            }
            FuzzAction::BumpAvail { queue, delta } if queue < self.queues => {
                self.driver.bump_avail_idx(queue, delta)
            }
            FuzzAction::BumpAvail { .. } => {}
            FuzzAction::RequestStats => {
                let _ = self.balloon.request_stats();
            }
            FuzzAction::SetTarget(mib) => {
                let _ = self.balloon.set_target_mib(mib);
            }
            FuzzAction::WriteConfig { offset, data } => self.balloon.write_config(offset, &data),
            FuzzAction::ResetAndReactivate => {
                self.balloon.reset();
                self.activate();
            }
        }
    }
}

proptest! {
    #[test]
    fn hostile_drivers_never_panic_the_device_or_reach_outside_ram(
        stats in any::<bool>(),
        reporting in any::<bool>(),
        ack_mask in prop_oneof![Just(u64::MAX), any::<u64>()],
        actions in prop::collection::vec(action(), 1..24),
    ) {
        let mem = guest_memory();
        let config = BalloonConfig {
            free_page_reporting: reporting,
            stats_interval: stats.then_some(Duration::from_secs(1)),
            deflate_on_oom: true,
            queue_size: QUEUE_SIZE,
            ..BalloonConfig::default()
        };
        let mut harness = Harness::new(&mem, config, ack_mask);
        for action in actions {
            harness.run(action);
        }
        let info = harness.balloon.info();
        prop_assert!(info.counters.inflated_pages <= (RAM[0].1 + RAM[1].1) / 4096);
        let mut config_space = [0u8; 16];
        harness.balloon.read_config(0, &mut config_space);
        prop_assert_eq!(&config_space[..4], &info.target_pages.to_le_bytes());
    }

    #[test]
    fn random_page_lists_only_inflate_ram(
        pfns in pfn_list(1..5),
        split in 0..2400u32,
    ) {
        let mem = guest_memory();
        let config = BalloonConfig { queue_size: QUEUE_SIZE, ..BalloonConfig::default() };
        let mut harness = Harness::new(&mem, config, u64::MAX);
        let len = harness.driver.write_pfns(BUFFERS, &pfns);
        // Split the list between two descriptors, possibly in the middle of an entry.
        let split = split.min(len);
        let head = if split == 0 || split == len {
            harness.driver.add_chain(0, &[(BUFFERS, len, false)])
        } else {
            let second = (BUFFERS + u64::from(split), len - split, false);
            harness.driver.add_chain(0, &[(BUFFERS, split, false), second])
        };
        harness.balloon.process_queue(0).unwrap();
        prop_assert_eq!(harness.driver.take_used(0), vec![head]);
        let in_ram = |pfn: &&u32| {
            let addr = u64::from(**pfn) * 4096;
            RAM.iter().any(|&(start, len)| addr >= start && addr < start + len)
        };
        let unique: std::collections::BTreeSet<_> = pfns.iter().filter(in_ram).collect();
        let info = harness.balloon.info();
        prop_assert_eq!(info.counters.inflated_pages, unique.len() as u64);
        prop_assert_eq!(
            info.violations.outside_ram,
            pfns.iter().filter(|p| !in_ram(p)).count() as u64
        );
        for pfn in unique {
            prop_assert!(harness.balloon.backend().is_given_away(u64::from(*pfn)));
        }
    }
}
