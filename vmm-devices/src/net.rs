//! The virtio-net device (virtio 1.2 §5.1; Firecracker's `PUT /network-interfaces/{iface_id}`)
//! over a host tap ([`tap::Tap`]).
//!
//! Frames move between the tap and the guest's buffers without a copy in the VMM: a frame the
//! guest sends is gathered straight from its buffers by one `writev`, and a frame for the guest
//! is read by one `readv` into the buffers it made available. The 12-byte virtio-net header
//! travels with each frame, so the checksum and segmentation offloads Firecracker negotiates
//! (`CSUM`, `GUEST_CSUM`, TSO and UFO both ways) are the tap's: Linux's checks of a header
//! the guest wrote run in the host kernel (a bad one fails the write, counted and dropped),
//! and what the tap hands the guest follows the features its driver took (`TUNSETOFFLOAD`).
//! Without `MRG_RXBUF` a driver that takes the TSO features posts 64 KiB receive buffers,
//! as Linux does.
//!
//! The tap is watched edge-triggered: the device reads until it would block, or notes that it
//! stopped for want of buffers (and reads on when the driver adds some). Rate limiters
//! (Firecracker's token buckets, [`crate::rate_limiter`]) cap each direction: a frame
//! to send waits in its queue, and a frame received waits in the guest's buffer, until the
//! buckets can pay for it; a timer the event loop watches takes it up again.
//!
//! Everything the guest writes is checked: a frame to send is device-readable buffers of at
//! least a header and at most [`MAX_FRAME`] bytes in at most
//! [`MAX_BUFFERS`](crate::virtio::buffers::MAX_BUFFERS) pieces inside
//! guest memory; a receive buffer is device-writable and long enough for a header. Anything
//! else is returned unused and counted as a warning (rate-limited).

pub mod config;
pub mod tap;

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guest_mem::GuestMemory;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_GUEST_UFO, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_HOST_UFO,
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MTU,
};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueState, QueueT};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::timerfd::TimerFd;

use crate::mmds::stack::Stack;
use crate::mmds::Mmds;
use crate::rate_limiter::{RateLimiter, RateLimiterConfig};
use crate::virtio::buffers::{BufferError, Buffers};
use crate::virtio::request_queue::read_config;
use crate::virtio::DeviceMemory;
use crate::virtio::{ActivateError, Activation, DeviceState, Interrupt, VirtioDevice, WakeSource};
use crate::GuestWarnings;
use config::{MacAddr, NetConfig};
use tap::{Tap, TapError};

/// The virtio 1.x header before each frame (`struct virtio_net_hdr_v1`).
pub const HEADER_SIZE: usize = 12;
/// Longest frame the guest may send, header included: a 64 KiB TSO segment with its Ethernet
/// and VLAN headers (Firecracker's limit).
pub const MAX_FRAME: usize = HEADER_SIZE + 65550;
/// Size of each queue.
const QUEUE_SIZES: [u16; 2] = [256, 256];
/// The offloads offered, as Firecracker's.
const OFFLOADS: [u32; 8] = [
    VIRTIO_NET_F_CSUM,
    VIRTIO_NET_F_GUEST_CSUM,
    VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_GUEST_UFO,
    VIRTIO_NET_F_HOST_TSO4,
    VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_HOST_UFO,
];
/// The receive queue.
const RX: u16 = 0;
/// The transmit queue.
const TX: u16 = 1;
/// Where the header's `num_buffers` is.
const NUM_BUFFERS_AT: usize = 10;

/// The wake sources, in [`VirtioDevice::wake_sources`] order.
const WAKE_TAP: usize = 0;
const WAKE_RX_TIMER: usize = 1;
const WAKE_TX_TIMER: usize = 2;
/// MMDS's stack must run (a retransmission, a connection that timed out).
const WAKE_MMDS_TIMER: usize = 3;

