//! The guest's console on the VMM's stdout (and, for Linux, stdin): the 16550 at COM1.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::events::Subscriber;
use crate::host_file::{self, HostFileError};
use vmm_api::model::SerialConfig;
use vmm_devices::event_loop::SerialInput;
use vmm_devices::metrics::UART;
use vmm_devices::rate_limiter::{RateLimiter, RateLimiterConfig};
use vmm_devices::serial::{SerialDevice, SerialError, SerialOutput};

/// The name every line a VMM prints starts with (`[NAME] `), set once by the front end from
/// `--vm` or `--id`: several VMMs on one terminal then write whole lines, each saying whose.
static LINE_NAME: OnceLock<String> = OnceLock::new();

/// A partial line is written after this long without its end (a shell's prompt).
const PARTIAL_LINE_DELAY: Duration = Duration::from_millis(100);
/// How often the partial-line writer looks whether the console is gone, with nothing pending.
const IDLE_LOOK: Duration = Duration::from_secs(1);
/// A line longer than this is written in pieces of this size, each a line of its own.
const MAX_LINE: usize = 4096;

/// Makes every line the VMM prints start with `[name] ` and be written whole (the console's
/// and the log's); the first call counts.
pub fn name_lines(name: &str) {
    let _ = LINE_NAME.set(format!("[{name}] "));
}

/// The prefix of every line the VMM prints, if [`name_lines`] gave one.
pub fn line_prefix() -> Option<&'static str> {
    LINE_NAME.get().map(String::as_str)
}

/// Prints `line` on stderr as one write, after the [`line_prefix`] if there is one: the VMM's
/// own messages (progress, notes, its final status).
pub fn say(line: impl std::fmt::Display) {
    let text = format!("{}{line}\n", line_prefix().unwrap_or_default());
    let _ = io::stderr().lock().write_all(text.as_bytes());
}

/// The VMM's stdout, written through at once: what the guest prints appears as it prints it
/// (and a reader sees the guest's first byte when it is written). With a [`line_prefix`] it is
/// written a whole line at a time, each starting with the prefix; a partial line (a prompt)
/// after [`PARTIAL_LINE_DELAY`] without its end.
#[derive(Debug, Default)]
pub(super) struct Stdout {
    /// The line being printed, with a thread that writes it once it waited long enough.
    pending: Option<Arc<PendingLine>>,
}

/// A partial line and its writer's wake-up.
#[derive(Debug, Default)]
struct PendingLine {
    line: Mutex<Partial>,
    changed: Condvar,
}

/// The bytes of a line so far (none: nothing pending), and when the last of them came.
#[derive(Debug)]
struct Partial {
    text: Vec<u8>,
    last: Instant,
}

impl Default for Partial {
    fn default() -> Self {
        Partial {
            text: Vec::new(),
            last: Instant::now(),
        }
    }
}

