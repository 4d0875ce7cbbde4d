//! End-to-end: `vmm run --kernel` through the Linux boot path.
//!
//! * A real Linux (see `linux_common`) boots to its init with 1, 2 and 4 vCPUs, every CPU
//!   online, on plain memory and 2 MiB and 1 GiB huge pages, populated lazily, eagerly and
//!   mapped ahead;
//!   its ELF vmlinux boots through PVH and its bzImage through Linux's 64-bit boot protocol,
//!   both with RAM of an odd number of MiB, which their memory map gives exactly;
//!   `reboot` (through the i8042, the default command line's reboot=k), a panic with panic=1
//!   and Ctrl-Alt-Del from the API end `vmm run` with status 7.
//! * The guest docs/linux-guests.md documents (`tests/linux-nested/run.sh --guest-files DIR`: its kernel and
//!   ext4 root file system) boots from its root drive to its shell, and reboots on Ctrl-Alt-Del.
//! * A minimal 64-bit ELF "kernel" (hand-assembled below) runs everywhere KVM does: it takes
//!   the command line from the zero page the VMM wrote (with `virtio_mmio.device=` for a
//!   `--balloon`), prints it on COM1 and triple-faults, which a Linux guest's run treats as a
//!   reset. (tests/tests/linux_balloon.rs drives Linux's balloon driver where Linux boots.)

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod linux_common;
mod vmm_common;

use std::time::{Duration, Instant};

use e2e_tests::{
    elf_kernel, guest_reset_line, kvm_available, BY_A_TRIPLE_FAULT, THROUGH_THE_KEYBOARD,
};
use guest_mem::testing::HugePageReservation;
use linux_common::{cmdline, field, LinuxGuest, BOOT_TIMEOUT};
use vmm::boot::DEFAULT_CMDLINE;
use vmm_common::{client, Scratch, VmmRun};

/// Prints the NUL-terminated command line at `[RSI + 0x228]` (the zero page's `cmd_line_ptr`)
/// and a newline on port 0x3f8, then executes UD2 with no usable IDT: a triple fault.
const PRINT_CMDLINE: &[u8] = &[
    0x8b, 0x9e, 0x28, 0x02, 0x00, 0x00, // mov ebx, [rsi + 0x228]
    0x8a, 0x03, // next: mov al, [rbx]
    0x84, 0xc0, // test al, al
    0x74, 0x0a, // jz done
    0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
    0xee, // out dx, al
    0x48, 0xff, 0xc3, // inc rbx
    0xeb, 0xf0, // jmp next
    0x66, 0xba, 0xf8, 0x03, // done: mov dx, 0x3f8
    0xb0, 0x0a, // mov al, '\n'
    0xee, // out dx, al
    0x0f, 0x0b, // ud2
];

/// Sends the i8042 its CPU reset command (0xfe to port 0x64), as Linux's reboot=k does, then
/// waits.
const I8042_RESET: &[u8] = &[
    0xb0, 0xfe, // mov al, 0xfe
    0xe6, 0x64, // out 0x64, al
    0xeb, 0xfe, // jmp $
];

/// Writes its counter to the read-only MagicValue register of the virtio-mmio device at
/// 0xc000_0000 1000 times (a driver gone mad), then executes UD2: a triple fault.
const HAMMER_VIRTIO_MMIO: &[u8] = &[
    0xb9, 0xe8, 0x03, 0x00, 0x00, // mov ecx, 1000
    0xbb, 0x00, 0x00, 0x00, 0xc0, // mov ebx, 0xc0000000
    0x89, 0x0b, // next: mov [rbx], ecx
    0xff, 0xc9, // dec ecx
    0x75, 0xfa, // jnz next
    0x0f, 0x0b, // ud2
];

