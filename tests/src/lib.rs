//! End-to-end tests of llfree-vmm (under `tests/`) and the helpers they share.

use std::path::Path;

/// Whether KVM is usable here; prints `SKIP: <test>: ...` and returns `false` when it is not.
pub fn kvm_available(test: &str) -> bool {
    let available = Path::new("/dev/kvm").exists();
    if !available {
        eprintln!("SKIP: {test}: /dev/kvm is absent");
    }
    available
}

/// Whether the host has hardware virtualization (`vmx` or `svm` in /proc/cpuinfo), which a
/// stock Linux guest needs; otherwise why not (e.g. PVM, which only runs our own guest code).
pub fn hardware_virtualization() -> Result<(), String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").map_err(|e| e.to_string())?;
    let hardware = cpuinfo
        .lines()
        .filter(|line| line.starts_with("flags"))
        .any(|line| line.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if !hardware {
        return Err("no vmx or svm in /proc/cpuinfo (e.g. PVM): a stock kernel cannot boot".into());
    }
    Ok(())
}
