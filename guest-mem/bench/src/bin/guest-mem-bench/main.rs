//! guest-mem-bench: populating, faulting and discarding guest memory made of pool frames, with
//! real KVM vCPUs running a tiny guest that touches memory, against plain anonymous memory.
//!
//! Groups (`--groups`):
//! * `populate`: time until the guest has touched all of 1 GiB / 4 GiB (eager, lazy; 2 MiB and
//!   1 GiB frames; plain anonymous memory with and without THP, with and without prefaulting).
//! * `faults`: per-fault latency of lazy population, in the handler and as the guest sees it.
//! * `discard`: discard throughput for both scrub policies, and re-population afterwards.
//! * `steps`: where the time of a fault goes (kernel zeroing, mmap, userfaultfd round trip).
//! * `hotplug`: plugging and unplugging hot-pluggable memory against a balloon, per 2 MiB
//!   block, and a block's hand-over between two VMs on one zone (no KVM needed).
//!
//! CSV on stdout (`group,case,size_mib,stride,metric,unit,run,value`, then the medians with
//! run `median`), a summary on stderr. Huge pages are reserved through sysfs and the old
//! settings restored on exit, on errors and on SIGINT / SIGTERM / SIGHUP.

mod discard;
mod faults;
mod guest;
mod host;
mod hotplug;
mod pinning;
mod populate;
mod report;
mod steps;
mod subject;

use clap::{Parser, ValueEnum};
use guest_mem::testing::{restore_huge_pages_now, KvmError, TouchVm};

use guest::Stride;
use report::Report;

/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// The benchmark groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Group {
    /// Time to populate guest RAM.
    Populate,
    /// Per-fault latency of lazy population.
    Faults,
    /// Discard throughput and re-population.
    Discard,
    /// Where the time of a fault goes.
    Steps,
    /// Hot-pluggable memory against the balloon.
    Hotplug,
}

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "Benchmarks of guest-mem with real KVM vCPUs (CSV on stdout)")]
pub struct Args {
    /// Runs of every measurement (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Groups to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "populate,faults,discard,steps,hotplug"
    )]
    pub groups: Vec<Group>,
    /// Guest RAM sizes in MiB for 2 MiB frames and plain memory (at most 4064: the programs run
    /// in 32-bit mode, and the top 32 MiB below 4 GiB hold the local APIC and the programs).
    #[arg(long, value_delimiter = ',', default_value = "1024,4064")]
    pub sizes: Vec<u64>,
    /// Touch strides of the populate group: 4k, 2m.
    #[arg(long, value_delimiter = ',', default_value = "4k,2m", value_parser = Stride::parse)]
    pub strides: Vec<Stride>,
    /// Most 1 GiB pages to use (1 to 3): 1 GiB frames are measured with 1 GiB and this many GiB.
    #[arg(long, default_value_t = 3)]
    pub giant_pages: u64,
    /// Lazy populate-discard cycles per run in the faults group for 1 GiB frames.
    #[arg(long, default_value_t = 4)]
    pub giant_cycles: usize,
    /// Measure memory cold: do not warm it first (this host is a VM whose hypervisor backs memory on first touch and takes freed memory back).
    #[arg(long)]
    pub cold: bool,
    /// Pin the vCPU thread and the fault handler threads: on one CPU or on two.
    #[arg(long, value_enum, default_value = "none")]
    pub pin: pinning::Pinning,
    /// Only cases whose name contains one of these (e.g. "hugetlb-2m/lazy,plain-anon-thp").
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
}

impl Args {
    /// Whether case `name` is selected.
    pub fn wants(&self, name: &str) -> bool {
        self.cases.is_empty() || self.cases.iter().any(|c| name.contains(c.as_str()))
    }
}

extern "C" fn on_exit_signal(signal: libc::c_int) {
    restore_huge_pages_now();
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(128 + signal) };
}

fn install_signal_handlers() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only makes async-signal-safe calls (open, write, close, _exit).
        unsafe {
            libc::signal(
                signal,
                on_exit_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

fn main() {
    let args = Args::parse();
    let max_mib = guest::MAX_RAM >> 20;
    if let Some(bad) = args
        .sizes
        .iter()
        .find(|&&s| s == 0 || s % 2 != 0 || s > max_mib)
    {
        eprintln!("error: bad size {bad} MiB: a multiple of 2 from 2 to {max_mib}");
        std::process::exit(2);
    }
    if !(1..=3).contains(&args.giant_pages) || args.repeats == 0 || args.giant_cycles == 0 {
        eprintln!("error: --giant-pages must be 1 to 3, --repeats and --giant-cycles at least 1");
        std::process::exit(2);
    }
    install_signal_handlers();
    pinning::set(args.pin);
    if args.cold {
        subject::measure_cold();
    }
    let kvm = TouchVm::empty(0).err().map(|e: KvmError| e.to_string());
    let mut report = Report::new();
    for group in &args.groups {
        match (group, &kvm) {
            (Group::Steps, _) => steps::run(&args, &mut report),
            (Group::Hotplug, _) => hotplug::run(&args, &mut report),
            (_, Some(why)) => eprintln!("SKIP: {group:?}: {why}"),
            (Group::Populate, None) => populate::run(&args, &mut report),
            (Group::Faults, None) => faults::run(&args, &mut report),
            (Group::Discard, None) => discard::run(&args, &mut report),
        }
    }
    report.finish();
}
