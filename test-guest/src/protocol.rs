//! The protocol between the VMM and the built-in test guest, shared by both (`no_std` plain data
//! and constants).
//!
//! # Guest physical memory layout
//!
//! ```text
//! 0x0000_0500            GDT, 0x520 IDT (see crate::arch::x86_64::gdt)
//! 0x0000_1000            workload descriptor (one page, written by the VMM)
//! 0x0000_9000..0x8_0000  identity-mapped page tables
//! 0x0008_0000..0x10_0000 vCPU stacks, STACK_SIZE each
//! 0x0010_0000            the guest image (ELF, loaded by linux-loader), below BALLOON_AREA_START
//! 0x001c_0000..0x1f_0000 the balloon driver's split rings and buffers (BALLOON_AREA_START)
//! 0x001f_0000..0x20_0000 the virtio-mem driver's ring and buffers (HOTPLUG_AREA_START)
//! 0x0020_0000..          workload area: steps may only touch [WORKLOAD_MIN_ADDR, RAM end)
//! 0xfe00_0000            report MMIO window (REPORT_STRIDE bytes per vCPU)
//! ```
//!
//! # Entry
//!
//! Every vCPU enters the image's entry point in 64-bit mode with RDI = its index, RSI = the
//! descriptor address and RSP = the top of its stack.
//!
//! # Descriptor
//!
//! A [`DescriptorHeader`] followed by `step_count` [`Step`]s. The vCPUs run the steps in order with a
//! barrier after each, except after a step flagged [`step_flags::JOINED_WITH_NEXT`]: the vCPUs
//! go on to the next step at once, so that steps on different vCPUs run at the same time. A step
//! with `vcpu == ALL_VCPUS` is split into contiguous, page-aligned parts, one per vCPU,
//! otherwise only vCPU `vcpu` runs it; it runs `repeat` times. Memory steps handle one `u64` at
//! the start of each 4 KiB page: page `a` holds `pattern ^ a` after a WRITE step.
//!
//! # Reports
//!
//! A vCPU reports by an 8-byte write of a value to `report_address(vcpu, code)` (one MMIO exit).
//! During a memory step it sends STEP_PROGRESS with the pages handled so far every
//! [`PROGRESS_PAGES`] pages. Per step it sends STEP_PAGES, STEP_MISMATCHES, then
//! FIRST_MISMATCH_ADDR/VALUE if any, then STEP_DONE with the step index, which commits them. It ends with EXIT and its status and halts.
//! vCPU 0 also prints progress on the 16550 at port 0x3f8.
//!
//! # Balloon steps
//!
//! The guest drives a virtio-balloon over virtio-mmio (virtio 1.2 §4.2.2, §5.5) by polling; see
//! [`step_kind::BALLOON_PROBE`] and the kinds after it. They run on one vCPU (the step's, or 0
//! for [`ALL_VCPUS`]). The balloon takes its pages from the top of a page area downwards, like
//! a stack: inflation grows it downwards, deflation gives back its lowest pages. A balloon step
//! reports the 4 KiB pages it handled as STEP_PAGES; a driver failure counts as one mismatch
//! with a [`balloon_error`] code as FIRST_MISMATCH_ADDR and a detail as FIRST_MISMATCH_VALUE,
//! and makes the run fail like a failed verification.

/// Guest physical address of the workload descriptor.
pub const DESCRIPTOR_ADDR: u64 = 0x1000;
/// Size of the descriptor area.
pub const DESCRIPTOR_SIZE: u64 = 0x1000;
/// `DescriptorHeader::magic`: "LLFVMMWL".
pub const DESCRIPTOR_MAGIC: u64 = u64::from_le_bytes(*b"LLFVMMWL");
/// Size of [`DescriptorHeader`].
pub const HEADER_SIZE: u64 = 16;
/// Size of [`Step`].
pub const STEP_SIZE: u64 = 40;
/// Most steps one descriptor holds.
pub const MAX_STEPS: usize = ((DESCRIPTOR_SIZE - HEADER_SIZE) / STEP_SIZE) as usize;

