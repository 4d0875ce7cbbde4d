//! Firecracker's metrics (`PUT /metrics`, `PUT /actions` FlushMetrics, and every
//! [`FLUSH_INTERVAL`]): one JSON object per line, appended to a file or named pipe, with
//! Firecracker's sections and names (`api_server`, `balloon`, `block` and `block_ID`,
//! `get_api_requests`, `put_api_requests`, `patch_api_requests`, `i8042`, `uart`,
//! `latencies_us`, `logger`, `vcpu`, `vmm`, ...) and their meanings: counters say what happened
//! since the previous line, stored values (latencies, startup times, shortest and longest exit
//! handling) are the latest. What is ours (the VM's state, guest memory, the frame pool, the
//! balloon's sizes) is under `llfree`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::session::Session;
use crate::host_file::{self, HostFileError};
use vmm_api::metrics::{Durations, Operation, GET_REQUESTS, METRICS, PATCH_REQUESTS, PUT_REQUESTS};
use vmm_api::model::{InstanceState, Metrics, MAX_METRICS_INTERVAL_MS, MIN_METRICS_INTERVAL_MS};
use vmm_api::VmmControl;
use vmm_devices::block::BlockCounters;
use vmm_devices::metrics::{LegacyDeviceMetrics, I8042, UART};
use vmm_devices::net::NetCounters;

/// How often the metrics are written without being asked (Firecracker's interval), unless
/// `flush_interval_ms` says otherwise.
pub(super) const FLUSH_INTERVAL: Duration = Duration::from_secs(60);

/// Errors of opening the metrics' destination.
#[derive(Debug, thiserror::Error)]
pub enum MetricsFileError {
    /// The file or pipe could not be opened.
    #[error(transparent)]
    Open(#[from] HostFileError),
    /// The interval is out of range.
    #[error(
        "flush_interval_ms {0} is out of range: {MIN_METRICS_INTERVAL_MS} to \
         {MAX_METRICS_INTERVAL_MS} (an hour)"
    )]
    Interval(u64),
}

/// Where metrics go, and what the previous line counted.
#[derive(Debug)]
pub(super) struct MetricsSink {
    file: Mutex<File>,
    id: Option<String>,
    properties: Option<Value>,
    /// The counters' totals at the previous line, by their place in it.
    previous: Mutex<HashMap<String, u64>>,
    /// How often a line is written unasked.
    interval: Duration,
}

/// One line being written: counters become what happened since the previous line.
struct MetricsLine<'a> {
    previous: &'a mut HashMap<String, u64>,
    object: Map<String, Value>,
}

/// One section of a [`MetricsLine`].
struct Section<'l, 'a> {
    line: &'l mut MetricsLine<'a>,
    name: String,
    fields: Map<String, Value>,
}

impl<'a> MetricsLine<'a> {
    fn section(&mut self, name: &str) -> Section<'_, 'a> {
        Section {
            line: self,
            name: name.to_owned(),
            fields: Map::new(),
        }
    }
}

impl Section<'_, '_> {
    /// A counter whose total so far is `total`: it says how much it grew since the last line.
    fn count(&mut self, field: &str, total: u64) -> &mut Self {
        let since = self.since_previous(field, total);
        self.fields.insert(field.into(), json!(since));
        self
    }

    /// How much the counter at `path` (in this section) grew to `total` since the last line.
    fn since_previous(&mut self, path: &str, total: u64) -> u64 {
        let key = format!("{}.{path}", self.name);
        let before = self.line.previous.insert(key, total).unwrap_or(0);
        total.saturating_sub(before)
    }

    /// A value as it is now.
    fn value(&mut self, field: &str, value: impl Into<Value>) -> &mut Self {
        self.fields.insert(field.into(), value.into());
        self
    }

