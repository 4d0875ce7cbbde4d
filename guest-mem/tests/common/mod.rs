//! What guest-mem's end-to-end tests share: the KVM harness of `guest_mem::testing`, with SKIP
//! when KVM is not usable here.
#![allow(dead_code, unused_imports)] // Each test file uses its own part.

use std::path::{Path, PathBuf};
use std::sync::Once;

use guest_mem::testing::{self, KvmError};
use guest_mem::{GuestMemory, MemoryConfig};
use vm_memory::GuestAddress;

pub use guest_mem::testing::{touch, HugePageReservation, Touch, TouchError};

/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// Pages of 4 KiB in `[addr, addr + len)` that are resident and mapped (mincore).
pub fn resident_pages(addr: usize, len: u64) -> usize {
    let mut pages = vec![0u8; (len / 4096) as usize];
    // SAFETY: `pages` has one byte per 4 KiB page of the range.
    let rc = unsafe { libc::mincore(addr as *mut _, len as usize, pages.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    pages.iter().filter(|&&p| p & 1 != 0).count()
}

/// Guest memory of `size` bytes at guest address 0 for `vcpus` vCPUs, kicked by
/// [`kick_signal`] when a fault cannot be resolved.
pub fn memory_config(size: u64, vcpus: usize) -> MemoryConfig {
    let mut config = MemoryConfig::new(vec![(GuestAddress(0), size)], vcpus);
    config.kick_signal = Some(kick_signal());
    config
}

/// A VM whose memory slots are the regions of a guest memory, with the touch program loaded.
pub struct RegionVm(testing::TouchVm);

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// The signal guest-mem sends to a vCPU whose fault cannot be resolved (handler installed).
pub fn kick_signal() -> i32 {
    static INSTALL: Once = Once::new();
    let signal = vmm_sys_util::signal::SIGRTMIN();
    INSTALL.call_once(|| {
        vmm_sys_util::signal::register_signal_handler(signal, on_kick).expect("signal handler")
    });
    signal
}

impl RegionVm {
    /// A VM over `memory`; `None` (after a SKIP line) when KVM is not usable here.
    pub fn new(memory: &GuestMemory) -> Option<Self> {
        match testing::TouchVm::new(memory) {
            Ok(vm) => Some(Self(vm)),
            Err(e @ KvmError::Unavailable(_)) => {
                eprintln!("SKIP: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs the touch program on a new vCPU `index`, on the calling thread (registered with
    /// `memory` as that vCPU). Returns the OR of the old values.
    pub fn run(&self, memory: &GuestMemory, index: usize, touch: Touch) -> Result<u32, TouchError> {
        self.0.run(memory, index, touch)
    }

    /// Like [`RegionVm::run`], but the vCPU leaves fault errors to the caller, as a VMM's vCPU loop
    /// leaves them to its event loop: a KVM_RUN interrupted by a kick is entered again.
    pub fn run_leaving_faults_to_the_vmm(
        &self,
        memory: &GuestMemory,
        index: usize,
        touch: Touch,
    ) -> Result<u32, TouchError> {
        self.0.vcpu_of(memory, index)?.run(touch, None)
    }

    /// Runs each of `touches` on its own vCPU (vCPU `i` runs `touches[i]`), each on a thread
    /// of its own; returns their results in that order.
    pub fn run_in_parallel(
        &self,
        memory: &GuestMemory,
        touches: &[Touch],
    ) -> Vec<Result<u32, TouchError>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = touches
                .iter()
                .enumerate()
                .map(|(i, &touch)| s.spawn(move || self.run(memory, i, touch)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("join"))
                .collect()
        })
    }
}

/// A file path for one test, the file removed before and after.
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// `guest-mem-NAME-PID` in cargo's temporary directory for tests (or the system's).
    pub fn new(name: &str) -> Self {
        let dir =
            std::env::var_os("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, PathBuf::from);
        Self::in_dir(&dir, name)
    }

    /// `guest-mem-NAME-PID` in `dir`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        let path = dir.join(format!("guest-mem-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A hugetlbfs mount of one page size in the temporary directory, with huge pages reserved
/// for it: unmounted, removed and the reservation put back when dropped.
pub struct HugetlbfsMount {
    /// The mount point.
    pub path: PathBuf,
    _pages: HugePageReservation,
}

impl HugetlbfsMount {
    /// Mounts hugetlbfs with pages of `kib` KiB, `pages` of them reserved; the error says why
    /// it cannot be had (for a SKIP line).
    pub fn new(kib: u64, pages: u64) -> Result<Self, String> {
        let pages = HugePageReservation::reserve(kib, pages)?;
        let path =
            std::env::temp_dir().join(format!("guest-mem-hugetlbfs-{kib}-{}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| format!("mount point: {e}"))?;
        let status = std::process::Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", &format!("pagesize={kib}K"), "none"])
            .arg(&path)
            .status();
        if !status.is_ok_and(|s| s.success()) {
            let _ = std::fs::remove_dir(&path);
            return Err("cannot mount hugetlbfs (not root?)".into());
        }
        Ok(Self {
            path,
            _pages: pages,
        })
    }
}

impl Drop for HugetlbfsMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.path)
            .status();
        let _ = std::fs::remove_dir(&self.path);
    }
}
