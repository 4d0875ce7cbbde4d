//! Firecracker-style metrics (`PUT /metrics`, `PUT /actions` FlushMetrics): one JSON line per
//! flush, appended to a file or named pipe, with the VM's state, guest memory and pool
//! counters, the balloon's sizes and the drives' requests.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::session::Session;
use crate::api::model::{InstanceState, Metrics};
use crate::api::VmmControl;

/// Where metrics go, and what each line carries besides them.
#[derive(Debug)]
pub(super) struct MetricsSink {
    file: Mutex<File>,
    id: Option<String>,
    properties: Option<Value>,
}

impl MetricsSink {
    /// Opens the file (created if missing, appended to) or named pipe (without waiting for a
    /// reader) of `metrics`; lines name instance `id` if `emit_id` asks.
    pub fn open(metrics: &Metrics, id: &str) -> io::Result<Self> {
        let fifo =
            std::fs::metadata(&metrics.metrics_path).is_ok_and(|meta| meta.file_type().is_fifo());
        let file = if fifo {
            // Read and write: opening a pipe without a reader neither blocks nor fails.
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&metrics.metrics_path)?
        } else {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&metrics.metrics_path)?
        };
        Ok(MetricsSink {
            file: Mutex::new(file),
            id: metrics.emit_id.then(|| id.to_owned()),
            properties: metrics.properties.as_ref().map(|p| json!(p)),
        })
    }

    /// Appends one line: the VM of `session` (if it has started) or a VM that has not.
    pub fn flush(&self, session: Option<&Session>) -> io::Result<()> {
        let mut line = Map::new();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        line.insert("utc_timestamp_ms".into(), json!(now));
        if let Some(id) = &self.id {
            line.insert("id".into(), json!(id));
        }
        if let Some(properties) = &self.properties {
            line.insert("properties".into(), properties.clone());
        }
        match session {
            Some(session) => add_session(&mut line, session),
            None => {
                line.insert("vmm".into(), json!({ "state": InstanceState::NotStarted }));
            }
        }
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        self.file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_all(text.as_bytes())
    }
}

/// The counters of a VM that exists.
fn add_session(line: &mut Map<String, Value>, session: &Session) {
    if let Ok(info) = session.machine_info() {
        line.insert(
            "vmm".into(),
            json!({ "state": InstanceState::from(info.state) }),
        );
    }
    if let Ok(memory) = session.memory_info() {
        line.insert(
            "memory".into(),
            json!({
                "populated_bytes": memory.guest.populated_bytes,
                "faults": memory.guest.faults,
                "exhausted_faults": memory.guest.exhausted_faults,
                "waiting_vcpus": memory.guest.waiting_vcpus,
                "waiting_other_faults": memory.guest.waiting_other_faults,
                "discarded_chunks": memory.guest.discarded_chunks,
                "pool_free_bytes": memory.pool.free_bytes,
                "pool_used_bytes": memory.pool.used_bytes,
            }),
        );
    }
    if let Ok(balloon) = session.balloon() {
        line.insert(
            "balloon".into(),
            json!({
                "target_mib": balloon.amount_mib,
                "actual_mib": balloon.actual_mib,
                "needs_reset": balloon.needs_reset,
            }),
        );
    }
    let drives: Map<String, Value> = session
        .drive_counters()
        .iter()
        .map(|(id, counters)| {
            let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            (
                id.clone(),
                json!({
                    "reads": count(&counters.reads),
                    "writes": count(&counters.writes),
                    "flushes": count(&counters.flushes),
                    "failed": count(&counters.failed),
                }),
            )
        })
        .collect();
    if !drives.is_empty() {
        line.insert("block".into(), Value::Object(drives));
    }
}
