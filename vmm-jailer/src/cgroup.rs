//! Placing the VMM in a cgroup `<hierarchy>/<parent>/<id>` with the `--cgroup` values
//! written, version 1 (a hierarchy per controller, found in /proc/mounts) or 2 (the unified
//! one, its controllers enabled down the path).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::args::{CgroupSetting, CgroupVersion};

/// Errors placing the VMM in its cgroups.
#[derive(Debug, Error)]
pub enum CgroupError {
    /// /proc/mounts could not be read.
    #[error("cannot read /proc/mounts: {0}")]
    Mounts(#[source] io::Error),
    /// No hierarchy of the version has the controller.
    #[error(
        "no cgroup v{version} hierarchy has the '{controller}' controller (/proc/mounts){hint}"
    )]
    NoHierarchy {
        /// 1 or 2.
        version: u8,
        /// The controller asked for.
        controller: String,
        /// What to try instead.
        hint: &'static str,
    },
    /// A directory of the path could not be made.
    #[error("cannot create the cgroup {0}: {1}")]
    Create(PathBuf, #[source] io::Error),
    /// A value could not be written.
    #[error("cannot write '{value}' to {file}: {source}")]
    Write {
        /// The cgroup file.
        file: PathBuf,
        /// What was written.
        value: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
}

/// A mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    dir: PathBuf,
    version: u8,
    /// v1: the controllers bound to it (mount options).
    controllers: Vec<String>,
}

/// Places process `pid` in `<hierarchy>/<parent>/<id>` of each hierarchy that `settings`
/// need, after writing them there; returns the cgroup directories. Nothing is done without
/// settings.
pub fn place(
    version: CgroupVersion,
    settings: &[CgroupSetting],
    parent: &Path,
    id: &str,
    pid: u32,
) -> Result<Vec<PathBuf>, CgroupError> {
    if settings.is_empty() {
        return Ok(Vec::new());
    }
    let text = fs::read_to_string("/proc/mounts").map_err(CgroupError::Mounts)?;
    let mounts = parse_mounts(&text);
    let relative = parent.join(id);
    match version {
        CgroupVersion::V1 => place_v1(&mounts, settings, &relative, pid),
        CgroupVersion::V2 => place_v2(&mounts, settings, &relative, pid).map(|dir| vec![dir]),
    }
}

fn place_v1(
    mounts: &[Mount],
    settings: &[CgroupSetting],
    relative: &Path,
    pid: u32,
) -> Result<Vec<PathBuf>, CgroupError> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for setting in settings {
        let mount = mounts
            .iter()
            .find(|m| m.version == 1 && m.controllers.contains(&setting.controller))
            .ok_or_else(|| CgroupError::NoHierarchy {
                version: 1,
                controller: setting.controller.clone(),
                hint: "; where the host has only the unified hierarchy, --cgroup-version 2",
            })?;
        let dir = make_path(&mount.dir, relative, |level, parent| {
            // A new cpuset has no CPUs and no memory nodes: it takes its parent's, as a
            // process can join it only with both.
            if setting.controller != "cpuset" {
                return Ok(());
            }
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let own = fs::read_to_string(level.join(file)).unwrap_or_default();
                if own.trim().is_empty() {
                    let inherited = fs::read_to_string(parent.join(file)).unwrap_or_default();
                    write(&level.join(file), inherited.trim())?;
                }
            }
            Ok(())
        })?;
        write(&dir.join(&setting.file), &setting.value)?;
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    for dir in &dirs {
        write(&dir.join("cgroup.procs"), &pid.to_string())?;
    }
    Ok(dirs)
}

fn place_v2(
    mounts: &[Mount],
    settings: &[CgroupSetting],
    relative: &Path,
    pid: u32,
) -> Result<PathBuf, CgroupError> {
    let mount = mounts
        .iter()
        .find(|m| m.version == 2)
        .ok_or_else(|| CgroupError::NoHierarchy {
            version: 2,
            controller: settings[0].controller.clone(),
            hint: "; where the host has per-controller hierarchies, --cgroup-version 1",
        })?;
    // `cgroup.*` are the core's files, in every cgroup without a controller to enable.
    let mut controllers: Vec<&str> = settings
        .iter()
        .map(|s| s.controller.as_str())
        .filter(|&c| c != "cgroup")
        .collect();
    controllers.sort_unstable();
    controllers.dedup();
    let enable: String = controllers
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    // Every level above the VM's cgroup hands the controllers down to its children.
    let dir = make_path(&mount.dir, relative, |_, parent| match enable.is_empty() {
        true => Ok(()),
        false => write(&parent.join("cgroup.subtree_control"), &enable),
    })?;
    for setting in settings {
        write(&dir.join(&setting.file), &setting.value)?;
    }
    write(&dir.join("cgroup.procs"), &pid.to_string())?;
    Ok(dir)
}

/// Makes the directories of `relative` under hierarchy `base`, calling `prepare(level,
/// parent)` for each level (made now or before) from the top down; returns the last.
fn make_path(
    base: &Path,
    relative: &Path,
    mut prepare: impl FnMut(&Path, &Path) -> Result<(), CgroupError>,
) -> Result<PathBuf, CgroupError> {
    let mut dir = base.to_owned();
    for component in relative.components() {
        let parent = dir.clone();
        dir.push(component);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CgroupError::Create(dir, e)),
        }
        prepare(&dir, &parent)?;
    }
    Ok(dir)
}

fn write(file: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(file, value).map_err(|source| CgroupError::Write {
        file: file.to_owned(),
        value: value.to_owned(),
        source,
    })
}

/// The cgroup hierarchies of /proc/mounts' text.
fn parse_mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (dir, kind, options) = (fields.get(1)?, fields.get(2)?, fields.get(3)?);
            let dir = PathBuf::from(dir.replace("\\040", " "));
            match *kind {
                "cgroup" => Some(Mount {
                    dir,
                    version: 1,
                    controllers: options.split(',').map(str::to_owned).collect(),
                }),
                "cgroup2" => Some(Mount {
                    dir,
                    version: 2,
                    controllers: Vec::new(),
                }),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hierarchies_of_a_hybrid_host_are_found() {
        let text = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
                    cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n\
                    cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n\
                    cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        let mounts = parse_mounts(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[1].dir, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(mounts[1].controllers.contains(&"cpuacct".to_owned()));
        assert_eq!(mounts[2].version, 2);
    }

    #[test]
    fn a_controller_no_hierarchy_has_is_named_with_a_hint() {
        let setting = CgroupSetting {
            controller: "memory".into(),
            file: "memory.max".into(),
            value: "1G".into(),
        };
        let err = place_v1(&[], std::slice::from_ref(&setting), Path::new("p/id"), 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'memory'") && err.contains("--cgroup-version 2"),
            "{err}"
        );
        let err = place_v2(&[], &[setting], Path::new("p/id"), 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--cgroup-version 1"), "{err}");
    }
}
