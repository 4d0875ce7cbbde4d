//! The API's resources and their dispatch to [`VmmControl`]: Firecracker's, and this VMM's own
//! views (`GET /machine`, `GET /memory`).
//!
//! | Resource              | Method | Body                                        | When     |
//! |-----------------------|--------|---------------------------------------------|----------|
//! | `/`                   | GET    | → [`InstanceInfo`]                          | always   |
//! | `/version`            | GET    | → [`VersionInfo`]                           | always   |
//! | `/machine-config`     | GET    | → [`MachineConfiguration`]                  | always   |
//! | `/machine-config`     | PUT    | [`MachineConfiguration`]                    | pre-boot |
//! | `/machine-config`     | PATCH  | [`MachineConfigurationUpdate`]              | pre-boot |
//! | `/boot-source`        | PUT    | [`BootSource`]                              | pre-boot |
//! | `/drives/{id}`        | PUT    | [`Drive`]                                   | pre-boot |
//! | `/drives/{id}`        | PATCH  | [`PartialDrive`]                            | running  |
//! | `/pmem/{id}`          | PUT    | [`Pmem`]                                    | pre-boot |
//! | `/pmem/{id}`          | PATCH  | [`PartialPmem`]                             | running  |
//! | `/network-interfaces/{id}` | PUT | [`NetworkInterface`]                     | pre-boot |
//! | `/network-interfaces/{id}` | PATCH | [`PartialNetworkInterface`]            | running  |
//! | `/vsock`              | PUT    | [`Vsock`]                                   | pre-boot |
//! | `/cpu-config`         | PUT    | a custom CPU template                       | pre-boot |
//! | `/mmds/config`        | PUT    | [`MmdsConfigRequest`]                       | pre-boot |
//! | `/mmds`               | PUT, PATCH, GET | the metadata document (JSON)       | always   |
//! | `/logger`             | PUT    | [`Logger`]                                  | pre-boot |
//! | `/metrics`            | PUT    | [`Metrics`]                                 | pre-boot |
//! | `/actions`            | PUT    | `{"action_type": "InstanceStart" \| "SendCtrlAltDel" \| "FlushMetrics" \| "Shutdown"}` | |
//! | `/vm`                 | PATCH  | `{"state": "Paused" \| "Resumed"}`          | running  |
//! | `/vm/config`          | GET    | → [`FullVmConfiguration`]                   | always   |
//! | `/balloon`            | GET    | → [`BalloonInfo`]                           | always   |
//! | `/balloon`            | PUT    | [`Balloon`]                                 | pre-boot |
//! | `/balloon`            | PATCH  | `{"amount_mib"?: N, "stats_polling_interval_s"?: N}` | always |
//! | `/balloon/statistics` | GET    | → [`BalloonStatistics`]                     | running  |
//! | `/balloon/statistics` | PATCH  | `{"stats_polling_interval_s": N}`           | always   |
//! | `/balloon/hinting/start` | PATCH | [`BalloonStartCmd`] (optional)           | running  |
//! | `/balloon/hinting/stop` | PATCH | none                                       | running  |
//! | `/balloon/hinting/status` | GET | → [`BalloonHintingStatus`]                 | running  |
//! | `/hotplug/memory`     | PUT    | [`MemoryHotplugConfig`]                     | pre-boot |
//! | `/hotplug/memory`     | PATCH  | [`MemoryHotplugSizeUpdate`]                 | running  |
//! | `/hotplug/memory`     | GET    | → [`MemoryHotplugStatus`]                   | always   |
//! | `/snapshot/create`    | PUT    | [`SnapshotCreateParams`]                    | paused   |
//! | `/snapshot/load`      | PUT    | [`SnapshotLoadParams`]                      | no VM    |
//! | `/machine`            | GET    | → [`MachineInfo`] (extension)               | always   |
//! | `/memory`             | GET    | → [`MemoryInfo`] (extension)                | running  |
//!
//! Errors answer `{"fault_message": "..."}` as Firecracker does: 400 for bad requests, unknown
//! paths and wrong methods ("Invalid request method and/or path: ..."), refused operations
//! (including "balloon not configured" and pre-boot requests after the start); 500 when the
//! VMM fails.
//!
//! [`MachineInfo`]: super::model::MachineInfo
//! [`InstanceInfo`]: super::model::InstanceInfo
//! [`VersionInfo`]: super::model::VersionInfo
//! [`MemoryInfo`]: super::model::MemoryInfo
//! [`MachineConfiguration`]: super::model::MachineConfiguration
//! [`MachineConfigurationUpdate`]: super::model::MachineConfigurationUpdate
//! [`BootSource`]: super::model::BootSource
//! [`Drive`]: super::model::Drive
//! [`Pmem`]: super::model::Pmem
//! [`PartialDrive`]: super::model::PartialDrive
//! [`PartialPmem`]: super::model::PartialPmem
//! [`NetworkInterface`]: super::model::NetworkInterface
//! [`PartialNetworkInterface`]: super::model::PartialNetworkInterface
//! [`Logger`]: super::model::Logger
//! [`Vsock`]: super::model::Vsock
//! [`MmdsConfigRequest`]: super::model::MmdsConfigRequest
//! [`Metrics`]: super::model::Metrics
//! [`FullVmConfiguration`]: super::model::FullVmConfiguration
//! [`Balloon`]: super::model::Balloon
//! [`BalloonInfo`]: super::model::BalloonInfo
//! [`BalloonStatistics`]: super::model::BalloonStatistics
//! [`BalloonStartCmd`]: super::model::BalloonStartCmd
//! [`BalloonHintingStatus`]: super::model::BalloonHintingStatus
//! [`MemoryHotplugConfig`]: super::model::MemoryHotplugConfig
//! [`MemoryHotplugSizeUpdate`]: super::model::MemoryHotplugSizeUpdate
//! [`MemoryHotplugStatus`]: super::model::MemoryHotplugStatus
//! [`SnapshotCreateParams`]: super::model::SnapshotCreateParams
//! [`SnapshotLoadParams`]: super::model::SnapshotLoadParams

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::http::{Method, Request, Response};
use super::model::{
    ActionRequest, ActionType, BalloonStartCmd, BalloonStatsUpdate, BalloonUpdate, PartialDrive,
    PartialNetworkInterface, PartialPmem, RequestedState, SnapshotCreateParams, SnapshotLoadParams,
    VersionInfo, VmStateRequest, Vsock,
};
use super::vmm_control::{ControlError, PreBoot, VmmControl};
use crate::metrics::{Level, Operation, METRICS};

