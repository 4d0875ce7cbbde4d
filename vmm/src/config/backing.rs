//! Which host memory the guest's frame pool is made of, and its textual form (`anon`,
//! `hugetlb-2m`, `hugetlb-1g`, `file:PATH`, `dax:PATH`: the `--backing` option).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use guest_mem::{Backing, FrameSize};

/// Errors of parsing `--backing`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackingKindError {
    /// The kind is unknown.
    #[error("unknown backing '{0}': expected anon, hugetlb-2m, hugetlb-1g, file:PATH or dax:PATH")]
    Unknown(String),
    /// `file:` or `dax:` without a path.
    #[error("backing '{0}' needs a path after the colon (e.g. file:/var/lib/vmm/pool)")]
    MissingPath(String),
}

/// The kind of host memory behind guest RAM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackingKind {
    /// `anon`: plain shared memory; 2 MiB frames.
    Anonymous,
    /// `hugetlb-2m`: hugetlb memory with 2 MiB pages.
    Hugetlb2M,
    /// `hugetlb-1g`: hugetlb memory with 1 GiB pages.
    Hugetlb1G,
    /// `file:PATH`: a persistent pool file, created if missing; 2 MiB frames.
    File(PathBuf),
    /// `dax:PATH`: a device DAX character device or a file on a DAX file system, which must
    /// exist; 2 MiB frames.
    Dax(PathBuf),
}

impl BackingKind {
    /// The size of the pool's frames, and so the alignment of guest RAM.
    pub fn frame_size(&self) -> FrameSize {
        match self {
            BackingKind::Hugetlb1G => FrameSize::Giant,
            _ => FrameSize::Huge,
        }
    }

    /// Whether the pool lives in a file or device (and outlives the VMM).
    pub fn is_persistent(&self) -> bool {
        matches!(self, BackingKind::File(_) | BackingKind::Dax(_))
    }

    /// The guest-mem pool backing; a persistent pool is laid out afresh with `format`, opened
    /// again otherwise.
    pub fn pool_backing(&self, format: bool) -> Backing {
        match self {
            BackingKind::Anonymous => Backing::Anonymous,
            BackingKind::Hugetlb2M => Backing::Hugetlb2M,
            BackingKind::Hugetlb1G => Backing::Hugetlb1G,
            BackingKind::File(path) | BackingKind::Dax(path) => Backing::File {
                path: path.clone(),
                format,
            },
        }
    }
}

impl FromStr for BackingKind {
    type Err = BackingKindError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let path = |rest: &str| {
            if rest.is_empty() {
                Err(BackingKindError::MissingPath(text.to_owned()))
            } else {
                Ok(PathBuf::from(rest))
            }
        };
        match text {
            "anon" => Ok(BackingKind::Anonymous),
            "hugetlb-2m" => Ok(BackingKind::Hugetlb2M),
            "hugetlb-1g" => Ok(BackingKind::Hugetlb1G),
            _ => {
                if let Some(rest) = text.strip_prefix("file:") {
                    path(rest).map(BackingKind::File)
                } else if let Some(rest) = text.strip_prefix("dax:") {
                    path(rest).map(BackingKind::Dax)
                } else {
                    Err(BackingKindError::Unknown(text.to_owned()))
                }
            }
        }
    }
}

impl fmt::Display for BackingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackingKind::Anonymous => f.write_str("anon"),
            BackingKind::Hugetlb2M => f.write_str("hugetlb-2m"),
            BackingKind::Hugetlb1G => f.write_str("hugetlb-1g"),
            BackingKind::File(path) => write!(f, "file:{}", path.display()),
            BackingKind::Dax(path) => write!(f, "dax:{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind_and_prints_it_back() {
        for text in [
            "anon",
            "hugetlb-2m",
            "hugetlb-1g",
            "file:/tmp/pool",
            "dax:/dev/dax0.0",
        ] {
            let kind: BackingKind = text.parse().unwrap();
            assert_eq!(kind.to_string(), text);
        }
        assert_eq!(
            "file:rel/pool".parse(),
            Ok(BackingKind::File(PathBuf::from("rel/pool")))
        );
    }

    #[test]
    fn rejects_unknown_kinds_and_missing_paths() {
        for bad in [
            "",
            "anonymous",
            "hugetlb",
            "HUGETLB-2M",
            "hugetlb-4m",
            "/tmp/pool",
        ] {
            assert_eq!(
                bad.parse::<BackingKind>(),
                Err(BackingKindError::Unknown(bad.to_owned()))
            );
        }
        for bad in ["file:", "dax:"] {
            assert_eq!(
                bad.parse::<BackingKind>(),
                Err(BackingKindError::MissingPath(bad.to_owned()))
            );
        }
    }

    #[test]
    fn frame_sizes_and_pool_backings_follow_the_kind() {
        assert_eq!(BackingKind::Hugetlb1G.frame_size(), FrameSize::Giant);
        assert_eq!(BackingKind::Anonymous.frame_size(), FrameSize::Huge);
        assert_eq!(BackingKind::Dax("/d".into()).frame_size(), FrameSize::Huge);
        assert_eq!(
            BackingKind::Hugetlb2M.pool_backing(false),
            Backing::Hugetlb2M
        );
        assert_eq!(
            BackingKind::File("/p".into()).pool_backing(true),
            Backing::File {
                path: "/p".into(),
                format: true
            }
        );
    }
}
