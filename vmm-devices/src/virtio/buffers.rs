//! [`Buffers`]: the host side of a descriptor chain's buffers, checked once, as iovecs that
//! `readv`/`writev` fill or drain straight from guest memory (virtio-net, virtio-vsock).
//!
//! Built on the stack for one chain and dropped with it: no allocation on the data path.

use guest_mem::GuestMemory;
use virtio_queue::DescriptorChain;
use vm_memory::bitmap::Bitmap;
use vm_memory::GuestMemoryBackend;

/// The host side of a guest buffer: where, how long.
pub type Iovec = libc::iovec;

/// Most pieces a chain may have (Linux's virtio-net uses at most 19).
pub const MAX_BUFFERS: usize = 64;

/// Why a chain's buffers cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BufferError {
    /// A buffer the device should write is device-readable, or the reverse.
    #[error(
        "a buffer goes the wrong way (device-readable where writable is needed, or the reverse)"
    )]
    WrongDirection,
    /// A buffer lies outside guest memory.
    #[error("a buffer is not in guest memory")]
    NotInMemory,
    /// More than [`MAX_BUFFERS`] pieces.
    #[error("a chain is in more than 64 pieces")]
    TooManyPieces,
    /// Longer than the device takes.
    #[error("a chain is longer than the device takes")]
    TooLong,
}

/// The buffers of one chain.
#[derive(Debug)]
pub struct Buffers {
    iovecs: [Iovec; MAX_BUFFERS],
    count: usize,
    len: usize,
}

impl Default for Buffers {
    fn default() -> Self {
        Buffers {
            iovecs: [Iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_BUFFERS],
            count: 0,
            len: 0,
        }
    }
}

impl Buffers {
    /// The buffers of `chain`: all device-writable (`writable`) or all device-readable, inside
    /// guest memory, in at most [`MAX_BUFFERS`] pieces. Past `max_len` bytes a writable chain
    /// is cut there (the device writes no more), a readable one refused.
    pub fn gather(
        mem: &GuestMemory,
        chain: DescriptorChain<&GuestMemory>,
        writable: bool,
        max_len: usize,
    ) -> Result<Self, BufferError> {
        let mut buffers = Buffers::default();
        for desc in chain {
            if desc.is_write_only() != writable {
                return Err(BufferError::WrongDirection);
            }
            let mut want = desc.len() as usize;
            if buffers.len + want > max_len {
                if !writable {
                    return Err(BufferError::TooLong);
                }
                want = max_len - buffers.len;
            }
            for slice in mem.get_slices(desc.addr(), want) {
                let slice = slice.map_err(|_| BufferError::NotInMemory)?;
                if writable {
                    // The host writes it behind vm-memory's back: dirty from now on (for diff
                    // snapshots; nothing where no dirty pages are tracked).
                    slice.bitmap().mark_dirty(0, slice.len());
                }
                let iovec = buffers
                    .iovecs
                    .get_mut(buffers.count)
                    .ok_or(BufferError::TooManyPieces)?;
                *iovec = Iovec {
                    iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                    iov_len: slice.len(),
                };
                buffers.count += 1;
            }
            buffers.len += want;
            if buffers.len == max_len {
                break;
            }
        }
        Ok(buffers)
    }

    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The iovecs, for `readv`/`writev` while the guest memory they came from is held.
    pub fn iovecs(&self) -> &[Iovec] {
        &self.iovecs[..self.count]
    }

    /// The buffers from byte `at` on (empty past the end).
    pub fn from(&self, mut at: usize) -> Buffers {
        let mut rest = Buffers::default();
        for iovec in self.iovecs() {
            if at >= iovec.iov_len {
                at -= iovec.iov_len;
                continue;
            }
            rest.iovecs[rest.count] = Iovec {
                // SAFETY: `at` is inside this buffer.
                iov_base: unsafe { iovec.iov_base.cast::<u8>().add(at).cast() },
                iov_len: iovec.iov_len - at,
            };
            rest.len += iovec.iov_len - at;
            rest.count += 1;
            at = 0;
        }
        rest
    }

