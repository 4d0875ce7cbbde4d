//! What the device needs from its surroundings: a memory backend that gives guest pages away
//! and takes them back, and a way to notify the guest.
//!
//! Both are small traits so that the same device logic can sit behind virtio-mmio in this VMM
//! or behind a vhost-user backend process.

use std::fmt;
use std::io;

use vm_memory::GuestAddress;

use crate::spec::{BALLOON_PAGE_SIZE, VIRTIO_BALLOON_PFN_SHIFT};

/// A range of guest physical memory. The device only hands out ranges that are non-empty,
/// 4 KiB aligned, do not wrap and that [`BalloonBackend::is_ram`] accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestRange {
    /// The first byte.
    pub addr: GuestAddress,
    /// The length in bytes.
    pub len: u64,
}

impl GuestRange {
    /// The range of `pages` 4 KiB balloon pages starting at page frame number `first_pfn`
    /// (a page frame number below 2^52; lengths saturate).
    pub fn from_pfns(first_pfn: u64, pages: u64) -> Self {
        Self {
            addr: GuestAddress(first_pfn << VIRTIO_BALLOON_PFN_SHIFT),
            len: pages.saturating_mul(BALLOON_PAGE_SIZE),
        }
    }

    /// The number of 4 KiB pages in the range.
    pub fn pages(&self) -> u64 {
        self.len / BALLOON_PAGE_SIZE
    }

    /// The first byte past the range, `None` if it wraps around the address space.
    pub fn end(&self) -> Option<u64> {
        self.addr.0.checked_add(self.len)
    }
}

impl fmt::Display for GuestRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}+{:#x}", self.addr.0, self.len)
    }
}

/// What inflating a range did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inflated {
    /// Pages newly given away; fewer than the range holds when some were given away already.
    pub new_pages: u64,
    /// Host frames that went back to the pool because their chunk is now entirely given away.
    pub freed_frames: u64,
}

/// Guest memory operations behind the balloon.
///
/// The backend keeps the record of given-away pages (e.g. per-chunk bitmaps); the device keeps
/// none of its own, so what it remembers is bounded by the guest's RAM. Every method may be
/// called with any range that passed [`BalloonBackend::is_ram`]; duplicate inflations and
/// deflations of pages that were never inflated must be harmless and show in the counts.
pub trait BalloonBackend: Send {
    /// The error of a failed operation (a host-side failure, not a guest mistake).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Whether `range` is entirely guest RAM that the backend manages: not a hole, not MMIO.
    fn is_ram(&self, range: GuestRange) -> bool;

    /// Gives the pages of `range` away (inflation). The guest promises not to touch them until
    /// it deflates them; a chunk whose pages have all been given away returns its frame to the
    /// pool.
    fn inflate(&self, range: GuestRange) -> Result<Inflated, Self::Error>;

    /// Takes the pages of `range` back (deflation): they are usable again once this returns
    /// (the backend may give them memory now, or when they are touched). Returns how many of
    /// them had been given away.
    fn deflate(&self, range: GuestRange) -> Result<u64, Self::Error>;

    /// Discards `range`, reported free by the guest: its contents are not needed, but the guest
    /// may use it again at any time without telling. Whole chunks return their frames to the
    /// pool at once. Returns how many frames were freed.
    fn discard(&self, range: GuestRange) -> Result<u64, Self::Error>;

    /// Takes every given-away page back (device reset: the driver forgot its balloon). Returns
    /// how many pages had been given away.
    fn deflate_all(&self) -> Result<u64, Self::Error>;
}

/// Interrupts towards the guest.
pub trait GuestNotifier: Send + Sync {
    /// Tells the driver that queue `index` has new used buffers.
    fn queue_used(&self, index: u16) -> io::Result<()>;

    /// Tells the driver that the configuration space changed (a new target).
    fn config_changed(&self) -> io::Result<()>;

    /// Tells the driver that the device stopped and needs a reset (virtio 1.2 §2.1.2: the
    /// transport sets DEVICE_NEEDS_RESET and sends a configuration change notification).
    fn needs_reset(&self) -> io::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_from_pfns() {
        let range = GuestRange::from_pfns(0x100, 3);
        assert_eq!(range.addr, GuestAddress(0x10_0000));
        assert_eq!(range.len, 0x3000);
        assert_eq!(range.pages(), 3);
        assert_eq!(range.end(), Some(0x10_3000));
        assert_eq!(range.to_string(), "0x100000+0x3000");
        let wrapping = GuestRange {
            addr: GuestAddress(u64::MAX - 0xfff),
            len: 0x2000,
        };
        assert_eq!(wrapping.end(), None);
    }
}
