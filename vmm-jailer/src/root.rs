//! The VMM's root: a directory built for it (the exec file, what it needs to start, device
//! nodes), made the root of a mount namespace of its own with `pivot_root` (on a host whose
//! root is an initramfs, moved over it and entered with `chroot`).
//!
//! Nothing under the chroot base is reached by a path the kernel resolves on its own: each
//! directory from the base down is opened (or made, then opened) by name in its parent with
//! `O_NOFOLLOW | O_DIRECTORY`, and every file is made, replaced, linked, chowned and mounted
//! through those open directories, so that no link planted anywhere under the base is ever
//! followed. A part that exists already (the id used before, or made by hand) must be what the
//! jailer would make: a directory, owned by the jailer (the root and `run` may also be the
//! VMM's user's), that nobody else may write; a file it puts is replaced only if it is a
//! regular file or a device node (e.g. a former VMM's pid file). Anything else is refused with
//! the path and why.

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag, AT_FDCWD};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::stat::{fstat, fstatat, mkdirat, mknodat, FileStat, Mode, SFlag};
use nix::unistd::{chroot, fchdir, fchown, fchownat, linkat, pivot_root, unlinkat};
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use thiserror::Error;

/// Errors building or entering the root.
#[derive(Debug, Error)]
pub enum RootError {
    /// A file or directory could not be made.
    #[error("cannot create {0}: {1}")]
    Create(PathBuf, #[source] io::Error),
    /// Something in the root is not what the jailer would have made.
    #[error("{0} {1}: refused (the jailer follows no link and replaces only what it made)")]
    Unexpected(PathBuf, &'static str),
    /// A device the VMM needs is missing on the host.
    #[error("the host has no {0}: {1}")]
    Device(&'static str, #[source] io::Error),
    /// A device node could not be made or given to the VMM's user.
    #[error("cannot make {0} in the root: {1}")]
    Node(PathBuf, #[source] nix::Error),
    /// The mount namespace or the root switch failed.
    #[error("cannot enter the root {0} ({1}): {2}")]
    Enter(PathBuf, &'static str, #[source] nix::Error),
}

/// A character device of the host that the VMM gets a node of in its root.
#[derive(Debug, Clone, Copy)]
pub struct Device {
    /// Its path on the host and, without the leading slash, in the root.
    pub path: &'static str,
    /// Whether the VMM cannot run without it.
    pub required: bool,
}

/// KVM; tun for taps (virtio-net); userfaultfd for lazy population, which an unprivileged
/// process may use for KVM's faults only through the device.
pub const DEVICES: [Device; 3] = [
    Device {
        path: "/dev/kvm",
        required: true,
    },
    Device {
        path: "/dev/net/tun",
        required: false,
    },
    Device {
        path: "/dev/userfaultfd",
        required: false,
    },
];

/// Who may own a directory that exists already.
#[derive(Debug, Clone, Copy)]
enum ExpectedOwner {
    /// The jailer's user alone (the directories above the root, those in it).
    Jailer,
    /// The jailer's user or the VMM's (the root itself and `run`, which the jailer gives it).
    JailerOrVmm(Uid),
}

/// A directory of the jail, open.
#[derive(Debug)]
struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn io_error(errno: Errno) -> io::Error {
    io::Error::from_raw_os_error(errno as i32)
}

impl Dir {
    /// Opens directory `path` of the host (links followed: the chroot base, an admin's path).
    fn open_host(path: &Path) -> Result<Dir, RootError> {
        let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let fd = openat(AT_FDCWD, path, flags, Mode::empty())
            .map_err(|e| RootError::Create(path.to_owned(), io_error(e)))?;
        Ok(Dir {
            fd,
            path: path.to_owned(),
        })
    }

    /// Opens directory `name` in this one, made first if missing (mode 0755), without
    /// following a link; one that exists must be owned as `owner` says and writable by its
    /// owner alone.
    fn child(&self, name: &str, owner: ExpectedOwner) -> Result<Dir, RootError> {
        let path = self.path.join(name);
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(RootError::Create(path, io_error(e))),
        }
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let fd = match openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                let link = self.stat(name)?.is_some_and(|stat| {
                    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK
                });
                let what = match link {
                    true => "is a symbolic link",
                    false => "is no directory",
                };
                return Err(RootError::Unexpected(path, what));
            }
            Err(e) => return Err(RootError::Create(path, io_error(e))),
        };
        let stat = fstat(&fd).map_err(|e| RootError::Create(path.clone(), io_error(e)))?;
        let uid = Uid::from_raw(stat.st_uid);
        let allowed = match owner {
            ExpectedOwner::Jailer => uid == Uid::effective(),
            ExpectedOwner::JailerOrVmm(vmm) => uid == Uid::effective() || uid == vmm,
        };
        if !allowed {
            return Err(RootError::Unexpected(path, "belongs to another user"));
        }
        if stat.st_mode & 0o022 != 0 {
            return Err(RootError::Unexpected(path, "is writable by others"));
        }
        Ok(Dir { fd, path })
    }

    /// Opens (making what is missing) the directories of `relative` in this one, each owned by
    /// the jailer.
    fn descend(&self, relative: &Path) -> Result<Dir, RootError> {
        let mut dir = Dir {
            fd: self
                .fd
                .try_clone()
                .map_err(|e| RootError::Create(self.path.clone(), e))?,
            path: self.path.clone(),
        };
        for component in relative.components() {
            let Component::Normal(name) = component else {
                continue;
            };
            dir = dir.child(&name.to_string_lossy(), ExpectedOwner::Jailer)?;
        }
        Ok(dir)
    }

    /// What `name` in this directory is, its link not followed; `None` if nothing.
    fn stat(&self, name: &str) -> Result<Option<FileStat>, RootError> {
        match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(stat)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(RootError::Create(self.path.join(name), io_error(e))),
        }
    }

    /// Removes `name` if it is a regular file or a character device (something made before);
    /// anything else there is refused.
    fn clear(&self, name: &str) -> Result<(), RootError> {
        let Some(stat) = self.stat(name)? else {
            return Ok(());
        };
        let kind = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
        if kind != SFlag::S_IFREG && kind != SFlag::S_IFCHR {
            let what = match kind {
                SFlag::S_IFLNK => "is a symbolic link",
                SFlag::S_IFDIR => "is a directory",
                _ => "is neither a regular file nor a device node",
            };
            return Err(RootError::Unexpected(self.path.join(name), what));
        }
        unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| RootError::Create(self.path.join(name), io_error(e)))
    }

