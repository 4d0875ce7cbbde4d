//! The command line, declared with clap's derive API. Every flag's doc comment is its `--help`.

// The doc comments below are clap's --help text (with brackets for optional parts), not
// rustdoc links.
#![allow(rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use vmm::config::{
    parse_mib, parse_size, BackingKind, BalloonDeviceConfig, DriveConfig, VsockConfig,
};

use crate::exit::EXIT_STATUS_HELP;
use vmm::testguest::WorkloadSpec;
use vmm_api::model::NetworkOverride;

/// Where a VMM of Firecracker's kind serves its API without --api-sock: Firecracker's default.
pub const DEFAULT_API_SOCK: &str = "/run/firecracker.socket";

/// llfree-vmm: a KVM microVM monitor whose guest memory comes from an LLFree frame pool.
///
/// `vmm run` boots a VM (the built-in test guest unless --kernel is given); the other
/// subcommands talk to a running VMM through its API socket (see `vmm run --api-socket`).
/// `vmm --api-sock PATH`, as Firecracker starts, serves Firecracker's API without a VM: a
/// client configures one (PUT /machine-config, /boot-source, /drives/ID, ...) and boots it
/// (PUT /actions InstanceStart), or loads a snapshot (PUT /snapshot/load).
#[derive(Debug, Parser)]
#[command(
    name = "vmm",
    version,
    after_help = EXIT_STATUS_HELP,
    arg_required_else_help = false
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Serve Firecracker's API on this Unix socket without a VM, until a client configures and
    /// starts one (InstanceStart) or loads a snapshot (PUT /snapshot/load); the VM then runs as
    /// with `vmm run`. Not with a subcommand. As Firecracker's, it defaults to
    /// /run/firecracker.socket when any flag but a subcommand is given (--config-file, --id,
    /// ...) and --no-api is not.
    #[arg(long, value_name = "PATH")]
    pub api_sock: Option<PathBuf>,

    /// The instance id GET / reports (Firecracker's --id): 1 to 64 letters, digits, '-' or '_'.
    #[arg(
        long,
        value_name = "ID",
        default_value = vmm_api::model::DEFAULT_INSTANCE_ID,
        value_parser = parse_instance_id
    )]
    pub id: String,

    /// Set by a jailer (Firecracker's or vmm-jailer): its start on the monotonic clock, in
    /// microseconds; the startup metrics count from it.
    #[arg(long, value_name = "US", requires = "start_time_cpu_us")]
    pub start_time_us: Option<u64>,

    /// Set by a jailer: the CPU time it used, in microseconds.
    #[arg(long, value_name = "US", requires = "start_time_us")]
    pub start_time_cpu_us: Option<u64>,

    /// Set by a jailer that forked into a new PID namespace: its parent's CPU time, in
    /// microseconds.
    #[arg(long, value_name = "US", requires = "start_time_us")]
    pub parent_cpu_time_us: Option<u64>,

    /// Boot the VM this Firecracker configuration file describes (the JSON of GET /vm/config:
    /// machine-config, boot-source, drives, balloon, ...) at once, with or without --api-sock.
    /// Not with a subcommand.
    #[arg(long, value_name = "FILE")]
    pub config_file: Option<PathBuf>,

    /// Firecracker's: a JSON file whose document the MMDS holds from the start (as `PUT /mmds`).
    #[arg(long, value_name = "FILE")]
    pub metadata: Option<PathBuf>,

    /// Firecracker's: start without an API socket, even with --api-sock (needs --config-file,
    /// which then boots the VM).
    #[arg(long, requires = "config_file")]
    pub no_api: bool,

    /// Firecracker's logger from the start, as `PUT /logger` sets it: a file or named pipe for
    /// the log lines (Firecracker's format: time, instance id, message).
    #[arg(long, value_name = "PATH")]
    pub log_path: Option<PathBuf>,

    /// Firecracker's logger level: Error, Warning, Info, Debug, Trace or Off (any case).
    #[arg(long, value_name = "LEVEL", value_parser = parse_log_level)]
    pub level: Option<vmm_api::model::LogLevel>,

    /// Firecracker's logger module filter: only messages of this module path.
    #[arg(long, value_name = "MODULE")]
    pub module: Option<String>,

    /// Firecracker's logger: show each message's level.
    #[arg(long)]
    pub show_level: bool,

    /// Firecracker's logger: show each message's origin (file and line).
    #[arg(long)]
    pub show_log_origin: bool,

    /// Firecracker's metrics from the start, as `PUT /metrics` sets them: a file or named pipe
    /// that gets a JSON line per flush.
    #[arg(long, value_name = "PATH")]
    pub metrics_path: Option<PathBuf>,

    /// Firecracker's boot timer device: accepted; this VMM has none (a guest's write to its
    /// address is an unhandled MMIO access), and says so once.
    #[arg(long)]
    pub boot_timer: bool,

    /// Print the snapshot format version this VMM writes and loads, as Firecracker does.
    #[arg(long)]
    pub snapshot_version: bool,

    /// Print the format version of this snapshot file, as Firecracker does.
    #[arg(long, value_name = "PATH")]
    pub describe_snapshot: Option<PathBuf>,

    /// Firecracker's largest API request body, in bytes (this VMM's default: 65536).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub http_api_max_payload_size: Option<u64>,

    /// Firecracker's MMDS data store limit, in bytes (default 51200).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub mmds_size_limit: Option<u64>,

    /// Firecracker's PCIe transport: accepted; this VMM's devices are on virtio-mmio (Linux
    /// finds them through the command line it gets), and says so once.
    #[arg(long)]
    pub enable_pci: bool,

    /// Messages on stderr from this level up: off, error, warn, info, debug or trace.
    ///
    /// Default: warn, or what RUST_LOG says (env_logger syntax, e.g. RUST_LOG=vmm=debug);
    /// this flag overrides RUST_LOG. Warnings a guest can trigger are rate-limited.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<log::LevelFilter>,

    /// Run the VM without seccomp filters (for debugging, as Firecracker's flag). By default
    /// each kind of VMM thread may make only the system calls it needs once the guest runs;
    /// a denied call ends the VMM with status 148.
    #[arg(long, global = true)]
    pub no_seccomp: bool,

    /// The seccomp filters of this JSON file (seccompiler's format, as Firecracker's
    /// seccompiler-bin reads; thread kinds "vmm", "vcpu" and "api", and "fault" for the fault
    /// handler threads, "devices" for the event loop) instead of the built-in ones. Each must allow write, exit_group and
    /// prctl, which report a denied call.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        conflicts_with = "no_seccomp"
    )]
    pub seccomp_filter: Option<PathBuf>,
}

