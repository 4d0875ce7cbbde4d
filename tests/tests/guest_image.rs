//! End-to-end: `vmm guest-image --out FILE`, the test guest as a kernel image, booted by
//! `vmm run --kernel` and by Firecracker's API (`PUT /boot-source`, then `InstanceStart`) with
//! its workload from `workload=` on the command line: what a user of Firecracker's tools runs
//! on a host where no Linux boots. With `self-boot` on its command line the VMM boots the image
//! as a kernel, through its PVH entry as Firecracker does (or Linux's boot protocol, the note
//! taken out), and the image runs itself.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use e2e_tests::{kvm_available, THROUGH_THE_KEYBOARD};
use serde_json::json;
use vmm_common::{client, send, Scratch, VmmRun};

const TIMEOUT: Duration = Duration::from_secs(120);

/// `vmm guest-image --out PATH` into `scratch`; returns the path.
fn guest_image(scratch: &Scratch, name: &str) -> String {
    let path = scratch.path(name);
    let written = client(&["guest-image", "--out", &path]);
    assert_eq!(written.code, Some(0), "{written:#?}");
    assert!(written
        .stdout
        .starts_with(&format!("wrote the test guest image to {path}")));
    assert_eq!(std::fs::read(&path).unwrap(), vmm::testguest::IMAGE);
    path
}

