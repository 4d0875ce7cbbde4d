//! The `vmm` command, the front end of the vmm library: its command line, in the style of Cloud
//! Hypervisor and Firecracker, the control API's client, and the process exit statuses.
//!
//! ```text
//! vmm run --memory 1G --backing hugetlb-2m --populate lazy --vcpus 2 --api-socket /tmp/vmm.sock
//! vmm info --socket /tmp/vmm.sock
//! vmm api --socket /tmp/vmm.sock PATCH /vm '{"state":"Paused"}'
//! ```
//!
//! `vmm run` parses its flags into the library's [`VmConfig`](vmm::config::VmConfig), checked
//! with the library's checks ([`run_config`]), checks the host ([`host::check_host`]) and hands
//! the config to [`vmm::run`]. The other subcommands are clients ([`ApiClient`]) of a running
//! VMM's control API ([`vmm_api`]).
//!
//! Every error prints one line, `error: ...`, on stderr. Exit statuses ([`ExitStatus`]):
//!
//! | status | meaning |
//! |--------|---------|
//! | 0 | the guest finished its work, or the API request succeeded |
//! | 1 | the guest reported a failure |
//! | 2 | usage or configuration error: bad flags, missing files, invalid sizes |
//! | 3 | host unsupported: no usable /dev/kvm, too few huge pages |
//! | 4 | runtime error: the VMM failed, or the API socket could not be reached |
//! | 5 | the API answered with an error status |
//! | 6 | `vmm run`: an API client stopped the VM before the guest finished |
//! | 7 | `vmm run`: the guest reset the VM (reboot, a panic with panic=N, a triple fault) |
//! | 130, 143 | `vmm run`: SIGINT or SIGTERM stopped the VM before the guest finished |

mod api_client;
mod args;
mod commands;
mod exit;
pub mod host;
mod log_limit;
mod logger;
pub mod run_config;
mod show;
mod zone;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::Parser;

pub use api_client::{ApiClient, ApiResponse, ClientError};
pub use args::{
    ApiArgs, BalloonAction, BalloonArgs, Cli, Command, CtrlAltDelArgs, FrameSizeArg, InfoArgs,
    MemoryArgs, PauseArgs, PopulateArg, ResumeArgs, RunArgs, ShutdownArgs, SnapshotAction,
    SnapshotArgs, SnapshotLoadArgs, SocketArgs, ZoneAction, ZoneArgs, DEFAULT_API_SOCK,
};
pub use exit::{run_error_status, zone_error_status, ExitStatus, EXIT_STATUS_HELP};
pub use run_config::RunConfigError;
pub use vmm::testguest::{WorkloadSpec, WorkloadSpecError, DEFAULT_PATTERN, DEFAULT_WORKLOAD};

/// What Firecracker's own flags set: the process-wide limits (`--http-api-max-payload-size`,
/// `--mmds-size-limit`), warnings for the devices this VMM lacks (`--boot-timer`,
/// `--enable-pci`), and the pre-boot requests of its logger and metrics flags, which
/// `serve` applies first.
fn firecracker_settings(cli: &Cli) -> Vec<vmm_api::PreBoot> {
    if let Some(bytes) = cli.http_api_max_payload_size {
        vmm_api::http::set_max_body_bytes(usize::try_from(bytes).unwrap_or(usize::MAX));
    }
    if let Some(bytes) = cli.mmds_size_limit {
        vmm_devices::mmds::store::set_size_limit(usize::try_from(bytes).unwrap_or(usize::MAX));
    }
    if cli.boot_timer {
        log::warn!(
            "--boot-timer: this VMM has no boot timer device; the guest's boot time is not logged"
        );
    }
    if cli.enable_pci {
        log::warn!(
            "--enable-pci: this VMM has no PCI transport; its virtio devices are on virtio-mmio, \
             which the guest's command line names"
        );
    }
    let mut requests = Vec::new();
    let logger = cli.log_path.is_some()
        || cli.level.is_some()
        || cli.module.is_some()
        || cli.show_level
        || cli.show_log_origin;
    if logger {
        requests.push(vmm_api::PreBoot::Logger(vmm_api::model::Logger {
            log_path: cli.log_path.clone(),
            level: cli.level,
            show_level: cli.show_level.then_some(true),
            show_log_origin: cli.show_log_origin.then_some(true),
            module: cli.module.clone(),
        }));
    }
    if let Some(path) = &cli.metrics_path {
        requests.push(vmm_api::PreBoot::Metrics(vmm_api::model::Metrics {
            metrics_path: path.clone(),
            emit_id: false,
            properties: None,
            flush_interval_ms: None,
        }));
    }
    requests
}