    /// Makes the new regular file `name` (`mode`), refusing anything there.
    fn create_file(&self, name: &str, mode: u32) -> Result<File, RootError> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        openat(&self.fd, name, flags, Mode::from_bits_truncate(mode))
            .map(File::from)
            .map_err(|e| RootError::Create(self.path.join(name), io_error(e)))
    }
}

/// The VMM's root `<base>/<parts...>/root`, open.
#[derive(Debug)]
pub struct Root {
    dir: Dir,
    base: PathBuf,
    parts: Vec<String>,
    /// The VMM's user and group.
    vmm: (Uid, Gid),
}

impl Root {
    /// Opens the root of `base` (followed as given) and `parts` (each made if missing), for
    /// a VMM that runs as `uid` and `gid`.
    pub fn open(base: &Path, parts: &[&str], uid: Uid, gid: Gid) -> Result<Root, RootError> {
        fs::create_dir_all(base).map_err(|e| RootError::Create(base.to_owned(), e))?;
        let parts: Vec<String> = parts.iter().map(|&part| part.to_owned()).collect();
        let parent = Self::parent(base, &parts)?;
        Ok(Root {
            dir: parent.child("root", ExpectedOwner::JailerOrVmm(uid))?,
            base: base.to_owned(),
            parts,
            vmm: (uid, gid),
        })
    }

    /// The root's parent directory, walked down from the base.
    fn parent(base: &Path, parts: &[String]) -> Result<Dir, RootError> {
        let mut parent = Dir::open_host(base)?;
        for part in parts {
            parent = parent.child(part, ExpectedOwner::Jailer)?;
        }
        Ok(parent)
    }