impl PendingLine {
    /// Writes the partial line once nothing came for [`PARTIAL_LINE_DELAY`]; runs until the
    /// console is dropped (its last reference is this thread's).
    fn write_late(self: &Arc<Self>, prefix: &'static str) {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        while Arc::strong_count(self) > 1 {
            // Nothing pending: a write wakes it (and a look now and then sees the end).
            let wait = if line.text.is_empty() {
                IDLE_LOOK
            } else {
                PARTIAL_LINE_DELAY.saturating_sub(line.last.elapsed())
            };
            if !line.text.is_empty() && wait.is_zero() {
                // Written without its end; what follows starts a line of its own.
                let _ = write_line(prefix, &line.text, false);
                line.text.clear();
                continue;
            }
            line = self
                .changed
                .wait_timeout(line, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Writes `prefix` and `text` to stdout in one write, with a newline if it `ends`.
fn write_line(prefix: &str, text: &[u8], ends: bool) -> io::Result<()> {
    let mut line = Vec::with_capacity(prefix.len() + text.len() + 1);
    line.extend_from_slice(prefix.as_bytes());
    line.extend_from_slice(text);
    if ends {
        line.push(b'\n');
    }
    super::progress::around_bars(|| {
        let mut out = io::stdout().lock();
        out.write_all(&line)?;
        out.flush()
    })
}

impl Stdout {
    fn write_named(&mut self, prefix: &'static str, buf: &[u8]) -> io::Result<()> {
        let pending = self.pending.get_or_insert_with(|| {
            let pending = Arc::new(PendingLine::default());
            let writer = pending.clone();
            let spawned = std::thread::Builder::new()
                .name("console-lines".into())
                .spawn(move || writer.write_late(prefix));
            if let Err(e) = spawned {
                log::warn!("console: partial lines wait for their end: {e}");
            }
            pending
        });
        let mut line = pending.line.lock().unwrap_or_else(|e| e.into_inner());
        for piece in buf.split_inclusive(|&b| b == b'\n') {
            let (text, ends) = match piece.strip_suffix(b"\n") {
                Some(text) => (text, true),
                None => (piece, false),
            };
            line.text.extend_from_slice(text);
            if ends || line.text.len() >= MAX_LINE {
                write_line(prefix, &line.text, true)?;
                line.text.clear();
            } else {
                line.last = Instant::now();
            }
        }
        pending.changed.notify_one();
        Ok(())
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Whole lines with a name, or while progress bars are on the terminal (a line at a time
        // with the bars lifted; not a byte at a time).
        let mid_line = self.pending.as_ref().is_some_and(|pending| {
            let line = pending.line.lock().unwrap_or_else(|e| e.into_inner());
            !line.text.is_empty()
        });
        let lines = super::progress::bars_shown() || mid_line;
        let prefix = line_prefix().or(lines.then_some(""));
        if let Some(prefix) = prefix {
            self.write_named(prefix, buf)?;
            return Ok(buf.len());
        }
        let mut out = io::stdout().lock();
        out.write_all(buf)?;
        out.flush()?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush()
    }
}

impl Drop for Stdout {
    fn drop(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let mut line = pending.line.lock().unwrap_or_else(|e| e.into_inner());
        if !line.text.is_empty() {
            let _ = write_line(line_prefix().unwrap_or_default(), &line.text, true);
        }
        line.text.clear();
        drop(line);
        // The writer thread sees it is the last owner and ends.
        pending.changed.notify_one();
    }
}

/// The VMM's stdout as the guest's console output.
pub(super) fn serial_output() -> SerialOutput {
    Box::new(Stdout::default())
}

/// The guest's console output to a file or named pipe (`PUT /serial`): output a full pipe (or
/// one nobody reads) cannot take is dropped rather than stalling the guest, and counted as a
/// missed write; with a rate limiter, output beyond its rate is dropped and counted in
/// `uart.rate_limiter_dropped_bytes`, as in Firecracker.
pub(super) struct SerialFile {
    file: File,
    limiter: RateLimiter,
}

impl SerialFile {
    /// Opens `config`'s path: a pipe (without waiting for a reader) or a regular file
    /// (appended to); anything else is refused.
    pub fn open(config: &SerialConfig) -> Result<Self, HostFileError> {
        Ok(SerialFile {
            file: host_file::open_appending("serial_out_path", &config.serial_out_path)?,
            limiter: RateLimiter::new(
                RateLimiterConfig {
                    bandwidth: config.rate_limiter,
                    ops: None,
                },
                Instant::now(),
            ),
        })
    }
}

impl Write for SerialFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let bytes = u64::try_from(buf.len()).unwrap_or(u64::MAX);
        if self.limiter.consume(bytes, Instant::now()).is_err() {
            UART.rate_limiter_dropped_bytes.add(bytes);
            return Ok(buf.len());
        }
        match self.file.write(buf) {
            Ok(n) if n < buf.len() => UART.missed_write_count.inc(),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                UART.missed_write_count.inc();
            }
            Err(_) => UART.error_count.inc(),
        }
        // The guest's output is taken either way: a UART does not wait for its cable.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
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
