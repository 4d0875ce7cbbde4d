//! The built-in test guest's memory workload written as text: `vmm run --workload`, and
//! `workload=` on the command line of the test guest's image (`vmm guest-image`).
//!
//! ```text
//! WORKLOAD := GROUP[,GROUP...]
//! GROUP    := STEP[&STEP...]          (steps of a group run at the same time)
//! STEP     := BASE[*COUNT]            (a step run COUNT times; not a checkpoint)
//! BASE     := KIND[@VCPU]:RANGE[:PATTERN]  |  checkpoint[@VCPU]:ID  |  BALLOON  |  HOTPLUG
//! KIND     := write | verify | verify-zero | read
//! BALLOON  := inflate[@VCPU]:SIZE | deflate[@VCPU]:SIZE | balloon-target[@VCPU]
//!           | report[@VCPU]:RANGE | hint[@VCPU]:RANGE | answer-stats[@VCPU][:COUNT]
//!           | break-balloon[@VCPU]
//! HOTPLUG  := hotplug-target[@VCPU]
//!           | hotplug-request[@VCPU]:REQUEST:ADDRESS:BLOCKS:ANSWER
//! REQUEST  := plug | unplug | unplug-all | state | a number (any request type)
//! ANSWER   := ack | nack | busy | error   (the answer the step expects)
//! RANGE    := all | START+SIZE      (sizes with K/M/G suffixes, 4 KiB aligned, START >= 2M)
//! PATTERN  := a u64, decimal or 0x-hex (write and verify only)
//! ```
//!
//! `all` is the workload area of low RAM: from 2 MiB (below it live the guest's own code and
//! tables) to the end of RAM or the MMIO gap. A range may also lie in the hot-pluggable memory
//! of `--hotplug` (the guest must have plugged it). A step without `@VCPU` is split among all
//! vCPUs. The vCPUs meet at a barrier after each group; a group holds no checkpoint, at most one
//! balloon step (the guest has one balloon driver) and at most one virtio-mem step.
//!
//! Virtio-mem steps drive the `--hotplug` device: `hotplug-target` plugs or unplugs blocks
//! until the plugged size is the requested one (`vmm hotplug set`), the lowest blocks first;
//! `hotplug-request` sends one request as it is (hostile-driver tests; after a
//! `hotplug-target`, which probes the device).
//!
//! Balloon steps drive the `--balloon` device through the test guest's virtio-mmio driver, on
//! vCPU 0 unless `@VCPU` says otherwise. The first one is preceded by a probe of the device in
//! [`BALLOON_SLOT`](crate::layout::BALLOON_SLOT), which negotiates the features of
//! [`BALLOON_DRIVER_FEATURES`](crate::testguest::protocol::BALLOON_DRIVER_FEATURES) that it
//! offers. The balloon takes its pages from the top of the workload area downwards.

use std::str::FromStr;

mod balloon;

use crate::config::{format_size, parse_size, BalloonDeviceConfig, SizeError};
use crate::layout::{ram_regions, RamRegion};
use crate::testguest::protocol::{MAX_STEPS, PAGE_SIZE, WORKLOAD_MIN_ADDR};
use crate::testguest::Workload;

/// The pattern of `write` and `verify` steps that give none.
pub const DEFAULT_PATTERN: u64 = 0x5a5a_5a5a_5a5a_5a5a;
/// The workload of `vmm run` without `--workload`: write and verify every page of `all`.
pub const DEFAULT_WORKLOAD: &str = "write:all,verify:all";

