//! The memory file of a snapshot that copied guest memory: the RAM regions one after the other
//! (chunks the guest never touched are holes), then a trailer that ties the file to its
//! snapshot, which keeps the same identity and a CRC32 of the memory:
//!
//! ```text
//! offset (from the trailer)  size  field
//!                         0     8  magic "LLFVMEMT"
//!                         8     8  the snapshot's memory identity, little endian
//!                        16     8  bytes of memory before the trailer, little endian
//!                        24  4072  zero
//! ```
//!
//! A memory file of another snapshot (or a damaged one) is refused by its identity (or its
//! checksum) instead of loading a guest that runs on garbage.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The trailer's first bytes.
pub const TRAILER_MAGIC: [u8; 8] = *b"LLFVMEMT";
/// Bytes of the trailer (a page, so that the memory before it stays page-aligned).
pub const TRAILER_LEN: u64 = 4096;

/// Writes the trailer after `memory_len` bytes of memory in `file`.
pub fn write_trailer(file: &File, memory_len: u64, identity: u64) -> io::Result<()> {
    let mut trailer = vec![0u8; TRAILER_LEN as usize];
    trailer[..8].copy_from_slice(&TRAILER_MAGIC);
    trailer[8..16].copy_from_slice(&identity.to_le_bytes());
    trailer[16..24].copy_from_slice(&memory_len.to_le_bytes());
    file.write_all_at(&trailer, memory_len)
}

/// What a memory file's trailer says, if it has one after `memory_len` bytes: the identity.
pub fn read_identity(file: &File, memory_len: u64) -> io::Result<Option<u64>> {
    let mut trailer = [0u8; 24];
    file.read_exact_at(&mut trailer, memory_len)?;
    let word = |at: usize| u64::from_le_bytes(trailer[at..at + 8].try_into().expect("8 bytes"));
    Ok((trailer[..8] == TRAILER_MAGIC && word(16) == memory_len).then(|| word(8)))
}

/// A CRC32 of guest memory in file order, where whole chunks of zeros (holes) are added without
/// reading them.
#[derive(Debug, Default)]
pub struct MemoryChecksum {
    hasher: crc32fast::Hasher,
    /// The CRC of one chunk of zeros, by chunk size.
    zero_chunk: Option<(usize, crc32fast::Hasher)>,
}

impl MemoryChecksum {
    /// Adds `bytes`.
    pub fn add(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// Adds a chunk of `len` zeros.
    pub fn add_zero_chunk(&mut self, len: usize) {
        if self
            .zero_chunk
            .as_ref()
            .is_none_or(|(size, _)| *size != len)
        {
            let mut zeros = crc32fast::Hasher::new();
            zeros.update(&vec![0u8; len]);
            self.zero_chunk = Some((len, zeros));
        }
        let (_, zeros) = self.zero_chunk.as_ref().expect("set above");
        self.hasher.combine(zeros);
    }

    /// The checksum of what was added.
    pub fn value(&self) -> u32 {
        self.hasher.clone().finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_chunks_count_as_their_bytes() {
        let data = [7u8; 100];
        let mut direct = MemoryChecksum::default();
        direct.add(&data);
        direct.add(&[0u8; 4096]);
        direct.add(&data);
        let mut holes = MemoryChecksum::default();
        holes.add(&data);
        holes.add_zero_chunk(4096);
        holes.add(&data);
        assert_eq!(direct.value(), holes.value());
        assert_ne!(direct.value(), MemoryChecksum::default().value());
    }

    #[test]
    fn the_trailer_names_its_snapshot_and_a_foreign_file_has_none() {
        let path = std::env::temp_dir().join(format!("memory-file-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(8192).unwrap();
        assert_eq!(read_identity(&file, 8192).ok().flatten(), None);
        write_trailer(&file, 8192, 0x5eed).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 8192 + TRAILER_LEN);
        assert_eq!(read_identity(&file, 8192).unwrap(), Some(0x5eed));
        assert_eq!(read_identity(&file, 4096).unwrap(), None, "another size");
        std::fs::remove_file(&path).unwrap();
    }
}
