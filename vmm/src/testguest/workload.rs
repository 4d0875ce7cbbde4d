//! Workloads for the test guest: a builder, validation against guest memory, and the encoding
//! into the descriptor the guest reads (see [`super::protocol`]).

use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryBackend};

use super::protocol::{
    self, balloon_raw, step_kind, DescriptorHeader, Step, DESCRIPTOR_ADDR, DESCRIPTOR_MAGIC,
    MAX_STEPS, MAX_VCPUS, WORKLOAD_MIN_ADDR,
};

/// Errors of workload validation and encoding.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkloadError {
    /// More steps than fit in the descriptor page.
    #[error("the workload has {0} steps; at most {MAX_STEPS} fit in the descriptor")]
    TooManySteps(usize),
    /// The vCPU count is outside what the test guest supports.
    #[error("the test guest runs on 1 to {MAX_VCPUS} vCPUs, not {0}")]
    BadVcpuCount(usize),
    /// A step is malformed: unaligned, below the workload area, or for a missing vCPU.
    #[error(
        "step {index} ({kind}) is malformed: addresses and sizes must be 4 KiB aligned, start \
         at or above {min:#x} and name an existing vCPU (addr {addr:#x}, size {size:#x}, \
         vcpu {vcpu})",
        min = protocol::WORKLOAD_MIN_ADDR
    )]
    BadStep {
        /// Index of the step.
        index: usize,
        /// Step kind.
        kind: &'static str,
        /// Its address.
        addr: u64,
        /// Its size.
        size: u64,
        /// Its vCPU (`u32::MAX`: all).
        vcpu: u32,
    },
    /// A step touches memory that is not guest RAM.
    #[error("step {index} touches {addr:#x}+{size:#x}, which is not all guest RAM")]
    OutsideRam {
        /// Index of the step.
        index: usize,
        /// Its address.
        addr: u64,
        /// Its size.
        size: u64,
    },
    /// The descriptor could not be written.
    #[error("cannot write the workload descriptor at {DESCRIPTOR_ADDR:#x}: {0}")]
    Write(String),
}

/// A raw chain for hostile-driver tests ([`Workload::balloon_raw`]): the guest posts it as it
/// is, without any check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawChain {
    /// The queue (0 inflate, 1 deflate, then statistics and reporting as negotiated).
    pub queue: u8,
    /// Descriptors in the chain (1 to the queue size).
    pub count: u16,
    /// Mark every descriptor device-writable.
    pub writable: bool,
    /// Every descriptor points at one buffer with the page frame numbers of
    /// `[addr, addr + size)` (at most 1024); otherwise descriptor `i` is the range
    /// `[addr + i * size, + size)`.
    pub pfn_buffer: bool,
    /// First address (of the pages, or of the first range).
    pub addr: u64,
    /// Bytes (of the pages, or of each range).
    pub size: u64,
}

/// A memory workload: steps the test guest's vCPUs run in order, with a barrier after each
/// (unless [`Workload::joined_with_next`] says otherwise).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "Vec<SavedStep>", into = "Vec<SavedStep>")]
pub struct Workload {
    steps: Vec<Step>,
}

/// The guest's [`Step`] (which has no serde) as serde sees it.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(remote = "Step")]
struct StepDef {
    kind: u32,
    vcpu: u32,
    addr: u64,
    size: u64,
    pattern: u64,
    repeat: u32,
    flags: u32,
}

/// A step as a snapshot keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedStep(#[serde(with = "StepDef")] Step);

impl From<Vec<SavedStep>> for Workload {
    /// The steps are checked when the workload is used ([`Workload::validate`]).
    fn from(steps: Vec<SavedStep>) -> Self {
        Workload {
            steps: steps.into_iter().map(|step| step.0).collect(),
        }
    }
}

impl From<Workload> for Vec<SavedStep> {
    fn from(workload: Workload) -> Self {
        workload.steps.into_iter().map(SavedStep).collect()
    }
}