/// Errors of parsing and resolving `--workload`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkloadSpecError {
    /// The option is empty, or has an empty step.
    #[error("empty workload step (steps are separated by single commas or '&')")]
    EmptyStep,
    /// A group joined with '&' holds a checkpoint or more than one balloon step.
    #[error("workload steps '{0}': {1}")]
    BadGroup(String, &'static str),
    /// A step's kind is unknown.
    #[error(
        "unknown workload step '{0}': expected write, verify, verify-zero, read, checkpoint, \
         inflate, deflate, balloon-target, report, hint, answer-stats, break-balloon, \
         hotplug-target or hotplug-request"
    )]
    UnknownKind(String),
    /// A step is missing its range (or checkpoint id) or has extra fields.
    #[error("workload step '{step}': {why}")]
    Malformed {
        /// The step as given.
        step: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A number (vCPU, pattern, checkpoint id) does not parse.
    #[error("workload step '{step}': '{text}' is not a number (decimal or 0x-hex)")]
    BadNumber {
        /// The step as given.
        step: String,
        /// The text.
        text: String,
    },
    /// A range's start or size does not parse.
    #[error("workload step '{step}': {source}")]
    BadSize {
        /// The step as given.
        step: String,
        /// What is wrong with the size.
        source: SizeError,
    },
    /// More steps than the guest's descriptor holds.
    #[error("the workload has {0} steps; the test guest takes at most {MAX_STEPS}")]
    TooManySteps(usize),
    /// A step names a vCPU that does not exist.
    #[error("workload step '{step}' runs on vCPU {vcpu}, but the VM has {vcpus} vCPUs")]
    NoSuchVcpu {
        /// The step as given.
        step: String,
        /// Its vCPU.
        vcpu: u32,
        /// vCPUs of the VM.
        vcpus: usize,
    },
    /// A range is empty, unaligned, below the workload area or not inside one RAM region.
    #[error("workload step '{step}': {why}")]
    BadRange {
        /// The step as given.
        step: String,
        /// What is wrong.
        why: String,
    },
    /// A balloon step without a `--balloon` device.
    #[error("workload step '{0}' drives the balloon: add --balloon (e.g. --balloon size=0)")]
    NoBalloon(String),
    /// A virtio-mem step without `--hotplug`.
    #[error("workload step '{0}' drives the virtio-mem device: add --hotplug total=SIZE")]
    NoHotplug(String),
    /// A balloon step needs a device feature that `--balloon` leaves off.
    #[error("workload step '{step}' needs --balloon {option}")]
    BalloonFeatureOff {
        /// The step as given.
        step: String,
        /// The `--balloon` option it needs.
        option: &'static str,
    },
}

/// A memory step's range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Range {
    /// The whole workload area of low RAM.
    All,
    /// `start+size`.
    Bytes { start: u64, size: u64 },
}

/// What a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Write(Range, u64),
    Verify(Range, u64),
    VerifyZero(Range),
    Read(Range),
    Checkpoint(u64),
    Inflate(u64),
    Deflate(u64),
    BalloonTarget,
    Report(Range),
    Hint(Range),
    AnswerStats(u64),
    BreakBalloon,
    HotplugTarget,
    HotplugRequest {
        kind: u16,
        addr: u64,
        blocks: u16,
        answer: u16,
    },
}

/// One parsed step, kept with its text for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StepSpec {
    text: String,
    vcpu: Option<u32>,
    action: Action,
    /// How many times it runs.
    repeat: u32,
}

/// A parsed `--workload`, resolved against the VM's memory and vCPUs by [`Self::resolve`]: its
/// groups, each of steps that run at the same time (joined with '&').
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadSpec {
    groups: Vec<Vec<StepSpec>>,
}

fn parse_number(step: &str, text: &str) -> Result<u64, WorkloadSpecError> {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(hex, 16).ok()
        }
        Some(_) => None,
        None if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => text.parse().ok(),
        None => None,
    };
    parsed.ok_or_else(|| WorkloadSpecError::BadNumber {
        step: step.to_owned(),
        text: text.to_owned(),
    })
}

fn parse_range(step: &str, text: &str) -> Result<Range, WorkloadSpecError> {
    if text == "all" {
        return Ok(Range::All);
    }
    let (start, size) = text
        .split_once('+')
        .ok_or_else(|| WorkloadSpecError::Malformed {
            step: step.to_owned(),
            why: "the range must be 'all' or START+SIZE (e.g. 2M+64M)",
        })?;
    let size_err = |source| WorkloadSpecError::BadSize {
        step: step.to_owned(),
        source,
    };
    Ok(Range::Bytes {
        start: parse_size(start).map_err(size_err)?,
        size: parse_size(size).map_err(size_err)?,
    })
}

/// Parses one step with its repeat count.
fn parse_step(text: &str) -> Result<StepSpec, WorkloadSpecError> {
    let Some((base, count)) = text.rsplit_once('*') else {
        return parse_base(text, text);
    };
    let count = parse_number(text, count)?;
    let repeat = u32::try_from(count)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| WorkloadSpecError::Malformed {
            step: text.to_owned(),
            why: "the repeat count (*N) must be 1 to 4294967295",
        })?;
    let step = parse_base(text, base)?;
    if step.action.is_checkpoint() {
        return Err(WorkloadSpecError::Malformed {
            step: text.to_owned(),
            why: "a checkpoint cannot be repeated",
        });
    }
    Ok(StepSpec { repeat, ..step })
}

