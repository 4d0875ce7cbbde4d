//! The 16550A UART at COM1 (0x3f8, IRQ 4), built on vm-superio.
//!
//! Output goes to any writer (stdout, a file, or a [`SharedBuffer`] that tests read back).
//! Input is queued with [`SerialDevice::enqueue_input`]; when the guest drains the receive FIFO
//! the device signals [`SerialDevice::rx_ready_evt`] so the event loop can feed it more.
//! Interrupts are raised through an event fd, registered as the KVM irqfd of IRQ 4.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use log::warn;
use vm_superio::serial::{SerialEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;
use super::GuestWarnings;
use crate::metrics::UART;

/// Errors of the serial device.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// Cloning or creating an event fd failed.
    #[error("serial event fd: {0}")]
    EventFd(#[source] io::Error),
    /// Queuing input failed (interrupt delivery or a full FIFO).
    #[error("serial input: {0}")]
    Input(String),
    /// A saved state cannot be restored.
    #[error("cannot restore the serial port: {0}")]
    BadState(String),
}

/// The UART's registers and receive FIFO, for snapshots (vm-superio's `SerialState`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SerialSnapshot {
    /// Divisor latch, low and high byte.
    pub baud_divisor: [u8; 2],
    /// Interrupt enable register.
    pub interrupt_enable: u8,
    /// Interrupt identification register.
    pub interrupt_identification: u8,
    /// Line control register.
    pub line_control: u8,
    /// Line status register.
    pub line_status: u8,
    /// Modem control register.
    pub modem_control: u8,
    /// Modem status register.
    pub modem_status: u8,
    /// Scratch register.
    pub scratch: u8,
    /// Bytes the guest has not read yet.
    pub in_buffer: Vec<u8>,
}

impl From<SerialState> for SerialSnapshot {
    fn from(state: SerialState) -> Self {
        SerialSnapshot {
            baud_divisor: [state.baud_divisor_low, state.baud_divisor_high],
            interrupt_enable: state.interrupt_enable,
            interrupt_identification: state.interrupt_identification,
            line_control: state.line_control,
            line_status: state.line_status,
            modem_control: state.modem_control,
            modem_status: state.modem_status,
            scratch: state.scratch,
            in_buffer: state.in_buffer,
        }
    }
}

impl From<&SerialSnapshot> for SerialState {
    fn from(snapshot: &SerialSnapshot) -> Self {
        SerialState {
            baud_divisor_low: snapshot.baud_divisor[0],
            baud_divisor_high: snapshot.baud_divisor[1],
            interrupt_enable: snapshot.interrupt_enable,
            interrupt_identification: snapshot.interrupt_identification,
            line_control: snapshot.line_control,
            line_status: snapshot.line_status,
            modem_control: snapshot.modem_control,
            modem_status: snapshot.modem_status,
            scratch: snapshot.scratch,
            in_buffer: snapshot.in_buffer.clone(),
        }
    }
}

/// Raises the UART interrupt by signalling an event fd.
#[derive(Debug)]
pub struct EventFdTrigger(EventFd);

impl Trigger for EventFdTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Signals an event fd whenever the guest empties the receive FIFO.
#[derive(Debug)]
pub struct RxReadyEvents(EventFd);

impl SerialEvents for RxReadyEvents {
    fn buffer_read(&self) {}
    fn out_byte(&self) {}
    fn tx_lost_byte(&self) {
        warn!("serial: output byte lost");
    }
    fn in_buffer_empty(&self) {
        if let Err(e) = self.0.write(1) {
            warn!("serial: cannot signal rx ready: {e}");
        }
    }
}

/// Bytes in the UART's receive FIFO (vm-superio's).
const FIFO_SIZE: usize = 64;

/// The writer the UART transmits to.
pub type SerialOutput = Box<dyn Write + Send>;

/// A 16550A UART on the port I/O bus.
pub struct SerialDevice {
    uart: Mutex<Serial<EventFdTrigger, RxReadyEvents, SerialOutput>>,
    irq: EventFd,
    rx_ready: EventFd,
    /// The guest's accesses so far (see [`Self::raise_stalled_interrupt`]).
    accesses: AtomicU64,
    /// Invalid accesses by the guest, rate-limited in the log.
    warnings: GuestWarnings,
}

impl std::fmt::Debug for SerialDevice {
    /// The interrupt and the warnings, not the UART (its output is a `dyn Write`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialDevice")
            .field("irq", &self.irq)
            .field("warnings", &self.warnings)
            .finish_non_exhaustive()
    }
}