/// Name of a step kind, for messages.
pub fn kind_name(kind: u32) -> &'static str {
    match kind {
        step_kind::WRITE => "write",
        step_kind::VERIFY => "verify",
        step_kind::VERIFY_ZERO => "verify-zero",
        step_kind::READ => "read",
        step_kind::CHECKPOINT => "checkpoint",
        step_kind::BALLOON_PROBE => "balloon-probe",
        step_kind::BALLOON_INFLATE => "inflate",
        step_kind::BALLOON_DEFLATE => "deflate",
        step_kind::BALLOON_TO_TARGET => "balloon-to-target",
        step_kind::BALLOON_REPORT => "report",
        step_kind::BALLOON_STATS => "balloon-stats",
        step_kind::BALLOON_RAW => "balloon-raw",
        step_kind::BALLOON_BREAK => "break-balloon",
        step_kind::BALLOON_HINT => "hint",
        step_kind::HOTPLUG_TO_REQUESTED => "hotplug-target",
        step_kind::HOTPLUG_RAW => "hotplug-request",
        _ => "unknown",
    }
}

impl Workload {
    /// The number a user gives step `index` (1 for the first step), counting the steps they
    /// wrote: `None` for the balloon probe, which the VMM adds before the first balloon step.
    pub fn user_step_number(&self, index: usize) -> Option<usize> {
        let step = self.steps.get(index)?;
        if step.kind == step_kind::BALLOON_PROBE {
            return None;
        }
        Some(
            self.steps[..=index]
                .iter()
                .filter(|s| s.kind != step_kind::BALLOON_PROBE)
                .count(),
        )
    }

