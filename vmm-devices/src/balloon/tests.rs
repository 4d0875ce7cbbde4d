//! Adapter tests: the balloon behind the real virtio-mmio transport, on real guest-mem memory
//! (an anonymous LLFree pool of 2 MiB frames), driven by a host-side driver writing real rings.
//! (Its wiring into a KVM VM is tested with the runner's `VirtioMmioDevices`.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guest_mem::{Backing, GuestMemory, MemoryConfig, Pool, PoolConfig, Populate};
use virtio_balloon::spec::{
    VIRTIO_BALLOON_F_MUST_TELL_HOST, VIRTIO_BALLOON_F_PAGE_REPORTING, VIRTIO_BALLOON_F_STATS_VQ,
    VIRTIO_F_VERSION_1,
};
use virtio_balloon::BalloonConfig;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::testing::{EventLoopThread, MmioDriver};
use super::*;
use crate::virtio::interrupt::{INT_CONFIG, INT_USED_RING};
use crate::virtio::mmio::{registers as reg, MmioTransport};

const MIB: u64 = 1 << 20;
const RAM: u64 = 16 * MIB;
/// The device's MMIO window (where the VMM's first virtio slot is).
const BASE: u64 = 0xc000_0000;
const RINGS: u64 = 0x10_0000;
const PFNS: u64 = 0x18_0000;
const ALL_FEATURES: u64 = 1 << VIRTIO_F_VERSION_1
    | 1 << VIRTIO_BALLOON_F_MUST_TELL_HOST
    | 1 << VIRTIO_BALLOON_F_STATS_VQ
    | 1 << VIRTIO_BALLOON_F_PAGE_REPORTING;

fn memory() -> Arc<GuestMemory> {
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 2 * RAM)).unwrap();
    let config = MemoryConfig {
        populate: Populate::Eager,
        ..MemoryConfig::new(vec![(GuestAddress(0), RAM)], 1)
    };
    Arc::new(GuestMemory::new(pool, config).unwrap())
}

fn config() -> BalloonConfig {
    BalloonConfig {
        free_page_reporting: true,
        stats_interval: Some(Duration::from_millis(10)),
        queue_size: 256,
        ..BalloonConfig::default()
    }
}

fn transport(memory: &Arc<GuestMemory>, config: BalloonConfig) -> BalloonTransport {
    let device = BalloonDevice::new(config, memory.clone()).unwrap();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    MmioTransport::new(memory.clone(), Arc::new(Mutex::new(device)), irq).unwrap()
}

fn process(transport: &BalloonTransport, queue: u16) {
    use crate::virtio::VirtioDevice;
    lock(transport.device()).process_queue(queue);
}

fn pfns(first: u64, count: u64) -> impl Iterator<Item = u32> {
    (first >> 12..(first >> 12) + count).map(|pfn| pfn as u32)
}

#[test]
fn the_device_offers_the_balloon_through_the_transport() {
    let memory = memory();
    let transport = transport(&memory, config());
    let mut driver = MmioDriver::start(&transport, BASE, &*memory, RINGS, ALL_FEATURES, 4, 256);
    assert_eq!(driver.read(reg::DEVICE_ID), 5);
    driver.write(reg::DEVICE_FEATURES_SEL, 0);
    assert_eq!(driver.read(reg::DEVICE_FEATURES) & 0b100011, 0b100011);
    driver.write(reg::QUEUE_SEL, 3);
    assert_eq!(driver.read(reg::QUEUE_NUM_MAX), 256);
    assert!(transport.is_activated());
    // The first statistics buffer is held; the target is readable, `actual` writable.
    driver.add_chain(2, &[(PFNS, 10, false)]);
    driver.notify(2);
    process(&transport, 2);
    assert_eq!(driver.take_used(2), 0);
    lock(transport.device())
        .balloon_mut()
        .set_target_mib(8)
        .unwrap();
    assert_eq!(driver.read(reg::CONFIG), 2048);
    assert_ne!(transport.interrupt().status() & INT_CONFIG, 0);
    driver.write(reg::CONFIG + 4, 77);
    assert_eq!(lock(transport.device()).balloon().actual_pages(), 77);
}

#[test]
fn inflation_and_reports_free_frames_and_reset_takes_the_balloon_back() {
    let memory = memory();
    let pool = memory.pool().clone();
    let transport = transport(&memory, config());
    let mut driver = MmioDriver::start(&transport, BASE, &*memory, RINGS, ALL_FEATURES, 4, 256);
    assert_eq!(pool.stats().free_bytes, RAM);

    // 4 MiB of pages from 4 MiB on, in buffers of 256, plus one page outside RAM.
    for batch in 0..4 {
        let buffer = PFNS + batch * 1024;
        let len = driver.write_pfns(buffer, pfns(4 * MIB + batch * MIB, 256));
        driver.add_chain(0, &[(buffer, len, false)]);
    }
    let len = driver.write_pfns(PFNS + 0x1000, pfns(BASE, 1));
    driver.add_chain(0, &[(PFNS + 0x1000, len, false)]);
    process(&transport, 0);
    assert_eq!(driver.take_used(0), 5);
    assert_eq!(pool.stats().free_bytes, RAM + 4 * MIB);
    assert_ne!(transport.interrupt().status() & INT_USED_RING, 0);
    assert!(transport.interrupt().irq_evt().read().is_ok());

    // One reported 4 MiB range spanning two chunks, and one unaligned.
    driver.add_chain(3, &[(10 * MIB, 4 << 20, true), (14 * MIB + 1, 4096, true)]);
    process(&transport, 3);
    assert_eq!(driver.take_used(3), 1);
    assert_eq!(pool.stats().free_bytes, RAM + 8 * MIB);

    let info = lock(transport.device()).balloon().info();
    assert_eq!(info.counters.inflated_pages, 1024);
    assert_eq!(info.counters.inflate_freed_frames, 2);
    assert_eq!(info.counters.report_freed_frames, 2);
    assert_eq!(info.violations.outside_ram, 1);
    assert_eq!(info.violations.misaligned, 1);
    assert_eq!(memory.stats().given_away_pieces, 1024);

    // Deflating one page, then a reset gives every page back; touches repopulate with zeroes.
    let len = driver.write_pfns(PFNS, pfns(4 * MIB, 1));
    driver.add_chain(1, &[(PFNS, len, false)]);
    process(&transport, 1);
    assert_eq!(memory.stats().given_away_pieces, 1023);
    driver.write(reg::STATUS, 0);
    assert_eq!(memory.stats().given_away_pieces, 0);
    assert_eq!(memory.read_obj::<u64>(GuestAddress(5 * MIB)).unwrap(), 0);
    assert_eq!(pool.stats().free_bytes, RAM + 6 * MIB);
}

