//! A virtio-vsock device: its configuration and checks (Firecracker's `PUT /vsock`,
//! `vmm run --vsock`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors of the vsock device's configuration.
#[derive(Debug, thiserror::Error)]
pub enum VsockConfigError {
    /// The vsock device's settings are invalid.
    #[error("vsock: {0}")]
    Invalid(String),
}

/// Smallest CID a guest may have (0 to 2 are the hypervisor's, the host's and reserved).
pub const MIN_GUEST_CID: u32 = 3;

/// A virtio-vsock device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockConfig {
    /// The guest's CID.
    pub guest_cid: u32,
    /// The Unix socket host programs connect to (`CONNECT <port>\n`); guest connections to
    /// port P go to `<uds_path>_P`.
    pub uds_path: PathBuf,
}

/// The keys `--vsock` takes, for messages.
const KEYS: &str = "cid, uds";

impl VsockConfig {
    /// `cid=N,uds=PATH` (`vmm run --vsock`); checked with [`Self::check`].
    pub fn parse(text: &str) -> Result<Self, VsockConfigError> {
        let bad = |why: String| VsockConfigError::Invalid(why);
        let (mut cid, mut uds) = (None, None);
        for item in text.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("'{item}' is not key=value (keys: {KEYS})")))?;
            match key {
                "cid" => {
                    cid = Some(
                        value
                            .parse()
                            .map_err(|_| bad(format!("cid={value}: expected a number")))?,
                    )
                }
                "uds" => uds = Some(PathBuf::from(value)),
                _ => return Err(bad(format!("unknown key '{key}' (keys: {KEYS})"))),
            }
        }
        let config = VsockConfig {
            guest_cid: cid.ok_or_else(|| bad("cid=N is missing".into()))?,
            uds_path: uds.ok_or_else(|| bad("uds=PATH is missing".into()))?,
        };
        config.check()?;
        Ok(config)
    }

    /// Checks the CID, and that nothing is at `uds_path` yet (the device makes its socket
    /// there; whatever is there stays) and its directory exists.
    pub fn check(&self) -> Result<(), VsockConfigError> {
        if self.guest_cid < MIN_GUEST_CID {
            return Err(VsockConfigError::Invalid(format!(
                "guest_cid {}: at least {MIN_GUEST_CID}",
                self.guest_cid
            )));
        }
        let path = &self.uds_path;
        if path.as_os_str().is_empty() {
            return Err(VsockConfigError::Invalid("uds_path is empty".into()));
        }
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(VsockConfigError::Invalid(format!(
                "uds_path {}: something is there already (remove an old socket first)",
                path.display()
            )));
        }
        // The socket is bound once the VM starts; its directory is checked now, as Firecracker
        // (which binds it at once) refuses such a request.
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        if !std::fs::metadata(dir).is_ok_and(|meta| meta.is_dir()) {
            return Err(VsockConfigError::Invalid(format!(
                "uds_path {}: the directory {} does not exist",
                path.display(),
                dir.display()
            )));
        }
        // A socket path is at most 107 bytes, and guest ports add up to 11 more.
        if path.as_os_str().len() > 96 {
            return Err(VsockConfigError::Invalid(format!(
                "uds_path {}: longer than 96 bytes (a Unix socket's path is at most 107, with \
                 `_PORT` after it)",
                path.display()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_form_gives_a_cid_and_a_free_socket_path() {
        let dir = std::env::temp_dir().join(format!("vsock-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let free = dir.join("v.sock");
        let config = VsockConfig::parse(&format!("cid=3,uds={}", free.display())).unwrap();
        assert_eq!(config.guest_cid, 3);
        assert!(VsockConfig::parse(&format!("cid=2,uds={}", free.display())).is_err());
        assert!(VsockConfig::parse("cid=3").is_err());
        assert!(VsockConfig::parse(&format!("uds={}", free.display())).is_err());
        let taken = dir.join("taken");
        std::fs::write(&taken, b"").unwrap();
        let refused = VsockConfig::parse(&format!("cid=3,uds={}", taken.display()));
        assert!(refused.unwrap_err().to_string().contains("already"));
        assert_eq!(std::fs::read(&taken).unwrap(), b"", "left as it was");
        let nowhere = VsockConfig::parse("cid=3,uds=/nonexistent-llfree-vmm/v.sock");
        assert!(
            nowhere.unwrap_err().to_string().contains("does not exist"),
            "a socket in a missing directory"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
