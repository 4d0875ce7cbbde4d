//! Builds the test guest into `$OUT_DIR/testguest.elf` with `rustc` directly, in two steps: this
//! crate's library (the protocol) as an rlib for the guest, then guest/main.rs against it. Both
//! are `no_std`, `panic=abort` and without SSE; the program is statically linked at 1 MiB by
//! guest/link.ld, for the host target (x86_64 Linux, which the guest never calls into: it only
//! needs the same CPU). Cargo cannot build it itself: the workspace's profiles unwind, and a
//! freestanding binary cannot.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The code generation flags of both steps.
const CODEGEN: &[&str] = &[
    "-C",
    "panic=abort",
    "-C",
    "opt-level=s",
    "-C",
    "codegen-units=1",
    "-C",
    "debuginfo=0",
    "-C",
    "relocation-model=static",
    // KVM's instruction emulator, which runs every guest instruction under PVM, has no SSE.
    // rustc warns that x86_64's float ABI needs SSE2: the guest uses no floating point.
    "-C",
    "target-feature=-sse,-sse2",
];

fn rustc() -> Command {
    let mut command = Command::new(env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc")));
    command.args(["--edition", "2021"]).args(CODEGEN);
    command
}

fn run(mut command: Command, what: &str) {
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("cannot run rustc to build {what}: {e}"));
    assert!(status.success(), "building {what} failed: {status}");
}

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let library = manifest_dir.join("src/lib.rs");
    let guest = manifest_dir.join("guest");
    let script = guest.join("link.ld");
    println!("cargo::rustc-check-cfg=cfg(test_guest_build)");
    for path in [&manifest_dir.join("src"), &guest] {
        println!("cargo:rerun-if-changed={}", path.display());
    }

    let rlib = out_dir.join("libtest_guest.rlib");
    let mut build_library = rustc();
    build_library
        .args(["--crate-type", "rlib", "--crate-name", "test_guest"])
        .args(["--cfg", "test_guest_build"])
        .arg("-o")
        .arg(&rlib)
        .arg(&library);
    run(build_library, "the test guest's library");

    let link_arg = |arg: &str| format!("link-arg={arg}");
    let mut build_guest = rustc();
    build_guest
        .args(["--crate-type", "bin", "--crate-name", "testguest"])
        .args(["-C", "lto=fat"])
        .arg("--extern")
        .arg(extern_arg(&rlib))
        .args([
            "-C",
            &link_arg("-nostartfiles"),
            "-C",
            &link_arg("-nostdlib"),
        ])
        .args([
            "-C",
            &link_arg("-static"),
            "-C",
            &link_arg("-Wl,--build-id=none"),
        ])
        .arg("-C")
        .arg(link_arg(&format!("-Wl,-T,{}", script.display())))
        .arg("-o")
        .arg(out_dir.join("testguest.elf"))
        .arg(guest.join("main.rs"));
    run(build_guest, "the test guest");
}

/// `test_guest=PATH` for `--extern`.
fn extern_arg(rlib: &Path) -> OsString {
    let mut arg = OsString::from("test_guest=");
    arg.push(rlib);
    arg
}
