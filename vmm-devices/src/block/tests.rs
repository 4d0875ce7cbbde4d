use std::io::{Read, Write};

use virtio_queue::mock::MockSplitQueue;
use virtio_queue::QueueT;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::tempfile::TempFile;

use super::*;
use crate::rate_limiter::TokenBucketConfig;
use crate::virtio::request_queue::testing::{self, activation, add_chain, used_len, wait_readable};
use crate::virtio::VirtioDevice;

const MIB: u64 = 1 << 20;
const RING: u64 = MIB;
const HEADER: u64 = 2 * MIB;
const DATA: u64 = 3 * MIB;
const STATUS: u64 = 4 * MIB;
/// The disk: 64 sectors.
const DISK_SIZE: u64 = 64 * SECTOR_SIZE;

/// An image of [`DISK_SIZE`] bytes (plus a partial sector), sector `n` filled with byte `n`.
fn image() -> TempFile {
    let file = TempFile::new().unwrap();
    let mut contents: Vec<u8> = (0..DISK_SIZE).map(|at| (at / SECTOR_SIZE) as u8).collect();
    contents.extend_from_slice(&[0xee; 100]);
    file.as_file().write_all(&contents).unwrap();
    file
}

/// Both engines: every test of a request runs on each.
const ENGINES: [IoEngine; 2] = [IoEngine::Sync, IoEngine::Async];

/// The drive `rootfs` over `image`, served by `io_engine`.
fn drive(
    image: &TempFile,
    read_only: bool,
    rate_limiter: RateLimiterConfig,
    io_engine: IoEngine,
) -> DriveConfig {
    DriveConfig {
        id: "rootfs".into(),
        path: image.as_path().to_owned(),
        read_only,
        root: true,
        partuuid: None,
        rate_limiter,
        io_engine,
    }
}

/// Serves what the driver made available and waits until every request is answered (the
/// asynchronous engine's too).
fn serve(device: &mut BlockDevice) {
    device.process_queue(0);
    device.quiesce();
}

/// A device of `config`, activated with the queue of `mock`; and its interrupt's eventfd.
fn activated_drive(
    memory: &DeviceMemory,
    mock: &MockSplitQueue<'_, GuestMemory>,
    config: DriveConfig,
) -> (BlockDevice, EventFd) {
    let (file, size) = open_image(&config.path, config.read_only).unwrap();
    let mut device = BlockDevice::new(memory.clone(), config, file, size).unwrap();
    let (activation, irq) = activation(memory, mock);
    device.activate(activation).unwrap();
    (device, irq)
}

/// A device over `image` on `io_engine` without a rate limiter, activated with the queue of `mock`; and its
/// interrupt's eventfd.
fn activated(
    memory: &DeviceMemory,
    mock: &MockSplitQueue<'_, GuestMemory>,
    image: &TempFile,
    read_only: bool,
    io_engine: IoEngine,
) -> (BlockDevice, EventFd) {
    activated_drive(
        memory,
        mock,
        drive(image, read_only, Default::default(), io_engine),
    )
}

fn header(memory: &DeviceMemory, kind: u32, sector: u64) {
    memory
        .write_obj(kind.to_le(), GuestAddress(HEADER))
        .unwrap();
    memory
        .write_obj(sector.to_le(), GuestAddress(HEADER + 8))
        .unwrap();
}

fn status(memory: &DeviceMemory) -> u8 {
    memory.read_obj(GuestAddress(STATUS)).unwrap()
}

#[test]
fn capacity_is_whole_sectors_and_features_follow_the_mode() {
    for engine in ENGINES {
        let memory = testing::memory(16 * MIB);
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let image = image();
        let (device, _) = activated(&memory, &mock, &image, true, engine);
        let mut config = [0u8; 8];
        device.read_config(0, &mut config);
        assert_eq!(u64::from_le_bytes(config), 64);
        let mut past = [0xffu8; 4];
        device.read_config(u64::MAX, &mut past);
        assert_eq!(past, [0; 4]);
        assert_eq!(device.device_type(), 2);
        assert_ne!(device.device_features() & 1 << VIRTIO_BLK_F_RO, 0);
        let (writable, _) = activated(&memory, &mock, &image, false, engine);
        assert_eq!(writable.device_features() & 1 << VIRTIO_BLK_F_RO, 0);
        assert_ne!(writable.device_features() & 1 << VIRTIO_BLK_F_FLUSH, 0);
    }
}

