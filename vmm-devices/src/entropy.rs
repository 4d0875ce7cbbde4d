//! The virtio-rng entropy device (virtio 1.2 §5.4; Firecracker's `PUT /entropy`): the guest
//! makes buffers available on its one queue, and the device fills them with random bytes from
//! the host's `getrandom(2)` (Linux: `/dev/hwrng`, and the kernel's entropy pool).
//!
//! A rate limiter (Firecracker's, see [`crate::rate_limiter`]) may cap the bytes and
//! requests: a request the buckets cannot pay for stays in the queue, and the device takes it
//! up again when its timer says they can.
//!
//! Everything the guest writes is checked: only device-writable buffers are filled, at most
//! [`MAX_BYTES_PER_REQUEST`] per request (a hostile 4 GiB chain costs no more than that), and a
//! buffer outside guest memory or a device-readable one ends the request there; such requests
//! are counted as warnings (rate-limited).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use guest_mem::GuestMemory;
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_queue::DescriptorChain;
use vm_memory::Bytes;

use crate::rate_limiter::{RateLimiterConfig, Throttle};
use crate::virtio::request_queue::Served;
use crate::virtio::throttled::{ThrottledDevice, ThrottledQueue};
use crate::virtio::DeviceMemory;
use crate::GuestWarnings;

/// Most random bytes one request gets (Linux asks for at most a few dozen at a time).
pub const MAX_BYTES_PER_REQUEST: u32 = 64 << 10;
/// Bytes asked of `getrandom` at a time.
const CHUNK: u32 = 4096;

/// What the control API and the metrics see of the device: the random bytes it gave.
#[derive(Debug, Clone, Default)]
pub struct EntropyHandle {
    bytes: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    host_failures: Arc<AtomicU64>,
    throttled: Arc<AtomicU64>,
}

impl EntropyHandle {
    /// Times the rate limiter made a request wait.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Random bytes given to the guest so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Times the host's `getrandom` failed.
    pub fn host_failures(&self) -> u64 {
        self.host_failures.load(Ordering::Relaxed)
    }
}

/// A virtio-rng device.
#[derive(Debug)]
pub struct Entropy {
    queue: ThrottledQueue,
    warnings: GuestWarnings,
    handle: EntropyHandle,
}

/// Fills `buffer` from the host's `getrandom`.
pub fn host_random(buffer: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buffer.len() {
        let rest = &mut buffer[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`, which is valid and
        // writable for that long.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(got) {
            Ok(got) => filled += got,
            Err(_) => {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
    Ok(())
}

impl Entropy {
    /// A device whose queue lives in `memory`, its bytes and requests capped by `limiter`.
    pub fn new(memory: DeviceMemory, limiter: RateLimiterConfig) -> std::io::Result<Self> {
        Ok(Self {
            queue: ThrottledQueue::new(memory, Throttle::new(limiter, "virtio-rng")?),
            warnings: GuestWarnings::default(),
            handle: EntropyHandle::default(),
        })
    }

    /// The bytes `chain` asks for: its writable buffers, at most [`MAX_BYTES_PER_REQUEST`].
    fn asked(chain: &DescriptorChain<&GuestMemory>) -> u32 {
        chain
            .clone()
            .take_while(|desc| desc.is_write_only())
            .fold(0u32, |sum, desc| sum.saturating_add(desc.len()))
            .min(MAX_BYTES_PER_REQUEST)
    }

    /// The device's handle, for the control API and the metrics.
    pub fn handle(&self) -> EntropyHandle {
        self.handle.clone()
    }

    /// Fills the writable buffers of one request; returns the bytes written.
    fn fill(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
        let mut written: u32 = 0;
        let mut random = [0u8; CHUNK as usize];
        for desc in chain {
            if !desc.is_write_only() {
                self.warnings.warn(format_args!(
                    "virtio-rng: a request has a device-readable buffer"
                ));
                break;
            }
            let mut at = desc.addr();
            let mut left = desc.len().min(MAX_BYTES_PER_REQUEST - written);
            while left > 0 {
                let n = CHUNK.min(left);
                let random = &mut random[..n as usize];
                if let Err(e) = host_random(random) {
                    self.handle.host_failures.fetch_add(1, Ordering::Relaxed);
                    log::error!("virtio-rng: the host's getrandom failed: {e}");
                    return written;
                }
                if mem.write_slice(random, at).is_err() {
                    self.warnings
                        .warn(format_args!("virtio-rng: a buffer is not in guest memory"));
                    return written;
                }
                written += n;
                left -= n;
                at = vm_memory::GuestAddress(at.0.wrapping_add(u64::from(n)));
            }
            if written == MAX_BYTES_PER_REQUEST {
                break;
            }
        }
        self.handle
            .bytes
            .fetch_add(u64::from(written), Ordering::Relaxed);
        self.handle.requests.fetch_add(1, Ordering::Relaxed);
        written
    }
}

impl ThrottledDevice for Entropy {
    const NAME: &'static str = "virtio-rng";
    const TYPE: u32 = VIRTIO_ID_RNG;
    const QUEUE_SIZES: &'static [u16] = &[256];

    fn config_read(&self, _offset: u64, data: &mut [u8]) {
        // No config space.
        data.fill(0);
    }

    fn config_write(&mut self, offset: u64) {
        self.warnings.warn(format_args!(
            "virtio-rng: write to the config space it does not have, at {offset}"
        ));
    }

    fn queue(&self) -> &ThrottledQueue {
        &self.queue
    }

    fn queue_mut(&mut self) -> &mut ThrottledQueue {
        &mut self.queue
    }

    fn warnings(&self) -> &GuestWarnings {
        &self.warnings
    }

    /// Fills the request's buffers if the rate limiter lets it through.
    fn serve(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> Served {
        if !self
            .queue
            .throttle()
            .admit(|| u64::from(Self::asked(&chain)))
        {
            self.handle.throttled.fetch_add(1, Ordering::Relaxed);
            return Served::Deferred;
        }
        Served::Answered(self.fill(mem, chain))
    }
}

#[cfg(test)]
mod tests;