/// Guest physical address of the page tables.
pub const PAGE_TABLES_START: u64 = 0x9000;
/// End (exclusive) of the page table area.
pub const PAGE_TABLES_END: u64 = 0x8_0000;
/// Guest physical address of the first vCPU stack.
pub const STACKS_START: u64 = 0x8_0000;
/// Stack size per vCPU.
pub const STACK_SIZE: u64 = 0x2000;
/// Most vCPUs the test guest supports (stacks must end below the image).
pub const MAX_VCPUS: u32 = 64;
/// Where the linker script places the guest image.
pub const IMAGE_START: u64 = 0x10_0000;
/// Lowest address a workload step may touch.
pub const WORKLOAD_MIN_ADDR: u64 = 0x20_0000;
/// Start of the balloon driver's area (rings and buffers); the guest image must end below it.
pub const BALLOON_AREA_START: u64 = 0x1c_0000;
/// Distance between the balloon queues' rings in the balloon area (room for 1024 entries).
pub const BALLOON_QUEUE_STRIDE: u64 = 0x8000;
/// Offset of the available ring from a queue's descriptor table (16 bytes x 1024 entries).
pub const BALLOON_AVAIL_OFFSET: u64 = 0x4000;
/// Offset of the used ring from a queue's descriptor table.
pub const BALLOON_USED_OFFSET: u64 = 0x5000;
/// The page frame number buffer of inflate, deflate and raw chains.
pub const BALLOON_PFN_BUFFER: u64 = BALLOON_AREA_START + 4 * BALLOON_QUEUE_STRIDE;
/// Page frame numbers the buffer holds (4 KiB of `le32`).
pub const BALLOON_PFN_BUFFER_ENTRIES: u64 = 1024;
/// The statistics buffer.
pub const BALLOON_STATS_BUFFER: u64 = BALLOON_PFN_BUFFER + 0x1000;
/// The free page hinting command buffer (an `le32`: the run the guest hints for, or STOP).
pub const BALLOON_HINT_CMD_BUFFER: u64 = BALLOON_STATS_BUFFER + 0x100;
/// The largest queue size the driver uses (Linux over virtio-mmio takes 1024 when offered).
pub const BALLOON_QUEUE_SIZE: u32 = 1024;
/// Page frame numbers per inflate or deflate buffer (as Linux: `VIRTIO_BALLOON_ARRAY_PFNS_MAX`).
pub const BALLOON_PFNS_PER_BATCH: u64 = 256;
/// Most descriptors per free page reporting chain (as Linux: `PAGE_REPORTING_CAPACITY`).
pub const BALLOON_REPORT_BATCH: u64 = 32;
/// Largest reported range (as Linux: an order-10 block of 4 MiB); ranges do not cross a
/// multiple of it.
pub const BALLOON_REPORT_MAX_RANGE: u64 = 0x40_0000;
/// Features the balloon driver understands (VERSION_1, MUST_TELL_HOST, STATS_VQ,
/// DEFLATE_ON_OOM, FREE_PAGE_HINT, PAGE_REPORTING); a probe step's `pattern` selects a subset.
pub const BALLOON_DRIVER_FEATURES: u64 = 1 << 32 | 1 << 0 | 1 << 1 | 1 << 2 | 1 << 3 | 1 << 5;
/// Start of the virtio-mem driver's area: its queue's descriptor table, then the rings at
/// [`HOTPLUG_AVAIL_OFFSET`] and [`HOTPLUG_USED_OFFSET`], then the request and the response.
pub const HOTPLUG_AREA_START: u64 = 0x1f_0000;
/// Offset of the available ring from the descriptor table (16 bytes x 128 entries).
pub const HOTPLUG_AVAIL_OFFSET: u64 = 0x800;
/// Offset of the used ring.
pub const HOTPLUG_USED_OFFSET: u64 = 0x1000;
/// The request buffer (24 bytes).
pub const HOTPLUG_REQUEST: u64 = HOTPLUG_AREA_START + 0x2000;
/// The response buffer (10 bytes).
pub const HOTPLUG_RESPONSE: u64 = HOTPLUG_AREA_START + 0x2100;
/// The largest queue size the virtio-mem driver uses.
pub const HOTPLUG_QUEUE_SIZE: u32 = 128;
/// Most blocks one plug or unplug request of the driver names.
pub const HOTPLUG_BLOCKS_PER_REQUEST: u64 = 64;
/// Granule of workload steps: one `u64` is touched per page.
pub const PAGE_SIZE: u64 = 0x1000;
/// A vCPU reports STEP_PROGRESS every this many pages of a memory step (64 MiB).
pub const PROGRESS_PAGES: u64 = 16384;

/// Base of the report MMIO window.
pub const REPORT_MMIO_BASE: u64 = 0xfe00_0000;
/// Bytes of the report window per vCPU (32 codes of 8 bytes).
pub const REPORT_STRIDE: u64 = 0x100;
/// Size of the report MMIO window.
pub const REPORT_MMIO_SIZE: u64 = REPORT_STRIDE * MAX_VCPUS as u64;

