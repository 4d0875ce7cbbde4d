//! Transport tests against real guest memory (`GuestMemoryMmap`) and real event fds.

use super::testing::*;
use super::*;
use crate::virtio::interrupt::{INT_CONFIG, INT_USED_RING};
use crate::virtio::status::{ACKNOWLEDGE, DEVICE_NEEDS_RESET};
use proptest::prelude::*;
use vm_memory::{GuestAddress, GuestMemoryMmap};

const BASE: u64 = 0xc000_0000;
const MEM_SIZE: usize = 0x10_0000;

pub(crate) struct Fixture {
    pub(crate) transport: MmioTransport<MmapMemory, TestDevice>,
}

impl Fixture {
    pub(crate) fn new() -> Self {
        let memory =
            Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap());
        let device = Arc::new(Mutex::new(TestDevice::default()));
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        Fixture {
            transport: MmioTransport::new(memory, device, irq).unwrap(),
        }
    }
    fn read(&self, offset: u64) -> u32 {
        let mut data = [0xffu8; 4];
        self.transport.read(BASE, offset, &mut data);
        u32::from_le_bytes(data)
    }
    pub(crate) fn write(&self, offset: u64, value: u32) {
        self.transport.write(BASE, offset, &value.to_le_bytes());
    }
    fn status(&self) -> u32 {
        self.read(reg::STATUS)
    }
    pub(crate) fn set_status(&self, bits: u32) {
        self.write(reg::STATUS, self.status() | bits);
    }
    /// ACKNOWLEDGE, DRIVER, features, FEATURES_OK.
    pub(crate) fn negotiate(&self, features: u64) {
        self.set_status(ACKNOWLEDGE);
        self.set_status(DRIVER);
        self.write(reg::DRIVER_FEATURES_SEL, 0);
        self.write(reg::DRIVER_FEATURES, features as u32);
        self.write(reg::DRIVER_FEATURES_SEL, 1);
        self.write(reg::DRIVER_FEATURES, (features >> 32) as u32);
        self.set_status(FEATURES_OK);
    }
    pub(crate) fn setup_queue(&self, index: u32, size: u32, desc: u64) {
        self.write(reg::QUEUE_SEL, index);
        self.write(reg::QUEUE_NUM, size);
        self.write(reg::QUEUE_DESC_LOW, desc as u32);
        self.write(reg::QUEUE_DESC_HIGH, (desc >> 32) as u32);
        self.write(reg::QUEUE_AVAIL_LOW, (desc + 0x1000) as u32);
        self.write(reg::QUEUE_AVAIL_HIGH, 0);
        self.write(reg::QUEUE_USED_LOW, (desc + 0x2000) as u32);
        self.write(reg::QUEUE_USED_HIGH, 0);
        self.write(reg::QUEUE_READY, 1);
    }
    /// Negotiates VERSION_1, sets queue `index` up with `size` entries at `desc` and sets
    /// DRIVER_OK: what a minimal driver does.
    pub(crate) fn activate_queue(&self, index: u32, size: u32, desc: u64) {
        self.negotiate(VERSION_1);
        self.setup_queue(index, size, desc);
        self.set_status(DRIVER_OK);
    }
    fn activations(&self) -> Vec<ActivationRecord> {
        lock(self.transport.device()).activations.clone()
    }
}

pub(crate) const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;

#[test]
fn identity_registers() {
    let f = Fixture::new();
    assert_eq!(f.read(reg::MAGIC_VALUE), 0x7472_6976);
    assert_eq!(f.read(reg::VERSION), 2);
    assert_eq!(f.read(reg::DEVICE_ID), TEST_DEVICE_TYPE);
    assert_eq!(f.read(reg::VENDOR_ID), 0);
    assert_eq!(f.read(reg::DEVICE_FEATURES), TEST_FEATURES as u32);
    f.write(reg::DEVICE_FEATURES_SEL, 1);
    assert_eq!(f.read(reg::DEVICE_FEATURES), 1, "VERSION_1 is bit 32");
    f.write(reg::DEVICE_FEATURES_SEL, 7);
    assert_eq!(f.read(reg::DEVICE_FEATURES), 0);
    assert_eq!(f.read(reg::QUEUE_NUM_MAX), 16);
    f.write(reg::QUEUE_SEL, 1);
    assert_eq!(f.read(reg::QUEUE_NUM_MAX), 256);
    f.write(reg::QUEUE_SEL, 2);
    assert_eq!(f.read(reg::QUEUE_NUM_MAX), 0);
    assert_eq!(f.read(reg::QUEUE_READY), 0);
    assert_eq!(f.read(reg::SHM_LEN_LOW), 0xffff_ffff);
    assert_eq!(f.read(reg::SHM_LEN_HIGH), 0xffff_ffff);
    assert_eq!(f.read(reg::CONFIG_GENERATION), 0);
    assert_eq!(f.read(reg::INTERRUPT_STATUS), 0);
    assert_eq!(f.read(reg::QUEUE_NOTIFY), 0, "write-only reads as 0");
    assert_eq!(f.read(0xf0), 0, "unknown reads as 0");
}