/// A Firecracker log level (`--level`), in any case.
fn parse_log_level(text: &str) -> Result<vmm_api::model::LogLevel, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned())).map_err(|e| e.to_string())
}

/// A duration: a number with ms, s, m or h (a bare number is seconds), more than zero.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("expected a duration such as 30s, 5m or 500ms, not '{text}'"))?;
    let millis = match unit {
        "ms" => Some(number),
        "" | "s" => number.checked_mul(1000),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        _ => return Err(format!("unknown unit '{unit}' in '{text}' (ms, s, m or h)")),
    };
    match millis {
        Some(0) => Err("the duration must be more than zero".into()),
        Some(millis) => Ok(Duration::from_millis(millis)),
        None => Err(format!("'{text}' is too long")),
    }
}

/// Checks an instance id: 1 to 64 ASCII letters, digits, '-' or '_' (a UUID fits).
fn parse_instance_id(text: &str) -> Result<String, String> {
    let valid = (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(text.to_owned())
    } else {
        Err("expected 1 to 64 letters, digits, '-' or '_'".into())
    }
}

/// `ID=TAP` of `--network-override`.
fn parse_network_override(text: &str) -> Result<NetworkOverride, String> {
    let (iface_id, host_dev_name) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected ID=TAP"))?;
    Ok(NetworkOverride {
        iface_id: iface_id.to_owned(),
        host_dev_name: host_dev_name.to_owned(),
    })
}

/// The subcommands. Each one's arguments are built only when it is the one given (a VMM of
/// Firecracker's kind starts 0.1 ms sooner); its about text comes from its arguments' type,
/// whose doc comment repeats the variant's (a unit test checks they agree).
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Boot a VM and run it until the guest finishes.
    #[command(after_help = EXIT_STATUS_HELP)]
    Run(Box<RunArgs>),
    /// Send one HTTP request to a running VMM's API and print the JSON response.
    ///
    /// Resources: Firecracker's (GET /, /version, /machine-config, /vm/config; before the
    /// start PUT /machine-config, /boot-source, /drives/ID, /balloon, /logger, /metrics,
    /// /network-interfaces/ID, /vsock, /mmds/config, /entropy, /serial and PUT /actions
    /// {"action_type":"InstanceStart"}; PATCH /vm {"state":"Paused"|"Resumed"}, GET|PATCH
    /// /balloon, GET|PATCH /balloon/statistics, PATCH /network-interfaces/ID, PUT|PATCH|GET
    /// /mmds, PUT|PATCH|GET /hotplug/memory, PUT /snapshot/create|load) and this
    /// VMM's: GET /machine (machine info), GET /memory (guest memory and pool),
    /// PUT /actions {"action_type":"Shutdown"}.
    Api(ApiArgs),
    /// Show the machine: run state, vCPUs, memory, backing and population (GET /machine).
    Info(InfoArgs),
    /// Show guest memory, pool and per-vCPU fault statistics, a line each (GET /memory).
    Memory(MemoryArgs),
    /// Pause all vCPUs (PATCH /vm {"state":"Paused"}).
    Pause(PauseArgs),
    /// Resume paused vCPUs (PATCH /vm {"state":"Resumed"}).
    Resume(ResumeArgs),
    /// Stop the VM; `vmm run` then exits (PUT /actions {"action_type":"Shutdown"}).
    Shutdown(ShutdownArgs),
    /// Press Ctrl-Alt-Del on a Linux guest's keyboard: its init usually reboots, which ends
    /// `vmm run` (PUT /actions {"action_type":"SendCtrlAltDel"}).
    CtrlAltDel(CtrlAltDelArgs),
    /// Set or show the balloon (/balloon resources).
    Balloon(BalloonArgs),
    /// Set or show the hot-pluggable memory's requested size (/hotplug/memory).
    Hotplug(HotplugArgs),
    /// Create, inspect and clean up persistent zones: files that keep VMs' memory across VMM
    /// restarts and crashes (`vmm run --zone PATH --vm NAME`).
    Zone(ZoneArgs),
    /// Take a snapshot of a paused VM, or load one into a new VMM process.
    Snapshot(SnapshotArgs),
    /// Write the built-in test guest as a kernel image file. `PUT /boot-source` (and so the
    /// Firecracker SDK) and `vmm run --kernel` boot it where no Linux can (a host without
    /// hardware virtualisation); `workload=` on its command line (`boot_args`) says what it
    /// does, as `vmm run --workload` does (default: write:all,verify:all).
    GuestImage(GuestImageArgs),
}