#[test]
fn reads_writes_flushes_and_the_id_reach_the_image_and_the_guest() {
    for engine in ENGINES {
        let memory = testing::memory(16 * MIB);
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 32);
        let image = image();
        let (mut device, irq) = activated(&memory, &mock, &image, false, engine);
        // Read sectors 3 and 4 into two buffers.
        header(&memory, VIRTIO_BLK_T_IN, 3);
        add_chain(
            &mock,
            0,
            0,
            &[
                (HEADER, 16, false),
                (DATA, 512, true),
                (DATA + 4096, 512, true),
                (STATUS, 1, true),
            ],
        );
        serve(&mut device);
        assert_eq!(status(&memory), VIRTIO_BLK_S_OK as u8);
        assert_eq!(used_len(&mock, 0), 1025);
        assert_eq!(memory.read_obj::<u8>(GuestAddress(DATA + 511)).unwrap(), 3);
        assert_eq!(memory.read_obj::<u8>(GuestAddress(DATA + 4096)).unwrap(), 4);
        assert_eq!(irq.read().unwrap(), 1);
        // Write one sector at the last sector.
        memory
            .write_slice(&[0xab; 512], GuestAddress(DATA))
            .unwrap();
        header(&memory, VIRTIO_BLK_T_OUT, 63);
        add_chain(
            &mock,
            4,
            1,
            &[(HEADER, 16, false), (DATA, 512, false), (STATUS, 1, true)],
        );
        serve(&mut device);
        assert_eq!(status(&memory), VIRTIO_BLK_S_OK as u8);
        let mut contents = Vec::new();
        std::fs::File::open(image.as_path())
            .unwrap()
            .read_to_end(&mut contents)
            .unwrap();
        assert!(contents[63 * 512..64 * 512].iter().all(|&b| b == 0xab));
        assert_eq!(contents[62 * 512], 62);
        // Flush, then GET_ID into a 20-byte buffer.
        header(&memory, VIRTIO_BLK_T_FLUSH, 0);
        add_chain(&mock, 8, 2, &[(HEADER, 16, false), (STATUS, 1, true)]);
        serve(&mut device);
        assert_eq!(status(&memory), VIRTIO_BLK_S_OK as u8);
        header(&memory, VIRTIO_BLK_T_GET_ID, 0);
        add_chain(
            &mock,
            10,
            3,
            &[(HEADER, 16, false), (DATA, 20, true), (STATUS, 1, true)],
        );
        serve(&mut device);
        let mut id = [0u8; 20];
        memory.read_slice(&mut id, GuestAddress(DATA)).unwrap();
        assert_eq!(&id[..7], b"rootfs\0");
        let counters = &device.counters;
        assert_eq!(counters.reads.load(Ordering::Relaxed), 1);
        assert_eq!(counters.writes.load(Ordering::Relaxed), 1);
        assert_eq!(counters.flushes.load(Ordering::Relaxed), 1);
        assert_eq!(counters.failed.load(Ordering::Relaxed), 0);
    }
}

#[test]
fn a_read_only_drive_refuses_writes() {
    for engine in ENGINES {
        let memory = testing::memory(16 * MIB);
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let image = image();
        let (mut device, _) = activated(&memory, &mock, &image, true, engine);
        header(&memory, VIRTIO_BLK_T_OUT, 0);
        add_chain(
            &mock,
            0,
            0,
            &[(HEADER, 16, false), (DATA, 512, false), (STATUS, 1, true)],
        );
        serve(&mut device);
        assert_eq!(status(&memory), VIRTIO_BLK_S_IOERR as u8);
        let mut first = [0u8; 1];
        std::fs::File::open(image.as_path())
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        assert_eq!(first, [0]);
    }
}