/// Parses `base`, step `text` without its repeat count.
fn parse_base(text: &str, base: &str) -> Result<StepSpec, WorkloadSpecError> {
    if base.is_empty() {
        return Err(WorkloadSpecError::EmptyStep);
    }
    let malformed = |why| WorkloadSpecError::Malformed {
        step: text.to_owned(),
        why,
    };
    let mut fields = base.split(':');
    let head = fields.next().unwrap_or_default();
    let (kind, vcpu) = match head.split_once('@') {
        Some((kind, vcpu)) => (kind, Some(parse_number(text, vcpu)?)),
        None => (head, None),
    };
    let vcpu = vcpu
        .map(|v| u32::try_from(v).map_err(|_| malformed("the vCPU index is too large")))
        .transpose()?;
    if kind == "hotplug-request" {
        let action = parse_hotplug_request(text, fields)?;
        return Ok(StepSpec {
            text: text.to_owned(),
            vcpu,
            action,
            repeat: 1,
        });
    }
    if matches!(
        kind,
        "balloon-target" | "answer-stats" | "break-balloon" | "hotplug-target"
    ) {
        let argument = fields.next();
        if fields.next().is_some() || (kind != "answer-stats" && argument.is_some()) {
            return Err(malformed("too many ':'-separated fields"));
        }
        let action = match argument {
            None if kind == "hotplug-target" => Action::HotplugTarget,
            Some(_) if kind == "hotplug-target" => {
                return Err(malformed("too many ':'-separated fields"))
            }
            None if kind == "balloon-target" => Action::BalloonTarget,
            None if kind == "break-balloon" => Action::BreakBalloon,
            None => Action::AnswerStats(1),
            Some(count) => Action::AnswerStats(parse_number(text, count)?),
        };
        return Ok(StepSpec {
            text: text.to_owned(),
            vcpu,
            action,
            repeat: 1,
        });
    }
    let argument = fields.next();
    let pattern = fields.next();
    if fields.next().is_some() {
        return Err(malformed("too many ':'-separated fields"));
    }
    let range = || {
        let argument = argument
            .ok_or_else(|| malformed("the step needs a range (KIND:all or KIND:START+SIZE)"))?;
        parse_range(text, argument)
    };
    let size = || {
        let argument =
            argument.ok_or_else(|| malformed("the step needs a size (e.g. inflate:64M)"))?;
        balloon::parse_size(text, argument)
    };
    let pattern_or_default = || pattern.map_or(Ok(DEFAULT_PATTERN), |p| parse_number(text, p));
    let no_pattern = |action| match pattern {
        Some(_) => Err(malformed("only write and verify steps take a pattern")),
        None => Ok(action),
    };
    let action = match kind {
        "write" => Action::Write(range()?, pattern_or_default()?),
        "verify" => Action::Verify(range()?, pattern_or_default()?),
        "verify-zero" => no_pattern(Action::VerifyZero(range()?))?,
        "read" => no_pattern(Action::Read(range()?))?,
        "checkpoint" => {
            let id =
                argument.ok_or_else(|| malformed("a checkpoint needs an id (checkpoint:ID)"))?;
            no_pattern(Action::Checkpoint(parse_number(text, id)?))?
        }
        "inflate" => no_pattern(Action::Inflate(size()?))?,
        "deflate" => no_pattern(Action::Deflate(size()?))?,
        "report" => no_pattern(Action::Report(range()?))?,
        "hint" => no_pattern(Action::Hint(range()?))?,
        _ => return Err(WorkloadSpecError::UnknownKind(text.to_owned())),
    };
    Ok(StepSpec {
        text: text.to_owned(),
        vcpu,
        action,
        repeat: 1,
    })
}