/// Write the built-in test guest as a kernel image file. `PUT /boot-source` (and so the
/// Firecracker SDK) and `vmm run --kernel` boot it where no Linux can (a host without
/// hardware virtualisation); `workload=` on its command line (`boot_args`) says what it
/// does, as `vmm run --workload` does (default: write:all,verify:all).
#[derive(Debug, Args)]
pub struct GuestImageArgs {
    /// The file to write: a new one, or a regular file it replaces.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Take a snapshot of a paused VM, or load one into a new VMM process.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: SnapshotAction,
}

/// `vmm snapshot` subcommands.
#[derive(Debug, Subcommand)]
pub enum SnapshotAction {
    /// Snapshot a paused VM (PUT /snapshot/create). With --mem-file-path naming the VM's zone
    /// nothing is copied: the memory stays there, sealed, until the VM runs again; any other
    /// path gets a copy of guest memory.
    Create {
        /// The running VMM's API socket.
        #[command(flatten)]
        socket: SocketArgs,
        /// Where the VM's state goes (written beside it, then renamed into place).
        #[arg(long, value_name = "PATH")]
        snapshot_path: PathBuf,
        /// The VM's zone (no copy), or a file for a copy of guest memory.
        #[arg(long, value_name = "PATH")]
        mem_file_path: PathBuf,
        /// A diff snapshot (Firecracker's `Diff`; the VM tracks dirty pages): only the pages
        /// written since the last snapshot go into the memory file, at their places. Naming the
        /// last snapshot's memory file updates it in place; a new file gets the pages alone, to
        /// merge onto the last one with `vmm snapshot rebase`.
        #[arg(long)]
        diff: bool,
    },
    /// Load a snapshot in this process and run its VM until it ends, as `vmm run` does.
    Load(SnapshotLoadArgs),
    /// Merge a diff snapshot's memory file onto its base's (Firecracker's rebase-snap): every
    /// part of the diff that holds data is written over the base at the same offset. The diff's
    /// snapshot then loads with the base's file.
    Rebase {
        /// The memory file of the snapshot the diff was taken after; it is changed in place.
        #[arg(long, value_name = "PATH")]
        base_file: PathBuf,
        /// The diff snapshot's memory file.
        #[arg(long, value_name = "PATH")]
        diff_file: PathBuf,
    },
}

/// Options of `vmm snapshot load`.
#[derive(Debug, Args)]
pub struct SnapshotLoadArgs {
    /// The snapshot file.
    #[arg(long, value_name = "PATH")]
    pub snapshot_path: PathBuf,
    /// The VM's zone, or the memory file the snapshot copied guest memory into.
    #[arg(long, value_name = "PATH")]
    pub mem_file_path: PathBuf,
    /// Let the VM run at once; otherwise it waits, paused, for `vmm resume` (needs
    /// --api-socket then).
    #[arg(long)]
    pub resume: bool,
    /// Serve the control API on this Unix socket.
    #[arg(long, value_name = "PATH", required_unless_present = "resume")]
    pub api_socket: Option<PathBuf>,
    /// Load a VM in a zone even though recovery found some of its memory lost (`vmm zone
    /// inspect` lists the ranges): the guest reads zeroes there.
    #[arg(long)]
    pub accept_damaged: bool,
    /// Check a memory file's contents against the snapshot's checksum before the VM runs
    /// (reads all of it; the load maps the file and reads nothing otherwise).
    #[arg(long)]
    pub verify_memory: bool,
    /// Load a zone snapshot as a new clone called NAME: an ephemeral VM of the zone that maps
    /// the snapshot's frames privately, leaving them (and the snapshot) as they are, so that
    /// any number of clones load one snapshot.
    #[arg(long = "clone", value_name = "NAME")]
    pub clone_name: Option<String>,
    /// With --clone: keep the clone, its frames copied from the snapshot's into its own, a VM
    /// of the zone that outlives its VMM (and a crash) like any other.
    #[arg(long, requires = "clone_name")]
    pub keep_clone: bool,

