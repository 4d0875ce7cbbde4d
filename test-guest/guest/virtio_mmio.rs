//! The virtio-mmio registers the balloon driver uses (virtio 1.2 §4.2.2), written down from the
//! spec on the driver's side: the VMM's transport takes its own from virtio-bindings, so a wrong
//! offset on either side shows in the tests instead of being shared.

/// MagicValue (R).
pub const MAGIC_VALUE: u64 = 0x000;
/// "virt" in little endian.
pub const MAGIC: u32 = 0x7472_6976;
/// Version (R).
pub const VERSION: u64 = 0x004;
/// The modern (non-legacy) interface.
pub const MODERN_VERSION: u32 = 2;
/// DeviceID (R).
pub const DEVICE_ID: u64 = 0x008;
/// DeviceFeatures (R).
pub const DEVICE_FEATURES: u64 = 0x010;
/// DeviceFeaturesSel (W).
pub const DEVICE_FEATURES_SEL: u64 = 0x014;
/// DriverFeatures (W).
pub const DRIVER_FEATURES: u64 = 0x020;
/// DriverFeaturesSel (W).
pub const DRIVER_FEATURES_SEL: u64 = 0x024;
/// QueueSel (W).
pub const QUEUE_SEL: u64 = 0x030;
/// QueueNumMax (R).
pub const QUEUE_NUM_MAX: u64 = 0x034;
/// QueueNum (W).
pub const QUEUE_NUM: u64 = 0x038;
/// QueueReady (RW).
pub const QUEUE_READY: u64 = 0x044;
/// QueueNotify (W).
pub const QUEUE_NOTIFY: u64 = 0x050;
/// Status (RW).
pub const STATUS: u64 = 0x070;
/// QueueDescLow (W); High follows.
pub const QUEUE_DESC_LOW: u64 = 0x080;
/// QueueDriverLow (W): the available ring; High follows.
pub const QUEUE_AVAIL_LOW: u64 = 0x090;
/// QueueDeviceLow (W): the used ring; High follows.
pub const QUEUE_USED_LOW: u64 = 0x0a0;
/// Start of the device-specific configuration space.
pub const CONFIG: u64 = 0x100;
