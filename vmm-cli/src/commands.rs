//! The subcommands' work: `run` boots a VM, the others talk to a running VMM's API.

use std::fmt::Display;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use vmm::config::{format_size, VmConfig};
use vmm::runner::{say, RunError, RunOutcome, ServeOptions, StopCause};
use vmm_api::model::{
    FullVmConfiguration, MemoryBackend, MemoryBackendType, SnapshotLoadParams, VsockOverride,
};

use crate::api_client::{ApiClient, ApiResponse, ClientError};
use crate::args::{BalloonAction, HotplugAction, RunArgs, SnapshotLoadArgs};
use crate::exit::{run_error_status, ExitStatus};
use crate::host::check_host;
use crate::logger::ApiLogControl;

/// Prints `error: {message}` and returns `status`.
fn fail(status: ExitStatus, message: impl Display) -> ExitStatus {
    say(format!("error: {message}"));
    status
}

/// `vmm run`: validate, check the host, run.
pub(super) fn run_vm(args: RunArgs) -> ExitStatus {
    let config = match VmConfig::try_from(args) {
        Ok(config) => config,
        Err(e) => return fail(ExitStatus::Usage, e),
    };
    if let Err(e) = check_host(&config) {
        return fail(
            ExitStatus::HostUnsupported,
            format!("host unsupported: {e}"),
        );
    }
    outcome_status(vmm::run(config))
}

/// `vmm snapshot load`: load a snapshot and run its VM as `vmm run` does.
pub(super) fn load_snapshot(args: SnapshotLoadArgs) -> ExitStatus {
    let params = SnapshotLoadParams {
        snapshot_path: args.snapshot_path,
        mem_file_path: None,
        mem_backend: Some(MemoryBackend {
            backend_type: MemoryBackendType::File,
            backend_path: args.mem_file_path,
        }),
        resume_vm: args.resume,
        enable_diff_snapshots: false,
        track_dirty_pages: args.track_dirty_pages,
        network_overrides: args.network_overrides,
        vsock_override: args
            .vsock_override
            .map(|uds_path| VsockOverride { uds_path }),
        clock_realtime: false,
        accept_damaged: args.accept_damaged,
        verify_memory: args.verify_memory,
        clone_name: args.clone_name,
        keep_clone: args.keep_clone,
    };
    if let (false, Some(socket)) = (args.resume, &args.api_socket) {
        say(format!(
            "paused after the load; resume with `vmm resume --socket {}`",
            socket.display()
        ));
    }
    outcome_status(vmm::runner::load(&params, args.api_socket))
}

/// `vmm snapshot create`: PUT /snapshot/create on a running VMM. Says which kind of snapshot
/// it made (zero-copy, the memory left in the VM's zone; or a copy of guest memory into the
/// memory file), how much it wrote and how long it took.
pub(super) fn create_snapshot(
    socket: &Path,
    snapshot_path: &Path,
    mem_file_path: &Path,
    diff: bool,
) -> ExitStatus {
    let body = serde_json::json!({
        "snapshot_path": snapshot_path,
        "mem_file_path": mem_file_path,
        "snapshot_type": if diff { "Diff" } else { "Full" },
    })
    .to_string();
    let zone = vm_zone(socket);
    let started = Instant::now();
    let status = api(socket, "PUT", "/snapshot/create", Some(&body));
    if status != ExitStatus::Success {
        return status;
    }
    let took = started.elapsed();
    let kind = match zone.filter(|zone| vmm::host_file::same_file(zone, mem_file_path)) {
        Some(zone) => format!(
            "zero-copy: the guest memory stays in zone {} (sealed until the VM runs again)",
            zone.display()
        ),
        None => {
            let (size, data) = std::fs::metadata(mem_file_path)
                .map(|m| (m.len(), m.blocks() * 512))
                .unwrap_or_default();
            format!(
                "guest memory copied into {} ({}, {} of it data)",
                mem_file_path.display(),
                format_size(size),
                format_size(data)
            )
        }
    };
    println!(
        "snapshot written to {} in {:.2} s: {kind}",
        snapshot_path.display(),
        took.as_secs_f64()
    );
    ExitStatus::Success
}

/// The zone of the VM behind `socket`, if it has one (`GET /vm/config`).
fn vm_zone(socket: &Path) -> Option<PathBuf> {
    let response = ApiClient::new(socket)
        .request("GET", "/vm/config", None)
        .ok()?;
    let config: serde_json::Value = serde_json::from_str(&response.body).ok()?;
    config["machine-config"]["zone"]["path"]
        .as_str()
        .map(PathBuf::from)
}

