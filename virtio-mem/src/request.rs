//! Requests and responses on the wire.

use crate::spec::{
    REQUEST_SIZE, RESPONSE_SIZE, VIRTIO_MEM_REQ_PLUG, VIRTIO_MEM_REQ_STATE, VIRTIO_MEM_REQ_UNPLUG,
    VIRTIO_MEM_REQ_UNPLUG_ALL, VIRTIO_MEM_RESP_ACK, VIRTIO_MEM_RESP_BUSY, VIRTIO_MEM_RESP_ERROR,
    VIRTIO_MEM_RESP_NACK,
};
use crate::BlockState;

/// A driver's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemRequest {
    /// Plug `blocks` blocks from guest address `addr`.
    Plug {
        /// The first block's guest address.
        addr: u64,
        /// How many blocks.
        blocks: u16,
    },
    /// Unplug `blocks` blocks from guest address `addr`.
    Unplug {
        /// The first block's guest address.
        addr: u64,
        /// How many blocks.
        blocks: u16,
    },
    /// Unplug every block.
    UnplugAll,
    /// The state of `blocks` blocks from guest address `addr`.
    State {
        /// The first block's guest address.
        addr: u64,
        /// How many blocks.
        blocks: u16,
    },
    /// A request type the specification does not define.
    Unknown(u16),
}

impl MemRequest {
    /// Parses the request the driver wrote (padding ignored).
    pub fn parse(bytes: &[u8; REQUEST_SIZE]) -> Self {
        let le16 = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&bytes[8..16]);
        let addr = u64::from_le_bytes(addr);
        let blocks = le16(16);
        match le16(0) {
            VIRTIO_MEM_REQ_PLUG => Self::Plug { addr, blocks },
            VIRTIO_MEM_REQ_UNPLUG => Self::Unplug { addr, blocks },
            VIRTIO_MEM_REQ_UNPLUG_ALL => Self::UnplugAll,
            VIRTIO_MEM_REQ_STATE => Self::State { addr, blocks },
            other => Self::Unknown(other),
        }
    }

    /// The request as a driver writes it.
    pub fn to_bytes(self) -> [u8; REQUEST_SIZE] {
        let (kind, addr, blocks) = match self {
            Self::Plug { addr, blocks } => (VIRTIO_MEM_REQ_PLUG, addr, blocks),
            Self::Unplug { addr, blocks } => (VIRTIO_MEM_REQ_UNPLUG, addr, blocks),
            Self::UnplugAll => (VIRTIO_MEM_REQ_UNPLUG_ALL, 0, 0),
            Self::State { addr, blocks } => (VIRTIO_MEM_REQ_STATE, addr, blocks),
            Self::Unknown(kind) => (kind, 0, 0),
        };
        let mut bytes = [0u8; REQUEST_SIZE];
        bytes[..2].copy_from_slice(&kind.to_le_bytes());
        bytes[8..16].copy_from_slice(&addr.to_le_bytes());
        bytes[16..18].copy_from_slice(&blocks.to_le_bytes());
        bytes
    }
}

/// The device's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemResponse {
    /// Done; for a state request, with the range's state.
    Ack(Option<BlockState>),
    /// Refused for now; the driver may retry later.
    Nack,
    /// Busy; the driver may retry.
    Busy,
    /// Invalid request.
    Error,
}

impl MemResponse {
    /// The response as the device writes it.
    pub fn to_bytes(self) -> [u8; RESPONSE_SIZE] {
        let (kind, state) = match self {
            Self::Ack(state) => (VIRTIO_MEM_RESP_ACK, state.map_or(0, BlockState::wire)),
            Self::Nack => (VIRTIO_MEM_RESP_NACK, 0),
            Self::Busy => (VIRTIO_MEM_RESP_BUSY, 0),
            Self::Error => (VIRTIO_MEM_RESP_ERROR, 0),
        };
        let mut bytes = [0u8; RESPONSE_SIZE];
        bytes[..2].copy_from_slice(&kind.to_le_bytes());
        bytes[8..10].copy_from_slice(&state.to_le_bytes());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::VIRTIO_MEM_STATE_MIXED;

    #[test]
    fn requests_round_trip_and_padding_is_ignored() {
        for request in [
            MemRequest::Plug {
                addr: 1 << 32,
                blocks: 3,
            },
            MemRequest::Unplug {
                addr: 0x4000_0000,
                blocks: u16::MAX,
            },
            MemRequest::UnplugAll,
            MemRequest::State { addr: 0, blocks: 1 },
            MemRequest::Unknown(77),
        ] {
            let mut bytes = request.to_bytes();
            bytes[2..8].fill(0xff);
            bytes[18..].fill(0xff);
            assert_eq!(MemRequest::parse(&bytes), request);
        }
    }

    #[test]
    fn responses_carry_their_type_and_state() {
        let bytes = MemResponse::Ack(Some(BlockState::Mixed)).to_bytes();
        assert_eq!(
            u16::from_le_bytes([bytes[0], bytes[1]]),
            VIRTIO_MEM_RESP_ACK
        );
        assert_eq!(
            u16::from_le_bytes([bytes[8], bytes[9]]),
            VIRTIO_MEM_STATE_MIXED
        );
        assert_eq!(MemResponse::Nack.to_bytes()[0], 1);
        assert_eq!(MemResponse::Busy.to_bytes()[0], 2);
        assert_eq!(MemResponse::Error.to_bytes()[0], 3);
    }
}