impl SerialDevice {
    /// Creates a UART raising `irq` and writing guest output to `out`.
    pub fn new(irq: EventFd, out: SerialOutput) -> Result<Self, SerialError> {
        let trigger = EventFdTrigger(irq.try_clone().map_err(SerialError::EventFd)?);
        let rx_ready =
            EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK).map_err(SerialError::EventFd)?;
        let events = RxReadyEvents(rx_ready.try_clone().map_err(SerialError::EventFd)?);
        Ok(SerialDevice {
            uart: Mutex::new(Serial::with_events(trigger, events, out)),
            irq,
            rx_ready,
            accesses: AtomicU64::new(0),
            warnings: GuestWarnings::default(),
        })
    }

    /// Raises the interrupt again when the UART has one pending and the guest has not touched
    /// the port since `seen` (what the previous call returned): an edge lost on its way into
    /// the guest (seen under nested virtualisation) would otherwise stall its console for good,
    /// the driver waiting for an interrupt that already came. Returns the accesses so far, for
    /// the next call; called a few times a second.
    pub fn raise_stalled_interrupt(&self, seen: u64) -> u64 {
        let accesses = self.accesses.load(Ordering::Acquire);
        // Bit 0 of IIR clear: an interrupt is pending.
        if accesses == seen && self.uart().state().interrupt_identification & 1 == 0 {
            log::debug!("serial: the guest has not taken its pending interrupt: raised again");
            if let Err(e) = self.irq.write(1) {
                log::error!("serial: cannot raise its interrupt: {e}");
            }
        }
        accesses
    }

    /// The interrupt event fd (register it as the irqfd of the serial port's interrupt line).
    pub fn irq_evt(&self) -> &EventFd {
        &self.irq
    }

    /// Signalled when the guest has emptied the receive FIFO.
    pub fn rx_ready_evt(&self) -> &EventFd {
        &self.rx_ready
    }

    fn uart(&self) -> MutexGuard<'_, Serial<EventFdTrigger, RxReadyEvents, SerialOutput>> {
        self.uart
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The UART's state, for a snapshot.
    pub fn save_state(&self) -> SerialSnapshot {
        self.uart().state().into()
    }

    /// Restores a saved state; the output keeps going where it goes.
    pub fn restore_state(&self, snapshot: &SerialSnapshot) -> Result<(), SerialError> {
        let clone = |fd: &EventFd| fd.try_clone().map_err(SerialError::EventFd);
        let (irq, rx_ready) = (clone(&self.irq)?, clone(&self.rx_ready)?);
        if snapshot.in_buffer.len() > FIFO_SIZE {
            return Err(SerialError::BadState(format!(
                "{} bytes of input, the FIFO holds {FIFO_SIZE}",
                snapshot.in_buffer.len()
            )));
        }
        let mut uart = self.uart();
        // Only the writer moves over: a stand-in holds the place while it does.
        let stand_in = Serial::with_events(
            EventFdTrigger(clone(&self.irq)?),
            RxReadyEvents(clone(&self.rx_ready)?),
            Box::new(io::sink()) as SerialOutput,
        );
        let out = std::mem::replace(&mut *uart, stand_in).into_writer();
        *uart = Serial::from_state(
            &SerialState::from(snapshot),
            EventFdTrigger(irq),
            RxReadyEvents(rx_ready),
            out,
        )
        .map_err(|e| SerialError::BadState(format!("{e:?}")))?;
        Ok(())
    }

    /// Free space in the receive FIFO.
    pub fn fifo_capacity(&self) -> usize {
        self.uart().fifo_capacity()
    }

    /// Queues input for the guest; returns how many bytes fit into the FIFO.
    pub fn enqueue_input(&self, input: &[u8]) -> Result<usize, SerialError> {
        let mut uart = self.uart();
        let room = uart.fifo_capacity().min(input.len());
        if room == 0 {
            return Ok(0);
        }
        uart.enqueue_raw_bytes(&input[..room])
            .map_err(|e| SerialError::Input(e.to_string()))
    }
}

impl BusDevice for SerialDevice {
    fn read(&self, base: u64, offset: u64, data: &mut [u8]) {
        self.accesses.fetch_add(1, Ordering::Release);
        data.fill(0);
        match (data, u8::try_from(offset)) {
            ([byte], Ok(offset)) => {
                *byte = self.uart().read(offset);
                UART.read_count.inc();
            }
            (data, _) => {
                UART.missed_read_count.inc();
                self.warnings.warn(format_args!(
                    "serial@{base:#x}: {}-byte read at offset {offset:#x} ignored",
                    data.len()
                ));
            }
        }
    }

    fn write(&self, base: u64, offset: u64, data: &[u8]) {
        self.accesses.fetch_add(1, Ordering::Release);
        match (data, u8::try_from(offset)) {
            ([byte], Ok(offset)) => {
                UART.write_count.inc();
                if let Err(e) = self.uart().write(offset, *byte) {
                    UART.error_count.inc();
                    self.warnings.warn(format_args!("serial@{base:#x}: {e}"));
                }
            }
            (data, _) => {
                UART.missed_write_count.inc();
                self.warnings.warn(format_args!(
                    "serial@{base:#x}: {}-byte write at offset {offset:#x} ignored",
                    data.len()
                ));
            }
        }
    }
}