/// Errors of creating a device.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The tap could not be opened.
    #[error(transparent)]
    Tap(#[from] TapError),
    /// A rate limiter's timer could not be made.
    #[error("a rate limiter's timer: {0}")]
    Timer(#[source] io::Error),
}

/// Firecracker's `net` metrics of one interface.
#[derive(Debug, Default)]
pub struct NetCounters {
    /// Bytes the guest received (headers left out).
    pub rx_bytes: AtomicU64,
    /// Frames the guest received.
    pub rx_packets: AtomicU64,
    /// Frames read from the tap that the guest's buffers could not take whole.
    pub rx_fails: AtomicU64,
    /// Times the receive rate limiter made a frame wait.
    pub rx_rate_limiter_throttled: AtomicU64,
    /// Bytes the guest sent (headers left out).
    pub tx_bytes: AtomicU64,
    /// Frames the guest sent.
    pub tx_packets: AtomicU64,
    /// Frames the tap refused (a bad header, a full queue).
    pub tx_fails: AtomicU64,
    /// Frames whose buffers broke the rules, returned unsent.
    pub tx_malformed_frames: AtomicU64,
    /// Times the transmit rate limiter made a frame wait.
    pub tx_rate_limiter_throttled: AtomicU64,
    /// Receive buffers that broke the rules, returned unused.
    pub rx_malformed_buffers: AtomicU64,
}

/// What the control API and the metrics keep of a device.
#[derive(Debug, Clone)]
pub struct NetHandle {
    /// The interface's id.
    pub id: String,
    /// Its counters.
    pub counters: Arc<NetCounters>,
    device: Arc<Mutex<NetDevice>>,
}

impl NetHandle {
    /// Replaces the rate limiters given (Firecracker's `PATCH /network-interfaces/{id}`); the
    /// new buckets start full.
    pub fn update_rate_limiters(
        &self,
        rx: Option<RateLimiterConfig>,
        tx: Option<RateLimiterConfig>,
    ) {
        self.device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .set_rate_limiters(rx, tx);
    }

    /// The receive and transmit limiters as the API last set them.
    pub fn rate_limiters(&self) -> (RateLimiterConfig, RateLimiterConfig) {
        self.device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .limiter_configs
    }
}

/// The queues of an active device.
#[derive(Debug)]
struct NetQueues {
    rx: Queue,
    tx: Queue,
    interrupt: Arc<Interrupt>,
}

/// A frame read into the guest's buffers that waits for the receive rate limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Deferred {
    head: u16,
    len: u32,
}

/// A virtio-net device.
#[derive(Debug)]
pub struct NetDevice {
    memory: DeviceMemory,
    id: String,
    tap: Tap,
    mac: Option<MacAddr>,
    mtu: Option<u16>,
    active: Option<NetQueues>,
    rx_limiter: RateLimiter,
    tx_limiter: RateLimiter,
    /// The limiters' configurations, as the API last set them.
    limiter_configs: (RateLimiterConfig, RateLimiterConfig),
    rx_timer: TimerFd,
    tx_timer: TimerFd,
    /// The receive limiter's timer is armed: nothing is read until it fires.
    rx_throttled: bool,
    /// The transmit limiter's timer is armed.
    tx_throttled: bool,
    /// A frame in the guest's buffers, not yet used.
    deferred: Option<Deferred>,
    counters: Arc<NetCounters>,
    warnings: GuestWarnings,
    /// MMDS, if it answers on this interface: the guest's frames to it go there, not to the
    /// tap.
    mmds: Option<Stack>,
    /// Expires when MMDS's stack must run though the guest sends nothing.
    mmds_timer: TimerFd,
}

/// The buffers of a frame's chain (`writable`: to receive into), at least a header long.
fn frame_buffers(
    mem: &GuestMemory,
    chain: DescriptorChain<&GuestMemory>,
    writable: bool,
) -> Result<Buffers, &'static str> {
    let buffers = Buffers::gather(mem, chain, writable, MAX_FRAME).map_err(|e| match e {
        BufferError::WrongDirection if writable => "a device-readable buffer",
        BufferError::WrongDirection => "a device-writable buffer",
        BufferError::NotInMemory => "a buffer outside guest memory",
        BufferError::TooManyPieces => "more than 64 pieces",
        BufferError::TooLong => "longer than 64 KiB",
    })?;
    if buffers.len() < HEADER_SIZE {
        return Err("shorter than the 12-byte header");
    }
    Ok(buffers)
}

