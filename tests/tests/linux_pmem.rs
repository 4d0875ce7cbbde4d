//! End-to-end: a real Linux keeps a DAX file system on the virtio-pmem device of a VM in a
//! persistent zone. ext4 on /dev/pmem0, mounted with `-o dax`, is written and synced file by
//! file; the VMM is killed with SIGKILL in the middle of that; the VM starts again from the
//! zone, Linux boots, the file system mounts, e2fsck finds it clean and every file that was
//! synced before the kill is intact. (See linux_common for the guest and where this runs.)
//!
//! The same with the zone right on a device DAX (`/dev/daxX.Y`: QEMU's second emulated NVDIMM
//! in the nested run's L1, or `LLFREE_VMM_DEVDAX` on a host that has one), and a zone there
//! backing a VM jailed by `vmm-jailer`.
//!
//! And a zone on a DAX file system (ext4 `-o dax` on QEMU's emulated NVDIMM in the nested run's
//! L1, or `LLFREE_VMM_DAX_DIR` on a host that has one): mapped with MAP_SYNC, it keeps a test
//! guest's RAM through a SIGKILL as a zone in a page-cache file does.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod jail_common;
mod linux_common;
mod vmm_common;

use std::time::Duration;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;

use e2e_tests::{jail_can_run, kvm_available};
use jail_common::{root_of, run_jailed_guest, GID, UID};
use linux_common::{cmdline, field, LinuxGuest, BOOT_TIMEOUT};
use vmm_common::{client, get, Scratch, VmmRun};

/// Files the guest syncs before the kill, at least.
const SYNCED_BEFORE_KILL: u64 = 5;

#[test]
fn a_dax_file_system_on_pmem_survives_a_vmm_kill() {
    let name = "a_dax_file_system_on_pmem_survives_a_vmm_kill";
    let Some(guest) = LinuxGuest::find(name) else {
        return;
    };
    let scratch = Scratch::new("linux-pmem");
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "512M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    pmem_survives_a_kill(&guest, &zone, &scratch);
}

/// The same with the zone right on a device DAX (`LLFREE_VMM_DEVDAX`, e.g. /dev/dax1.0; the
/// nested run's L1 makes QEMU's second emulated NVDIMM one): its frames are scrubbed by writing
/// zeroes (a device has no holes to punch), its metadata and frames are stores to the device.
#[test]
fn a_dax_file_system_on_pmem_in_a_zone_on_device_dax_survives_a_vmm_kill() {
    let name = "a_dax_file_system_on_pmem_in_a_zone_on_device_dax_survives_a_vmm_kill";
    let Some(device) = device_dax(name) else {
        return;
    };
    let Some(guest) = LinuxGuest::find(name) else {
        return;
    };
    let _turn = DEVICE_DAX_TURN.lock().unwrap_or_else(|e| e.into_inner());
    zone_on_device_dax(&device, "linux");
    let scratch = Scratch::new("linux-devdax");
    pmem_survives_a_kill(&guest, &device, &scratch);
    let deleted = client(&["zone", "delete-vm", &device, "linux"]);
    assert_eq!(deleted.code, Some(0), "{deleted:#?}");
    let info = inspect(&device);
    assert_eq!(info["free_frames"], info["frames"], "{info:#}");
}

/// The device DAX is one zone: its tests take turns.
static DEVICE_DAX_TURN: Mutex<()> = Mutex::new(());

/// The device DAX to test on (`LLFREE_VMM_DEVDAX`), or None after a SKIP line.
fn device_dax(test: &str) -> Option<String> {
    let Some(device) = std::env::var_os("LLFREE_VMM_DEVDAX") else {
        eprintln!(
            "SKIP: {test}: no device DAX (LLFREE_VMM_DEVDAX); tests/linux-nested/run.sh makes \
             one of QEMU's second emulated NVDIMM"
        );
        return None;
    };
    Some(device.to_str().expect("UTF-8 path").to_owned())
}

/// Makes a zone on `device`, or, where an earlier round made one (LLFREE_NESTED_ROUNDS),
/// deletes VM `vm` there.
fn zone_on_device_dax(device: &str, vm: &str) {
    let created = client(&["zone", "create", device, "--size", "512M"]);
    if created.stderr.contains("already holds a zone") {
        let _ = client(&["zone", "delete-vm", device, vm]);
    } else {
        assert_eq!(created.code, Some(0), "{created:#?}");
    }
}

