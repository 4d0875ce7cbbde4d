//! [`RequestQueue`]: the one queue of a device that answers the driver's requests (virtio-blk,
//! virtio-pmem): taken from the activation, drained chain by chain (each answered at once, left
//! in flight to be answered later, or left in the queue), its interrupt raised once per batch;
//! and [`read_config`], a config space read that stays inside the config.

use std::sync::Arc;

use guest_mem::GuestMemory;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueState, QueueT};
use vm_memory::GuestAddress;

use super::{ActivateError, Activation, Interrupt};

/// A device's request queue (index 0) and its interrupt, between activation and reset.
#[derive(Debug)]
pub struct RequestQueue {
    queue: Queue,
    interrupt: Arc<Interrupt>,
}

/// What a device did with one request chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// Answered, with this many bytes written into its buffers: it goes in the used ring now.
    Answered(u32),
    /// Taken and in flight (an asynchronous engine's): [`RequestQueue::complete`] answers it.
    InFlight,
    /// Left in the queue (a rate limiter or a full engine said to wait); draining stops.
    Deferred,
}

/// The used ring could not be written, or the available ring read: the driver put them
/// outside guest memory.
#[derive(Debug, thiserror::Error)]
#[error("the used or available ring is not in guest memory")]
pub struct UsedRingError;

impl RequestQueue {
    /// Takes queue 0 of `activation`, which the device needs.
    pub fn take<M>(activation: Activation<M>) -> Result<Self, ActivateError> {
        let queue = activation
            .queues
            .into_iter()
            .find(|q| q.index == 0)
            .ok_or(ActivateError::MissingQueue(0))?;
        Ok(RequestQueue {
            queue: queue.queue,
            interrupt: activation.interrupt,
        })
    }

    /// Tells the driver that the device's configuration changed.
    pub fn signal_config_change(&self) -> std::io::Result<()> {
        self.interrupt.signal_config_change()
    }

    /// The queue's position, for a snapshot.
    pub fn state(&self) -> QueueState {
        self.queue.state()
    }

    /// Answers every chain the driver made available with `answer` (which returns the bytes it
    /// wrote into the chain's buffers), puts each in the used ring, and raises the interrupt
    /// once if any was used; `device` names the device in the log. Stops at a used ring outside
    /// guest memory.
    pub fn drain(
        &mut self,
        mem: &GuestMemory,
        device: &str,
        mut answer: impl FnMut(DescriptorChain<&GuestMemory>) -> u32,
    ) -> Result<(), UsedRingError> {
        self.drain_until(mem, device, |chain| Served::Answered(answer(chain)))
    }

    /// As [`Self::drain`], but `answer` may leave a chain in flight ([`Served::InFlight`]) or
    /// in the queue ([`Served::Deferred`], e.g. a rate limiter said to wait): then it goes back
    /// to the queue, and draining stops there.
    pub fn drain_until(
        &mut self,
        mem: &GuestMemory,
        device: &str,
        mut answer: impl FnMut(DescriptorChain<&GuestMemory>) -> Served,
    ) -> Result<(), UsedRingError> {
        let mut used = false;
        let result = 'drain: loop {
            // No notifications while the queue drains (with EVENT_IDX the driver is told where
            // to notify next once it is empty).
            if self.queue.disable_notification(mem).is_err() {
                break Err(UsedRingError);
            }
            while let Some(chain) = self.queue.pop_descriptor_chain(mem) {
                let head = chain.head_index();
                match answer(chain) {
                    Served::Answered(written) => {
                        if self.queue.add_used(mem, head, written).is_err() {
                            break 'drain Err(UsedRingError);
                        }
                        used = true;
                    }
                    Served::InFlight => {}
                    Served::Deferred => {
                        self.queue.go_to_previous_position();
                        // Whatever wakes the device later, the driver's next chain notifies.
                        break 'drain self
                            .queue
                            .enable_notification(mem)
                            .map(drop)
                            .map_err(|_| UsedRingError);
                    }
                }
            }
            // A chain made available between the last pop and here is drained, not missed.
            match self.queue.enable_notification(mem) {
                Ok(true) => continue,
                Ok(false) => break Ok(()),
                Err(_) => break Err(UsedRingError),
            }
        };
        if used {
            self.signal_used(mem, device);
        }
        result
    }

    /// Answers the chain at `head`, which was left in flight, with `written` bytes written into
    /// its buffers; the interrupt waits for [`Self::signal_used`].
    pub fn complete(
        &mut self,
        mem: &GuestMemory,
        head: u16,
        written: u32,
    ) -> Result<(), UsedRingError> {
        self.queue
            .add_used(mem, head, written)
            .map_err(|_| UsedRingError)
    }

    /// Raises the used-buffer interrupt if the driver wants it (always, unless EVENT_IDX was
    /// negotiated and the driver's used event says it does not wait yet); `device` names the
    /// device in the log.
    pub fn signal_used(&mut self, mem: &GuestMemory, device: &str) {
        // A used event outside guest memory: signal, as without EVENT_IDX.
        if matches!(self.queue.needs_notification(mem), Ok(false)) {
            return;
        }
        if self.interrupt.signal_used_queue().is_err() {
            log::error!("{device}: cannot raise the used-buffer interrupt");
        }
    }
}

