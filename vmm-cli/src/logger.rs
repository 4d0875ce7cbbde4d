//! The logger of the `vmm` command: env_logger on stderr, `warning: ...` lines.

use std::io::Write;

use log::{Level, LevelFilter};

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
        if level <= Level::Warn {
            writeln!(out, "{}: {}", prefix(level), record.args())
        } else {
            writeln!(
                out,
                "{}: {}: {}",
                prefix(level),
                record.target(),
                record.args()
            )
        }
    });
    // Fails only when a logger is installed already.
    let _ = builder.try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_start_like_the_commands_own_lines() {
        assert_eq!(prefix(Level::Error), "error");
        assert_eq!(prefix(Level::Warn), "warning");
        assert_eq!(prefix(Level::Info), "info");
    }
}