#[test]
fn full_initialization_activates_the_device_with_its_queues() {
    let f = Fixture::new();
    let features = VERSION_1 | TEST_FEATURES;
    f.negotiate(features);
    assert_ne!(f.status() & FEATURES_OK, 0);
    f.setup_queue(0, 16, 0x1_0000);
    f.setup_queue(1, 128, 0x2_0000);
    assert_eq!(f.read(reg::QUEUE_READY), 1);
    f.set_status(DRIVER_OK);
    assert!(f.transport.is_activated());
    assert_eq!(
        f.activations(),
        vec![(
            features,
            vec![(0, 16, 0x1_0000, true), (1, 128, 0x2_0000, true)]
        )]
    );

    // A trapped notification signals the queue's event fd.
    f.write(reg::QUEUE_NOTIFY, 1);
    assert_eq!(f.transport.queue_notifiers()[1].read().unwrap(), 1);
    assert!(f.transport.queue_notifiers()[0].read().is_err());

    // Interrupts: status visible, acknowledged by the driver.
    f.transport.interrupt().signal_used_queue().unwrap();
    assert_eq!(f.read(reg::INTERRUPT_STATUS), INT_USED_RING);
    assert_eq!(f.transport.interrupt().irq_evt().read().unwrap(), 1);
    f.write(reg::INTERRUPT_ACK, INT_USED_RING);
    assert_eq!(f.read(reg::INTERRUPT_STATUS), 0);
    f.transport.interrupt().signal_config_change().unwrap();
    assert_eq!(f.read(reg::CONFIG_GENERATION), 1);
}

#[test]
fn unused_queues_are_left_out_of_the_activation() {
    let f = Fixture::new();
    f.activate_queue(1, 256, 0x3_0000);
    assert_eq!(
        f.activations(),
        vec![(VERSION_1, vec![(1, 256, 0x3_0000, false)])]
    );
}

#[test]
fn bad_queue_values_are_rejected() {
    let f = Fixture::new();
    f.negotiate(VERSION_1);
    f.write(reg::QUEUE_SEL, 0);
    for bad_size in [0, 3, 32, 0x1_0010] {
        f.write(reg::QUEUE_NUM, bad_size);
    }
    f.write(reg::QUEUE_DESC_LOW, 0x1_0008); // not 16-byte aligned
    f.write(reg::QUEUE_AVAIL_LOW, 0x1_1001); // not 2-byte aligned
    f.write(reg::QUEUE_USED_LOW, 0x1_2002); // not 4-byte aligned
    let state = lock(&f.transport.state);
    let queue = &state.queues[0];
    assert_eq!(queue.size(), 16);
    assert_eq!(queue.desc_table(), 0);
    assert_eq!(queue.avail_ring(), 0);
    assert_eq!(queue.used_ring(), 0);
    drop(state);

    // Rings outside guest memory: the queue does not become ready.
    f.setup_queue(0, 16, MEM_SIZE as u64 - 0x1000);
    assert_eq!(f.read(reg::QUEUE_READY), 0);
    f.setup_queue(0, 16, 0xc000_0000);
    assert_eq!(f.read(reg::QUEUE_READY), 0);
    f.setup_queue(0, 16, 0xffff_ffff_ffff_d000);
    assert_eq!(f.read(reg::QUEUE_READY), 0);
    // A ready queue cannot be changed.
    f.setup_queue(0, 16, 0x1_0000);
    assert_eq!(f.read(reg::QUEUE_READY), 1);
    f.write(reg::QUEUE_NUM, 8);
    assert_eq!(lock(&f.transport.state).queues[0].size(), 16);
    // Missing queue: ignored.
    f.write(reg::QUEUE_SEL, 9);
    f.write(reg::QUEUE_NUM, 8);
    f.write(reg::QUEUE_READY, 1);
    assert_eq!(f.read(reg::QUEUE_READY), 0);
}

