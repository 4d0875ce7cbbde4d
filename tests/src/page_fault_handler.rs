//! A page-fault handler for Firecracker's Uffd memory backend, as the tests run it: a thread
//! of the test process, written as Firecracker's example handlers are. It accepts the one VMM
//! that connects, takes the regions (JSON) and the userfaultfd from its one message, maps the
//! memory file and answers each fault with `UFFDIO_COPY` of the faulting page from the file.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::Value;
use vmm_sys_util::ioctl::ioctl_with_mut_ref;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// The userfaultfd ioctl the handler resolves faults with.
mod uffdio {
    use vmm_sys_util::ioctl_iowr_nr;

    /// The kernel's `struct uffdio_copy`.
    #[repr(C)]
    pub struct UffdioCopy {
        pub dst: u64,
        pub src: u64,
        pub len: u64,
        pub mode: u64,
        pub copy: i64,
    }

    ioctl_iowr_nr!(UFFDIO_COPY, 0xAA, 0x03, UffdioCopy);
}
use uffdio::{UffdioCopy, UFFDIO_COPY};

/// `UFFD_EVENT_PAGEFAULT`.
const EVENT_PAGEFAULT: u8 = 0x12;

/// A region of the handshake, as Firecracker's `GuestRegionUffdMapping`.
struct Region {
    base: u64,
    size: u64,
    offset: u64,
    page_size: u64,
}

/// What the handler saw.
#[derive(Debug, Default)]
pub struct Served {
    /// The regions the VMM described.
    pub regions: usize,
    /// The faults it answered.
    pub faults: u64,
    /// The page size of the first region.
    pub page_size: u64,
}

/// Serves the faults of the one VMM that connects to `listener` from `memory_file` until
/// `stop`; returns what it saw.
fn serve(listener: UnixListener, memory_file: String, stop: Arc<AtomicBool>) -> Served {
    let (stream, _) = listener.accept().expect("the VMM connects");
    let mut message = vec![0u8; 64 << 10];
    let (len, uffd) = stream.recv_with_fd(&mut message).expect("one message");
    let uffd = OwnedFd::from(uffd.expect("the userfaultfd comes with the regions"));
    let mappings: Value = serde_json::from_slice(&message[..len]).expect("JSON regions");
    let regions: Vec<Region> = mappings
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| Region {
            base: r["base_host_virt_addr"].as_u64().unwrap(),
            size: r["size"].as_u64().unwrap(),
            offset: r["offset"].as_u64().unwrap(),
            page_size: r["page_size"].as_u64().unwrap(),
        })
        .collect();
    assert_eq!(mappings[0]["page_size_kib"], mappings[0]["page_size"]);
    let file = std::fs::File::open(&memory_file).unwrap();
    let file_len = file.metadata().unwrap().len() as usize;
    // SAFETY: a fresh read-only private mapping of the whole file.
    let backing = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            file_len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(backing, libc::MAP_FAILED);
    let mut served = Served {
        regions: regions.len(),
        page_size: regions[0].page_size,
        ..Served::default()
    };
    while !stop.load(Ordering::Relaxed) {
        let mut poll = libc::pollfd {
            fd: uffd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut poll, 1, 100) } <= 0 {
            continue;
        }
        let mut msg = [0u8; 32];
        // SAFETY: reads at most 32 bytes into `msg`.
        let got = unsafe { libc::read(uffd.as_raw_fd(), msg.as_mut_ptr().cast(), 32) };
        if got != 32 || msg[0] != EVENT_PAGEFAULT {
            continue;
        }
        let address = u64::from_ne_bytes(msg[16..24].try_into().unwrap());
        let region = regions
            .iter()
            .find(|r| (r.base..r.base + r.size).contains(&address))
            .expect("a fault inside the regions");
        let page = address & !(region.page_size - 1);
        let mut copy = UffdioCopy {
            dst: page,
            src: backing as u64 + region.offset + (page - region.base),
            len: region.page_size,
            mode: 0,
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY reads and writes a `struct uffdio_copy`; the source is inside
        // the file's mapping, the destination a registered page of the VMM's.
        let done = unsafe { ioctl_with_mut_ref(&uffd, UFFDIO_COPY(), &mut copy) };
        let error = std::io::Error::last_os_error().raw_os_error();
        // EEXIST: another fault on the page was answered first.
        assert!(done >= 0 || error == Some(libc::EEXIST), "{error:?}");
        served.faults += 1;
    }
    served
}

/// A handler serving faults on its own thread.
#[derive(Debug)]
pub struct PageFaultHandler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Served>,
}

impl PageFaultHandler {
    /// Listens on `socket` and serves the faults of the VMM that connects from `memory_file`.
    pub fn listen(socket: &str, memory_file: &str) -> Self {
        let listener = UnixListener::bind(socket).expect("bind the handler's socket");
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, memory_file) = (Arc::clone(&stop), memory_file.to_owned());
            std::thread::spawn(move || serve(listener, memory_file, stop))
        };
        PageFaultHandler { stop, thread }
    }

    /// Stops serving (once the VMM is gone) and says what was served.
    pub fn finish(self) -> Served {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the handler thread")
    }
}
