//! Device tests on real split rings in a `GuestMemoryMmap`, with a recording backend.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use virtio_queue::QueueState;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::*;
use crate::spec::{stat_tag, CONFIG_ACTUAL, CONFIG_NUM_PAGES};
use crate::testing::{
    guest_memory, BackendCall, CountingNotifier, Driver, RecordingBackend, BUFFERS, CHUNK_PAGES,
    RAM,
};
use crate::{GuestRange, DEFAULT_QUEUE_SIZE};

type TestBalloon = VirtioBalloon<Arc<GuestMemoryMmap>, RecordingBackend>;

const QUEUE_SIZE: u16 = 64;
const INFLATE: u16 = 0;
const DEFLATE: u16 = 1;
const STATS: u16 = 2;
const REPORTING: u16 = 3;

fn full_config() -> BalloonConfig {
    BalloonConfig {
        deflate_on_oom: true,
        free_page_reporting: true,
        stats_interval: Some(Duration::from_secs(2)),
        queue_size: QUEUE_SIZE,
        ..BalloonConfig::default()
    }
}

fn range(first_pfn: u64, pages: u64) -> GuestRange {
    GuestRange::from_pfns(first_pfn, pages)
}

/// Activates `balloon` on `mem` with every feature it offers and the queues of `driver`.
fn activate_all_features(
    balloon: &mut TestBalloon,
    mem: &Arc<GuestMemoryMmap>,
    driver: &Driver<'_>,
    notifier: &Arc<CountingNotifier>,
) {
    let features = balloon.device_features();
    balloon
        .activate(
            mem.clone(),
            features,
            driver.device_queues(),
            notifier.clone(),
        )
        .unwrap();
}

/// An active balloon with every feature, and its driver side.
struct Setup<'a> {
    balloon: TestBalloon,
    driver: Driver<'a>,
    notifier: Arc<CountingNotifier>,
}

fn activate(mem: &Arc<GuestMemoryMmap>) -> Setup<'_> {
    let mut balloon = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    let driver = Driver::new(mem, 4, QUEUE_SIZE);
    let notifier = Arc::new(CountingNotifier::default());
    activate_all_features(&mut balloon, mem, &driver, &notifier);
    Setup {
        balloon,
        driver,
        notifier,
    }
}

#[test]
fn offers_features_and_queues_from_its_options() {
    let basic = TestBalloon::new(BalloonConfig::default(), RecordingBackend::default()).unwrap();
    assert_eq!(basic.device_type(), 5);
    assert_eq!(basic.device_features(), 1 << 32 | 1);
    assert_eq!(basic.queue_max_sizes(), [DEFAULT_QUEUE_SIZE; 2]);
    assert_eq!(basic.stats_interval(), None);

    let full = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    assert_eq!(full.device_features(), 1 << 32 | 0b10_0111);
    assert_eq!(full.queue_max_sizes(), [QUEUE_SIZE; 4]);
    assert_eq!(full.stats_interval(), Some(Duration::from_secs(2)));

    let bad = BalloonConfig {
        queue_size: 100,
        ..BalloonConfig::default()
    };
    assert!(matches!(
        TestBalloon::new(bad, RecordingBackend::default()),
        Err(BalloonError::Config(OptionsError::QueueSize(100)))
    ));
}

#[test]
fn inflation_coalesces_pages_and_frees_full_chunks() {
    let mem = guest_memory();
    let mut s = activate(&mem);
    // One whole 2 MiB chunk at 4 MiB in a batch of 256 and a batch of 256 + 3 pages out of
    // order (sorted into one run).
    let chunk: Vec<u32> = (1024..1024 + CHUNK_PAGES as u32).collect();
    let first = s.driver.write_pfns(BUFFERS, &chunk[..256]);
    let mut second = chunk[256..].to_vec();
    second.extend([7, 9, 8]);
    let len = s.driver.write_pfns(BUFFERS + 0x1000, &second);
    let a = s.driver.add_chain(INFLATE, &[(BUFFERS, first, false)]);
    let b = s
        .driver
        .add_chain(INFLATE, &[(BUFFERS + 0x1000, len, false)]);
    s.balloon.process_queue(INFLATE).unwrap();

    assert_eq!(s.driver.take_used(INFLATE), [a, b]);
    assert_eq!(s.notifier.used(INFLATE), 1);
    assert_eq!(
        s.balloon.backend().calls(),
        [
            BackendCall::Inflate(range(1024, 256)),
            BackendCall::Inflate(range(1280, 256)),
            BackendCall::Inflate(range(7, 3)),
        ]
    );
    let info = s.balloon.info();
    assert_eq!(info.counters.inflated_pages, CHUNK_PAGES + 3);
    assert_eq!(info.counters.inflate_freed_frames, 1);
    assert_eq!(info.violations.total(), 0);
}

