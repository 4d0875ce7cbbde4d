//! The virtio-pmem device (virtio 1.2 §5.19): a range of guest memory, outside RAM, that the
//! guest uses as persistent memory (Linux: /dev/pmem0, a file system on it with `-o dax`). Its
//! memory is guest memory like RAM, so in a zone it is made of zone frames and outlives the VMM.
//! A flush request writes the range back to its backing (msync) before it is answered.
//!
//! Everything the guest writes is checked: a request needs a readable descriptor of at least
//! 4 bytes (the type) and a writable one of at least 4 bytes (the answer); anything else is put
//! in the used ring unanswered and counted as a warning (rate-limited).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use guest_mem::GuestMemory;
use virtio_bindings::virtio_ids::VIRTIO_ID_PMEM;
use virtio_queue::{DescriptorChain, Queue, QueueState, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};

use crate::devices::virtio::{ActivateError, Activation, DeviceState, Interrupt, VirtioDevice};
use crate::devices::GuestWarnings;

/// The only request type: make everything written so far durable.
pub const REQ_TYPE_FLUSH: u32 = 0;
/// Answer: done.
pub const RESP_OK: u32 = 0;
/// Answer: the flush failed.
pub const RESP_EIO: u32 = 1;
/// Size of the request queue.
const QUEUE_SIZE: u16 = 256;
const QUEUE_SIZES: [u16; 1] = [QUEUE_SIZE];

/// The queues' guest memory.
pub type Memory = Arc<GuestMemory>;

/// What the device holds between activation and reset.
#[derive(Debug)]
struct Active {
    queue: Queue,
    interrupt: Arc<Interrupt>,
}

/// What the control API shows of a virtio-pmem device: where its memory is and how often the
/// guest flushed it.
#[derive(Debug, Clone)]
pub struct PmemHandle {
    /// Guest physical address of its memory.
    pub start: u64,
    /// Bytes of memory.
    pub size: u64,
    flushes: Arc<AtomicU64>,
}

impl PmemHandle {
    /// Flush requests answered so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }
}

/// A virtio-pmem device over `[start, start + size)` of guest memory.
#[derive(Debug)]
pub struct PmemDevice {
    start: u64,
    size: u64,
    memory: Memory,
    active: Option<Active>,
    warnings: GuestWarnings,
    flushes: Arc<AtomicU64>,
}

impl PmemDevice {
    /// A device whose memory is `[start, start + size)` of `memory` (which must hold it).
    pub fn new(memory: Memory, start: u64, size: u64) -> Self {
        Self {
            start,
            size,
            memory,
            active: None,
            warnings: GuestWarnings::default(),
            flushes: Arc::default(),
        }
    }

    /// The device's handle for the control API.
    pub fn handle(&self) -> PmemHandle {
        PmemHandle {
            start: self.start,
            size: self.size,
            flushes: Arc::clone(&self.flushes),
        }
    }

    /// The config space: `le64 start; le64 size`.
    fn config(&self) -> [u8; 16] {
        let mut config = [0u8; 16];
        config[..8].copy_from_slice(&self.start.to_le_bytes());
        config[8..].copy_from_slice(&self.size.to_le_bytes());
        config
    }

    /// Answers one request; returns the bytes written to the guest.
    fn answer(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
        let mut request = None;
        let mut response = None;
        for desc in chain {
            if desc.is_write_only() {
                if response.is_none() && desc.len() >= 4 {
                    response = Some(desc.addr());
                }
            } else if request.is_none() && desc.len() >= 4 {
                request = Some(desc.addr());
            }
        }
        let (Some(request), Some(response)) = (request, response) else {
            self.warnings.warn(format_args!(
                "virtio-pmem: a request lacks its 4-byte type or its 4-byte answer buffer"
            ));
            return 0;
        };
        let answer = match mem.read_obj::<u32>(request).map(u32::from_le) {
            Ok(REQ_TYPE_FLUSH) => match self.memory.sync(GuestAddress(self.start), self.size) {
                Ok(()) => {
                    self.flushes.fetch_add(1, Ordering::Relaxed);
                    RESP_OK
                }
                Err(e) => {
                    log::error!("virtio-pmem: flush failed: {e}");
                    RESP_EIO
                }
            },
            Ok(other) => {
                self.warnings
                    .warn(format_args!("virtio-pmem: unknown request type {other}"));
                RESP_EIO
            }
            Err(_) => {
                self.warnings.warn(format_args!(
                    "virtio-pmem: the request is not in guest memory"
                ));
                return 0;
            }
        };
        match mem.write_obj(answer.to_le(), response) {
            Ok(()) => 4,
            Err(_) => {
                self.warnings.warn(format_args!(
                    "virtio-pmem: the answer buffer is not in guest memory"
                ));
                0
            }
        }
    }
}

