//! A userfaultfd in "missing" mode: the uapi of `linux/userfaultfd.h`, with ioctl numbers from
//! vmm-sys-util's macros. (The `userfaultfd` crate has the thread-id feature only through
//! bindgen at build time, which would make libclang a build dependency.)

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use thiserror::Error;
use vmm_sys_util::ioctl::{ioctl_with_mut_ref, ioctl_with_ref};
use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iowr_nr};

/// Errors of the userfaultfd wrapper.
#[derive(Debug, Error)]
pub enum UffdError {
    /// Neither the `userfaultfd` system call nor `/dev/userfaultfd` gave one.
    #[error(
        "cannot create a userfaultfd (needs root, read-write access to /dev/userfaultfd or \
         vm.unprivileged_userfaultfd=1): {0}"
    )]
    Create(#[source] io::Error),
    /// The kernel refused the API handshake or lacks a feature.
    #[error("userfaultfd API handshake failed: {0}")]
    Api(#[source] io::Error),
    /// The kernel does not report the faulting thread id.
    #[error("the kernel's userfaultfd lacks UFFD_FEATURE_THREAD_ID")]
    NoThreadId,
    /// The kernel does not report ranges the process removed (a handler's `remove` events).
    #[error("the kernel's userfaultfd lacks UFFD_FEATURE_EVENT_REMOVE")]
    NoEventRemove,
    /// Registering a range failed.
    #[error("cannot register {len:#x} bytes at {start:#x} with userfaultfd: {source}")]
    Register {
        /// Start of the range.
        start: usize,
        /// Length of the range.
        len: usize,
        /// The error of the ioctl.
        #[source]
        source: io::Error,
    },
}

const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1;

/// The ioctl type of userfaultfd (`UFFDIO`).
const UFFDIO: u32 = 0xAA;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

/// The kernel's `struct uffd_msg` (32 bytes), page-fault view.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    flags: u64,
    address: u64,
    ptid: u32,
    pad: u32,
}

ioctl_iowr_nr!(UFFDIO_API, UFFDIO, 0x3F, UffdioApi);
// /dev/userfaultfd's one ioctl: a new userfaultfd, its flags the argument (Linux 6.1).
ioctl_io_nr!(USERFAULTFD_IOC_NEW, UFFDIO, 0x00);
ioctl_iowr_nr!(UFFDIO_REGISTER, UFFDIO, 0x00, UffdioRegister);
ioctl_ior_nr!(UFFDIO_WAKE, UFFDIO, 0x02, UffdioRange);
ioctl_iowr_nr!(UFFDIO_ZEROPAGE, UFFDIO, 0x04, UffdioZeropage);

/// The ioctl requests a fault handler thread makes: registering a chunk given back, waking a
/// fault's waiters, answering one with the zero page (for a seccomp filter of those threads).
pub fn handler_ioctls() -> [libc::c_ulong; 3] {
    [UFFDIO_REGISTER(), UFFDIO_WAKE(), UFFDIO_ZEROPAGE()]
}

/// The result of an ioctl helper as an `io::Result`.
fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One page fault read from the userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UffdFault {
    /// The faulting host virtual address (page aligned by the kernel).
    pub address: usize,
    /// The thread id of the faulting thread.
    pub tid: u32,
    /// Whether the access was a write.
    pub write: bool,
}

/// A userfaultfd with the thread-id feature, for missing-page faults.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

impl Uffd {
    /// A new userfaultfd from the system call or, where it is refused (an unprivileged
    /// process, e.g. one in a jail, may not take kernel faults through it), from
    /// `/dev/userfaultfd`, whose file mode decides instead.
    fn create() -> io::Result<OwnedFd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: the syscall takes only flags and returns a new fd or -1.
        let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if raw >= 0 {
            // SAFETY: `raw` is a fresh fd that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(raw as RawFd) });
        }
        let refused = io::Error::last_os_error();
        if refused.raw_os_error() != Some(libc::EPERM) {
            return Err(refused);
        }
        let Ok(device) = std::fs::File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/userfaultfd")
        else {
            return Err(refused);
        };
        // SAFETY: USERFAULTFD_IOC_NEW takes the new fd's flags by value and returns it or -1.
        let raw = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                USERFAULTFD_IOC_NEW() as _,
                flags as libc::c_ulong,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// Creates a non-blocking userfaultfd that also sees faults taken inside the kernel (KVM).
    pub fn new() -> Result<Self, UffdError> {
        Self::with_feature(UFFD_FEATURE_THREAD_ID, UffdError::NoThreadId)
    }

