//! The device on its request queue: real split rings in real guest memory (an LLFree pool of
//! 2 MiB frames with guest-mem's hot-pluggable region), driven as Linux drives it.

use guest_mem::{Backing, MemoryConfig, Pool, PoolConfig, Populate};
use virtio_mem::spec::{VIRTIO_MEM_RESP_ACK, VIRTIO_MEM_RESP_ERROR, VIRTIO_MEM_RESP_NACK};
use virtio_queue::mock::MockSplitQueue;
use vmm_sys_util::eventfd::EventFd;

use super::config::{DEFAULT_BLOCK_SIZE, DEFAULT_SLOT_SIZE};
use super::*;
use crate::virtio::request_queue::testing::{activation, add_chain, used_len};

const MIB: u64 = 1 << 20;
const RAM: u64 = 16 * MIB;
/// The hot-pluggable memory: 128 MiB at 4 GiB.
const REGION: u64 = 4 << 30;
const TOTAL: u64 = 128 * MIB;
const RING: u64 = MIB;
const REQUEST: u64 = 2 * MIB;
const ANSWER: u64 = 2 * MIB + 0x100;

fn config() -> HotplugConfig {
    HotplugConfig {
        total_size: TOTAL,
        block_size: DEFAULT_BLOCK_SIZE,
        slot_size: DEFAULT_SLOT_SIZE,
    }
}

/// RAM populated up front and the hot-pluggable memory, on a pool with `frames_mib` for it.
fn memory(frames_mib: u64) -> (DeviceMemory, Arc<Pool>) {
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, RAM + frames_mib * MIB)).unwrap();
    let config = MemoryConfig {
        populate: Populate::Eager,
        hotplug: Some((GuestAddress(REGION), TOTAL)),
        ..MemoryConfig::new(vec![(GuestAddress(0), RAM)], 1)
    };
    (
        Arc::new(GuestMemory::new(Arc::clone(&pool), config).unwrap()),
        pool,
    )
}

/// A device activated as Linux activates it, with the queue of `mock`.
fn activated(
    memory: &DeviceMemory,
    mock: &MockSplitQueue<'_, GuestMemory>,
) -> (MemHandle, EventFd) {
    let device = MemDevice::new(memory.clone(), config()).unwrap();
    let (mut activation, irq) = activation(memory, mock);
    activation.acked_features = 1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE;
    let (device, handle) = device.into_shared(config());
    device.lock().unwrap().activate(activation).unwrap();
    (handle, irq)
}

/// Sends `request` as the `avail`-th chain and returns the answer's type.
fn send(
    handle: &MemHandle,
    memory: &DeviceMemory,
    mock: &MockSplitQueue<'_, GuestMemory>,
    avail: u16,
    request: MemRequest,
) -> u16 {
    memory
        .write_slice(&request.to_bytes(), GuestAddress(REQUEST))
        .unwrap();
    add_chain(
        mock,
        avail * 2,
        avail,
        &[(REQUEST, 24, false), (ANSWER, 10, true)],
    );
    handle.lock().process_queue(0);
    assert_eq!(used_len(mock, avail), 10);
    memory.read_obj::<u16>(GuestAddress(ANSWER)).unwrap()
}

#[test]
fn the_config_space_shows_the_region_and_a_new_requested_size_interrupts_the_driver() {
    let (memory, _pool) = memory(TOTAL / MIB);
    let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
    let (handle, irq) = activated(&memory, &mock);
    let le64 = |offset: u64| {
        let mut bytes = [0u8; 8];
        handle.lock().read_config(offset, &mut bytes);
        u64::from_le_bytes(bytes)
    };
    assert_eq!(le64(0), DEFAULT_BLOCK_SIZE);
    assert_eq!(le64(16), REGION);
    assert_eq!((le64(24), le64(32)), (TOTAL, TOTAL));
    assert_eq!((le64(40), le64(48)), (0, 0));
    handle.set_requested_size(64 * MIB).unwrap();
    assert_eq!(le64(48), 64 * MIB);
    assert_eq!(irq.read().unwrap(), 1);
    assert!(handle
        .set_requested_size(TOTAL + DEFAULT_BLOCK_SIZE)
        .is_err());
    assert!(handle.set_requested_size(MIB).is_err());
    assert_eq!(handle.status().requested_size, 64 * MIB);
    assert_eq!(handle.lock().device_type(), 24);
}

