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