/// `REQUEST:ADDRESS:BLOCKS:ANSWER` of a `hotplug-request` step.
fn parse_hotplug_request<'a>(
    text: &str,
    mut fields: impl Iterator<Item = &'a str>,
) -> Result<Action, WorkloadSpecError> {
    let malformed = |why| WorkloadSpecError::Malformed {
        step: text.to_owned(),
        why,
    };
    let (Some(request), Some(addr), Some(blocks), Some(answer), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(malformed(
            "hotplug-request takes REQUEST:ADDRESS:BLOCKS:ANSWER (e.g. plug:4G:1:ack)",
        ));
    };
    let number16 = |field: &str| {
        u16::try_from(parse_number(text, field)?)
            .map_err(|_| malformed("request types and block counts are at most 65535"))
    };
    let kind = match request {
        "plug" => 0,
        "unplug" => 1,
        "unplug-all" => 2,
        "state" => 3,
        other => number16(other)?,
    };
    let addr = parse_size(addr).map_err(|source| WorkloadSpecError::BadSize {
        step: text.to_owned(),
        source,
    })?;
    let answer = match answer {
        "ack" => 0,
        "nack" => 1,
        "busy" => 2,
        "error" => 3,
        _ => return Err(malformed("the answer must be ack, nack, busy or error")),
    };
    Ok(Action::HotplugRequest {
        kind,
        addr,
        blocks: number16(blocks)?,
        answer,
    })
}

impl Action {
    fn is_checkpoint(self) -> bool {
        matches!(self, Action::Checkpoint(_))
    }

    fn is_hotplug(self) -> bool {
        matches!(self, Action::HotplugTarget | Action::HotplugRequest { .. })
    }
}

/// Parses a group of steps joined with '&'.
fn parse_group(text: &str) -> Result<Vec<StepSpec>, WorkloadSpecError> {
    let steps = text
        .split('&')
        .map(parse_step)
        .collect::<Result<Vec<_>, _>>()?;
    if steps.len() > 1 {
        let bad = |why| Err(WorkloadSpecError::BadGroup(text.to_owned(), why));
        if steps.iter().any(|step| step.action.is_checkpoint()) {
            return bad("a checkpoint cannot run at the same time as other steps");
        }
        let balloon_steps = steps
            .iter()
            .filter(|step| balloon::need(step.action) != balloon::Need::Nothing)
            .count();
        if balloon_steps > 1 {
            return bad("at most one balloon step runs at a time (the guest has one driver)");
        }
        if steps.iter().filter(|step| step.action.is_hotplug()).count() > 1 {
            return bad("at most one virtio-mem step runs at a time (the guest has one driver)");
        }
    }
    Ok(steps)
}

impl FromStr for WorkloadSpec {
    type Err = WorkloadSpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let groups = text
            .split(',')
            .map(parse_group)
            .collect::<Result<Vec<_>, _>>()?;
        let steps = groups.iter().map(Vec::len).sum();
        if steps > MAX_STEPS {
            return Err(WorkloadSpecError::TooManySteps(steps));
        }
        Ok(WorkloadSpec { groups })
    }
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        DEFAULT_WORKLOAD
            .parse()
            .expect("the default workload is well formed")
    }
}

impl WorkloadSpec {
    /// Checks that the balloon steps have a `balloon` device with the features they need.
    pub fn check_balloon(
        &self,
        balloon: Option<&BalloonDeviceConfig>,
    ) -> Result<(), WorkloadSpecError> {
        self.groups
            .iter()
            .flatten()
            .try_for_each(|step| balloon::check(&step.text, step.action, balloon))
    }

    /// Checks that the virtio-mem steps have a device (`hotplug`).
    pub fn check_hotplug(&self, hotplug: bool) -> Result<(), WorkloadSpecError> {
        match self.groups.iter().flatten().find(|s| s.action.is_hotplug()) {
            Some(step) if !hotplug => Err(WorkloadSpecError::NoHotplug(step.text.clone())),
            _ => Ok(()),
        }
    }

    /// The workload for a VM with `memory_size` bytes of RAM and `vcpus` vCPUs: `all` becomes
    /// the workload area, and every range must lie inside one RAM region.
    pub fn resolve(&self, memory_size: u64, vcpus: usize) -> Result<Workload, WorkloadSpecError> {
        self.resolve_with_hotplug(memory_size, vcpus, None)
    }

    /// [`Self::resolve`] for a VM with hot-pluggable memory `hotplug`, where ranges may lie too.
    pub fn resolve_with_hotplug(
        &self,
        memory_size: u64,
        vcpus: usize,
        hotplug: Option<RamRegion>,
    ) -> Result<Workload, WorkloadSpecError> {
        let regions = ram_regions(memory_size);
        let area_end = regions.first().map_or(0, |r| r.end());
        let mut workload = Workload::new();
        let mut probed = false;
        for group in &self.groups {
            // The probe goes before the group of the first balloon step, not into it.
            let needs_balloon = group
                .iter()
                .any(|s| balloon::need(s.action) != balloon::Need::Nothing);
            if !probed && needs_balloon {
                workload = balloon::probe(workload, area_end);
                probed = true;
            }
            for (index, step) in group.iter().enumerate() {
                workload = resolve_step(workload, step, area_end, memory_size, vcpus, hotplug)?;
                if index + 1 < group.len() {
                    workload = workload.joined_with_next();
                }
            }
        }
        if workload.steps().len() > MAX_STEPS {
            return Err(WorkloadSpecError::TooManySteps(workload.steps().len()));
        }
        Ok(workload)
    }
}

