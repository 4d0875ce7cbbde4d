//! The i8042 PS/2 controller at ports 0x60 (data) and 0x64 (status and command), with a
//! keyboard behind it, as much of it as Linux's i8042 and atkbd drivers use: the controller's
//! self-tests and command byte, the keyboard's identification and settings, its interrupt
//! (IRQ 1), the CPU reset command (0xFE, what `reboot=k` uses) and Ctrl-Alt-Del, which the VMM
//! sends as key presses (what a guest's init turns into a reboot). There is no mouse: commands
//! for the auxiliary port get no answer, and the driver finds none.
//!
//! Every byte comes from the guest and is treated as hostile: unknown commands are ignored
//! (and warned about, rate-limited), and the output queue is bounded.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;
use super::GuestWarnings;
use super::ResetLine;
use crate::metrics::I8042;

/// First port of the controller (the data port).
pub const I8042_PORT_BASE: u64 = 0x60;
/// Ports from the base: 0x60 to 0x64.
pub const I8042_PORT_SIZE: u64 = 0x5;
/// The keyboard's interrupt.
pub const I8042_IRQ: u32 = 1;

const DATA_OFFSET: u64 = 0;
const COMMAND_OFFSET: u64 = 4;

// Status register bits.
const STATUS_OUTPUT_FULL: u8 = 1 << 0;
const STATUS_SYSTEM: u8 = 1 << 2;
const STATUS_LAST_WAS_COMMAND: u8 = 1 << 3;
const STATUS_UNLOCKED: u8 = 1 << 4;

// Command byte bits.
const CTR_KBD_INTERRUPT: u8 = 1 << 0;
const CTR_SYSTEM: u8 = 1 << 2;
const CTR_KBD_DISABLED: u8 = 1 << 4;

// Controller commands (port 0x64).
const CMD_READ_CTR: u8 = 0x20;
const CMD_WRITE_CTR: u8 = 0x60;
const CMD_DISABLE_AUX: u8 = 0xa7;
const CMD_ENABLE_AUX: u8 = 0xa8;
const CMD_TEST_AUX: u8 = 0xa9;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_TEST_KBD: u8 = 0xab;
const CMD_DISABLE_KBD: u8 = 0xad;
const CMD_ENABLE_KBD: u8 = 0xae;
const CMD_READ_OUTPUT_PORT: u8 = 0xd0;
const CMD_WRITE_OUTPUT_PORT: u8 = 0xd1;
const CMD_WRITE_KBD_OUTPUT: u8 = 0xd2;
const CMD_WRITE_AUX_OUTPUT: u8 = 0xd3;
const CMD_WRITE_AUX: u8 = 0xd4;
const CMD_RESET_CPU: u8 = 0xfe;

const SELF_TEST_PASSED: u8 = 0x55;
const PORT_TEST_PASSED: u8 = 0x00;
/// Output port: A20 enabled, system not in reset.
const OUTPUT_PORT: u8 = 0x03;

// Keyboard commands (port 0x60) and answers.
const KBD_SET_LEDS: u8 = 0xed;
const KBD_ECHO: u8 = 0xee;
const KBD_SCANCODE_SET: u8 = 0xf0;
const KBD_GET_ID: u8 = 0xf2;
const KBD_SET_TYPEMATIC: u8 = 0xf3;
const KBD_RESET: u8 = 0xff;
const KBD_ACK: u8 = 0xfa;
const KBD_SELF_TEST_PASSED: u8 = 0xaa;
const KBD_ID: [u8; 2] = [0xab, 0x83];
const KBD_SCANCODE_SET_2: u8 = 0x02;

/// Ctrl, Alt and Delete pressed and released, in scan code set 2 (no translation: Linux keeps
/// the controller's command byte, which does not ask for it).
const CTRL_ALT_DEL: [u8; 11] = [
    0x14, 0x11, 0xe0, 0x71, // make: Ctrl, Alt, Delete
    0xe0, 0xf0, 0x71, 0xf0, 0x11, 0xf0, 0x14, // break: Delete, Alt, Ctrl
];

/// Bytes the output queue holds at most: a guest that never reads cannot grow it.
const OUTPUT_CAPACITY: usize = 64;

/// What the next byte written to the data port is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum DataTarget {
    /// A keyboard command.
    Keyboard,
    /// The command byte (after 0x60).
    CommandByte,
    /// The output port (after 0xd1).
    OutputPort,
    /// A byte to echo as keyboard output (after 0xd2).
    KeyboardOutput,
    /// A byte for the mouse (after 0xd3, 0xd4): there is none.
    Aux,
    /// The argument of a keyboard command that takes one.
    KeyboardArgument(u8),
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct ControllerState {
    command_byte: u8,
    output: VecDeque<u8>,
    /// The last byte read from the data port, read again when the queue is empty.
    last_output: u8,
    status_last_was_command: bool,
    target: DataTarget,
}

