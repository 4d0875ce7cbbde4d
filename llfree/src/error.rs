//! Errors of allocation and initialisation.

use thiserror::Error;

/// An allocation or free failed.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// No free frame of the requested order is left.
    #[error("out of memory: no free frame of order {order}")]
    Memory {
        /// The requested order.
        order: usize,
    },
    /// The order is not one of 0..=10 or 18.
    #[error("order {0} is not supported (supported: 0..=10 and 18)")]
    InvalidOrder(usize),
    /// The frame lies outside the zone.
    #[error("frame {frame} (order {order}) is outside the zone of {frames} frames")]
    OutOfRange {
        /// The first frame of the request.
        frame: usize,
        /// The order of the request.
        order: usize,
        /// Frames in the zone.
        frames: usize,
    },
    /// The frame is not aligned to its order.
    #[error("frame {frame} is not aligned to order {order}")]
    Misaligned {
        /// The frame.
        frame: usize,
        /// The order.
        order: usize,
    },
    /// The frame is not allocated (double free).
    #[error("frame {frame} (order {order}) is not allocated (double free?)")]
    NotAllocated {
        /// The frame.
        frame: usize,
        /// The order.
        order: usize,
    },
    /// A specific frame was asked for ([`crate::LLFree::get_at`]) but is not entirely free, or
    /// its tree is reserved by a core.
    #[error("frame {frame} (order {order}) is not free")]
    NotFree {
        /// The frame.
        frame: usize,
        /// The order.
        order: usize,
    },
    /// The frame is allocated, but with another order.
    #[error("frame {frame} was not allocated with order {order}")]
    WrongOrder {
        /// The frame.
        frame: usize,
        /// The order given to `put`.
        order: usize,
    },
}

/// Creating or recovering an allocator failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum InitError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// The persistent region is too small for the metadata.
    #[error("persistent region too small: need {need} bytes, have {have}")]
    RegionTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        have: usize,
    },
    /// The persistent region is not 64-byte aligned.
    #[error("persistent region is not aligned to a cache line (64 bytes)")]
    RegionMisaligned,
    /// The region holds no LLFree metadata.
    #[error("no LLFree metadata in region (bad magic {found:#x})")]
    BadMagic {
        /// The magic number found.
        found: u64,
    },
    /// The metadata was written by another layout version.
    #[error("metadata layout version {found} is not supported (expected {expected})")]
    Version {
        /// Version found.
        found: u32,
        /// Version supported.
        expected: u32,
    },
    /// The metadata describes a zone of another size.
    #[error("metadata describes {found} frames, but {expected} were requested")]
    Size {
        /// Frames recorded in the metadata.
        found: u64,
        /// Frames requested.
        expected: u64,
    },
    /// An entry of the metadata is corrupted.
    #[error("corrupted metadata: {what} at index {index}")]
    Corrupted {
        /// What is wrong.
        what: &'static str,
        /// The child or tree index.
        index: usize,
    },
}
