//! The guest's console on the VMM's stdout (and, for Linux, stdin): the 16550 at COM1.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::Arc;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::events::Subscriber;
use crate::devices::event_loop::SerialInput;
use crate::devices::serial::{SerialDevice, SerialError, SerialOutput};

/// The VMM's stdout, written through at once: what the guest prints appears as it prints it
/// (and a reader sees the guest's first byte when it is written).
#[derive(Debug, Default)]
pub(super) struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = io::stdout().lock();
        out.write_all(buf)?;
        out.flush()?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush()
    }
}

/// The VMM's stdout as the guest's console output.
pub(super) fn serial_output() -> SerialOutput {
    Box::new(Stdout)
}

/// A serial port writing to the console output, its input coming from stdin.
pub(super) struct Console {
    serial: Arc<SerialDevice>,
}

impl Console {
    /// A 16550 writing to `output`.
    pub fn new(output: SerialOutput) -> Result<Self, SerialError> {
        let irq = EventFd::new(EFD_NONBLOCK).map_err(SerialError::EventFd)?;
        let serial = SerialDevice::new(irq, output)?;
        Ok(Console {
            serial: Arc::new(serial),
        })
    }

    /// The UART, for the port I/O bus and its irqfd.
    pub fn serial(&self) -> &Arc<SerialDevice> {
        &self.serial
    }

    /// Feeds stdin to the UART. Without an stdin there is no input; one that epoll cannot
    /// watch (/dev/null, a regular file) is ignored by the subscriber.
    pub fn input_subscriber(&self) -> Option<Subscriber> {
        // A plain file on a duplicate of fd 0: reads take only what the FIFO has room for
        // (std's Stdin would buffer more than that behind epoll's back).
        let stdin = io::stdin().as_fd().try_clone_to_owned().ok()?;
        Some(Box::new(SerialInput::new(
            self.serial.clone(),
            File::from(stdin),
        )))
    }
}