#[test]
fn queue_registers_are_only_writable_between_features_ok_and_driver_ok() {
    let f = Fixture::new();
    f.set_status(ACKNOWLEDGE);
    f.set_status(DRIVER);
    f.setup_queue(0, 8, 0x1_0000);
    assert_eq!(f.read(reg::QUEUE_READY), 0, "before FEATURES_OK");
    f.write(reg::DRIVER_FEATURES_SEL, 1);
    f.write(reg::DRIVER_FEATURES, 1);
    f.set_status(FEATURES_OK);
    f.set_status(DRIVER_OK);
    f.setup_queue(0, 8, 0x1_0000);
    assert_eq!(f.read(reg::QUEUE_READY), 0, "after DRIVER_OK");
    assert_eq!(lock(&f.transport.state).queues[0].size(), 16);
}

#[test]
fn feature_negotiation_rejects_unoffered_features_and_legacy_drivers() {
    let f = Fixture::new();
    f.negotiate(VERSION_1 | (1 << 5));
    assert_eq!(f.status() & FEATURES_OK, 0);
    let f = Fixture::new();
    f.negotiate(TEST_FEATURES);
    assert_eq!(f.status() & FEATURES_OK, 0);
    // Features are frozen once FEATURES_OK is set.
    let f = Fixture::new();
    f.negotiate(VERSION_1);
    f.write(reg::DRIVER_FEATURES_SEL, 0);
    f.write(reg::DRIVER_FEATURES, TEST_FEATURES as u32);
    assert_eq!(lock(&f.transport.state).driver_features, VERSION_1);
}

#[test]
fn illegal_status_writes_are_ignored() {
    let f = Fixture::new();
    f.write(reg::STATUS, DRIVER_OK);
    assert_eq!(f.status(), 0);
    f.set_status(ACKNOWLEDGE);
    f.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    assert_eq!(f.status(), ACKNOWLEDGE);
    assert!(!f.transport.is_activated());
}

#[test]
fn reset_returns_everything_to_the_initial_state() {
    let f = Fixture::new();
    f.activate_queue(0, 8, 0x1_0000);
    f.transport.interrupt().signal_used_queue().unwrap();
    f.write(reg::QUEUE_NOTIFY, 0);
    f.write(reg::STATUS, 0);
    assert_eq!(f.status(), 0);
    assert!(!f.transport.is_activated());
    assert_eq!(lock(f.transport.device()).resets, 1);
    assert_eq!(f.read(reg::INTERRUPT_STATUS), 0);
    assert!(f.transport.queue_notifiers()[0].read().is_err());
    f.write(reg::QUEUE_SEL, 0);
    assert_eq!(f.read(reg::QUEUE_READY), 0);
    assert_eq!(lock(&f.transport.state).queues[0].size(), 16);
    // And it can be initialized again.
    f.activate_queue(0, 8, 0x1_0000);
    assert_eq!(f.activations().len(), 2);
}

#[test]
fn bad_notifications_are_ignored() {
    let f = Fixture::new();
    f.write(reg::QUEUE_NOTIFY, 0); // before activation
    assert!(f.transport.queue_notifiers()[0].read().is_err());
    f.activate_queue(0, 8, 0x1_0000);
    f.write(reg::QUEUE_NOTIFY, 1); // not ready
    f.write(reg::QUEUE_NOTIFY, 2); // does not exist
    f.write(reg::QUEUE_NOTIFY, u32::MAX);
    for notifier in f.transport.queue_notifiers() {
        assert!(notifier.read().is_err());
    }
}

#[test]
fn failed_activation_asks_for_a_reset() {
    let f = Fixture::new();
    lock(f.transport.device()).fail_activation = true;
    f.activate_queue(0, 8, 0x1_0000);
    assert!(!f.transport.is_activated());
    assert_ne!(f.status() & DEVICE_NEEDS_RESET, 0);
    assert_eq!(f.read(reg::INTERRUPT_STATUS), INT_CONFIG);
}

#[test]
fn a_device_that_stops_after_activation_shows_needs_reset_until_the_driver_resets_it() {
    let f = Fixture::new();
    f.activate_queue(0, 8, 0x1_0000);
    assert!(f.transport.is_activated());
    let running = f.status();
    // The device found a broken ring (as the balloon does through its notifier).
    f.transport.interrupt().signal_needs_reset().unwrap();
    assert_eq!(f.status(), running | DEVICE_NEEDS_RESET);
    assert_eq!(f.read(reg::INTERRUPT_STATUS), INT_CONFIG);
    f.write(reg::INTERRUPT_ACK, INT_CONFIG);
    // The driver may echo the bit back; only a reset clears it.
    f.write(reg::STATUS, running | DEVICE_NEEDS_RESET);
    assert_eq!(f.status(), running | DEVICE_NEEDS_RESET);
    f.write(reg::STATUS, 0);
    assert_eq!(f.status(), 0);
}

