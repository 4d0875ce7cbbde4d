//! The command line: Firecracker's jailer flags, checked before anything is created.

use std::path::{Path, PathBuf};

use clap::Parser;
use thiserror::Error;

/// Errors in the flags' values.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ArgsError {
    /// The id is empty, too long or has other characters than letters, digits and hyphens.
    #[error("--id '{0}': 1 to 64 letters, digits and hyphens")]
    Id(String),
    /// The exec file is not a regular file.
    #[error("--exec-file {0}: {1}")]
    ExecFile(PathBuf, String),
    /// The chroot base is not an absolute path.
    #[error("--chroot-base-dir {0}: must be an absolute path")]
    ChrootBase(PathBuf),
    /// A `--cgroup` is not `<controller>.<file>=<value>`.
    #[error("--cgroup '{0}': expected <controller>.<file>=<value>, e.g. cpuset.cpus=0")]
    Cgroup(String),
    /// The parent cgroup leaves its hierarchy.
    #[error("--parent-cgroup '{0}': a relative path without '..'")]
    ParentCgroup(String),
    /// A `--resource-limit` is not `fsize=N` or `no-file=N`.
    #[error("--resource-limit '{0}': expected fsize=<bytes> or no-file=<count>")]
    ResourceLimit(String),
}

/// The cgroup hierarchy the jailer places the VMM in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupVersion {
    /// One hierarchy per controller (`/sys/fs/cgroup/<controller>`), Firecracker's default.
    #[value(name = "1")]
    V1,
    /// The unified hierarchy (`cgroup2` in /proc/mounts).
    #[value(name = "2")]
    V2,
}

/// `vmm-jailer`: builds a chroot for a VMM, places it in cgroups and a network namespace,
/// drops to an unprivileged uid/gid without capabilities, and execs it (Firecracker's jailer
/// flags; see docs/security.md).
#[derive(Debug, Parser)]
#[command(name = "vmm-jailer", version)]
pub struct Args {
    /// The VM's id: 1 to 64 letters, digits and hyphens; names its chroot and cgroup, and is
    /// passed on as the VMM's --id.
    #[arg(long)]
    pub id: String,
    /// The VMM binary: copied into the chroot (with its ELF interpreter and libraries, if it
    /// is dynamically linked) and exec'd there.
    #[arg(long)]
    pub exec_file: PathBuf,
    /// The uid the VMM runs as.
    #[arg(long)]
    pub uid: u32,
    /// The gid the VMM runs as (its only group).
    #[arg(long)]
    pub gid: u32,
    /// Where chroots are built: the VMM's root is `<base>/<exec file name>/<id>/root`.
    #[arg(long, default_value = "/srv/jailer")]
    pub chroot_base_dir: PathBuf,
    /// A network namespace to join (e.g. /var/run/netns/NAME).
    #[arg(long)]
    pub netns: Option<PathBuf>,
    /// A cgroup file and its value, `<controller>.<file>=<value>` (e.g. cpuset.cpus=0,
    /// memory.max=1G with version 2); repeatable.
    #[arg(long = "cgroup", value_name = "FILE=VALUE")]
    pub cgroups: Vec<String>,
    /// The cgroup version: 1 (Firecracker's default) or 2.
    #[arg(long, value_enum, default_value = "1")]
    pub cgroup_version: CgroupVersion,
    /// The VM's cgroup is `<hierarchy>/<parent>/<id>` (default: the exec file's name).
    #[arg(long)]
    pub parent_cgroup: Option<String>,
    /// A resource limit, `fsize=<bytes>` or `no-file=<count>` (default no-file=2048);
    /// repeatable.
    #[arg(long = "resource-limit", value_name = "RESOURCE=VALUE")]
    pub resource_limits: Vec<String>,
    /// Start a new session and send stdin, stdout and stderr to /dev/null.
    #[arg(long)]
    pub daemonize: bool,
    /// Run the VMM as the first process of a new PID namespace; its pid (as this namespace
    /// sees it) is written to `<exec file name>.pid` in the chroot.
    #[arg(long)]
    pub new_pid_ns: bool,
    /// The VMM's own arguments, after `--`.
    #[arg(last = true)]
    pub vmm_args: Vec<String>,
}

