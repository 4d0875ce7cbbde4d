//! End-to-end, real Linux: the Firecracker Go SDK (the program of `tests/firecracker-sdk`,
//! built by `tests/linux-nested/run.sh` and named by `LLFREE_VMM_FC_SDK`) boots Linux from a
//! root drive as Firecracker's users do (a kernel, no initrd, an ext4 root file system on a
//! virtio-blk drive), reads the guest's balloon statistics, pauses, snapshots, restores into a
//! new VMM process, resumes and shuts it down with Ctrl-Alt-Del. Then `vmm run --drive ...,ro=on`
//! boots the same image read-only and finds what the first boot wrote. (See linux_common for the
//! kernel and where this runs.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::path::Path;
use std::process::Command;

use e2e_tests::run_sdk_program;
use linux_common::{field, LinuxGuest, BOOT_TIMEOUT};
use vmm::boot::DEFAULT_CMDLINE;
use vmm_common::{vmm_binary, Scratch, VmmRun};

/// The root file system's /sbin/init: reports in lines starting with `LLFREE-ROOT `. On a
/// writable root it counts its boots in /boots and waits for Ctrl-Alt-Del, on which it remounts
/// the root read-only (a clean file system) and reboots; on a read-only root it reports and
/// reboots.
const INIT: &str = r#"#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
dmesg -n 1
# Ctrl-Alt-Del comes to init as SIGINT (the kernel would reset at once, the journal unclean).
echo 0 >/proc/sys/kernel/ctrl-alt-del
say() { echo "LLFREE-ROOT $*"; }
boots=$(cat /boots 2>/dev/null || echo 0)
if touch /probe 2>/dev/null; then
    ro=0
    rm /probe
    echo $((boots + 1)) >/boots
    sync
else
    ro=1
fi
say "ready boots=$boots ro=$ro marker=$(cat /marker) root=$(awk '$2 == "/" { print $1 }' /proc/mounts | tail -n 1)"
[ "$ro" = 1 ] && reboot -f
trap 'say ctrl-alt-del; mount -o remount,ro /; reboot -f' INT
while :; do sleep 1; done
"#;

/// The busybox applets the init uses.
const APPLETS: [&str; 12] = [
    "sh", "mount", "dmesg", "echo", "cat", "touch", "rm", "sync", "awk", "tail", "reboot", "sleep",
];

/// The first of `candidates` that exists.
fn find(candidates: &[&str]) -> Option<String> {
    candidates
        .iter()
        .find(|path| Path::new(path).is_file())
        .map(|path| (*path).to_owned())
}

/// An ext4 image at `image` holding busybox, the init and a marker file.
fn root_file_system(scratch: &Scratch, image: &str) {
    let tree = scratch.path("rootfs");
    for dir in ["bin", "sbin", "proc", "sys", "dev", "tmp"] {
        std::fs::create_dir_all(Path::new(&tree).join(dir)).unwrap();
    }
    let busybox = find(&["/bin/busybox", "/usr/bin/busybox"]).expect("busybox");
    std::fs::copy(busybox, Path::new(&tree).join("bin/busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", Path::new(&tree).join("bin").join(applet)).unwrap();
    }
    let init = Path::new(&tree).join("sbin/init");
    std::fs::write(&init, INIT).unwrap();
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(Path::new(&tree).join("marker"), "llfree-root\n").unwrap();
    // L1 of the nested run has mke2fs as mke2fs.real.
    let mke2fs = find(&["/bin/mke2fs.real", "/sbin/mke2fs", "/usr/sbin/mke2fs"]).expect("mke2fs");
    let made = Command::new(mke2fs)
        .args(["-q", "-F", "-t", "ext4", "-d", &tree, image, "64M"])
        .output()
        .expect("run mke2fs");
    assert!(
        made.status.success(),
        "mke2fs: {}",
        String::from_utf8_lossy(&made.stderr)
    );
}

#[test]
fn the_firecracker_go_sdk_boots_linux_from_a_root_drive_and_restores_its_snapshot() {
    let name = "the_firecracker_go_sdk_boots_linux_from_a_root_drive";
    let Some(guest) = LinuxGuest::find(name) else {
        return;
    };
    let Some(sdk) = std::env::var("LLFREE_VMM_FC_SDK")
        .ok()
        .filter(|p| Path::new(p).is_file())
    else {
        eprintln!(
            "SKIP: {name}: LLFREE_VMM_FC_SDK names no program; tests/linux-nested/run.sh builds it"
        );
        return;
    };
    let scratch = Scratch::new("linux-fc");
    let image = scratch.path("rootfs.ext4");
    root_file_system(&scratch, &image);
    let dir = scratch.path("run");
    std::fs::create_dir(&dir).unwrap();
    let args = [
        "-vmm",
        vmm_binary(),
        "-kernel",
        &guest.kernel,
        "-rootfs",
        &image,
        "-dir",
        &dir,
        "-ready",
        "LLFREE-ROOT ready",
        "-mem-mib",
        "128",
        "-boot-args",
        DEFAULT_CMDLINE,
        "-guest-stats",
    ];
    // Under emulation a request (a start, a snapshot) takes longer than the SDK's 500 ms.
    let timeouts = [
        ("FIRECRACKER_GO_SDK_REQUEST_TIMEOUT_MILLISECONDS", "120000"),
        ("FIRECRACKER_GO_SDK_INIT_TIMEOUT_SECONDS", "120"),
    ];
    run_sdk_program(&sdk, &args, &timeouts);

    // The same image, read-only, through `vmm run --drive`: the first boot's count is there.
    let drive = format!("id=rootfs,path={image},root=on,ro=on");
    let mut again = VmmRun::start(&[
        "--kernel",
        &guest.kernel,
        "--memory",
        "128M",
        "--drive",
        &drive,
    ]);
    let ready = again.wait_for_line("LLFREE-ROOT ready", BOOT_TIMEOUT);
    assert_eq!(field(&ready, "boots"), Some("1"), "{ready}");
    assert_eq!(field(&ready, "ro"), Some("1"), "{ready}");
    assert_eq!(field(&ready, "marker"), Some("llfree-root"), "{ready}");
    assert_eq!(field(&ready, "root"), Some("/dev/root"), "{ready}");
    let run = again.wait(BOOT_TIMEOUT);
    assert_eq!(
        run.code,
        Some(7),
        "the guest's reboot ends `vmm run`: {run:#?}"
    );
}
