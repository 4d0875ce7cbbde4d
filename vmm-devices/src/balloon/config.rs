//! The balloon device's configuration and its textual form, `size=SIZE,deflate_on_oom=on|off,
//! free_page_reporting=on|off,free_page_hinting=on|off,stats_polling_interval_s=N` (the
//! `--balloon` option, in the style of Cloud Hypervisor's).

use std::str::FromStr;

use crate::size::{format_size, parse_size, SizeError};

/// The keys `--balloon` accepts, for messages.
const KEYS: &str =
    "size, deflate_on_oom, free_page_reporting, free_page_hinting, stats_polling_interval_s";

/// Errors of parsing `--balloon` and of checking the balloon against the VM.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BalloonConfigError {
    /// The option is empty.
    #[error("no balloon options given: expected e.g. size=256M,deflate_on_oom=on")]
    Empty,
    /// An item is not `key=value`.
    #[error("balloon option '{0}' is not key=value (keys: {KEYS})")]
    NotKeyValue(String),
    /// The key is unknown.
    #[error("unknown balloon option '{0}' (keys: {KEYS})")]
    UnknownKey(String),
    /// A key appears twice.
    #[error("balloon option '{0}' is given twice")]
    Duplicate(String),
    /// An on/off value is something else.
    #[error("balloon option {key}={value}: expected on or off")]
    NotOnOff {
        /// The key.
        key: &'static str,
        /// The value given.
        value: String,
    },
    /// The size is malformed.
    #[error("balloon option size: {0}")]
    Size(SizeError),
    /// The size is not a whole number of 4 KiB balloon pages.
    #[error("balloon size {0} is not a multiple of 4 KiB (balloon pages are 4 KiB)")]
    UnalignedSize(u64),
    /// The polling interval is not a number of seconds.
    #[error("balloon option stats_polling_interval_s={0}: expected whole seconds (0 disables)")]
    BadInterval(String),
    /// The balloon is larger than guest RAM.
    #[error("balloon size={}: larger than guest RAM ({})", format_size(*.size), format_size(*.memory))]
    TooLarge {
        /// The balloon size.
        size: u64,
        /// Guest RAM.
        memory: u64,
    },
}

/// A virtio-balloon device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct BalloonDeviceConfig {
    /// Initial balloon target in bytes: memory the guest is asked to give back (default 0).
    pub size: u64,
    /// Whether the guest may deflate the balloon when it runs out of memory (default off).
    pub deflate_on_oom: bool,
    /// Whether the guest reports free pages, which go back to the pool (default off).
    pub free_page_reporting: bool,
    /// Whether the host may start free page hinting runs, whose hinted pages go back to the
    /// pool (default off).
    #[serde(default)]
    pub free_page_hinting: bool,
    /// Seconds between statistics requests to the guest; 0 disables statistics (default 0).
    pub stats_polling_interval_s: u32,
}

/// Size of a balloon page.
const BALLOON_PAGE_SIZE: u64 = 4096;

fn on_off(key: &'static str, value: &str) -> Result<bool, BalloonConfigError> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(BalloonConfigError::NotOnOff {
            key,
            value: value.to_owned(),
        }),
    }
}

impl BalloonDeviceConfig {
    /// Checks that the balloon fits in `memory` bytes of guest RAM.
    pub fn check_fits(&self, memory: u64) -> Result<(), BalloonConfigError> {
        if self.size > memory {
            return Err(BalloonConfigError::TooLarge {
                size: self.size,
                memory,
            });
        }
        Ok(())
    }
}