/// Puts `used` (head, bytes written) into `queue`'s used ring; false (and a warning for
/// interface `id`) when the ring is not in guest memory.
fn give_back(
    queue: &mut Queue,
    mem: &GuestMemory,
    (head, len): (u16, u32),
    warnings: &GuestWarnings,
    id: &str,
) -> bool {
    let done = queue.add_used(mem, head, len).is_ok();
    if !done {
        warnings.warn(format_args!(
            "virtio-net {id}: a used ring is not in guest memory"
        ));
    }
    done
}

/// Whether the frame in `buffers` (after its virtio header) is for MMDS.
fn for_mmds(buffers: &Buffers, mmds: &Option<Stack>) -> bool {
    let mut head = [0u8; 42];
    let got = buffers.read_at(HEADER_SIZE, &mut head);
    mmds.as_ref().is_some_and(|stack| stack.wants(&head[..got]))
}

/// Arms `timer` for when `stack` must run next, or disarms it.
fn arm_mmds_timer(stack: &mut Stack, timer: &mut TimerFd, id: &str) {
    let armed = match stack.poll_delay() {
        Some(wait) => timer.reset(wait.max(Duration::from_millis(1)), None),
        None => timer.clear(),
    };
    if let Err(e) = armed {
        log::error!("virtio-net {id}: cannot arm MMDS's timer: {e}");
    }
}

/// Arms `timer` to fire after `wait` (at least a millisecond: zero would disarm it).
fn arm(timer: &mut TimerFd, wait: Duration, id: &str) {
    if let Err(e) = timer.reset(wait.max(Duration::from_millis(1)), None) {
        log::error!("virtio-net {id}: cannot arm a rate limiter's timer: {e}");
    }
}

impl NetDevice {
    /// The interface `config` over its tap, its queues in `memory`.
    /// MMDS answers the guest on it if `mmds` names it.
    pub fn new(
        memory: DeviceMemory,
        config: &NetConfig,
        mmds: Option<&Mmds>,
    ) -> Result<Self, NetError> {
        let tap = Tap::open(&config.host_dev_name, HEADER_SIZE)?;
        let now = Instant::now();
        Ok(NetDevice {
            mmds: mmds.and_then(|mmds| mmds.stack_for(&config.id)),
            memory,
            id: config.id.clone(),
            tap,
            mac: config.guest_mac,
            mtu: config.mtu,
            active: None,
            rx_limiter: RateLimiter::new(config.rx_rate_limiter, now),
            tx_limiter: RateLimiter::new(config.tx_rate_limiter, now),
            limiter_configs: (config.rx_rate_limiter, config.tx_rate_limiter),
            rx_timer: TimerFd::new().map_err(|e| NetError::Timer(e.into()))?,
            tx_timer: TimerFd::new().map_err(|e| NetError::Timer(e.into()))?,
            mmds_timer: TimerFd::new().map_err(|e| NetError::Timer(e.into()))?,
            rx_throttled: false,
            tx_throttled: false,
            deferred: None,
            counters: Arc::default(),
            warnings: GuestWarnings::default(),
        })
    }

    /// The device in its mutex, and the handle the control API and metrics keep.
    pub fn into_shared(self) -> (Arc<Mutex<NetDevice>>, NetHandle) {
        let id = self.id.clone();
        let counters = self.counters.clone();
        let device = Arc::new(Mutex::new(self));
        let handle = NetHandle {
            id,
            counters,
            device: device.clone(),
        };
        (device, handle)
    }

    /// Replaces the rate limiters given, their buckets full; what waited for the old ones asks
    /// the new ones at once.
    fn set_rate_limiters(&mut self, rx: Option<RateLimiterConfig>, tx: Option<RateLimiterConfig>) {
        let now = Instant::now();
        if let Some(rx) = rx {
            self.limiter_configs.0 = rx;
            self.rx_limiter = RateLimiter::new(rx, now);
            self.rx_throttled = false;
            self.receive();
        }
        if let Some(tx) = tx {
            self.limiter_configs.1 = tx;
            self.tx_limiter = RateLimiter::new(tx, now);
            self.tx_throttled = false;
            self.transmit();
        }
    }

