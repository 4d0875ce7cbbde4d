//! Device options chosen by the VMM, and the configuration space the driver sees.

use std::time::Duration;

use crate::spec::{
    BALLOON_PAGE_SIZE, CONFIG_ACTUAL, CONFIG_FREE_PAGE_HINT_CMD_ID, CONFIG_NUM_PAGES, CONFIG_SIZE,
    MAX_QUEUE_SIZE, VIRTIO_BALLOON_F_DEFLATE_ON_OOM, VIRTIO_BALLOON_F_FREE_PAGE_HINT,
    VIRTIO_BALLOON_F_MUST_TELL_HOST, VIRTIO_BALLOON_F_PAGE_REPORTING, VIRTIO_BALLOON_F_STATS_VQ,
    VIRTIO_F_VERSION_1,
};
use log::warn;
use thiserror::Error;

/// Queue size offered by default; the Linux driver over virtio-mmio takes what is offered.
pub const DEFAULT_QUEUE_SIZE: u16 = 1024;

/// Errors of device options and balloon targets.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OptionsError {
    /// The queue size is zero, not a power of two or larger than virtio allows.
    #[error("balloon queue size {0} must be a power of two between 1 and {MAX_QUEUE_SIZE}")]
    QueueSize(u16),
    /// The statistics polling interval is zero.
    #[error("balloon statistics polling interval must not be zero (leave it unset to disable)")]
    ZeroStatsInterval,
    /// A target does not fit the 32-bit page count of the configuration space.
    #[error("balloon target of {bytes} bytes exceeds the device limit of {max} bytes")]
    TargetTooLarge {
        /// The target asked for.
        bytes: u128,
        /// The largest target the device can express.
        max: u64,
    },
    /// A target in bytes is not a whole number of 4 KiB balloon pages.
    #[error("balloon target of {0} bytes is not a multiple of 4 KiB")]
    UnalignedTarget(u64),
}

/// Device options, fixed when the device is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalloonConfig {
    /// Initial target in 4 KiB pages (`num_pages`).
    pub target_pages: u32,
    /// Offer VIRTIO_BALLOON_F_DEFLATE_ON_OOM: the guest may deflate when it runs out of memory.
    pub deflate_on_oom: bool,
    /// Offer VIRTIO_BALLOON_F_PAGE_REPORTING: reported free ranges go back to the pool.
    pub free_page_reporting: bool,
    /// Offer VIRTIO_BALLOON_F_FREE_PAGE_HINT: in a hinting run the host starts, the pages the
    /// guest hints free go back to the pool.
    pub free_page_hinting: bool,
    /// Offer VIRTIO_BALLOON_F_STATS_VQ and ask for statistics at this interval; `None` disables.
    pub stats_interval: Option<Duration>,
    /// Offer VIRTIO_BALLOON_F_MUST_TELL_HOST: the guest waits for the device to process a
    /// deflate request before it uses the pages again.
    pub must_tell_host: bool,
    /// Maximum size of every queue.
    pub queue_size: u16,
}

impl Default for BalloonConfig {
    fn default() -> Self {
        Self {
            target_pages: 0,
            deflate_on_oom: false,
            free_page_reporting: false,
            free_page_hinting: false,
            stats_interval: None,
            must_tell_host: true,
            queue_size: DEFAULT_QUEUE_SIZE,
        }
    }
}

impl BalloonConfig {
    /// Checks the options.
    pub fn validate(&self) -> Result<(), OptionsError> {
        let size = self.queue_size;
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(OptionsError::QueueSize(size));
        }
        if self.stats_interval == Some(Duration::ZERO) {
            return Err(OptionsError::ZeroStatsInterval);
        }
        Ok(())
    }

    /// The feature bits the device offers.
    pub fn features(&self) -> u64 {
        let bit = |on: bool, bit: u32| u64::from(on) << bit;
        bit(true, VIRTIO_F_VERSION_1)
            | bit(self.must_tell_host, VIRTIO_BALLOON_F_MUST_TELL_HOST)
            | bit(self.stats_interval.is_some(), VIRTIO_BALLOON_F_STATS_VQ)
            | bit(self.deflate_on_oom, VIRTIO_BALLOON_F_DEFLATE_ON_OOM)
            | bit(self.free_page_reporting, VIRTIO_BALLOON_F_PAGE_REPORTING)
            | bit(self.free_page_hinting, VIRTIO_BALLOON_F_FREE_PAGE_HINT)
    }
}

/// The largest target the configuration space can hold, in bytes.
pub const MAX_TARGET_BYTES: u64 = u32::MAX as u64 * BALLOON_PAGE_SIZE;

/// Converts a target in MiB to 4 KiB balloon pages.
pub fn pages_from_mib(mib: u64) -> Result<u32, OptionsError> {
    let bytes = u128::from(mib) << 20;
    u32::try_from(bytes / u128::from(BALLOON_PAGE_SIZE)).map_err(|_| OptionsError::TargetTooLarge {
        bytes,
        max: MAX_TARGET_BYTES,
    })
}

/// Converts a target in bytes (a multiple of 4 KiB) to balloon pages.
pub fn pages_from_bytes(bytes: u64) -> Result<u32, OptionsError> {
    if !bytes.is_multiple_of(BALLOON_PAGE_SIZE) {
        return Err(OptionsError::UnalignedTarget(bytes));
    }
    u32::try_from(bytes / BALLOON_PAGE_SIZE).map_err(|_| OptionsError::TargetTooLarge {
        bytes: u128::from(bytes),
        max: MAX_TARGET_BYTES,
    })
}