#[test]
fn a_minimal_elf_kernel_gets_its_command_line_and_console() {
    if !kvm_available("a_minimal_elf_kernel_gets_its_command_line_and_console") {
        return;
    }
    let scratch = Scratch::new("minimal-kernel");
    let kernel = scratch.path("vmlinux");
    std::fs::write(&kernel, elf_kernel(PRINT_CMDLINE)).unwrap();
    // Two vCPUs: the second waits for a SIPI that never comes and must not hold up the end.
    for populate in ["lazy", "eager"] {
        let run = VmmRun::run(&[
            "--kernel",
            &kernel,
            "--memory",
            "64M",
            "--vcpus",
            "2",
            "--populate",
            populate,
        ]);
        run.assert_guest_reset(BY_A_TRIPLE_FAULT);
        assert_eq!(run.stdout, format!("{DEFAULT_CMDLINE}\n"));
    }
    let run = VmmRun::run(&[
        "--kernel",
        &kernel,
        "--memory",
        "64M",
        "--cmdline",
        "console=ttyS0 llfree.test=1 -- init-arg",
    ]);
    run.assert_guest_reset(BY_A_TRIPLE_FAULT);
    assert_eq!(run.stdout, "console=ttyS0 llfree.test=1 -- init-arg\n");
    // The balloon is announced to Linux in its virtio-mmio slot, before the init arguments.
    let run = VmmRun::run(&[
        "--kernel",
        &kernel,
        "--memory",
        "64M",
        "--balloon",
        "size=16M,free_page_reporting=on",
        "--cmdline",
        "console=ttyS0 -- init-arg",
    ]);
    run.assert_guest_reset(BY_A_TRIPLE_FAULT);
    assert_eq!(
        run.stdout,
        "console=ttyS0 virtio_mmio.device=4K@0xc0000000:5 -- init-arg\n"
    );
}

#[test]
fn the_i8042_reset_command_ends_the_vmm_and_ctrl_alt_del_is_answered_without_a_keyboard() {
    if !kvm_available(
        "the_i8042_reset_command_ends_the_vmm_and_ctrl_alt_del_is_answered_without_a_keyboard",
    ) {
        return;
    }
    let scratch = Scratch::new("i8042-reset");
    let kernel = scratch.path("vmlinux");
    std::fs::write(&kernel, elf_kernel(I8042_RESET)).unwrap();
    let started = Instant::now();
    VmmRun::run(&["--kernel", &kernel, "--memory", "64M"]).assert_guest_reset(THROUGH_THE_KEYBOARD);
    eprintln!("i8042 reset: vmm ran {:.1?}", started.elapsed());
    // The test guest has no keyboard controller: the press is answered as Firecracker answers
    // it (204), goes nowhere, and says so.
    let socket = scratch.path("api.sock");
    let (mut vmm, _api) =
        VmmRun::start_paused(&["--memory", "16M", "--workload", "checkpoint:1"], &socket);
    client(&["ctrl-alt-del", "--socket", &socket]).assert_success();
    assert!(
        vmm.running(),
        "the test guest's VMM ended on a Ctrl-Alt-Del"
    );
    assert!(
        vmm.stderr_so_far().contains("no keyboard controller"),
        "{}",
        vmm.stderr_so_far()
    );
}

#[test]
fn a_guest_hammering_a_device_register_gets_rate_limited_warnings_on_stderr() {
    if !kvm_available("a_guest_hammering_a_device_register_gets_rate_limited_warnings") {
        return;
    }
    let scratch = Scratch::new("hammer-mmio");
    let kernel = scratch.path("vmlinux");
    std::fs::write(&kernel, elf_kernel(HAMMER_VIRTIO_MMIO)).unwrap();
    let args = [
        "--kernel",
        &kernel,
        "--memory",
        "64M",
        "--balloon",
        "size=0",
    ];
    let run = VmmRun::run(&args);
    assert_eq!(run.code, Some(7), "{run:#?}");
    // Warnings 1, 2, 4, ..., 512 of the 1000: ten lines, each with its count.
    let stderr = run.stderr_besides_notes();
    let reset = guest_reset_line(BY_A_TRIPLE_FAULT);
    let lines: Vec<&str> = stderr.lines().filter(|l| *l != reset.trim_end()).collect();
    assert_eq!(lines.len(), 10, "{run:#?}");
    for (line, count) in lines.iter().zip((0..10).map(|n| 1 << n)) {
        assert!(
            line.starts_with(
                "warning: virtio-mmio@0xc0000000: write to read-only or unknown register 0x0"
            ) && line.contains(&format!("(guest warning {count} of this device;")),
            "{line}"
        );
    }
    // The level is the user's to choose.
    let mut quiet = args.to_vec();
    quiet.extend(["--log-level", "error"]);
    let run = VmmRun::run(&quiet);
    run.assert_guest_reset(BY_A_TRIPLE_FAULT);
    assert_eq!(run.stderr, guest_reset_line(BY_A_TRIPLE_FAULT), "{run:#?}");
}