    /// Sends every frame the guest made available, as far as the rate limiter lets it.
    fn transmit(&mut self) {
        let Some(queues) = self.active.as_mut() else {
            return;
        };
        if self.tx_throttled {
            return;
        }
        let memory = Arc::clone(&self.memory);
        let mem = memory.memory();
        let mut used = false;
        while let Some(chain) = queues.tx.pop_descriptor_chain(&*mem) {
            let head = chain.head_index();
            match frame_buffers(&mem, chain, false) {
                Err(why) => {
                    self.counters
                        .tx_malformed_frames
                        .fetch_add(1, Ordering::Relaxed);
                    self.warnings.warn(format_args!(
                        "virtio-net {}: a frame to send: {why}",
                        self.id
                    ));
                }
                Ok(buffers) if self.mmds.is_some() && for_mmds(&buffers, &self.mmds) => {
                    let mut frame = vec![0u8; buffers.len() - HEADER_SIZE];
                    buffers.read_at(HEADER_SIZE, &mut frame);
                    if let Some(stack) = self.mmds.as_mut() {
                        stack.take(frame);
                        arm_mmds_timer(stack, &mut self.mmds_timer, &self.id);
                    }
                }
                Ok(buffers) => {
                    let len = buffers.len();
                    if self.tx_limiter.is_limiting() {
                        if let Err(wait) = self.tx_limiter.consume(len as u64, Instant::now()) {
                            queues.tx.go_to_previous_position();
                            self.counters
                                .tx_rate_limiter_throttled
                                .fetch_add(1, Ordering::Relaxed);
                            self.tx_throttled = true;
                            arm(&mut self.tx_timer, wait, &self.id);
                            break;
                        }
                    }
                    // SAFETY: `gather` made the iovecs from buffers inside guest memory, which
                    // `mem` keeps mapped for the call.
                    match unsafe { self.tap.write_frame(buffers.iovecs()) } {
                        Ok(_) => {
                            self.counters.tx_packets.fetch_add(1, Ordering::Relaxed);
                            self.counters
                                .tx_bytes
                                .fetch_add((len - HEADER_SIZE) as u64, Ordering::Relaxed);
                        }
                        Err(e) => {
                            self.counters.tx_fails.fetch_add(1, Ordering::Relaxed);
                            self.warnings.warn(format_args!(
                                "virtio-net {}: the tap {} refused a frame: {e}",
                                self.id,
                                self.tap.name()
                            ));
                        }
                    }
                }
            }
            if !give_back(&mut queues.tx, &mem, (head, 0), &self.warnings, &self.id) {
                break;
            }
            used = true;
        }
        self.notify(used);
    }

    /// Raises the used-buffer interrupt if `used`.
    fn notify(&self, used: bool) {
        let interrupt = self.active.as_ref().map(|queues| &queues.interrupt);
        if used && interrupt.is_some_and(|i| i.signal_used_queue().is_err()) {
            log::error!(
                "virtio-net {}: cannot raise the used-buffer interrupt",
                self.id
            );
        }
    }

