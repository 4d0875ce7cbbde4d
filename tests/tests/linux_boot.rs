//! End-to-end: `vmm run --kernel` through the Linux boot path.
//!
//! * A real kernel boots to its banner where the host has hardware virtualization (`vmx` or
//!   `svm` in /proc/cpuinfo) and a kernel is at hand (`LLFREE_VMM_TEST_KERNEL`, or the newest
//!   `/boot/vmlinuz-*`); elsewhere (e.g. on PVM, which cannot run a stock kernel) it prints
//!   SKIP. The guest kernel needs CONFIG_SERIAL_8250_CONSOLE for the console; without an initrd
//!   it panics at the root mount and `panic=1` resets the VM, which ends `vmm run`.
//! * A minimal 64-bit ELF "kernel" (hand-assembled below) runs everywhere KVM does: it takes
//!   the command line from the zero page the VMM wrote (with `virtio_mmio.device=` for a
//!   `--balloon`), prints it on COM1 and triple-faults, which a Linux guest's run treats as a
//!   reset. (tests/tests/linux_balloon.rs drives Linux's balloon driver where Linux boots.)

mod vmm_common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e_tests::{elf_kernel, hardware_virtualization, kvm_available};
use vmm_common::{Scratch, VmmRun};

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
        run.assert_success();
        assert_eq!(run.stdout, "console=ttyS0 reboot=k panic=1 pci=off\n");
    }
    let run = VmmRun::run(&[
        "--kernel",
        &kernel,
        "--memory",
        "64M",
        "--cmdline",
        "console=ttyS0 llfree.test=1 -- init-arg",
    ]);
    run.assert_success();
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
    run.assert_success();
    assert_eq!(
        run.stdout,
        "console=ttyS0 virtio_mmio.device=4K@0xc0000000:5 -- init-arg\n"
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
    assert_eq!(run.code, Some(0), "{run:#?}");
    // Warnings 1, 2, 4, ..., 512 of the 1000: ten lines, each with its count.
    let stderr = run.stderr_besides_notes();
    let lines: Vec<&str> = stderr.lines().collect();
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
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""), "{run:#?}");
}

/// Why a real kernel cannot be booted here, if it cannot.
fn real_kernel() -> Result<PathBuf, String> {
    hardware_virtualization()?;
    if let Some(path) = std::env::var_os("LLFREE_VMM_TEST_KERNEL") {
        return Ok(path.into());
    }
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .map_err(|e| format!("no kernel: /boot: {e}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .collect();
    kernels.sort();
    kernels
        .pop()
        .ok_or_else(|| "no kernel: set LLFREE_VMM_TEST_KERNEL or install /boot/vmlinuz-*".into())
}

#[test]
fn linux_boots_to_its_banner() {
    let test = "linux_boots_to_its_banner";
    if !kvm_available(test) {
        return;
    }
    let kernel = match real_kernel() {
        Ok(kernel) => kernel,
        Err(why) => {
            eprintln!("SKIP: {test}: {why}");
            return;
        }
    };
    let kernel = kernel.to_str().unwrap().to_owned();
    let mut vmm = VmmRun::start(&[
        "--kernel",
        &kernel,
        "--memory",
        "512M",
        "--vcpus",
        "2",
        "--cmdline",
        "console=ttyS0 reboot=k panic=1 pci=off",
    ]);
    // Without an initrd the kernel panics and resets; stop it if it hangs instead.
    let deadline = Instant::now() + Duration::from_secs(120);
    while vmm.running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if vmm.running() {
        vmm.signal("TERM");
    }
    let run = vmm.wait(Duration::from_secs(30));
    run.assert_success();
    assert!(run.stdout.contains("Linux version"), "{run:#?}");
}
