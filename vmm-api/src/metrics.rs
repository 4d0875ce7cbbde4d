//! The VMM's own counters for Firecracker's metrics (`PUT /metrics`): what the API served, what
//! the vCPUs exited for, how long pauses and snapshots took (the devices count theirs:
//! [`vmm_devices::metrics`]). One
//! VMM process runs one VM, so they are process-wide, as Firecracker's are; every counter is a
//! relaxed atomic add (no lock, no allocation on a vCPU's exit path). The counters only grow:
//! the VMM's metrics writer (`vmm::runner::metrics_file`) turns them into Firecracker's per-flush deltas.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use vmm_devices::metrics::Counter;

/// The shortest, longest and total time of something that happens often (Firecracker's
/// `LatencyAggregateMetrics`), in microseconds.
#[derive(Debug)]
pub struct Durations {
    min_us: AtomicU64,
    max_us: AtomicU64,
    sum_us: Counter,
}

impl Durations {
    const fn new() -> Self {
        Durations {
            min_us: AtomicU64::new(u64::MAX),
            max_us: AtomicU64::new(0),
            sum_us: Counter::new(),
        }
    }

    /// Records one that took `took`.
    pub fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.min_us.fetch_min(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
        self.sum_us.add(us);
    }

    /// The shortest (0 before the first), the longest and the total, in microseconds.
    pub fn get(&self) -> (u64, u64, u64) {
        let min = self.min_us.load(Ordering::Relaxed);
        (
            if min == u64::MAX { 0 } else { min },
            self.max_us.load(Ordering::Relaxed),
            self.sum_us.get(),
        )
    }
}

impl Default for Durations {
    fn default() -> Self {
        Self::new()
    }
}

/// Requests of one kind and how many of them failed (answered 400 or more).
#[derive(Debug, Default)]
pub struct Requests {
    /// Requests.
    pub count: Counter,
    /// Failed requests.
    pub fails: Counter,
}

impl Requests {
    const fn new() -> Self {
        Requests {
            count: Counter::new(),
            fails: Counter::new(),
        }
    }
}

/// Firecracker's names of the `GET` requests it counts, by the first segment of their path.
pub const GET_REQUESTS: [(&str, &str); 5] = [
    ("", "instance_info_count"),
    ("machine-config", "machine_cfg_count"),
    ("mmds", "mmds_count"),
    ("version", "vmm_version_count"),
    ("hotplug", "hotplug_memory_count"),
];

/// Firecracker's names of the `PUT` requests it counts (`NAME_count`, `NAME_fails`).
pub const PUT_REQUESTS: [(&str, &str); 13] = [
    ("actions", "actions"),
    ("boot-source", "boot_source"),
    ("drives", "drive"),
    ("logger", "logger"),
    ("machine-config", "machine_cfg"),
    ("cpu-config", "cpu_cfg"),
    ("metrics", "metrics"),
    ("network-interfaces", "network"),
    ("mmds", "mmds"),
    ("vsock", "vsock"),
    ("pmem", "pmem"),
    ("serial", "serial"),
    ("hotplug", "hotplug_memory"),
];

/// Firecracker's names of the `PATCH` requests it counts.
pub const PATCH_REQUESTS: [(&str, &str); 5] = [
    ("drives", "drive"),
    ("network-interfaces", "network"),
    ("machine-config", "machine_cfg"),
    ("mmds", "mmds"),
    ("hotplug", "hotplug_memory"),
];

/// What the API served.
#[derive(Debug)]
pub struct ApiMetrics {
    /// By [`GET_REQUESTS`].
    pub get: [Counter; GET_REQUESTS.len()],
    /// By [`PUT_REQUESTS`].
    pub put: [Requests; PUT_REQUESTS.len()],
    /// By [`PATCH_REQUESTS`].
    pub patch: [Requests; PATCH_REQUESTS.len()],
}