    /// Firecracker's `LatencyAggregateMetrics` of `durations`.
    fn durations(&mut self, field: &str, durations: &Durations) -> &mut Self {
        let (min, max, sum) = durations.get();
        let sum = self.since_previous(&format!("{field}.sum_us"), sum);
        self.fields.insert(
            field.into(),
            json!({ "min_us": min, "max_us": max, "sum_us": sum }),
        );
        self
    }

    fn done(&mut self) {
        let fields = std::mem::take(&mut self.fields);
        self.line
            .object
            .insert(self.name.clone(), Value::Object(fields));
    }
}

impl MetricsSink {
    /// Opens the file (created if missing, appended to) or named pipe (without waiting for a
    /// reader) of `metrics`; lines name instance `id` if `emit_id` asks.
    pub fn open(metrics: &Metrics, id: &str) -> Result<Self, MetricsFileError> {
        let interval = match metrics.flush_interval_ms {
            None => FLUSH_INTERVAL,
            Some(ms) if (MIN_METRICS_INTERVAL_MS..=MAX_METRICS_INTERVAL_MS).contains(&ms) => {
                Duration::from_millis(ms)
            }
            Some(ms) => return Err(MetricsFileError::Interval(ms)),
        };
        Ok(MetricsSink {
            interval,
            file: Mutex::new(host_file::open_appending(
                "metrics_path",
                &metrics.metrics_path,
            )?),
            id: metrics.emit_id.then(|| id.to_owned()),
            properties: metrics.properties.as_ref().map(|p| json!(p)),
            previous: Mutex::new(HashMap::new()),
        })
    }

    /// How often a line is written unasked.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Appends one line: the VM of `session` (if it has started) or a VM that has not.
    pub fn flush(&self, session: Option<&Session>) -> io::Result<()> {
        let mut previous = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        let mut line = MetricsLine {
            previous: &mut previous,
            object: Map::new(),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        line.object.insert("utc_timestamp_ms".into(), json!(now));
        if let Some(id) = &self.id {
            line.object.insert("id".into(), json!(id));
        }
        if let Some(properties) = &self.properties {
            line.object.insert("properties".into(), properties.clone());
        }
        add_process(&mut line);
        add_devices(&mut line, session);
        line.object.insert("llfree".into(), ours(session));
        let mut text = Value::Object(line.object).to_string();
        text.push('\n');
        let written = self
            .file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_all(text.as_bytes());
        match &written {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                METRICS.writer.missed_metrics_count.inc()
            }
            Err(_) => METRICS.writer.metrics_fails.inc(),
            Ok(()) => {}
        }
        written
    }
}

/// The process's own counters: the API, the vCPUs, the legacy devices, latencies.
fn add_process(line: &mut MetricsLine<'_>) {
    let (startup_us, startup_cpu_us) = METRICS.startup_us();
    line.section("api_server")
        .value("process_startup_time_us", startup_us)
        .value("process_startup_time_cpu_us", startup_cpu_us)
        .done();
    let api = &METRICS.api;
    let mut get = line.section("get_api_requests");
    for ((_, name), counter) in GET_REQUESTS.iter().zip(&api.get) {
        get.count(name, counter.get());
    }
    get.done();
    for (section, table, requests) in [
        ("put_api_requests", &PUT_REQUESTS[..], &api.put[..]),
        ("patch_api_requests", &PATCH_REQUESTS[..], &api.patch[..]),
    ] {
        let mut section = line.section(section);
        for ((_, name), requests) in table.iter().zip(requests) {
            section
                .count(&format!("{name}_count"), requests.count.get())
                .count(&format!("{name}_fails"), requests.fails.get());
        }
        section.done();
    }
    line.section("deprecated_api")
        .count("deprecated_http_api_calls", 0)
        .done();
    let mut latencies = line.section("latencies_us");
    for operation in Operation::ALL {
        let (api, vmm) = METRICS.latencies.get(operation);
        latencies
            .value(operation.name(), api)
            .value(&format!("vmm_{}", operation.name()), vmm);
    }
    latencies.done();
    line.section("logger")
        .count(
            "missed_metrics_count",
            METRICS.writer.missed_metrics_count.get(),
        )
        .count("metrics_fails", METRICS.writer.metrics_fails.get())
        .done();
    let vcpu = &METRICS.vcpu;
    line.section("vcpu")
        .count("exit_io_in", vcpu.exit_io_in.get())
        .count("exit_io_out", vcpu.exit_io_out.get())
        .count("exit_mmio_read", vcpu.exit_mmio_read.get())
        .count("exit_mmio_write", vcpu.exit_mmio_write.get())
        .count("failures", vcpu.failures.get())
        .durations("exit_io_in_agg", &vcpu.exit_io_in_agg)
        .durations("exit_io_out_agg", &vcpu.exit_io_out_agg)
        .durations("exit_mmio_read_agg", &vcpu.exit_mmio_read_agg)
        .durations("exit_mmio_write_agg", &vcpu.exit_mmio_write_agg)
        .done();
    line.section("vmm")
        .value("panic_count", METRICS.panic_count.get())
        .done();
    line.section("seccomp")
        .count("num_faults", METRICS.seccomp_faults.get())
        .done();
    legacy(line, "i8042", &I8042)
        .count("reset_count", I8042.reset_count.get())
        .done();
    legacy(line, "uart", &UART)
        .count(
            "rate_limiter_dropped_bytes",
            UART.rate_limiter_dropped_bytes.get(),
        )
        .done();
}