#[test]
fn the_stats_timer_requests_statistics_at_the_interval_it_is_set_to() {
    let memory = memory();
    let transport = Arc::new(transport(&memory, config()));
    let device = transport.device().clone();
    let (timer, interval) = StatsTimer::new(device.clone()).unwrap();
    assert_eq!(interval.get(), Some(Duration::from_millis(10)));
    let mut driver = MmioDriver::start(&*transport, BASE, &*memory, RINGS, ALL_FEATURES, 4, 256);
    let _events = EventLoopThread::start(vec![Box::new(timer)]).unwrap();

    // Answer three requests the way a guest does: new statistics in the returned buffer.
    let entry = |tag: u16, value: u64| [&tag.to_le_bytes()[..], &value.to_le_bytes()].concat();
    for round in 0..3u64 {
        memory
            .write_slice(&entry(4, round << 20), GuestAddress(PFNS))
            .unwrap();
        driver.add_chain(2, &[(PFNS, 10, false)]);
        process(&transport, 2);
        let deadline = Instant::now() + Duration::from_secs(5);
        while driver.take_used(2) == 0 {
            assert!(Instant::now() < deadline, "no statistics request");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            lock(&device).balloon().info().stats.free_memory,
            Some(round << 20)
        );
    }
    interval.set(None).unwrap();
    assert_eq!(interval.get(), None);

    let quiet = BalloonConfig {
        stats_interval: None,
        ..config()
    };
    let quiet_device = Arc::new(Mutex::new(BalloonDevice::new(quiet, memory).unwrap()));
    let (_, no_stats) = StatsTimer::new(quiet_device).unwrap();
    assert!(matches!(
        no_stats.set(Some(Duration::from_secs(1))),
        Err(StatsTimerError::NotEnabled)
    ));
    no_stats.set(Some(Duration::ZERO)).unwrap();
}

#[test]
fn the_balloon_option_becomes_device_options() {
    let option = super::config::BalloonDeviceConfig {
        size: 256 * MIB,
        deflate_on_oom: true,
        free_page_reporting: true,
        free_page_hinting: true,
        stats_polling_interval_s: 2,
    };
    let config = device_config(&option).unwrap();
    assert_eq!(config.target_pages, 65536);
    assert!(config.deflate_on_oom && config.free_page_reporting && config.must_tell_host);
    assert!(config.free_page_hinting);
    assert_eq!(config.stats_interval, Some(Duration::from_secs(2)));
    assert_eq!(config.queue_size, 1024);
    let quiet = super::config::BalloonDeviceConfig {
        stats_polling_interval_s: 0,
        ..option
    };
    assert_eq!(device_config(&quiet).unwrap().stats_interval, None);

    // A created balloon reports its target before any driver shows up.
    let balloon = create(memory(), config).unwrap();
    assert_eq!(balloon.handle.info().target_pages, 65536);
    assert!(!balloon.handle.info().active);
    assert!(Arc::ptr_eq(&balloon.device, balloon.handle.device()));
    let bad = BalloonConfig {
        queue_size: 3,
        ..config
    };
    assert!(matches!(
        create(memory(), bad),
        Err(BalloonCreateError::Device(_))
    ));
}

#[test]
fn a_refused_update_changes_neither_the_target_nor_the_interval() {
    let quiet = BalloonConfig {
        stats_interval: None,
        ..config()
    };
    let handle = create(memory(), quiet).unwrap().handle;
    handle.set_target_mib(4).unwrap();
    let refused = handle.update(Some(8), Some(Duration::from_secs(1)));
    assert!(matches!(
        refused,
        Err(BalloonControlError::Stats(StatsTimerError::NotEnabled))
    ));
    let above = handle.update(Some(17), Some(Duration::ZERO));
    assert!(matches!(
        above,
        Err(BalloonControlError::TargetAboveRam { .. })
    ));
    assert_eq!(handle.info().target_pages, 1024);
    handle.update(Some(8), Some(Duration::ZERO)).unwrap();
    assert_eq!(handle.info().target_pages, 2048);
    assert_eq!(handle.stats_interval(), None);
    let polled = create(memory(), config()).unwrap().handle;
    polled.update(None, Some(Duration::from_secs(3))).unwrap();
    assert_eq!(polled.stats_interval(), Some(Duration::from_secs(3)));
}