    /// Give the loaded VM's network interface ID the host's tap TAP instead of the one it had
    /// (Firecracker's network_overrides; repeatable).
    #[arg(long = "network-override", value_name = "ID=TAP", value_parser = parse_network_override)]
    pub network_overrides: Vec<NetworkOverride>,

    /// Let the loaded VM's vsock device listen on PATH instead (Firecracker's vsock_override).
    #[arg(long, value_name = "PATH")]
    pub vsock_override: Option<std::path::PathBuf>,
    /// Track the pages the loaded VM writes, for diff snapshots (Firecracker's
    /// track_dirty_pages).
    #[arg(long)]
    pub track_dirty_pages: bool,
}

/// Create, inspect and clean up persistent zones: files that keep VMs' memory across VMM
/// restarts and crashes (`vmm run --zone PATH --vm NAME`).
#[derive(Debug, Args)]
pub struct ZoneArgs {
    /// What to do with the zone.
    #[command(subcommand)]
    pub action: ZoneAction,
}

/// A zone's frame size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FrameSizeArg {
    /// 2 MiB frames.
    #[value(name = "2M")]
    Huge,
    /// 1 GiB frames (a zone on hugetlbfs needs a mount with 1 GiB pages).
    #[value(name = "1G")]
    Giant,
}

/// `vmm zone` subcommands.
#[derive(Debug, Subcommand)]
pub enum ZoneAction {
    /// Create a zone in a new file (on any file system: tmpfs, hugetlbfs, a disk, DAX) or in
    /// an all-zero device DAX. A file that holds anything is refused, except a zone whose
    /// creation was cut short.
    Create {
        /// The zone file.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// Bytes of frames (K, M, G, T suffixes), a multiple of the frame size; the file is
        /// larger by the metadata.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        size: u64,
        /// The frame size, which is also the chunk size of every VM's RAM.
        #[arg(long, value_enum, value_name = "SIZE", default_value = "2M")]
        frame_size: FrameSizeArg,
        /// How many VMs the zone can hold.
        #[arg(long, value_name = "N", default_value_t = guest_mem::zone::DEFAULT_MAX_VMS)]
        max_vms: u64,
    },
    /// Show a zone: size, frames free and used, each VM with its frames, and what opening it
    /// recovered (after a crash: the leaked frames it freed, the lost ones it took back).
    Inspect {
        /// The zone file.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete a VM from a zone: its frames are scrubbed and freed.
    DeleteVm {
        /// The zone file.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// The VM's name (a damaged slot's as it is recorded).
        #[arg(
            value_name = "NAME",
            required_unless_present = "slot",
            conflicts_with = "slot"
        )]
        name: Option<String>,
        /// The VM of this directory slot instead (`vmm zone inspect` names a damaged one's).
        #[arg(long, value_name = "SLOT")]
        slot: Option<u64>,
    },
    /// Take a damaged directory slot as it reads, after `vmm zone inspect` showed what is
    /// damaged in it: its checksum is written anew and each damaged word reset to what a VM
    /// without a process has (no owner, no seal, not ephemeral); its VM can then be attached
    /// again with its memory. Refused where its name or RAM layout cannot be read (delete it
    /// then: `vmm zone delete-vm PATH --slot SLOT`).
    AcceptSlot {
        /// The zone file.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// The slot.
        #[arg(value_name = "SLOT")]
        slot: u64,
    },
    /// Recover a zone (after a crash) and give the host memory of its free frames back to the
    /// file system.
    Gc {
        /// The zone file.
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
}

/// When guest memory is populated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PopulateArg {
    /// Every chunk gets its pool frame before the guest starts, with every page faulted in.
    Eager,
    /// A chunk gets its frame on the first touch, allocated on the touching vCPU's LLFree core.
    Lazy,
    /// Every chunk gets its pool frame before the guest starts, mapped without touching it:
    /// the host kernel fills a page at the guest's first touch, with no userfaultfd round trip.
    Mapped,
}