    /// Creates a userfaultfd for a page-fault handler of another process (Firecracker's Uffd
    /// backend): non-blocking, seeing faults taken inside the kernel, and telling the handler
    /// of ranges the VMM removed (`remove` events, as Firecracker's asks).
    pub fn for_handler() -> Result<Self, UffdError> {
        Self::with_feature(UFFD_FEATURE_EVENT_REMOVE, UffdError::NoEventRemove)
    }

    /// A new userfaultfd with `feature`, or `missing` where the kernel lacks it.
    fn with_feature(feature: u64, missing: UffdError) -> Result<Self, UffdError> {
        let fd = Self::create().map_err(UffdError::Create)?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features: feature,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api`, which `api` is.
        check(unsafe { ioctl_with_mut_ref(&fd, UFFDIO_API(), &mut api) })
            .map_err(UffdError::Api)?;
        if api.features & feature == 0 {
            return Err(missing);
        }
        Ok(Self { fd })
    }

    /// Registers `[start, start + len)` for missing-page faults.
    pub fn register(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a `struct uffdio_register`, which `reg` is.
        check(unsafe { ioctl_with_mut_ref(&self.fd, UFFDIO_REGISTER(), &mut reg) })
            .map_err(|source| UffdError::Register { start, len, source })
    }

    /// Wakes the threads blocked on faults in `[start, start + len)`.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_WAKE reads a `struct uffdio_range`, which `range` is.
        check(unsafe { ioctl_with_ref(&self.fd, UFFDIO_WAKE(), &range) })
    }

    /// Resolves a fault on the 4 KiB page at `page` with the shared zero page and wakes the waiters.
    pub fn zero_page(&self, page: usize) -> io::Result<()> {
        let mut zp = UffdioZeropage {
            range: UffdioRange {
                start: page as u64,
                len: 4096,
            },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: UFFDIO_ZEROPAGE reads and writes a `struct uffdio_zeropage`, which `zp` is.
        match check(unsafe { ioctl_with_mut_ref(&self.fd, UFFDIO_ZEROPAGE(), &mut zp) }) {
            // EEXIST: the page is present already (another resolver won); the waiter retries.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    /// Reads pending page faults into `out` without blocking; returns how many were read.
    ///
    /// Events other than page faults (none are enabled) are skipped.
    pub fn read_faults(&self, out: &mut [UffdFault]) -> io::Result<usize> {
        const BATCH: usize = 16;
        let mut msgs = [UffdMsg::default(); BATCH];
        let want = out.len().min(BATCH);
        // SAFETY: `msgs` is writable memory of `want` messages; read() writes whole messages only.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr().cast(),
                want * size_of::<UffdMsg>(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock => Ok(0),
                _ => Err(err),
            };
        }
        let mut count = 0;
        for msg in &msgs[..n as usize / size_of::<UffdMsg>()] {
            if msg.event == UFFD_EVENT_PAGEFAULT {
                out[count] = UffdFault {
                    address: msg.address as usize,
                    tid: msg.ptid,
                    write: msg.flags & UFFD_PAGEFAULT_FLAG_WRITE != 0,
                };
                count += 1;
            }
        }
        Ok(count)
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uapi_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<UffdMsg>(), 32);
        // The numbers of linux/userfaultfd.h.
        assert_eq!(UFFDIO_API(), 0xc018_aa3f);
        assert_eq!(USERFAULTFD_IOC_NEW(), 0xaa00);
        assert_eq!(UFFDIO_REGISTER(), 0xc020_aa00);
        assert_eq!(UFFDIO_WAKE(), 0x8010_aa02);
        assert_eq!(UFFDIO_ZEROPAGE(), 0xc020_aa04);
    }

    #[test]
    fn fault_from_another_thread_is_reported_with_its_tid() {
        let uffd = Uffd::new().expect("userfaultfd");
        let len = 4096 * 4;
        let map = crate::sys::mmap::Mapping::anonymous(len, 4096).expect("mmap");
        uffd.register(map.addr(), len).expect("register");
        let addr = map.addr();
        let toucher = std::thread::spawn(move || {
            // SAFETY: the page lies in `map`, which outlives the thread (joined below).
            unsafe { std::ptr::read_volatile((addr + 4096) as *const u8) }
        });
        let mut faults = [UffdFault {
            address: 0,
            tid: 0,
            write: false,
        }; 4];
        let n = loop {
            let n = uffd.read_faults(&mut faults).expect("read");
            if n > 0 {
                break n;
            }
            std::thread::yield_now();
        };
        assert_eq!(n, 1);
        assert_eq!(faults[0].address, addr + 4096);
        assert!(!faults[0].write);
        assert_ne!(faults[0].tid, 0);
        uffd.zero_page(addr + 4096).expect("zeropage");
        assert_eq!(toucher.join().expect("join"), 0);
    }
}