#[test]
fn bad_access_sizes_are_ignored_and_config_space_passes_through() {
    let f = Fixture::new();
    let mut two = [0xaa; 2];
    f.transport.read(BASE, reg::MAGIC_VALUE, &mut two);
    assert_eq!(two, [0, 0]);
    let mut eight = [0xaa; 8];
    f.transport.read(BASE, reg::MAGIC_VALUE, &mut eight);
    assert_eq!(eight, [0; 8]);
    f.transport.write(BASE, reg::STATUS, &[ACKNOWLEDGE as u8]);
    assert_eq!(f.status(), 0);
    f.transport.write(BASE, reg::STATUS + 1, &[1, 0, 0, 0]);
    assert_eq!(f.status(), 0);

    // Config writes need DRIVER.
    f.transport.write(BASE, reg::CONFIG, &[1, 2]);
    assert_eq!(lock(f.transport.device()).config[..2], [0, 0]);
    f.set_status(ACKNOWLEDGE);
    f.set_status(DRIVER);
    f.transport.write(BASE, reg::CONFIG + 6, &[7, 8, 9, 10]);
    let mut data = [0xaa; 4];
    f.transport.read(BASE, reg::CONFIG + 5, &mut data);
    assert_eq!(data, [0, 7, 8, 0]);
    f.transport.read(BASE, u64::MAX - 1, &mut data);
    assert_eq!(data, [0; 4]);
}

proptest! {
    /// Arbitrary register traffic never panics and never activates without DRIVER_OK.
    #[test]
    fn random_register_traffic_is_harmless(
        ops in proptest::collection::vec((0u64..0x120, any::<u32>(), 0usize..5), 0..200)
    ) {
        let f = Fixture::new();
        for (offset, value, len) in ops {
            let bytes = value.to_le_bytes();
            f.transport.write(BASE, offset, &bytes[..len.min(4)]);
            let mut data = [0u8; 4];
            f.transport.read(BASE, offset, &mut data[..len.min(4)]);
        }
        if f.transport.is_activated() {
            prop_assert_ne!(f.status() & DRIVER_OK, 0);
        }
    }
}

#[test]
fn a_restored_transport_shows_the_driver_what_the_saved_one_did() {
    let f = Fixture::new();
    f.negotiate(VERSION_1 | TEST_FEATURES);
    f.setup_queue(0, 16, 0x1_0000);
    f.set_status(DRIVER_OK);
    f.transport.interrupt().signal_config_change().unwrap();
    let saved = f.transport.save_state();
    assert!(saved.activated && saved.queues[0].ready && !saved.queues[1].ready);

    let g = Fixture::new();
    g.transport.restore_state(&saved).unwrap();
    assert_eq!(g.transport.save_state(), saved);
    assert_eq!(g.status(), f.status());
    assert_eq!(g.read(reg::CONFIG_GENERATION), 1);
    assert_eq!(g.read(reg::INTERRUPT_STATUS), INT_CONFIG);
    assert_eq!(
        g.activations(),
        vec![(VERSION_1 | TEST_FEATURES, vec![(0, 16, 0x1_0000, true)])],
        "the device got its queue back"
    );
    assert_eq!(
        g.transport.queue_notifiers()[0].read().unwrap(),
        1,
        "a notification lost with the old process is made up for"
    );
    assert!(
        g.transport.queue_notifiers()[1].read().is_err(),
        "not ready"
    );

    // States that do not fit are refused, and leave a reset transport.
    let h = Fixture::new();
    let mut other_type = saved.clone();
    other_type.device_type = 5;
    let mut too_few = saved.clone();
    too_few.queues.pop();
    let mut ring_outside = saved.clone();
    ring_outside.queues[0].used_ring = MEM_SIZE as u64;
    let mut unoffered = saved.clone();
    unoffered.driver_features |= 1 << 60;
    for bad in [other_type, too_few, ring_outside, unoffered] {
        assert!(matches!(
            h.transport.restore_state(&bad),
            Err(MmioError::BadState(_))
        ));
        assert_eq!((h.status(), h.transport.is_activated()), (0, false));
    }
}