/// `Step::vcpu` value: all vCPUs share the step.
pub const ALL_VCPUS: u32 = u32::MAX;

/// Descriptor header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DescriptorHeader {
    /// [`DESCRIPTOR_MAGIC`].
    pub magic: u64,
    /// Number of vCPUs running the workload.
    pub vcpu_count: u32,
    /// Number of steps following the header.
    pub step_count: u32,
}

/// One workload step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// One of [`step_kind`].
    pub kind: u32,
    /// The vCPU running the step, or [`ALL_VCPUS`].
    pub vcpu: u32,
    /// First guest physical address (page aligned).
    pub addr: u64,
    /// Bytes (a multiple of the page size).
    pub size: u64,
    /// Pattern for WRITE/VERIFY; checkpoint id for CHECKPOINT.
    pub pattern: u64,
    /// How many times the step runs (at least 1; 1 for CHECKPOINT).
    pub repeat: u32,
    /// [`step_flags`].
    pub flags: u32,
}

impl Step {
    /// A step of `kind` over `[addr, addr + size)` with `pattern`, run once and split among
    /// all vCPUs, with a barrier after it.
    pub const fn for_all_vcpus(kind: u32, addr: u64, size: u64, pattern: u64) -> Self {
        Step {
            kind,
            vcpu: ALL_VCPUS,
            addr,
            size,
            pattern,
            repeat: 1,
            flags: 0,
        }
    }
}

/// Step flags.
pub mod step_flags {
    /// No barrier after the step: it runs at the same time as the next one (not on CHECKPOINT).
    pub const JOINED_WITH_NEXT: u32 = 1;
}

/// Step kinds.
pub mod step_kind {
    /// Write `pattern ^ page_address` to the first `u64` of each page.
    pub const WRITE: u32 = 1;
    /// Check that the first `u64` of each page holds `pattern ^ page_address`.
    pub const VERIFY: u32 = 2;
    /// Check that the first `u64` of each page is 0.
    pub const VERIFY_ZERO: u32 = 3;
    /// Read the first `u64` of each page (population by reads).
    pub const READ: u32 = 4;
    /// Report CHECKPOINT with `pattern` as id, and wait until the VMM handled it.
    pub const CHECKPOINT: u32 = 5;
    /// Probe and initialize the virtio-balloon at MMIO address `addr` (reset, feature
    /// negotiation with the features of `pattern` that the device offers, queues, a first
    /// statistics buffer, DRIVER_OK). Its page area is `[WORKLOAD_MIN_ADDR, size)`.
    pub const BALLOON_PROBE: u32 = 6;
    /// Inflate by `size` bytes: batches of 256 page frame numbers, `actual` after each.
    pub const BALLOON_INFLATE: u32 = 7;
    /// Deflate by `size` bytes, the most recently inflated pages first.
    pub const BALLOON_DEFLATE: u32 = 8;
    /// Read `num_pages` and inflate or deflate to it.
    pub const BALLOON_TO_TARGET: u32 = 9;
    /// Report `[addr, addr + size)` free (free page reporting): chains of up to 32 device-writable
    /// ranges of up to 4 MiB.
    pub const BALLOON_REPORT: u32 = 10;
    /// Answer `pattern` statistics requests, waiting for each.
    pub const BALLOON_STATS: u32 = 11;
    /// A raw chain, unchecked by the guest, for hostile-driver tests; `pattern` is built by
    /// [`super::balloon_raw`].
    pub const BALLOON_RAW: u32 = 12;
    /// Break the inflate queue (publish an available index more than the queue size ahead),
    /// wait until the device asks for a reset (DEVICE_NEEDS_RESET), then reset and probe it
    /// again as the last probe did: a hostile driver's loop.
    pub const BALLOON_BREAK: u32 = 13;
    /// Plug or unplug blocks of the virtio-mem device until its plugged size is its requested
    /// size (requests of up to [`super::HOTPLUG_BLOCKS_PER_REQUEST`] blocks; the plugged
    /// blocks are the lowest, plugged upwards and unplugged downwards). The first such step
    /// probes the device: the first of the `size / 4 KiB` virtio-mmio slots from `addr` whose
    /// device ID is virtio-mem's (24), negotiating VERSION_1 and UNPLUGGED_INACCESSIBLE; it
    /// takes over what the device shows plugged (a VM whose memory outlived its VMM).
    pub const HOTPLUG_TO_REQUESTED: u32 = 14;
    /// One raw virtio-mem request, unchecked by the guest, for hostile-driver tests: type
    /// `pattern & 0xffff`, `nb_blocks` `(pattern >> 16) & 0xffff`, guest address `addr`; the
    /// step fails unless the answer's type is `(pattern >> 32) & 0xffff`. It needs a
    /// [`HOTPLUG_TO_REQUESTED`] step before it (which probes the device).
    pub const HOTPLUG_RAW: u32 = 15;
    /// Hint `[addr, addr + size)` free in a free page hinting run (virtio 1.2 §5.5.6.6): the
    /// guest asks the VMM for a run (report code HINTING_RUN; a VMM that does not take the
    /// code, e.g. another one booting the image, starts runs through its API), waits for its
    /// id in the configuration space, sends the id, chains of up to 32 device-writable ranges
    /// of up to 4 MiB, and STOP, then waits until the host ends the run (DONE), after which
    /// the pages are the guest's again.
    pub const BALLOON_HINT: u32 = 16;
}