impl FromStr for BalloonDeviceConfig {
    type Err = BalloonConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err(BalloonConfigError::Empty);
        }
        let mut config = BalloonDeviceConfig::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in text.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| BalloonConfigError::NotKeyValue(item.to_owned()))?;
            if seen.contains(&key) {
                return Err(BalloonConfigError::Duplicate(key.to_owned()));
            }
            seen.push(key);
            match key {
                "size" => {
                    config.size = parse_size(value).map_err(BalloonConfigError::Size)?;
                    if !config.size.is_multiple_of(BALLOON_PAGE_SIZE) {
                        return Err(BalloonConfigError::UnalignedSize(config.size));
                    }
                }
                "deflate_on_oom" => config.deflate_on_oom = on_off("deflate_on_oom", value)?,
                "free_page_reporting" => {
                    config.free_page_reporting = on_off("free_page_reporting", value)?
                }
                "free_page_hinting" => {
                    config.free_page_hinting = on_off("free_page_hinting", value)?
                }
                "stats_polling_interval_s" => {
                    config.stats_polling_interval_s = value
                        .parse()
                        .ok()
                        .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
                        .ok_or_else(|| BalloonConfigError::BadInterval(value.to_owned()))?
                }
                _ => return Err(BalloonConfigError::UnknownKey(key.to_owned())),
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_options_in_any_order() {
        let config: BalloonDeviceConfig =
            "free_page_reporting=on,size=256M,stats_polling_interval_s=2,deflate_on_oom=on,\
             free_page_hinting=on"
                .parse()
                .unwrap();
        assert_eq!(
            config,
            BalloonDeviceConfig {
                size: 256 << 20,
                deflate_on_oom: true,
                free_page_reporting: true,
                free_page_hinting: true,
                stats_polling_interval_s: 2,
            }
        );
        assert_eq!("size=0".parse(), Ok(BalloonDeviceConfig::default()));
        assert_eq!(
            "deflate_on_oom=off".parse::<BalloonDeviceConfig>().unwrap(),
            BalloonDeviceConfig::default()
        );
    }

    #[test]
    fn every_malformed_option_has_its_own_error() {
        let cases = [
            ("", BalloonConfigError::Empty),
            ("size", BalloonConfigError::NotKeyValue("size".into())),
            ("size=1M,", BalloonConfigError::NotKeyValue("".into())),
            (
                "size=1M,,deflate_on_oom=on",
                BalloonConfigError::NotKeyValue("".into()),
            ),
            ("amount=1M", BalloonConfigError::UnknownKey("amount".into())),
            ("SIZE=1M", BalloonConfigError::UnknownKey("SIZE".into())),
            (
                "size=1M,size=2M",
                BalloonConfigError::Duplicate("size".into()),
            ),
            (
                "size=1X",
                BalloonConfigError::Size(SizeError::Malformed("1X".into())),
            ),
            ("size=", BalloonConfigError::Size(SizeError::Empty)),
            ("size=4097", BalloonConfigError::UnalignedSize(4097)),
            (
                "deflate_on_oom=yes",
                BalloonConfigError::NotOnOff {
                    key: "deflate_on_oom",
                    value: "yes".into(),
                },
            ),
            (
                "free_page_reporting=",
                BalloonConfigError::NotOnOff {
                    key: "free_page_reporting",
                    value: "".into(),
                },
            ),
            (
                "stats_polling_interval_s=-1",
                BalloonConfigError::BadInterval("-1".into()),
            ),
            (
                "stats_polling_interval_s=+1",
                BalloonConfigError::BadInterval("+1".into()),
            ),
            (
                "stats_polling_interval_s=1s",
                BalloonConfigError::BadInterval("1s".into()),
            ),
            (
                "stats_polling_interval_s=99999999999",
                BalloonConfigError::BadInterval("99999999999".into()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(
                text.parse::<BalloonDeviceConfig>(),
                Err(expected),
                "{text:?}"
            );
        }
    }

    #[test]
    fn messages_name_the_offending_option() {
        let err = "deflate_on_oom=1"
            .parse::<BalloonDeviceConfig>()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "balloon option deflate_on_oom=1: expected on or off"
        );
        let err = "foo=1".parse::<BalloonDeviceConfig>().unwrap_err();
        assert!(
            err.to_string().contains("keys: size, deflate_on_oom"),
            "{err}"
        );
    }
}
