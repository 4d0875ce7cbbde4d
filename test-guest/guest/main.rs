//! The built-in test guest: a freestanding 64-bit program that runs the memory workload the VMM
//! describes (see the crate's `protocol`) and reports the results over MMIO and the serial port.
//! Built by `build.rs` with `rustc` directly: no std, no libc, static, linked at 1 MiB, against
//! the crate's library compiled the same way.
//!
//! Every instruction may be emulated on hosts without hardware virtualization: it touches one
//! `u64` per 4 KiB page and does little else. KVM's instruction emulator (all PVM has) knows no
//! SSE, so the guest is built without it and reads the descriptor one integer at a time.

#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

mod balloon;
mod driver_memory;
mod failure;
mod hotplug;
mod pvh;
mod self_boot;
mod virtio_mmio;

use test_guest::protocol::*;

// Entry from the VMM: RDI = vCPU index, RSI = descriptor, RSP = stack top (16-byte aligned).
// Entry from a loader of Linux's boot protocol (`self_boot`): RSI = zero page and a stack in
// the loader's low memory, which the guest leaves for vCPU 0's.
global_asm!(
    ".section .text.start, \"ax\"",
    ".global _start",
    "_start:",
    "mov rax, [rsi]",
    "mov rcx, {magic}",
    "cmp rax, rcx",
    "je 1f",
    "mov rsp, {stack_top}",
    "1:",
    "call guest_main",
    "2:",
    "cli",
    "hlt",
    "jmp 2b",
    magic = const DESCRIPTOR_MAGIC,
    stack_top = const STACKS_START + STACK_SIZE,
);

const SERIAL_DATA: u16 = 0x3f8;
const SERIAL_LINE_STATUS: u16 = 0x3fd;
const LINE_STATUS_THR_EMPTY: u8 = 1 << 5;

/// vCPUs that reached the current barrier.
static BARRIER_ARRIVED: AtomicU32 = AtomicU32::new(0);
/// Barrier generation, bumped by the last vCPU to arrive.
static BARRIER_GENERATION: AtomicU32 = AtomicU32::new(0);
/// Mismatches found by all vCPUs, per step.
static STEP_MISMATCHES: [AtomicU64; MAX_STEPS] = [const { AtomicU64::new(0) }; MAX_STEPS];
/// Whether any step failed.
static FAILED: AtomicU32 = AtomicU32::new(0);
/// Whether a loader started the guest (`self_boot`): no VMM reads reports, checkpoints wait for
/// the console and the end resets the machine. One of the `STARTED_BY_*` values.
static SELF_BOOTED: AtomicU32 = AtomicU32::new(STARTED_BY_VMM);
/// [`SELF_BOOTED`]: the VMM started the guest with its descriptor.
const STARTED_BY_VMM: u32 = 0;
/// [`SELF_BOOTED`]: a loader of Linux's 64-bit boot protocol started it.
const STARTED_BY_LINUX_LOADER: u32 = 1;
/// [`SELF_BOOTED`]: a loader of the PVH boot protocol started it (`pvh`).
const STARTED_BY_PVH_LOADER: u32 = 2;

fn self_booted() -> bool {
    SELF_BOOTED.load(Ordering::Relaxed) != STARTED_BY_VMM
}

fn outb(port: u16, value: u8) {
    // SAFETY: port I/O to the serial port has no memory effects.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack)) };
}

fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: port I/O to the serial port has no memory effects.
    unsafe { asm!("in al, dx", out("al") value, in("dx") port, options(nomem, nostack)) };
    value
}

fn outb_serial(byte: u8) {
    while inb(SERIAL_LINE_STATUS) & LINE_STATUS_THR_EMPTY == 0 {}
    outb(SERIAL_DATA, byte);
}

fn print(text: &str) {
    for byte in text.bytes() {
        outb_serial(byte);
    }
}

fn print_number(value: u64) {
    let mut divisor = 1;
    while value / divisor >= 10 {
        divisor *= 10;
    }
    while divisor > 0 {
        outb_serial(b'0' + (value / divisor % 10) as u8);
        divisor /= 10;
    }
}

/// Prints "1 vCPU", "2 vCPUs".
fn print_count(count: u64, noun: &str) {
    print_number(count);
    print(" ");
    print(noun);
    if count != 1 {
        print("s");
    }
}

/// Whether `step` is the balloon probe the VMM adds before the first balloon step.
fn is_probe(step: &Step) -> bool {
    step.kind == step_kind::BALLOON_PROBE
}

fn report(vcpu: u32, code: u64, value: u64) {
    if self_booted() {
        return;
    }
    // SAFETY: the report window is MMIO the VMM emulates; the write exits to the VMM.
    unsafe { write_volatile(report_address(vcpu, code) as *mut u64, value) };
}