/// One `--cgroup`: the controller, the file (`<controller>.<name>`) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSetting {
    /// The controller, the file's prefix (`cpuset` of `cpuset.cpus`).
    pub controller: String,
    /// The file in the VM's cgroup.
    pub file: String,
    /// What is written to it.
    pub value: String,
}

/// A resource limit of the VMM process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceLimit {
    /// The largest file it may create, in bytes (RLIMIT_FSIZE).
    FileSize(u64),
    /// One more than the largest file descriptor it may open (RLIMIT_NOFILE).
    OpenFiles(u64),
}

/// Firecracker's default bound on the open files of a jailed VMM.
pub const DEFAULT_OPEN_FILES: u64 = 2048;

/// What the flags ask for, checked and derived once: everything the jailer builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The exec file's name: the VMM's path in its root and the chroot's middle directory
    /// (the root is `<base>/<exec file name>/<id>/root`).
    pub exec_name: String,
    /// The `--cgroup` settings.
    pub cgroups: Vec<CgroupSetting>,
    /// The parent cgroup (relative), the exec file's name by default.
    pub parent_cgroup: PathBuf,
    /// The resource limits, with Firecracker's default bound on open files unless given.
    pub limits: Vec<ResourceLimit>,
}

impl Args {
    /// Checks every value and derives the [`Plan`] (nothing is created before they all hold).
    pub fn validate(&self) -> Result<Plan, ArgsError> {
        check_id(&self.id)?;
        let exec_name = self.exec_file_name()?;
        if !self.chroot_base_dir.is_absolute() {
            return Err(ArgsError::ChrootBase(self.chroot_base_dir.clone()));
        }
        let cgroups = self
            .cgroups
            .iter()
            .map(|c| parse_cgroup(c))
            .collect::<Result<_, _>>()?;
        let parent = self.parent_cgroup.as_deref().unwrap_or(&exec_name);
        let parent_cgroup = check_parent_cgroup(parent)?;
        let mut limits: Vec<ResourceLimit> = self
            .resource_limits
            .iter()
            .map(|l| parse_limit(l))
            .collect::<Result<_, _>>()?;
        if !limits
            .iter()
            .any(|l| matches!(l, ResourceLimit::OpenFiles(_)))
        {
            limits.push(ResourceLimit::OpenFiles(DEFAULT_OPEN_FILES));
        }
        Ok(Plan {
            exec_name,
            cgroups,
            parent_cgroup,
            limits,
        })
    }

    /// The exec file's name, after checking that it is a regular file.
    fn exec_file_name(&self) -> Result<String, ArgsError> {
        let bad = |why: &str| ArgsError::ExecFile(self.exec_file.clone(), why.to_owned());
        let metadata = std::fs::metadata(&self.exec_file).map_err(|e| bad(&e.to_string()))?;
        if !metadata.is_file() {
            return Err(bad("not a regular file"));
        }
        self.exec_file
            .file_name()
            .and_then(|name| name.to_str())
            .map(str::to_owned)
            .ok_or_else(|| bad("no file name in UTF-8"))
    }
}

/// A parent cgroup: a relative path without `..`.
fn check_parent_cgroup(parent: &str) -> Result<PathBuf, ArgsError> {
    let path = Path::new(parent);
    let plain = path
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    match plain && !parent.is_empty() {
        true => Ok(path.to_owned()),
        false => Err(ArgsError::ParentCgroup(parent.to_owned())),
    }
}

fn check_id(id: &str) -> Result<(), ArgsError> {
    let valid = !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    match valid {
        true => Ok(()),
        false => Err(ArgsError::Id(id.to_owned())),
    }
}

fn parse_cgroup(text: &str) -> Result<CgroupSetting, ArgsError> {
    let bad = || ArgsError::Cgroup(text.to_owned());
    let (file, value) = text.split_once('=').ok_or_else(bad)?;
    let (controller, name) = file.split_once('.').ok_or_else(bad)?;
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    if !word(controller) || !word(name) || value.contains('\n') {
        return Err(bad());
    }
    Ok(CgroupSetting {
        controller: controller.to_owned(),
        file: file.to_owned(),
        value: value.to_owned(),
    })
}

