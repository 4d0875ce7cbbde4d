//! Shared by the API and CLI-client tests: a small in-test [`VmmControl`] that keeps a run
//! state and an optional balloon, and a server on a fresh socket path.

#![allow(dead_code)] // Each test file uses its own part.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use vmm_api::model::{
    BalloonInfo, BalloonStatistics, BalloonUpdate, CoreReservation, FaultLatencyInfo,
    GuestMemoryInfo, MachineInfo, MemoryInfo, PoolInfo, PopulateMode, VmState,
};
use vmm_api::{ApiServer, ControlError, VmmControl};

/// What `memory_info` panics with when told to.
pub const PANIC_ON_PURPOSE: &str = "memory_info failed on purpose";

/// A VMM stand-in that behaves like the real run control: pause/resume/shutdown change the
/// state, requests that do not fit the state are refused.
pub struct TestVmm {
    pub state: Mutex<VmState>,
    pub balloon: Option<Mutex<BalloonInfo>>,
    pub shutdowns: AtomicUsize,
    /// `memory_info` panics, to check that the server survives a failing VMM.
    pub panic_on_memory: bool,
}

impl TestVmm {
    pub fn new() -> Self {
        TestVmm {
            state: Mutex::new(VmState::Running),
            balloon: None,
            shutdowns: AtomicUsize::new(0),
            panic_on_memory: false,
        }
    }

    pub fn with_balloon() -> Self {
        TestVmm {
            balloon: Some(Mutex::new(BalloonInfo {
                amount_mib: 0,
                actual_mib: 0,
                deflate_on_oom: true,
                free_page_reporting: true,
                free_page_hinting: false,
                stats_polling_interval_s: 0,
                needs_reset: false,
                driver_violations: Default::default(),
            })),
            ..TestVmm::new()
        }
    }

    pub fn state(&self) -> VmState {
        *self.state.lock().unwrap()
    }

    fn balloon_lock(&self) -> Result<std::sync::MutexGuard<'_, BalloonInfo>, ControlError> {
        let balloon = self
            .balloon
            .as_ref()
            .ok_or(ControlError::BalloonNotConfigured)?;
        Ok(balloon.lock().unwrap())
    }
}

impl VmmControl for TestVmm {
    fn machine_info(&self) -> Result<MachineInfo, ControlError> {
        Ok(MachineInfo {
            zone_vm: None,
            vmm_version: "test".into(),
            state: self.state(),
            vcpu_count: 2,
            mem_size_mib: 256,
            backing: "hugetlb-2m".into(),
            frame_size_kib: 2048,
            populate: PopulateMode::Lazy,
            guest: "test-guest".into(),
            balloon: self.balloon.is_some(),
        })
    }

    fn memory_info(&self) -> Result<MemoryInfo, ControlError> {
        assert!(!self.panic_on_memory, "{PANIC_ON_PURPOSE}");
        Ok(MemoryInfo {
            pmem: None,
            zone: None,
            guest: GuestMemoryInfo {
                chunk_size_kib: 2048,
                chunks: 128,
                populated_chunks: 3,
                populated_bytes: 3 << 21,
                file_backed_chunks: 0,
                clone_of: None,
                faults: 3,
                exhausted_faults: 0,
                waiting_vcpus: 0,
                waiting_other_faults: 0,
                discarded_chunks: 0,
                mapped_ahead_chunks: 0,
                given_away_4k_pages: 0,
                fault_latency: FaultLatencyInfo::default(),
            },
            vcpus: Vec::new(),
            pool: PoolInfo {
                frame_size_kib: 2048,
                total_bytes: 256 << 20,
                free_bytes: (256 << 20) - (3 << 21),
                used_bytes: 3 << 21,
                free_4k_frames: ((256 << 20) - (3 << 21)) >> 12,
                used_4k_frames: (3 << 21) >> 12,
                free_2m_frames: 125,
                free_1g_frames: 0,
                reservation_slots: 4,
                reservations: vec![CoreReservation { core: 0, tree: 0 }],
                trees: Vec::new(),
            },
        })
    }

    fn pause(&self) -> Result<(), ControlError> {
        let mut state = self.state.lock().unwrap();
        match *state {
            VmState::Running | VmState::Paused => {
                *state = VmState::Paused;
                Ok(())
            }
            _ => Err(ControlError::InvalidState("the VM has stopped".into())),
        }
    }

    fn resume(&self) -> Result<(), ControlError> {
        let mut state = self.state.lock().unwrap();
        match *state {
            VmState::Running | VmState::Paused => {
                *state = VmState::Running;
                Ok(())
            }
            _ => Err(ControlError::InvalidState("the VM has stopped".into())),
        }
    }

    fn shutdown(&self) -> Result<(), ControlError> {
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
        *self.state.lock().unwrap() = VmState::Stopped;
        Ok(())
    }

    fn balloon(&self) -> Result<BalloonInfo, ControlError> {
        Ok(self.balloon_lock()?.clone())
    }

    fn update_balloon(&self, update: BalloonUpdate) -> Result<(), ControlError> {
        let mut balloon = self.balloon_lock()?;
        if let Some(amount) = update.amount_mib {
            if amount > 256 {
                return Err(ControlError::InvalidArgument(format!(
                    "amount_mib {amount} exceeds guest RAM (256 MiB)"
                )));
            }
            balloon.amount_mib = amount;
        }
        if let Some(interval) = update.stats_polling_interval_s {
            balloon.stats_polling_interval_s = interval;
        }
        Ok(())
    }

    fn balloon_statistics(&self) -> Result<BalloonStatistics, ControlError> {
        let balloon = self.balloon_lock()?;
        Ok(BalloonStatistics {
            target_mib: balloon.amount_mib,
            target_pages: balloon.amount_mib << 8,
            free_memory: Some(100 << 20),
            ..BalloonStatistics::default()
        })
    }
}

/// A fresh socket path in the temp dir, unique per test.
pub fn socket_path(test: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("vmm-{test}-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Serves `vmm` on a fresh socket for `test`.
pub fn serve(test: &str, vmm: TestVmm) -> (ApiServer, Arc<TestVmm>) {
    let vmm = Arc::new(vmm);
    let server = ApiServer::start(socket_path(test), vmm.clone()).expect("API server starts");
    (server, vmm)
}
