//! The logger of the `vmm` command: env_logger on stderr, `warning: ...` lines; a VMM started
//! as `vmm --api-sock` lets the API move it to a file or named pipe (`PUT /logger`,
//! [`ApiLogControl`]). Warnings and errors are rate-limited per place in the code, whatever
//! crate logs them ([`crate::log_limit`]), with a summary of what was not shown.

use std::io::Write;
use std::sync::{Once, OnceLock, RwLock};
use std::time::Instant;

use log::{Level, LevelFilter, Log, Metadata, Record};
use vmm_api::model::{LogLevel, Logger};
use vmm_api::LogControl;

use crate::log_limit::{LogLimiter, WINDOW};

/// The level when neither `--log-level` nor `RUST_LOG` says otherwise.
pub const DEFAULT_LEVEL: LevelFilter = LevelFilter::Warn;

/// How a message of `level` starts ("warning: ..."), as the command's own error lines do.
fn prefix(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// The installed logger: an env_logger that `PUT /logger` can replace, behind the rate limit.
struct SwitchableLogger {
    inner: RwLock<env_logger::Logger>,
    limiter: LogLimiter,
    /// Starts the thread that writes the summaries of windows nothing else closes.
    summaries: Once,
}

impl SwitchableLogger {
    fn write(&self, record: &Record<'_>) {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .log(record);
    }

    /// Writes the summaries of the rate limit's windows that ended by `now` (all of them when
    /// the process `ends`).
    fn write_summaries(&self, now: Instant, ends: bool) {
        for hidden in self.limiter.ended(now, ends) {
            self.write(
                &Record::builder()
                    .args(format_args!("{hidden}"))
                    .level(Level::Warn)
                    .target(&hidden.target)
                    .build(),
            );
        }
    }
}

impl Log for SwitchableLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if record.level() <= Level::Warn && self.enabled(record.metadata()) {
            let now = Instant::now();
            self.write_summaries(now, false);
            if !self.limiter.admit(record, now) {
                // Once messages are held back, their summary must come even if no message
                // follows to close the window.
                self.summaries.call_once(|| {
                    let _ = std::thread::Builder::new()
                        .name("log-summaries".into())
                        .spawn(|| loop {
                            std::thread::sleep(WINDOW);
                            if let Some(logger) = LOGGER.get() {
                                logger.write_summaries(Instant::now(), false);
                            }
                        });
                });
                return;
            }
        }
        self.write(record);
    }

    fn flush(&self) {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).flush();
    }
}

static LOGGER: OnceLock<&'static SwitchableLogger> = OnceLock::new();

/// Writes the summaries of the messages that the rate limit held back and has not summarized
/// yet: the process ends.
pub fn finish() {
    if let Some(logger) = LOGGER.get() {
        logger.write_summaries(Instant::now(), true);
    }
}

/// Installs the logger: `level` if given, else `RUST_LOG`, else [`DEFAULT_LEVEL`]. A second
/// call (tests run the command many times in one process) keeps the first logger.
pub fn init(level: Option<LevelFilter>) {
    let mut builder = env_logger::Builder::new();
    builder.filter_level(DEFAULT_LEVEL);
    builder.parse_env("RUST_LOG");
    if let Some(level) = level {
        builder.filter_level(level);
    }
    builder.format(|out, record| {
        let level = record.level();
        // The VMM's name first where it has one; env_logger writes each line whole.
        let name = vmm::runner::line_prefix().unwrap_or_default();
        if level <= Level::Warn {
            writeln!(out, "{name}{}: {}", prefix(level), record.args())
        } else {
            writeln!(
                out,
                "{name}{}: {}: {}",
                prefix(level),
                record.target(),
                record.args()
            )
        }
    });
    let built = builder.build();
    let max = built.filter();
    LOGGER.get_or_init(|| {
        let logger: &'static SwitchableLogger = Box::leak(Box::new(SwitchableLogger {
            inner: RwLock::new(built),
            limiter: LogLimiter::default(),
            summaries: Once::new(),
        }));
        if log::set_logger(logger).is_ok() {
            log::set_max_level(max);
        }
        logger
    });
}

/// `PUT /logger` for the installed logger of the VMM instance `id`: its lines start with a
/// UTC timestamp and the instance id, as Firecracker's do.
#[derive(Debug, Default)]
pub struct ApiLogControl {
    /// The instance id (`--id`).
    pub id: String,
}

impl LogControl for ApiLogControl {
    fn configure(&self, config: &Logger) -> Result<(), String> {
        let logger = LOGGER.get().ok_or("no logger is installed")?;
        let level = config.level.unwrap_or(LogLevel::Info).filter();
        let mut builder = env_logger::Builder::new();
        match &config.module {
            Some(module) => builder
                .filter_level(LevelFilter::Off)
                .filter_module(module, level),
            None => builder.filter_level(level),
        };
        let show_level = config.show_level.unwrap_or(false);
        let show_origin = config.show_log_origin.unwrap_or(false);
        let id = self.id.clone();
        builder.format(move |out, record| {
            write!(out, "{} [{id}] ", out.timestamp_millis())?;
            if show_level {
                write!(out, "{} ", record.level())?;
            }
            if show_origin {
                write!(
                    out,
                    "{}:{} ",
                    record.file().unwrap_or("?"),
                    record.line().unwrap_or(0)
                )?;
            }
            writeln!(out, "{}", record.args())
        });
        if let Some(path) = &config.log_path {
            let file = vmm::host_file::open_appending("log_path", path)
                .map_err(|e| format!("cannot open the log: {e}"))?;
            builder.target(env_logger::Target::Pipe(Box::new(file)));
        }
        let built = builder.build();
        let max = built.filter();
        *logger.inner.write().unwrap_or_else(|e| e.into_inner()) = built;
        log::set_max_level(max);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A pipe target that keeps what is written.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_guest_breaking_a_queue_20000_times_writes_a_few_lines_whatever_logs_them() {
        let captured = Captured::default();
        let mut builder = env_logger::Builder::new();
        builder
            .filter_level(LevelFilter::Warn)
            .format(|out, record| writeln!(out, "{}: {}", prefix(record.level()), record.args()))
            .target(env_logger::Target::Pipe(Box::new(captured.clone())));
        let logger = SwitchableLogger {
            inner: RwLock::new(builder.build()),
            limiter: LogLimiter::default(),
            summaries: Once::new(),
        };
        // What one broken-queue event logged: virtio-queue's error, the balloon's, the VMM's.
        for event in 0..20_000 {
            for (target, level, line) in [
                ("virtio_queue::queue", Level::Error, 100),
                ("virtio_balloon::device", Level::Error, 384),
                ("vmm_devices::balloon::device", Level::Warn, 100),
            ] {
                logger.log(
                    &Record::builder()
                        .args(format_args!("broken queue, event {event}"))
                        .level(level)
                        .target(target)
                        .file(Some("src.rs"))
                        .line(Some(line))
                        .build(),
                );
            }
        }
        logger.write_summaries(Instant::now() + WINDOW, false);
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3 * 10 + 3, "{text}");
        assert!(
            lines[30..]
                .iter()
                .all(|l| l.contains("19990 similar messages not shown")),
            "{text}"
        );
    }

    #[test]
    fn messages_start_like_the_commands_own_lines() {
        assert_eq!(prefix(Level::Error), "error");
        assert_eq!(prefix(Level::Warn), "warning");
        assert_eq!(prefix(Level::Info), "info");
    }
}