impl ApiMetrics {
    /// Counts a request for `target` (its path, perhaps with a query) answered with `status`.
    pub fn count(&self, method: &str, target: &str, status: u16) {
        let path = target.split('?').next().unwrap_or_default();
        let resource = path.trim_start_matches('/').split('/').next().unwrap_or("");
        let index = |table: &[(&str, &str)]| table.iter().position(|(r, _)| *r == resource);
        let requests = match method {
            "GET" => {
                if let Some(i) = index(&GET_REQUESTS) {
                    self.get[i].inc();
                }
                return;
            }
            "PUT" => index(&PUT_REQUESTS).map(|i| &self.put[i]),
            "PATCH" => index(&PATCH_REQUESTS).map(|i| &self.patch[i]),
            _ => None,
        };
        if let Some(requests) = requests {
            requests.count.inc();
            if status >= 400 {
                requests.fails.inc();
            }
        }
    }
}

/// Why vCPUs exited to the VMM, and how long the VMM took to handle it.
#[derive(Debug)]
pub struct VcpuMetrics {
    /// Port reads.
    pub exit_io_in: Counter,
    /// Port writes.
    pub exit_io_out: Counter,
    /// MMIO reads.
    pub exit_mmio_read: Counter,
    /// MMIO writes.
    pub exit_mmio_write: Counter,
    /// vCPUs that failed (their run ended with an error).
    pub failures: Counter,
    /// Handling port reads.
    pub exit_io_in_agg: Durations,
    /// Handling port writes.
    pub exit_io_out_agg: Durations,
    /// Handling MMIO reads.
    pub exit_mmio_read_agg: Durations,
    /// Handling MMIO writes.
    pub exit_mmio_write_agg: Durations,
}

/// Operations whose last duration Firecracker reports in `latencies_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A full snapshot was made.
    FullCreateSnapshot,
    /// A diff snapshot was made.
    DiffCreateSnapshot,
    /// A snapshot was loaded.
    LoadSnapshot,
    /// The VM was paused.
    PauseVm,
    /// The VM was resumed.
    ResumeVm,
}

impl Operation {
    /// Every operation, in the order of [`Self::name`]'s table.
    pub const ALL: [Operation; 5] = [
        Operation::FullCreateSnapshot,
        Operation::DiffCreateSnapshot,
        Operation::LoadSnapshot,
        Operation::PauseVm,
        Operation::ResumeVm,
    ];

    /// Firecracker's name (`vmm_` before it for the time inside the VMM).
    pub fn name(self) -> &'static str {
        match self {
            Operation::FullCreateSnapshot => "full_create_snapshot",
            Operation::DiffCreateSnapshot => "diff_create_snapshot",
            Operation::LoadSnapshot => "load_snapshot",
            Operation::PauseVm => "pause_vm",
            Operation::ResumeVm => "resume_vm",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where a duration of an [`Operation`] was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The whole API request, as its client waited for it.
    Api,
    /// Inside the VMM (Firecracker's `vmm_` names).
    Vmm,
}

/// The last duration of each [`Operation`] at each [`Level`], in microseconds.
#[derive(Debug)]
pub struct Latencies {
    api_us: [AtomicU64; Operation::ALL.len()],
    vmm_us: [AtomicU64; Operation::ALL.len()],
}

impl Latencies {
    /// Runs `work` and, where it succeeds, records how long it took as the latest `operation`
    /// at `level`.
    pub fn time<T, E>(
        &self,
        level: Level,
        operation: Operation,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let done = work();
        if done.is_ok() {
            self.record(level, operation, started.elapsed());
        }
        done
    }

    /// Records that `operation` took `took` at `level`.
    pub fn record(&self, level: Level, operation: Operation, took: Duration) {
        let slots = match level {
            Level::Api => &self.api_us,
            Level::Vmm => &self.vmm_us,
        };
        store_us(&slots[operation.index()], took);
    }