fn parse_limit(text: &str) -> Result<ResourceLimit, ArgsError> {
    let bad = || ArgsError::ResourceLimit(text.to_owned());
    let (name, value) = text.split_once('=').ok_or_else(bad)?;
    let value: u64 = value.parse().map_err(|_| bad())?;
    match name {
        "fsize" => Ok(ResourceLimit::FileSize(value)),
        "no-file" => Ok(ResourceLimit::OpenFiles(value)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<Args, clap::Error> {
        let exe = std::env::current_exe().unwrap();
        let mut all = vec![
            "vmm-jailer",
            "--id",
            "vm-1",
            "--exec-file",
            exe.to_str().unwrap(),
            "--uid",
            "123",
            "--gid",
            "100",
        ];
        all.extend_from_slice(extra);
        Args::try_parse_from(all)
    }

    #[test]
    fn firecracker_s_flags_parse_and_the_vmm_s_follow_the_double_dash() {
        let parsed = args(&[
            "--cgroup",
            "cpuset.cpus=0-1",
            "--cgroup",
            "cpuset.mems=0",
            "--cgroup-version",
            "2",
            "--parent-cgroup",
            "all/vms",
            "--resource-limit",
            "fsize=1000",
            "--netns",
            "/var/run/netns/n",
            "--daemonize",
            "--new-pid-ns",
            "--",
            "--api-sock",
            "/run/api.sock",
        ])
        .unwrap();
        let plan = parsed.validate().unwrap();
        assert_eq!(parsed.cgroup_version, CgroupVersion::V2);
        assert_eq!(parsed.vmm_args, ["--api-sock", "/run/api.sock"]);
        assert_eq!(plan.parent_cgroup, Path::new("all/vms"));
        assert_eq!(
            plan.cgroups[0],
            CgroupSetting {
                controller: "cpuset".into(),
                file: "cpuset.cpus".into(),
                value: "0-1".into()
            }
        );
        assert_eq!(
            plan.limits,
            [
                ResourceLimit::FileSize(1000),
                ResourceLimit::OpenFiles(DEFAULT_OPEN_FILES)
            ]
        );
        assert!(parsed.daemonize && parsed.new_pid_ns);
    }

    #[test]
    fn defaults_are_firecracker_s() {
        let parsed = args(&[]).unwrap();
        let plan = parsed.validate().unwrap();
        assert_eq!(parsed.cgroup_version, CgroupVersion::V1);
        assert_eq!(parsed.chroot_base_dir, Path::new("/srv/jailer"));
        let name = &plan.exec_name;
        assert_eq!(plan.parent_cgroup, Path::new(name));
        assert_eq!(plan.limits, [ResourceLimit::OpenFiles(DEFAULT_OPEN_FILES)]);
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        let cases: &[(&[&str], &str)] = &[
            (&["--cgroup", "cpus=0"], "--cgroup 'cpus=0'"),
            (&["--cgroup", "../x.y=1"], "--cgroup '../x.y=1'"),
            (&["--cgroup", "cpuset.cpus"], "--cgroup 'cpuset.cpus'"),
            (&["--parent-cgroup", "../up"], "--parent-cgroup '../up'"),
            (&["--parent-cgroup", "/abs"], "--parent-cgroup '/abs'"),
            (
                &["--resource-limit", "nproc=1"],
                "--resource-limit 'nproc=1'",
            ),
            (
                &["--resource-limit", "fsize=x"],
                "--resource-limit 'fsize=x'",
            ),
            (&["--chroot-base-dir", "rel"], "--chroot-base-dir rel"),
        ];
        for (extra, said) in cases {
            let err = args(extra).unwrap().validate().unwrap_err().to_string();
            assert!(err.starts_with(said), "{extra:?}: {err}");
        }
        for id in ["", "a b", "../x", &"x".repeat(65)] {
            let mut parsed = args(&[]).unwrap();
            parsed.id = id.to_owned();
            assert_eq!(parsed.validate(), Err(ArgsError::Id(id.to_owned())));
        }
        let mut parsed = args(&[]).unwrap();
        parsed.exec_file = "/".into();
        assert!(matches!(parsed.validate(), Err(ArgsError::ExecFile(..))));
        assert!(args(&["--cgroup-version", "3"]).is_err());
    }
}
