//! Event loop tests with a real epoll, real pipes and real event fds.

use std::io::Write;

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::EFD_NONBLOCK;

use super::*;
use crate::bus::BusDevice;
use crate::serial::SharedBuffer;
use crate::virtio::mmio::registers as reg;
use crate::virtio::mmio::tests::Fixture;

type Manager = EventManager<Box<dyn MutEventSubscriber + Send>>;

fn serial() -> Arc<SerialDevice> {
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    Arc::new(SerialDevice::new(irq, Box::new(SharedBuffer::new())).unwrap())
}

fn drain(serial: &SerialDevice) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let mut lsr = [0];
        serial.read(0x3f8, 5, &mut lsr);
        if lsr[0] & 1 == 0 {
            return out;
        }
        let mut byte = [0];
        serial.read(0x3f8, 0, &mut byte);
        out.push(byte[0]);
    }
}

#[test]
fn console_input_reaches_the_guest_across_fifo_refills() {
    let serial = serial();
    let (reader, mut writer) = std::io::pipe().unwrap();
    let mut manager = Manager::new().unwrap();
    manager.add_subscriber(Box::new(SerialInput::new(serial.clone(), reader)));

    let input: Vec<u8> = (0..150u8).collect();
    writer.write_all(&input).unwrap();
    drop(writer);
    let mut received = Vec::new();
    for _ in 0..20 {
        manager.run_with_timeout(100).unwrap();
        received.extend(drain(&serial));
        if received.len() == input.len() {
            break;
        }
    }
    assert_eq!(received, input);
    // End of input: after the last wakeups are consumed, the loop goes quiet (no spinning).
    let quiet = (0..5).any(|_| manager.run_with_timeout(50).unwrap() == 0);
    assert!(quiet);
}

#[test]
fn an_unwatchable_input_is_ignored() {
    let serial = serial();
    let null = std::fs::File::open("/dev/null").unwrap();
    let mut manager = Manager::new().unwrap();
    manager.add_subscriber(Box::new(SerialInput::new(serial.clone(), null)));
    assert_eq!(manager.run_with_timeout(10).unwrap(), 0);
    assert!(drain(&serial).is_empty());
}

#[test]
fn queue_notifications_reach_the_device() {
    let fixture = Fixture::new();
    fixture.activate_queue(1, 16, 0x1_0000);
    let device = fixture.transport.device().clone();
    let subscriber =
        QueueSubscriber::new(device.clone(), fixture.transport.queue_notifiers()).unwrap();
    let mut manager = Manager::new().unwrap();
    manager.add_subscriber(Box::new(subscriber));

    // What KVM does for an ioeventfd, and what a trapped QueueNotify write does.
    fixture.transport.queue_notifiers()[1].write(1).unwrap();
    manager.run_with_timeout(100).unwrap();
    fixture.write(reg::QUEUE_NOTIFY, 1);
    manager.run_with_timeout(100).unwrap();
    assert_eq!(device.lock().unwrap().processed, vec![1, 1]);
}