impl VirtioDevice<Memory> for PmemDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_PMEM
    }

    fn device_features(&self) -> u64 {
        0
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.config();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = usize::try_from(offset)
                .ok()
                .and_then(|offset| offset.checked_add(i))
                .and_then(|at| config.get(at))
                .copied()
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        self.warnings.warn(format_args!(
            "virtio-pmem: write to the read-only config space at {offset}"
        ));
    }

    fn activate(&mut self, activation: Activation<Memory>) -> Result<(), ActivateError> {
        let queue = activation
            .queues
            .into_iter()
            .find(|q| q.index == 0)
            .ok_or(ActivateError::MissingQueue(0))?;
        self.active = Some(Active {
            queue: queue.queue,
            interrupt: activation.interrupt,
        });
        Ok(())
    }

    fn process_queue(&mut self, index: u16) {
        let Some(mut active) = self.active.take() else {
            return;
        };
        if index == 0 {
            let memory = Arc::clone(&self.memory);
            let mem = memory.memory();
            let mut used = false;
            while let Some(chain) = active.queue.pop_descriptor_chain(&*mem) {
                let head = chain.head_index();
                let written = self.answer(&mem, chain);
                if active.queue.add_used(&*mem, head, written).is_err() {
                    self.warnings.warn(format_args!(
                        "virtio-pmem: the used ring is not in guest memory"
                    ));
                    break;
                }
                used = true;
            }
            if used && active.interrupt.signal_used_queue().is_err() {
                log::error!("virtio-pmem: cannot raise the used-buffer interrupt");
            }
        }
        self.active = Some(active);
    }

    fn reset(&mut self) {
        self.active = None;
    }

    fn queue_states(&self) -> Vec<(u16, QueueState)> {
        self.active
            .iter()
            .map(|active| (0, active.queue.state()))
            .collect()
    }

    fn save_state(&self) -> DeviceState {
        DeviceState::Pmem {
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }

    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<Memory>>,
    ) -> Result<(), ActivateError> {
        let DeviceState::Pmem { flushes } = state else {
            return Err(ActivateError::Device(
                format!("a virtio-pmem device cannot take the state {state:?}").into(),
            ));
        };
        if let Some(activation) = activation {
            self.activate(activation)?;
        }
        self.flushes.store(*flushes, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use guest_mem::{Backing, MemoryConfig, Pool, PoolConfig, Populate};
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    use super::*;
    use crate::devices::virtio::ActiveQueue;

    const MIB: u64 = 1 << 20;
    /// The pmem region: 4 MiB at 64 MiB, above 16 MiB of RAM.
    const PMEM: (u64, u64) = (64 * MIB, 4 * MIB);
    const RING: u64 = MIB;
    const REQUEST: u64 = 2 * MIB;
    const ANSWER: u64 = 2 * MIB + 0x100;

    fn memory() -> Memory {
        let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 32 * MIB)).unwrap();
        let ranges = vec![(GuestAddress(0), 16 * MIB), (GuestAddress(PMEM.0), PMEM.1)];
        let config = MemoryConfig {
            populate: Populate::Eager,
            ..MemoryConfig::new(ranges, 1)
        };
        Arc::new(GuestMemory::new(pool, config).unwrap())
    }

    /// A device activated with the queue of `mock`; returns it and its interrupt's eventfd.
    fn activated(memory: &Memory, mock: &MockSplitQueue<'_, GuestMemory>) -> (PmemDevice, EventFd) {
        let mut device = PmemDevice::new(memory.clone(), PMEM.0, PMEM.1);
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let activation = Activation {
            memory: memory.clone(),
            acked_features: 0,
            queues: vec![ActiveQueue {
                index: 0,
                queue: mock.create_queue().unwrap(),
                notifier: EventFd::new(EFD_NONBLOCK).unwrap(),
            }],
            interrupt: Arc::new(Interrupt::new(irq.try_clone().unwrap())),
        };
        device.activate(activation).unwrap();
        (device, irq)
    }

    /// Puts a chain of `(addr, len, writable)` buffers at descriptor `first` and makes it the
    /// `avail`-th available entry.
    fn add_chain(
        mock: &MockSplitQueue<'_, GuestMemory>,
        first: u16,
        avail: u16,
        buffers: &[(u64, u32, bool)],
    ) {
        for (i, &(addr, len, writable)) in buffers.iter().enumerate() {
            let at = first + i as u16;
            let last = i + 1 == buffers.len();
            let flags = if last { 0 } else { VRING_DESC_F_NEXT }
                | if writable { VRING_DESC_F_WRITE } else { 0 };
            let desc = Descriptor::new(addr, len, flags as u16, at + 1);
            mock.desc_table()
                .store(at, RawDescriptor::from(desc))
                .unwrap();
        }
        mock.avail()
            .ring()
            .ref_at(usize::from(avail))
            .unwrap()
            .store(first);
        mock.avail().idx().store(avail + 1);
    }

    #[test]
    fn config_space_tells_where_the_memory_is() {
        let device = PmemDevice::new(memory(), PMEM.0, PMEM.1);
        let mut config = [0u8; 16];
        device.read_config(0, &mut config);
        assert_eq!(&config[..8], &PMEM.0.to_le_bytes());
        assert_eq!(&config[8..], &PMEM.1.to_le_bytes());
        let mut high = [0xffu8; 4];
        device.read_config(12, &mut high);
        assert_eq!(high, [0; 4]);
        device.read_config(u64::MAX, &mut high);
        assert_eq!(high, [0; 4]);
        assert_eq!(device.device_type(), 27);
    }

    #[test]
    fn a_flush_is_answered_after_the_memory_is_written_back() {
        let memory = memory();
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let (mut device, irq) = activated(&memory, &mock);
        memory
            .write_obj(REQ_TYPE_FLUSH.to_le(), GuestAddress(REQUEST))
            .unwrap();
        memory.write_obj(0xdead_u32, GuestAddress(ANSWER)).unwrap();
        add_chain(&mock, 0, 0, &[(REQUEST, 4, false), (ANSWER, 4, true)]);
        device.process_queue(0);
        assert_eq!(
            memory.read_obj::<u32>(GuestAddress(ANSWER)).unwrap(),
            RESP_OK
        );
        assert_eq!(mock.used().idx().load(), 1);
        assert_eq!(mock.used().ring().ref_at(0).unwrap().load().len(), 4);
        assert_eq!(device.handle().flushes(), 1);
        assert_eq!(irq.read().unwrap(), 1);
    }

    #[test]
    fn hostile_requests_get_no_flush_and_no_panic() {
        let memory = memory();
        let mock = MockSplitQueue::create(&*memory, GuestAddress(RING), 16);
        let (mut device, _irq) = activated(&memory, &mock);
        memory
            .write_obj(7u32.to_le(), GuestAddress(REQUEST))
            .unwrap();
        // An unknown type is answered with an error.
        add_chain(&mock, 0, 0, &[(REQUEST, 4, false), (ANSWER, 4, true)]);
        device.process_queue(0);
        assert_eq!(
            memory.read_obj::<u32>(GuestAddress(ANSWER)).unwrap(),
            RESP_EIO
        );
        // No answer buffer, a short request, buffers outside guest memory: used, unanswered.
        add_chain(&mock, 2, 1, &[(REQUEST, 4, false)]);
        add_chain(&mock, 3, 2, &[(REQUEST, 2, false), (ANSWER, 4, true)]);
        add_chain(&mock, 5, 3, &[(1 << 40, 4, false), (ANSWER, 4, true)]);
        add_chain(&mock, 7, 4, &[(REQUEST, 4, false), (1 << 40, 4, true)]);
        device.process_queue(0);
        assert_eq!(mock.used().idx().load(), 5);
        for slot in 1..5 {
            assert_eq!(mock.used().ring().ref_at(slot).unwrap().load().len(), 0);
        }
        assert_eq!(device.handle().flushes(), 0);
        assert!(device.warnings.count() >= 5);
        // Notifications for other queues, and after a reset, are ignored.
        device.process_queue(3);
        device.reset();
        device.process_queue(0);
    }
}
