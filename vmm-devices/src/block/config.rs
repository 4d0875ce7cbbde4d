//! A virtio-blk drive over a raw image: its configuration and checks (Firecracker's
//! `PUT /drives/{id}`).

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::rate_limiter::RateLimiterConfig;

/// Errors of a drive's configuration; each message starts with the setting's name.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// A drive id is not one Firecracker takes.
    #[error("drive id {0:?}: {1}")]
    Id(String, &'static str),
    /// A drive does not fit the others, or its options do not fit together.
    #[error("drive: {0}")]
    Invalid(String),
    /// The image is missing or unusable.
    #[error("drive path_on_host {}: {why}", .path.display())]
    Image {
        /// The image.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// Longest drive id (virtio-blk's serial number, which the guest can read, is 20 bytes).
pub const MAX_DRIVE_ID: usize = 20;

/// A virtio-blk drive.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DriveConfig {
    /// The drive's id: letters, digits and '_' (Firecracker's rule), at most [`MAX_DRIVE_ID`]
    /// bytes; the guest reads it as the disk's serial number.
    pub id: String,
    /// The raw image: a regular file or a block device.
    pub path: PathBuf,
    /// The guest may only read it.
    pub read_only: bool,
    /// The guest's root file system: `root=/dev/vda` (or `root=PARTUUID=...`) goes on the
    /// kernel command line, and the drive comes first.
    pub root: bool,
    /// The root partition's PARTUUID, for a root drive with a partition table.
    pub partuuid: Option<String>,
    /// Caps the guest's requests (bytes read or written, and requests).
    #[serde(default)]
    pub rate_limiter: RateLimiterConfig,
    /// How requests reach the image.
    #[serde(default)]
    pub io_engine: IoEngine,
}

/// How a drive's requests reach its image (Firecracker's `io_engine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum IoEngine {
    /// One request after the other on the event loop's thread.
    #[default]
    Sync,
    /// Through an io_uring: many requests in flight, the event loop free meanwhile.
    Async,
}

/// The keys `--drive` takes, for messages.
const KEYS: &str = "id, path, ro, root, partuuid, io_engine";

impl FromStr for DriveConfig {
    type Err = DriveError;

    /// `id=ID,path=PATH[,ro=on|off][,root=on|off][,partuuid=UUID][,io_engine=sync|async]`
    /// (`vmm run --drive`); the result is not checked yet ([`DriveConfig::check`]).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| DriveError::Invalid(why);
        let (mut id, mut path) = (None, None);
        let (mut read_only, mut root, mut partuuid) = (false, false, None);
        let mut io_engine = IoEngine::Sync;
        for item in text.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("'{item}' is not key=value (keys: {KEYS})")))?;
            let on_off = || match value {
                "on" => Ok(true),
                "off" => Ok(false),
                _ => Err(bad(format!("{key}={value}: expected on or off"))),
            };
            match key {
                "id" => id = Some(value.to_owned()),
                "path" => path = Some(PathBuf::from(value)),
                "ro" => read_only = on_off()?,
                "root" => root = on_off()?,
                "partuuid" => partuuid = Some(value.to_owned()),
                "io_engine" => {
                    io_engine = match value {
                        "sync" | "Sync" => IoEngine::Sync,
                        "async" | "Async" => IoEngine::Async,
                        _ => return Err(bad(format!("io_engine={value}: expected sync or async"))),
                    }
                }
                _ => return Err(bad(format!("unknown key '{key}' (keys: {KEYS})"))),
            }
        }
        Ok(DriveConfig {
            id: id.ok_or_else(|| bad("id=ID is missing".into()))?,
            path: path.ok_or_else(|| bad("path=PATH is missing".into()))?,
            read_only,
            root,
            partuuid,
            rate_limiter: RateLimiterConfig::default(),
            io_engine,
        })
    }
}

/// Opens the image at `path` for a drive (read-only or read-write) and returns it with its
/// size: it must be a non-empty regular file or block device. The open never blocks (a named
/// pipe is opened without waiting for a writer, then refused) and follows no symbolic link at
/// the last component's place to anything but such an image.
pub fn open_image(path: &Path, read_only: bool) -> Result<(File, u64), DriveError> {
    let error = |why: String| DriveError::Image {
        path: path.to_owned(),
        why,
    };
    let mut image = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| error(e.to_string()))?;
    let kind = image
        .metadata()
        .map_err(|e| error(e.to_string()))?
        .file_type();
    if !(kind.is_file() || kind.is_block_device()) {
        return Err(error("is neither a regular file nor a block device".into()));
    }
    // A block device's size is where its end is; a file's is its length.
    let size = image
        .seek(SeekFrom::End(0))
        .map_err(|e| error(e.to_string()))?;
    if size == 0 {
        return Err(error("is empty".into()));
    }
    Ok((image, size))
}

/// Checks a drive id.
pub fn check_drive_id(id: &str) -> Result<(), DriveError> {
    if id.is_empty() {
        return Err(DriveError::Id(id.to_owned(), "the ID cannot be empty"));
    }
    if id.len() > MAX_DRIVE_ID {
        return Err(DriveError::Id(
            id.to_owned(),
            "longer than 20 bytes (the disk's serial number)",
        ));
    }
    if !id.bytes().all(|b| b == b'_' || b.is_ascii_alphanumeric()) {
        return Err(DriveError::Id(
            id.to_owned(),
            "only letters, digits and underscores are allowed",
        ));
    }
    Ok(())
}