#[test]
fn hostile_requests_get_an_error_status_or_are_dropped_and_never_panic() {
    for engine in ENGINES {
        let memory = testing::memory(16 * MIB);
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 64);
        let image = image();
        let (mut device, _) = activated(&memory, &mock, &image, false, engine);
        let expect =
            |device: &mut BlockDevice, chain: &[(u64, u32, bool)], slot: u16, want: u32| {
                add_chain(&mock, slot * 4, slot, chain);
                memory.write_obj(0x77u8, GuestAddress(STATUS)).unwrap();
                serve(device);
                assert_eq!(u32::from(status(&memory)), want, "chain {slot}: {chain:?}");
            };
        let read = |sectors: u32| {
            [
                (HEADER, 16, false),
                (DATA, sectors * 512, true),
                (STATUS, 1, true),
            ]
        };
        // Past the end (the partial last sector is not part of the disk), and wrapping around.
        header(&memory, VIRTIO_BLK_T_IN, 63);
        expect(&mut device, &read(2), 0, VIRTIO_BLK_S_IOERR);
        header(&memory, VIRTIO_BLK_T_IN, u64::MAX);
        expect(&mut device, &read(1), 1, VIRTIO_BLK_S_IOERR);
        // Not whole sectors; data outside guest memory.
        header(&memory, VIRTIO_BLK_T_IN, 0);
        expect(
            &mut device,
            &[(HEADER, 16, false), (DATA, 100, true), (STATUS, 1, true)],
            2,
            VIRTIO_BLK_S_IOERR,
        );
        expect(
            &mut device,
            &[(HEADER, 16, false), (1 << 40, 512, true), (STATUS, 1, true)],
            3,
            VIRTIO_BLK_S_IOERR,
        );
        // An unknown type, and GET_ID without a buffer.
        header(&memory, 0x1234, 0);
        expect(
            &mut device,
            &[(HEADER, 16, false), (STATUS, 1, true)],
            4,
            VIRTIO_BLK_S_UNSUPP,
        );
        header(&memory, VIRTIO_BLK_T_GET_ID, 0);
        expect(
            &mut device,
            &[(HEADER, 16, false), (STATUS, 1, true)],
            5,
            VIRTIO_BLK_S_IOERR,
        );
        // No status byte, a read-only status, a short header, a header outside memory: dropped.
        header(&memory, VIRTIO_BLK_T_IN, 0);
        for (slot, chain) in [
            vec![(HEADER, 16, false)],
            vec![(HEADER, 16, false), (STATUS, 1, false)],
            vec![(HEADER, 8, false), (STATUS, 1, true)],
            vec![(DATA, 512, true), (STATUS, 1, true)],
        ]
        .iter()
        .enumerate()
        {
            let slot = 6 + slot as u16;
            add_chain(&mock, slot * 4, slot, chain);
            serve(&mut device);
            assert_eq!(used_len(&mock, slot), 0);
        }
        add_chain(&mock, 40, 10, &[(1 << 40, 16, false), (STATUS, 1, true)]);
        memory.write_obj(0x77u8, GuestAddress(STATUS)).unwrap();
        serve(&mut device);
        assert_eq!(status(&memory), VIRTIO_BLK_S_IOERR as u8);
        assert_eq!(mock.used().idx().load(), 11);
        assert!(device.warnings.count() >= 10);
        assert_eq!(device.counters.reads.load(Ordering::Relaxed), 0);
        // Notifications for other queues, and after a reset, are ignored.
        device.process_queue(3);
        device.reset();
        device.process_queue(0);
    }
}

#[test]
fn the_rate_limiter_holds_a_request_in_the_queue_until_its_timer() {
    for engine in ENGINES {
        let memory = testing::memory(16 * MIB);
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let image = image();
        // Two sectors' worth of bytes every 100 ms.
        let limiter = RateLimiterConfig {
            bandwidth: Some(TokenBucketConfig {
                size: 1024,
                one_time_burst: None,
                refill_time: 100,
            }),
            ops: None,
        };
        let (mut device, irq) =
            activated_drive(&memory, &mock, drive(&image, false, limiter, engine));
        for slot in 0..2u16 {
            header(&memory, VIRTIO_BLK_T_IN, u64::from(slot));
            add_chain(
                &mock,
                slot * 3,
                slot,
                &[(HEADER, 16, false), (DATA, 1024, true), (STATUS, 1, true)],
            );
        }
        serve(&mut device);
        assert_eq!(mock.used().idx().load(), 1, "the second read waits");
        assert_eq!(irq.read().unwrap(), 1);
        // A notification while it waits changes nothing.
        serve(&mut device);
        assert_eq!(mock.used().idx().load(), 1);
        wait_readable(device.wake_sources()[0].fd);
        device.wake(0);
        device.quiesce();
        assert_eq!(mock.used().idx().load(), 2);
        assert_eq!(status(&memory), VIRTIO_BLK_S_OK as u8);
        let counters = &device.counters;
        assert_eq!(counters.reads.load(Ordering::Relaxed), 2);
        assert_eq!(counters.rate_limiter_throttled.load(Ordering::Relaxed), 1);
    }
}