/// The controller's and keyboard's state, for snapshots.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct I8042Snapshot(ControllerState);

/// A saved state that cannot be restored.
#[derive(Debug, thiserror::Error)]
#[error("cannot restore the i8042: {0} bytes of output, it holds {OUTPUT_CAPACITY}")]
pub struct I8042StateError(usize);

/// The controller and its keyboard.
#[derive(Debug)]
pub struct I8042Device {
    state: Mutex<ControllerState>,
    irq: EventFd,
    reset: OnceLock<Arc<dyn ResetLine>>,
    /// The guest's accesses so far (see [`Self::raise_stalled_interrupt`]).
    accesses: AtomicU64,
    warnings: GuestWarnings,
}

impl I8042Device {
    /// A controller raising `irq` (register it as the irqfd of [`I8042_IRQ`]).
    pub fn new(irq: EventFd) -> Self {
        I8042Device {
            state: Mutex::new(ControllerState {
                command_byte: CTR_KBD_INTERRUPT | CTR_SYSTEM,
                output: VecDeque::with_capacity(OUTPUT_CAPACITY),
                last_output: 0,
                status_last_was_command: false,
                target: DataTarget::Keyboard,
            }),
            irq,
            reset: OnceLock::new(),
            accesses: AtomicU64::new(0),
            warnings: GuestWarnings::default(),
        }
    }

    /// Raises IRQ 1 again when output waits and the guest has not touched the controller since
    /// `seen` (what the previous call returned): keys whose interrupt got lost on its way into
    /// the guest (seen under nested virtualisation) would otherwise wait for good. Returns the
    /// accesses so far, for the next call; called a few times a second.
    pub fn raise_stalled_interrupt(&self, seen: u64) -> u64 {
        let accesses = self.accesses.load(Ordering::Acquire);
        if accesses == seen {
            let state = self.lock();
            if !state.output.is_empty() && state.command_byte & CTR_KBD_INTERRUPT != 0 {
                log::debug!("i8042: the guest has not read its pending output: IRQ 1 again");
                self.interrupt(&state);
            }
        }
        accesses
    }

    /// The state, for a snapshot.
    pub fn save_state(&self) -> I8042Snapshot {
        I8042Snapshot(self.lock().clone())
    }

    /// Restores a saved state.
    pub fn restore_state(&self, snapshot: &I8042Snapshot) -> Result<(), I8042StateError> {
        let output = snapshot.0.output.len();
        if output > OUTPUT_CAPACITY {
            return Err(I8042StateError(output));
        }
        *self.lock() = snapshot.0.clone();
        Ok(())
    }

    /// The interrupt event fd.
    pub fn irq_evt(&self) -> &EventFd {
        &self.irq
    }

    /// Connects the device to the VM that the reset command resets (stops).
    pub fn connect_reset(&self, line: Arc<dyn ResetLine>) {
        // Set once, before the vCPUs run; a second call keeps the first VM.
        let _ = self.reset.set(line);
    }

    /// Presses and releases Ctrl-Alt-Del on the keyboard. Returns `false` when the keyboard
    /// is disabled or the guest has not read what is queued (nothing was sent).
    pub fn send_ctrl_alt_del(&self) -> bool {
        let mut state = self.lock();
        if state.command_byte & CTR_KBD_DISABLED != 0
            || state.output.len() + CTRL_ALT_DEL.len() > OUTPUT_CAPACITY
        {
            return false;
        }
        state.output.extend(CTRL_ALT_DEL);
        self.interrupt(&state);
        true
    }

    fn lock(&self) -> MutexGuard<'_, ControllerState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Raises IRQ 1 if there is output and the guest enabled the keyboard interrupt.
    fn interrupt(&self, state: &ControllerState) {
        if !state.output.is_empty() && state.command_byte & CTR_KBD_INTERRUPT != 0 {
            if let Err(e) = self.irq.write(1) {
                log::error!("i8042: cannot raise IRQ {I8042_IRQ}: {e}");
            }
        }
    }

    fn status(state: &ControllerState) -> u8 {
        let mut status = STATUS_SYSTEM | STATUS_UNLOCKED;
        if !state.output.is_empty() {
            status |= STATUS_OUTPUT_FULL;
        }
        if state.status_last_was_command {
            status |= STATUS_LAST_WAS_COMMAND;
        }
        status
    }

    fn read_data(&self, state: &mut ControllerState) -> u8 {
        if let Some(byte) = state.output.pop_front() {
            state.last_output = byte;
        }
        // The next byte, if any, gets its own interrupt.
        self.interrupt(state);
        state.last_output
    }