/// The counters of a legacy device, in a section the caller may add to and then ends.
fn legacy<'l, 'a>(
    line: &'l mut MetricsLine<'a>,
    name: &str,
    metrics: &LegacyDeviceMetrics,
) -> Section<'l, 'a> {
    let mut section = line.section(name);
    section
        .count("read_count", metrics.read_count.get())
        .count("write_count", metrics.write_count.get())
        .count("missed_read_count", metrics.missed_read_count.get())
        .count("missed_write_count", metrics.missed_write_count.get())
        .count("error_count", metrics.error_count.get());
    section
}

/// The VM's devices: its balloon, entropy device, drives and network interfaces.
fn add_devices(line: &mut MetricsLine<'_>, session: Option<&Session>) {
    if let Some(balloon) = session.and_then(Session::balloon_handle) {
        let info = balloon.info();
        let counters = info.counters;
        let violations = info.violations.total();
        line.section("balloon")
            .count("inflate_count", counters.inflate_buffers)
            .count("deflate_count", counters.deflate_buffers)
            .count("stats_updates_count", counters.stats_updates)
            .count("free_page_report_count", counters.report_buffers)
            .count("free_page_report_freed", counters.reported_bytes)
            .count("free_page_report_fails", counters.backend_errors)
            .count("free_page_hint_count", counters.hint_buffers)
            .count("free_page_hint_freed", counters.hinted_bytes)
            .count("event_fails", violations)
            .done();
    }
    if let Some(entropy) = session.and_then(Session::entropy) {
        line.section("entropy")
            .count("entropy_event_count", entropy.requests())
            .count("entropy_bytes", entropy.bytes())
            .count("host_rng_fails", entropy.host_failures())
            .done();
    }
    let drives = session.map_or(&[][..], Session::drives);
    let mut totals = [0u64; DRIVE_FIELDS.len()];
    for drive in drives {
        let values = drive_values(&drive.counters);
        for (total, value) in totals.iter_mut().zip(values) {
            *total += value;
        }
        add_counters(line, &format!("block_{}", drive.id), &DRIVE_FIELDS, values);
    }
    if !drives.is_empty() {
        add_counters(line, "block", &DRIVE_FIELDS, totals);
    }
    if let Some(vsock) = session.and_then(Session::vsock) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        line.section("vsock")
            .count("rx_packets_count", load(&vsock.rx_packets))
            .count("rx_bytes_count", load(&vsock.rx_bytes))
            .count("tx_packets_count", load(&vsock.tx_packets))
            .count("tx_bytes_count", load(&vsock.tx_bytes))
            .count("conns_added", load(&vsock.conns_added))
            .count("conns_killed", load(&vsock.conns_killed))
            .count("conns_removed", load(&vsock.conns_removed))
            .count("malformed_packets", load(&vsock.malformed))
            .done();
    }
    let interfaces = session.map_or(&[][..], Session::network_interfaces);
    let mut totals = [0u64; NET_FIELDS.len()];
    for interface in interfaces {
        let values = net_values(&interface.counters);
        for (total, value) in totals.iter_mut().zip(values) {
            *total += value;
        }
        add_counters(line, &format!("net_{}", interface.id), &NET_FIELDS, values);
    }
    if !interfaces.is_empty() {
        add_counters(line, "net", &NET_FIELDS, totals);
    }
}