#[test]
fn plugs_take_frames_up_to_the_requested_size_and_unplugs_give_them_back() {
    let (memory, pool) = memory(TOTAL / MIB);
    let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
    let (handle, _irq) = activated(&memory, &mock);
    let used = || pool.stats().used_bytes;
    assert_eq!(used(), RAM);
    handle.set_requested_size(8 * MIB).unwrap();
    let plug = |blocks| MemRequest::Plug {
        addr: REGION,
        blocks,
    };
    assert_eq!(
        send(&handle, &memory, &mock, 0, plug(5)),
        VIRTIO_MEM_RESP_NACK
    );
    assert_eq!(
        send(&handle, &memory, &mock, 1, plug(4)),
        VIRTIO_MEM_RESP_ACK
    );
    assert_eq!(used(), RAM + 8 * MIB);
    assert_eq!(handle.status().plugged_size, 8 * MIB);
    memory.write_obj(7u64, GuestAddress(REGION)).unwrap();
    let unplug = MemRequest::Unplug {
        addr: REGION + 2 * MIB,
        blocks: 3,
    };
    assert_eq!(
        send(&handle, &memory, &mock, 2, unplug),
        VIRTIO_MEM_RESP_ACK
    );
    assert_eq!(used(), RAM + 2 * MIB);
    assert!(memory
        .read_obj::<u64>(GuestAddress(REGION + 2 * MIB))
        .is_err());
    assert_eq!(memory.read_obj::<u64>(GuestAddress(REGION)).unwrap(), 7);
    let hostile = MemRequest::Plug {
        addr: REGION - 2 * MIB,
        blocks: 1,
    };
    assert_eq!(
        send(&handle, &memory, &mock, 3, hostile),
        VIRTIO_MEM_RESP_ERROR
    );
    assert_eq!(
        send(&handle, &memory, &mock, 4, MemRequest::UnplugAll),
        VIRTIO_MEM_RESP_ACK
    );
    assert_eq!(used(), RAM);
    assert_eq!(mock.used().idx().load(), 5);
}

#[test]
fn malformed_chains_are_used_unanswered_and_a_driver_without_the_feature_is_refused() {
    let (memory, pool) = memory(TOTAL / MIB);
    let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
    let (handle, _irq) = activated(&memory, &mock);
    handle.set_requested_size(TOTAL).unwrap();
    memory
        .write_slice(
            &MemRequest::Plug {
                addr: REGION,
                blocks: 1,
            }
            .to_bytes(),
            GuestAddress(REQUEST),
        )
        .unwrap();
    for (avail, chain) in [
        vec![(REQUEST, 24, false)],
        vec![(REQUEST, 23, false), (ANSWER, 10, true)],
        vec![(REQUEST, 24, false), (ANSWER, 9, true)],
        vec![(REQUEST, 24, false), (RAM + MIB, 10, true)],
        vec![(RAM, 24, false), (ANSWER, 10, true)],
    ]
    .into_iter()
    .enumerate()
    {
        add_chain(&mock, avail as u16 * 2, avail as u16, &chain);
    }
    handle.lock().process_queue(0);
    assert_eq!(mock.used().idx().load(), 5);
    for slot in 0..5 {
        assert_eq!(used_len(&mock, slot), 0, "chain {slot}");
    }
    // The one whose answer could not be written was still applied, as a plug.
    assert_eq!(pool.stats().used_bytes, RAM + 2 * MIB);

    let mut device = MemDevice::new(memory.clone(), config()).unwrap();
    let (activation, _irq) = activation(&memory, &mock);
    assert!(device.activate(activation).is_err());
}
