//! The `vmm` binary itself: its help, version and usage errors, without KVM. (The end-to-end
//! tests under tests/ run this same binary; having this test makes `cargo test` build it.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::process::{Command, Output};

fn vmm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmm"))
        .args(args)
        .output()
        .expect("run vmm")
}

#[test]
fn help_lists_the_subcommands_and_every_exit_status() {
    let help = vmm(&["--help"]);
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    for subcommand in ["run", "api", "info", "memory", "pause", "resume", "balloon"] {
        assert!(
            text.contains(&format!("\n  {subcommand} ")),
            "{subcommand}: {text}"
        );
    }
    for status in vmm_cli::EXIT_STATUS_HELP.lines() {
        assert!(text.contains(status), "{status:?} missing from {text}");
    }
}

#[test]
fn version_and_usage_errors() {
    let version = vmm(&["--version"]);
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8(version.stdout).unwrap(),
        format!("vmm {}\n", env!("CARGO_PKG_VERSION"))
    );
    let bad = vmm(&["run", "--vcpus", "0"]);
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(bad.stderr).unwrap(),
        "error: --vcpus 0: must be between 1 and 254\n"
    );
}