#[test]
fn invalid_and_duplicate_pages_are_ignored_and_counted() {
    let mem = guest_memory();
    let mut s = activate(&mem);
    let hole = (RAM[0].1 / 4096) as u32; // first page of the MMIO hole
    let ram2 = (RAM[1].0 / 4096) as u32;
    let pfns = [hole - 1, hole, hole + 1, ram2 - 1, ram2, u32::MAX, 5, 5];
    let len = s.driver.write_pfns(BUFFERS, &pfns);
    s.driver.add_chain(INFLATE, &[(BUFFERS, len, false)]);
    s.balloon.process_queue(INFLATE).unwrap();

    let calls = s.balloon.backend().calls();
    assert_eq!(
        calls,
        [
            BackendCall::Inflate(range(5, 1)),
            BackendCall::Inflate(range(5, 1)),
            BackendCall::Inflate(range(u64::from(hole) - 1, 1)),
            BackendCall::Inflate(range(u64::from(ram2), 1)),
        ]
    );
    let violations = s.balloon.info().violations;
    assert_eq!(violations.outside_ram, 4);
    assert_eq!(violations.duplicate_inflation, 1);
    assert_eq!(s.balloon.info().counters.inflated_pages, 3);
}

#[test]
fn deflation_returns_pages_and_counts_never_inflated_ones() {
    let mem = guest_memory();
    let mut s = activate(&mem);
    let len = s.driver.write_pfns(BUFFERS, &[100, 101, 102]);
    s.driver.add_chain(INFLATE, &[(BUFFERS, len, false)]);
    s.balloon.process_queue(INFLATE).unwrap();

    let len = s.driver.write_pfns(BUFFERS + 0x1000, &[101, 102, 103]);
    let head = s
        .driver
        .add_chain(DEFLATE, &[(BUFFERS + 0x1000, len, false)]);
    s.balloon.process_queue(DEFLATE).unwrap();
    assert_eq!(s.driver.take_used(DEFLATE), [head]);
    assert!(s.balloon.backend().is_given_away(100));
    assert!(!s.balloon.backend().is_given_away(101));
    let info = s.balloon.info();
    assert_eq!(info.counters.inflated_pages, 1);
    assert_eq!(info.counters.deflated_pages, 2);
    assert_eq!(info.violations.not_inflated, 1);
}

#[test]
fn reported_ranges_are_discarded_and_merged() {
    let mem = guest_memory();
    let mut s = activate(&mem);
    let mb2 = 2 << 20;
    let head = s.driver.add_chain(
        REPORTING,
        &[
            (4 * mb2, 2 * mb2 as u32, true),
            (6 * mb2, mb2 as u32, true),
            (0x3000, 0x1000, true),
            (0x5000, 0x1000, false),
            (RAM[0].1, mb2 as u32, true),
        ],
    );
    s.balloon.process_queue(REPORTING).unwrap();
    assert_eq!(s.driver.take_used(REPORTING), [head]);
    assert_eq!(
        s.balloon.backend().calls(),
        [
            BackendCall::Discard(GuestRange {
                addr: GuestAddress(4 * mb2),
                len: 3 * mb2
            }),
            BackendCall::Discard(range(3, 1)),
        ]
    );
    let info = s.balloon.info();
    assert_eq!(info.counters.report_freed_frames, 3);
    assert_eq!(info.counters.reported_bytes, 3 * mb2 + 0x1000);
    assert_eq!(info.violations.wrong_direction, 1);
    assert_eq!(info.violations.outside_ram, 1);
}

fn stats_entry(tag: u16, value: u64) -> Vec<u8> {
    [&tag.to_le_bytes()[..], &value.to_le_bytes()].concat()
}

