//! The API's resources and their dispatch to [`VmmControl`].
//!
//! | Resource              | Method | Body                                        | Answer           |
//! |-----------------------|--------|---------------------------------------------|------------------|
//! | `/`                   | GET    |                                             | [`InstanceInfo`] |
//! | `/version`            | GET    |                                             | [`VersionInfo`]  |
//! | `/machine`            | GET    |                                             | [`MachineInfo`]  |
//! | `/memory`             | GET    |                                             | [`MemoryInfo`]   |
//! | `/vm`                 | PATCH  | `{"state": "Paused" \| "Resumed"}`          | 204              |
//! | `/actions`            | PUT    | `{"action_type": "Shutdown" \| "SendCtrlAltDel"}` | 204       |
//! | `/balloon`            | GET    |                                             | [`BalloonInfo`]  |
//! | `/balloon`            | PUT    | `{"amount_mib": N}`                         | 204              |
//! | `/balloon`            | PATCH  | `{"amount_mib"?: N, "stats_polling_interval_s"?: N}` | 204     |
//! | `/balloon/statistics` | GET    |                                             | [`BalloonStatistics`] |
//! | `/balloon/statistics` | PATCH  | `{"stats_polling_interval_s": N}`           | 204              |
//! | `/snapshot/create`    | PUT    | [`SnapshotCreateParams`]                    | 204              |
//! | `/snapshot/load`      | PUT    | [`SnapshotLoadParams`]                      | 204              |
//!
//! Errors answer `{"fault_message": "..."}`: 400 for bad requests and refused operations
//! (including "balloon not configured"), 404 for unknown resources, 405 (with `Allow`) for
//! wrong methods, 500 when the VMM fails.
//!
//! [`MachineInfo`]: super::model::MachineInfo
//! [`InstanceInfo`]: super::model::InstanceInfo
//! [`VersionInfo`]: super::model::VersionInfo
//! [`MemoryInfo`]: super::model::MemoryInfo
//! [`BalloonInfo`]: super::model::BalloonInfo
//! [`BalloonStatistics`]: super::model::BalloonStatistics
//! [`SnapshotCreateParams`]: super::model::SnapshotCreateParams
//! [`SnapshotLoadParams`]: super::model::SnapshotLoadParams

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::control::{ControlError, VmmControl};
use super::http::{Method, Request, Response};
use super::model::{
    ActionRequest, ActionType, BalloonStatsUpdate, BalloonTarget, BalloonUpdate, RequestedState,
    SnapshotCreateParams, SnapshotLoadParams, VersionInfo, VmStateRequest,
};

/// The resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resource {
    Instance,
    Version,
    Machine,
    Memory,
    Vm,
    Actions,
    Balloon,
    BalloonStatistics,
    SnapshotCreate,
    SnapshotLoad,
}

impl Resource {
    fn find(path: &str) -> Option<Self> {
        match path {
            "/" => Some(Resource::Instance),
            "/version" => Some(Resource::Version),
            "/machine" => Some(Resource::Machine),
            "/memory" => Some(Resource::Memory),
            "/vm" => Some(Resource::Vm),
            "/actions" => Some(Resource::Actions),
            "/balloon" => Some(Resource::Balloon),
            "/balloon/statistics" => Some(Resource::BalloonStatistics),
            "/snapshot/create" => Some(Resource::SnapshotCreate),
            "/snapshot/load" => Some(Resource::SnapshotLoad),
            _ => None,
        }
    }

    /// The methods the resource allows, as an `Allow` header value.
    fn allow(self) -> &'static str {
        match self {
            Resource::Instance | Resource::Version | Resource::Machine | Resource::Memory => "GET",
            Resource::Vm => "PATCH",
            Resource::Actions | Resource::SnapshotCreate | Resource::SnapshotLoad => "PUT",
            Resource::Balloon => "GET, PUT, PATCH",
            Resource::BalloonStatistics => "GET, PATCH",
        }
    }
}