/// Boots the guest with `args` and waits for its init's first line; returns the run and the
/// line.
fn boot(guest: &LinuxGuest, args: &[&str]) -> (VmmRun, String) {
    let mut vmm = VmmRun::start(&guest.args(args));
    let ready = vmm.wait_for_line("LLFREE-L2 ready", BOOT_TIMEOUT);
    (vmm, ready)
}

#[test]
fn linux_boots_to_init_with_every_cpu_online_and_reboot_ends_the_vmm() {
    let test = "linux_boots_to_init_with_every_cpu_online_and_reboot_ends_the_vmm";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    // 256 MiB of 2 MiB huge pages for the hugetlb-2m runs.
    let _pages = match HugePageReservation::reserve(2048, 128) {
        Ok(pages) => pages,
        Err(why) => return eprintln!("SKIP: {test}: {why}"),
    };
    // Every vCPU count, backing and population, each at least once; SMT (two threads per
    // core, as Firecracker's `smt`) once.
    let cases = [
        ("1", "anon", "lazy", None),
        ("2", "hugetlb-2m", "eager", None),
        ("4", "anon", "eager", None),
        ("4", "hugetlb-2m", "lazy", None),
        ("4", "anon", "lazy", Some("--smt")),
        ("2", "hugetlb-2m", "mapped", None),
    ];
    for (vcpus, backing, populate, smt) in cases {
        let started = Instant::now();
        // The default command line: the init's default test reports and runs `reboot -f`,
        // which resets through the i8042 (reboot=k).
        let mut args = vec![
            "--memory",
            "256M",
            "--vcpus",
            vcpus,
            "--backing",
            backing,
            "--populate",
            populate,
        ];
        args.extend(smt);
        let (vmm, ready) = boot(&guest, &args);
        let to_init = started.elapsed();
        let last = vcpus.parse::<u32>().unwrap() - 1;
        let online = if last == 0 {
            "0".to_owned()
        } else {
            format!("0-{last}")
        };
        assert_eq!(field(&ready, "cpus"), Some(vcpus), "{ready}");
        assert_eq!(field(&ready, "online"), Some(online.as_str()), "{ready}");
        // CPU 0 shares its core with CPU 1 under SMT, with nobody otherwise.
        let siblings = if smt.is_some() { "0-1" } else { "0" };
        assert_eq!(field(&ready, "siblings"), Some(siblings), "{ready}");
        // Linux's timer is the TSC-deadline timer our CPUID offers (where KVM emulates it,
        // as every KVM with an in-kernel LAPIC does), not the LAPIC's one-shot count.
        assert_eq!(field(&ready, "timer"), Some("lapic-deadline"), "{ready}");
        let run = vmm.wait(Duration::from_secs(60));
        let to_exit = started.elapsed();
        run.assert_guest_reset(THROUGH_THE_KEYBOARD);
        assert!(run.stdout.contains("smp: Brought up 1 node"), "{run:#?}");
        assert!(
            run.stdout.contains("TSC deadline timer available"),
            "{run:#?}"
        );
        eprintln!(
            "{test}: {vcpus} vCPUs{}, {backing}, {populate}: init after {to_init:.1?} (guest \
             uptime {}), vmm ended {:.1?} after the reboot",
            if smt.is_some() { " (SMT)" } else { "" },
            field(&ready, "uptime").unwrap_or("?"),
            to_exit - to_init
        );
    }
}