#[test]
fn a_new_image_from_the_api_is_served_and_announced_and_a_bad_one_changes_nothing() {
    for engine in ENGINES {
        let memory = testing::memory(16 * MIB);
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let image = image();
        let (device, irq) = activated(&memory, &mock, &image, true, engine);
        let (device, handle) = device.into_shared();
        // The new image: 8 sectors of 0x5a, read-only to this process (the drive is read-only).
        let media = TempFile::new().unwrap();
        media.as_file().write_all(&[0x5a; 8 * 512]).unwrap();
        let mut permissions = media.as_file().metadata().unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o400);
        media.as_file().set_permissions(permissions).unwrap();
        let fifo = std::env::temp_dir().join(format!("llfree-blk-fifo-{}", std::process::id()));
        let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
        for bad in [fifo.as_path(), Path::new("/nonexistent/image")] {
            assert!(handle.update(Some(bad), None).is_err(), "{}", bad.display());
        }
        std::fs::remove_file(&fifo).unwrap();
        assert_eq!(handle.config().path, image.as_path());
        handle.update(Some(media.as_path()), None).unwrap();
        assert_eq!(handle.config().path, media.as_path());
        let mut device = device.lock().unwrap();
        let mut capacity = [0u8; 8];
        device.read_config(0, &mut capacity);
        assert_eq!(u64::from_le_bytes(capacity), 8);
        // The driver is told (nothing else raised the interrupt yet: a configuration change).
        assert_eq!(irq.read().unwrap(), 1);
        header(&memory, VIRTIO_BLK_T_IN, 7);
        add_chain(
            &mock,
            0,
            0,
            &[(HEADER, 16, false), (DATA, 512, true), (STATUS, 1, true)],
        );
        serve(&mut device);
        assert_eq!(status(&memory), VIRTIO_BLK_S_OK as u8);
        assert_eq!(
            memory.read_obj::<u8>(GuestAddress(DATA + 511)).unwrap(),
            0x5a
        );
        // Sector 8 was on the old disk, not on this one.
        header(&memory, VIRTIO_BLK_T_IN, 8);
        add_chain(
            &mock,
            3,
            1,
            &[(HEADER, 16, false), (DATA, 512, true), (STATUS, 1, true)],
        );
        serve(&mut device);
        assert_eq!(status(&memory), VIRTIO_BLK_S_IOERR as u8);
    }
}

#[test]
fn the_async_engine_keeps_many_requests_in_flight_and_answers_each_when_it_finishes() {
    let memory = testing::memory(16 * MIB);
    let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 32);
    let image = image();
    let (mut device, irq) = activated(&memory, &mock, &image, false, IoEngine::Async);
    // Eight reads of one sector each, sector n into its own buffer, all made available at once.
    for n in 0..8u16 {
        let header_at = HEADER + u64::from(n) * 16;
        memory
            .write_obj(VIRTIO_BLK_T_IN.to_le(), GuestAddress(header_at))
            .unwrap();
        memory
            .write_obj((u64::from(n) + 10).to_le(), GuestAddress(header_at + 8))
            .unwrap();
        add_chain(
            &mock,
            n * 3,
            n,
            &[
                (header_at, 16, false),
                (DATA + u64::from(n) * 4096, 512, true),
                (STATUS + u64::from(n), 1, true),
            ],
        );
    }
    device.process_queue(0);
    // Nothing is answered before the event loop collects the completions.
    assert_eq!(mock.used().idx().load(), 0);
    let completions = device.wake_sources()[1].fd;
    while mock.used().idx().load() < 8 {
        wait_readable(completions);
        device.wake(1);
    }
    assert!(irq.read().unwrap() >= 1);
    for n in 0..8u16 {
        let status: u8 = memory
            .read_obj(GuestAddress(STATUS + u64::from(n)))
            .unwrap();
        assert_eq!(status, VIRTIO_BLK_S_OK as u8, "request {n}");
        let data: u8 = memory
            .read_obj(GuestAddress(DATA + u64::from(n) * 4096 + 511))
            .unwrap();
        assert_eq!(data, n as u8 + 10, "request {n}");
    }
    let counters = &device.counters;
    assert_eq!(counters.reads.load(Ordering::Relaxed), 8);
    assert_eq!(counters.read_bytes.load(Ordering::Relaxed), 8 * 512);
    assert_eq!(used_len(&mock, 7), 513);
}