/// Firecracker's names of an interface's counters.
const NET_FIELDS: [&str; 10] = [
    "rx_bytes_count",
    "rx_packets_count",
    "rx_fails",
    "rx_rate_limiter_throttled",
    "tx_bytes_count",
    "tx_packets_count",
    "tx_fails",
    "tx_malformed_frames",
    "tx_rate_limiter_throttled",
    "rx_malformed_buffers",
];

/// An interface's totals, in the order of [`NET_FIELDS`].
fn net_values(counters: &NetCounters) -> [u64; NET_FIELDS.len()] {
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    [
        load(&counters.rx_bytes),
        load(&counters.rx_packets),
        load(&counters.rx_fails),
        load(&counters.rx_rate_limiter_throttled),
        load(&counters.tx_bytes),
        load(&counters.tx_packets),
        load(&counters.tx_fails),
        load(&counters.tx_malformed_frames),
        load(&counters.tx_rate_limiter_throttled),
        load(&counters.rx_malformed_buffers),
    ]
}

/// A drive's totals, in the order of [`DRIVE_FIELDS`].
fn drive_values(counters: &BlockCounters) -> [u64; DRIVE_FIELDS.len()] {
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    [
        load(&counters.reads),
        load(&counters.writes),
        load(&counters.flushes),
        load(&counters.read_bytes),
        load(&counters.written_bytes),
        load(&counters.failed),
        load(&counters.rate_limiter_throttled),
        load(&counters.io_engine_throttled),
    ]
}

/// Firecracker's names of a drive's counters.
const DRIVE_FIELDS: [&str; 8] = [
    "read_count",
    "write_count",
    "flush_count",
    "read_bytes",
    "write_bytes",
    "execute_fails",
    "rate_limiter_throttled_events",
    "io_engine_throttled_events",
];

/// A section of counters named `fields`.
fn add_counters<const N: usize>(
    line: &mut MetricsLine<'_>,
    name: &str,
    fields: &[&str; N],
    values: [u64; N],
) {
    let mut section = line.section(name);
    for (field, value) in fields.iter().zip(values) {
        section.count(field, value);
    }
    section.done();
}

/// What is ours: the VM's state, guest memory and its pool, the balloon's sizes.
fn ours(session: Option<&Session>) -> Value {
    let Some(session) = session else {
        return json!({ "state": InstanceState::NotStarted });
    };
    let mut ours = Map::new();
    if let Ok(info) = session.machine_info() {
        ours.insert("state".into(), json!(InstanceState::from(info.state)));
    }
    if let Ok(memory) = session.memory_info() {
        ours.insert(
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
        if let Some(zone) = &memory.zone {
            ours.insert("zone".into(), json!(zone));
        }
    }
    if let Ok(balloon) = session.balloon() {
        ours.insert(
            "balloon".into(),
            json!({
                "target_mib": balloon.amount_mib,
                "actual_mib": balloon.actual_mib,
                "needs_reset": balloon.needs_reset,
            }),
        );
    }
    Value::Object(ours)
}

#[cfg(test)]
mod tests;
