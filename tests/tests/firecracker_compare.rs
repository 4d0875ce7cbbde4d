//! End-to-end: the side-by-side harness of `tests/firecracker-compare/run.sh`
//! (`firecracker-compare`) on every host, with our `vmm` in Firecracker's place (it takes
//! Firecracker's requests: a Full snapshot into a memory file, a load from it): every row is
//! measured, and each loaded guest verified all of its memory.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::process::Command;

use e2e_tests::{kvm_available, vmm_binary, Scratch};

#[test]
fn the_harness_measures_every_row_with_a_vmm_in_firecracker_s_place() {
    let test = "the_harness_measures_every_row_with_a_vmm_in_firecracker_s_place";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("firecracker-compare");
    let output = Command::new(env!("CARGO_BIN_EXE_firecracker-compare"))
        .args(["--firecracker", vmm_binary(), "--runs", "2", "--sizes", "1"])
        .args(["--clones", "3", "--clone-mib", "32"])
        .args(["--dir", &scratch.path("")])
        .env("LLFREE_VMM_BIN", vmm_binary())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:#?}");
    for row in [
        "| spawn to API socket (2 runs) |",
        "| spawn to InstanceStart answered (128 MiB) |",
        "| spawn to the guest's first console line |",
        "| 1 GiB, every page written: snapshot create (paused) |",
        "| 1 GiB: load to running |",
        "| 1 GiB: load and read every page back (verified) |",
        "| 3 clones of a 32 MiB guest, every page written; ours from a copy snapshot |",
        "| 3 clones of a 32 MiB guest, every page written; ours from a zone snapshot |",
        "| PSS per idle clone, MiB (median) |",
    ] {
        assert!(stdout.contains(row), "no row {row}: {stdout}");
    }
    // A bad option is named, and nothing runs.
    let refused = Command::new(env!("CARGO_BIN_EXE_firecracker-compare"))
        .args(["--firecracker", vmm_binary(), "--populate", "sometimes"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "error: --populate is lazy or eager\n"
    );
    let refused = Command::new(env!("CARGO_BIN_EXE_firecracker-compare"))
        .args(["--runs", "1"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "error: --firecracker PATH or --cloud-hypervisor PATH (or both) is required\n"
    );
    // Nothing left behind in the scratch directory.
    let left: Vec<_> = std::fs::read_dir(scratch.path("")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}
