//! Definitions from the virtio 1.2 specification, §5.15 "Memory Device" (virtio-bindings has
//! the device id but no virtio-mem header).

pub use virtio_bindings::virtio_ids::VIRTIO_ID_MEM;

/// Feature bit: the device describes the region's NUMA node (`node_id`) by ACPI PXM.
pub const VIRTIO_MEM_F_ACPI_PXM: u32 = 0;
/// Feature bit: the driver does not touch unplugged memory, which the device may make
/// inaccessible (Linux 5.16 and later on x86-64).
pub const VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE: u32 = 1;
/// Feature bit: plugged memory keeps its contents across a suspend.
pub const VIRTIO_MEM_F_PERSISTENT_SUSPEND: u32 = 2;

/// Request: plug `nb_blocks` blocks from `addr`.
pub const VIRTIO_MEM_REQ_PLUG: u16 = 0;
/// Request: unplug `nb_blocks` blocks from `addr`.
pub const VIRTIO_MEM_REQ_UNPLUG: u16 = 1;
/// Request: unplug every block.
pub const VIRTIO_MEM_REQ_UNPLUG_ALL: u16 = 2;
/// Request: the state of `nb_blocks` blocks from `addr`.
pub const VIRTIO_MEM_REQ_STATE: u16 = 3;

/// Response: done.
pub const VIRTIO_MEM_RESP_ACK: u16 = 0;
/// Response: refused for now (e.g. a plug beyond the requested size); the driver may retry.
pub const VIRTIO_MEM_RESP_NACK: u16 = 1;
/// Response: the device is busy; the driver may retry.
pub const VIRTIO_MEM_RESP_BUSY: u16 = 2;
/// Response: the request is invalid.
pub const VIRTIO_MEM_RESP_ERROR: u16 = 3;

/// State response: every block of the range is plugged.
pub const VIRTIO_MEM_STATE_PLUGGED: u16 = 0;
/// State response: every block of the range is unplugged.
pub const VIRTIO_MEM_STATE_UNPLUGGED: u16 = 1;
/// State response: some blocks are plugged, some not.
pub const VIRTIO_MEM_STATE_MIXED: u16 = 2;

/// Bytes of a request: `le16 type; le16 padding[3]; le64 addr; le16 nb_blocks; le16
/// padding[3]`.
pub const REQUEST_SIZE: usize = 24;
/// Bytes of a response: `le16 type; le16 padding[3]; le16 state`.
pub const RESPONSE_SIZE: usize = 10;

/// Configuration space offsets (all little endian).
pub mod config {
    /// `le64 block_size`.
    pub const BLOCK_SIZE: u64 = 0;
    /// `le16 node_id` (with ACPI_PXM).
    pub const NODE_ID: u64 = 8;
    /// `le64 addr`: the region's guest physical address.
    pub const ADDR: u64 = 16;
    /// `le64 region_size`.
    pub const REGION_SIZE: u64 = 24;
    /// `le64 usable_region_size`: the part of the region the driver may plug.
    pub const USABLE_REGION_SIZE: u64 = 32;
    /// `le64 plugged_size`.
    pub const PLUGGED_SIZE: u64 = 40;
    /// `le64 requested_size`.
    pub const REQUESTED_SIZE: u64 = 48;
    /// Bytes of the configuration space.
    pub const SIZE: usize = 56;
}
