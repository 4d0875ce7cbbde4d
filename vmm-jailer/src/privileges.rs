//! What the jailed process may do: its resource limits, and its user, group and
//! capabilities (none, for good: the bounding set emptied and no_new_privs set).

use caps::CapSet;
use nix::sys::prctl::set_no_new_privs;
use nix::sys::resource::{setrlimit, Resource};
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
use thiserror::Error;

use crate::args::ResourceLimit;

/// Errors setting limits or dropping privileges.
#[derive(Debug, Error)]
pub enum PrivilegesError {
    /// A resource limit was refused.
    #[error("cannot set the resource limit {0:?}: {1}")]
    Limit(ResourceLimit, #[source] nix::Error),
    /// A capability set could not be emptied.
    #[error("cannot empty the {0:?} capability set: {1}")]
    Capabilities(CapSet, #[source] caps::errors::CapsError),
    /// The groups, gid or uid could not be set.
    #[error("cannot become uid {uid} gid {gid} ({step}): {source}")]
    Identity {
        /// The uid asked for.
        uid: u32,
        /// The gid asked for.
        gid: u32,
        /// What failed.
        step: &'static str,
        /// Why.
        #[source]
        source: nix::Error,
    },
}

/// Sets each limit, soft and hard, for this process and what it execs.
pub fn set_limits(limits: &[ResourceLimit]) -> Result<(), PrivilegesError> {
    for &limit in limits {
        let (resource, value) = match limit {
            ResourceLimit::FileSize(bytes) => (Resource::RLIMIT_FSIZE, bytes),
            ResourceLimit::OpenFiles(count) => (Resource::RLIMIT_NOFILE, count),
        };
        setrlimit(resource, value, value).map_err(|e| PrivilegesError::Limit(limit, e))?;
    }
    Ok(())
}

/// Becomes `uid`/`gid` (with `gid` its only group) with no capability in any set, and sets
/// no_new_privs: nothing it execs can gain a privilege back.
pub fn drop_to(uid: u32, gid: u32) -> Result<(), PrivilegesError> {
    let identity = |step| {
        move |source| PrivilegesError::Identity {
            uid,
            gid,
            step,
            source,
        }
    };
    // While it still has CAP_SETPCAP.
    caps::clear(None, CapSet::Bounding)
        .map_err(|e| PrivilegesError::Capabilities(CapSet::Bounding, e))?;
    let (uid_, gid_) = (Uid::from_raw(uid), Gid::from_raw(gid));
    setgroups(&[gid_]).map_err(identity("setgroups"))?;
    setresgid(gid_, gid_, gid_).map_err(identity("setresgid"))?;
    setresuid(uid_, uid_, uid_).map_err(identity("setresuid"))?;
    // A uid other than 0 lost them already; uid 0 keeps them until now.
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|e| PrivilegesError::Capabilities(set, e))?;
    }
    set_no_new_privs().map_err(identity("no_new_privs"))?;
    Ok(())
}
