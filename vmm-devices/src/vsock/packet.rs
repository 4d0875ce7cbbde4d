//! The virtio-vsock packet header (virtio 1.2 §5.10.6): 44 bytes, little-endian, before each
//! packet's payload.

/// Bytes of a header.
pub const HEADER_SIZE: usize = 44;
/// The host's CID: the VMM answers for it.
pub const HOST_CID: u64 = 2;
/// The only socket type: a stream.
pub const TYPE_STREAM: u16 = 1;

/// A connection request.
pub const OP_REQUEST: u16 = 1;
/// The request's acceptance.
pub const OP_RESPONSE: u16 = 2;
/// A refusal or an abort: the connection is gone.
pub const OP_RST: u16 = 3;
/// The sender will receive (`SHUTDOWN_RCV`) or send (`SHUTDOWN_SEND`) no more.
pub const OP_SHUTDOWN: u16 = 4;
/// Data.
pub const OP_RW: u16 = 5;
/// The sender's buffer space, unasked.
pub const OP_CREDIT_UPDATE: u16 = 6;
/// A request for the receiver's buffer space.
pub const OP_CREDIT_REQUEST: u16 = 7;

/// `OP_SHUTDOWN` flag: the sender receives no more.
pub const SHUTDOWN_RCV: u32 = 1;
/// `OP_SHUTDOWN` flag: the sender sends no more.
pub const SHUTDOWN_SEND: u32 = 2;

/// A packet header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketHeader {
    /// The sender's CID.
    pub src_cid: u64,
    /// The receiver's CID.
    pub dst_cid: u64,
    /// The sender's port.
    pub src_port: u32,
    /// The receiver's port.
    pub dst_port: u32,
    /// Bytes of payload.
    pub len: u32,
    /// The socket type ([`TYPE_STREAM`]).
    pub kind: u16,
    /// What the packet does (`OP_*`).
    pub op: u16,
    /// `OP_SHUTDOWN`'s flags.
    pub flags: u32,
    /// The sender's receive buffer, in bytes.
    pub buf_alloc: u32,
    /// Bytes the sender has taken out of its receive buffer so far (wrapping).
    pub fwd_cnt: u32,
}

impl PacketHeader {
    /// The header in `bytes`.
    pub fn parse(bytes: &[u8; HEADER_SIZE]) -> Self {
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let u32_at = |at: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&bytes[at..at + 4]);
            u32::from_le_bytes(b)
        };
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        PacketHeader {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            kind: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    /// The header's bytes.
    pub fn to_bytes(self) -> [u8; HEADER_SIZE] {
        let mut bytes = [0u8; HEADER_SIZE];
        bytes[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        bytes[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.len.to_le_bytes());
        bytes[28..30].copy_from_slice(&self.kind.to_le_bytes());
        bytes[30..32].copy_from_slice(&self.op.to_le_bytes());
        bytes[32..36].copy_from_slice(&self.flags.to_le_bytes());
        bytes[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        bytes[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written() {
        let header = PacketHeader {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: 1024,
            dst_port: 52,
            len: 4096,
            kind: TYPE_STREAM,
            op: OP_RW,
            flags: SHUTDOWN_SEND,
            buf_alloc: 1 << 18,
            fwd_cnt: u32::MAX,
        };
        let bytes = header.to_bytes();
        assert_eq!(&bytes[..8], &3u64.to_le_bytes());
        assert_eq!(&bytes[30..32], &OP_RW.to_le_bytes());
        assert_eq!(PacketHeader::parse(&bytes), header);
    }
}
