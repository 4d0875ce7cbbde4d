//! Making a balloon ([`create`]: the device, its statistics timer and the [`BalloonHandle`] the
//! control API keeps) and putting it on a VM ([`attach`]: its virtio-mmio transport on the MMIO
//! bus at a layout slot, a KVM irqfd for its interrupt line, a KVM ioeventfd per queue on its
//! QueueNotify register, and the event-loop subscribers).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_manager::MutEventSubscriber;
use guest_mem::GuestMemory;
use kvm_ioctls::{IoEventAddress, VmFd};
use virtio_balloon::{
    pages_from_bytes, pages_from_mib, BalloonConfig, BalloonError, BalloonInfo, ConfigError,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::stats_timer::{StatsInterval, StatsTimer, StatsTimerError};
use super::{lock, BalloonDevice, Memory};
use crate::cli::BalloonConfig as BalloonOption;
use crate::devices::bus::{Bus, BusError};
use crate::devices::event_loop::QueueSubscriber;
use crate::devices::virtio::mmio::{MmioError, MmioTransport};
use crate::layout::{virtio_mmio_base, virtio_mmio_irq, VIRTIO_MMIO_SIZE};

/// The balloon's transport.
pub type BalloonTransport = MmioTransport<Memory, BalloonDevice>;

/// An event-loop subscriber of the balloon.
pub type Subscriber = Box<dyn MutEventSubscriber + Send>;

/// Errors of attaching a balloon to a VM.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The layout has no virtio-mmio slot of this number.
    #[error("there is no virtio-mmio slot {0}")]
    NoSlot(u64),
    /// The balloon options are invalid.
    #[error("virtio-balloon: {0}")]
    Device(#[source] BalloonError),
    /// The transport could not be created.
    #[error("virtio-balloon transport: {0}")]
    Transport(#[source] MmioError),
    /// An event fd could not be created.
    #[error("virtio-balloon interrupt event fd: {0}")]
    EventFd(#[source] std::io::Error),
    /// Registering an irqfd or ioeventfd with KVM failed.
    #[error("virtio-balloon: {what} failed: {source}")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// Its error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The slot is taken on the bus.
    #[error("virtio-balloon: {0}")]
    Bus(#[source] BusError),
    /// Creating the statistics timer failed.
    #[error(transparent)]
    StatsTimer(#[from] StatsTimerError),
}

/// Errors of controlling a running balloon.
#[derive(Debug, thiserror::Error)]
pub enum BalloonControlError {
    /// The target is larger than the guest's RAM.
    #[error("balloon target of {target_mib} MiB exceeds the guest's {ram_mib} MiB of RAM")]
    TargetAboveRam {
        /// The target asked for.
        target_mib: u64,
        /// The guest's RAM.
        ram_mib: u64,
    },
    /// The device refused the target or could not interrupt the guest.
    #[error(transparent)]
    Device(#[from] BalloonError),
    /// The statistics interval could not be changed.
    #[error(transparent)]
    Stats(#[from] StatsTimerError),
}

/// What the VMM keeps of an attached balloon to control it (from the API thread).
#[derive(Clone)]
pub struct BalloonHandle {
    device: Arc<Mutex<BalloonDevice>>,
    config: BalloonConfig,
    ram_bytes: u64,
    stats: StatsInterval,
}

impl BalloonHandle {
    /// The device (shared with its transport and the event loop).
    pub fn device(&self) -> &Arc<Mutex<BalloonDevice>> {
        &self.device
    }

    /// The options the balloon was created with.
    pub fn config(&self) -> BalloonConfig {
        self.config
    }

    /// Sets the target in MiB and tells the guest; the target may not exceed guest RAM.
    pub fn set_target_mib(&self, mib: u64) -> Result<(), BalloonControlError> {
        let ram_mib = self.ram_bytes >> 20;
        if mib > ram_mib {
            return Err(BalloonControlError::TargetAboveRam {
                target_mib: mib,
                ram_mib,
            });
        }
        let pages = pages_from_mib(mib).map_err(BalloonError::from)?;
        lock(&self.device).balloon_mut().set_target_pages(pages)?;
        Ok(())
    }

    /// Target, actual size, counters, the guest's statistics and its violations.
    pub fn info(&self) -> BalloonInfo {
        lock(&self.device).balloon().info()
    }

    /// The statistics polling interval; `None` when polling is off.
    pub fn stats_interval(&self) -> Option<Duration> {
        self.stats.get()
    }

    /// Changes the statistics polling interval (`None` or zero: off). Polling cannot be turned
    /// on when the balloon was created without statistics.
    pub fn set_stats_interval(
        &self,
        interval: Option<Duration>,
    ) -> Result<(), BalloonControlError> {
        Ok(self.stats.set(interval)?)
    }
}

/// The device options of a `--balloon` option: the initial target, deflate-on-OOM, free page
/// reporting, statistics (an interval of 0 turns them off), MUST_TELL_HOST and 1024-entry queues.
pub fn device_config(option: &BalloonOption) -> Result<BalloonConfig, ConfigError> {
    let interval = option.stats_polling_interval_s;
    Ok(BalloonConfig {
        target_pages: pages_from_bytes(option.size)?,
        deflate_on_oom: option.deflate_on_oom,
        free_page_reporting: option.free_page_reporting,
        stats_interval: (interval > 0).then(|| Duration::from_secs(interval.into())),
        ..BalloonConfig::default()
    })
}

/// A balloon that is not on a transport yet.
pub struct NewBalloon {
    /// The device, to put behind a virtio-mmio transport (whose queue subscriber processes it).
    pub device: Arc<Mutex<BalloonDevice>>,
    /// The event-loop subscriber that asks the guest for statistics.
    pub stats_timer: StatsTimer,
    /// What the control API keeps.
    pub handle: BalloonHandle,
}

/// Creates a balloon with `config` over `memory`, with its statistics timer and API handle.
pub fn create(memory: Arc<GuestMemory>, config: BalloonConfig) -> Result<NewBalloon, AttachError> {
    let ram_bytes = memory.regions().iter().map(|r| r.size()).sum();
    let device = BalloonDevice::new(config, memory).map_err(AttachError::Device)?;
    let device = Arc::new(Mutex::new(device));
    let (stats_timer, stats) = StatsTimer::new(device.clone())?;
    let handle = BalloonHandle {
        device: device.clone(),
        config,
        ram_bytes,
        stats,
    };
    Ok(NewBalloon {
        device,
        stats_timer,
        handle,
    })
}

/// Creates a balloon with `config` over `memory` and attaches it to `vm` at virtio-mmio slot
/// `slot`: the transport goes on `mmio`, its interrupt to the slot's IRQ line (irqfd) and its
/// queue notifications to event fds (ioeventfds). Returns the handle for the API and the
/// subscribers to add to the VMM's event loop (they process the queues and poll statistics).
pub fn attach(
    vm: &VmFd,
    mmio: &mut Bus,
    memory: Arc<GuestMemory>,
    config: BalloonConfig,
    slot: u64,
) -> Result<(BalloonHandle, Vec<Subscriber>), AttachError> {
    let (Some(base), Some(irq)) = (virtio_mmio_base(slot), virtio_mmio_irq(slot)) else {
        return Err(AttachError::NoSlot(slot));
    };
    let balloon = create(memory.clone(), config)?;
    let irq_evt = EventFd::new(EFD_NONBLOCK).map_err(AttachError::EventFd)?;
    let transport = MmioTransport::new(memory, balloon.device.clone(), irq_evt)
        .map_err(AttachError::Transport)?;
    let kvm = |what| move |source| AttachError::Kvm { what, source };
    vm.register_irqfd(transport.interrupt().irq_evt(), irq)
        .map_err(kvm("KVM_IRQFD"))?;
    let notify = IoEventAddress::Mmio(base + BalloonTransport::QUEUE_NOTIFY_OFFSET);
    for (index, notifier) in transport.queue_notifiers().iter().enumerate() {
        vm.register_ioevent(notifier, &notify, index as u32)
            .map_err(kvm("KVM_IOEVENTFD"))?;
    }
    let queues = QueueSubscriber::new(balloon.device, transport.queue_notifiers())
        .map_err(AttachError::EventFd)?;
    mmio.insert(Arc::new(transport), base, VIRTIO_MMIO_SIZE)
        .map_err(AttachError::Bus)?;
    let subscribers: Vec<Subscriber> = vec![Box::new(queues), Box::new(balloon.stats_timer)];
    Ok((balloon.handle, subscribers))
}
