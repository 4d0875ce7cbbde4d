//! A virtio-net interface over a host tap: its configuration and checks (Firecracker's
//! `PUT /network-interfaces/{iface_id}`, `vmm run --net`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::rate_limiter::RateLimiterConfig;

/// Errors of a network interface's configuration.
#[derive(Debug, thiserror::Error)]
pub enum NetConfigError {
    /// A network interface's settings are invalid or clash with another's.
    #[error("network interface: {0}")]
    Invalid(String),
}

/// Longest interface id (it names the interface's metrics).
pub const MAX_IFACE_ID: usize = 64;
/// Smallest MTU the guest may be told (IPv4's minimum).
pub const MIN_MTU: u16 = 68;

/// An Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl FromStr for MacAddr {
    type Err = NetConfigError;

    /// Six pairs of hex digits separated by colons, as Firecracker takes `guest_mac`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || {
            NetConfigError::Invalid(format!("{text:?} is not a MAC address (06:00:ac:10:00:02)"))
        };
        let mut bytes = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut bytes {
            let part = parts.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(bytes))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A virtio-net interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetConfig {
    /// The interface's id (Firecracker's `iface_id`).
    pub id: String,
    /// The host's tap interface the frames go through.
    pub host_dev_name: String,
    /// The address the guest is given; none: the guest picks one.
    pub guest_mac: Option<MacAddr>,
    /// The MTU the guest is told (VIRTIO_NET_F_MTU); none: the guest's default.
    pub mtu: Option<u16>,
    /// Caps the frames the guest receives.
    pub rx_rate_limiter: RateLimiterConfig,
    /// Caps the frames the guest sends.
    pub tx_rate_limiter: RateLimiterConfig,
}

/// The keys `--net` takes, for messages.
const KEYS: &str = "tap, mac, id, mtu";

impl NetConfig {
    /// `tap=NAME[,mac=MAC][,id=ID][,mtu=N]` (`vmm run --net`); `id` defaults to `eth{index}`.
    /// The result is not checked yet ([`check_network_interfaces`]).
    pub fn parse(text: &str, index: usize) -> Result<Self, NetConfigError> {
        let bad = |why: String| NetConfigError::Invalid(why);
        let mut config = NetConfig {
            id: format!("eth{index}"),
            host_dev_name: String::new(),
            guest_mac: None,
            mtu: None,
            rx_rate_limiter: RateLimiterConfig::default(),
            tx_rate_limiter: RateLimiterConfig::default(),
        };
        let mut tap = None;
        for item in text.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("'{item}' is not key=value (keys: {KEYS})")))?;
            match key {
                "tap" => tap = Some(value.to_owned()),
                "mac" => config.guest_mac = Some(value.parse()?),
                "id" => config.id = value.to_owned(),
                "mtu" => {
                    config.mtu = Some(
                        value
                            .parse()
                            .map_err(|_| bad(format!("mtu={value}: expected 68 to 65535")))?,
                    )
                }
                _ => return Err(bad(format!("unknown key '{key}' (keys: {KEYS})"))),
            }
        }
        config.host_dev_name = tap.ok_or_else(|| bad("tap=NAME is missing".into()))?;
        Ok(config)
    }

    /// Checks the id, the tap's name and the MTU.
    pub fn check(&self) -> Result<(), NetConfigError> {
        let id = &self.id;
        if id.is_empty() || id.len() > MAX_IFACE_ID {
            return Err(NetConfigError::Invalid(format!(
                "iface_id {id:?}: 1 to {MAX_IFACE_ID} bytes"
            )));
        }
        if !id.bytes().all(|b| b == b'_' || b.is_ascii_alphanumeric()) {
            return Err(NetConfigError::Invalid(format!(
                "iface_id {id:?}: only letters, digits and '_' are allowed"
            )));
        }
        let name = &self.host_dev_name;
        if !super::tap::valid_name(name) {
            return Err(NetConfigError::Invalid(format!(
                "host_dev_name {name:?}: not an interface name (1 to 15 bytes, no '/', ':', space)"
            )));
        }
        if let Some(mtu) = self.mtu {
            if mtu < MIN_MTU {
                return Err(NetConfigError::Invalid(format!(
                    "mtu {mtu}: at least {MIN_MTU}"
                )));
            }
        }
        Ok(())
    }
}

/// Checks each interface, and that no two share an id, a tap or a MAC address.
pub fn check_network_interfaces(interfaces: &[NetConfig]) -> Result<(), NetConfigError> {
    for (i, net) in interfaces.iter().enumerate() {
        net.check()?;
        for other in &interfaces[..i] {
            let clash = if other.id == net.id {
                format!("the id {} is given twice", net.id)
            } else if other.host_dev_name == net.host_dev_name {
                format!(
                    "the tap {} is given to {} and {}",
                    net.host_dev_name, other.id, net.id
                )
            } else if net.guest_mac.is_some() && other.guest_mac == net.guest_mac {
                format!("{} and {} have the same guest_mac", other.id, net.id)
            } else {
                continue;
            };
            return Err(NetConfigError::Invalid(clash));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_addresses_are_six_hex_pairs() {
        let mac: MacAddr = "06:00:AC:10:00:02".parse().unwrap();
        assert_eq!(mac.0, [6, 0, 0xac, 0x10, 0, 2]);
        assert_eq!(mac.to_string(), "06:00:ac:10:00:02");
        for bad in [
            "",
            "06:00:ac:10:00",
            "06:00:ac:10:00:02:03",
            "6:00:ac:10:00:02",
            "0g:00:ac:10:00:02",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?}");
        }
        let json: MacAddr = serde_json::from_str("\"aa:bb:cc:dd:ee:ff\"").unwrap();
        assert_eq!(
            serde_json::to_string(&json).unwrap(),
            "\"aa:bb:cc:dd:ee:ff\""
        );
    }

    #[test]
    fn the_command_line_form_names_a_tap_and_may_give_the_rest() {
        let net = NetConfig::parse("tap=tap0,mac=06:00:00:00:00:01,mtu=9000", 1).unwrap();
        assert_eq!(net.id, "eth1");
        assert_eq!(net.host_dev_name, "tap0");
        assert_eq!(net.mtu, Some(9000));
        net.check().unwrap();
        assert!(NetConfig::parse("mac=06:00:00:00:00:01", 0).is_err());
        assert!(NetConfig::parse("tap=tap0,speed=10", 0).is_err());
        assert!(NetConfig::parse("tap=tap0,mtu=70000", 0).is_err());
        let small_mtu = NetConfig::parse("tap=tap0,mtu=40", 0).unwrap();
        assert!(small_mtu.check().is_err());
        let bad_tap = NetConfig::parse("tap=../x", 0).unwrap();
        assert!(bad_tap.check().is_err());
    }

    #[test]
    fn interfaces_share_no_id_tap_or_mac() {
        let a = NetConfig::parse("tap=tap0,mac=06:00:00:00:00:01", 0).unwrap();
        let ok = NetConfig::parse("tap=tap1", 1).unwrap();
        check_network_interfaces(&[a.clone(), ok.clone()]).unwrap();
        let same_id = NetConfig::parse("tap=tap1,id=eth0", 1).unwrap();
        let same_tap = NetConfig::parse("tap=tap0", 1).unwrap();
        let same_mac = NetConfig::parse("tap=tap1,mac=06:00:00:00:00:01", 1).unwrap();
        for other in [same_id, same_tap, same_mac] {
            assert!(check_network_interfaces(&[a.clone(), other]).is_err());
        }
    }
}