fn fault(error: ControlError) -> Response {
    Response::fault(error.status(), error.to_string())
}

fn reply<T: Serialize>(result: Result<T, ControlError>) -> Response {
    result.map_or_else(fault, |value| Response::json(&value))
}

/// Runs `work`, recording how long it took as the API's latest `operation` where it succeeds.
fn timed(
    operation: Operation,
    work: impl FnOnce() -> Result<(), ControlError>,
) -> Result<(), ControlError> {
    METRICS.latencies.time(Level::Api, operation, work)
}

fn done(result: Result<(), ControlError>) -> Response {
    result.map_or_else(fault, |()| Response::no_content())
}

/// Parses the JSON body of `request` as `T`; a bad one gets Firecracker's answer.
fn body<T: DeserializeOwned>(request: &Request) -> Result<T, Response> {
    serde_json::from_slice(&request.body).map_err(|e| {
        Response::fault(
            400,
            format!("An error occurred when deserializing the json body of a request: {e}."),
        )
    })
}

/// Checks a resource id in a path as Firecracker does.
fn path_id(id: Option<&str>) -> Result<&str, Response> {
    match id {
        None | Some("") => Err(Response::fault(400, "The ID cannot be empty.")),
        Some(id) if id.chars().all(|c| c == '_' || c.is_ascii_alphanumeric()) => Ok(id),
        Some(_) => Err(Response::fault(
            400,
            "API Resource IDs can only contain alphanumeric characters and underscores.",
        )),
    }
}

/// The requests Firecracker routes on the first path segment alone, ignoring the rest of the
/// path (its `parsed_request.rs`).
const FIRST_SEGMENT_ONLY: [(Method, &str); 17] = [
    (Method::Get, ""),
    (Method::Get, "version"),
    (Method::Get, "machine-config"),
    (Method::Get, "mmds"),
    (Method::Put, "actions"),
    (Method::Put, "balloon"),
    (Method::Put, "boot-source"),
    (Method::Put, "cpu-config"),
    (Method::Put, "logger"),
    (Method::Put, "serial"),
    (Method::Put, "machine-config"),
    (Method::Put, "metrics"),
    (Method::Put, "vsock"),
    (Method::Put, "entropy"),
    (Method::Patch, "machine-config"),
    (Method::Patch, "mmds"),
    (Method::Patch, "vm"),
];