#[test]
fn statistics_are_held_and_requested_on_the_timer() {
    let mem = guest_memory();
    let mut balloon = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    let mut driver = Driver::new(&mem, 4, QUEUE_SIZE);
    let notifier = Arc::new(CountingNotifier::default());
    assert!(!balloon.request_stats().unwrap(), "inactive");

    // The driver queues its first statistics before DRIVER_OK.
    let bytes = [stats_entry(stat_tag::MEMFREE, 1 << 30), stats_entry(42, 1)].concat();
    driver.write(BUFFERS, &bytes);
    let head = driver.add_chain(STATS, &[(BUFFERS, bytes.len() as u32, false)]);
    activate_all_features(&mut balloon, &mem, &driver, &notifier);
    assert_eq!(balloon.info().stats.free_memory, Some(1 << 30));
    assert!(
        driver.take_used(STATS).is_empty(),
        "the device holds the buffer"
    );

    assert!(balloon.request_stats().unwrap());
    assert_eq!(driver.take_used(STATS), [head]);
    assert_eq!(notifier.used(STATS), 1);
    assert!(!balloon.request_stats().unwrap(), "nothing held");

    driver.write(BUFFERS, &stats_entry(stat_tag::MEMFREE, 2 << 30));
    let second = driver.add_chain(STATS, &[(BUFFERS, 10, false)]);
    balloon.process_queue(STATS).unwrap();
    assert_eq!(balloon.info().stats.free_memory, Some(2 << 30));
    assert_eq!(balloon.info().counters.stats_updates, 2);

    // A second buffer while one is held: the old one goes back at once.
    let third = driver.add_chain(STATS, &[(BUFFERS, 10, false)]);
    balloon.process_queue(STATS).unwrap();
    assert_eq!(driver.take_used(STATS), [second]);
    assert_eq!(balloon.info().violations.extra_stats_buffer, 1);
    assert!(balloon.request_stats().unwrap());
    assert_eq!(driver.take_used(STATS), [third]);
}

#[test]
fn targets_update_the_config_space_and_notify_an_active_driver() {
    let mem = guest_memory();
    let mut idle = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    idle.set_target_mib(4).unwrap();
    assert_eq!(idle.target_pages(), 1024);

    let mut s = activate(&mem);
    s.balloon.set_target_mib(256).unwrap();
    let mut word = [0; 4];
    s.balloon.read_config(CONFIG_NUM_PAGES, &mut word);
    assert_eq!(u32::from_le_bytes(word), 65536);
    assert_eq!(s.notifier.config(), 1);
    assert!(matches!(
        s.balloon.set_target_mib(1 << 40),
        Err(BalloonError::Config(OptionsError::TargetTooLarge { .. }))
    ));
    assert_eq!(s.balloon.target_pages(), 65536);

    s.balloon.write_config(CONFIG_ACTUAL, &300u32.to_le_bytes());
    s.balloon
        .write_config(CONFIG_NUM_PAGES, &1u32.to_le_bytes());
    assert_eq!(
        (s.balloon.target_pages(), s.balloon.actual_pages()),
        (65536, 300)
    );
    s.balloon.reset();
    assert_eq!(s.balloon.actual_pages(), 0);
}

#[test]
fn activation_checks_features_and_queues() {
    let mem = guest_memory();
    let driver = Driver::new(&mem, 4, QUEUE_SIZE);
    let notifier: Arc<dyn GuestNotifier> = Arc::new(CountingNotifier::default());
    let mut balloon = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    let all = balloon.device_features();
    let basic = 1 << 32;
    let mut try_activate = |features, queues: Vec<(u16, Queue)>| {
        balloon.activate(mem.clone(), features, queues, notifier.clone())
    };
    let queues = || driver.device_queues();
    let first = |n: usize| queues().into_iter().take(n).collect::<Vec<_>>();
    assert!(matches!(
        try_activate(all | 1 << 3, queues()),
        Err(BalloonError::UnofferedFeatures(8))
    ));
    assert!(matches!(
        try_activate(basic, queues()),
        Err(BalloonError::UnexpectedQueue(2))
    ));
    assert!(matches!(
        try_activate(all, first(3)),
        Err(BalloonError::MissingQueue {
            index: 3,
            role: QueueRole::Reporting
        })
    ));
    let mut twice = first(2);
    twice.extend(first(2).pop());
    assert!(matches!(
        try_activate(basic, twice),
        Err(BalloonError::DuplicateQueue(1))
    ));
    let mut not_ready = first(2);
    not_ready[1].1.set_ready(false);
    assert!(matches!(
        try_activate(basic, not_ready),
        Err(BalloonError::InvalidQueue(1))
    ));
    try_activate(all, queues()).unwrap();
    assert!(matches!(
        try_activate(all, queues()),
        Err(BalloonError::AlreadyActive)
    ));
}

