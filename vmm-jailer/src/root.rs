//! The VMM's root: a directory built for it (the exec file, what it needs to start, device
//! nodes), made the root of a mount namespace of its own with `pivot_root` (on a host whose
//! root is an initramfs, moved over it and entered with `chroot`).
//!
//! A root that exists already (its id used before) may hold what a former jailed VMM, which
//! owned it, left there: nothing in it is followed as a link, and only regular files and
//! device nodes are replaced.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::stat::{mknod, Mode, SFlag};
use nix::unistd::{chdir, chown, chroot, pivot_root, Gid, Uid};
use thiserror::Error;

/// Errors building or entering the root.
#[derive(Debug, Error)]
pub enum RootError {
    /// A file or directory could not be made.
    #[error("cannot create {0}: {1}")]
    Create(PathBuf, #[source] io::Error),
    /// Something in the root is not what the jailer would have made.
    #[error("{0} is a link or another kind of file: not replaced")]
    Unexpected(PathBuf),
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

/// Makes `root` and the directories in it that lead to `relative`; a component that exists
/// must be a directory, not a link to one.
fn make_dirs(root: &Path, relative: &Path) -> Result<PathBuf, RootError> {
    fs::create_dir_all(root).map_err(|e| RootError::Create(root.to_owned(), e))?;
    let mut path = root.to_owned();
    for component in relative.components() {
        let Component::Normal(name) = component else {
            continue;
        };
        path.push(name);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(RootError::Unexpected(path)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&path).map_err(|e| RootError::Create(path.clone(), e))?;
            }
            Err(e) => return Err(RootError::Create(path, e)),
        }
    }
    Ok(path)
}

/// Removes what `path` holds if it is a regular file or a character device (something made
/// before); anything else there is refused.
fn clear(path: &Path) -> Result<(), RootError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() || m.file_type().is_char_device() => {
            fs::remove_file(path).map_err(|e| RootError::Create(path.to_owned(), e))
        }
        Ok(_) => Err(RootError::Unexpected(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RootError::Create(path.to_owned(), e)),
    }
}

/// Puts host file `source` into the root at `relative`, owned by root and writable by nobody
/// else: a hard link where it is such a file on the root's file system (a VMM binary of tens
/// of MiB is not copied for every VM), else a copy without write bits for others. A `source`
/// that is a symbolic link (e.g. `/lib64/ld-linux-x86-64.so.2`) puts the file it names there,
/// never the link itself (which `link(2)` would make, and which a later jailer with the same
/// id would then refuse to replace).
pub fn copy_in(root: &Path, source: &Path, relative: &Path) -> Result<(), RootError> {
    let parent = relative.parent().unwrap_or(Path::new(""));
    let dir = make_dirs(root, parent)?;
    let target = dir.join(relative.file_name().unwrap_or_default());
    clear(&target)?;
    let created = |e| RootError::Create(target.clone(), e);
    let source = &fs::canonicalize(source).map_err(created)?;
    let (file, dir) = (
        fs::metadata(source).map_err(created)?,
        fs::metadata(&dir).map_err(created)?,
    );
    if file.uid() == 0 && file.mode() & 0o022 == 0 && file.dev() == dir.dev() {
        match fs::hard_link(source, &target) {
            Ok(()) => return Ok(()),
            // Refused (e.g. protected_hardlinks): copied instead.
            Err(_) => clear(&target)?,
        }
    }
    let mut from = File::open(source).map_err(created)?;
    let mode = from.metadata().map_err(created)?.permissions().mode() & 0o755;
    let mut to = File::options()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&target)
        .map_err(created)?;
    io::copy(&mut from, &mut to).map_err(created)?;
    to.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(created)?;
    Ok(())
}

/// Writes `contents` to a new file at `path` (e.g. the pid file, inside the root after
/// [`enter`]): a regular file left there before is replaced, a link or anything else is
/// refused, so that what a former jailed VMM left cannot redirect the jailer's write.
pub fn write_new(path: &Path, contents: &str) -> Result<(), RootError> {
    clear(path)?;
    let created = |e| RootError::Create(path.to_owned(), e);
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(created)?;
    io::Write::write_all(&mut file, contents.as_bytes()).map_err(created)
}

/// Makes directory `relative` in the root, owned by the VMM's user (e.g. `run` for its API
/// socket).
pub fn own_dir(root: &Path, relative: &str, uid: Uid, gid: Gid) -> Result<(), RootError> {
    let dir = make_dirs(root, Path::new(relative))?;
    chown(&dir, Some(uid), Some(gid)).map_err(|e| RootError::Node(dir, e))
}

