//! Event-manager subscribers that connect devices to file descriptors: console input to the
//! UART, and queue notifications (KVM ioeventfds) to virtio devices.

use std::io::Read;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use log::warn;
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::EventFd;

use super::serial::SerialDevice;
use super::virtio::VirtioDevice;

/// An event-loop subscriber owned by the loop (device queues, timers, console input).
pub type Subscriber = Box<dyn MutEventSubscriber + Send>;

/// Data tag of the input source's events.
const INPUT: u32 = 0;
/// Data tag of the UART's "receive FIFO drained" events.
const RX_READY: u32 = 1;

/// Feeds bytes from an input (e.g. stdin) into the UART as the guest drains its FIFO.
///
/// When the FIFO is full the input is dropped from the epoll set (so a level-triggered input
/// does not spin) and added back once the guest has read the FIFO empty. On end of input or
/// an error, the input is removed for good. An input epoll cannot watch (a regular file,
/// `/dev/null`) is reported once and ignored.
#[derive(Debug)]
pub struct SerialInput<R: Read + AsRawFd> {
    serial: Arc<SerialDevice>,
    input: R,
    input_active: bool,
    input_closed: bool,
}

impl<R: Read + AsRawFd> SerialInput<R> {
    /// Connects `input` to `serial`.
    pub fn new(serial: Arc<SerialDevice>, input: R) -> Self {
        SerialInput {
            serial,
            input,
            input_active: false,
            input_closed: false,
        }
    }

    fn watch_input(&mut self, ops: &mut EventOps) {
        if self.input_active || self.input_closed {
            return;
        }
        let events = Events::with_data(&self.input, INPUT, EventSet::IN);
        match ops.add(events) {
            Ok(()) => self.input_active = true,
            Err(e) => {
                // E.g. /dev/null or a regular file on stdin (EPERM): there is no input then.
                log::debug!(
                    "serial input: cannot watch fd {}: {e}; the guest gets no console input",
                    self.input.as_raw_fd()
                );
                self.input_closed = true;
            }
        }
    }

    fn unwatch_input(&mut self, ops: &mut EventOps) {
        if self.input_active {
            let events = Events::with_data(&self.input, INPUT, EventSet::IN);
            if let Err(e) = ops.remove(events) {
                warn!("serial input: cannot unwatch: {e}");
            }
            self.input_active = false;
        }
    }

    fn forward_input(&mut self, ops: &mut EventOps) {
        let room = self.serial.fifo_capacity();
        if room == 0 {
            self.unwatch_input(ops);
            return;
        }
        let mut buffer = [0u8; 64];
        let len = room.min(buffer.len());
        match self.input.read(&mut buffer[..len]) {
            Ok(0) => {
                self.unwatch_input(ops);
                self.input_closed = true;
            }
            Ok(count) => {
                if let Err(e) = self.serial.enqueue_input(&buffer[..count]) {
                    warn!("serial input: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                warn!("serial input: read failed, closing: {e}");
                self.unwatch_input(ops);
                self.input_closed = true;
            }
        }
    }
}

impl<R: Read + AsRawFd> MutEventSubscriber for SerialInput<R> {
    fn init(&mut self, ops: &mut EventOps) {
        let rx_ready = Events::with_data(self.serial.rx_ready_evt(), RX_READY, EventSet::IN);
        if let Err(e) = ops.add(rx_ready) {
            warn!("serial input: cannot watch the rx-ready event: {e}");
        }
        self.watch_input(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            RX_READY => {
                let _ = self.serial.rx_ready_evt().read();
                self.watch_input(ops);
            }
            _ if events.event_set().contains(EventSet::IN) => self.forward_input(ops),
            _ => {
                // HUP or ERR without data: the input is gone.
                self.unwatch_input(ops);
                self.input_closed = true;
            }
        }
    }
}

/// Calls [`VirtioDevice::process_queue`] when a queue's notifier fires.
#[derive(Debug)]
pub struct QueueSubscriber<M, D> {
    device: Arc<Mutex<D>>,
    notifiers: Vec<EventFd>,
    _memory: PhantomData<fn() -> M>,
}

impl<M: GuestAddressSpace, D: VirtioDevice<M>> QueueSubscriber<M, D> {
    /// Watches `notifiers` (the transport's, one per queue, in index order) for `device`.
    pub fn new(device: Arc<Mutex<D>>, notifiers: &[EventFd]) -> std::io::Result<Self> {
        let notifiers = notifiers
            .iter()
            .map(EventFd::try_clone)
            .collect::<std::io::Result<_>>()?;
        Ok(QueueSubscriber {
            device,
            notifiers,
            _memory: PhantomData,
        })
    }
}

/// Data tag of a device's first [`VirtioDevice::wake_sources`] (queue tags are a u16); the
/// others follow it.
const FIRST_WAKE: u32 = 1 << 16;

impl<M: GuestAddressSpace, D: VirtioDevice<M>> MutEventSubscriber for QueueSubscriber<M, D> {
    fn init(&mut self, ops: &mut EventOps) {
        // At most a u16 of queues: see `QueueSubscriber::new`.
        for (index, notifier) in (0u16..).zip(&self.notifiers) {
            if let Err(e) = ops.add(Events::with_data(notifier, index.into(), EventSet::IN)) {
                warn!("virtio: cannot watch queue {index}: {e}");
            }
        }
        let sources = self.lock().wake_sources();
        for (tag, source) in (FIRST_WAKE..).zip(sources) {
            let mut set = EventSet::IN;
            if source.edge_triggered {
                set |= EventSet::EDGE_TRIGGERED;
            }
            if let Err(e) = ops.add(Events::with_data_raw(source.fd, tag, set)) {
                warn!("virtio: cannot watch a device's file descriptor: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let index = events.data();
        if let Some(source) = index.checked_sub(FIRST_WAKE) {
            self.lock().wake(source as usize);
            return;
        }
        let Some((queue, notifier)) = u16::try_from(index)
            .ok()
            .and_then(|queue| Some((queue, self.notifiers.get(usize::from(queue))?)))
        else {
            warn!("virtio: event for unknown queue {index}");
            return;
        };
        // The counter value does not matter; an empty read is a spurious wakeup.
        if notifier.read().is_ok() {
            self.lock().process_queue(queue);
        }
    }
}

impl<M, D> QueueSubscriber<M, D> {
    fn lock(&self) -> std::sync::MutexGuard<'_, D> {
        self.device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