/// Boot a VM and run it until the guest finishes.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Guest RAM size: a number with an optional K, M, G or T suffix (binary units).
    ///
    /// A whole number of MiB, at least 4 MiB and at most 1 TiB. The host backs it in whole
    /// frames of the backing (2 MiB; 1 GiB for hugetlb-1g): the last is partly used (129M takes
    /// 130 MiB on 2 MiB frames, 1 GiB on hugetlb-1g), the guest sees what was asked for. RAM
    /// above 3 GiB continues at 4 GiB (the MMIO gap lies between).
    /// The built-in test guest maps all of RAM: where KVM offers no 1 GiB pages (PVM) it takes
    /// at most 116 GiB.
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = parse_size)]
    pub memory: u64,

    /// Host memory behind guest RAM, managed by an LLFree frame pool.
    ///
    /// anon: plain shared memory, 2 MiB frames, no set-up needed.
    /// hugetlb-2m: 2 MiB huge pages (raise /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages).
    /// hugetlb-1g: 1 GiB huge pages (raise .../hugepages-1048576kB/nr_hugepages).
    /// file:PATH: a persistent pool file, created if missing (its directory must exist).
    /// dax:PATH: a device DAX (/dev/daxX.Y) or a file on a DAX file system; it must exist.
    #[arg(
        long,
        value_name = "KIND",
        default_value = "anon",
        verbatim_doc_comment
    )]
    pub backing: BackingKind,

    /// Keep guest RAM in this persistent zone (`vmm zone create`) instead of a pool of its own:
    /// it outlives the VMM, through exits and crashes alike. Needs --vm.
    ///
    /// The VM is created in the zone on first use with --memory's RAM; later runs attach to it
    /// (with the same --memory) and find its RAM as it was, whatever the guest does at boot.
    /// After a crash the zone is recovered first: no frame is lost or leaked.
    #[arg(
        long,
        value_name = "PATH",
        requires = "vm",
        conflicts_with_all = ["backing", "format_pool"]
    )]
    pub zone: Option<PathBuf>,

    /// The VM's name in the --zone: 1 to 64 letters, digits, '.', '_' or '-'.
    #[arg(long, value_name = "NAME", requires = "zone")]
    pub vm: Option<String>,

    /// Delete the VM from the --zone when this VMM ends or dies (its frames go back to the zone
    /// at once) instead of keeping its memory for the next run.
    #[arg(long, requires = "zone")]
    pub ephemeral: bool,

    /// Attach the --vm even though the zone's recovery found some of its memory lost (`vmm
    /// zone inspect` lists the ranges): the guest reads zeroes there.
    #[arg(long, requires = "zone")]
    pub accept_damaged: bool,

    /// Add a virtio-pmem device of SIZE (a multiple of the zone's frame size; needs --zone):
    /// persistent memory whose contents live in the zone beside the VM's RAM.
    ///
    /// Linux (CONFIG_VIRTIO_PMEM) sees /dev/pmem0 and can put a file system on it with `-o dax`;
    /// its flushes (fsync, sync) write the memory back to the zone file. The device's memory
    /// lies above RAM at a 1 GiB boundary.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "zone")]
    pub pmem: Option<u64>,

    /// Add hot-pluggable memory, a virtio-mem device (Firecracker's PUT /hotplug/memory):
    /// total=SIZE[,block=SIZE][,slot=SIZE]. Nothing is plugged at the start; `vmm hotplug set
    /// SIZE` (PATCH /hotplug/memory) asks the guest to plug or unplug blocks (default 2 MiB; a
    /// power of two, whole frames of the backing) up to SIZE. A plugged block takes frames of
    /// the pool (or the zone), an unplugged one gives them back and is inaccessible to the
    /// guest. The slot size (default 128 MiB, Firecracker's) must divide the total. The memory
    /// lies above RAM (and pmem) at a 1 GiB boundary; Linux needs CONFIG_VIRTIO_MEM and 5.16 or
    /// later, and memhp_default_state=online_movable to unplug reliably.
    #[arg(long, value_name = "OPTIONS")]
    pub hotplug: Option<String>,

    /// Add a virtio-net interface over the host's tap NAME (Firecracker's PUT
    /// /network-interfaces): tap=NAME[,mac=MAC][,id=ID][,mtu=N]; repeat for more. The tap must
    /// exist (`ip tuntap add NAME mode tap`) unless the VMM may make it; its address and link
    /// state are the host's business. The id defaults to eth0, eth1, ...
    #[arg(long = "net", value_name = "tap=NAME[,...]")]
    pub net: Vec<String>,

    /// Add a virtio-vsock device (Firecracker's PUT /vsock): cid=N,uds=PATH. Host programs
    /// connect to the Unix socket PATH and write `CONNECT <port>\n` to reach the guest's port;
    /// the guest's connections to CID 2 port P go to the Unix socket PATH_P.
    #[arg(long, value_name = "cid=N,uds=PATH", value_parser = VsockConfig::parse)]
    pub vsock: Option<VsockConfig>,

    /// Add a virtio-rng entropy device (Firecracker's PUT /entropy): the guest's random bytes
    /// come from the host's getrandom (Linux: CONFIG_HW_RANDOM_VIRTIO, /dev/hwrng).
    #[arg(long)]
    pub entropy: bool,

    /// Lay out a new, empty pool in the file or device of --backing file:/dax:, overwriting
    /// what it holds (an all-zero file, a fresh DAX device, an old pool and its frames).
    ///
    /// Without it, the pool the file holds is opened again, a new or empty file gets a new pool,
    /// and a file that holds anything else is refused untouched.
    #[arg(long)]
    pub format_pool: bool,

    /// When the pool has no free frame for a vCPU's fault, let the vCPU wait until one is free
    /// (another VM on the same pool gives memory back: memory overcommit) instead of the VM
    /// stopping with an error (exit status 4).
    ///
    /// With =DURATION (e.g. 30s, 5m, 1h, 500ms; a bare number is seconds), a fault waits at
    /// most that long (not counting while the VM is paused): then the VM stops with exit
    /// status 8 and a message naming what it lacked, instead of waiting for ever.
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        require_equals = true,
        value_parser = parse_duration
    )]
    pub wait_for_memory: Option<Option<Duration>>,

    /// With --zone and a --balloon that reports statistics (stats_polling_interval_s=N): when
    /// less than PERCENT of the zone is free, inflate the balloon by this VM's share of the
    /// deficit up to twice PERCENT (every VMM on the zone gives in proportion to what its guest
    /// reports free), and deflate again once more than twice PERCENT is free. 0 opts out.
    #[arg(long, value_name = "PERCENT", default_value_t = vmm::config::DEFAULT_RECLAIM_BELOW_PERCENT,
          value_parser = clap::value_parser!(u8).range(0..=50))]
    pub reclaim_below: u8,

    /// This VM's weight in the zone's reclaim policy: its share of a deficit is in proportion
    /// to what its guest can spare times its weight (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = vmm::config::DEFAULT_RECLAIM_WEIGHT,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub reclaim_weight: u16,

    /// Guest RAM the zone's reclaim policy always leaves this VM (K, M, G suffixes): it never
    /// inflates the balloon beyond the RAM less this.
    #[arg(long, value_name = "SIZE", default_value = "0", value_parser = parse_size)]
    pub reclaim_floor: u64,

    /// When guest memory gets its host frames: all at start and touched (eager), on first touch
    /// (lazy), or all at start and mapped untouched (mapped).
    #[arg(long, value_enum, value_name = "MODE", default_value = "lazy")]
    pub populate: PopulateArg,

    /// Track the pages the guest and the VMM write, for diff snapshots (Firecracker's
    /// track_dirty_pages; `vmm snapshot create --diff`). KVM then maps guest memory in 4 KiB
    /// pages.
    #[arg(long)]
    pub track_dirty_pages: bool,

    /// Number of vCPUs, 1 to 254 (1 to 64 for the built-in test guest); a core each.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vcpus: usize,

    /// SMT: the vCPUs are the two threads of each core, as the guest's CPUID tells (Firecracker's
    /// `smt`); --vcpus must then be 1 or even.
    #[arg(long)]
    pub smt: bool,

    /// Linux kernel to boot: a bzImage or an uncompressed ELF vmlinux.
    ///
    /// Without it, the built-in test guest runs the --workload. The kernel needs
    /// CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES to find virtio devices.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,

    /// Initial ramdisk for the kernel (needs --kernel).
    #[arg(long, value_name = "PATH", requires = "kernel")]
    pub initrd: Option<PathBuf>,

    /// Kernel command line (needs --kernel). Default, as Firecracker's: "console=ttyS0 reboot=k
    /// panic=1 pci=off i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd"; virtio-mmio devices
    /// are appended to it.
    #[arg(long, value_name = "ARGS", requires = "kernel")]
    pub cmdline: Option<String>,

    /// Serve the control API (HTTP/1.1 + JSON) on this Unix socket path.
    ///
    /// A stale socket file left by a dead VMM is replaced; a live one is an error. Use
    /// `vmm api`, `vmm info`, `vmm pause`, ... or curl --unix-socket PATH to talk to it.
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,

    /// Memory workload of the built-in test guest (not with --kernel).
    ///
    /// Comma-separated steps, run in order by all vCPUs with a barrier after each:
    ///   write[@VCPU]:RANGE[:PATTERN]   write PATTERN ^ page address into every 4 KiB page
    ///   verify[@VCPU]:RANGE[:PATTERN]  check what write wrote
    ///   verify-zero[@VCPU]:RANGE       check that every page reads zero
    ///   read[@VCPU]:RANGE              read every page (populates by reads)
    ///   checkpoint[@VCPU]:ID           stop at a checkpoint the VMM handles: with --api-socket
    ///                                  the VM pauses there until resumed (`vmm resume`)
    /// Balloon steps (need --balloon; they run on vCPU 0 unless @VCPU is given):
    ///   inflate[@VCPU]:SIZE            give SIZE more to the balloon (256 pages per buffer)
    ///   deflate[@VCPU]:SIZE            take SIZE back from the balloon
    ///   balloon-target[@VCPU]          inflate or deflate to the target (--balloon size=,
    ///                                  `vmm balloon set`, PATCH /balloon)
    ///   report[@VCPU]:RANGE            report RANGE free (needs free_page_reporting=on)
    ///   hint[@VCPU]:RANGE              hint RANGE free in a free page hinting run the VMM
    ///                                  starts (needs free_page_hinting=on)
    ///   answer-stats[@VCPU][:COUNT]    answer COUNT (default 1) statistics requests, waiting
    ///                                  for each (needs stats_polling_interval_s=N)
    /// The guest probes the balloon before its first balloon step; the balloon takes its pages
    /// from the top of `all` downwards, deflation gives back its lowest ones.
    /// virtio-mem steps (need --hotplug; on vCPU 0 unless @VCPU is given):
    ///   hotplug-target[@VCPU]          plug or unplug blocks to the requested size (`vmm
    ///                                  hotplug set`), the lowest blocks first
    ///   hotplug-request[@VCPU]:REQUEST:ADDRESS:BLOCKS:ANSWER
    ///                                  one raw request (plug, unplug, unplug-all, state or a
    ///                                  number) that must be answered ANSWER (ack, nack, busy,
    ///                                  error); after a hotplug-target, which probes the device
    /// RANGE is `all` (2 MiB to the end of low RAM) or START+SIZE (e.g. 2M+64M), 4 KiB aligned
    /// and at or above 2M; it may lie in the hot-pluggable memory (at 4G with up to 3G of RAM).
    /// SIZE is 4 KiB aligned. PATTERN is a u64 (decimal or 0x-hex), default 0x5a5a5a5a5a5a5a5a.
    /// STEP*N runs a step N times (not a checkpoint). STEP&STEP runs steps at the same time:
    /// no barrier between them, at most one balloon and one virtio-mem step, no checkpoint
    /// (quote the option for the shell), e.g. 'write@1:2M+2M*1000&report@0:2M+2M*100' with
    /// --vcpus 2.
    /// @VCPU runs the step on that vCPU alone; otherwise the range is split among all vCPUs.
    #[arg(
        long,
        value_name = "STEPS",
        conflicts_with = "kernel",
        default_value = vmm::testguest::DEFAULT_WORKLOAD,
        verbatim_doc_comment
    )]
    pub workload: WorkloadSpec,

    /// Add a virtio-blk drive over a raw image (repeatable):
    /// id=ID,path=PATH[,ro=on][,root=on][,partuuid=UUID][,io_engine=async].
    ///
    /// IDs are letters, digits and '_' (the guest reads them as the disk's serial). The root
    /// drive becomes /dev/vda and adds `root=/dev/vda rw` (ro with ro=on; root=PARTUUID=... with
    /// partuuid) to the kernel command line. io_engine=async serves the drive through an
    /// io_uring (Firecracker's Async engine; sync, the default, on the event loop's thread).
    /// Needs --kernel.
    #[arg(long = "drive", value_name = "OPTIONS", requires = "kernel")]
    pub drives: Vec<DriveConfig>,

    /// Add a virtio-balloon device: comma-separated key=value options.
    ///
    /// Pages the guest gives to the balloon go back to the frame pool: a chunk (one pool frame)
    /// entirely given away or reported free frees its frame, which another guest can then use.
    ///   size=SIZE                    initial balloon target (default 0), 4 KiB aligned
    ///   deflate_on_oom=on|off        the guest may deflate when it runs out of memory (off)
    ///   free_page_reporting=on|off   the guest reports free pages back to the pool (off)
    ///   stats_polling_interval_s=N   seconds between statistics requests, 0 = none (0)
    #[arg(long, value_name = "OPTIONS", verbatim_doc_comment)]
    pub balloon: Option<BalloonDeviceConfig>,
}

