//! The saved state of a virtio-mmio device, for snapshots: the transport's registers, its
//! queues (with the device's positions in them), the interrupt, and the device's own state.

use serde::{Deserialize, Serialize};
use virtio_queue::QueueState;

/// A queue as the transport or the device holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    /// The maximum size the device offers.
    pub max_size: u16,
    /// Next entry of the available ring to look at.
    pub next_avail: u16,
    /// Next entry of the used ring to fill.
    pub next_used: u16,
    /// VIRTIO_RING_F_EVENT_IDX was negotiated.
    pub event_idx_enabled: bool,
    /// The size the driver chose.
    pub size: u16,
    /// The driver made the queue ready.
    pub ready: bool,
    /// Guest physical address of the descriptor table.
    pub desc_table: u64,
    /// Guest physical address of the available ring.
    pub avail_ring: u64,
    /// Guest physical address of the used ring.
    pub used_ring: u64,
}

impl From<QueueState> for QueueSnapshot {
    fn from(state: QueueState) -> Self {
        QueueSnapshot {
            max_size: state.max_size,
            next_avail: state.next_avail,
            next_used: state.next_used,
            event_idx_enabled: state.event_idx_enabled,
            size: state.size,
            ready: state.ready,
            desc_table: state.desc_table,
            avail_ring: state.avail_ring,
            used_ring: state.used_ring,
        }
    }
}

impl From<QueueSnapshot> for QueueState {
    fn from(snapshot: QueueSnapshot) -> Self {
        QueueState {
            max_size: snapshot.max_size,
            next_avail: snapshot.next_avail,
            next_used: snapshot.next_used,
            event_idx_enabled: snapshot.event_idx_enabled,
            size: snapshot.size,
            ready: snapshot.ready,
            desc_table: snapshot.desc_table,
            avail_ring: snapshot.avail_ring,
            used_ring: snapshot.used_ring,
        }
    }
}

/// A device's own state beyond its queues.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceState {
    /// A device whose queues are all it has.
    Plain,
    /// The virtio-balloon.
    Balloon(Box<virtio_balloon::BalloonState>),
    /// The virtio-net device.
    Net {
        /// A frame the guest's receive buffer (this head) holds, which waits for the rate
        /// limiter: its head and length.
        deferred_rx: Option<(u16, u32)>,
    },
    /// The virtio-vsock device: its connections are not kept (the guest hears of a transport
    /// reset after the restore).
    Vsock,
    /// The virtio-pmem device.
    Pmem {
        /// Flush requests answered so far.
        flushes: u64,
    },
    /// The virtio-mem device (its plugged blocks are the machine's, see
    /// `snapshot::SavedHotplug`).
    Mem {
        /// Bytes the host asked the guest to have plugged.
        requested_size: u64,
    },
}

/// The interrupt's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptSnapshot {
    /// Pending status bits.
    pub status: u32,
    /// The configuration generation.
    pub config_generation: u32,
    /// The device waits for a reset.
    pub needs_reset: bool,
}

/// A virtio-mmio device: transport registers, queues, interrupt and device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioSnapshot {
    /// The virtio device ID, checked on restoration.
    pub device_type: u32,
    /// The status register (the driver's bits).
    pub device_status: u32,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// The features the driver wrote.
    pub driver_features: u64,
    /// QueueSel.
    pub queue_sel: u32,
    /// The queues; an active device's with its own positions.
    pub queues: Vec<QueueSnapshot>,
    /// DRIVER_OK was accepted and the device runs.
    pub activated: bool,
    /// The interrupt.
    pub interrupt: InterruptSnapshot,
    /// The device's own state.
    pub device: DeviceState,
}