/// Error codes of virtio-mem steps (reported as FIRST_MISMATCH_ADDR).
pub mod hotplug_error {
    /// No virtio-mem device in the slots; detail: the slots looked at.
    pub const NO_DEVICE: u64 = 1;
    /// The device did not accept the features; detail: the features written.
    pub const FEATURES_REJECTED: u64 = 2;
    /// The queue is missing or in use.
    pub const BAD_QUEUE: u64 = 3;
    /// The device answered otherwise than the step needs; detail: the answer's type.
    pub const ANSWER: u64 = 4;
    /// A raw request before a step that probed the device.
    pub const NOT_PROBED: u64 = 5;
    /// The device did not return the request.
    pub const TIMEOUT: u64 = 6;
}

/// Error codes of balloon steps (reported as FIRST_MISMATCH_ADDR).
pub mod balloon_error {
    /// No virtio-mmio balloon at the address; detail: the magic, version or device ID read.
    pub const NO_DEVICE: u64 = 1;
    /// The device did not accept the features; detail: the features written.
    pub const FEATURES_REJECTED: u64 = 2;
    /// A queue is missing or in use; detail: its index.
    pub const BAD_QUEUE: u64 = 3;
    /// A balloon step before a successful probe.
    pub const NOT_PROBED: u64 = 4;
    /// Inflation past the page area or deflation of more than is inflated; detail: the pages
    /// the balloon has.
    pub const NO_ROOM: u64 = 5;
    /// The device did not return a buffer; detail: the queue index.
    pub const TIMEOUT: u64 = 6;
    /// The step needs a feature that was not negotiated; detail: the feature bit.
    pub const NO_FEATURE: u64 = 7;
    /// No free page hinting run started, or the run did not end; detail: the host's
    /// command last read.
    pub const NO_HINTING_RUN: u64 = 8;
}

/// Raw chain options (`Step::pattern` of [`step_kind::BALLOON_RAW`]).
pub mod balloon_raw {
    /// Bits 0..8: the queue index.
    pub const QUEUE_MASK: u64 = 0xff;
    /// Mark every descriptor device-writable.
    pub const WRITABLE: u64 = 1 << 8;
    /// Every descriptor points at one page frame number buffer holding the pages of
    /// `[addr, addr + size)` (at most [`super::BALLOON_PFN_BUFFER_ENTRIES`]); otherwise
    /// descriptor `i` is the range `[addr + i * size, + size)`, with any address and length.
    pub const PFN_BUFFER: u64 = 1 << 9;
    /// Bits 16..32: the number of descriptors in the chain (1 to the queue size).
    pub const COUNT_SHIFT: u32 = 16;

    /// The `pattern` of a raw chain of `count` descriptors on `queue`.
    pub const fn pattern(queue: u8, count: u16, writable: bool, pfn_buffer: bool) -> u64 {
        queue as u64
            | (count as u64) << COUNT_SHIFT
            | if writable { WRITABLE } else { 0 }
            | if pfn_buffer { PFN_BUFFER } else { 0 }
    }

    /// The descriptor count of `pattern`.
    pub const fn count(pattern: u64) -> u64 {
        (pattern >> COUNT_SHIFT) & 0xffff
    }
}