impl DriveConfig {
    /// Checks the id, that the image is a non-empty regular file or block device this process
    /// can open as the drive asks (read-only or read-write), and that a PARTUUID is printable
    /// and only given for a root drive.
    pub fn check(&self) -> Result<(), DriveError> {
        check_drive_id(&self.id)?;
        open_image(&self.path, self.read_only)?;
        if let Some(partuuid) = &self.partuuid {
            if !self.root {
                return Err(DriveError::Invalid(
                    "partuuid is only used for the root device (is_root_device: true)".into(),
                ));
            }
            if partuuid.is_empty()
                || !partuuid
                    .bytes()
                    .all(|b| b == b'-' || b.is_ascii_alphanumeric())
            {
                return Err(DriveError::Invalid(format!(
                    "partuuid {partuuid:?}: expected hex digits and dashes"
                )));
            }
        }
        Ok(())
    }

    /// What the kernel command line gets for a root drive: its device (the first virtio-blk
    /// disk, /dev/vda, or a partition by PARTUUID) and whether it is mounted read-only.
    pub fn root_cmdline(&self) -> String {
        let device = match &self.partuuid {
            Some(partuuid) => format!("PARTUUID={partuuid}"),
            None => "/dev/vda".to_owned(),
        };
        let mode = if self.read_only { "ro" } else { "rw" };
        format!("root={device} {mode}")
    }
}

/// Checks a VM's drives: each valid, ids unique, at most one root drive.
pub fn check_drives(drives: &[DriveConfig]) -> Result<(), DriveError> {
    for (i, drive) in drives.iter().enumerate() {
        drive.check()?;
        if drives[..i].iter().any(|other| other.id == drive.id) {
            return Err(DriveError::Invalid(format!(
                "drive id {} is given twice",
                drive.id
            )));
        }
    }
    if drives.iter().filter(|d| d.root).count() > 1 {
        return Err(DriveError::Invalid(
            "A root block device already exists!".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn drive(id: &str, path: PathBuf) -> DriveConfig {
        DriveConfig {
            id: id.to_owned(),
            path,
            read_only: false,
            root: false,
            partuuid: None,
            rate_limiter: RateLimiterConfig::default(),
            io_engine: IoEngine::Sync,
        }
    }

    #[test]
    fn the_command_line_form_names_every_field() {
        let drive: DriveConfig = "id=rootfs,path=/img,ro=on,root=on,partuuid=ab-1,io_engine=async"
            .parse()
            .unwrap();
        assert_eq!(
            drive,
            DriveConfig {
                id: "rootfs".into(),
                path: "/img".into(),
                read_only: true,
                root: true,
                partuuid: Some("ab-1".into()),
                rate_limiter: RateLimiterConfig::default(),
                io_engine: IoEngine::Async,
            }
        );
        let plain: DriveConfig = "id=a,path=/i".parse().unwrap();
        assert_eq!(plain.io_engine, IoEngine::Sync);
        for bad in [
            "id=a,path=/i,io_engine=uring",
            "path=/img",
            "id=a",
            "id=a,path=/i,ro=yes",
            "id=a,path=/i,size=3",
            "id",
        ] {
            assert!(bad.parse::<DriveConfig>().is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_are_short_words() {
        assert!(check_drive_id("rootfs").is_ok());
        assert!(check_drive_id("data_2").is_ok());
        for bad in ["", "a-b", "a/b", "ü", "abcdefghijklmnopqrstu"] {
            assert!(check_drive_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn images_must_exist_and_open_as_asked() {
        let dir = std::env::temp_dir().join(format!("llfree-drive-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let image = dir.join("disk.img");
        fs::write(&image, vec![0u8; 4096]).unwrap();
        assert!(drive("disk", image.clone()).check().is_ok());
        let message = drive("disk", dir.join("missing")).check().unwrap_err();
        assert!(message.to_string().starts_with("drive path_on_host "));
        assert!(drive("disk", dir.clone()).check().is_err());
        // A named pipe nobody writes to is refused at once, not waited on; so is an empty file.
        let fifo = dir.join("fifo");
        let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
        for read_only in [true, false] {
            let refused = open_image(&fifo, read_only).unwrap_err().to_string();
            assert!(
                refused.contains("neither") || refused.contains("No such device"),
                "{refused}"
            );
        }
        let empty = dir.join("empty.img");
        fs::write(&empty, b"").unwrap();
        assert!(open_image(&empty, true)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert_eq!(open_image(&image, true).unwrap().1, 4096);
        let with_partuuid = DriveConfig {
            partuuid: Some("abcd-01".into()),
            ..drive("disk", image.clone())
        };
        assert!(with_partuuid.check().is_err());
        let root = DriveConfig {
            root: true,
            ..with_partuuid
        };
        assert!(root.check().is_ok());
        assert_eq!(root.root_cmdline(), "root=PARTUUID=abcd-01 rw");
        let plain_root = DriveConfig {
            root: true,
            read_only: true,
            ..drive("rootfs", image.clone())
        };
        assert_eq!(plain_root.root_cmdline(), "root=/dev/vda ro");
        let twice = [drive("a", image.clone()), drive("a", image.clone())];
        assert!(check_drives(&twice).is_err());
        let two_roots = [
            plain_root.clone(),
            DriveConfig {
                id: "b".into(),
                ..plain_root
            },
        ];
        assert!(check_drives(&two_roots).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