#[test]
fn a_descriptor_made_available_twice_while_in_flight_is_refused_and_a_reset_waits() {
    let memory = testing::memory(16 * MIB);
    let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
    let image = image();
    let (mut device, _) = activated(&memory, &mock, &image, false, IoEngine::Async);
    memory
        .write_slice(&[0xcd; 4096], GuestAddress(DATA))
        .unwrap();
    header(&memory, VIRTIO_BLK_T_OUT, 8);
    let chain = [(HEADER, 16, false), (DATA, 4096, false), (STATUS, 1, true)];
    add_chain(&mock, 0, 0, &chain);
    device.process_queue(0);
    // The same head again, while its write is in flight: refused, the write unharmed.
    mock.avail().ring().ref_at(1).unwrap().store(0);
    mock.avail().idx().store(2);
    device.process_queue(0);
    assert!(device.warnings.count() >= 1);
    device.reset();
    assert_eq!(mock.used().idx().load(), 2);
    let mut contents = Vec::new();
    std::fs::File::open(image.as_path())
        .unwrap()
        .read_to_end(&mut contents)
        .unwrap();
    assert!(contents[8 * 512..16 * 512].iter().all(|&b| b == 0xcd));
    assert_eq!(device.counters.writes.load(Ordering::Relaxed), 1);
    assert_eq!(device.counters.failed.load(Ordering::Relaxed), 1);
}

#[test]
fn with_event_idx_the_driver_is_told_where_to_notify_and_interrupted_only_when_it_waits() {
    for engine in ENGINES {
        let memory = testing::memory(16 * MIB);
        let size = 16u16;
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), size);
        let image = image();
        let config = drive(&image, false, Default::default(), engine);
        let (file, image_size) = open_image(&config.path, false).unwrap();
        let mut device = BlockDevice::new(memory.clone(), config, file, image_size).unwrap();
        assert_ne!(device.device_features() & 1 << VIRTIO_RING_F_EVENT_IDX, 0);
        let (mut activation, irq) = activation(&memory, &mock);
        activation.queues[0].queue.set_event_idx(true);
        device.activate(activation).unwrap();
        // `used_event` after the available ring, `avail_event` after the used ring.
        let used_event = GuestAddress(mock.avail_addr().0 + 4 + 2 * u64::from(size));
        let avail_event = GuestAddress(mock.used_addr().0 + 4 + 8 * u64::from(size));
        // The driver waits for an interrupt only after its fifth request.
        memory.write_obj(4u16, used_event).unwrap();
        for n in 0..2u16 {
            header(&memory, VIRTIO_BLK_T_IN, u64::from(n));
            add_chain(
                &mock,
                n * 3,
                n,
                &[(HEADER, 16, false), (DATA, 512, true), (STATUS, 1, true)],
            );
        }
        serve(&mut device);
        assert_eq!(mock.used().idx().load(), 2, "{engine:?}");
        assert!(irq.read().is_err(), "{engine:?}: no interrupt yet");
        // Told to notify again at the next chain it makes available.
        assert_eq!(
            memory.read_obj::<u16>(avail_event).unwrap(),
            2,
            "{engine:?}"
        );
        // Now it waits for the third: interrupted.
        memory.write_obj(2u16, used_event).unwrap();
        header(&memory, VIRTIO_BLK_T_IN, 2);
        add_chain(
            &mock,
            6,
            2,
            &[(HEADER, 16, false), (DATA, 512, true), (STATUS, 1, true)],
        );
        serve(&mut device);
        assert_eq!(irq.read().unwrap(), 1, "{engine:?}");
        assert_eq!(
            memory.read_obj::<u16>(avail_event).unwrap(),
            3,
            "{engine:?}"
        );
    }
}