/// Answers `request` by calling `control`.
pub fn handle(control: &dyn VmmControl, request: &Request) -> Response {
    let target = request.target.as_str();
    if target.contains('?') {
        return Response::fault(400, "query strings are not supported");
    }
    let path = target.trim_start_matches('/');
    let path = path.strip_suffix('/').unwrap_or(path);
    let mut tokens = path.split('/');
    let method = &request.method;
    let first = tokens.next().unwrap_or("");
    // Firecracker routes these on their first segment alone and ignores the rest of the path
    // (`PUT /vsock/vsock0` is `PUT /vsock`); clients depend on it.
    let first_segment_only = FIRST_SEGMENT_ONLY
        .iter()
        .any(|(routed, segment)| routed == method && *segment == first);
    let (second, rest) = match first_segment_only {
        true => (None, None),
        false => {
            let (second, rest) = (tokens.next(), tokens.next());
            if tokens.next().is_some() {
                return invalid_path(method, path);
            }
            (second, rest)
        }
    };
    let has_body = !request.body.is_empty();
    match method {
        Method::Get if has_body => return Response::fault(400, "GET request cannot have a body."),
        Method::Put if !has_body => return Response::fault(400, "Empty PUT request."),
        // Firecracker's hinting start takes an optional body, its stop none.
        Method::Patch if !has_body && !path.starts_with("balloon/hinting/") => {
            return Response::fault(400, "Empty PATCH request.")
        }
        _ => {}
    }
    let configure = |what: Result<PreBoot, Response>| what.map(|r| done(control.configure(r)));
    let result = match (method, first, second, rest) {
        (Method::Patch, "balloon", Some("hinting"), Some("start")) => {
            let cmd = if has_body {
                body::<BalloonStartCmd>(request)
            } else {
                Ok(BalloonStartCmd::default())
            };
            cmd.map(|cmd| done(control.start_balloon_hinting(cmd)))
        }
        (Method::Patch, "balloon", Some("hinting"), Some("stop")) => {
            Ok(done(control.stop_balloon_hinting()))
        }
        (Method::Get, "balloon", Some("hinting"), Some("status")) => {
            Ok(reply(control.balloon_hinting_status()))
        }
        (Method::Patch, "balloon", Some("statistics"), _) => body::<BalloonStatsUpdate>(request)
            .map(|u| {
                done(control.update_balloon(BalloonUpdate {
                    amount_mib: None,
                    stats_polling_interval_s: Some(u.stats_polling_interval_s),
                }))
            }),
        (_, _, _, Some(_)) => Err(invalid_path(method, path)),
        (Method::Get, "", None, _) => Ok(reply(control.instance_info())),
        (Method::Get, "version", None, _) => Ok(Response::json(&VersionInfo::default())),
        (Method::Get, "machine", None, _) => Ok(reply(control.machine_info())),
        (Method::Get, "memory", None, _) => Ok(reply(control.memory_info())),
        (Method::Get, "machine-config", None, _) => Ok(reply(control.machine_config())),
        (Method::Put, "machine-config", None, _) => configure(body(request).map(PreBoot::Machine)),
        (Method::Patch, "machine-config", None, _) => {
            configure(body(request).map(PreBoot::PatchMachine))
        }
        (Method::Put, "boot-source", None, _) => configure(body(request).map(PreBoot::BootSource)),
        (Method::Put, "drives", id, _) => {
            configure(path_id(id).and_then(|id| Ok(PreBoot::Drive(id.to_owned(), body(request)?))))
        }
        (Method::Patch, "drives", id, _) => path_id(id).and_then(|id| {
            let update: PartialDrive = body(request)?;
            Ok(done(control.update_drive(id, &update)))
        }),
        (Method::Patch, "pmem", id, _) => path_id(id).and_then(|id| {
            let update: PartialPmem = body(request)?;
            Ok(done(control.update_pmem(id, &update)))
        }),
        (Method::Put, "pmem", id, _) => {
            configure(path_id(id).and_then(|id| Ok(PreBoot::Pmem(id.to_owned(), body(request)?))))
        }
        (Method::Put, "network-interfaces", id, _) => configure(
            path_id(id).and_then(|id| Ok(PreBoot::NetworkInterface(id.to_owned(), body(request)?))),
        ),
        (Method::Patch, "network-interfaces", id, _) => path_id(id).and_then(|id| {
            let update: PartialNetworkInterface = body(request)?;
            Ok(done(control.update_network_interface(id, &update)))
        }),
        (Method::Put, "mmds", Some("config"), _) => {
            configure(body(request).map(PreBoot::MmdsConfig))
        }
        (Method::Put, "mmds", None, _) => {
            body(request).map(|data| done(control.update_mmds(data, false)))
        }
        (Method::Patch, "mmds", None, _) => {
            body(request).map(|data| done(control.update_mmds(data, true)))
        }
        (Method::Get, "mmds", None, _) => Ok(reply(control.mmds())),
        (Method::Put, "cpu-config", None, _) => configure(body(request).map(PreBoot::CpuConfig)),
        (Method::Put, "vsock", None, _) => body::<Vsock>(request).map(|vsock| {
            // The field is ignored.
            let deprecated = vsock.vsock_id.is_some();
            let answer = done(control.configure(PreBoot::Vsock(vsock)));
            deprecation(
                answer,
                deprecated,
                "PUT /vsock: vsock_id field is deprecated.",
            )
        }),
        (Method::Put, "logger", None, _) => configure(body(request).map(PreBoot::Logger)),
        (Method::Put, "metrics", None, _) => configure(body(request).map(PreBoot::Metrics)),
        (Method::Put, "entropy", None, _) => configure(body(request).map(PreBoot::Entropy)),
        (Method::Put, "serial", None, _) => configure(body(request).map(PreBoot::Serial)),
        (Method::Put, "actions", None, _) => {
            body::<ActionRequest>(request).map(|r| match r.action_type {
                ActionType::InstanceStart => done(control.start_instance()),
                ActionType::FlushMetrics => done(control.flush_metrics()),
                ActionType::Shutdown => done(control.shutdown()),
                ActionType::SendCtrlAltDel => done(control.send_ctrl_alt_del()),
            })
        }
        (Method::Patch, "vm", None, _) => body::<VmStateRequest>(request).map(|r| {
            done(match r.state {
                RequestedState::Paused => timed(Operation::PauseVm, || control.pause()),
                RequestedState::Resumed => timed(Operation::ResumeVm, || control.resume()),
            })
        }),
        (Method::Get, "vm", Some("config"), _) => Ok(reply(control.vm_config())),
        (Method::Get, "balloon", None, _) => Ok(reply(control.balloon())),
        (Method::Put, "balloon", None, _) => configure(body(request).map(PreBoot::Balloon)),
        (Method::Patch, "balloon", None, _) => body::<BalloonUpdate>(request).and_then(|update| {
            if update == BalloonUpdate::default() {
                Err(Response::fault(
                    400,
                    "PATCH /balloon needs amount_mib or stats_polling_interval_s",
                ))
            } else {
                Ok(done(control.update_balloon(update)))
            }
        }),
        (Method::Get, "balloon", Some("statistics"), _) => Ok(reply(control.balloon_statistics())),
        (Method::Put, "hotplug", Some("memory"), _) => {
            configure(body(request).map(PreBoot::MemoryHotplug))
        }
        (Method::Patch, "hotplug", Some("memory"), _) => {
            body(request).map(|update| done(control.update_memory_hotplug(update)))
        }
        (Method::Get, "hotplug", Some("memory"), _) => Ok(reply(control.memory_hotplug())),
        (Method::Put, "snapshot", Some("create"), _) => {
            body::<SnapshotCreateParams>(request).map(|params| {
                done(timed(params.snapshot_type.operation(), || {
                    control.create_snapshot(&params)
                }))
            })
        }
        (Method::Put, "snapshot", Some("load"), _) => {
            body::<SnapshotLoadParams>(request).map(|params| {
                let answer = done(timed(Operation::LoadSnapshot, || {
                    control.load_snapshot(&params)
                }));
                // The fields still work.
                deprecation(
                    answer,
                    params.uses_deprecated_fields(),
                    "PUT /snapshot/load: mem_file_path and enable_diff_snapshots fields are \
                     deprecated.",
                )
            })
        }
        _ => Err(invalid_path(method, path)),
    };
    result.unwrap_or_else(|response| response)
}

/// Firecracker's deprecation: where a request used a deprecated field (`deprecated`), `message`
/// is logged as a warning and the answer carries the Deprecation header.
fn deprecation(answer: Response, deprecated: bool, message: &str) -> Response {
    if !deprecated {
        return answer;
    }
    log::warn!("{message}");
    answer.deprecated()
}

/// Firecracker's answer to an unknown path or a method a resource does not take.
fn invalid_path(method: &Method, path: &str) -> Response {
    Response::fault(
        400,
        format!(
            "Invalid request method and/or path: {} /{path}.",
            method.as_str()
        ),
    )
}