    /// The last durations of `operation` (request, inside the VMM), in microseconds.
    pub fn get(&self, operation: Operation) -> (u64, u64) {
        let i = operation.index();
        (
            self.api_us[i].load(Ordering::Relaxed),
            self.vmm_us[i].load(Ordering::Relaxed),
        )
    }
}

fn store_us(slot: &AtomicU64, took: Duration) {
    slot.store(
        u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// The metrics writer's own troubles.
#[derive(Debug)]
pub struct WriterMetrics {
    /// Flushes that could not be written whole (a full pipe nobody reads).
    pub missed_metrics_count: Counter,
    /// Flushes that failed otherwise.
    pub metrics_fails: Counter,
}

/// Every counter of the process.
#[derive(Debug)]
pub struct ProcessMetrics {
    /// The API.
    pub api: ApiMetrics,
    /// The vCPUs.
    pub vcpu: VcpuMetrics,
    /// Pauses, resumes and snapshots.
    pub latencies: Latencies,
    /// API requests whose handling panicked (answered 500).
    pub panic_count: Counter,
    /// System calls a seccomp filter denied (the VMM ends on the first).
    pub seccomp_faults: Counter,
    /// The metrics writer.
    pub writer: WriterMetrics,
    /// When the process started and how long it took until its API answered, in wall and CPU
    /// microseconds.
    startup: OnceLock<(Instant, OnceLock<(u64, u64)>)>,
    /// Where a jailer started the process: the wall and CPU microseconds it spent before.
    jailer: OnceLock<(u64, u64)>,
}

/// The process's counters.
pub static METRICS: ProcessMetrics = ProcessMetrics {
    api: ApiMetrics {
        get: [const { Counter::new() }; GET_REQUESTS.len()],
        put: [const { Requests::new() }; PUT_REQUESTS.len()],
        patch: [const { Requests::new() }; PATCH_REQUESTS.len()],
    },
    vcpu: VcpuMetrics {
        exit_io_in: Counter::new(),
        exit_io_out: Counter::new(),
        exit_mmio_read: Counter::new(),
        exit_mmio_write: Counter::new(),
        failures: Counter::new(),
        exit_io_in_agg: Durations::new(),
        exit_io_out_agg: Durations::new(),
        exit_mmio_read_agg: Durations::new(),
        exit_mmio_write_agg: Durations::new(),
    },
    latencies: Latencies {
        api_us: [const { AtomicU64::new(0) }; Operation::ALL.len()],
        vmm_us: [const { AtomicU64::new(0) }; Operation::ALL.len()],
    },
    panic_count: Counter::new(),
    seccomp_faults: Counter::new(),
    writer: WriterMetrics {
        missed_metrics_count: Counter::new(),
        metrics_fails: Counter::new(),
    },
    startup: OnceLock::new(),
    jailer: OnceLock::new(),
};

impl ProcessMetrics {
    /// Notes that the process starts now (the front end calls it first).
    pub fn process_started(&self) {
        let _ = self.startup.set((Instant::now(), OnceLock::new()));
    }

    /// Notes that a jailer started at `start_time_us` on the monotonic clock and used `cpu_us`
    /// of CPU before it exec'd this process (Firecracker's jailer passes both as
    /// `--start-time-us` and `--start-time-cpu-us`): the startup times count from its start.
    pub fn started_by_jailer(&self, start_time_us: u64, cpu_us: u64) {
        let Some((started, _)) = self.startup.get() else {
            return;
        };
        let since_start = monotonic_us().saturating_sub(start_time_us);
        let own = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let _ = self.jailer.set((since_start.saturating_sub(own), cpu_us));
    }

    /// Notes that the API answers from now on: the wall and CPU time since the process (or
    /// the jailer that started it) started (Firecracker's `process_startup_time_us` and
    /// `_cpu_us`).
    pub fn api_ready(&self) {
        let Some((started, ready)) = self.startup.get() else {
            return;
        };
        let (jailer_wall, jailer_cpu) = self.jailer.get().copied().unwrap_or_default();
        let wall = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let _ = ready.set((
            wall.saturating_add(jailer_wall),
            process_cpu_us().saturating_add(jailer_cpu),
        ));
    }

    /// The startup times of [`Self::api_ready`] (0 where unknown).
    pub fn startup_us(&self) -> (u64, u64) {
        self.startup
            .get()
            .and_then(|(_, ready)| ready.get().copied())
            .unwrap_or_default()
    }
}

/// The monotonic clock (which a jailer's `--start-time-us` reads too), in microseconds.
fn monotonic_us() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into `now`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64) * 1_000_000 + (now.tv_nsec as u64) / 1000
}

/// The CPU time the process has used, in microseconds.
fn process_cpu_us() -> u64 {
    // SAFETY: an all-zero rusage is valid, and getrusage writes only into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
    };
    us(usage.ru_utime) + us(usage.ru_stime)
}

#[cfg(test)]
mod tests;