    /// An empty workload.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(mut self, kind: u32, addr: u64, size: u64, pattern: u64) -> Self {
        self.steps
            .push(Step::for_all_vcpus(kind, addr, size, pattern));
        self
    }

    /// Writes `pattern ^ page address` into one `u64` of every page of `[addr, addr + size)`,
    /// the range split among all vCPUs.
    pub fn write(self, addr: u64, size: u64, pattern: u64) -> Self {
        self.push(step_kind::WRITE, addr, size, pattern)
    }

    /// Checks what [`Self::write`] with `pattern` wrote.
    pub fn verify(self, addr: u64, size: u64, pattern: u64) -> Self {
        self.push(step_kind::VERIFY, addr, size, pattern)
    }

    /// Checks that one `u64` of every page of the range is zero (fresh or discarded memory).
    pub fn verify_zero(self, addr: u64, size: u64) -> Self {
        self.push(step_kind::VERIFY_ZERO, addr, size, 0)
    }

    /// Reads one `u64` of every page of the range.
    pub fn read(self, addr: u64, size: u64) -> Self {
        self.push(step_kind::READ, addr, size, 0)
    }

    /// Stops at a checkpoint: the VMM runs its checkpoint hook with `id` while all vCPUs wait.
    pub fn checkpoint(self, id: u64) -> Self {
        self.push(step_kind::CHECKPOINT, 0, 0, id)
    }

    /// Probes the virtio-balloon at MMIO address `base` and negotiates the driver's features
    /// that `features` selects (see [`protocol::BALLOON_DRIVER_FEATURES`]). The balloon takes
    /// its pages from `[WORKLOAD_MIN_ADDR, top)`, highest first. Balloon steps run on vCPU 0
    /// unless [`Self::on_vcpu`] says otherwise.
    pub fn balloon_probe(self, base: u64, top: u64, features: u64) -> Self {
        self.push(step_kind::BALLOON_PROBE, base, top, features)
    }

    /// Inflates the balloon by `bytes` (4 KiB aligned), in batches of 256 pages.
    pub fn inflate(self, bytes: u64) -> Self {
        self.push(step_kind::BALLOON_INFLATE, 0, bytes, 0)
    }

    /// Deflates the balloon by `bytes` (4 KiB aligned), its most recent pages first.
    pub fn deflate(self, bytes: u64) -> Self {
        self.push(step_kind::BALLOON_DEFLATE, 0, bytes, 0)
    }

    /// Inflates or deflates the balloon to the device's target (`num_pages`).
    pub fn balloon_to_target(self) -> Self {
        self.push(step_kind::BALLOON_TO_TARGET, 0, 0, 0)
    }

    /// Reports `[addr, addr + size)` free through free page reporting.
    pub fn report(self, addr: u64, size: u64) -> Self {
        self.push(step_kind::BALLOON_REPORT, addr, size, 0)
    }

    /// Hints `[addr, addr + size)` free in a free page hinting run the VMM is asked to start.
    pub fn hint(self, addr: u64, size: u64) -> Self {
        self.push(step_kind::BALLOON_HINT, addr, size, 0)
    }

    /// Answers `count` statistics requests of the device, waiting for each.
    pub fn balloon_stats(self, count: u64) -> Self {
        self.push(step_kind::BALLOON_STATS, 0, 0, count)
    }

    /// Posts `chain` to the balloon as it is (hostile-driver tests).
    pub fn balloon_raw(self, chain: RawChain) -> Self {
        let pattern =
            balloon_raw::pattern(chain.queue, chain.count, chain.writable, chain.pfn_buffer);
        self.push(step_kind::BALLOON_RAW, chain.addr, chain.size, pattern)
    }

    /// Breaks the balloon's inflate queue, waits until the device asks for a reset, and resets
    /// and probes it again (hostile-driver tests; with [`Self::repeat`], a loop).
    pub fn balloon_break(self) -> Self {
        self.push(step_kind::BALLOON_BREAK, 0, 0, 0)
    }

    /// Plugs or unplugs blocks of the virtio-mem device to its requested size; the first such
    /// step probes the device in the virtio-mmio slots.
    pub fn hotplug_to_requested(self) -> Self {
        let slots = crate::layout::VIRTIO_MMIO_SLOTS * crate::layout::VIRTIO_MMIO_SIZE;
        self.push(
            step_kind::HOTPLUG_TO_REQUESTED,
            crate::layout::VIRTIO_MMIO_START,
            slots,
            0,
        )
    }

    /// Sends the virtio-mem device one request as it is (hostile-driver tests): `kind` on
    /// `blocks` blocks from `addr`; the step fails unless the answer's type is `answer`.
    pub fn hotplug_request(self, kind: u16, addr: u64, blocks: u16, answer: u16) -> Self {
        let pattern = u64::from(kind) | u64::from(blocks) << 16 | u64::from(answer) << 32;
        self.push(step_kind::HOTPLUG_RAW, addr, 0, pattern)
    }

    /// Makes the last step run on vCPU `vcpu` alone instead of on all vCPUs.
    pub fn on_vcpu(mut self, vcpu: u32) -> Self {
        if let Some(step) = self.steps.last_mut() {
            step.vcpu = vcpu;
        }
        self
    }

    /// Makes the last step run `count` times (at least once) before the barrier.
    pub fn repeat(mut self, count: u32) -> Self {
        if let Some(step) = self.steps.last_mut() {
            step.repeat = count;
        }
        self
    }

    /// Lets the last step and the next one run at the same time: no barrier between them.
    pub fn joined_with_next(mut self) -> Self {
        if let Some(step) = self.steps.last_mut() {
            step.flags |= protocol::step_flags::JOINED_WITH_NEXT;
        }
        self
    }

    /// The steps in descriptor form.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Checks the workload for `vcpus` vCPUs against `memory`.
    pub fn validate<M: GuestMemoryBackend>(
        &self,
        memory: &M,
        vcpus: usize,
    ) -> Result<(), WorkloadError> {
        if vcpus == 0 || vcpus > MAX_VCPUS as usize {
            return Err(WorkloadError::BadVcpuCount(vcpus));
        }
        if self.steps.len() > MAX_STEPS {
            return Err(WorkloadError::TooManySteps(self.steps.len()));
        }
        for (index, step) in self.steps.iter().enumerate() {
            if !protocol::step_is_valid(step, vcpus as u32) {
                return Err(WorkloadError::BadStep {
                    index,
                    kind: kind_name(step.kind),
                    addr: step.addr,
                    size: step.size,
                    vcpu: step.vcpu,
                });
            }
            let in_ram = ram_range(step).is_none_or(|(addr, size)| {
                usize::try_from(size).is_ok_and(|size| memory.check_range(GuestAddress(addr), size))
            });
            if !in_ram {
                return Err(WorkloadError::OutsideRam {
                    index,
                    addr: step.addr,
                    size: step.size,
                });
            }
        }
        Ok(())
    }

    /// Validates the workload and writes its descriptor at [`DESCRIPTOR_ADDR`].
    pub fn write_descriptor<M: GuestMemoryBackend>(
        &self,
        memory: &M,
        vcpus: usize,
    ) -> Result<(), WorkloadError> {
        self.validate(memory, vcpus)?;
        let header = DescriptorHeader {
            magic: DESCRIPTOR_MAGIC,
            vcpu_count: vcpus as u32,
            step_count: self.steps.len() as u32,
        };
        let mut bytes = header.as_slice().to_vec();
        for step in &self.steps {
            bytes.extend_from_slice(step.as_slice());
        }
        memory
            .write_slice(&bytes, GuestAddress(DESCRIPTOR_ADDR))
            .map_err(|e| WorkloadError::Write(e.to_string()))
    }
}

