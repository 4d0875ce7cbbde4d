//! Definitions from the virtio 1.2 specification, §5.5 "Memory Balloon Device".
//!
//! The device ID and VIRTIO_F_VERSION_1 come from virtio-bindings; it has no balloon header, so
//! the rest is written down here from the spec (and, for the statistics tags 10 to 15, from
//! Linux's `include/uapi/linux/virtio_balloon.h`, which later spec versions adopted).

pub use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
pub use virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;

/// The largest split virtqueue (virtio 1.2 §2.7).
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Feature bit: the driver must tell the host before using pages from the balloon (deflate).
pub const VIRTIO_BALLOON_F_MUST_TELL_HOST: u32 = 0;
/// Feature bit: a virtqueue for reporting guest memory statistics is present.
pub const VIRTIO_BALLOON_F_STATS_VQ: u32 = 1;
/// Feature bit: the driver may deflate the balloon when the guest runs out of memory.
pub const VIRTIO_BALLOON_F_DEFLATE_ON_OOM: u32 = 2;
/// Feature bit: the device supports free page hinting (offered with `free_page_hinting`).
pub const VIRTIO_BALLOON_F_FREE_PAGE_HINT: u32 = 3;
/// Feature bit: the driver poisons free pages with `poison_val` (not offered by this device).
pub const VIRTIO_BALLOON_F_PAGE_POISON: u32 = 4;
/// Feature bit: the driver reports free pages through the reporting virtqueue.
pub const VIRTIO_BALLOON_F_PAGE_REPORTING: u32 = 5;

/// Balloon page frame numbers are in units of `1 << VIRTIO_BALLOON_PFN_SHIFT` bytes.
pub const VIRTIO_BALLOON_PFN_SHIFT: u32 = 12;
/// Size of a balloon page in bytes (4 KiB, whatever the guest's own page size).
pub const BALLOON_PAGE_SIZE: u64 = 1 << VIRTIO_BALLOON_PFN_SHIFT;
/// Size of one page frame number in an inflate or deflate buffer (a `le32`).
pub const PFN_SIZE: usize = 4;

/// Offset of `le32 num_pages` in the configuration space: the target, written by the device.
pub const CONFIG_NUM_PAGES: u64 = 0;
/// Offset of `le32 actual`: the balloon's size, written by the driver.
pub const CONFIG_ACTUAL: u64 = 4;
/// Offset of `le32 free_page_hint_cmd_id` (only meaningful with FREE_PAGE_HINT).
pub const CONFIG_FREE_PAGE_HINT_CMD_ID: u64 = 8;
/// Offset of `le32 poison_val` (only meaningful with PAGE_POISON).
pub const CONFIG_POISON_VAL: u64 = 12;
/// `free_page_hint_cmd_id`: no hinting run (the driver stops one that goes on).
pub const FREE_PAGE_HINT_STOP: u32 = 0;
/// `free_page_hint_cmd_id`: the run is over, the driver may use the hinted pages again.
pub const FREE_PAGE_HINT_DONE: u32 = 1;

/// Size of the configuration space in bytes.
pub const CONFIG_SIZE: usize = 16;

/// Size of one statistics entry: `le16 tag` followed by `le64 val`, packed.
pub const STAT_ENTRY_SIZE: usize = 10;

/// Statistics tags (virtio 1.2 §5.5.6.3; tags 10 to 15 are Linux extensions).
pub mod stat_tag {
    /// Memory swapped in (bytes).
    pub const SWAP_IN: u16 = 0;
    /// Memory swapped out (bytes).
    pub const SWAP_OUT: u16 = 1;
    /// Major page faults.
    pub const MAJFLT: u16 = 2;
    /// Minor page faults.
    pub const MINFLT: u16 = 3;
    /// Unused memory (bytes).
    pub const MEMFREE: u16 = 4;
    /// Total memory available to the guest (bytes).
    pub const MEMTOT: u16 = 5;
    /// Memory available for new applications without swapping (bytes).
    pub const AVAIL: u16 = 6;
    /// Disk caches (bytes).
    pub const CACHES: u16 = 7;
    /// Successful huge page allocations.
    pub const HTLB_PGALLOC: u16 = 8;
    /// Failed huge page allocations.
    pub const HTLB_PGFAIL: u16 = 9;
    /// OOM killer invocations (Linux extension).
    pub const OOM_KILL: u16 = 10;
    /// Allocation stalls (Linux extension).
    pub const ALLOC_STALL: u16 = 11;
    /// Memory scanned asynchronously, bytes (Linux extension).
    pub const ASYNC_SCAN: u16 = 12;
    /// Memory scanned directly, bytes (Linux extension).
    pub const DIRECT_SCAN: u16 = 13;
    /// Memory reclaimed asynchronously, bytes (Linux extension).
    pub const ASYNC_RECLAIM: u16 = 14;
    /// Memory reclaimed directly, bytes (Linux extension).
    pub const DIRECT_RECLAIM: u16 = 15;
    /// The highest tag of the spec.
    pub const MAX: u16 = DIRECT_RECLAIM;
}