    /// Moves frames from the tap into the guest's receive buffers until the tap is empty, the
    /// guest has no buffer left, or the rate limiter says to wait.
    fn receive(&mut self) {
        let Some(queues) = self.active.as_mut() else {
            return;
        };
        if self.rx_throttled {
            return;
        }
        let memory = Arc::clone(&self.memory);
        let mem = memory.memory();
        let mut used = false;
        loop {
            if self.deferred.is_none() && self.mmds.as_ref().is_some_and(Stack::has_frames) {
                let Some(chain) = queues.rx.pop_descriptor_chain(&*mem) else {
                    break;
                };
                let head = chain.head_index();
                let len = match (frame_buffers(&mem, chain, true), self.mmds.as_mut()) {
                    (Ok(buffers), Some(stack)) => {
                        let frame = stack.next_frame().unwrap_or_default();
                        let mut header = [0u8; HEADER_SIZE];
                        header[NUM_BUFFERS_AT..].copy_from_slice(&1u16.to_le_bytes());
                        buffers.write_at(0, &header);
                        buffers.write_at(HEADER_SIZE, &frame);
                        (HEADER_SIZE + frame.len()).min(buffers.len())
                    }
                    _ => 0,
                };
                if queues
                    .rx
                    .add_used(&*mem, head, u32::try_from(len).unwrap_or(0))
                    .is_err()
                {
                    break;
                }
                used = true;
                continue;
            }
            let Deferred { head, len } = match self.deferred.take() {
                Some(deferred) => deferred,
                None => {
                    let Some(chain) = queues.rx.pop_descriptor_chain(&*mem) else {
                        // No buffer: the driver's next notification of the queue reads on.
                        break;
                    };
                    let head = chain.head_index();
                    match frame_buffers(&mem, chain, true) {
                        Err(why) => {
                            self.counters
                                .rx_malformed_buffers
                                .fetch_add(1, Ordering::Relaxed);
                            self.warnings.warn(format_args!(
                                "virtio-net {}: a receive buffer: {why}",
                                self.id
                            ));
                            Deferred { head, len: 0 }
                        }
                        Ok(buffers) => {
                            let room = buffers.len();
                            // SAFETY: `gather` made the iovecs from device-writable buffers
                            // inside guest memory, which `mem` keeps mapped for the call.
                            match unsafe { self.tap.read_frame(buffers.iovecs()) } {
                                Ok(read) => {
                                    // Without MRG_RXBUF each frame is one buffer chain.
                                    buffers.write_at(NUM_BUFFERS_AT, &1u16.to_le_bytes());
                                    if read > room {
                                        self.counters.rx_fails.fetch_add(1, Ordering::Relaxed);
                                    }
                                    self.counters.rx_packets.fetch_add(1, Ordering::Relaxed);
                                    self.counters.rx_bytes.fetch_add(
                                        read.saturating_sub(HEADER_SIZE) as u64,
                                        Ordering::Relaxed,
                                    );
                                    Deferred {
                                        head,
                                        len: u32::try_from(read.min(room)).unwrap_or(u32::MAX),
                                    }
                                }
                                Err(e) => {
                                    queues.rx.go_to_previous_position();
                                    if e.kind() != io::ErrorKind::WouldBlock {
                                        log::error!(
                                            "virtio-net {}: cannot read the tap {}: {e}",
                                            self.id,
                                            self.tap.name()
                                        );
                                    }
                                    break;
                                }
                            }
                        }
                    }
                }
            };
            if len > 0 && self.rx_limiter.is_limiting() {
                if let Err(wait) = self.rx_limiter.consume(u64::from(len), Instant::now()) {
                    self.deferred = Some(Deferred { head, len });
                    self.counters
                        .rx_rate_limiter_throttled
                        .fetch_add(1, Ordering::Relaxed);
                    self.rx_throttled = true;
                    arm(&mut self.rx_timer, wait, &self.id);
                    break;
                }
            }
            if !give_back(&mut queues.rx, &mem, (head, len), &self.warnings, &self.id) {
                break;
            }
            used = true;
        }
        self.notify(used);
    }

    /// The offloads the tap may hand a driver that took `features`.
    fn tap_offloads(features: u64) -> u32 {
        let has = |bit: u32| features & (1 << bit) != 0;
        if !has(VIRTIO_NET_F_GUEST_CSUM) {
            return 0;
        }
        let mut flags = tap::TUN_F_CSUM;
        for (bit, flag) in [
            (VIRTIO_NET_F_GUEST_TSO4, tap::TUN_F_TSO4),
            (VIRTIO_NET_F_GUEST_TSO6, tap::TUN_F_TSO6),
            (VIRTIO_NET_F_GUEST_UFO, tap::TUN_F_UFO),
        ] {
            if has(bit) {
                flags |= flag;
            }
        }
        flags
    }

    /// The config space: `mac[6]`, `status` (not offered), `max_virtqueue_pairs`, `mtu`.
    fn config(&self) -> [u8; 12] {
        let mut config = [0u8; 12];
        if let Some(mac) = self.mac {
            config[..6].copy_from_slice(&mac.0);
        }
        config[8..10].copy_from_slice(&1u16.to_le_bytes());
        if let Some(mtu) = self.mtu {
            config[10..12].copy_from_slice(&mtu.to_le_bytes());
        }
        config
    }

