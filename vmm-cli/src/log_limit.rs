//! Rate limiting of warnings and errors, whatever their source: this VMM's own and those of its
//! dependencies (virtio-queue logs every bad descriptor a guest writes). A guest that repeats a
//! mistake must not flood the host's log: each place in the code that logs (its target, file and
//! line) shows [`SHOWN_PER_WINDOW`] messages a [`WINDOW`], then counts the rest and says once
//! per window how many it did not show.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::Record;

/// How many messages of one place are shown per window.
pub const SHOWN_PER_WINDOW: u32 = 10;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Where a message comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Callsite {
    target: String,
    file: String,
    line: u32,
}

/// One place's current window.
#[derive(Debug)]
struct Window {
    started: Instant,
    shown: u32,
    hidden: u64,
    /// The first message not shown, for the summary.
    example: String,
}

/// A summary of the messages of one place that were not shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hidden {
    /// The messages' target (module path).
    pub target: String,
    /// How many were not shown.
    pub count: u64,
    /// The first of them.
    pub example: String,
    /// The window they fell in.
    pub window: Duration,
}

impl std::fmt::Display for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} similar messages not shown in the last {} s (rate-limited), the first: {}",
            self.target,
            self.count,
            self.window.as_secs(),
            self.example
        )
    }
}

/// The windows of every place that logged.
#[derive(Debug, Default)]
pub struct LogLimiter {
    windows: Mutex<HashMap<Callsite, Window>>,
}

impl LogLimiter {
    /// Whether `record` is shown (at `now`); one that is not is counted for the summary.
    pub fn admit(&self, record: &Record<'_>, now: Instant) -> bool {
        let callsite = Callsite {
            target: record.target().to_owned(),
            file: record.file().unwrap_or("?").to_owned(),
            line: record.line().unwrap_or(0),
        };
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let window = windows.entry(callsite).or_insert_with(|| Window {
            started: now,
            shown: 0,
            hidden: 0,
            example: String::new(),
        });
        if window.shown < SHOWN_PER_WINDOW {
            window.shown += 1;
            return true;
        }
        if window.hidden == 0 {
            window.example = record.args().to_string();
        }
        window.hidden += 1;
        false
    }

    /// The summaries of the windows that ended by `now` (all of them when the process `ends`)
    /// with messages not shown; those places start a new window.
    pub fn ended(&self, now: Instant, ends: bool) -> Vec<Hidden> {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let mut hidden = Vec::new();
        windows.retain(|callsite, window| {
            let over = ends || now.saturating_duration_since(window.started) >= WINDOW;
            if over && window.hidden > 0 {
                hidden.push(Hidden {
                    target: callsite.target.clone(),
                    count: window.hidden,
                    example: std::mem::take(&mut window.example),
                    window: now.saturating_duration_since(window.started),
                });
            }
            // A window that ended starts again with the place's next message.
            !over
        });
        hidden
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `limiter` shows an error `text` of `target`, line `line`, at `now`.
    fn admit(limiter: &LogLimiter, text: &str, target: &str, line: u32, now: Instant) -> bool {
        limiter.admit(
            &Record::builder()
                .args(format_args!("{text}"))
                .level(log::Level::Error)
                .target(target)
                .file(Some("queue.rs"))
                .line(Some(line))
                .build(),
            now,
        )
    }

    #[test]
    fn twenty_thousand_messages_of_one_place_show_ten_and_one_summary_a_window() {
        let limiter = LogLimiter::default();
        let start = Instant::now();
        let shown = (0..20_000)
            .filter(|i| {
                let text = format!("out of bounds descriptor {i}");
                admit(&limiter, &text, "virtio_queue::queue", 7, start)
            })
            .count();
        assert_eq!(shown, SHOWN_PER_WINDOW as usize);
        // Another place has its own budget.
        assert!(admit(&limiter, "balloon", "virtio_balloon", 9, start));
        assert!(
            limiter.ended(start + WINDOW / 2, false).is_empty(),
            "not over yet"
        );
        let ended = limiter.ended(start + WINDOW, false);
        assert_eq!(
            ended.len(),
            1,
            "only the place that hid messages: {ended:?}"
        );
        assert_eq!(ended[0].count, 20_000 - u64::from(SHOWN_PER_WINDOW));
        assert_eq!(
            ended[0].to_string(),
            "virtio_queue::queue: 19990 similar messages not shown in the last 60 s \
             (rate-limited), the first: out of bounds descriptor 10"
        );
        // A new window shows again.
        assert!(admit(
            &limiter,
            "again",
            "virtio_queue::queue",
            7,
            start + WINDOW
        ));
    }
}