/// `vmm --api-sock PATH [--config-file FILE]`: wait for the VM's configuration and start, or a
/// snapshot to load, then run the VM (at once with a configuration file).
pub(super) fn serve(
    api_socket: Option<PathBuf>,
    id: &str,
    (config_file, metadata): (Option<&Path>, Option<&Path>),
    command_line: Vec<vmm_api::PreBoot>,
) -> ExitStatus {
    if let Some(socket) = &api_socket {
        if let Err(e) = vmm::config::check_api_socket(socket) {
            return fail(ExitStatus::Usage, format!("--api-sock: {e}"));
        }
    }
    let config = match config_file.map(read_config_file).transpose() {
        Ok(config) => config,
        Err(e) => return fail(ExitStatus::Usage, e),
    };
    let metadata = match metadata.map(read_metadata).transpose() {
        Ok(metadata) => metadata,
        Err(e) => return fail(ExitStatus::Usage, e),
    };
    let outcome = vmm::runner::serve(ServeOptions {
        api_socket,
        id: id.to_owned(),
        config,
        logger: Some(Arc::new(ApiLogControl { id: id.to_owned() })),
        command_line,
        metadata,
    });
    // As Firecracker's: a guest that rebooted (Ctrl-Alt-Del, `reboot`) ends the VMM normally.
    if let Ok(RunOutcome::GuestReset(cause)) = &outcome {
        eprintln!("the guest reset the VM {cause}: the microVM ends");
        return ExitStatus::Success;
    }
    outcome_status(outcome)
}

/// Reads the MMDS document of `--metadata`.
fn read_metadata(path: &Path) -> Result<serde_json::Value, String> {
    let file = vmm::host_file::open_input("--metadata", path).map_err(|e| e.to_string())?;
    serde_json::from_reader(std::io::BufReader::new(file))
        .map_err(|e| format!("--metadata {}: {e}", path.display()))
}

/// Reads a Firecracker configuration file.
fn read_config_file(path: &Path) -> Result<FullVmConfiguration, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--config-file {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("--config-file {}: {e}", path.display()))
}

/// The exit status of a VM run, with its message on stderr.
fn outcome_status(outcome: Result<RunOutcome, RunError>) -> ExitStatus {
    match outcome {
        Ok(RunOutcome::Success) => ExitStatus::Success,
        Ok(RunOutcome::GuestReset(cause)) => {
            say(format!(
                "the guest reset the VM {cause} (reboot, a panic with panic=N, or a crash); a \
                 microVM does not restart"
            ));
            ExitStatus::GuestReset
        }
        Ok(RunOutcome::GuestFailure(why)) => {
            fail(ExitStatus::GuestFailure, format!("the guest failed: {why}"))
        }
        Ok(RunOutcome::Stopped(cause)) => {
            say(format!(
                "stopped: {cause} ended the VM before the guest finished"
            ));
            match cause {
                StopCause::Signal(libc::SIGINT) => ExitStatus::Interrupted,
                StopCause::Signal(_) => ExitStatus::Terminated,
                StopCause::Api => ExitStatus::StoppedByApi,
            }
        }
        Err(e) => fail(run_error_status(&e), e),
    }
}

/// Sends one request; a failure is said on stderr and becomes the exit status.
fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<ApiResponse, ExitStatus> {
    let response = match ApiClient::new(socket).request(method, path, body) {
        Ok(response) => response,
        Err(e @ ClientError::InvalidRequest(_)) => return Err(fail(ExitStatus::Usage, e)),
        Err(e) => return Err(fail(ExitStatus::Runtime, e)),
    };
    if !response.is_success() {
        let message = response
            .fault_message()
            .unwrap_or_else(|| response.body.trim().to_owned());
        return Err(fail(
            ExitStatus::ApiError,
            format!("{method} {path}: {} {message}", response.status),
        ));
    }
    Ok(response)
}

/// `GET path`, shown short by `view`, or as the whole JSON with `json`.
pub(super) fn show(
    socket: &Path,
    path: &str,
    json: bool,
    view: fn(&serde_json::Value) -> String,
) -> ExitStatus {
    if json {
        return api(socket, "GET", path, None);
    }
    let response = match request(socket, "GET", path, None) {
        Ok(response) => response,
        Err(status) => return status,
    };
    match serde_json::from_str::<serde_json::Value>(&response.body) {
        Ok(value) => print!("{}", view(&value)),
        Err(e) => return fail(ExitStatus::Runtime, format!("GET {path}: not JSON: {e}")),
    }
    ExitStatus::Success
}