/// The device configuration space (virtio 1.2 §5.5.4): `num_pages`, `actual`,
/// `free_page_hint_cmd_id` and `poison_val`, all `le32`. The last two stay zero: their features
/// are not offered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConfigSpace {
    /// Target size of the balloon in 4 KiB pages; written by the device.
    pub num_pages: u32,
    /// Current size of the balloon in 4 KiB pages, as the driver reports it.
    pub actual: u32,
    /// The host's free page hinting command: a run's id, or [`FREE_PAGE_HINT_STOP`] or
    /// [`FREE_PAGE_HINT_DONE`]; written by the device.
    ///
    /// [`FREE_PAGE_HINT_STOP`]: crate::spec::FREE_PAGE_HINT_STOP
    /// [`FREE_PAGE_HINT_DONE`]: crate::spec::FREE_PAGE_HINT_DONE
    pub free_page_hint_cmd_id: u32,
}

impl ConfigSpace {
    fn bytes(&self) -> [u8; CONFIG_SIZE] {
        // The layout of the spec: num_pages, actual, free_page_hint_cmd_id (poison_val: 0).
        const _: () = assert!(
            CONFIG_NUM_PAGES == 0 && CONFIG_ACTUAL == 4 && CONFIG_FREE_PAGE_HINT_CMD_ID == 8
        );
        let mut bytes = [0; CONFIG_SIZE];
        bytes[..4].copy_from_slice(&self.num_pages.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.actual.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.free_page_hint_cmd_id.to_le_bytes());
        bytes
    }

    /// Reads `data.len()` bytes at `offset`; bytes past the end read as zero.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let bytes = self.bytes();
        let Some(start) = usize::try_from(offset).ok().filter(|&o| o < CONFIG_SIZE) else {
            return;
        };
        let len = data.len().min(CONFIG_SIZE - start);
        data[..len].copy_from_slice(&bytes[start..start + len]);
    }

    /// Writes `data` at `offset`. Only `actual` is writable, as one aligned 32-bit access (virtio
    /// 1.2 §4.2.2.2 asks drivers for that); anything else is ignored with a warning.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        match (offset, <[u8; 4]>::try_from(data)) {
            (CONFIG_ACTUAL, Ok(value)) => self.actual = u32::from_le_bytes(value),
            _ => warn!(
                "virtio-balloon: ignored {}-byte config write at offset {offset:#x}",
                data.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated_and_select_features() {
        let config = BalloonConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.features(), 1 << 32 | 1);
        let all = BalloonConfig {
            deflate_on_oom: true,
            free_page_reporting: true,
            free_page_hinting: true,
            stats_interval: Some(Duration::from_secs(2)),
            ..config
        };
        assert_eq!(all.features(), 1 << 32 | 0b101111);
        for size in [0, 3, 1000] {
            let bad = BalloonConfig {
                queue_size: size,
                ..config
            };
            assert_eq!(bad.validate(), Err(OptionsError::QueueSize(size)));
        }
        let zero = BalloonConfig {
            stats_interval: Some(Duration::ZERO),
            ..config
        };
        assert_eq!(zero.validate(), Err(OptionsError::ZeroStatsInterval));
    }

    #[test]
    fn targets_convert_to_pages_within_limits() {
        assert_eq!(pages_from_mib(256), Ok(65536));
        assert_eq!(pages_from_mib(16 * 1024 * 1024 - 1), Ok(u32::MAX - 255));
        assert!(matches!(
            pages_from_mib(16 * 1024 * 1024),
            Err(OptionsError::TargetTooLarge { .. })
        ));
        assert!(matches!(
            pages_from_mib(u64::MAX),
            Err(OptionsError::TargetTooLarge { .. })
        ));
        assert_eq!(pages_from_bytes(8192), Ok(2));
        assert_eq!(
            pages_from_bytes(100),
            Err(OptionsError::UnalignedTarget(100))
        );
        assert_eq!(pages_from_bytes(MAX_TARGET_BYTES), Ok(u32::MAX));
    }

    #[test]
    fn config_space_reads_any_window_and_writes_only_actual() {
        let mut space = ConfigSpace {
            num_pages: 0x0403_0201,
            actual: 0,
            free_page_hint_cmd_id: 0x0807_0605,
        };
        let mut word = [0xff; 4];
        space.read(0, &mut word);
        assert_eq!(word, [1, 2, 3, 4]);
        space.read(8, &mut word);
        assert_eq!(word, [5, 6, 7, 8]);
        let mut tail = [0xff; 8];
        space.read(12, &mut tail);
        assert_eq!(tail, [0; 8]);
        space.read(u64::MAX, &mut tail);
        assert_eq!(tail, [0; 8]);

        space.write(CONFIG_ACTUAL, &7u32.to_le_bytes());
        assert_eq!(space.actual, 7);
        space.write(CONFIG_NUM_PAGES, &9u32.to_le_bytes());
        space.write(CONFIG_ACTUAL, &[1, 2]);
        space.write(5, &[1, 2, 3, 4]);
        space.write(CONFIG_FREE_PAGE_HINT_CMD_ID, &9u32.to_le_bytes());
        assert_eq!(
            space.free_page_hint_cmd_id, 0x0807_0605,
            "the device's to write"
        );
        assert_eq!(space.num_pages, 0x0403_0201);
        assert_eq!(space.actual, 7);
    }
}
