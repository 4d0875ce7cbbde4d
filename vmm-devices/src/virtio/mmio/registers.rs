//! Register offsets (from virtio-bindings, as `u64` for the MMIO bus) and fixed values of the
//! virtio-mmio interface (virtio 1.2 §4.2.2).

use virtio_bindings::virtio_mmio as mmio;

/// "virt" in little endian.
pub const MAGIC: u32 = 0x7472_6976;
/// The modern (non-legacy) interface.
pub const MODERN_VERSION: u32 = 2;
/// Our vendor ID: none in particular, as in Firecracker and Cloud Hypervisor.
pub const VENDOR: u32 = 0;
/// Shared memory length/base reported for a region that does not exist.
pub const SHM_NOT_PRESENT: u32 = 0xffff_ffff;

/// MagicValue (R).
pub const MAGIC_VALUE: u64 = mmio::VIRTIO_MMIO_MAGIC_VALUE as u64;
/// Version (R).
pub const VERSION: u64 = mmio::VIRTIO_MMIO_VERSION as u64;
/// DeviceID (R).
pub const DEVICE_ID: u64 = mmio::VIRTIO_MMIO_DEVICE_ID as u64;
/// VendorID (R).
pub const VENDOR_ID: u64 = mmio::VIRTIO_MMIO_VENDOR_ID as u64;
/// DeviceFeatures (R).
pub const DEVICE_FEATURES: u64 = mmio::VIRTIO_MMIO_DEVICE_FEATURES as u64;
/// DeviceFeaturesSel (W).
pub const DEVICE_FEATURES_SEL: u64 = mmio::VIRTIO_MMIO_DEVICE_FEATURES_SEL as u64;
/// DriverFeatures (W).
pub const DRIVER_FEATURES: u64 = mmio::VIRTIO_MMIO_DRIVER_FEATURES as u64;
/// DriverFeaturesSel (W).
pub const DRIVER_FEATURES_SEL: u64 = mmio::VIRTIO_MMIO_DRIVER_FEATURES_SEL as u64;
/// QueueSel (W).
pub const QUEUE_SEL: u64 = mmio::VIRTIO_MMIO_QUEUE_SEL as u64;
/// QueueNumMax (R).
pub const QUEUE_NUM_MAX: u64 = mmio::VIRTIO_MMIO_QUEUE_NUM_MAX as u64;
/// QueueNum (W).
pub const QUEUE_NUM: u64 = mmio::VIRTIO_MMIO_QUEUE_NUM as u64;
/// QueueReady (RW).
pub const QUEUE_READY: u64 = mmio::VIRTIO_MMIO_QUEUE_READY as u64;
/// QueueNotify (W).
pub const QUEUE_NOTIFY: u64 = mmio::VIRTIO_MMIO_QUEUE_NOTIFY as u64;
/// InterruptStatus (R).
pub const INTERRUPT_STATUS: u64 = mmio::VIRTIO_MMIO_INTERRUPT_STATUS as u64;
/// InterruptACK (W).
pub const INTERRUPT_ACK: u64 = mmio::VIRTIO_MMIO_INTERRUPT_ACK as u64;
/// Status (RW).
pub const STATUS: u64 = mmio::VIRTIO_MMIO_STATUS as u64;
/// QueueDescLow (W).
pub const QUEUE_DESC_LOW: u64 = mmio::VIRTIO_MMIO_QUEUE_DESC_LOW as u64;
/// QueueDescHigh (W).
pub const QUEUE_DESC_HIGH: u64 = mmio::VIRTIO_MMIO_QUEUE_DESC_HIGH as u64;
/// QueueDriverLow (W): the available ring.
pub const QUEUE_AVAIL_LOW: u64 = mmio::VIRTIO_MMIO_QUEUE_AVAIL_LOW as u64;
/// QueueDriverHigh (W).
pub const QUEUE_AVAIL_HIGH: u64 = mmio::VIRTIO_MMIO_QUEUE_AVAIL_HIGH as u64;
/// QueueDeviceLow (W): the used ring.
pub const QUEUE_USED_LOW: u64 = mmio::VIRTIO_MMIO_QUEUE_USED_LOW as u64;
/// QueueDeviceHigh (W).
pub const QUEUE_USED_HIGH: u64 = mmio::VIRTIO_MMIO_QUEUE_USED_HIGH as u64;
/// SHMSel (W).
pub const SHM_SEL: u64 = mmio::VIRTIO_MMIO_SHM_SEL as u64;
/// SHMLenLow (R).
pub const SHM_LEN_LOW: u64 = mmio::VIRTIO_MMIO_SHM_LEN_LOW as u64;
/// SHMLenHigh (R).
pub const SHM_LEN_HIGH: u64 = mmio::VIRTIO_MMIO_SHM_LEN_HIGH as u64;
/// SHMBaseLow (R).
pub const SHM_BASE_LOW: u64 = mmio::VIRTIO_MMIO_SHM_BASE_LOW as u64;
/// SHMBaseHigh (R).
pub const SHM_BASE_HIGH: u64 = mmio::VIRTIO_MMIO_SHM_BASE_HIGH as u64;
/// ConfigGeneration (R).
pub const CONFIG_GENERATION: u64 = mmio::VIRTIO_MMIO_CONFIG_GENERATION as u64;
/// Start of the device-specific configuration space.
pub const CONFIG: u64 = mmio::VIRTIO_MMIO_CONFIG as u64;