/// Runs the `vmm` command with `args` (the first is the program name) and returns its exit
/// status.
pub fn main<I, T>(args: I) -> ExitStatus
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // Firecracker serves its API on its default socket unless told otherwise: so does a VMM of
    // its kind here, started with any flag (bare `vmm` asks for a subcommand instead).
    let flags_given = args.len() > 1;
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => return clap_error(err),
    };
    // With a name (the VM's in its zone, else an instance id given), every line the VMM
    // prints says whose it is.
    let vm_name = match &cli.command {
        Some(Command::Run(args)) => args.vm.clone(),
        _ => None,
    };
    if let Some(name) =
        vm_name.or_else(|| (cli.id != vmm_api::model::DEFAULT_INSTANCE_ID).then(|| cli.id.clone()))
    {
        vmm::runner::name_lines(&name);
    }
    logger::init(cli.log_level);
    if let (Some(start), Some(cpu)) = (cli.start_time_us, cli.start_time_cpu_us) {
        let parent_cpu = cli.parent_cpu_time_us.unwrap_or(0);
        vmm_api::metrics::METRICS.started_by_jailer(start, cpu.saturating_add(parent_cpu));
    }
    let seccomp = match (cli.no_seccomp, &cli.seccomp_filter) {
        (true, _) => vmm::seccomp::Policy::Off,
        (false, Some(path)) => vmm::seccomp::Policy::File(path.clone()),
        (false, None) => vmm::seccomp::Policy::BuiltIn,
    };
    if let Err(e) = vmm::seccomp::set_policy(&seccomp) {
        eprintln!("error: {e}");
        return ExitStatus::Usage;
    }
    // A VMM of Firecracker's kind (--api-sock, --config-file) locks down in `serve`, once its
    // socket takes connections.
    let runs_a_vm = match &cli.command {
        Some(Command::Run(_)) => true,
        Some(Command::Snapshot(snapshot)) => matches!(snapshot.action, SnapshotAction::Load(_)),
        _ => false,
    };
    if runs_a_vm {
        vmm::seccomp::lock_down_early();
    }
    if cli.snapshot_version {
        println!("v{}.0.0", vmm::snapshot::file::VERSION);
        return ExitStatus::Success;
    }
    if let Some(path) = &cli.describe_snapshot {
        return match vmm::snapshot::file::version(path) {
            Ok(version) => {
                println!("v{version}.0.0");
                ExitStatus::Success
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitStatus::Usage
            }
        };
    }
    let command_line = firecracker_settings(&cli);
    if cli.command.is_some() && !command_line.is_empty() {
        eprintln!(
            "error: --log-path, --level, --module, --show-level, --show-log-origin and \
             --metrics-path configure a VMM of Firecracker's kind (--api-sock, --config-file): \
             not with a subcommand"
        );
        return ExitStatus::Usage;
    }
    let command = match (cli.command, cli.api_sock, cli.config_file) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            eprintln!(
                "error: --api-sock and --config-file start a VMM of Firecracker's kind: not with \
                 a subcommand"
            );
            return ExitStatus::Usage;
        }
        (Some(command), None, None) => command,
        (None, socket, config_file) if flags_given => {
            // As Firecracker's: --no-api serves nothing, even with --api-sock.
            let socket = match (cli.no_api, socket) {
                (true, _) => None,
                (false, Some(socket)) => Some(socket),
                (false, None) => Some(PathBuf::from(DEFAULT_API_SOCK)),
            };
            return commands::serve(
                socket,
                &cli.id,
                (config_file.as_deref(), cli.metadata.as_deref()),
                command_line,
            );
        }
        (None, _, _) => {
            eprintln!(
                "error: 'vmm' requires a subcommand or Firecracker's flags (--api-sock PATH, \
                 --config-file FILE, ...); see `vmm --help`"
            );
            return ExitStatus::Usage;
        }
    };
    let status = match command {
        Command::Run(args) => commands::run_vm(*args),
        Command::Api(args) => commands::api(
            &args.socket.socket,
            &args.method.to_ascii_uppercase(),
            &args.path,
            args.body.as_deref(),
        ),
        Command::Info(InfoArgs { show: args }) => {
            commands::show(&args.socket.socket, "/machine", args.json, show::machine)
        }
        Command::Memory(MemoryArgs { show: args }) => {
            commands::show(&args.socket.socket, "/memory", args.json, show::memory)
        }
        Command::Pause(PauseArgs { socket }) => commands::action(
            &socket.socket,
            ("PATCH", "/vm", r#"{"state":"Paused"}"#),
            "paused: every vCPU is out of the guest",
        ),
        Command::Resume(ResumeArgs { socket }) => commands::action(
            &socket.socket,
            ("PATCH", "/vm", r#"{"state":"Resumed"}"#),
            "resumed",
        ),
        Command::Shutdown(ShutdownArgs { socket }) => commands::action(
            &socket.socket,
            ("PUT", "/actions", r#"{"action_type":"Shutdown"}"#),
            "shutdown requested: the VM stops and `vmm run` exits",
        ),
        Command::CtrlAltDel(CtrlAltDelArgs { socket }) => commands::action(
            &socket.socket,
            ("PUT", "/actions", r#"{"action_type":"SendCtrlAltDel"}"#),
            "Ctrl-Alt-Del sent to the guest's keyboard",
        ),
        Command::Balloon(balloon) => match balloon.socket {
            Some(socket) => commands::balloon(&socket, balloon.action),
            None => {
                eprintln!(
                    "error: the following required arguments were not provided: \
                         --socket <PATH>"
                );
                ExitStatus::Usage
            }
        },
        Command::Hotplug(hotplug) => match hotplug.socket {
            Some(socket) => commands::hotplug(&socket, hotplug.action),
            None => {
                eprintln!(
                    "error: the following required arguments were not provided: \
                         --socket <PATH>"
                );
                ExitStatus::Usage
            }
        },
        Command::Zone(zone) => zone::run(zone.action),
        Command::Snapshot(snapshot) => match snapshot.action {
            SnapshotAction::Create {
                socket,
                snapshot_path,
                mem_file_path,
                diff,
            } => commands::create_snapshot(&socket.socket, &snapshot_path, &mem_file_path, diff),
            SnapshotAction::Load(args) => commands::load_snapshot(args),
            SnapshotAction::Rebase {
                base_file,
                diff_file,
            } => commands::rebase_snapshot(&base_file, &diff_file),
        },
        Command::GuestImage(args) => commands::guest_image(&args.out),
    };
    logger::finish();
    status
}

/// Prints help and version as clap does, and any other clap error as one line.
fn clap_error(err: clap::Error) -> ExitStatus {
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        // Help goes to stdout; if that fails there is nobody to tell.
        let _ = err.print();
        return ExitStatus::Success;
    }
    eprintln!("{}", one_line(&err.render().to_string()));
    ExitStatus::Usage
}

/// Joins the lines of a clap error before its usage section into one line.
fn one_line(text: &str) -> String {
    let lines = text
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .filter(|line| !line.is_empty());
    let mut joined = String::new();
    for line in lines {
        if !joined.is_empty() {
            joined.push_str(if joined.ends_with(':') { " " } else { "; " });
        }
        joined.push_str(line);
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_become_one_line() {
        let err = Cli::try_parse_from(["vmm", "run", "--memroy", "1G"]).unwrap_err();
        let line = one_line(&err.render().to_string());
        assert!(!line.contains('\n'));
        assert_eq!(
            line,
            "error: unexpected argument '--memroy' found; tip: a similar argument exists: '--memory'"
        );
        let err = Cli::try_parse_from(["vmm", "run", "--initrd", "i"]).unwrap_err();
        assert_eq!(
            one_line(&err.render().to_string()),
            "error: the following required arguments were not provided: --kernel <PATH>"
        );
        assert_eq!(main(["vmm"]), ExitStatus::Usage);
        let err = Cli::try_parse_from(["vmm", "--api-sock", "s", "--id", "a b"]).unwrap_err();
        assert!(
            one_line(&err.render().to_string()).contains("expected 1 to 64 letters"),
            "{err}"
        );
        let uuid = "0f8fad5b-d9cb-469f-a165-70867728950e";
        assert_eq!(Cli::try_parse_from(["vmm", "--id", uuid]).unwrap().id, uuid);
        assert_eq!(
            main(["vmm", "--api-sock", "s", "info", "-s", "t"]),
            ExitStatus::Usage
        );
        for args in [
            &["vmm", "balloon", "--socket", "s"][..],
            &["vmm", "balloon"],
        ] {
            let err = Cli::try_parse_from(args).unwrap_err();
            let line = one_line(&err.render().to_string());
            assert!(
                line.starts_with("error: 'vmm balloon' requires a subcommand"),
                "{args:?}: {line}"
            );
        }
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_and_subcommand_has_help() {
        use clap::CommandFactory;
        let mut stack = vec![Cli::command()];
        while let Some(command) = stack.pop() {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" {
                    assert!(
                        arg.get_help().is_some(),
                        "{} {id} has no help",
                        command.get_name()
                    );
                }
            }
            for sub in command.get_subcommands() {
                assert!(sub.get_about().is_some(), "{} has no help", sub.get_name());
                stack.push(sub.clone());
            }
        }
    }
}