/// Sends one request and prints the response body (pretty JSON) on stdout.
pub(super) fn api(socket: &Path, method: &str, path: &str, body: Option<&str>) -> ExitStatus {
    let response = match request(socket, method, path, body) {
        Ok(response) => response,
        Err(status) => return status,
    };
    if !response.body.is_empty() {
        match serde_json::from_str::<serde_json::Value>(&response.body) {
            Ok(json) => println!(
                "{}",
                serde_json::to_string_pretty(&json).unwrap_or(response.body)
            ),
            Err(_) => println!("{}", response.body),
        }
    }
    ExitStatus::Success
}

/// Sends a request that answers no content and confirms its success with `done` on stdout.
pub(super) fn action(
    socket: &Path,
    (method, path, body): (&str, &str, &str),
    done: &str,
) -> ExitStatus {
    let status = api(socket, method, path, Some(body));
    if status == ExitStatus::Success {
        println!("{done}");
    }
    status
}

/// `vmm balloon set|get|stats`.
pub(super) fn balloon(socket: &Path, balloon_action: BalloonAction) -> ExitStatus {
    match balloon_action {
        BalloonAction::Set { amount_mib } => {
            let body = format!(r#"{{"amount_mib":{amount_mib}}}"#);
            let done = format!("balloon target set to {amount_mib} MiB");
            action(socket, ("PATCH", "/balloon", &body), &done)
        }
        BalloonAction::Get { json } => show(socket, "/balloon", json, crate::show::balloon),
        BalloonAction::Stats { json } => show(
            socket,
            "/balloon/statistics",
            json,
            crate::show::balloon_stats,
        ),
    }
}

/// `vmm hotplug set|get`.
pub(super) fn hotplug(socket: &Path, hotplug_action: HotplugAction) -> ExitStatus {
    match hotplug_action {
        HotplugAction::Set { requested_size_mib } => {
            let body = format!(r#"{{"requested_size_mib":{requested_size_mib}}}"#);
            let done = format!(
                "requested {requested_size_mib} MiB of hot-pluggable memory: the guest plugs or \
                 unplugs toward it (vmm hotplug get)"
            );
            action(socket, ("PATCH", "/hotplug/memory", &body), &done)
        }
        HotplugAction::Get { json } => show(socket, "/hotplug/memory", json, crate::show::hotplug),
    }
}

/// `vmm guest-image --out FILE`: the test guest's image, written where nothing is or a
/// regular file is (nothing else is replaced).
pub(super) fn guest_image(out: &Path) -> ExitStatus {
    let written = vmm::host_file::create_output("--out", out)
        .map_err(|e| e.to_string())
        .and_then(|mut file| {
            file.write_all(vmm::testguest::IMAGE)
                .map_err(|e| format!("--out {}: {e}", out.display()))
        });
    if let Err(e) = written {
        return fail(ExitStatus::Usage, e);
    }
    println!(
        "wrote the test guest image to {} ({} KiB); boot it with `vmm run --kernel {0}` or \
         PUT /boot-source {{\"kernel_image_path\": \"{0}\", \"boot_args\": \
         \"workload=write:all,verify:all\"}}",
        out.display(),
        vmm::testguest::IMAGE.len().div_ceil(1024)
    );
    ExitStatus::Success
}

/// `vmm snapshot rebase`: merges the diff memory file at `diff_file` onto `base_file`.
pub(super) fn rebase_snapshot(base_file: &Path, diff_file: &Path) -> ExitStatus {
    use vmm::snapshot::rebase::{rebase, RebaseError};
    match rebase(base_file, diff_file) {
        Ok(done) => {
            println!(
                "merged {} of {} onto {} ({} runs of data); load the diff snapshot with it",
                format_size(done.bytes),
                diff_file.display(),
                base_file.display(),
                done.runs
            );
            ExitStatus::Success
        }
        Err(e @ (RebaseError::Path(_) | RebaseError::NotMemoryFile { .. })) => {
            fail(ExitStatus::Usage, e)
        }
        Err(e @ RebaseError::Io { .. }) => fail(ExitStatus::Runtime, e),
    }
}