#[test]
fn reporting_takes_index_2_without_statistics() {
    let mem = guest_memory();
    let config = BalloonConfig {
        stats_interval: None,
        ..full_config()
    };
    let mut balloon = TestBalloon::new(config, RecordingBackend::default()).unwrap();
    assert_eq!(balloon.queue_max_sizes().len(), 3);
    let mut driver = Driver::new(&mem, 3, QUEUE_SIZE);
    let notifier = Arc::new(CountingNotifier::default());
    let features = balloon.device_features();
    balloon
        .activate(mem.clone(), features, driver.device_queues(), notifier)
        .unwrap();
    driver.add_chain(2, &[(0x20_0000, 0x20_0000, true)]);
    balloon.process_queue(2).unwrap();
    assert_eq!(
        balloon.backend().calls(),
        [BackendCall::Discard(range(512, 512))]
    );
    balloon.process_queue(3).unwrap();
    assert_eq!(balloon.info().violations.unknown_queue, 1);
}

#[test]
fn broken_rings_stop_the_device_until_reset() {
    let mem = guest_memory();
    let mut s = activate(&mem);
    let len = s.driver.write_pfns(BUFFERS, &[10]);
    s.driver.add_chain(INFLATE, &[(BUFFERS, len, false)]);
    s.balloon.process_queue(INFLATE).unwrap();
    s.driver.bump_avail_idx(DEFLATE, QUEUE_SIZE + 1);
    assert!(matches!(
        s.balloon.process_queue(DEFLATE),
        Err(BalloonError::Queue { index: 1, .. })
    ));
    assert!(s.balloon.info().needs_reset);
    // The driver is told (DEVICE_NEEDS_RESET with a configuration change interrupt).
    assert_eq!(s.notifier.needs_reset_count(), 1);
    s.balloon.process_queue(INFLATE).unwrap();
    assert!(!s.balloon.request_stats().unwrap());

    s.balloon.reset();
    let info = s.balloon.info();
    assert!(!info.active && !info.needs_reset);
    assert_eq!(info.counters.inflated_pages, 0);
    assert_eq!(
        s.balloon.backend().calls().last(),
        Some(&BackendCall::DeflateAll)
    );
    assert!(!s.balloon.backend().is_given_away(10));
    s.balloon.process_queue(INFLATE).unwrap();
}

#[test]
fn backend_failures_are_counted_and_buffers_still_returned() {
    let mem = guest_memory();
    let mut s = activate(&mem);
    s.balloon.backend().failing.store(true, Ordering::Relaxed);
    let len = s.driver.write_pfns(BUFFERS, &[10, 20]);
    let head = s.driver.add_chain(INFLATE, &[(BUFFERS, len, false)]);
    s.balloon.process_queue(INFLATE).unwrap();
    assert_eq!(s.driver.take_used(INFLATE), [head]);
    assert_eq!(s.balloon.info().counters.backend_errors, 2);
    assert_eq!(s.balloon.info().counters.inflated_pages, 0);
}

#[test]
fn notifications_while_inactive_are_ignored() {
    let mut balloon = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    balloon.process_queue(0).unwrap();
    balloon.process_queue(9).unwrap();
    balloon.reset();
    assert!(balloon.backend().calls().is_empty());
    assert_eq!(balloon.info().violations.total(), 0);
}

#[test]
fn the_device_can_move_to_the_event_loop_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<TestBalloon>();
}

#[test]
fn chains_with_indirect_descriptors_are_refused_unread() {
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT};
    use virtio_queue::desc::split::Descriptor;
    let mem = guest_memory();
    let mut s = activate(&mem);
    // An indirect table at BUFFERS + 0x1000 whose one descriptor points at a page frame number
    // list: followed, it would inflate page 10.
    let len = s.driver.write_pfns(BUFFERS, &[10]);
    let mut entry = BUFFERS.to_le_bytes().to_vec();
    entry.extend_from_slice(&len.to_le_bytes());
    entry.extend_from_slice(&[0; 4]);
    s.driver.write(BUFFERS + 0x1000, &entry);
    let indirect = Descriptor::new(BUFFERS + 0x1000, 16, VRING_DESC_F_INDIRECT as u16, 0);
    // One chain is the indirect descriptor alone, the other has it second.
    let head = Descriptor::new(BUFFERS, len, VRING_DESC_F_NEXT as u16, 6);
    s.driver
        .add_raw(INFLATE, &[(5, indirect), (4, head), (6, indirect)], &[5, 4]);
    s.balloon.process_queue(INFLATE).unwrap();
    assert_eq!(s.driver.take_used(INFLATE), [5, 4]);
    assert_eq!(s.balloon.backend().calls(), []);
    let info = s.balloon.info();
    assert_eq!(info.violations.count(Violation::IndirectDescriptor), 2);
    assert!(
        !info.needs_reset,
        "refusing a chain does not stop the device"
    );
}