/// An in-memory serial output that can be read back while the guest runs.
#[derive(Clone, Debug, Default)]
pub struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl SharedBuffer {
    /// Creates an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    const DATA: u64 = 0;
    const IER: u64 = 1;
    const LSR: u64 = 5;
    const LSR_DATA_READY: u8 = 1;
    const IER_RDA: u8 = 1;

    fn device() -> (SerialDevice, SharedBuffer) {
        let out = SharedBuffer::new();
        let serial =
            SerialDevice::new(EventFd::new(EFD_NONBLOCK).unwrap(), Box::new(out.clone())).unwrap();
        (serial, out)
    }

    #[test]
    fn a_pending_interrupt_the_guest_does_not_take_is_raised_again() {
        const IIR: u64 = 2;
        const IER_THRE: u8 = 2;
        let (serial, _) = device();
        // Enabling the transmitter-empty interrupt makes one pending; its edge is "lost".
        serial.write(0x3f8, IER, &[IER_THRE]);
        let _ = serial.irq_evt().read();
        let seen = serial.raise_stalled_interrupt(u64::MAX);
        assert!(
            serial.irq_evt().read().is_err(),
            "the guest just touched the port"
        );
        let seen = serial.raise_stalled_interrupt(seen);
        assert_eq!(serial.irq_evt().read().unwrap(), 1, "raised again");
        // The guest takes it (reading IIR clears it): nothing more is raised.
        let mut iir = [0u8];
        serial.read(0x3f8, IIR, &mut iir);
        let seen = serial.raise_stalled_interrupt(seen);
        serial.raise_stalled_interrupt(seen);
        assert!(serial.irq_evt().read().is_err());
    }

    #[test]
    fn guest_output_reaches_the_writer() {
        let (serial, out) = device();
        for byte in b"hello\n" {
            serial.write(0x3f8, DATA, &[*byte]);
        }
        assert_eq!(out.contents(), b"hello\n");
    }

    #[test]
    fn input_is_readable_and_raises_the_interrupt() {
        let (serial, _) = device();
        serial.write(0x3f8, IER, &[IER_RDA]);
        let _ = serial.irq_evt().read(); // THR-empty interrupt from enabling IER
        assert_eq!(serial.enqueue_input(b"ab").unwrap(), 2);
        assert_eq!(serial.irq_evt().read().unwrap(), 1);
        let mut byte = [0];
        serial.read(0x3f8, LSR, &mut byte);
        assert_eq!(byte[0] & LSR_DATA_READY, LSR_DATA_READY);
        serial.read(0x3f8, DATA, &mut byte);
        assert_eq!(byte[0], b'a');
        assert!(serial.rx_ready_evt().read().is_err(), "FIFO not empty yet");
        serial.read(0x3f8, DATA, &mut byte);
        assert_eq!(byte[0], b'b');
        assert_eq!(serial.rx_ready_evt().read().unwrap(), 1);
    }

    #[test]
    fn a_restored_uart_has_the_saved_registers_and_input_and_keeps_its_output() {
        let (saved, _) = device();
        saved.write(0x3f8, IER, &[IER_RDA]);
        saved.enqueue_input(b"xyz").unwrap();
        let state = saved.save_state();
        assert_eq!(
            (state.interrupt_enable, &state.in_buffer[..]),
            (IER_RDA, &b"xyz"[..])
        );

        let (restored, out) = device();
        restored.restore_state(&state).unwrap();
        assert_eq!(restored.save_state(), state);
        let mut byte = [0];
        restored.read(0x3f8, DATA, &mut byte);
        assert_eq!(byte[0], b'x');
        restored.write(0x3f8, DATA, b"!");
        assert_eq!(out.contents(), b"!");

        let too_much = SerialSnapshot {
            in_buffer: vec![0; FIFO_SIZE + 1],
            ..state
        };
        assert!(matches!(
            restored.restore_state(&too_much),
            Err(SerialError::BadState(_))
        ));
    }

    #[test]
    fn a_full_fifo_accepts_only_what_fits() {
        let (serial, _) = device();
        let capacity = serial.fifo_capacity();
        let input = vec![b'x'; capacity + 10];
        assert_eq!(serial.enqueue_input(&input).unwrap(), capacity);
        assert_eq!(serial.enqueue_input(b"y").unwrap(), 0);
    }

    #[test]
    fn odd_accesses_are_ignored() {
        let (serial, out) = device();
        serial.write(0x3f8, DATA, b"ab");
        serial.write(0x3f8, 0x1_0000, b"a");
        let mut two = [0xff; 2];
        serial.read(0x3f8, DATA, &mut two);
        assert_eq!(two, [0, 0]);
        assert!(out.contents().is_empty());
    }
}