    /// Puts host file `source` into the root at `relative`, owned by root and writable by
    /// nobody else: a hard link where it is such a file on the root's file system (a VMM
    /// binary of tens of MiB is not copied for every VM), else a copy without write bits for
    /// others. A `source` that is a symbolic link (e.g. `/lib64/ld-linux-x86-64.so.2`) puts the
    /// file it names there, never the link itself.
    pub fn copy_in(&self, source: &Path, relative: &Path) -> Result<(), RootError> {
        let parent = relative.parent().unwrap_or(Path::new(""));
        let dir = self.dir.descend(parent)?;
        let name = relative
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let target = dir.path.join(&name);
        dir.clear(&name)?;
        let created = |e| RootError::Create(target.clone(), e);
        let source = &fs::canonicalize(source).map_err(created)?;
        let file = fs::metadata(source).map_err(created)?;
        let dir_dev = fstat(&dir.fd).map_err(|e| created(io_error(e)))?.st_dev;
        if file.uid() == 0 && file.mode() & 0o022 == 0 && file.dev() == dir_dev {
            match linkat(AT_FDCWD, source, &dir.fd, name.as_str(), AtFlags::empty()) {
                Ok(()) => return Ok(()),
                // Refused (e.g. protected_hardlinks): copied instead.
                Err(_) => dir.clear(&name)?,
            }
        }
        let mut from = File::open(source).map_err(created)?;
        let mode = from.metadata().map_err(created)?.permissions().mode() & 0o755;
        let mut to = dir.create_file(&name, mode)?;
        io::copy(&mut from, &mut to).map_err(created)?;
        to.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(created)?;
        Ok(())
    }

    /// Makes directory `name` in the root (or, with "", the root itself) the VMM's: owned by
    /// its user and group (e.g. `run` for its API socket).
    pub fn give_dir(&self, name: &str) -> Result<(), RootError> {
        let dir = match name {
            "" => &self.dir,
            name => &self
                .dir
                .child(name, ExpectedOwner::JailerOrVmm(self.vmm.0))?,
        };
        let (uid, gid) = self.vmm;
        fchown(&dir.fd, Some(uid), Some(gid)).map_err(|e| RootError::Node(dir.path.clone(), e))
    }

    /// Makes a node of each host device of [`DEVICES`] in the root (the host's numbers, mode
    /// 0600), owned by the VMM's user.
    pub fn make_devices(&self) -> Result<(), RootError> {
        for device in DEVICES {
            let rdev = match fs::metadata(device.path) {
                Ok(m) if m.file_type().is_char_device() => m.rdev(),
                Ok(_) if device.required => {
                    let error = io::Error::other("not a character device");
                    return Err(RootError::Device(device.path, error));
                }
                Err(e) if device.required => return Err(RootError::Device(device.path, e)),
                _ => continue,
            };
            let relative = Path::new(device.path.trim_start_matches('/'));
            let dir = self
                .dir
                .descend(relative.parent().unwrap_or(Path::new("")))?;
            let name = relative
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let node = dir.path.join(&name);
            dir.clear(&name)?;
            let mode = Mode::S_IRUSR | Mode::S_IWUSR;
            mknodat(&dir.fd, name.as_str(), SFlag::S_IFCHR, mode, rdev)
                .map_err(|e| RootError::Node(node.clone(), e))?;
            let (uid, gid) = (Some(self.vmm.0), Some(self.vmm.1));
            fchownat(
                &dir.fd,
                name.as_str(),
                uid,
                gid,
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| RootError::Node(node, e))?;
        }
        Ok(())
    }