#[test]
fn linux_s_elf_vmlinux_boots_through_pvh_and_its_bzimage_through_the_64_bit_protocol() {
    let test = "linux_s_elf_vmlinux_boots_through_pvh_and_its_bzimage_through_the_64_bit_protocol";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    // The zero page's type_of_loader, as the guest sees it: Linux's PVH entry builds the zero
    // page itself from the start info and writes 0xb0 (PVH, not under Xen); for the 64-bit
    // protocol our VMM writes the zero page, with 0xff (a loader without an ID).
    for (kernel, loader) in [
        (guest.vmlinux.as_str(), "b0"),
        (guest.kernel.as_str(), "ff"),
    ] {
        let started = Instant::now();
        let args = [
            "--kernel",
            kernel,
            "--initrd",
            &guest.initrd,
            // Any number of MiB, as in Firecracker: the memory map ends at 257 MiB, inside
            // the host's last 2 MiB frame.
            "--memory",
            "257M",
            "--vcpus",
            "2",
        ];
        let mut vmm = VmmRun::start(&args);
        // The init ran from the initramfs and the console is the command line's: PVH's module
        // list and command line arrived.
        let ready = vmm.wait_for_line("LLFREE-L2 ready", BOOT_TIMEOUT);
        assert_eq!(field(&ready, "loader"), Some(loader), "{kernel}: {ready}");
        assert_eq!(field(&ready, "online"), Some("0-1"), "{kernel}: {ready}");
        // The memory map: all of the RAM but what the kernel keeps for itself.
        let total: u64 = field(&ready, "memtotal_kib").unwrap().parse().unwrap();
        assert!(total > 200 * 1024, "{kernel}: {ready}");
        let run = vmm.wait(Duration::from_secs(60));
        run.assert_guest_reset(THROUGH_THE_KEYBOARD);
        assert!(
            run.stdout.contains("-0x00000000100fffff] usable"),
            "{kernel}: the memory map ends at 257 MiB: {run:#?}"
        );
        eprintln!(
            "{test}: {kernel} (loader {loader}): init after {:.1?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_panic_with_panic_1_ends_the_vmm() {
    let test = "a_panic_with_panic_1_ends_the_vmm";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    // Without the initramfs the kernel cannot mount a root file system and panics; the default
    // command line's panic=1 reboots a second later.
    let started = Instant::now();
    let run = VmmRun::start(&["--kernel", &guest.kernel, "--memory", "128M"]).wait(BOOT_TIMEOUT);
    run.assert_guest_reset(THROUGH_THE_KEYBOARD);
    assert!(
        run.stdout.contains("Kernel panic - not syncing"),
        "{run:#?}"
    );
    eprintln!(
        "{test}: vmm ended {:.1?} after its start",
        started.elapsed()
    );
}

#[test]
fn ctrl_alt_del_through_the_api_reboots_the_guest_and_ends_the_vmm() {
    let test = "ctrl_alt_del_through_the_api_reboots_the_guest_and_ends_the_vmm";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let scratch = Scratch::new("ctrl-alt-del");
    let socket = scratch.path("api.sock");
    let cmdline = cmdline("llfree.test=idle");
    let (mut vmm, _) = boot(
        &guest,
        &[
            "--memory",
            "128M",
            "--cmdline",
            &cmdline,
            "--api-socket",
            &socket,
        ],
    );
    let sent = client(&["ctrl-alt-del", "--socket", &socket]);
    assert_eq!(sent.code, Some(0), "{sent:#?}");
    assert_eq!(sent.stdout, "Ctrl-Alt-Del sent to the guest's keyboard\n");
    // The idle init never reboots by itself: Linux took the keys for Ctrl-Alt-Del and
    // restarted (at once, as by default, or through init).
    vmm.wait_for_line("reboot: Restarting system", Duration::from_secs(60));
    vmm.wait(Duration::from_secs(60))
        .assert_guest_reset(THROUGH_THE_KEYBOARD);
}

#[test]
fn linux_boots_on_1g_frames() {
    let test = "linux_boots_on_1g_frames";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let _pages = match HugePageReservation::reserve(1_048_576, 1) {
        Ok(pages) => pages,
        Err(why) => return eprintln!("SKIP: {test}: {why}"),
    };
    let (vmm, ready) = boot(&guest, &["--memory", "1G", "--backing", "hugetlb-1g"]);
    let total: u64 = field(&ready, "memtotal_kib").unwrap().parse().unwrap();
    assert!(total > 900 * 1024, "{ready}");
    vmm.wait(Duration::from_secs(60))
        .assert_guest_reset(THROUGH_THE_KEYBOARD);
}

#[test]
fn the_documented_guest_files_boot_linux_from_its_root_drive_to_a_shell() {
    let test = "the_documented_guest_files_boot_linux_from_its_root_drive_to_a_shell";
    // Where Linux can boot at all.
    if LinuxGuest::find(test).is_none() {
        return;
    }
    // `tests/linux-nested/run.sh --guest-files DIR`, as docs/linux-guests.md gives it; run.sh passes its DIR.
    let Some(dir) = std::env::var("LLFREE_VMM_GUEST_FILES").ok() else {
        return eprintln!(
            "SKIP: {test}: LLFREE_VMM_GUEST_FILES names no directory; tests/linux-nested/run.sh \
             makes one"
        );
    };
    let scratch = Scratch::new("guest-files");
    let socket = scratch.path("api.sock");
    let (kernel, rootfs) = (format!("{dir}/bzImage"), format!("{dir}/rootfs.ext4"));
    let drive = format!("id=rootfs,path={rootfs},root=on,ro=on");
    let mut vmm = VmmRun::start(&[
        "--kernel",
        &kernel,
        "--drive",
        &drive,
        "--memory",
        "128M",
        "--vcpus",
        "2",
        "--api-socket",
        &socket,
    ]);
    vmm.wait_for_line("llfree-vmm guest: Linux 6.1", BOOT_TIMEOUT);
    let greeting = vmm.stdout_so_far();
    assert!(greeting.contains("with 2 CPUs"), "{greeting}");
    let sent = client(&["ctrl-alt-del", "--socket", &socket]);
    assert_eq!(sent.code, Some(0), "{sent:#?}");
    vmm.wait_for_line(
        "llfree-vmm guest: Ctrl-Alt-Del: rebooting",
        Duration::from_secs(60),
    );
    vmm.wait(Duration::from_secs(60))
        .assert_guest_reset(THROUGH_THE_KEYBOARD);
}

#[test]
fn linux_reads_a_mebibyte_of_random_bytes_from_the_entropy_device() {
    let test = "linux_reads_a_mebibyte_of_random_bytes_from_the_entropy_device";
    let Some(guest) = LinuxGuest::find(test) else {
        return;
    };
    let cmdline = cmdline("llfree.test=entropy llfree.mib=1");
    let (vmm, _) = boot(
        &guest,
        &["--memory", "128M", "--entropy", "--cmdline", &cmdline],
    );
    let done = vmm.wait(BOOT_TIMEOUT);
    let line = done
        .stdout
        .lines()
        .find(|l| l.contains("LLFREE-L2 entropy"))
        .unwrap_or_else(|| panic!("no entropy line: {done:#?}"));
    eprintln!("{test}: {line}");
    // Linux's virtio-rng driver is /dev/hwrng's source, it read the whole MiB, and the bytes
    // are not one value repeated.
    assert!(line.contains("rng=virtio_rng"), "{line}");
    assert_eq!(field(line, "read_kib"), Some("1024"), "{line}");
    let distinct: u32 = field(line, "distinct").unwrap().parse().unwrap();
    assert!(distinct > 200, "{line}");
    done.assert_guest_reset(THROUGH_THE_KEYBOARD);
}