/// Report codes (the offset of the write is `code * 8`).
pub mod report_code {
    /// The vCPU started; value: descriptor address.
    pub const STARTED: u64 = 0;
    /// Pages this vCPU handled in the current step.
    pub const STEP_PAGES: u64 = 1;
    /// Mismatching pages this vCPU found in the current step.
    pub const STEP_MISMATCHES: u64 = 2;
    /// Address of the first mismatching page.
    pub const FIRST_MISMATCH_ADDR: u64 = 3;
    /// Value found in the first mismatching page.
    pub const FIRST_MISMATCH_VALUE: u64 = 4;
    /// The step with index `value` is done on this vCPU.
    pub const STEP_DONE: u64 = 5;
    /// Checkpoint `value` reached; the VMM handles it before the write returns.
    pub const CHECKPOINT: u64 = 6;
    /// The vCPU finished with status `value` (see [`super::exit_status`]).
    pub const EXIT: u64 = 7;
    /// Pages this vCPU handled so far in the current step (all its runs).
    pub const STEP_PROGRESS: u64 = 8;
    /// A hint step asks for a free page hinting run, which ends once the guest says STOP; the
    /// VMM starts it before the write returns. Value: unused.
    pub const HINTING_RUN: u64 = 9;
    /// Number of codes.
    pub const COUNT: u64 = 10;
}

/// Exit statuses.
pub mod exit_status {
    /// All steps ran and every verification passed.
    pub const SUCCESS: u64 = 0;
    /// A verification found mismatches.
    pub const VERIFY_FAILED: u64 = 1;
    /// The descriptor is malformed.
    pub const BAD_DESCRIPTOR: u64 = 2;
}

/// Address a vCPU writes to report `code`.
pub const fn report_address(vcpu: u32, code: u64) -> u64 {
    REPORT_MMIO_BASE + vcpu as u64 * REPORT_STRIDE + code * 8
}

/// The value page `addr` holds after a WRITE step with `pattern`.
pub const fn page_value(pattern: u64, addr: u64) -> u64 {
    pattern ^ addr
}

/// The first and last (exclusive) page of a step of `pages` pages that `vcpu` of `vcpus`
/// handles.
pub const fn vcpu_share(step_vcpu: u32, pages: u64, vcpu: u32, vcpus: u32) -> (u64, u64) {
    if step_vcpu == ALL_VCPUS {
        // The first `pages % vcpus` vCPUs take one page more; no product can overflow.
        let (base, extra) = (pages / vcpus as u64, pages % vcpus as u64);
        let vcpu = vcpu as u64;
        let first = vcpu * base + if vcpu < extra { vcpu } else { extra };
        (first, first + base + if vcpu < extra { 1 } else { 0 })
    } else if step_vcpu == vcpu {
        (0, pages)
    } else {
        (0, 0)
    }
}

/// Whether `step` is well formed for `vcpus` vCPUs (ranges are not checked against RAM).
pub const fn step_is_valid(step: &Step, vcpus: u32) -> bool {
    if step.vcpu != ALL_VCPUS && step.vcpu >= vcpus {
        return false;
    }
    if step.repeat == 0 || step.flags & !step_flags::JOINED_WITH_NEXT != 0 {
        return false;
    }
    if step.kind == step_kind::CHECKPOINT && (step.repeat != 1 || step.flags != 0) {
        return false;
    }
    let aligned = step.addr.is_multiple_of(PAGE_SIZE) && step.size.is_multiple_of(PAGE_SIZE);
    match step.kind {
        step_kind::CHECKPOINT
        | step_kind::BALLOON_TO_TARGET
        | step_kind::BALLOON_STATS
        | step_kind::BALLOON_BREAK => true,
        step_kind::BALLOON_PROBE => aligned && step.size > WORKLOAD_MIN_ADDR,
        step_kind::BALLOON_INFLATE | step_kind::BALLOON_DEFLATE => aligned,
        step_kind::HOTPLUG_TO_REQUESTED => aligned && step.size > 0,
        step_kind::HOTPLUG_RAW => true,
        step_kind::BALLOON_REPORT | step_kind::BALLOON_HINT => {
            aligned
                && step.size > 0
                && step.addr >= WORKLOAD_MIN_ADDR
                && step.addr.checked_add(step.size).is_some()
        }
        step_kind::BALLOON_RAW => {
            let count = balloon_raw::count(step.pattern);
            count >= 1
                && count <= BALLOON_QUEUE_SIZE as u64
                && (step.pattern & balloon_raw::PFN_BUFFER == 0
                    || step.size / PAGE_SIZE <= BALLOON_PFN_BUFFER_ENTRIES)
        }
        step_kind::WRITE | step_kind::VERIFY | step_kind::VERIFY_ZERO | step_kind::READ => {
            aligned && step.addr >= WORKLOAD_MIN_ADDR && step.addr.checked_add(step.size).is_some()
        }
        _ => false,
    }
}