/// The guest RAM a (well-formed) step touches or hands to a device, if any.
fn ram_range(step: &Step) -> Option<(u64, u64)> {
    match step.kind {
        step_kind::WRITE
        | step_kind::VERIFY
        | step_kind::VERIFY_ZERO
        | step_kind::READ
        | step_kind::BALLOON_REPORT
        | step_kind::BALLOON_HINT => Some((step.addr, step.size)),
        step_kind::BALLOON_PROBE => Some((WORKLOAD_MIN_ADDR, step.size - WORKLOAD_MIN_ADDR)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testguest::protocol::{ALL_VCPUS, HEADER_SIZE, STEP_SIZE};
    use vm_memory::GuestMemoryMmap;

    const MIB: u64 = 1 << 20;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap()
    }

    #[test]
    fn encodes_header_and_steps_as_the_guest_reads_them() {
        assert_eq!(std::mem::size_of::<DescriptorHeader>() as u64, HEADER_SIZE);
        assert_eq!(std::mem::size_of::<Step>() as u64, STEP_SIZE);
        let mem = memory();
        let workload = Workload::new()
            .write(2 * MIB, 4 * MIB, 0xabcd)
            .checkpoint(7)
            .verify(2 * MIB, MIB, 0xabcd)
            .on_vcpu(1);
        workload.write_descriptor(&mem, 2).unwrap();
        let header: DescriptorHeader = mem.read_obj(GuestAddress(DESCRIPTOR_ADDR)).unwrap();
        assert_eq!(
            header,
            DescriptorHeader {
                magic: DESCRIPTOR_MAGIC,
                vcpu_count: 2,
                step_count: 3
            }
        );
        for (index, expected) in workload.steps().iter().enumerate() {
            let addr = DESCRIPTOR_ADDR + HEADER_SIZE + index as u64 * STEP_SIZE;
            let step: Step = mem.read_obj(GuestAddress(addr)).unwrap();
            assert_eq!(step, *expected);
        }
        assert_eq!(workload.steps()[2].vcpu, 1);
        assert_eq!(workload.steps()[0].vcpu, ALL_VCPUS);
    }

    #[test]
    fn rejects_malformed_steps() {
        let mem = memory();
        let bad = [
            Workload::new().write(2 * MIB + 8, MIB, 1),
            Workload::new().write(2 * MIB, 100, 1),
            Workload::new().write(MIB, MIB, 1),
            Workload::new().read(2 * MIB, MIB).on_vcpu(2),
        ];
        for workload in bad {
            let err = workload.validate(&mem, 2).unwrap_err();
            assert!(
                matches!(err, WorkloadError::BadStep { index: 0, .. }),
                "{err}"
            );
        }
        let outside = Workload::new().verify_zero(4 * MIB, 8 * MIB);
        assert_eq!(
            outside.validate(&mem, 1),
            Err(WorkloadError::OutsideRam {
                index: 0,
                addr: 4 * MIB,
                size: 8 * MIB
            })
        );
        let wrapping = Workload::new().write(u64::MAX - 0xfff, 0x2000, 0);
        assert!(wrapping.validate(&mem, 1).is_err());
    }

    #[test]
    fn rejects_bad_vcpu_counts_and_too_many_steps() {
        let mem = memory();
        assert_eq!(
            Workload::new().validate(&mem, 0),
            Err(WorkloadError::BadVcpuCount(0))
        );
        assert_eq!(
            Workload::new().validate(&mem, 65),
            Err(WorkloadError::BadVcpuCount(65))
        );
        let long = (0..=MAX_STEPS).fold(Workload::new(), |w, i| w.checkpoint(i as u64));
        assert_eq!(
            long.validate(&mem, 1),
            Err(WorkloadError::TooManySteps(MAX_STEPS + 1))
        );
    }

    #[test]
    fn shares_split_pages_without_gaps_or_overlaps() {
        for vcpus in 1..=7u32 {
            let mut next = 0;
            for vcpu in 0..vcpus {
                let (first, last) = protocol::vcpu_share(ALL_VCPUS, 1001, vcpu, vcpus);
                assert_eq!(first, next);
                assert!(last - first <= 1001 / u64::from(vcpus) + 1);
                next = last;
            }
            assert_eq!(next, 1001);
        }
        assert_eq!(protocol::vcpu_share(1, 10, 1, 2), (0, 10));
        assert_eq!(protocol::vcpu_share(1, 10, 0, 2), (0, 0));
    }

    #[test]
    fn balloon_steps_encode_and_validate() {
        let mem = memory();
        let raw = RawChain {
            queue: 3,
            count: 100,
            writable: true,
            pfn_buffer: false,
            addr: 0xc000_0000,
            size: 0x123,
        };
        let workload = Workload::new()
            .balloon_probe(0xc000_0000, 8 * MIB, protocol::BALLOON_DRIVER_FEATURES)
            .inflate(MIB)
            .deflate(4096)
            .balloon_to_target()
            .report(4 * MIB, 4 * MIB)
            .balloon_stats(2)
            .balloon_raw(raw)
            .on_vcpu(1);
        workload.validate(&mem, 2).unwrap();
        let steps = workload.steps();
        assert_eq!(steps[0].kind, step_kind::BALLOON_PROBE);
        assert_eq!((steps[0].addr, steps[0].size), (0xc000_0000, 8 * MIB));
        assert_eq!(steps[6].pattern, 3 | 100 << 16 | balloon_raw::WRITABLE);
        assert_eq!(balloon_raw::count(steps[6].pattern), 100);
        assert_eq!(steps[6].vcpu, 1);
        assert_eq!(kind_name(steps[4].kind), "report");

        let beyond = Workload::new().balloon_probe(0xc000_0000, 16 * MIB, 0);
        assert!(matches!(
            beyond.validate(&mem, 1),
            Err(WorkloadError::OutsideRam { index: 0, .. })
        ));
        let bad = [
            Workload::new().balloon_probe(0xc000_0000, MIB, 0),
            Workload::new().inflate(100),
            Workload::new().report(4 * MIB, 0),
            Workload::new().report(MIB, MIB),
            Workload::new().balloon_raw(RawChain { count: 0, ..raw }),
            Workload::new().balloon_raw(RawChain { count: 2000, ..raw }),
            Workload::new().balloon_raw(RawChain {
                pfn_buffer: true,
                size: 1025 * 4096,
                ..raw
            }),
        ];
        for workload in bad {
            let err = workload.validate(&mem, 1).unwrap_err();
            assert!(matches!(err, WorkloadError::BadStep { .. }), "{err}");
        }
    }

    #[test]
    fn the_guest_image_ends_below_the_balloon_area() {
        use linux_loader::loader::{Elf, KernelLoader};
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let mut image = std::io::Cursor::new(crate::testguest::IMAGE);
        let loaded = Elf::load(&mem, None, &mut image, Some(GuestAddress(0x10_0000))).unwrap();
        assert!(loaded.kernel_end <= protocol::BALLOON_AREA_START);
    }
}
