//! The host side of a virtio-net device: a tap interface opened by name (tun-rs: `IFF_TAP`,
//! `IFF_NO_PI`, `IFF_VNET_HDR`), whose frames carry the 12-byte virtio-net header, read and
//! written straight from and into guest buffers with `readv`/`writev`.
//!
//! The offloads the tap hands the guest (`TUNSETOFFLOAD`) follow the features the driver
//! acknowledged, and the header is the virtio 1.x one (`TUNSETVNETHDRSZ`): tun-rs fixes both at
//! open and has no call to change them, so these two ioctls are made here.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use std::os::raw::{c_int, c_uint, c_ulong};

use vmm_sys_util::ioctl::{ioctl_expr, ioctl_with_ref, ioctl_with_val, _IOC_WRITE};

/// The tun driver's ioctl type.
const TUNTAP: c_uint = b'T' as c_uint;
/// `sizeof(int)` and `sizeof(unsigned int)`, the size both ioctls encode.
const INT_SIZE: u32 = 4;
const _: () = assert!(size_of::<c_int>() == 4 && size_of::<c_uint>() == 4);
/// `TUNSETOFFLOAD`: `_IOW('T', 208, unsigned int)`, the argument passed by value.
const TUNSETOFFLOAD: c_ulong = ioctl_expr(_IOC_WRITE, TUNTAP, 208, INT_SIZE);
/// `TUNSETVNETHDRSZ`: `_IOW('T', 216, int)`.
const TUNSETVNETHDRSZ: c_ulong = ioctl_expr(_IOC_WRITE, TUNTAP, 216, INT_SIZE);

/// The tap checks and completes checksums the guest left out (`TUN_F_CSUM`).
pub const TUN_F_CSUM: u32 = 0x01;
/// TCP over IPv4 segmentation offload.
pub const TUN_F_TSO4: u32 = 0x02;
/// TCP over IPv6 segmentation offload.
pub const TUN_F_TSO6: u32 = 0x04;
/// TCP segmentation offload with ECN.
pub const TUN_F_TSO_ECN: u32 = 0x08;
/// UDP fragmentation offload.
pub const TUN_F_UFO: u32 = 0x10;

/// Longest interface name, its terminating NUL left out (`IFNAMSIZ - 1`).
pub const MAX_NAME_LEN: usize = 15;

/// Errors of opening a tap.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The name is not one Linux takes for an interface.
    #[error(
        "{0:?} is not an interface name (1 to {MAX_NAME_LEN} bytes, no '/', ':', space or NUL)"
    )]
    BadName(String),
    /// The tun driver refused it (no such tap and no right to make one, a tun device by that
    /// name, or one another process holds).
    #[error("cannot open the tap {name}: {source}")]
    Open {
        /// The interface.
        name: String,
        /// The error.
        source: io::Error,
    },
    /// The tap does not take the virtio 1.x header.
    #[error("the tap {name} does not take a {size}-byte virtio-net header: {source}")]
    HeaderSize {
        /// The interface.
        name: String,
        /// The header size.
        size: usize,
        /// The error.
        source: io::Error,
    },
}

/// An open tap, non-blocking.
pub struct Tap {
    device: tun_rs::SyncDevice,
    name: String,
}

/// Whether `name` is a name Linux takes for an interface (`dev_valid_name`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
}

impl Tap {
    /// Opens the tap `name` (making it if it does not exist and the process may), with frames
    /// that carry a `header_size`-byte virtio-net header. Its link state is left as it is.
    pub fn open(name: &str, header_size: usize) -> Result<Tap, TapError> {
        if !valid_name(name) {
            return Err(TapError::BadName(name.to_owned()));
        }
        let open_error = |source| TapError::Open {
            name: name.to_owned(),
            source,
        };
        let device = tun_rs::DeviceBuilder::new()
            .name(name)
            .layer(tun_rs::Layer::L2)
            .offload(true)
            .inherit_enable_state()
            .build_sync()
            .map_err(open_error)?;
        device.set_nonblocking(true).map_err(open_error)?;
        let tap = Tap {
            device,
            name: name.to_owned(),
        };
        let header_error = |source| TapError::HeaderSize {
            name: name.to_owned(),
            size: header_size,
            source,
        };
        let size = c_int::try_from(header_size)
            .map_err(|_| header_error(io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: TUNSETVNETHDRSZ reads one int from the reference, which lives for the call;
        // the descriptor is a tap this value owns.
        let done = unsafe { ioctl_with_ref(&tap.device, TUNSETVNETHDRSZ, &size) };
        if done < 0 {
            return Err(header_error(io::Error::last_os_error()));
        }
        // Nothing is offloaded to the guest until its driver says what it takes.
        tap.set_offload(0).map_err(open_error)?;
        Ok(tap)
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets what the tap may hand the guest (`TUN_F_*`): frames with their checksum left out,
    /// segments larger than the MTU.
    pub fn set_offload(&self, flags: u32) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value; the descriptor is a tap.
        let done = unsafe { ioctl_with_val(&self.device, TUNSETOFFLOAD, flags.into()) };
        if done < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads one frame (header first) into `iovecs`; a frame longer than they are is cut.
    /// `WouldBlock` when there is none.
    ///
    /// # Safety
    /// Every iovec must be valid for writes of its length for the whole call.
    pub unsafe fn read_frame(&self, iovecs: &[libc::iovec]) -> io::Result<usize> {
        let count = libc::c_int::try_from(iovecs.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: the caller vouches for the buffers; readv writes only into them.
        let read = unsafe { libc::readv(self.as_raw_fd(), iovecs.as_ptr(), count) };
        usize::try_from(read).map_err(|_| io::Error::last_os_error())
    }

    /// Writes one frame (header first) gathered from `iovecs`.
    ///
    /// # Safety
    /// Every iovec must be valid for reads of its length for the whole call.
    pub unsafe fn write_frame(&self, iovecs: &[libc::iovec]) -> io::Result<usize> {
        let count = libc::c_int::try_from(iovecs.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: the caller vouches for the buffers; writev only reads them.
        let written = unsafe { libc::writev(self.as_raw_fd(), iovecs.as_ptr(), count) };
        usize::try_from(written).map_err(|_| io::Error::last_os_error())
    }
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap")
            .field("name", &self.name)
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.device.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_checked_before_the_driver_sees_them() {
        for bad in [
            "",
            "a/b",
            "eth:0",
            "with space",
            "sixteen-chars-xx",
            ".",
            "..",
            "nul\0",
        ] {
            assert!(
                matches!(Tap::open(bad, 12), Err(TapError::BadName(_))),
                "{bad:?}"
            );
        }
        assert!(valid_name("tap0"));
        assert!(valid_name("fifteen-chars-x"));
    }
}