fn barrier(vcpus: u32) {
    let generation = BARRIER_GENERATION.load(Ordering::Acquire);
    if BARRIER_ARRIVED.fetch_add(1, Ordering::AcqRel) + 1 == vcpus {
        BARRIER_ARRIVED.store(0, Ordering::Relaxed);
        BARRIER_GENERATION.store(generation.wrapping_add(1), Ordering::Release);
    } else {
        while BARRIER_GENERATION.load(Ordering::Acquire) == generation {
            core::hint::spin_loop();
        }
    }
}

fn halt(vcpu: u32, status: u64) -> ! {
    if self_booted() {
        self_boot::reset();
    }
    report(vcpu, report_code::EXIT, status);
    loop {
        // SAFETY: halting with interrupts off only stops this vCPU.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) };
    }
}

/// Pages and mismatches of one vCPU in one step, over all its runs.
#[derive(Clone, Copy, Default)]
struct Tally {
    pages: u64,
    mismatches: u64,
}

/// Runs this vCPU's share of a memory step once, adding to `tally`; reports the first mismatch
/// of the step and progress every [`PROGRESS_PAGES`] pages.
fn run_memory_step(step: &Step, vcpu: u32, vcpus: u32, tally: &mut Tally) {
    let (first, last) = vcpu_share(step.vcpu, step.size / PAGE_SIZE, vcpu, vcpus);
    for page in first..last {
        let addr = step.addr + page * PAGE_SIZE;
        let word = addr as *mut u64;
        tally.pages += 1;
        if tally.pages.is_multiple_of(PROGRESS_PAGES) {
            report(vcpu, report_code::STEP_PROGRESS, tally.pages);
        }
        let expected = match step.kind {
            step_kind::WRITE => {
                // SAFETY: the page is workload RAM the descriptor assigned to this vCPU.
                unsafe { write_volatile(word, page_value(step.pattern, addr)) };
                continue;
            }
            step_kind::VERIFY => page_value(step.pattern, addr),
            _ => 0,
        };
        // SAFETY: as above; reads of workload RAM.
        let found = unsafe { read_volatile(word) };
        if step.kind != step_kind::READ && found != expected {
            if tally.mismatches == 0 {
                report(vcpu, report_code::FIRST_MISMATCH_ADDR, addr);
                report(vcpu, report_code::FIRST_MISMATCH_VALUE, found);
            }
            tally.mismatches += 1;
        }
    }
}

/// Runs a balloon or virtio-mem step once on its vCPU, adding to `tally`; prints a failure.
fn run_device_step(step: &Step, vcpu: u32, tally: &mut Tally) {
    let owner = if step.vcpu == ALL_VCPUS { 0 } else { step.vcpu };
    if vcpu != owner {
        return;
    }
    let (device, result) = if hotplug::is_hotplug_step(step.kind) {
        ("hotplug", hotplug::run_step(step))
    } else {
        if step.kind == step_kind::BALLOON_HINT {
            report(vcpu, report_code::HINTING_RUN, 0);
        }
        ("balloon", balloon::run_step(step))
    };
    match result {
        Ok(pages) => tally.pages += pages,
        Err(failure) => {
            report(vcpu, report_code::FIRST_MISMATCH_ADDR, failure.code());
            report(vcpu, report_code::FIRST_MISMATCH_VALUE, failure.detail());
            print(device);
            print(" error ");
            print_number(failure.code());
            print(", detail ");
            print_number(failure.detail());
            print("\n");
            tally.mismatches += 1;
        }
    }
}

fn read_descriptor(descriptor: u64, vcpu: u32) -> (DescriptorHeader, u64) {
    // SAFETY: the VMM wrote the descriptor at this address before starting the vCPUs.
    let header = unsafe {
        DescriptorHeader {
            magic: read_volatile(descriptor as *const u64),
            vcpu_count: read_volatile((descriptor + 8) as *const u32),
            step_count: read_volatile((descriptor + 12) as *const u32),
        }
    };
    let valid = header.magic == DESCRIPTOR_MAGIC
        && header.step_count as usize <= MAX_STEPS
        && header.vcpu_count >= 1
        && header.vcpu_count <= MAX_VCPUS
        && vcpu < header.vcpu_count;
    if !valid {
        halt(vcpu, exit_status::BAD_DESCRIPTOR);
    }
    (header, descriptor + HEADER_SIZE)
}

/// Reads the step at `addr` field by field (a whole-struct copy could use SSE).
fn read_step(addr: u64) -> Step {
    // SAFETY: within the descriptor page (step_count <= MAX_STEPS).
    unsafe {
        Step {
            kind: read_volatile(addr as *const u32),
            vcpu: read_volatile((addr + 4) as *const u32),
            addr: read_volatile((addr + 8) as *const u64),
            size: read_volatile((addr + 16) as *const u64),
            pattern: read_volatile((addr + 24) as *const u64),
            repeat: read_volatile((addr + 32) as *const u32),
            flags: read_volatile((addr + 36) as *const u32),
        }
    }
}

