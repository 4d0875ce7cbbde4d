//! The microVM metadata service (Firecracker's MMDS): a JSON document the host sets through
//! the API (`PUT`/`PATCH`/`GET /mmds`) and the guest reads over HTTP at a link-local address
//! (169.254.169.254 by default) through the network interfaces `PUT /mmds/config` names, V1
//! (no session) or V2 (session tokens, as AWS's IMDSv2). The guest's frames to MMDS are
//! answered inside the VMM ([`stack`]): they never reach the tap.

pub mod http;
pub mod stack;
pub mod store;

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub use store::{Store, StoreError};

/// The address MMDS answers on unless configured otherwise.
pub const DEFAULT_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// MMDS's version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Version {
    /// Requests need no session.
    #[default]
    V1,
    /// Every `GET` needs a session token.
    V2,
}

/// How a VM reaches MMDS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmdsConfig {
    /// V1 or V2.
    pub version: Version,
    /// The address it answers on.
    pub ipv4_address: Ipv4Addr,
    /// The interfaces (by id) it answers on.
    pub network_interfaces: Vec<String>,
    /// Answer in IMDS's text form even when JSON is asked for.
    pub imds_compat: bool,
}

/// A VM's MMDS: how it is reached and the document it serves (shared with the API).
#[derive(Clone, Debug)]
pub struct Mmds {
    /// How it is reached.
    pub config: MmdsConfig,
    /// The document and session tokens.
    pub store: Arc<Mutex<Store>>,
}

impl PartialEq for Mmds {
    fn eq(&self, other: &Self) -> bool {
        self.config == other.config && Arc::ptr_eq(&self.store, &other.store)
    }
}

impl Eq for Mmds {}

impl Mmds {
    /// What an interface's stack serves.
    pub fn shared(&self) -> stack::StackShared {
        stack::StackShared {
            store: self.store.clone(),
            version: self.config.version,
            imds_compat: self.config.imds_compat,
        }
    }

    /// The stack for interface `id`, if MMDS answers on it.
    pub fn stack_for(&self, id: &str) -> Option<stack::Stack> {
        self.config
            .network_interfaces
            .iter()
            .any(|name| name == id)
            .then(|| stack::Stack::new(self.config.ipv4_address, self.shared()))
    }
}