    /// Makes the root this process's root in a mount namespace of its own: every mount
    /// private, the root (walked down to again in the new namespace, whose mounts its open
    /// directories do not name) bound onto itself through its open directory
    /// (/proc/self/fd), `pivot_root` into it (entered by name from its open parent, which
    /// crosses onto the bind) and the old root detached, so that no host file outside it can
    /// be reached by any path.
    pub fn enter(self) -> Result<(), RootError> {
        let root = &self.dir.path;
        let fail = |step| move |e| RootError::Enter(root.clone(), step, e);
        unshare(CloneFlags::CLONE_NEWNS).map_err(fail("unshare the mount namespace"))?;
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_PRIVATE | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(fail("make the mounts private"))?;
        let parent = Self::parent(&self.base, &self.parts)?;
        let dir = parent.child("root", ExpectedOwner::JailerOrVmm(self.vmm.0))?;
        let named = PathBuf::from(format!("/proc/self/fd/{}", dir.fd.as_raw_fd()));
        mount(
            Some(&named),
            &named,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(fail("bind it onto itself"))?;
        let bound = parent.child("root", ExpectedOwner::JailerOrVmm(self.vmm.0))?;
        fchdir(bound.fd.as_fd()).map_err(fail("change into it"))?;
        match pivot_root(".", ".") {
            // The old root is stacked under the new one and detached from there.
            Ok(()) => umount2(".", MntFlags::MNT_DETACH).map_err(fail("detach the old root"))?,
            // The host's root is an initramfs, which pivot_root refuses (it has no parent
            // mount): the root is moved over it and made this process's root with chroot, as
            // switch_root and runc's --no-pivot do. What else was mounted stays beneath, where
            // no path reaches, and leaving a chroot needs the capabilities the VMM has not.
            Err(Errno::EINVAL)
                if root_is_initramfs(
                    &fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
                ) =>
            {
                mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
                    .map_err(fail("move it over the initramfs"))?;
                chroot(".").map_err(fail("chroot"))?;
            }
            Err(e) => return Err(fail("pivot_root")(e)),
        }
        nix::unistd::chdir("/").map_err(fail("change into the new root"))?;
        Ok(())
    }
}

/// Writes `contents` to a new file `name` in directory `dir` (the pid file in `/` after
/// [`Root::enter`]): a regular file left there before is replaced, a link or anything else is
/// refused, so that what a former jailed VMM left cannot redirect the jailer's write.
pub fn write_new(dir: &Path, name: &str, contents: &str) -> Result<(), RootError> {
    let top = Dir::open_host(dir)?;
    top.clear(name)?;
    let mut file = top.create_file(name, 0o644)?;
    io::Write::write_all(&mut file, contents.as_bytes())
        .map_err(|e| RootError::Create(top.path.join(name), e))
}

/// Whether `mountinfo` (a process's /proc/self/mountinfo) shows the kernel's initramfs
/// (`rootfs`; the fields after ` - ` start with the file system type) at its root.
fn root_is_initramfs(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        let mut fields = line.split(' ');
        let at_root = fields.nth(4) == Some("/");
        let kind = line
            .split(" - ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next());
        at_root && kind == Some("rootfs")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const UID: u32 = 4242;
    const GID: u32 = 4243;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vmm-jailer-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn open(base: &Path) -> Result<Root, RootError> {
        Root::open(
            base,
            &["vmm", "vm-1"],
            Uid::from_raw(UID),
            Gid::from_raw(GID),
        )
    }

    /// What a directory tree holds, to compare before and after: each entry's path, kind,
    /// owner, mode and contents (of files).
    fn snapshot(dir: &Path) -> Vec<(PathBuf, u32, u32, Vec<u8>)> {
        let mut seen = Vec::new();
        let mut todo = vec![dir.to_owned()];
        while let Some(at) = todo.pop() {
            let meta = fs::symlink_metadata(&at).unwrap();
            let contents = if meta.is_file() {
                fs::read(&at).unwrap()
            } else {
                Vec::new()
            };
            seen.push((at.clone(), meta.mode(), meta.uid(), contents));
            if meta.is_dir() {
                for entry in fs::read_dir(&at).unwrap() {
                    todo.push(entry.unwrap().path());
                }
            }
        }
        seen.sort();
        seen
    }

    #[test]
    fn only_a_rootfs_mounted_at_the_root_counts_as_an_initramfs() {
        let initramfs = "1 1 0:2 / / rw - rootfs rootfs rw,size=3014044k\n\
                         22 1 0:20 / /proc rw,relatime - proc proc rw\n";
        assert!(root_is_initramfs(initramfs));
        let disk = "24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    25 24 0:22 / /tmp rw - rootfs rootfs rw\n";
        assert!(!root_is_initramfs(disk));
        assert!(!root_is_initramfs(""));
    }

    #[test]
    fn a_file_lands_in_new_directories_linked_or_copied_without_write_bits_for_others() {
        let base = scratch("copy");
        let root = open(&base).unwrap();
        let at = base.join("vmm/vm-1/root");
        let exe = std::env::current_exe().unwrap();
        root.copy_in(&exe, Path::new("lib/x/tool")).unwrap();
        let copied = at.join("lib/x/tool");
        assert_eq!(fs::read(&copied).unwrap(), fs::read(&exe).unwrap());
        assert_eq!(
            fs::metadata(&copied).unwrap().permissions().mode() & 0o777,
            fs::metadata(&exe).unwrap().permissions().mode() & 0o755
        );
        // One that others may write is copied, without their write bits.
        let shared = base.join("shared");
        fs::write(&shared, "x").unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o666)).unwrap();
        root.copy_in(&shared, Path::new("lib/shared")).unwrap();
        let copy = fs::metadata(at.join("lib/shared")).unwrap();
        assert_ne!(copy.ino(), fs::metadata(&shared).unwrap().ino());
        assert_eq!(copy.mode() & 0o777, 0o644);
        // A second copy (the id used again) replaces the file.
        root.copy_in(&exe, Path::new("lib/x/tool")).unwrap();
        // The root and `run` become the VMM's; a second jailer accepts them so.
        root.give_dir("run").unwrap();
        root.give_dir("").unwrap();
        for dir in [at.clone(), at.join("run")] {
            let meta = fs::metadata(&dir).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (UID, GID), "{}", dir.display());
        }
        drop(root);
        let again = open(&base).unwrap();
        again.copy_in(&exe, Path::new("lib/x/tool")).unwrap();
        again.give_dir("run").unwrap();
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_source_that_is_a_link_puts_the_file_it_names_and_can_be_put_again() {
        let base = scratch("link-source");
        let host = base.join("host");
        fs::create_dir_all(&host).unwrap();
        // On the root's file system and root-owned, so that it is hard-linked (the case where
        // link(2) would link the symbolic link itself).
        let real = host.join("ld.so");
        fs::write(&real, "loader").unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o755)).unwrap();
        let link = host.join("ld-link.so");
        symlink(&real, &link).unwrap();
        let root = open(&base).unwrap();
        let put = base.join("vmm/vm-1/root/lib64/ld.so");
        for _ in 0..2 {
            root.copy_in(&link, Path::new("lib64/ld.so")).unwrap();
            let meta = fs::symlink_metadata(&put).unwrap();
            assert!(meta.is_file(), "{:?}", meta.file_type());
            assert_eq!(fs::read_to_string(&put).unwrap(), "loader");
        }
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_new_file_replaces_a_regular_one_and_refuses_a_link() {
        let dir = scratch("write");
        write_new(&dir, "vmm.pid", "1").unwrap();
        write_new(&dir, "vmm.pid", "22").unwrap();
        assert_eq!(fs::read_to_string(dir.join("vmm.pid")).unwrap(), "22");
        let target = dir.join("target");
        fs::write(&target, "kept").unwrap();
        symlink(&target, dir.join("link.pid")).unwrap();
        let err = write_new(&dir, "link.pid", "3").unwrap_err();
        assert!(matches!(err, RootError::Unexpected(..)), "{err}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "kept");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Plants something in a base (first argument), with an outside directory beside it.
    type Plant = dyn Fn(&Path, &Path);

    /// Plants a symbolic link to `outside` at `relative` in `base`.
    fn symlink_at(relative: &'static str) -> impl Fn(&Path, &Path) {
        move |base: &Path, outside: &Path| {
            let at = base.join(relative);
            fs::create_dir_all(at.parent().unwrap()).unwrap();
            symlink(outside, at).unwrap();
        }
    }

    /// Builds a root in `base` as the jailer does.
    fn build(base: &Path) -> Result<(), RootError> {
        let root = open(base)?;
        let exe = std::env::current_exe().unwrap();
        root.copy_in(&exe, Path::new("vmm"))?;
        root.copy_in(&exe, Path::new("lib/x86_64-linux-gnu/tool"))?;
        root.make_devices()?;
        root.give_dir("run")?;
        root.give_dir("")
    }

    /// Each way to plant a link, or another kind of file, where the jailer builds (in a fresh
    /// base, with an `outside` directory beside it): refused, and nothing outside changes.
    #[test]
    fn no_link_planted_under_the_base_is_followed_and_nothing_outside_changes() {
        let cases: Vec<(&str, Box<Plant>)> = vec![
            ("the exec's directory", Box::new(symlink_at("vmm"))),
            ("the id's directory", Box::new(symlink_at("vmm/vm-1"))),
            ("the root", Box::new(symlink_at("vmm/vm-1/root"))),
            ("lib", Box::new(symlink_at("vmm/vm-1/root/lib"))),
            (
                "a library's directory",
                Box::new(symlink_at("vmm/vm-1/root/lib/x86_64-linux-gnu")),
            ),
            ("dev", Box::new(symlink_at("vmm/vm-1/root/dev"))),
            ("dev/net", Box::new(symlink_at("vmm/vm-1/root/dev/net"))),
            ("run", Box::new(symlink_at("vmm/vm-1/root/run"))),
            ("the exec file", Box::new(symlink_at("vmm/vm-1/root/vmm"))),
            (
                "a library",
                Box::new(symlink_at("vmm/vm-1/root/lib/x86_64-linux-gnu/tool")),
            ),
            ("/dev/kvm", Box::new(symlink_at("vmm/vm-1/root/dev/kvm"))),
            (
                "a relative link to the root's parent",
                Box::new(|base: &Path, _: &Path| {
                    fs::create_dir_all(base.join("vmm/vm-1/root")).unwrap();
                    symlink("..", base.join("vmm/vm-1/root/dev")).unwrap();
                }),
            ),
            (
                "the root as a file",
                Box::new(|base: &Path, _: &Path| {
                    fs::create_dir_all(base.join("vmm/vm-1")).unwrap();
                    fs::write(base.join("vmm/vm-1/root"), "x").unwrap();
                }),
            ),
            (
                "dev/kvm as a directory",
                Box::new(|base: &Path, _: &Path| {
                    fs::create_dir_all(base.join("vmm/vm-1/root/dev/kvm")).unwrap();
                }),
            ),
            (
                "a directory of another user",
                Box::new(|base: &Path, _: &Path| {
                    let dev = base.join("vmm/vm-1/root/dev");
                    fs::create_dir_all(&dev).unwrap();
                    std::os::unix::fs::chown(&dev, Some(UID), Some(GID)).unwrap();
                }),
            ),
            (
                "the root of another user",
                Box::new(|base: &Path, _: &Path| {
                    let root = base.join("vmm/vm-1/root");
                    fs::create_dir_all(&root).unwrap();
                    std::os::unix::fs::chown(&root, Some(UID + 1), Some(GID)).unwrap();
                }),
            ),
            (
                "a directory others may write",
                Box::new(|base: &Path, _: &Path| {
                    let id = base.join("vmm/vm-1");
                    fs::create_dir_all(&id).unwrap();
                    fs::set_permissions(&id, fs::Permissions::from_mode(0o777)).unwrap();
                }),
            ),
        ];
        for (what, plant) in &cases {
            let base = scratch("planted");
            let outside = scratch("outside");
            fs::write(outside.join("secret"), "kept").unwrap();
            plant(&base, &outside);
            let before = snapshot(&outside);
            let err = build(&base).expect_err(what);
            assert!(matches!(err, RootError::Unexpected(..)), "{what}: {err}");
            assert_eq!(snapshot(&outside), before, "{what}: outside changed");
            fs::remove_dir_all(&base).unwrap();
            fs::remove_dir_all(&outside).unwrap();
        }
    }

    #[test]
    fn hard_links_planted_in_a_used_root_are_replaced_and_their_files_left_alone() {
        let base = scratch("hard-links");
        let outside = scratch("hard-outside");
        build(&base).unwrap();
        let root = base.join("vmm/vm-1/root");
        let secret = outside.join("secret");
        fs::write(&secret, "kept").unwrap();
        // Where the jailer writes a file or node: the exec file, a library, a device node, the
        // pid file.
        let places = ["vmm", "lib/x86_64-linux-gnu/tool", "dev/kvm", "vmm.pid"];
        for place in places {
            let _ = fs::remove_file(root.join(place));
            fs::hard_link(&secret, root.join(place)).unwrap();
        }
        let before = snapshot(&outside);
        build(&base).unwrap();
        write_new(&root, "vmm.pid", "7").unwrap();
        assert_eq!(snapshot(&outside), before);
        for place in places {
            let meta = fs::symlink_metadata(root.join(place)).unwrap();
            assert_ne!(meta.ino(), fs::metadata(&secret).unwrap().ino(), "{place}");
        }
        fs::remove_dir_all(&base).unwrap();
        fs::remove_dir_all(&outside).unwrap();
    }
}
