//! Register offsets and fixed values of the virtio-mmio interface (virtio 1.2 §4.2.2).
//!
//! The `no_std` test guest's balloon driver includes this file too (`#[path]` in guest/main.rs),
//! so it holds plain constants only.

/// "virt" in little endian.
pub const MAGIC: u32 = 0x7472_6976;
/// The modern (non-legacy) interface.
pub const MODERN_VERSION: u32 = 2;
/// Our vendor ID: none in particular, as in Firecracker and Cloud Hypervisor.
pub const VENDOR: u32 = 0;
/// Shared memory length/base reported for a region that does not exist.
pub const SHM_NOT_PRESENT: u32 = 0xffff_ffff;

/// MagicValue (R).
pub const MAGIC_VALUE: u64 = 0x000;
/// Version (R).
pub const VERSION: u64 = 0x004;
/// DeviceID (R).
pub const DEVICE_ID: u64 = 0x008;
/// VendorID (R).
pub const VENDOR_ID: u64 = 0x00c;
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
/// InterruptStatus (R).
pub const INTERRUPT_STATUS: u64 = 0x060;
/// InterruptACK (W).
pub const INTERRUPT_ACK: u64 = 0x064;
/// Status (RW).
pub const STATUS: u64 = 0x070;
/// QueueDescLow (W).
pub const QUEUE_DESC_LOW: u64 = 0x080;
/// QueueDescHigh (W).
pub const QUEUE_DESC_HIGH: u64 = 0x084;
/// QueueDriverLow (W): the available ring.
pub const QUEUE_AVAIL_LOW: u64 = 0x090;
/// QueueDriverHigh (W).
pub const QUEUE_AVAIL_HIGH: u64 = 0x094;
/// QueueDeviceLow (W): the used ring.
pub const QUEUE_USED_LOW: u64 = 0x0a0;
/// QueueDeviceHigh (W).
pub const QUEUE_USED_HIGH: u64 = 0x0a4;
/// SHMSel (W).
pub const SHM_SEL: u64 = 0x0ac;
/// SHMLenLow (R).
pub const SHM_LEN_LOW: u64 = 0x0b0;
/// SHMLenHigh (R).
pub const SHM_LEN_HIGH: u64 = 0x0b4;
/// SHMBaseLow (R).
pub const SHM_BASE_LOW: u64 = 0x0b8;
/// SHMBaseHigh (R).
pub const SHM_BASE_HIGH: u64 = 0x0bc;
/// ConfigGeneration (R).
pub const CONFIG_GENERATION: u64 = 0x0fc;
/// Start of the device-specific configuration space.
pub const CONFIG: u64 = 0x100;