/// Adds `step` to `workload`, its ranges resolved against RAM of `memory_size` bytes whose
/// workload area ends at `area_end`, for a VM of `vcpus` vCPUs.
fn resolve_step(
    workload: Workload,
    step: &StepSpec,
    area_end: u64,
    memory_size: u64,
    vcpus: usize,
    hotplug: Option<RamRegion>,
) -> Result<Workload, WorkloadSpecError> {
    let bad_range = |why: String| WorkloadSpecError::BadRange {
        step: step.text.clone(),
        why,
    };
    let resolve = |range| match range {
        Range::All if area_end > WORKLOAD_MIN_ADDR => {
            Ok((WORKLOAD_MIN_ADDR, area_end - WORKLOAD_MIN_ADDR))
        }
        Range::All => Err(bad_range(format!(
            "'all' is empty: guest RAM ({}) must be larger than 2 MiB",
            format_size(memory_size)
        ))),
        Range::Bytes { start, size } => check_range(start, size, memory_size, hotplug)
            .map(|_| (start, size))
            .map_err(bad_range),
    };
    let mut workload = match step.action {
        Action::Write(range, pattern) => {
            let (start, size) = resolve(range)?;
            workload.write(start, size, pattern)
        }
        Action::Verify(range, pattern) => {
            let (start, size) = resolve(range)?;
            workload.verify(start, size, pattern)
        }
        Action::VerifyZero(range) => {
            let (start, size) = resolve(range)?;
            workload.verify_zero(start, size)
        }
        Action::Read(range) => {
            let (start, size) = resolve(range)?;
            workload.read(start, size)
        }
        Action::Checkpoint(id) => workload.checkpoint(id),
        Action::Inflate(size) => workload.inflate(size),
        Action::Deflate(size) => workload.deflate(size),
        Action::BalloonTarget => workload.balloon_to_target(),
        Action::Report(range) => {
            let (start, size) = resolve(range)?;
            workload.report(start, size)
        }
        Action::Hint(range) => {
            let (start, size) = resolve(range)?;
            workload.hint(start, size)
        }
        Action::AnswerStats(count) => workload.balloon_stats(count),
        Action::BreakBalloon => workload.balloon_break(),
        Action::HotplugTarget => workload.hotplug_to_requested(),
        Action::HotplugRequest {
            kind,
            addr,
            blocks,
            answer,
        } => workload.hotplug_request(kind, addr, blocks, answer),
    };
    if let Some(vcpu) = step.vcpu {
        if vcpu as usize >= vcpus {
            return Err(WorkloadSpecError::NoSuchVcpu {
                step: step.text.clone(),
                vcpu,
                vcpus,
            });
        }
        workload = workload.on_vcpu(vcpu);
    }
    Ok(workload.repeat(step.repeat))
}

/// Checks that `[start, start + size)` is a non-empty, page-aligned part of the workload area
/// inside one RAM region of `memory_size` bytes of RAM, or inside the hot-pluggable memory.
fn check_range(
    start: u64,
    size: u64,
    memory_size: u64,
    hotplug: Option<RamRegion>,
) -> Result<(), String> {
    if size == 0 {
        return Err("the range is empty".into());
    }
    if !start.is_multiple_of(PAGE_SIZE) || !size.is_multiple_of(PAGE_SIZE) {
        return Err("start and size must be multiples of 4 KiB".into());
    }
    if start < WORKLOAD_MIN_ADDR {
        return Err("the range must start at or above 2M (the guest's own memory)".into());
    }
    let inside = |r: &crate::layout::RamRegion| {
        start >= r.start && start.checked_add(size).is_some_and(|end| end <= r.end())
    };
    if !ram_regions(memory_size).iter().chain(&hotplug).any(inside) {
        return Err(format!(
            "the range is not inside guest RAM ({} of RAM, with the MMIO gap at 3 GiB..4 GiB)",
            format_size(memory_size)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