/// The API socket of a running VMM.
#[derive(Debug, Args)]
pub struct SocketArgs {
    /// The running VMM's API socket (its `vmm run --api-socket`).
    #[arg(long, short = 's', value_name = "PATH")]
    pub socket: PathBuf,
}

/// Options of `vmm info` and `vmm memory`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The API socket.
    #[command(flatten)]
    pub socket: SocketArgs,
    /// Print the API's whole JSON object instead of the short view.
    #[arg(long)]
    pub json: bool,
}

/// Show the machine: run state, vCPUs, memory, backing and population (GET /machine).
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// What to show and where.
    #[command(flatten)]
    pub show: ShowArgs,
}

/// Show guest memory, pool and per-vCPU fault statistics, a line each (GET /memory).
#[derive(Debug, Args)]
pub struct MemoryArgs {
    /// What to show and where.
    #[command(flatten)]
    pub show: ShowArgs,
}

/// Pause all vCPUs (PATCH /vm {"state":"Paused"}).
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The API socket.
    #[command(flatten)]
    pub socket: SocketArgs,
}

/// Resume paused vCPUs (PATCH /vm {"state":"Resumed"}).
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The API socket.
    #[command(flatten)]
    pub socket: SocketArgs,
}

/// Stop the VM; `vmm run` then exits (PUT /actions {"action_type":"Shutdown"}).
#[derive(Debug, Args)]
pub struct ShutdownArgs {
    /// The API socket.
    #[command(flatten)]
    pub socket: SocketArgs,
}