    fn start(&mut self, activation: Activation<DeviceMemory>) -> Result<(), ActivateError> {
        let mut rx = None;
        let mut tx = None;
        for queue in activation.queues {
            match queue.index {
                RX => rx = Some(queue.queue),
                TX => tx = Some(queue.queue),
                _ => {}
            }
        }
        let offloads = Self::tap_offloads(activation.acked_features);
        self.tap
            .set_offload(offloads)
            .map_err(|e| ActivateError::Device(Box::new(e)))?;
        self.active = Some(NetQueues {
            rx: rx.ok_or(ActivateError::MissingQueue(RX))?,
            tx: tx.ok_or(ActivateError::MissingQueue(TX))?,
            interrupt: activation.interrupt,
        });
        Ok(())
    }
}

impl VirtioDevice<DeviceMemory> for NetDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn device_features(&self) -> u64 {
        let optional = [
            (self.mac.is_some(), VIRTIO_NET_F_MAC),
            (self.mtu.is_some(), VIRTIO_NET_F_MTU),
        ];
        OFFLOADS
            .iter()
            .copied()
            .chain(optional.iter().filter(|(on, _)| *on).map(|&(_, bit)| bit))
            .fold(0, |features, bit| features | 1 << bit)
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config(&self.config(), offset, data);
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        // The MAC is writable only with VIRTIO_NET_F_CTRL_MAC_ADDR's legacy cousin; not here.
        self.warnings.warn(format_args!(
            "virtio-net {}: write to the read-only config space at {offset}",
            self.id
        ));
    }

    fn activate(&mut self, activation: Activation<DeviceMemory>) -> Result<(), ActivateError> {
        self.start(activation)?;
        // Frames may wait in the tap, and its edge may be gone.
        self.receive();
        Ok(())
    }

    fn process_queue(&mut self, index: u16) {
        match index {
            RX => self.receive(),
            TX => {
                self.transmit();
                // A guest that sends also frees buffers the host's answers land in.
                self.receive();
            }
            _ => {}
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.deferred = None;
        self.rx_throttled = false;
        self.tx_throttled = false;
    }

    fn queue_states(&self) -> Vec<(u16, QueueState)> {
        self.active
            .iter()
            .flat_map(|queues| [(RX, queues.rx.state()), (TX, queues.tx.state())])
            .collect()
    }

    fn save_state(&self) -> DeviceState {
        DeviceState::Net {
            deferred_rx: self.deferred.map(|d| (d.head, d.len)),
        }
    }

    fn wake_sources(&self) -> Vec<WakeSource> {
        vec![
            WakeSource {
                fd: self.tap.as_raw_fd(),
                edge_triggered: true,
            },
            WakeSource::level(self.rx_timer.as_raw_fd()),
            WakeSource::level(self.tx_timer.as_raw_fd()),
            WakeSource::level(self.mmds_timer.as_raw_fd()),
        ]
    }

    fn wake(&mut self, source: usize) {
        match source {
            WAKE_TAP => self.receive(),
            WAKE_RX_TIMER => {
                // How often it expired does not matter.
                let _ = self.rx_timer.wait();
                self.rx_throttled = false;
                self.receive();
            }
            WAKE_TX_TIMER => {
                let _ = self.tx_timer.wait();
                self.tx_throttled = false;
                self.transmit();
            }
            WAKE_MMDS_TIMER => {
                let _ = self.mmds_timer.wait();
                if let Some(stack) = self.mmds.as_mut() {
                    stack.poll();
                    arm_mmds_timer(stack, &mut self.mmds_timer, &self.id);
                }
                // What the stack sent (a retransmission, a reset).
                self.receive();
            }
            _ => {}
        }
    }

    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation<DeviceMemory>>,
    ) -> Result<(), ActivateError> {
        let DeviceState::Net { deferred_rx } = state else {
            return Err(ActivateError::Device(
                format!("a virtio-net device cannot take the state {state:?}").into(),
            ));
        };
        if let Some(activation) = activation {
            let size = activation
                .queues
                .iter()
                .find(|q| q.index == RX)
                .map(|q| q.queue.size());
            if let (Some((head, _)), Some(size)) = (deferred_rx, size) {
                if *head >= size {
                    return Err(ActivateError::Device(
                        format!("a waiting receive buffer {head} outside its queue of {size}")
                            .into(),
                    ));
                }
            }
            self.start(activation)?;
            self.deferred = deferred_rx.map(|(head, len)| Deferred { head, len });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