#[test]
fn a_restored_balloon_goes_on_where_the_saved_one_stood() {
    let mem = guest_memory();
    let mut balloon = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    let mut driver = Driver::new(&mem, 4, QUEUE_SIZE);
    let notifier = Arc::new(CountingNotifier::default());
    driver.write(BUFFERS, &stats_entry(stat_tag::MEMFREE, 1 << 30));
    let held = driver.add_chain(STATS, &[(BUFFERS, 10, false)]);
    activate_all_features(&mut balloon, &mem, &driver, &notifier);
    balloon.set_target_mib(8).unwrap();
    let len = driver.write_pfns(BUFFERS, &[0x300, 0x301]);
    driver.add_chain(INFLATE, &[(BUFFERS, len, false)]);
    balloon.process_queue(INFLATE).unwrap();
    assert_eq!(driver.take_used(INFLATE).len(), 1);

    let state = balloon.save_state();
    let queues = balloon.queue_states();
    assert_eq!(queues.len(), 4);
    assert_eq!(
        queues[usize::from(INFLATE)].1.next_used,
        1,
        "the device's own queue"
    );
    assert_eq!(state.active.unwrap().held_stats, Some(held));

    // A new device, as another process makes it, gets the state and the saved queues.
    let mut restored = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    let reactivation = |queues: &[(u16, QueueState)]| Reactivation {
        memory: mem.clone(),
        queues: queues
            .iter()
            .map(|(index, state)| (*index, Queue::try_from(*state).unwrap()))
            .collect::<Vec<_>>(),
        notifier: notifier.clone() as Arc<dyn GuestNotifier>,
    };
    restored
        .restore(&state, Some(reactivation(&queues)))
        .unwrap();
    assert_eq!(restored.save_state(), state);
    assert_eq!(restored.info().stats.free_memory, Some(1 << 30));
    assert_eq!(restored.target_pages(), 2048);
    // The held statistics buffer goes back to the driver when the timer asks.
    assert!(restored.request_stats().unwrap());
    assert_eq!(driver.take_used(STATS), [held]);
    // The inflate queue goes on after the entry it had used.
    let len = driver.write_pfns(BUFFERS, &[0x302]);
    driver.add_chain(INFLATE, &[(BUFFERS, len, false)]);
    restored.process_queue(INFLATE).unwrap();
    assert_eq!(driver.take_used(INFLATE).len(), 1);
    assert_eq!(restored.info().counters.inflated_pages, 3);

    // A damaged state changes nothing.
    let mut bad = state.clone();
    bad.active.as_mut().unwrap().held_stats = Some(QUEUE_SIZE);
    let mut fresh = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    assert!(matches!(
        fresh.restore(&bad, Some(reactivation(&queues))),
        Err(BalloonError::BadState(_))
    ));
    assert!(matches!(
        fresh.restore(&state, None::<Reactivation<_, Vec<_>>>),
        Err(BalloonError::BadState(_))
    ));
    assert!(!fresh.is_active() && fresh.target_pages() == 0);
}