/// Makes a node of each host device of [`DEVICES`] in the root (the host's numbers, mode
/// 0600), owned by the VMM's user.
pub fn make_devices(root: &Path, uid: Uid, gid: Gid) -> Result<(), RootError> {
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
        let dir = make_dirs(root, relative.parent().unwrap_or(Path::new("")))?;
        let node = dir.join(relative.file_name().unwrap_or_default());
        clear(&node)?;
        let mode = Mode::S_IRUSR | Mode::S_IWUSR;
        mknod(&node, SFlag::S_IFCHR, mode, rdev).map_err(|e| RootError::Node(node.clone(), e))?;
        chown(&node, Some(uid), Some(gid)).map_err(|e| RootError::Node(node, e))?;
    }
    Ok(())
}

/// Makes `root` this process's root in a mount namespace of its own: every mount private,
/// `root` bound onto itself, `pivot_root` into it and the old root detached, so that no
/// host file outside it can be reached by any path.
pub fn enter(root: &Path) -> Result<(), RootError> {
    let fail = |step| move |e| RootError::Enter(root.to_owned(), step, e);
    unshare(CloneFlags::CLONE_NEWNS).map_err(fail("unshare the mount namespace"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_PRIVATE | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(fail("make the mounts private"))?;
    mount(
        Some(root),
        root,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(fail("bind it onto itself"))?;
    chdir(root).map_err(fail("change into it"))?;
    match pivot_root(".", ".") {
        // The old root is stacked under the new one and detached from there.
        Ok(()) => umount2(".", MntFlags::MNT_DETACH).map_err(fail("detach the old root"))?,
        // The host's root is an initramfs, which pivot_root refuses (it has no parent mount):
        // the root is moved over it and made this process's root with chroot, as switch_root
        // and runc's --no-pivot do. What else was mounted stays beneath, where no path
        // reaches, and leaving a chroot needs the capabilities the VMM has not.
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
    chdir("/").map_err(fail("change into the new root"))?;
    Ok(())
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

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vmm-jailer-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
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
        let root = scratch("copy");
        let exe = std::env::current_exe().unwrap();
        copy_in(&root, &exe, Path::new("lib/x/tool")).unwrap();
        let copied = root.join("lib/x/tool");
        assert_eq!(fs::read(&copied).unwrap(), fs::read(&exe).unwrap());
        assert_eq!(
            fs::metadata(&copied).unwrap().permissions().mode() & 0o777,
            fs::metadata(&exe).unwrap().permissions().mode() & 0o755
        );
        // One that others may write is copied, without their write bits.
        let shared = root.join("shared");
        fs::write(&shared, "x").unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o666)).unwrap();
        copy_in(&root, &shared, Path::new("lib/shared")).unwrap();
        let copy = fs::metadata(root.join("lib/shared")).unwrap();
        assert_ne!(copy.ino(), fs::metadata(&shared).unwrap().ino());
        assert_eq!(copy.mode() & 0o777, 0o644);
        // A second copy (the id used again) replaces the file.
        copy_in(&root, &exe, Path::new("lib/x/tool")).unwrap();
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_source_that_is_a_link_puts_the_file_it_names_and_can_be_put_again() {
        let root = scratch("link-source");
        let host = scratch("link-host");
        fs::create_dir_all(&host).unwrap();
        // On the root's file system and root-owned, so that it is hard-linked (the case where
        // link(2) would link the symbolic link itself).
        let real = host.join("ld.so");
        fs::write(&real, "loader").unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o755)).unwrap();
        let link = host.join("ld-link.so");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        for _ in 0..2 {
            copy_in(&root, &link, Path::new("lib64/ld.so")).unwrap();
            let put = fs::symlink_metadata(root.join("lib64/ld.so")).unwrap();
            assert!(put.is_file(), "{:?}", put.file_type());
            assert_eq!(
                fs::read_to_string(root.join("lib64/ld.so")).unwrap(),
                "loader"
            );
        }
        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&host).unwrap();
    }

    #[test]
    fn a_new_file_replaces_a_regular_one_and_refuses_a_link() {
        let dir = scratch("write");
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("vmm.pid");
        write_new(&file, "1").unwrap();
        write_new(&file, "22").unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "22");
        let target = dir.join("target");
        fs::write(&target, "kept").unwrap();
        let link = dir.join("link.pid");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = write_new(&link, "3").unwrap_err();
        assert!(matches!(err, RootError::Unexpected(_)), "{err}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "kept");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn links_left_in_a_used_root_are_not_followed() {
        let root = scratch("links");
        let outside = scratch("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::create_dir_all(&root).unwrap();
        let exe = std::env::current_exe().unwrap();
        // A directory link, and a file link, where the jailer would write.
        std::os::unix::fs::symlink(&outside, root.join("lib")).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), root.join("tool")).unwrap();
        let err = copy_in(&root, &exe, Path::new("lib/tool")).unwrap_err();
        assert!(matches!(err, RootError::Unexpected(_)), "{err}");
        let err = copy_in(&root, &exe, Path::new("tool")).unwrap_err();
        assert!(matches!(err, RootError::Unexpected(_)), "{err}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&outside).unwrap();
    }
}
