//! Hot-pluggable memory (a virtio-mem device): Firecracker's `PUT /hotplug/memory` and
//! `memory-hotplug` configuration, `vmm run --hotplug`, and their checks.

use guest_mem::FrameSize;
use serde::{Deserialize, Serialize};

use crate::size::{format_size, parse_size};

/// The largest hot-pluggable memory: 1 TiB, as guest RAM.
pub const MAX_HOTPLUG_SIZE: u64 = 1 << 40;

/// Errors of the hot-pluggable memory's configuration.
#[derive(Debug, thiserror::Error)]
pub enum HotplugConfigError {
    /// The hot-pluggable memory's settings are invalid.
    #[error("hotplug: {0}")]
    Invalid(String),
}

const MIB: u64 = 1 << 20;
/// Firecracker's default block size: 2 MiB.
pub const DEFAULT_BLOCK_SIZE: u64 = 2 * MIB;
/// Firecracker's default slot size: 128 MiB.
pub const DEFAULT_SLOT_SIZE: u64 = 128 * MIB;
/// Firecracker's smallest slot size.
pub const MIN_SLOT_SIZE: u64 = 128 * MIB;

/// The keys `--hotplug` takes, for messages.
const KEYS: &str = "total, block, slot";

/// The virtio-mem device's memory: how much may be plugged, in blocks of what size. Every
/// block is protected on its own when unplugged (inaccessible, no frame); `slot_size` is
/// Firecracker's granularity of protection, checked and shown as there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotplugConfig {
    /// Bytes that may be plugged: the size of the device's region.
    pub total_size: u64,
    /// Bytes of a block, the unit the guest plugs and unplugs.
    pub block_size: u64,
    /// Bytes of a slot (Firecracker's KVM memory slots).
    pub slot_size: u64,
}

impl HotplugConfig {
    /// `total=SIZE[,block=SIZE][,slot=SIZE]` (`vmm run --hotplug`); checked with
    /// [`Self::check`].
    pub fn parse(text: &str, frame: FrameSize) -> Result<Self, HotplugConfigError> {
        let bad = |why: String| HotplugConfigError::Invalid(why);
        let mut config = HotplugConfig {
            total_size: 0,
            block_size: DEFAULT_BLOCK_SIZE.max(frame.bytes()),
            slot_size: DEFAULT_SLOT_SIZE.max(frame.bytes()),
        };
        let mut total = None;
        for item in text.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("'{item}' is not key=value (keys: {KEYS})")))?;
            let size = parse_size(value).map_err(|e| bad(format!("{key}={value}: {e}")))?;
            match key {
                "total" => total = Some(size),
                "block" => config.block_size = size,
                "slot" => config.slot_size = size,
                _ => return Err(bad(format!("unknown key '{key}' (keys: {KEYS})"))),
            }
        }
        config.total_size = total.ok_or_else(|| bad("total=SIZE is missing".into()))?;
        config.check(frame)?;
        Ok(config)
    }

    /// Checks the sizes as Firecracker does (a block of at least 2 MiB and a power of two; a
    /// slot of at least 128 MiB, whole blocks; the total whole slots, not 0), and that a block
    /// is whole frames of the backing (`frame`).
    pub fn check(&self, frame: FrameSize) -> Result<(), HotplugConfigError> {
        let bad = |why: String| Err(HotplugConfigError::Invalid(why));
        let (total, block, slot) = (self.total_size, self.block_size, self.slot_size);
        if !block.is_power_of_two() || block < DEFAULT_BLOCK_SIZE {
            return bad(format!(
                "block size {}: must be a power of two of at least 2 MiB",
                format_size(block)
            ));
        }
        if !block.is_multiple_of(frame.bytes()) {
            return bad(format!(
                "block size {}: must be a multiple of the backing's {} frames",
                format_size(block),
                frame.name()
            ));
        }
        if slot < MIN_SLOT_SIZE || !slot.is_multiple_of(block) {
            return bad(format!(
                "slot size {}: must be at least 128 MiB and a multiple of the block size",
                format_size(slot)
            ));
        }
        if total == 0 || !total.is_multiple_of(slot) || total > MAX_HOTPLUG_SIZE {
            return bad(format!(
                "total size {}: must be a multiple of the slot size ({}) up to 1 TiB",
                format_size(total),
                format_size(slot)
            ));
        }
        Ok(())
    }

    /// A requested size (`PATCH /hotplug/memory`, `vmm hotplug set`): whole blocks, at most
    /// the total.
    pub fn check_requested(&self, requested: u64) -> Result<(), HotplugConfigError> {
        if requested > self.total_size || !requested.is_multiple_of(self.block_size) {
            return Err(HotplugConfigError::Invalid(format!(
                "requested size {}: must be a multiple of the block size ({}) up to the total \
                 ({})",
                format_size(requested),
                format_size(self.block_size),
                format_size(self.total_size)
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_takes_firecrackers_defaults_and_checks() {
        let config = HotplugConfig::parse("total=1G", FrameSize::Huge).unwrap();
        assert_eq!(
            config,
            HotplugConfig {
                total_size: 1 << 30,
                block_size: 2 * MIB,
                slot_size: 128 * MIB
            }
        );
        let config = HotplugConfig::parse("total=512M,block=4M,slot=256M", FrameSize::Huge);
        assert_eq!(config.unwrap().block_size, 4 * MIB);
        // 1 GiB frames: blocks and slots of a frame at least.
        let giant = HotplugConfig::parse("total=2G", FrameSize::Giant).unwrap();
        assert_eq!((giant.block_size, giant.slot_size), (1 << 30, 1 << 30));
        for bad in [
            "",
            "block=2M",
            "total=1G,block=3M",
            "total=1G,block=1M",
            "total=1G,slot=64M",
            "total=1G,slot=130M",
            "total=100M",
            "total=0",
            "total=2T",
            "total=1G,color=red",
            "total",
            "total=lots",
        ] {
            let error = HotplugConfig::parse(bad, FrameSize::Huge).unwrap_err();
            assert!(error.to_string().starts_with("hotplug: "), "{bad}: {error}");
        }
        let error = HotplugConfig::parse("total=2G,block=2M", FrameSize::Giant).unwrap_err();
        assert!(error.to_string().contains("1 GiB frames"), "{error}");
    }

    #[test]
    fn a_requested_size_is_whole_blocks_up_to_the_total() {
        let config = HotplugConfig::parse("total=256M", FrameSize::Huge).unwrap();
        assert!(config.check_requested(0).is_ok());
        assert!(config.check_requested(256 * MIB).is_ok());
        assert!(config.check_requested(258 * MIB).is_err());
        assert!(config.check_requested(MIB).is_err());
    }
}
