//! End-to-end: what `vmm run` says when it cannot run a VM: one `error:` line on stderr and a
//! documented exit status (2: usage or configuration, 4: runtime). Bad flags, missing files,
//! no /dev/kvm and too few huge pages are in cli_run.rs.

mod vmm_common;

use e2e_tests::kvm_available;
use vmm_common::{send, wait_for_state, Scratch, VmmRun};

/// Runs a 16 MiB VM that reads all its memory on the `file:` backing `backing`, which leaves a
/// pool file of 16 MiB of frames behind.
fn create_pool_file(backing: &str) {
    VmmRun::run(&[
        "--memory",
        "16M",
        "--backing",
        backing,
        "--workload",
        "read:all",
    ])
    .assert_success();
}

#[test]
fn an_api_socket_served_by_another_vmm_is_a_usage_error() {
    if !kvm_available("an_api_socket_served_by_another_vmm_is_a_usage_error") {
        return;
    }
    let scratch = Scratch::new("socket-in-use");
    let socket = scratch.path("api.sock");
    let (_first, api) =
        VmmRun::start_paused(&["--memory", "16M", "--workload", "checkpoint:1"], &socket);
    let second = VmmRun::run(&["--memory", "16M", "--api-socket", &socket]);
    second.assert_fails(2, "another process is listening on it");
    // The first VMM still serves its socket.
    wait_for_state(&api, "Paused");
}

#[test]
fn an_api_socket_that_cannot_be_created_is_a_usage_error() {
    if !kvm_available("an_api_socket_that_cannot_be_created_is_a_usage_error") {
        return;
    }
    // sysfs takes no sockets (read-only, or EPERM), like a read-only file system.
    VmmRun::run(&["--memory", "16M", "--api-socket", "/sys/api.sock"])
        .assert_fails(2, "API socket /sys/api.sock: ");
}

#[test]
fn a_kernel_file_that_is_no_kernel_is_a_usage_error() {
    if !kvm_available("a_kernel_file_that_is_no_kernel_is_a_usage_error") {
        return;
    }
    let scratch = Scratch::new("no-kernel");
    let kernel = scratch.path("vmlinux");
    std::fs::write(&kernel, vec![0x90; 4096]).unwrap();
    VmmRun::run(&["--memory", "64M", "--kernel", &kernel]).assert_fails(
        2,
        &format!("cannot boot {kernel}: kernel is neither an ELF vmlinux nor a bzImage"),
    );
    let empty = scratch.path("empty");
    std::fs::write(&empty, b"").unwrap();
    VmmRun::run(&["--memory", "64M", "--kernel", &empty])
        .assert_fails(2, &format!("--kernel {empty}: is empty"));
}

#[test]
fn a_pool_file_of_another_size_is_a_usage_error() {
    if !kvm_available("a_pool_file_of_another_size_is_a_usage_error") {
        return;
    }
    let scratch = Scratch::new("pool-size");
    let backing = format!("file:{}", scratch.path("pool"));
    create_pool_file(&backing);
    VmmRun::run(&["--memory", "32M", "--backing", &backing]).assert_fails(
        2,
        "holds 16777216 bytes of frames, but 33554432 were requested",
    );
    // A file that is not a pool is refused and left as it was.
    let foreign = scratch.path("foreign");
    std::fs::write(&foreign, vec![0x42; 1 << 20]).unwrap();
    let backing = format!("file:{foreign}");
    VmmRun::run(&["--memory", "16M", "--backing", &backing])
        .assert_fails(2, "cannot create the frame pool: pool file");
    let contents = std::fs::read(&foreign).unwrap();
    assert!(
        contents[..1 << 20].iter().all(|&b| b == 0x42),
        "overwritten"
    );
    assert_eq!(contents.len(), 1 << 20, "resized");
}

#[test]
fn a_truncated_pool_file_is_a_usage_error() {
    if !kvm_available("a_truncated_pool_file_is_a_usage_error") {
        return;
    }
    let scratch = Scratch::new("pool-truncated");
    let pool = scratch.path("pool");
    let backing = format!("file:{pool}");
    create_pool_file(&backing);
    let file = std::fs::OpenOptions::new().write(true).open(&pool).unwrap();
    let len = file.metadata().unwrap().len();
    file.set_len(len / 2).unwrap();
    VmmRun::run(&["--memory", "16M", "--backing", &backing]).assert_fails(2, "but its pool needs");
    assert_eq!(std::fs::metadata(&pool).unwrap().len(), len / 2, "resized");
}

