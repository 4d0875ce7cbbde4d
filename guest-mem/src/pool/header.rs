//! The header at the start of a persistent pool file: where the allocator metadata and the frames
//! lie. The allocator's own metadata follows at [`META_OFFSET`]; frames start at `data_offset`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use thiserror::Error;

/// File offset of the allocator metadata (the header takes the first 4 KiB).
pub const META_OFFSET: u64 = 4096;
/// Frames start at a multiple of this, so DAX can map them with huge pages.
const DATA_ALIGN: u64 = 2 << 20;
const MAGIC: u64 = u64::from_le_bytes(*b"LLFVMPL1");
/// The magic of a pool being laid out: written (and synced) before anything else of a new
/// layout, replaced by [`MAGIC`] once the layout is complete. A file that still has it was left
/// half-created (the process died meanwhile) and holds nothing to keep.
const CREATING_MAGIC: u64 = u64::from_le_bytes(*b"LLFVMPL~");
const VERSION: u32 = 1;
const ENCODED_LEN: usize = 40;

/// Errors of reading a pool header.
#[derive(Debug, Error)]
pub enum HeaderError {
    /// The file holds something else than a pool.
    #[error(
        "holds no llfree-vmm pool (magic {found:#018x}); formatting it (vmm run --format-pool) \
         overwrites it with an empty pool"
    )]
    BadMagic {
        /// The magic number found.
        found: u64,
    },
    /// The file holds a pool whose creation never finished.
    #[error("holds a pool whose creation never finished")]
    HalfCreated,
    /// The header has another layout version.
    #[error("pool header version {found} is not supported (expected {VERSION})")]
    Version {
        /// The version found.
        found: u32,
    },
    /// Reading or writing the header failed.
    #[error("cannot access the pool header: {0}")]
    Io(#[from] io::Error),
}

/// Where the parts of a persistent pool lie in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolHeader {
    /// 4 KiB frames in the pool.
    pub frames: u64,
    /// Bytes of allocator metadata at [`META_OFFSET`].
    pub meta_len: u64,
    /// File offset of frame 0.
    pub data_offset: u64,
}

impl PoolHeader {
    /// The layout for `frames` frames with `meta_len` bytes of allocator metadata.
    pub fn new(frames: u64, meta_len: u64) -> Self {
        Self {
            frames,
            meta_len,
            data_offset: (META_OFFSET + meta_len).next_multiple_of(DATA_ALIGN),
        }
    }

    /// Writes the header and flushes it to the device.
    pub fn write(&self, file: &File) -> io::Result<()> {
        let mut buf = [0u8; ENCODED_LEN];
        buf[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        buf[8..12].copy_from_slice(&VERSION.to_le_bytes());
        buf[16..24].copy_from_slice(&self.frames.to_le_bytes());
        buf[24..32].copy_from_slice(&self.meta_len.to_le_bytes());
        buf[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        file.write_all_at(&buf, 0)?;
        file.sync_data()
    }

    /// Marks the file as holding a pool being laid out (see [`CREATING_MAGIC`]) and flushes
    /// the mark to the device, before anything else of the layout is written.
    pub fn write_creating(file: &File) -> io::Result<()> {
        let mut buf = [0u8; ENCODED_LEN];
        buf[0..8].copy_from_slice(&CREATING_MAGIC.to_le_bytes());
        file.write_all_at(&buf, 0)?;
        file.sync_data()
    }

    /// Reads the header of an existing pool.
    pub fn read(file: &File) -> Result<Self, HeaderError> {
        // A short file reads as zeroes past its end, and so has no magic.
        let mut buf = [0u8; ENCODED_LEN];
        file.read_at(&mut buf, 0)?;
        let word = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
        match word(0) {
            MAGIC => {}
            CREATING_MAGIC => return Err(HeaderError::HalfCreated),
            found => return Err(HeaderError::BadMagic { found }),
        }
        let version = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(HeaderError::Version { found: version });
        }
        Ok(Self {
            frames: word(16),
            meta_len: word(24),
            data_offset: word(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_foreign_files() {
        let path = std::env::temp_dir().join(format!("guest-mem-header-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("create");
        file.write_all_at(b"not a pool, just some user data......", 0)
            .expect("write");
        assert!(matches!(
            PoolHeader::read(&file),
            Err(HeaderError::BadMagic { .. })
        ));
        let header = PoolHeader::new(1 << 18, 12345);
        assert_eq!(header.data_offset, 2 << 20);
        header.write(&file).expect("write header");
        assert_eq!(PoolHeader::read(&file).expect("read"), header);
        std::fs::remove_file(&path).expect("remove");
    }
}
