//! Builds the test guest (guest/main.rs) into `$OUT_DIR/testguest.elf` with `rustc` directly:
//! `no_std`, `panic=abort`, statically linked at 1 MiB by guest/link.ld, for the host target
//! (x86_64 Linux, which the guest never calls into: it only needs the same CPU).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let source = manifest_dir.join("guest/main.rs");
    let script = manifest_dir.join("guest/link.ld");
    // The files the guest shares with the VMM.
    let protocol = manifest_dir.join("src/testguest/protocol.rs");
    let registers = manifest_dir.join("src/devices/virtio/mmio/registers.rs");
    // The guest directory as a whole: main.rs and its modules (balloon.rs).
    let guest_dir = manifest_dir.join("guest");
    for path in [&guest_dir, &source, &script, &protocol, &registers] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let output = out_dir.join("testguest.elf");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let link_arg = |arg: &str| format!("link-arg={arg}");
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "bin",
            "--crate-name",
            "testguest",
        ])
        .args(["-C", "panic=abort", "-C", "opt-level=s", "-C", "lto=fat"])
        .args(["-C", "codegen-units=1", "-C", "debuginfo=0"])
        .args(["-C", "relocation-model=static"])
        // KVM's instruction emulator, which runs every guest instruction under PVM, has no SSE.
        // rustc warns that x86_64's float ABI needs SSE2: the guest uses no floating point.
        .args(["-C", "target-feature=-sse,-sse2"])
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
        .arg(&output)
        .arg(&source)
        .status()
        .expect("cannot run rustc to build the test guest");
    assert!(status.success(), "building the test guest failed: {status}");
}