/// A read-only bind mount of the host's /sys, undone when dropped.
struct SysfsBound(CString);

impl SysfsBound {
    fn at(dir: &Path) -> Self {
        fs::create_dir_all(dir).unwrap();
        let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let mount = |source: *const libc::c_char, flags| {
            // SAFETY: every pointer is a NUL-terminated string or null, as mount(2) takes.
            let done = unsafe {
                libc::mount(
                    source,
                    target.as_ptr(),
                    std::ptr::null(),
                    flags,
                    std::ptr::null(),
                )
            };
            assert_eq!(done, 0, "mount: {}", std::io::Error::last_os_error());
        };
        mount(c"/sys".as_ptr(), libc::MS_BIND | libc::MS_REC);
        // A bind mount is made read-only by remounting it.
        mount(
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
        );
        SysfsBound(target)
    }
}

impl Drop for SysfsBound {
    fn drop(&mut self) {
        // SAFETY: the target is a NUL-terminated path.
        unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A zone on a device DAX in a jail, as docs/security.md says: a node of the device in
/// the root given to the VMM's user, and /sys bound read-only there (the VMM reads the
/// device's size and alignment from it). The jailed test guest writes and verifies its
/// memory, the zone then shows its VM, consistent, whose frames come back when it is deleted.
/// In the nested run's L1, whose root is an initramfs, the jailer enters the root with a move
/// and chroot (pivot_root refuses an initramfs).
#[test]
fn a_zone_on_device_dax_backs_a_jailed_vm_through_a_node_in_its_root() {
    let name = "a_zone_on_device_dax_backs_a_jailed_vm_through_a_node_in_its_root";
    let Some(device) = device_dax(name) else {
        return;
    };
    if !jail_can_run(name) {
        return;
    }
    let _turn = DEVICE_DAX_TURN.lock().unwrap_or_else(|e| e.into_inner());
    zone_on_device_dax(&device, "jailed");
    let scratch = Scratch::new("jailed-devdax");
    let root = root_of(&scratch, "devdax");
    let node = root.join(device.trim_start_matches('/'));
    fs::create_dir_all(node.parent().unwrap()).unwrap();
    let path = CString::new(node.as_os_str().as_bytes()).unwrap();
    let rdev = fs::metadata(&device).unwrap().rdev();
    // SAFETY: the path is a NUL-terminated string; a character device node of the device.
    let made = unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o600, rdev) };
    assert_eq!(made, 0, "mknod: {}", std::io::Error::last_os_error());
    std::os::unix::fs::chown(&node, Some(UID), Some(GID)).unwrap();
    let _sysfs = SysfsBound::at(&root.join("sys"));
    let memory = ["--zone", &device, "--vm", "jailed", "--memory", "32M"];
    run_jailed_guest(&scratch, "devdax", &memory);
    let info = inspect(&device);
    let vms = info["vms"].as_array().unwrap();
    assert!(vms.iter().any(|vm| vm["name"] == "jailed"), "{info:#}");
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0)),
        "{info:#}"
    );
    let deleted = client(&["zone", "delete-vm", &device, "jailed"]);
    assert_eq!(deleted.code, Some(0), "{deleted:#?}");
}

