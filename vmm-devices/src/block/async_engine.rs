//! Firecracker's `Async` I/O engine for virtio-blk: each request's reads, writes and flushes go
//! to an io_uring, straight between the image and guest memory, and the event loop goes on
//! while the kernel works; an eventfd registered with the ring says when operations finished.
//!
//! The ring serves reads, writes and `fdatasync`s and nothing else: it is set up disabled,
//! restricted to those operations (io_uring's restrictions, which no later call can lift), then
//! enabled, so that a thread allowed to submit to it cannot make it open or send anything.
//!
//! Nothing is allocated per request: the operations in flight live in a table of fixed size
//! (twice the queue's, so that a request whose buffers cross a region boundary still fits), and
//! a request that finds too little room waits in the queue until operations finish. A short
//! transfer (the kernel may move fewer bytes than asked) is sent again for the rest.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::register::Restriction;
use io_uring::{opcode, types, IoUring, Probe};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Errors of setting up the engine.
#[derive(Debug, thiserror::Error)]
pub enum AsyncEngineError {
    /// The kernel refused an io_uring (too old, or `kernel.io_uring_disabled`).
    #[error("cannot set up an io_uring (io_engine Async needs Linux 5.10 or later): {0}")]
    Setup(io::Error),
    /// The kernel's io_uring lacks an operation the engine needs.
    #[error(
        "the kernel's io_uring lacks the {0} operation (io_engine Async needs Linux 5.10 or later)"
    )]
    Unsupported(&'static str),
    /// The completion eventfd could not be made or registered.
    #[error("cannot register the io_uring's completion eventfd: {0}")]
    Eventfd(io::Error),
    /// The ring could not be restricted to its operations, or enabled.
    #[error("cannot restrict the io_uring to reads, writes and syncs (Linux 5.10 or later): {0}")]
    Restrict(io::Error),
}

/// What an operation does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Transfer {
    /// Reads from the image into guest memory.
    #[default]
    Read,
    /// Writes guest memory to the image.
    Write,
    /// Makes the image's data durable (`fdatasync`).
    Sync,
}

/// One operation in flight: a piece of a request.
#[derive(Clone, Copy, Debug, Default)]
struct Operation {
    /// The request's descriptor head.
    request: u16,
    transfer: Transfer,
    /// Where in the VMM's mapping of guest memory the bytes go or come from.
    host_addr: usize,
    len: u32,
    /// Where in the image.
    offset: u64,
    /// The image's descriptor.
    fd: RawFd,
}

/// An operation that finished: the request it belongs to, and whether it failed.
pub type Finished = (u16, io::Result<()>);

/// An io_uring with a fixed table of operations in flight.
pub struct AsyncEngine {
    ring: IoUring,
    completions: EventFd,
    operations: Box<[Operation]>,
    /// Indices of the free entries of `operations`.
    free: Vec<u16>,
    /// Operations pushed but not yet submitted to the kernel.
    unsubmitted: bool,
}