    fn push(state: &mut ControllerState, bytes: &[u8]) {
        for &byte in bytes {
            if state.output.len() < OUTPUT_CAPACITY {
                state.output.push_back(byte);
            }
        }
    }

    fn command(&self, state: &mut ControllerState, command: u8) {
        state.status_last_was_command = true;
        match command {
            CMD_READ_CTR => Self::push(state, &[state.command_byte]),
            CMD_WRITE_CTR => state.target = DataTarget::CommandByte,
            CMD_DISABLE_AUX | CMD_ENABLE_AUX => {}
            // No mouse: its port "fails" the test (clock line stuck low).
            CMD_TEST_AUX => Self::push(state, &[0x01]),
            CMD_SELF_TEST => Self::push(state, &[SELF_TEST_PASSED]),
            CMD_TEST_KBD => Self::push(state, &[PORT_TEST_PASSED]),
            CMD_DISABLE_KBD => state.command_byte |= CTR_KBD_DISABLED,
            CMD_ENABLE_KBD => state.command_byte &= !CTR_KBD_DISABLED,
            CMD_READ_OUTPUT_PORT => Self::push(state, &[OUTPUT_PORT]),
            CMD_WRITE_OUTPUT_PORT => state.target = DataTarget::OutputPort,
            CMD_WRITE_KBD_OUTPUT => state.target = DataTarget::KeyboardOutput,
            CMD_WRITE_AUX_OUTPUT | CMD_WRITE_AUX => state.target = DataTarget::Aux,
            CMD_RESET_CPU => {
                I8042.reset_count.inc();
                if let Some(line) = self.reset.get() {
                    line.reset();
                }
            }
            // Pulses of the output port lines, password and other vendor commands: nothing.
            0xf0..=0xff | 0xa4..=0xa6 | 0xc0..=0xcb | 0xe0 => {}
            other => {
                self.warnings.warn(format_args!(
                    "i8042: unknown controller command {other:#04x}"
                ));
            }
        }
        self.interrupt(state);
    }

    fn data(&self, state: &mut ControllerState, byte: u8) {
        state.status_last_was_command = false;
        match std::mem::replace(&mut state.target, DataTarget::Keyboard) {
            DataTarget::CommandByte => state.command_byte = byte,
            DataTarget::OutputPort => {
                // Bit 0 low holds the CPU in reset: the way some guests reboot.
                if byte & 1 == 0 {
                    I8042.reset_count.inc();
                    if let Some(line) = self.reset.get() {
                        line.reset();
                    }
                }
            }
            DataTarget::KeyboardOutput => Self::push(state, &[byte]),
            DataTarget::Aux => {}
            DataTarget::KeyboardArgument(KBD_SCANCODE_SET) if byte == 0 => {
                Self::push(state, &[KBD_ACK, KBD_SCANCODE_SET_2]);
            }
            DataTarget::KeyboardArgument(_) => Self::push(state, &[KBD_ACK]),
            DataTarget::Keyboard => self.keyboard_command(state, byte),
        }
        self.interrupt(state);
    }

    fn keyboard_command(&self, state: &mut ControllerState, command: u8) {
        match command {
            KBD_SET_LEDS | KBD_SCANCODE_SET | KBD_SET_TYPEMATIC => {
                state.target = DataTarget::KeyboardArgument(command);
                Self::push(state, &[KBD_ACK]);
            }
            KBD_ECHO => Self::push(state, &[KBD_ECHO]),
            KBD_GET_ID => {
                Self::push(state, &[KBD_ACK]);
                Self::push(state, &KBD_ID);
            }
            KBD_RESET => {
                state.output.clear();
                Self::push(state, &[KBD_ACK, KBD_SELF_TEST_PASSED]);
            }
            // Enable, disable, set defaults, resend and the other settings: acknowledged.
            _ => Self::push(state, &[KBD_ACK]),
        }
    }
}

impl BusDevice for I8042Device {
    fn read(&self, _base: u64, offset: u64, data: &mut [u8]) {
        I8042.read_count.inc();
        self.accesses.fetch_add(1, Ordering::Release);
        let mut state = self.lock();
        let value = match offset {
            DATA_OFFSET => self.read_data(&mut state),
            COMMAND_OFFSET => Self::status(&state),
            _ => 0xff,
        };
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    fn write(&self, _base: u64, offset: u64, data: &[u8]) {
        let [byte] = data else {
            I8042.missed_write_count.inc();
            self.warnings.warn(format_args!(
                "i8042: {}-byte write at port {:#x} ignored",
                data.len(),
                I8042_PORT_BASE + offset
            ));
            return;
        };
        I8042.write_count.inc();
        self.accesses.fetch_add(1, Ordering::Release);
        let mut state = self.lock();
        match offset {
            DATA_OFFSET => self.data(&mut state, *byte),
            COMMAND_OFFSET => self.command(&mut state, *byte),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