/// The first readable descriptor of `chain` of at least `request` bytes and the first writable
/// one of at least `answer` bytes (virtio-pmem's and virtio-mem's requests): their addresses, or
/// `None` if one is missing.
pub fn request_and_answer<M: vm_memory::GuestMemoryBackend>(
    chain: DescriptorChain<&M>,
    request: u32,
    answer: u32,
) -> Option<(GuestAddress, GuestAddress)> {
    let (mut request_at, mut answer_at) = (None, None);
    for desc in chain {
        if desc.is_write_only() {
            if answer_at.is_none() && desc.len() >= answer {
                answer_at = Some(desc.addr());
            }
        } else if request_at.is_none() && desc.len() >= request {
            request_at = Some(desc.addr());
        }
    }
    request_at.zip(answer_at)
}

/// Reads `data.len()` bytes of `config` at `offset`; bytes past its end read as 0.
pub fn read_config(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, byte) in data.iter_mut().enumerate() {
        *byte = usize::try_from(offset)
            .ok()
            .and_then(|offset| offset.checked_add(i))
            .and_then(|at| config.get(at))
            .copied()
            .unwrap_or(0);
    }
}

/// Building a request queue's chains in tests.
#[cfg(test)]
pub mod testing {
    use std::sync::Arc;

    use guest_mem::{Backing, GuestMemory, MemoryConfig, Pool, PoolConfig, Populate};
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestAddress;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    use crate::virtio::{Activation, ActiveQueue, Interrupt};

    /// `ram` bytes of guest RAM at address 0 on a pool of their own, populated up front.
    pub fn memory(ram: u64) -> Arc<GuestMemory> {
        let pool = Pool::new(PoolConfig::new(Backing::Anonymous, ram)).unwrap();
        let config = MemoryConfig {
            populate: Populate::Eager,
            ..MemoryConfig::new(vec![(GuestAddress(0), ram)], 1)
        };
        Arc::new(GuestMemory::new(pool, config).unwrap())
    }

    /// Waits (at most a second) until `fd`, a device's wake source, is readable.
    pub fn wait_readable(fd: std::os::fd::RawFd) {
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for at most a second.
        assert_eq!(unsafe { libc::poll(&mut poll, 1, 1000) }, 1, "not readable");
    }

    /// The length the device put in used ring entry `slot` of `mock`.
    pub fn used_len(mock: &MockSplitQueue<'_, GuestMemory>, slot: u16) -> u32 {
        mock.used()
            .ring()
            .ref_at(usize::from(slot))
            .unwrap()
            .load()
            .len()
    }

    /// An activation with the queue of `mock` as queue 0, and its interrupt's eventfd.
    pub fn activation(
        memory: &Arc<GuestMemory>,
        mock: &MockSplitQueue<'_, GuestMemory>,
    ) -> (Activation<Arc<GuestMemory>>, EventFd) {
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
        (activation, irq)
    }

    /// Puts a chain of `(addr, len, writable)` buffers at descriptor `first` and makes it the
    /// `avail`-th available entry.
    pub fn add_chain(
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
}