/// Press Ctrl-Alt-Del on a Linux guest's keyboard: its init usually reboots, which ends
/// `vmm run` (PUT /actions {"action_type":"SendCtrlAltDel"}).
#[derive(Debug, Args)]
pub struct CtrlAltDelArgs {
    /// The API socket.
    #[command(flatten)]
    pub socket: SocketArgs,
}

/// Send one HTTP request to a running VMM's API and print the JSON response.
///
/// Resources: Firecracker's (GET /, /version, /machine-config, /vm/config; before the
/// start PUT /machine-config, /boot-source, /drives/ID, /balloon, /logger, /metrics,
/// /network-interfaces/ID, /vsock, /mmds/config, /entropy, /serial and PUT /actions
/// {"action_type":"InstanceStart"}; PATCH /vm {"state":"Paused"|"Resumed"}, GET|PATCH
/// /balloon, GET|PATCH /balloon/statistics, PATCH /network-interfaces/ID, PUT|PATCH|GET
/// /mmds, PUT|PATCH|GET /hotplug/memory, PUT /snapshot/create|load) and this
/// VMM's: GET /machine (machine info), GET /memory (guest memory and pool),
/// PUT /actions {"action_type":"Shutdown"}.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// The API socket.
    #[command(flatten)]
    pub socket: SocketArgs,
    /// HTTP method: GET, PUT or PATCH, which the API serves; any other (e.g. DELETE) is sent as
    /// it is and answered 400 (case-insensitive).
    #[arg(value_name = "METHOD")]
    pub method: String,
    /// Resource path, e.g. /machine.
    #[arg(value_name = "PATH")]
    pub path: String,
    /// JSON request body, e.g. '{"state":"Paused"}'.
    #[arg(value_name = "BODY")]
    pub body: Option<String>,
}