    /// The first `len` bytes of the buffers (all of them if they are shorter).
    pub fn first(&self, len: usize) -> Buffers {
        let mut first = Buffers::default();
        for iovec in self.iovecs() {
            let take = iovec.iov_len.min(len - first.len);
            if take == 0 {
                break;
            }
            first.iovecs[first.count] = Iovec {
                iov_base: iovec.iov_base,
                iov_len: take,
            };
            first.count += 1;
            first.len += take;
        }
        first
    }

    /// Writes `value` at byte `at` (as much of it as the buffers hold).
    pub fn write_at(&self, at: usize, value: &[u8]) {
        let mut value = value.iter();
        for iovec in self.from(at).iovecs() {
            for offset in 0..iovec.iov_len {
                let Some(&byte) = value.next() else {
                    return;
                };
                // SAFETY: the iovec is the host side of a guest buffer that `gather` checked is
                // in guest memory, which the caller holds mapped; `offset` is inside it.
                unsafe { iovec.iov_base.cast::<u8>().add(offset).write_volatile(byte) };
            }
        }
    }

    /// Reads `out.len()` bytes at byte `at`; how many there were.
    pub fn read_at(&self, at: usize, out: &mut [u8]) -> usize {
        let mut read = 0;
        for iovec in self.from(at).iovecs() {
            for offset in 0..iovec.iov_len {
                let Some(byte) = out.get_mut(read) else {
                    return read;
                };
                // SAFETY: as in `write_at`, for a read.
                *byte = unsafe { iovec.iov_base.cast::<u8>().add(offset).read_volatile() };
                read += 1;
            }
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::virtio::request_queue::testing::{self, add_chain};

    #[test]
    fn a_chain_is_checked_once_and_read_and_written_across_its_pieces() {
        let memory = testing::memory(4 << 20);
        let mock = virtio_queue::mock::MockSplitQueue::create(&*memory, GuestAddress(0), 16);
        let mut queue: virtio_queue::Queue = mock.create_queue().unwrap();
        use virtio_queue::QueueOwnedT;
        add_chain(&mock, 0, 0, &[(0x10000, 3, true), (0x20000, 5, true)]);
        add_chain(&mock, 2, 1, &[(0x10000, 3, true), (0x20000, 5, false)]);
        add_chain(&mock, 4, 2, &[(0x10000, 3, true), (64 << 20, 5, true)]);
        let mem = &*memory;
        let chain = queue.iter(mem).unwrap().next().unwrap();
        let buffers = Buffers::gather(mem, chain, true, 7).unwrap();
        assert_eq!(buffers.len(), 7, "cut at the limit");
        buffers.write_at(1, b"abcdefgh");
        let mut first = [0u8; 3];
        memory
            .read_slice(&mut first, GuestAddress(0x10000))
            .unwrap();
        assert_eq!(&first, b"\0ab");
        let mut second = [0u8; 5];
        memory
            .read_slice(&mut second, GuestAddress(0x20000))
            .unwrap();
        assert_eq!(&second, b"cdef\0");
        let mut back = [0u8; 10];
        assert_eq!(buffers.read_at(2, &mut back), 5);
        assert_eq!(&back[..5], b"bcdef");
        assert_eq!(buffers.from(5).len(), 2);
        assert_eq!(buffers.from(1).first(4).len(), 4);
        assert_eq!(buffers.from(1).first(4).iovecs().len(), 2);
        assert_eq!(buffers.first(100).len(), 7);
        assert!(buffers.from(9).is_empty());
        let mut chains = queue.iter(mem).unwrap();
        assert_eq!(
            Buffers::gather(mem, chains.next().unwrap(), true, 100).unwrap_err(),
            BufferError::WrongDirection
        );
        assert_eq!(
            Buffers::gather(mem, chains.next().unwrap(), true, 100).unwrap_err(),
            BufferError::NotInMemory
        );
    }
}
