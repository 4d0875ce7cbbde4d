//! Shared by the balloon end-to-end tests: lazy guest-mem memory on an anonymous LLFree pool of
//! 2 MiB frames, and the test guest with a virtio-balloon wired as `vmm run` wires it (the
//! runner's `VirtioMmioDevices`: the first virtio-mmio slot, irqfd, ioeventfds) whose queues and
//! statistics timer an event-loop thread processes.

#![allow(dead_code)] // Each test file uses its own part.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use guest_mem::{Backing, GuestMemory, MemoryConfig, Pool, PoolConfig, PoolStats};
use virtio_balloon::BalloonConfig;
use vm_memory::GuestAddress;
use vmm::layout::{virtio_mmio_base, BALLOON_SLOT};
use vmm::runner::VirtioMmioDevices;
use vmm::testguest::protocol::{BALLOON_DRIVER_FEATURES, WORKLOAD_MIN_ADDR};
use vmm::testguest::{self, GuestReport, RunOptions, Workload};
use vmm_devices::balloon::testing::EventLoopThread;
use vmm_devices::balloon::BalloonHandle;

pub const MIB: u64 = 1 << 20;

/// The balloon's MMIO address: its transport is the first (and only) virtio-mmio device.
pub fn balloon_base() -> u64 {
    virtio_mmio_base(BALLOON_SLOT).expect("the balloon's slot exists")
}

/// Lazily populated guest RAM `[0, ram)` for `vcpus` vCPUs on a pool of `pool` bytes.
pub fn guest_memory(ram: u64, pool: u64, vcpus: usize) -> Arc<GuestMemory> {
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, pool)).expect("pool");
    let config = MemoryConfig::new(vec![(GuestAddress(0), ram)], vcpus);
    Arc::new(GuestMemory::new(pool, config).expect("guest memory"))
}

/// The balloon options of most tests: everything on, statistics every 50 ms.
pub fn balloon_config() -> BalloonConfig {
    BalloonConfig {
        deflate_on_oom: true,
        free_page_reporting: true,
        stats_interval: Some(Duration::from_millis(50)),
        ..BalloonConfig::default()
    }
}

/// A workload that writes `pattern` to all of guest RAM `[WORKLOAD_MIN_ADDR, ram)`, reaches
/// checkpoint 1 and probes the balloon with every feature the test guest's driver knows.
pub fn probed_workload(ram: u64, pattern: u64) -> Workload {
    Workload::new()
        .write(WORKLOAD_MIN_ADDR, ram - WORKLOAD_MIN_ADDR, pattern)
        .checkpoint(1)
        .balloon_probe(balloon_base(), ram, BALLOON_DRIVER_FEATURES)
}

/// A checkpoint hook that can reach the balloon.
pub type BalloonHook = Box<dyn Fn(u64, &BalloonHandle) + Send + Sync>;

/// The outcome of a run with a balloon.
pub struct BalloonRun {
    pub report: GuestReport,
    pub balloon: BalloonHandle,
}

/// Runs `workload` on `memory` with a balloon of `config`; `on_checkpoint` runs at checkpoints.
pub fn run(
    memory: &Arc<GuestMemory>,
    vcpus: usize,
    config: BalloonConfig,
    workload: &Workload,
    on_checkpoint: Option<BalloonHook>,
) -> BalloonRun {
    let attached: Arc<Mutex<Option<(BalloonHandle, EventLoopThread)>>> = Arc::default();
    let slot = attached.clone();
    let device_memory = memory.clone();
    let tid_memory = memory.clone();
    let hook_slot = attached.clone();
    let options = RunOptions {
        timeout: Duration::from_secs(240),
        add_devices: Some(Box::new(move |vm, buses| {
            let mut devices = VirtioMmioDevices::new();
            let handle = devices
                .add_balloon(device_memory, config)
                .map_err(|e| e.to_string())?;
            devices.attach(vm, buses).map_err(|e| e.to_string())?;
            let events =
                EventLoopThread::start(devices.take_subscribers()).map_err(|e| e.to_string())?;
            *slot.lock().unwrap() = Some((handle, events));
            Ok(())
        })),
        on_start: Some(Box::new(move |vm| {
            for (index, tid) in vm.vcpu_tids().iter().enumerate() {
                tid_memory.register_vcpu_tid(index, *tid).expect("vCPU");
            }
        })),
        on_checkpoint: on_checkpoint.map(|hook| {
            let hook: vmm::testguest::CheckpointHook = Arc::new(move |id| {
                let handle = hook_slot.lock().unwrap().as_ref().map(|(h, _)| h.clone());
                hook(id, &handle.expect("the balloon is attached"));
            });
            hook
        }),
        ..RunOptions::default()
    };
    let report = testguest::run_with(memory.clone(), vcpus, workload, options).expect("run");
    let (balloon, events) = attached.lock().unwrap().take().expect("attached");
    drop(events);
    BalloonRun { report, balloon }
}

/// Runs `workload` on `memory` with one vCPU and a balloon of [`balloon_config`]; at each
/// checkpoint, `sample(checkpoint, memory)` is kept. Returns the run and the samples in order.
pub fn run_sampled<T: Send + 'static>(
    memory: &Arc<GuestMemory>,
    workload: &Workload,
    sample: impl Fn(u64, &GuestMemory) -> T + Send + Sync + 'static,
) -> (BalloonRun, Vec<T>) {
    let samples: Arc<Mutex<Vec<T>>> = Arc::default();
    let hook_samples = samples.clone();
    let hook_memory = memory.clone();
    let run = run(
        memory,
        1,
        balloon_config(),
        workload,
        Some(Box::new(move |id, _| {
            let taken = sample(id, &hook_memory);
            hook_samples.lock().unwrap().push(taken);
        })),
    );
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    (run, samples)
}

/// Trees of the pool (64 MiB each) with every frame free.
pub fn free_trees(stats: &PoolStats) -> usize {
    stats
        .trees
        .iter()
        .filter(|t| t.free_frames == 16384)
        .count()
}

/// Free bytes of the memory's pool.
pub fn pool_free(memory: &GuestMemory) -> u64 {
    memory.pool().stats().free_bytes
}