#[test]
fn vmm_run_boots_the_image_with_the_workload_of_its_command_line() {
    let test = "vmm_run_boots_the_image_with_the_workload_of_its_command_line";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("guest-image-run");
    let image = guest_image(&scratch, "guest.elf");
    let run = VmmRun::run(&[
        "--kernel",
        &image,
        "--memory",
        "64M",
        "--vcpus",
        "2",
        "--cmdline",
        "console=ttyS0 workload=write:all,checkpoint:1,read:all,verify:all",
    ]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stdout.contains("2 vCPUs, 4 steps"), "{run:#?}");
    // A workload that must fail does: the command line's workload is the one that runs.
    let run = VmmRun::run(&[
        "--kernel",
        &image,
        "--memory",
        "64M",
        "--cmdline",
        "workload=write:all,verify:all:0x1",
    ]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    // A bad workload, and an initrd, are usage errors.
    let run = VmmRun::run(&["--kernel", &image, "--cmdline", "workload=fly:all"]);
    run.assert_fails(
        2,
        "--kernel: the test guest image's workload= on the command line",
    );
    let run = VmmRun::run(&["--kernel", &image, "--initrd", &image]);
    run.assert_fails(2, "the test guest image takes no initrd");
}

#[test]
fn firecrackers_api_boots_the_image_and_the_vmm_ends_with_the_guests_result() {
    let test = "firecrackers_api_boots_the_image_and_the_vmm_ends_with_the_guests_result";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("guest-image-api");
    let image = guest_image(&scratch, "guest.elf");
    let socket = scratch.path("fc.sock");
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket, "--id", "guide"]);
    let api = vmm.api(&socket);
    let boot_source = json!({"kernel_image_path": image,
                             "boot_args": "console=ttyS0 workload=write:all,verify:all"});
    send(&api, "PUT", "/boot-source", &boot_source.to_string());
    let machine = json!({"vcpu_count": 2, "mem_size_mib": 128});
    send(&api, "PUT", "/machine-config", &machine.to_string());
    send(
        &api,
        "PUT",
        "/actions",
        r#"{"action_type":"InstanceStart"}"#,
    );
    let done = vmm.wait(TIMEOUT);
    assert_eq!(done.code, Some(0), "{done:#?}");
    assert!(
        done.stdout.contains("[guide] test guest: done"),
        "{done:#?}"
    );

    // An image of another vmm version is refused at the start, with what to do.
    let mut old = vmm::testguest::IMAGE.to_vec();
    *old.last_mut().unwrap() ^= 0xff;
    let old_image = scratch.path("old.elf");
    std::fs::write(&old_image, old).unwrap();
    let socket = scratch.path("fc2.sock");
    let mut vmm = VmmRun::start_command(&["--api-sock", &socket]);
    let api = vmm.api(&socket);
    let boot_source = json!({"kernel_image_path": old_image});
    send(&api, "PUT", "/boot-source", &boot_source.to_string());
    let answer = api
        .request(
            "PUT",
            "/actions",
            Some(r#"{"action_type":"InstanceStart"}"#),
        )
        .unwrap();
    assert_eq!(answer.status, 400);
    assert!(
        answer
            .body
            .contains("another vmm version; write it again with `vmm guest-image"),
        "{}",
        answer.body
    );
    send(&api, "PUT", "/actions", r#"{"action_type":"Shutdown"}"#);
    vmm.wait(TIMEOUT);
}

#[test]
fn the_image_replaces_only_a_regular_file() {
    let scratch = Scratch::new("guest-image-out");
    let fifo = scratch.path("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let refused = client(&["guest-image", "--out", &fifo]);
    refused.assert_fails(2, "--out");
    assert!(
        refused.stderr.contains("a FIFO, not a regular file"),
        "{refused:#?}"
    );
    let dir = scratch.path("dir");
    std::fs::create_dir(&dir).unwrap();
    client(&["guest-image", "--out", &dir]).assert_fails(2, "a directory");
    // A regular file is replaced whole.
    let file = scratch.path("old");
    std::fs::write(&file, vec![7u8; 1 << 20]).unwrap();
    assert_eq!(client(&["guest-image", "--out", &file]).code, Some(0));
    assert_eq!(std::fs::read(&file).unwrap(), vmm::testguest::IMAGE);
}

/// `image` without its PVH entry: its PT_NOTE program header made PT_NULL, so that a loader
/// boots it through Linux's 64-bit boot protocol.
fn without_pvh_note(image: &[u8]) -> Vec<u8> {
    const PT_NULL: u32 = 0;
    const PT_NOTE: u32 = 4;
    let read = |offset: usize, size: usize| {
        let mut bytes = [0u8; 8];
        bytes[..size].copy_from_slice(&image[offset..offset + size]);
        u64::from_le_bytes(bytes) as usize
    };
    let (phoff, phentsize, phnum) = (read(32, 8), read(54, 2), read(56, 2));
    let mut stripped = image.to_vec();
    let mut notes = 0;
    for index in 0..phnum {
        let header = phoff + index * phentsize;
        if read(header, 4) as u32 == PT_NOTE {
            stripped[header..header + 4].copy_from_slice(&PT_NULL.to_le_bytes());
            notes += 1;
        }
    }
    assert_eq!(notes, 1, "the image has one note segment, the PVH entry's");
    stripped
}

#[test]
fn the_image_boots_itself_through_pvh_and_linux_s_boot_protocol_as_firecracker_boots_it() {
    let test =
        "the_image_boots_itself_through_pvh_and_linux_s_boot_protocol_as_firecracker_boots_it";
    if !kvm_available(test) {
        return;
    }
    let scratch = Scratch::new("guest-image-self-boot");
    let image = guest_image(&scratch, "guest.elf");
    // RAM on both sides of the MMIO gap (the loader maps only the first GiB: the guest maps
    // the rest); the checkpoint waits for a byte on the console.
    let (mut run, mut console) = VmmRun::start_with_console(&[
        "--kernel",
        &image,
        "--memory",
        "4608M",
        "--cmdline",
        "console=ttyS0 self-boot workload=write:all,checkpoint:7,verify:all",
    ]);
    run.wait_for_line("checkpoint 7: waiting for a byte on the console", TIMEOUT);
    console.write_all(b"\n").unwrap();
    let run = run.wait(TIMEOUT);
    run.assert_guest_reset(THROUGH_THE_KEYBOARD);
    // Through its PVH entry (an ELF note names it, and this VMM prefers it, as Firecracker and
    // Cloud Hypervisor do); two ranges (below and above the gap) written, the checkpoint, both
    // verified.
    assert!(run.stdout.contains("1 vCPU, 5 steps"), "{run:#?}");
    assert!(
        run.stdout.contains("test guest: booted through PVH\n"),
        "{run:#?}"
    );
    assert!(run.stdout.contains("step 5: ok"), "{run:#?}");
    assert!(run.stdout.ends_with("test guest: done\n"), "{run:#?}");

    // A verification that must fail says so before the reset; what the guest cannot parse,
    // it names, and resets.
    let self_booted = |cmdline: &str| {
        let run = VmmRun::run(&["--kernel", &image, "--memory", "64M", "--cmdline", cmdline]);
        run.assert_guest_reset(THROUGH_THE_KEYBOARD);
        run
    };
    let run = self_booted("self-boot workload=verify:all");
    assert!(run.stdout.contains("FAILED"), "{run:#?}");
    let run = self_booted("self-boot workload=write:2M+4K");
    assert!(
        run.stdout.contains(
            "test guest: bad workload= on the command line: a self-booted guest's ranges are 'all'"
        ),
        "{run:#?}"
    );

    // Without the note, through Linux's 64-bit boot protocol: the same workload, verified.
    let linux_image = scratch.path("linux-protocol.elf");
    std::fs::write(&linux_image, without_pvh_note(vmm::testguest::IMAGE)).unwrap();
    let run = VmmRun::run(&[
        "--kernel",
        &linux_image,
        "--memory",
        "64M",
        "--cmdline",
        "self-boot workload=write:all,verify:all",
    ]);
    run.assert_guest_reset(THROUGH_THE_KEYBOARD);
    assert!(
        run.stdout
            .contains("test guest: booted through Linux's boot protocol\n"),
        "{run:#?}"
    );
    assert!(run.stdout.ends_with("test guest: done\n"), "{run:#?}");
}