fn fault(error: ControlError) -> Response {
    Response::fault(error.status(), error.to_string())
}

fn reply<T: Serialize>(result: Result<T, ControlError>) -> Response {
    result.map_or_else(fault, |value| Response::json(&value))
}

fn done(result: Result<(), ControlError>) -> Response {
    result.map_or_else(fault, |()| Response::no_content())
}

/// Parses the JSON body of `request` as `T`.
fn body<T: DeserializeOwned>(request: &Request, path: &str) -> Result<T, Response> {
    let method = request.method.as_str();
    if request.body.is_empty() {
        return Err(Response::fault(
            400,
            format!("{method} {path} needs a JSON body"),
        ));
    }
    serde_json::from_slice(&request.body)
        .map_err(|e| Response::fault(400, format!("invalid JSON body for {method} {path}: {e}")))
}

/// Answers `request` by calling `control`.
pub fn handle(control: &dyn VmmControl, request: &Request) -> Response {
    let target = request.target.as_str();
    if target.contains('?') {
        return Response::fault(400, "query strings are not supported");
    }
    let path = match target.strip_suffix('/') {
        Some(stripped) if !stripped.is_empty() => stripped,
        _ => target,
    };
    let Some(resource) = Resource::find(path) else {
        return Response::fault(404, format!("no resource at {path}"));
    };
    if request.method == Method::Get && !request.body.is_empty() {
        return Response::fault(400, format!("GET {path} takes no body"));
    }
    let result = match (resource, &request.method) {
        (Resource::Instance, Method::Get) => Ok(reply(control.instance_info())),
        (Resource::Version, Method::Get) => Ok(Response::json(&VersionInfo::default())),
        (Resource::Machine, Method::Get) => Ok(reply(control.machine_info())),
        (Resource::Memory, Method::Get) => Ok(reply(control.memory_info())),
        (Resource::Vm, Method::Patch) => body::<VmStateRequest>(request, path).map(|r| {
            done(match r.state {
                RequestedState::Paused => control.pause(),
                RequestedState::Resumed => control.resume(),
            })
        }),
        (Resource::Actions, Method::Put) => {
            body::<ActionRequest>(request, path).map(|r| match r.action_type {
                ActionType::Shutdown => done(control.shutdown()),
                ActionType::SendCtrlAltDel => done(control.send_ctrl_alt_del()),
            })
        }
        (Resource::Balloon, Method::Get) => Ok(reply(control.balloon())),
        (Resource::Balloon, Method::Put) => body::<BalloonTarget>(request, path).map(|t| {
            done(control.update_balloon(BalloonUpdate {
                amount_mib: Some(t.amount_mib),
                stats_polling_interval_s: None,
            }))
        }),
        (Resource::Balloon, Method::Patch) => {
            body::<BalloonUpdate>(request, path).and_then(|update| {
                if update == BalloonUpdate::default() {
                    Err(Response::fault(
                        400,
                        "PATCH /balloon needs amount_mib or stats_polling_interval_s",
                    ))
                } else {
                    Ok(done(control.update_balloon(update)))
                }
            })
        }
        (Resource::BalloonStatistics, Method::Get) => Ok(reply(control.balloon_statistics())),
        (Resource::BalloonStatistics, Method::Patch) => body::<BalloonStatsUpdate>(request, path)
            .map(|u| {
                done(control.update_balloon(BalloonUpdate {
                    amount_mib: None,
                    stats_polling_interval_s: Some(u.stats_polling_interval_s),
                }))
            }),
        (Resource::SnapshotCreate, Method::Put) => body::<SnapshotCreateParams>(request, path)
            .map(|params| done(control.create_snapshot(&params))),
        (Resource::SnapshotLoad, Method::Put) => body::<SnapshotLoadParams>(request, path)
            .map(|params| done(control.load_snapshot(&params))),
        (resource, method) => Err(Response::method_not_allowed(
            method.as_str(),
            path,
            resource.allow(),
        )),
    };
    result.unwrap_or_else(|response| response)
}
