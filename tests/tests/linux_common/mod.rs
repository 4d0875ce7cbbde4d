//! Shared by the real-Linux tests: the guest they boot and the lines its init prints.
//!
//! The guest is the kernel and initramfs that `tests/linux-nested/run.sh` builds (Linux 6.1,
//! tinyconfig plus `tests/linux-nested/l2.config`, busybox and `tests/linux-nested/l2-init`),
//! named by `LLFREE_VMM_TEST_KERNEL` (its bzImage), `LLFREE_VMM_TEST_VMLINUX` (the same
//! kernel's ELF image, with a PVH entry note) and `LLFREE_VMM_TEST_INITRD`. `llfree.test=NAME` on the
//! command line picks what its init does; it reports in lines starting with `LLFREE-L2 `.
//! Without hardware virtualization (vmx or svm) or without the guest, the tests print SKIP:
//! run.sh runs them for real, nested in QEMU where the host has neither.
#![allow(dead_code)] // Each test file uses its own part.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e_tests::{hardware_virtualization, kvm_available};
use serde_json::json;
use vmm::boot::DEFAULT_CMDLINE;
use vmm_cli::ApiClient;

/// How long a boot to init may take: under QEMU/TCG (nested) a boot takes 5 to 20 s.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// The kernel and initramfs of the real-Linux tests.
pub struct LinuxGuest {
    /// The kernel (bzImage).
    pub kernel: String,
    /// The same kernel's ELF image (it boots through PVH).
    pub vmlinux: String,
    /// The initramfs with `l2-init`.
    pub initrd: String,
}

impl LinuxGuest {
    /// The guest, or `None` after a SKIP line saying why `test` cannot boot it here.
    pub fn find(test: &str) -> Option<Self> {
        if !kvm_available(test) {
            return None;
        }
        match Self::from_env() {
            Ok(guest) => Some(guest),
            Err(why) => {
                eprintln!("SKIP: {test}: {why}; tests/linux-nested/run.sh runs it for real");
                None
            }
        }
    }

    fn from_env() -> Result<Self, String> {
        hardware_virtualization()?;
        let var = |name: &str| {
            let path = std::env::var(name).map_err(|_| format!("{name} is not set"))?;
            if Path::new(&path).is_file() {
                Ok(path)
            } else {
                Err(format!("{name}: {path} is not a file"))
            }
        };
        Ok(LinuxGuest {
            kernel: var("LLFREE_VMM_TEST_KERNEL")?,
            vmlinux: var("LLFREE_VMM_TEST_VMLINUX")?,
            initrd: var("LLFREE_VMM_TEST_INITRD")?,
        })
    }

    /// `vmm run` arguments that boot the guest with `args` after them.
    pub fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec!["--kernel", &self.kernel, "--initrd", &self.initrd];
        all.extend_from_slice(args);
        all
    }
}

/// The default command line with `extra` (`llfree.*` options for the guest's init).
pub fn cmdline(extra: &str) -> String {
    format!("{DEFAULT_CMDLINE} {extra}")
}

/// `len` pseudo-random bytes (xorshift from `seed`), the same each run.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// The MD5 of the file at `path`, by busybox's md5sum (the guest's own tool).
pub fn md5_of_file(path: &str) -> String {
    let output = std::process::Command::new("md5sum")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("md5sum {path}: {e}"));
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("md5sum {path} printed nothing"))
        .to_owned()
}

/// The value of `name=VALUE` in an `LLFREE-L2` line.
pub fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
}

/// Runs a tool of L1 (busybox's `ip`, `tunctl`, `ping`) with `args` in the calling thread's
/// network namespace; panics unless it succeeds.
pub fn run_tool(program: &str, args: &str) {
    let status = Command::new(program)
        .args(args.split(' '))
        .status()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(status.success(), "{program} {args}");
}

/// Moves the calling test thread into a network namespace of its own: every packet of its
/// taps stays there.
pub fn private_network() {
    // SAFETY: unshare(CLONE_NEWNET) moves only the calling thread into a new namespace.
    let done = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(done, 0, "unshare: {}", std::io::Error::last_os_error());
}

/// Makes tap `name` in the calling thread's network namespace, up, with the host's address
/// `cidr` (address/prefix) on it.
pub fn add_tap(name: &str, cidr: &str) {
    run_tool("tunctl", &format!("-t {name}"));
    run_tool("ip", &format!("link set {name} up"));
    run_tool("ip", &format!("addr add {cidr} dev {name}"));
}

/// A Linux VM with a network interface and MMDS, as Firecracker's users configure one.
pub struct NetworkedVm<'a> {
    /// Its kernel command line.
    pub cmdline: &'a str,
    /// The host's tap of its eth0.
    pub tap: &'a str,
    /// The MAC of its eth0.
    pub mac: &'a str,
    /// MMDS's version on eth0 (`V1`, `V2`).
    pub mmds_version: &'a str,
    /// MMDS's document.
    pub mmds: serde_json::Value,
}

/// Configures `vm` of `guest` through `api` (1 vCPU and 128 MiB, the boot source, eth0 on its
/// tap, MMDS on eth0 and its document) and starts it; each request must answer 204.
pub fn start_networked(api: &ApiClient, guest: &LinuxGuest, vm: NetworkedVm) {
    let requests = [
        (
            "/machine-config",
            json!({"vcpu_count": 1, "mem_size_mib": 128}),
        ),
        (
            "/boot-source",
            json!({"kernel_image_path": guest.kernel, "initrd_path": guest.initrd,
                   "boot_args": vm.cmdline}),
        ),
        (
            "/network-interfaces/eth0",
            json!({"iface_id": "eth0", "host_dev_name": vm.tap, "guest_mac": vm.mac}),
        ),
        (
            "/mmds/config",
            json!({"version": vm.mmds_version, "network_interfaces": ["eth0"]}),
        ),
        ("/mmds", vm.mmds),
        ("/actions", json!({"action_type": "InstanceStart"})),
    ];
    for (path, body) in requests {
        let response = api.request("PUT", path, Some(&body.to_string())).unwrap();
        assert_eq!(response.status, 204, "PUT {path}: {}", response.body);
    }
}
