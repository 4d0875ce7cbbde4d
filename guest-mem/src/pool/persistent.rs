//! Persistent pools in a file or on a DAX device: the pool a file holds is recovered, a new or
//! empty file (or one being formatted, or one whose creation never finished) gets a fresh
//! layout, anything else is refused untouched.

use std::path::Path;

use llfree::{Config, FileRegion, Init, LLFree, FRAME_SIZE};

use super::backing::BackingFile;
use super::header::{HeaderError, PoolHeader, META_OFFSET};
use super::{PoolConfig, PoolError, Scrub};

/// A pool's allocator and backing, before the pool is put together.
pub(super) struct Opened {
    /// The allocator, over the metadata in the file.
    pub llfree: LLFree,
    /// The file or device.
    pub file: BackingFile,
    /// File offset of frame 0.
    pub data_offset: u64,
    /// Whether a file pool was laid out afresh, so that its frames still hold old data.
    pub formatted: bool,
}

/// Opens the persistent pool in `path`: recovers the pool the file holds, or lays out a fresh
/// one in a new or empty file (or with `format`). A file that holds something else, or a pool
/// of another size, is refused before anything in it changes.
pub(super) fn open_file(
    path: &Path,
    format: bool,
    config: &PoolConfig,
    llfree_config: Config,
) -> Result<Opened, PoolError> {
    let meta_len = LLFree::metadata_size(llfree_config.frames) as u64;
    let layout = PoolHeader::new(llfree_config.frames as u64, meta_len);
    let file = BackingFile::open(path, true)?;
    if !file.can_punch && config.scrub == Scrub::PunchHole {
        return Err(PoolError::CannotPunch(path.to_owned()));
    }
    let header_err = |source| PoolError::Header {
        path: path.to_owned(),
        source,
    };
    let mut fresh = format || !file.had_contents;
    if !fresh {
        match PoolHeader::read(file.as_file()) {
            Ok(found) if found.frames != layout.frames || found.meta_len != meta_len => {
                return Err(PoolError::SizeMismatch {
                    path: path.to_owned(),
                    found: found.frames * FRAME_SIZE as u64,
                    expected: config.size,
                });
            }
            Ok(_) => {}
            Err(HeaderError::HalfCreated) => {
                log::warn!(
                    "pool file {}: its creation never finished (the process creating it \
                     stopped); creating it again",
                    path.display()
                );
                fresh = true;
            }
            Err(e) => return Err(header_err(e)),
        }
    }
    if fresh {
        // From here until the header is written, a crash leaves a file that the next open
        // recognises as half-created and lays out again.
        PoolHeader::write_creating(file.as_file()).map_err(|e| header_err(HeaderError::Io(e)))?;
    }
    file.ensure_len(path, layout.data_offset + config.size, fresh)?;
    let region = FileRegion::map(file.as_file(), META_OFFSET, meta_len as usize)
        .map_err(PoolError::MapMetadata)?;
    let init = if fresh { Init::Fresh } else { Init::Recover };
    let llfree = LLFree::persistent(llfree_config, Box::new(region), init)?;
    if fresh {
        layout
            .write(file.as_file())
            .map_err(|e| header_err(HeaderError::Io(e)))?;
    }
    Ok(Opened {
        llfree,
        file,
        data_offset: layout.data_offset,
        formatted: fresh,
    })
}