fn inspect(zone: &str) -> serde_json::Value {
    let run = client(&["zone", "inspect", "--json", zone]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    serde_json::from_str(&run.stdout).expect("inspect JSON")
}

/// VM "linux" of `zone` (RAM and a virtio-pmem device there) writes and syncs files on ext4
/// `-o dax` until its VMM is killed; after the zone's recovery (0 leaked, 0 lost) the VM starts
/// again, e2fsck finds the file system clean and every synced file is intact.
fn pmem_survives_a_kill(guest: &LinuxGuest, zone: &str, scratch: &Scratch) {
    let socket = scratch.path("api.sock");
    let vm = |extra: &str| {
        let line = cmdline(&format!("llfree.test=fs {extra}"));
        let args = [
            "--zone",
            zone,
            "--vm",
            "linux",
            "--memory",
            "256M",
            "--pmem",
            "128M",
            "--cmdline",
            &line,
            "--api-socket",
            &socket,
        ];
        VmmRun::start(&guest.args(&args))
    };

    let mut writer = vm("llfree.phase=write llfree.format=1");
    let mounted = writer.wait_for_line("LLFREE-L2 mounted", BOOT_TIMEOUT);
    assert_eq!(
        field(&mounted, "dax"),
        Some("1"),
        "not mounted with DAX: {mounted}"
    );
    writer.wait_for_line(
        &format!("LLFREE-L2 synced {SYNCED_BEFORE_KILL}"),
        Duration::from_secs(120),
    );
    // Linux's syncs reached the device: each is a flush request, answered after an msync.
    let memory = get(&writer.api(&socket), "/memory");
    let flushes = memory["pmem"]["flushes"].as_u64().unwrap_or(0);
    assert!(flushes >= SYNCED_BEFORE_KILL, "pmem flushes: {memory:#}");
    assert_eq!(memory["pmem"]["size_mib"], 128, "{memory:#}");
    // Somewhere in the middle of the next file.
    std::thread::sleep(Duration::from_millis(150));
    let killed = writer.kill();
    let synced = killed
        .stdout
        .lines()
        .filter_map(|line| e2e_tests::without_name(line).strip_prefix("LLFREE-L2 synced "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .max()
        .expect("synced lines");
    eprintln!("killed the VMM after {synced} synced files ({flushes} pmem flushes by then)");

    let info = inspect(zone);
    assert_eq!(info["recovery"]["kind"], "crash", "{info:#}");
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(info["damaged_vms"], serde_json::json!([]), "{info:#}");

    let mut checker = vm(&format!("llfree.phase=check llfree.upto={synced}"));
    let checked = checker.wait_for_line("LLFREE-L2 checked", BOOT_TIMEOUT);
    let run = checker.wait(Duration::from_secs(60));
    assert_eq!(
        field(&checked, "fsck"),
        Some("0"),
        "{checked}: {}",
        run.stdout
    );
    assert_eq!(field(&checked, "bad"), Some("0"), "{checked}");
    assert_eq!(
        field(&checked, "good"),
        Some(synced.to_string().as_str()),
        "{checked}"
    );
}

#[test]
fn a_zone_on_a_dax_file_system_is_mapped_with_map_sync_and_survives_a_kill() {
    let name = "a_zone_on_a_dax_file_system_is_mapped_with_map_sync_and_survives_a_kill";
    if !kvm_available(name) {
        return;
    }
    let Some(dir) = std::env::var_os("LLFREE_VMM_DAX_DIR") else {
        eprintln!(
            "SKIP: {name}: no DAX file system (LLFREE_VMM_DAX_DIR); tests/linux-nested/run.sh \
             mounts one on QEMU's emulated NVDIMM"
        );
        return;
    };
    let zone = std::path::Path::new(&dir).join(format!("zone-{}", std::process::id()));
    let zone = zone.to_str().expect("UTF-8 path").to_owned();
    let created = client(&["zone", "create", &zone, "--size", "256M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    let inspect = || {
        let run = client(&["zone", "inspect", "--json", &zone]);
        assert_eq!(run.code, Some(0), "{run:#?}");
        serde_json::from_str::<serde_json::Value>(&run.stdout).expect("JSON")
    };
    assert_eq!(
        inspect()["map_sync"],
        true,
        "not mapped with MAP_SYNC: {:#}",
        inspect()
    );
    let scratch = Scratch::new("dax-zone");
    let socket = scratch.path("api.sock");
    let args = ["--zone", &zone, "--vm", "vm", "--memory", "64M"];
    let mut paused = args.to_vec();
    paused.extend(["--workload", "write:all:0xDA7A,checkpoint:1"]);
    let (vmm, _api) = VmmRun::start_paused(&paused, &socket);
    assert_eq!(vmm.kill().code, None);
    let info = inspect();
    assert_eq!(info["recovery"]["kind"], "crash", "{info:#}");
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0))
    );
    let mut verify = args.to_vec();
    verify.extend(["--workload", "verify:all:0xDA7A"]);
    VmmRun::run(&verify).assert_success();
    let _ = std::fs::remove_file(&zone);
}
