//! Shared by the end-to-end tests that start VMMs through `vmm-jailer`: the jailed identity,
//! a jailer started with its output in files, the root it builds, the built-in guest run
//! jailed.

#![allow(dead_code)] // Each test file uses its own part.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use e2e_tests::{jailer_binary, vmm_binary, Scratch};

/// The uid the jailed VMMs run as.
pub const UID: u32 = 4242;
/// The gid the jailed VMMs run as.
pub const GID: u32 = 4243;

/// A jailer started with `args` then `-- vmm_args`, its stdout and stderr in files of
/// `scratch`.
pub fn start_jailed(scratch: &Scratch, name: &str, args: &[&str], vmm_args: &[&str]) -> Child {
    let base = scratch.path("jail");
    let mut command = Command::new(jailer_binary());
    command
        .args(["--id", name, "--exec-file", vmm_binary()])
        .args(["--uid", &UID.to_string(), "--gid", &GID.to_string()])
        .args(["--chroot-base-dir", &base])
        .args(args)
        .arg("--")
        .args(vmm_args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(scratch.path(&format!("{name}.out"))).unwrap())
        .stderr(fs::File::create(scratch.path(&format!("{name}.err"))).unwrap());
    command.spawn().expect("start vmm-jailer")
}

/// The root the jailer builds for `name` under `scratch`'s jail directory.
pub fn root_of(scratch: &Scratch, name: &str) -> PathBuf {
    Path::new(&scratch.path("jail"))
        .join("vmm")
        .join(name)
        .join("root")
}

/// Runs the built-in guest jailed (`vmm run MEMORY` writing and verifying 8 MiB) to its end,
/// which must be status 0 with the guest done.
pub fn run_jailed_guest(scratch: &Scratch, name: &str, memory: &[&str]) {
    let mut vmm = vec!["run"];
    vmm.extend_from_slice(memory);
    vmm.extend(["--workload", "write:8M+8M,verify:8M+8M"]);
    let status = start_jailed(scratch, name, &[], &vmm).wait().unwrap();
    let out = fs::read_to_string(scratch.path(&format!("{name}.out"))).unwrap();
    let err = fs::read_to_string(scratch.path(&format!("{name}.err"))).unwrap();
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("test guest: done"), "{out}\n{err}");
}