#[test]
fn free_page_hints_of_the_host_s_run_are_discarded_and_the_run_ends_as_asked() {
    use crate::spec::{FREE_PAGE_HINT_DONE, FREE_PAGE_HINT_STOP};
    const HINTS: u16 = 2;
    let mem = guest_memory();
    let config = BalloonConfig {
        free_page_hinting: true,
        queue_size: QUEUE_SIZE,
        ..BalloonConfig::default()
    };
    let mut balloon = TestBalloon::new(config, RecordingBackend::default()).unwrap();
    assert_eq!(balloon.queue_max_sizes(), [QUEUE_SIZE; 3]);
    assert!(matches!(
        balloon.start_hinting(true),
        Err(BalloonError::HintingInactive)
    ));
    let mut driver = Driver::new(&mem, 3, QUEUE_SIZE);
    let notifier = Arc::new(CountingNotifier::default());
    activate_all_features(&mut balloon, &mem, &driver, &notifier);
    let status = balloon.hinting_status().unwrap();
    assert_eq!(
        (status.host_cmd, status.guest_cmd),
        (FREE_PAGE_HINT_STOP, None)
    );

    // A run: the guest reads its id from the configuration space.
    let run = balloon.start_hinting(true).unwrap();
    assert_eq!(run, 2);
    assert_eq!(notifier.config(), 1);
    let mut word = [0u8; 4];
    balloon.read_config(8, &mut word);
    assert_eq!(u32::from_le_bytes(word), run);
    // A hint before the guest joined the run is ignored; then it sends the id and hints a
    // whole 2 MiB chunk and a page; a misaligned hint and one outside RAM are refused.
    let command = BUFFERS;
    driver.write(command, &run.to_le_bytes());
    let chunk = 4 << 20;
    let early = driver.add_chain(HINTS, &[(chunk, 0x1000, true)]);
    let joined = driver.add_chain(HINTS, &[(command, 4, false)]);
    let hints = [
        driver.add_chain(HINTS, &[(chunk, 2 << 20, true)]),
        driver.add_chain(HINTS, &[(0x8000, 0x1000, true)]),
        driver.add_chain(HINTS, &[(0x8800, 0x1000, true)]),
        driver.add_chain(HINTS, &[(16 << 20, 0x1000, true)]),
    ];
    balloon.process_queue(HINTS).unwrap();
    let mut used = vec![early, joined];
    used.extend(hints);
    assert_eq!(driver.take_used(HINTS), used);
    assert_eq!(
        balloon.backend().calls(),
        [
            BackendCall::Discard(range(1024, CHUNK_PAGES)),
            BackendCall::Discard(range(8, 1))
        ]
    );
    let info = balloon.info();
    assert_eq!(info.counters.hinted_bytes, (2 << 20) + 0x1000);
    assert_eq!(info.counters.hint_freed_frames, 1);
    assert_eq!(info.violations.misaligned, 1);
    assert_eq!(info.violations.outside_ram, 1);
    assert_eq!(balloon.hinting_status().unwrap().guest_cmd, Some(run));
    // The guest is through (STOP): acknowledged at once, the run is DONE.
    driver.write(command, &FREE_PAGE_HINT_STOP.to_le_bytes());
    driver.add_chain(HINTS, &[(command, 4, false)]);
    balloon.process_queue(HINTS).unwrap();
    let status = balloon.hinting_status().unwrap();
    assert_eq!(
        (status.host_cmd, status.guest_cmd),
        (FREE_PAGE_HINT_DONE, Some(FREE_PAGE_HINT_STOP))
    );
    assert_eq!(notifier.config(), 2);
    // Hints after the run ended are ignored.
    driver.add_chain(HINTS, &[(chunk, 0x1000, true)]);
    balloon.process_queue(HINTS).unwrap();
    assert_eq!(balloon.backend().calls().len(), 2);

    // Without acknowledge_on_stop the run stays until the host stops it.
    let second = balloon.start_hinting(false).unwrap();
    assert_eq!(second, run + 1);
    driver.write(command, &FREE_PAGE_HINT_STOP.to_le_bytes());
    driver.add_chain(HINTS, &[(command, 4, false)]);
    balloon.process_queue(HINTS).unwrap();
    assert_eq!(balloon.hinting_status().unwrap().host_cmd, second);
    balloon.stop_hinting().unwrap();
    assert_eq!(
        balloon.hinting_status().unwrap().host_cmd,
        FREE_PAGE_HINT_DONE
    );

    // A saved run comes back ended; a reset forgets hinting.
    let saved = balloon.save_state();
    assert_eq!(saved.last_hint_run, second);
    balloon.reset();
    assert_eq!(
        balloon.hinting_status().unwrap().host_cmd,
        FREE_PAGE_HINT_STOP
    );
    // A balloon without hinting refuses it.
    let mut plain = TestBalloon::new(full_config(), RecordingBackend::default()).unwrap();
    assert!(matches!(
        plain.start_hinting(true),
        Err(BalloonError::HintingDisabled)
    ));
    assert!(matches!(
        plain.hinting_status(),
        Err(BalloonError::HintingDisabled)
    ));
}