impl std::fmt::Debug for AsyncEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEngine")
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl AsyncEngine {
    /// An engine of room for `operations` operations at once (at most `u16::MAX`).
    pub fn new(operations: u16) -> Result<Self, AsyncEngineError> {
        let ring = IoUring::builder()
            .setup_r_disabled()
            .build(u32::from(operations).next_power_of_two())
            .map_err(AsyncEngineError::Setup)?;
        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(AsyncEngineError::Setup)?;
        for (code, name) in [
            (opcode::Read::CODE, "read"),
            (opcode::Write::CODE, "write"),
            (opcode::Fsync::CODE, "fsync"),
        ] {
            if !probe.is_supported(code) {
                return Err(AsyncEngineError::Unsupported(name));
            }
        }
        let completions = EventFd::new(EFD_NONBLOCK).map_err(AsyncEngineError::Eventfd)?;
        ring.submitter()
            .register_eventfd(completions.as_raw_fd())
            .map_err(AsyncEngineError::Eventfd)?;
        let mut allowed = [
            Restriction::sqe_op(opcode::Read::CODE),
            Restriction::sqe_op(opcode::Write::CODE),
            Restriction::sqe_op(opcode::Fsync::CODE),
        ];
        ring.submitter()
            .register_restrictions(&mut allowed)
            .and_then(|()| ring.submitter().register_enable_rings())
            .map_err(AsyncEngineError::Restrict)?;
        Ok(Self {
            ring,
            completions,
            operations: vec![Operation::default(); usize::from(operations)].into_boxed_slice(),
            free: (0..operations).rev().collect(),
            unsubmitted: false,
        })
    }

    /// The descriptor that becomes readable when operations finish.
    pub fn completion_fd(&self) -> RawFd {
        self.completions.as_raw_fd()
    }

    /// Room for this many more operations.
    pub fn room(&self) -> usize {
        self.free.len()
    }

    /// Operations in flight.
    pub fn in_flight(&self) -> usize {
        self.operations.len() - self.free.len()
    }

    /// Reads `len` bytes at `offset` of the image `fd` to `host_addr` for `request`; the
    /// caller made sure of [`Self::room`], and the memory stays mapped until it finished.
    pub fn read(&mut self, request: u16, fd: RawFd, host_addr: usize, len: u32, offset: u64) {
        self.push(Operation {
            request,
            transfer: Transfer::Read,
            host_addr,
            len,
            offset,
            fd,
        });
    }

    /// Writes `len` bytes at `host_addr` to `offset` of the image `fd` for `request`; as
    /// [`Self::read`].
    pub fn write(&mut self, request: u16, fd: RawFd, host_addr: usize, len: u32, offset: u64) {
        self.push(Operation {
            request,
            transfer: Transfer::Write,
            host_addr,
            len,
            offset,
            fd,
        });
    }

    /// Makes the data written to the image `fd` durable for `request`; as [`Self::read`].
    pub fn sync(&mut self, request: u16, fd: RawFd) {
        self.push(Operation {
            request,
            transfer: Transfer::Sync,
            fd,
            ..Operation::default()
        });
    }

    /// Takes a free entry for `operation` and queues it for the kernel.
    fn push(&mut self, operation: Operation) {
        let Some(index) = self.free.pop() else {
            // The callers check the room first: losing an operation would lose a request.
            unreachable!("an io_uring operation pushed without room");
        };
        self.operations[usize::from(index)] = operation;
        self.queue(index);
    }

    /// Puts the operation at `index` in the submission queue.
    fn queue(&mut self, index: u16) {
        let op = &self.operations[usize::from(index)];
        let fd = types::Fd(op.fd);
        let entry = match op.transfer {
            Transfer::Read => opcode::Read::new(fd, op.host_addr as *mut u8, op.len)
                .offset(op.offset)
                .build(),
            Transfer::Write => opcode::Write::new(fd, op.host_addr as *const u8, op.len)
                .offset(op.offset)
                .build(),
            Transfer::Sync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        }
        .user_data(u64::from(index));
        // SAFETY: the entry's buffer is guest memory the VMM keeps mapped while the VM lives
        // (the caller's promise), its fd the image the device holds until every operation
        // finished; the submission queue has an entry for every operation in the table (the
        // ring is at least that large), so a push never fails.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        debug_assert!(
            pushed.is_ok(),
            "the submission queue is as large as the table"
        );
        self.unsubmitted = true;
    }

    /// Hands the queued operations to the kernel.
    pub fn submit(&mut self) -> io::Result<()> {
        if self.unsubmitted {
            self.ring.submit()?;
            self.unsubmitted = false;
        }
        Ok(())
    }

    /// Collects the finished operations: each request piece that finished goes to `finished`
    /// (a short transfer is queued again for the rest instead); then submits what was queued
    /// again. With `wait`, blocks until every operation in flight finished.
    pub fn collect(&mut self, wait: bool, mut finished: impl FnMut(Finished)) -> io::Result<()> {
        // The eventfd only says "look"; the completion queue says what finished.
        let _ = self.completions.read();
        loop {
            let mut done = 0;
            while let Some(entry) = self.next_completion() {
                done += 1;
                let Ok(index) = u16::try_from(entry.user_data()) else {
                    continue;
                };
                if let Some(result) = self.finish(index, entry.result()) {
                    self.free.push(index);
                    finished((self.operations[usize::from(index)].request, result));
                }
            }
            self.submit()?;
            if !wait || self.in_flight() == 0 {
                return Ok(());
            }
            if done == 0 {
                self.ring.submit_and_wait(1)?;
            }
        }
    }

    /// The oldest completion not collected yet.
    fn next_completion(&mut self) -> Option<io_uring::cqueue::Entry> {
        self.ring.completion().next()
    }

    /// The outcome of the operation at `index`, which the kernel answered with `result`, or
    /// `None` if the rest of a short transfer was queued again.
    fn finish(&mut self, index: u16, result: i32) -> Option<io::Result<()>> {
        let op = self.operations.get_mut(usize::from(index))?;
        let moved = match u32::try_from(result) {
            Err(_) => return Some(Err(io::Error::from_raw_os_error(-result))),
            Ok(moved) => moved,
        };
        if op.transfer == Transfer::Sync || moved >= op.len {
            return Some(Ok(()));
        }
        if moved == 0 {
            return Some(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the image ended before the transfer did",
            )));
        }
        op.host_addr += moved as usize;
        op.offset += u64::from(moved);
        op.len -= moved;
        self.queue(index);
        None
    }
}