#[test]
fn a_pool_file_another_vmm_uses_is_refused_at_once() {
    if !kvm_available("a_pool_file_another_vmm_uses_is_refused_at_once") {
        return;
    }
    let scratch = Scratch::new("pool-in-use");
    let socket = scratch.path("api.sock");
    let pool = scratch.path("pool");
    let backing = format!("file:{pool}");
    let (first, api) = VmmRun::start_paused(
        &[
            "--memory",
            "16M",
            "--backing",
            &backing,
            "--workload",
            "write:all,checkpoint:1,verify:all",
        ],
        &socket,
    );
    VmmRun::run(&["--memory", "16M", "--backing", &backing])
        .assert_fails(2, &format!("pool file {pool} is in use by another process"));
    // The first VMM goes on undisturbed, and once it is gone the pool file serves again.
    send(&api, "PATCH", "/vm", r#"{"state":"Resumed"}"#);
    first
        .wait(std::time::Duration::from_secs(30))
        .assert_success();
    VmmRun::run(&["--memory", "16M", "--backing", &backing]).assert_success();
}

#[test]
fn more_ram_than_the_test_guest_can_map_is_refused_before_anything_is_allocated() {
    if !kvm_available(
        "more_ram_than_the_test_guest_can_map_is_refused_before_anything_is_allocated",
    ) {
        return;
    }
    let started = std::time::Instant::now();
    let run = VmmRun::run(&["--memory", "1T", "--workload", "read:2M+4K"]);
    if run.code == Some(0) {
        // KVM offers 1 GiB pages here: four pages of tables map 1 TiB.
        eprintln!("SKIP: the test guest maps 1 TiB with 1 GiB pages on this host");
        return;
    }
    run.assert_fails(
        2,
        "the built-in test guest can use at most 116 GiB of RAM on this host (its page tables \
         map RAM with 2 MiB pages: KVM offers no 1 GiB pages here), not 1 TiB",
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "{run:#?}"
    );
    VmmRun::run(&["--memory", "116G", "--workload", "read:2M+4K"]).assert_success();
}

/// An ELF "kernel" that every KVM runs to its end: `ud2` at 1 MiB, which with the boot IDT
/// (no handlers) ends in a triple fault, i.e. a reset, which ends the VM.
fn triple_fault_elf() -> Vec<u8> {
    const LOAD: u64 = 0x10_0000;
    const CODE_OFFSET: u64 = 64 + 56;
    let code = [0x0f, 0x0b]; // ud2
    let mut elf = Vec::new();
    elf.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&0x3eu16.to_le_bytes()); // x86_64
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&LOAD.to_le_bytes()); // entry
    elf.extend_from_slice(&64u64.to_le_bytes()); // program headers
    elf.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    elf.extend_from_slice(&0u32.to_le_bytes());
    for half in [64u16, 56, 1, 64, 0, 0] {
        elf.extend_from_slice(&half.to_le_bytes());
    }
    elf.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    elf.extend_from_slice(&5u32.to_le_bytes()); // R + X
    for word in [
        CODE_OFFSET,
        LOAD,
        LOAD,
        code.len() as u64,
        code.len() as u64,
        0x1000,
    ] {
        elf.extend_from_slice(&word.to_le_bytes());
    }
    elf.extend_from_slice(&code);
    elf
}

#[test]
fn a_kernel_on_a_host_without_hardware_virtualization_is_warned_about() {
    if !kvm_available("a_kernel_on_a_host_without_hardware_virtualization_is_warned_about") {
        return;
    }
    let hardware = e2e_tests::hardware_virtualization().is_ok();
    let scratch = Scratch::new("kernel-warning");
    let kernel = scratch.path("vmlinux");
    std::fs::write(&kernel, triple_fault_elf()).unwrap();
    let run = VmmRun::run(&["--memory", "64M", "--kernel", &kernel]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    let warned = run
        .stderr
        .lines()
        .any(|line| line.starts_with("warning: this host's CPU has no hardware virtualization"));
    assert_eq!(warned, !hardware, "{run:#?}");
}

#[test]
fn a_pool_with_no_free_frame_at_start_says_so() {
    if !kvm_available("a_pool_with_no_free_frame_at_start_says_so") {
        return;
    }
    let scratch = Scratch::new("pool-full");
    let socket = scratch.path("api.sock");
    let pool = scratch.path("pool");
    let backing = format!("file:{pool}");
    // A VMM killed with all its frames in use leaves them allocated in the pool file.
    let (first, _api) = VmmRun::start_paused(
        &[
            "--memory",
            "16M",
            "--backing",
            &backing,
            "--workload",
            "write:all,checkpoint:1",
        ],
        &socket,
    );
    first.kill();
    let full = "the guest memory pool is exhausted (pool of 16 MiB, 0 bytes free; a pool file \
                keeps the frames of a VMM that was killed)";
    VmmRun::run(&["--memory", "16M", "--backing", &backing])
        .assert_fails(2, &format!("cannot load the test guest image: {full}"));
    let kernel = scratch.path("vmlinux");
    std::fs::write(&kernel, triple_fault_elf()).unwrap();
    VmmRun::run(&[
        "--memory",
        "16M",
        "--backing",
        &backing,
        "--kernel",
        &kernel,
    ])
    .assert_fails(2, &format!("cannot load the kernel {kernel}: {full}"));
}
