use super::*;
use std::sync::atomic::AtomicU64;

fn device() -> I8042Device {
    I8042Device::new(EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK).unwrap())
}

fn read(device: &I8042Device, port: u64) -> u8 {
    let mut byte = [0];
    device.read(I8042_PORT_BASE, port - I8042_PORT_BASE, &mut byte);
    byte[0]
}

fn write(device: &I8042Device, port: u64, byte: u8) {
    device.write(I8042_PORT_BASE, port - I8042_PORT_BASE, &[byte]);
}

/// Reads the data port while the status says there is output.
fn drain(device: &I8042Device) -> Vec<u8> {
    let mut bytes = Vec::new();
    while read(device, 0x64) & STATUS_OUTPUT_FULL != 0 {
        bytes.push(read(device, 0x60));
    }
    bytes
}

#[test]
fn linux_probe_sequence_gets_the_answers_of_a_real_controller() {
    let device = device();
    assert_eq!(read(&device, 0x64) & STATUS_OUTPUT_FULL, 0);
    write(&device, 0x64, CMD_SELF_TEST);
    assert_eq!(drain(&device), [SELF_TEST_PASSED]);
    write(&device, 0x64, CMD_READ_CTR);
    let ctr = drain(&device)[0];
    assert_eq!(ctr & CTR_KBD_INTERRUPT, CTR_KBD_INTERRUPT);
    write(&device, 0x64, CMD_WRITE_CTR);
    write(&device, 0x60, ctr & !CTR_KBD_INTERRUPT);
    write(&device, 0x64, CMD_READ_CTR);
    assert_eq!(drain(&device), [ctr & !CTR_KBD_INTERRUPT]);
    write(&device, 0x64, CMD_TEST_KBD);
    assert_eq!(drain(&device), [PORT_TEST_PASSED]);
    // atkbd: identify, reset, pick scan code set 2, typematic rate, enable.
    write(&device, 0x60, KBD_GET_ID);
    assert_eq!(drain(&device), [KBD_ACK, 0xab, 0x83]);
    write(&device, 0x60, KBD_RESET);
    assert_eq!(drain(&device), [KBD_ACK, KBD_SELF_TEST_PASSED]);
    write(&device, 0x60, KBD_SCANCODE_SET);
    write(&device, 0x60, 0);
    assert_eq!(drain(&device), [KBD_ACK, KBD_ACK, KBD_SCANCODE_SET_2]);
    write(&device, 0x60, KBD_SET_TYPEMATIC);
    write(&device, 0x60, 0x20);
    write(&device, 0x60, 0xf4);
    assert_eq!(drain(&device), [KBD_ACK, KBD_ACK, KBD_ACK]);
    // No mouse: the aux port fails its test, bytes for it get no answer.
    write(&device, 0x64, CMD_TEST_AUX);
    assert_ne!(drain(&device), [PORT_TEST_PASSED]);
    write(&device, 0x64, CMD_WRITE_AUX);
    write(&device, 0x60, 0xff);
    assert!(drain(&device).is_empty());
}

#[test]
fn ctrl_alt_del_arrives_as_key_presses_with_interrupts() {
    let device = device();
    assert!(device.send_ctrl_alt_del());
    assert_eq!(device.irq_evt().read().unwrap(), 1);
    assert_eq!(read(&device, 0x60), 0x14);
    // Each further byte raises the interrupt again.
    assert_eq!(device.irq_evt().read().unwrap(), 1);
    let rest = drain(&device);
    assert_eq!(
        rest,
        [0x11, 0xe0, 0x71, 0xe0, 0xf0, 0x71, 0xf0, 0x11, 0xf0, 0x14]
    );
    // Empty: the data port repeats the last byte.
    assert_eq!(read(&device, 0x60), 0x14);
    // A disabled keyboard gets nothing.
    write(&device, 0x64, CMD_DISABLE_KBD);
    assert!(!device.send_ctrl_alt_del());
}

#[test]
fn keys_whose_interrupt_the_guest_never_took_raise_it_again() {
    let device = device();
    let seen = device.raise_stalled_interrupt(u64::MAX);
    assert!(device.send_ctrl_alt_del());
    // The edge is "lost": the guest never comes.
    let _ = device.irq_evt().read();
    let seen = device.raise_stalled_interrupt(seen);
    assert_eq!(device.irq_evt().read().unwrap(), 1, "raised again");
    // Once the guest reads everything, nothing more is raised.
    drain(&device);
    let _ = device.irq_evt().read();
    let seen = device.raise_stalled_interrupt(seen);
    device.raise_stalled_interrupt(seen);
    assert!(device.irq_evt().read().is_err());
}

#[test]
fn a_guest_that_never_reads_cannot_grow_the_queue() {
    let device = device();
    for _ in 0..10_000 {
        write(&device, 0x60, KBD_GET_ID);
        write(&device, 0x64, 0x77); // unknown: warned about, rate-limited
    }
    assert_eq!(drain(&device).len(), OUTPUT_CAPACITY);
    assert!(!device.send_ctrl_alt_del() || drain(&device).len() == CTRL_ALT_DEL.len());
    // Wide accesses are ignored.
    device.write(I8042_PORT_BASE, 4, &[0xfe, 0xfe]);
}

/// The VM's side of the reset line, counting resets.
#[derive(Debug, Default)]
struct Resets(AtomicU64);

impl crate::ResetLine for Resets {
    fn reset(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn the_reset_command_pulls_the_reset_line() {
    let device = device();
    let resets = Arc::new(Resets::default());
    device.connect_reset(resets.clone());
    write(&device, 0x64, CMD_RESET_CPU);
    assert_eq!(resets.0.load(Ordering::Relaxed), 1);
}

#[test]
fn a_restored_controller_answers_as_the_saved_one_would() {
    let saved = device();
    write(&saved, 0x64, CMD_WRITE_CTR);
    write(&saved, 0x60, CTR_SYSTEM);
    write(&saved, 0x60, KBD_GET_ID);
    let state = saved.save_state();

    let restored = device();
    restored.restore_state(&state).unwrap();
    assert_eq!(restored.save_state(), state);
    assert_eq!(drain(&restored), [KBD_ACK, 0xab, 0x83]);
    write(&restored, 0x64, CMD_READ_CTR);
    assert_eq!(drain(&restored), [CTR_SYSTEM]);

    let mut flooded = state.clone();
    flooded.0.output = std::iter::repeat_n(0, OUTPUT_CAPACITY + 1).collect();
    assert!(restored.restore_state(&flooded).is_err());
    assert_eq!(drain(&restored), Vec::<u8>::new(), "unchanged");
}