impl Drop for AsyncEngine {
    /// Waits for what is in flight: the kernel must not write into memory the VMM may reuse.
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            if let Err(e) = self.collect(true, |_| {}) {
                log::error!("virtio-blk: cannot wait for the io_uring's operations: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;

    use super::*;

    use vmm_sys_util::tempfile::TempFile;

    /// A file of `bytes`, removed when dropped.
    fn image(bytes: &[u8]) -> TempFile {
        let file = TempFile::new().unwrap();
        file.as_file().write_all(bytes).unwrap();
        file
    }

    fn collect_all(engine: &mut AsyncEngine) -> Vec<Finished> {
        let mut finished = Vec::new();
        engine.collect(true, |f| finished.push(f)).unwrap();
        finished
    }

    #[test]
    fn reads_writes_and_syncs_the_image_through_the_ring() {
        let image = image(&[7u8; 8192]);
        let mut file = image.as_file();
        let mut engine = AsyncEngine::new(4).unwrap();
        let mut buffer = vec![0u8; 4096];
        let source = vec![9u8; 4096];
        engine.read(
            3,
            file.as_raw_fd(),
            buffer.as_mut_ptr() as usize,
            4096,
            4096,
        );
        engine.write(5, file.as_raw_fd(), source.as_ptr() as usize, 4096, 0);
        engine.sync(5, file.as_raw_fd());
        assert_eq!(engine.room(), 1);
        engine.submit().unwrap();
        let mut finished = collect_all(&mut engine);
        finished.sort_by_key(|(request, _)| *request);
        assert_eq!(finished.len(), 3);
        assert!(finished.iter().all(|(_, result)| result.is_ok()));
        assert_eq!(
            finished.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            [3, 5, 5]
        );
        assert_eq!(engine.in_flight(), 0);
        assert_eq!(engine.room(), 4);
        assert!(buffer.iter().all(|&b| b == 7));
        let mut back = vec![0u8; 4096];
        file.seek(SeekFrom::Start(0)).unwrap();
        file.read_exact(&mut back).unwrap();
        assert!(back.iter().all(|&b| b == 9));
    }

    #[test]
    fn a_read_past_the_end_of_the_image_fails_and_frees_its_entry() {
        let image = image(&[1u8; 512]);
        let file = image.as_file();
        let mut engine = AsyncEngine::new(2).unwrap();
        let mut buffer = vec![0u8; 1024];
        // 512 bytes come, then the rest is sent again and finds the end.
        engine.read(1, file.as_raw_fd(), buffer.as_mut_ptr() as usize, 1024, 0);
        engine.submit().unwrap();
        let finished = collect_all(&mut engine);
        assert_eq!(finished.len(), 1);
        let error = finished[0].1.as_ref().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(engine.room(), 2);
        assert!(buffer[..512].iter().all(|&b| b == 1));
    }

    #[test]
    fn the_ring_refuses_operations_other_than_reads_writes_and_syncs() {
        let mut engine = AsyncEngine::new(1).unwrap();
        let path = c"/";
        let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
            .build()
            .user_data(0);
        // SAFETY: the path is a static C string; the entry is refused before it is read.
        unsafe { engine.ring.submission().push(&open).unwrap() };
        engine.ring.submit_and_wait(1).unwrap();
        let result = engine.next_completion().unwrap().result();
        assert_eq!(result, -libc::EACCES);
        // Nor can the restrictions be changed.
        let mut more = [Restriction::sqe_op(opcode::OpenAt::CODE)];
        assert!(engine
            .ring
            .submitter()
            .register_restrictions(&mut more)
            .is_err());
    }

    #[test]
    fn an_operation_on_a_bad_descriptor_fails_with_the_kernels_error() {
        let mut engine = AsyncEngine::new(1).unwrap();
        engine.sync(0, -1);
        engine.submit().unwrap();
        let finished = collect_all(&mut engine);
        let error = finished[0].1.as_ref().unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EBADF));
    }
}