/// Prints the result of a step with the user's number `number`, found by all vCPUs.
fn print_result(step: &Step, number: u64, mismatches: u64) {
    if mismatches != 0 {
        FAILED.store(1, Ordering::Relaxed);
    }
    if is_probe(step) {
        // A probe that worked is not worth a line.
        if mismatches != 0 {
            print("balloon probe: FAILED\n");
        }
        return;
    }
    print("step ");
    print_number(number);
    if mismatches == 0 {
        print(": ok\n");
    } else {
        print(": FAILED, mismatching pages: ");
        print_number(mismatches);
        print("\n");
    }
}

#[no_mangle]
extern "C" fn guest_main(vcpu: u64, descriptor: u64) -> ! {
    let mut vcpu = vcpu as u32;
    let mut descriptor = descriptor;
    // SAFETY: RSI points at the VMM's descriptor or at a loader's zero page.
    let magic = unsafe { read_volatile(descriptor as *const u64) };
    if magic != DESCRIPTOR_MAGIC && self_boot::is_zero_page(descriptor) {
        // The PVH entry wrote this zero page and said so; otherwise a loader of Linux's did.
        let _ = SELF_BOOTED.compare_exchange(
            STARTED_BY_VMM,
            STARTED_BY_LINUX_LOADER,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        vcpu = 0;
        descriptor = match self_boot::prepare(descriptor) {
            Ok(descriptor) => descriptor,
            Err(why) => {
                print("test guest: bad workload= on the command line: ");
                print(why);
                print("\n");
                self_boot::reset();
            }
        };
    }
    report(vcpu, report_code::STARTED, descriptor);
    let (header, steps) = read_descriptor(descriptor, vcpu);
    let vcpus = header.vcpu_count;
    if vcpu == 0 {
        // The balloon probe is the VMM's, not one of the steps the user wrote.
        let user_steps = (0..header.step_count)
            .filter(|&index| !is_probe(&read_step(steps + u64::from(index) * STEP_SIZE)))
            .count();
        print("llfree-vmm test guest: ");
        print_count(vcpus.into(), "vCPU");
        print(", ");
        print_count(user_steps as u64, "step");
        print("\n");
        match SELF_BOOTED.load(Ordering::Relaxed) {
            STARTED_BY_LINUX_LOADER => print("test guest: booted through Linux's boot protocol\n"),
            STARTED_BY_PVH_LOADER => print("test guest: booted through PVH\n"),
            _ => {}
        }
    }
    let mut status = exit_status::SUCCESS;
    // The first step whose result vCPU 0 has not printed, and the user's number of the last
    // step printed (1 for the first step they wrote).
    let mut unprinted = 0;
    let mut user_step = 0;
    for index in 0..header.step_count {
        let step = read_step(steps + u64::from(index) * STEP_SIZE);
        if !step_is_valid(&step, vcpus) {
            halt(vcpu, exit_status::BAD_DESCRIPTOR);
        }
        if step.kind == step_kind::CHECKPOINT {
            let owner = if step.vcpu == ALL_VCPUS { 0 } else { step.vcpu };
            if vcpu == owner && self_booted() {
                print("checkpoint ");
                print_number(step.pattern);
                print(": waiting for a byte on the console\n");
                self_boot::wait_for_input();
            } else if vcpu == owner {
                report(vcpu, report_code::CHECKPOINT, step.pattern);
            }
        } else {
            let mut tally = Tally::default();
            for _ in 0..step.repeat {
                if balloon::is_balloon_step(step.kind) || hotplug::is_hotplug_step(step.kind) {
                    run_device_step(&step, vcpu, &mut tally);
                } else {
                    run_memory_step(&step, vcpu, vcpus, &mut tally);
                }
                if tally.mismatches != 0 {
                    break;
                }
            }
            report(vcpu, report_code::STEP_PAGES, tally.pages);
            report(vcpu, report_code::STEP_MISMATCHES, tally.mismatches);
            if tally.mismatches != 0 {
                STEP_MISMATCHES[index as usize].fetch_add(tally.mismatches, Ordering::Relaxed);
                status = exit_status::VERIFY_FAILED;
            }
        }
        report(vcpu, report_code::STEP_DONE, index.into());
        let last = index + 1 == header.step_count;
        if step.flags & step_flags::JOINED_WITH_NEXT != 0 && !last {
            continue;
        }
        barrier(vcpus);
        if vcpu == 0 {
            for done in unprinted..=index {
                let step = read_step(steps + u64::from(done) * STEP_SIZE);
                let mismatches = STEP_MISMATCHES[done as usize].load(Ordering::Relaxed);
                if !is_probe(&step) {
                    user_step += 1;
                }
                print_result(&step, user_step, mismatches);
            }
            unprinted = index + 1;
        }
        barrier(vcpus);
    }
    if vcpu == 0 {
        if FAILED.load(Ordering::Relaxed) == 0 {
            print("test guest: done\n");
        } else {
            print("test guest: FAILED\n");
        }
    }
    halt(vcpu, status)
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    print("test guest: panic\n");
    if self_booted() {
        self_boot::reset();
    }
    loop {
        // SAFETY: halting with interrupts off only stops this vCPU.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) };
    }
}