/// Set or show the hot-pluggable memory's requested size (/hotplug/memory).
#[derive(Debug, Args)]
pub struct HotplugArgs {
    /// The running VMM's API socket (its `vmm run --api-socket`).
    #[arg(long, short = 's', value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub action: HotplugAction,
}

/// `vmm hotplug` subcommands.
#[derive(Debug, Subcommand)]
pub enum HotplugAction {
    /// Ask the guest to have SIZE plugged (PATCH /hotplug/memory {"requested_size_mib":N}).
    Set {
        /// A size such as 512M or 1G, or a bare number of MiB: whole blocks, at most the total.
        #[arg(value_name = "SIZE", value_parser = parse_mib, allow_hyphen_values = true)]
        requested_size_mib: u64,
    },
    /// Show the total, block, slot, plugged and requested sizes (GET /hotplug/memory).
    Get {
        /// Print the API's whole JSON object instead of the short view.
        #[arg(long)]
        json: bool,
    },
}

/// Set or show the balloon (/balloon resources).
#[derive(Debug, Args)]
#[command(arg_required_else_help = false)]
pub struct BalloonArgs {
    /// The running VMM's API socket (its `vmm run --api-socket`); before or after the action,
    /// as with every other subcommand.
    #[arg(long, short = 's', value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// What to do with the balloon.
    #[command(subcommand)]
    pub action: BalloonAction,
}

/// `vmm balloon` subcommands.
#[derive(Debug, Subcommand)]
pub enum BalloonAction {
    /// Set the balloon target (PATCH /balloon {"amount_mib":N}).
    Set {
        /// Target size of the balloon: a size such as 256M or 1G, or a bare number of MiB.
        #[arg(value_name = "SIZE", value_parser = parse_mib, allow_hyphen_values = true)]
        amount_mib: u64,
    },
    /// Show the balloon's target and actual size, options and driver violations (GET /balloon).
    Get {
        /// Print the API's whole JSON object instead of the short view.
        #[arg(long)]
        json: bool,
    },
    /// Show the guest's memory statistics from the balloon (GET /balloon/statistics).
    Stats {
        /// Print the API's whole JSON object instead of the short view.
        #[arg(long)]
        json: bool,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn each_subcommand_s_help_says_what_the_list_of_subcommands_says() {
        let mut cli = Cli::command();
        // Before the build, each subcommand has its variant's texts; building applies its
        // arguments' type, deferred until then.
        let listed: Vec<_> = cli
            .get_subcommands()
            .map(|sub| (sub.get_about().cloned(), sub.get_long_about().cloned()))
            .collect();
        cli.build();
        for (sub, (about, long_about)) in cli.get_subcommands().zip(listed) {
            let name = sub.get_name();
            assert!(about.is_some(), "{name} has no about text");
            assert_eq!(sub.get_about(), about.as_ref(), "{name}");
            assert_eq!(sub.get_long_about(), long_about.as_ref(), "{name}");
        }
    }

    #[test]
    fn durations_take_a_unit_and_a_bare_number_is_seconds() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        for bad in [
            "",
            "0",
            "0s",
            "s",
            "5d",
            "-1s",
            "1.5s",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
