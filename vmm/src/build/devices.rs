//! The VM's virtio-mmio devices: each gets a slot of the MMIO gap
//! ([`crate::layout::virtio_mmio_base`]) and an interrupt line
//! ([`crate::layout::virtio_mmio_irq`]), a KVM irqfd for its interrupt, a KVM ioeventfd per
//! queue (a QueueNotify write wakes the event loop without a trip through the vCPU thread), a
//! queue subscriber in the event loop, and a `virtio_mmio.device=` entry for Linux.
//!
//! [`create_devices`] is where the VM's devices are made from its configuration: the balloon,
//! if any, comes first and so sits in [`BALLOON_SLOT`](crate::layout::BALLOON_SLOT).

use std::io;
use std::sync::{Arc, Mutex};

use guest_mem::GuestMemory;
use kvm_ioctls::{IoEventAddress, VmFd};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::boot::VirtioMmioEntry;
use crate::config::{open_image, ConfigError, DriveConfig, VmConfig};
use crate::layout::{virtio_mmio_base, virtio_mmio_irq, VIRTIO_MMIO_SIZE, VIRTIO_MMIO_SLOTS};
use crate::vm::vcpu::Buses;
use vmm_devices::balloon::{self, BalloonCreateError, BalloonHandle};
use vmm_devices::block::{BlockDevice, BlockError, BlockHandle};
use vmm_devices::entropy::{Entropy, EntropyHandle};
use vmm_devices::event_loop::{QueueSubscriber, Subscriber};
use vmm_devices::mem::{MemDevice, MemHandle, UnpluggedMemory};
use vmm_devices::net::{NetDevice, NetError, NetHandle};
use vmm_devices::pmem::{PmemDevice, PmemHandle};
use vmm_devices::serial::SerialError;
use vmm_devices::virtio::mmio::{registers, MmioError, MmioTransport, StatefulTransport};
use vmm_devices::virtio::state::MmioSnapshot;
use vmm_devices::virtio::VirtioDevice;
use vmm_devices::vsock::{VsockCounters, VsockDevice, VsockError};
use vmm_devices::{BusDevice, BusError};

/// Errors of creating and wiring devices.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The entropy device's timer could not be made.
    #[error("virtio-rng: {0}")]
    Entropy(#[source] std::io::Error),
    /// A network interface could not be made.
    #[error("network interface {id}: {source}")]
    Net {
        /// The interface's id.
        id: String,
        /// The error.
        source: NetError,
    },
    /// The vsock device could not be made.
    #[error("vsock: {0}")]
    Vsock(#[from] VsockError),
    /// The virtio-mem device could not be made.
    #[error("virtio-mem: {0}")]
    Mem(#[source] vmm_devices::virtio::ActivateError),
    /// Every virtio-mmio slot is taken.
    #[error("no free virtio-mmio slot (there are {VIRTIO_MMIO_SLOTS})")]
    NoSlot,
    /// The serial port could not be created.
    #[error(transparent)]
    Serial(#[from] SerialError),
    /// A virtio-mmio transport could not be created.
    #[error(transparent)]
    Transport(#[from] MmioError),
    /// An event fd could not be created or cloned.
    #[error("event fd: {0}")]
    EventFd(#[source] io::Error),
    /// Registering an irqfd or ioeventfd with KVM failed.
    #[error("{what}: {source}")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// A device does not fit on its bus.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The `--balloon` options do not make a valid device.
    #[error("--balloon: {0}")]
    BalloonOption(#[source] virtio_balloon::OptionsError),
    /// The balloon could not be created.
    #[error(transparent)]
    Balloon(#[from] BalloonCreateError),
    /// A drive's image could not be opened.
    #[error("drive {id}: {source}")]
    Drive {
        /// The drive's id.
        id: String,
        /// The error.
        source: ConfigError,
    },
    /// A drive's device could not be made (its rate limiter's timer, its io_uring).
    #[error("drive {id}: {source}")]
    Block {
        /// The drive's id.
        id: String,
        /// The error.
        source: BlockError,
    },
    /// The virtio-pmem device's rate limiter timer could not be made.
    #[error("{device}: a rate limiter's timer: {source}")]
    Timer {
        /// The device.
        device: String,
        /// The error.
        source: io::Error,
    },
    /// A device could not take the state a snapshot saved.
    #[error("cannot restore a device: {0}")]
    Restore(String),
    /// The VM generation id device could not be made or renewed.
    #[error(transparent)]
    VmGenId(#[from] vmm_devices::vmgenid::VmGenIdError),
}

/// One device in its slot.
struct DeviceSlot {
    entry: VirtioMmioEntry,
    transport: Arc<dyn BusDevice>,
    /// The same transport, for snapshots.
    stateful: Arc<dyn StatefulTransport>,
    irq: EventFd,
    notifiers: Vec<EventFd>,
}

/// The virtio-mmio devices of a VM, before they are attached to it.
#[derive(Default)]
pub struct VirtioMmioDevices {
    slots: Vec<DeviceSlot>,
    subscribers: Vec<Subscriber>,
    /// Bus devices over guest memory ranges that are not memory now (unplugged virtio-mem
    /// memory where KVM leaves accesses to the VMM): base, size, device.
    guards: Vec<(u64, u64, Arc<dyn BusDevice>)>,
}

impl std::fmt::Debug for VirtioMmioDevices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.entries()).finish()
    }
}

impl VirtioMmioDevices {
    /// No devices.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `device` behind a virtio-mmio transport in the next free slot; its queues read and
    /// write `memory`. Returns its slot.
    pub fn add<M, D>(
        &mut self,
        memory: M,
        device: Arc<Mutex<D>>,
    ) -> Result<VirtioMmioEntry, DeviceError>
    where
        M: GuestAddressSpace + Send + Sync + 'static,
        D: VirtioDevice<M> + 'static,
    {
        let slot = self.slots.len() as u64;
        let (Some(base), Some(irq_line)) = (virtio_mmio_base(slot), virtio_mmio_irq(slot)) else {
            return Err(DeviceError::NoSlot);
        };
        let irq = EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
        let irq_clone = irq.try_clone().map_err(DeviceError::EventFd)?;
        let transport = MmioTransport::new(memory, device.clone(), irq_clone)?;
        let notifiers = transport
            .queue_notifiers()
            .iter()
            .map(EventFd::try_clone)
            .collect::<io::Result<Vec<_>>>()
            .map_err(DeviceError::EventFd)?;
        let subscriber = QueueSubscriber::new(device, transport.queue_notifiers())
            .map_err(DeviceError::EventFd)?;
        let entry = VirtioMmioEntry {
            base,
            size: VIRTIO_MMIO_SIZE,
            irq: irq_line,
        };
        self.subscribers.push(Box::new(subscriber));
        let transport = Arc::new(transport);
        self.slots.push(DeviceSlot {
            entry,
            stateful: transport.clone(),
            transport,
            irq,
            notifiers,
        });
        Ok(entry)
    }

    /// Creates a virtio-balloon of `config` over `memory` and adds it like [`Self::add`], with its
    /// statistics timer among the subscribers. Returns what the control API keeps of it.
    pub fn add_balloon(
        &mut self,
        memory: Arc<GuestMemory>,
        config: virtio_balloon::BalloonConfig,
    ) -> Result<BalloonHandle, DeviceError> {
        let balloon = balloon::create(memory.clone(), config)?;
        self.add(memory, balloon.device)?;
        self.subscribers.push(Box::new(balloon.stats_timer));
        Ok(balloon.handle)
    }

    /// Creates the virtio-mem device of `hotplug` over `memory`'s hot-pluggable region and
    /// adds it like [`Self::add`], with the guard that answers accesses to its unplugged
    /// memory. Returns what the control API keeps of it.
    pub fn add_mem(
        &mut self,
        memory: Arc<GuestMemory>,
        hotplug: crate::config::HotplugConfig,
    ) -> Result<MemHandle, DeviceError> {
        let device = MemDevice::new(memory.clone(), hotplug).map_err(DeviceError::Mem)?;
        let (base, size) = device.region();
        let (device, handle) = device.into_shared(hotplug);
        self.add(memory, device)?;
        self.guards
            .push((base, size, Arc::new(UnpluggedMemory::default())));
        Ok(handle)
    }

    /// The transports by slot, for snapshots.
    pub fn transports(&self) -> Vec<Arc<dyn StatefulTransport>> {
        self.slots
            .iter()
            .map(|slot| slot.stateful.clone())
            .collect()
    }

    /// Gives each device the state a snapshot saved for its slot.
    pub fn restore_states(&self, saved: &[MmioSnapshot]) -> Result<(), DeviceError> {
        if saved.len() != self.slots.len() {
            return Err(DeviceError::Transport(MmioError::BadState(format!(
                "{} virtio devices saved, the VM has {}",
                saved.len(),
                self.slots.len()
            ))));
        }
        for (slot, state) in self.slots.iter().zip(saved) {
            slot.stateful.restore_state(state)?;
        }
        Ok(())
    }

    /// The devices' slots, for the kernel command line.
    pub fn entries(&self) -> Vec<VirtioMmioEntry> {
        self.slots.iter().map(|slot| slot.entry).collect()
    }

    /// The event loop subscribers of the devices: their queues, and timers (taken once).
    pub fn take_subscribers(&mut self) -> Vec<Subscriber> {
        std::mem::take(&mut self.subscribers)
    }

    /// Wires the devices to `vm` (irqfds, one ioeventfd per queue on QueueNotify with the
    /// queue index as datamatch) and puts them on the MMIO bus.
    pub fn attach(&self, vm: &VmFd, buses: &mut Buses) -> Result<(), DeviceError> {
        let kvm = |what| move |source| DeviceError::Kvm { what, source };
        for slot in &self.slots {
            let VirtioMmioEntry { base, size, irq } = slot.entry;
            vm.register_irqfd(&slot.irq, irq)
                .map_err(kvm("KVM_IRQFD"))?;
            let notify = IoEventAddress::Mmio(base + registers::QUEUE_NOTIFY);
            for (index, notifier) in slot.notifiers.iter().enumerate() {
                vm.register_ioevent(notifier, &notify, index as u32)
                    .map_err(kvm("KVM_IOEVENTFD"))?;
            }
            buses.mmio.insert(slot.transport.clone(), base, size)?;
        }
        for (base, size, guard) in &self.guards {
            buses.mmio.insert(guard.clone(), *base, *size)?;
        }
        Ok(())
    }
}

/// The VM's virtio devices, before they are attached, and the balloon's handle if it has one.
pub(crate) struct Devices {
    /// The virtio-mmio devices.
    pub mmio: VirtioMmioDevices,
    /// The balloon, for the control API.
    pub balloon: Option<BalloonHandle>,
    /// The virtio-pmem device, for the control API.
    pub pmem: Option<PmemHandle>,
    /// The virtio-mem device, for the control API.
    pub hotplug: Option<MemHandle>,
    /// The drives, for the control API and metrics.
    pub drives: Vec<BlockHandle>,
    /// The virtio-rng device, for metrics.
    pub entropy: Option<EntropyHandle>,
    /// The network interfaces, for the control API and metrics.
    pub network_interfaces: Vec<NetHandle>,
    /// The vsock device's counters, for metrics.
    pub vsock: Option<Arc<VsockCounters>>,
}

/// Opens a drive's image as it asks and makes its virtio-blk device.
fn create_drive(
    drive: &DriveConfig,
    memory: &Arc<GuestMemory>,
) -> Result<BlockDevice, DeviceError> {
    let (image, size) =
        open_image(&drive.path, drive.read_only).map_err(|source| DeviceError::Drive {
            id: drive.id.clone(),
            source: source.into(),
        })?;
    BlockDevice::new(memory.clone(), drive.clone(), image, size).map_err(|source| {
        DeviceError::Block {
            id: drive.id.clone(),
            source,
        }
    })
}

/// Creates the devices `config` asks for over `memory`: the balloon first (in
/// [`BALLOON_SLOT`](crate::layout::BALLOON_SLOT), where the test guest's balloon steps look).
pub(crate) fn create_devices(
    config: &VmConfig,
    memory: &Arc<GuestMemory>,
) -> Result<Devices, DeviceError> {
    let mut mmio = VirtioMmioDevices::new();
    let balloon = match &config.balloon {
        Some(option) => {
            let device = balloon::device_config(option).map_err(DeviceError::BalloonOption)?;
            Some(mmio.add_balloon(memory.clone(), device)?)
        }
        None => None,
    };
    let pmem = match config.pmem_region() {
        Some(region) => {
            let device = PmemDevice::new(
                memory.clone(),
                region.start,
                region.size,
                config.pmem_rate_limiter,
            )
            .map_err(|source| DeviceError::Timer {
                device: "virtio-pmem".into(),
                source,
            })?;
            let (device, handle) = device.into_shared();
            mmio.add(memory.clone(), device)?;
            Some(handle)
        }
        None => None,
    };
    let mut drives = Vec::with_capacity(config.drives.len());
    for drive in &config.drives {
        let (device, handle) = create_drive(drive, memory)?.into_shared();
        drives.push(handle);
        mmio.add(memory.clone(), device)?;
    }
    // After the drives, then the network interfaces, then vsock: a snapshot's devices come
    // back in this order.
    let entropy = match config.entropy {
        Some(limiter) => {
            let device = Entropy::new(memory.clone(), limiter).map_err(DeviceError::Entropy)?;
            let handle = device.handle();
            mmio.add(memory.clone(), Arc::new(Mutex::new(device)))?;
            Some(handle)
        }
        None => None,
    };
    let mut network_interfaces = Vec::with_capacity(config.network_interfaces.len());
    for net in &config.network_interfaces {
        let device =
            NetDevice::new(memory.clone(), net, config.mmds.as_ref()).map_err(|source| {
                DeviceError::Net {
                    id: net.id.clone(),
                    source,
                }
            })?;
        let (device, handle) = device.into_shared();
        mmio.add(memory.clone(), device)?;
        network_interfaces.push(handle);
    }
    let vsock = match &config.vsock {
        Some(vsock) => {
            let device = VsockDevice::new(memory.clone(), vsock)?;
            let counters = device.counters();
            mmio.add(memory.clone(), Arc::new(Mutex::new(device)))?;
            Some(counters)
        }
        None => None,
    };
    let hotplug = match config.hotplug {
        Some(hotplug) => Some(mmio.add_mem(memory.clone(), hotplug)?),
        None => None,
    };
    Ok(Devices {
        mmio,
        balloon,
        pmem,
        hotplug,
        drives,
        entropy,
        network_interfaces,
        vsock,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kvm_ioctls::Kvm;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;
    use crate::build::memory::{create_memory, create_pool, Frames};
    use crate::layout::BALLOON_SLOT;
    use vmm_devices::balloon::BalloonControlError;
    use vmm_devices::virtio::mmio::testing::TestDevice;

    fn memory() -> Arc<GuestMemoryMmap<()>> {
        Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap())
    }

    fn test_device() -> Arc<Mutex<TestDevice>> {
        Arc::new(Mutex::new(TestDevice::default()))
    }

    #[test]
    fn devices_take_consecutive_slots_until_none_is_left() {
        let mut devices = VirtioMmioDevices::new();
        let first = devices.add(memory(), test_device()).unwrap();
        assert_eq!(
            first,
            VirtioMmioEntry {
                base: 0xc000_0000,
                size: 0x1000,
                irq: 5
            }
        );
        let second = devices.add(memory(), test_device()).unwrap();
        assert_eq!((second.base, second.irq), (0xc000_1000, 6));
        assert_eq!(devices.entries(), vec![first, second]);
        assert_eq!(devices.take_subscribers().len(), 2);
        assert!(devices.take_subscribers().is_empty(), "taken once");
        for _ in 2..VIRTIO_MMIO_SLOTS {
            devices.add(memory(), test_device()).unwrap();
        }
        assert!(matches!(
            devices.add(memory(), test_device()),
            Err(DeviceError::NoSlot)
        ));
    }

    #[test]
    fn attached_devices_are_on_the_bus_with_their_irqfd_and_ioeventfds() {
        let Ok(kvm) = Kvm::new() else {
            eprintln!("SKIP: attached_devices_are_on_the_bus: /dev/kvm is not available");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let mut devices = VirtioMmioDevices::new();
        devices.add(memory(), test_device()).unwrap();
        devices.add(memory(), test_device()).unwrap();
        let mut buses = Buses::default();
        devices.attach(&vm, &mut buses).unwrap();
        let mut magic = [0u8; 4];
        buses.mmio.read(0xc000_1000, &mut magic).unwrap();
        assert_eq!(u32::from_le_bytes(magic), registers::MAGIC);
        // KVM holds the registrations: the same irqfd cannot be registered twice.
        let again = devices.attach(&vm, &mut Buses::default());
        assert!(
            matches!(
                again,
                Err(DeviceError::Kvm {
                    what: "KVM_IRQFD",
                    ..
                })
            ),
            "{again:?}"
        );
    }

    /// A 16 MiB VM with the balloon `balloon`.
    fn vm_config(balloon: &str) -> VmConfig {
        VmConfig::test_guest(16 << 20, 1).with_balloon(balloon)
    }

    #[test]
    fn the_balloon_sits_in_its_slot_with_irqfd_ioeventfds_and_a_statistics_timer() {
        let Ok(kvm) = Kvm::new() else {
            eprintln!("SKIP: the_balloon_sits_in_its_slot: /dev/kvm is not available");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let option = "size=4M,free_page_reporting=on,stats_polling_interval_s=1";
        let config = vm_config(option);
        let memory = Arc::new(
            create_memory(
                &config,
                Frames::Pool(create_pool(&config).unwrap()),
                &Default::default(),
                true,
            )
            .unwrap(),
        );
        let Devices {
            mut mmio, balloon, ..
        } = create_devices(&config, &memory).unwrap();
        let balloon = balloon.expect("a balloon");
        let entry = VirtioMmioEntry {
            base: virtio_mmio_base(BALLOON_SLOT).unwrap(),
            size: VIRTIO_MMIO_SIZE,
            irq: virtio_mmio_irq(BALLOON_SLOT).unwrap(),
        };
        assert_eq!(mmio.entries(), [entry]);
        assert_eq!(
            mmio.take_subscribers().len(),
            2,
            "queues and statistics timer"
        );
        let mut buses = Buses::default();
        mmio.attach(&vm, &mut buses).unwrap();
        let read = |offset| {
            let mut value = [0; 4];
            buses.mmio.read(entry.base + offset, &mut value).unwrap();
            u32::from_le_bytes(value)
        };
        assert_eq!(
            (read(0), read(8)),
            (registers::MAGIC, 5),
            "a virtio-balloon"
        );
        // Its queues' notify address carries ioeventfds now: KVM refuses one a second time.
        let notify = IoEventAddress::Mmio(entry.base + registers::QUEUE_NOTIFY);
        let evt = EventFd::new(EFD_NONBLOCK).unwrap();
        assert!(vm.register_ioevent(&evt, &notify, 3u32).is_err());

        assert_eq!(balloon.info().target_pages, 1024);
        assert!(matches!(
            balloon.set_target_mib(17),
            Err(BalloonControlError::TargetAboveRam { ram_mib: 16, .. })
        ));
        balloon.set_target_mib(16).unwrap();
        assert_eq!(balloon.info().target_pages, 4096);
        assert!(balloon.config().free_page_reporting);
        assert_eq!(balloon.stats_interval(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn without_balloon_there_are_no_devices() {
        let config = VmConfig::test_guest(16 << 20, 1);
        let memory = Arc::new(
            create_memory(
                &config,
                Frames::Pool(create_pool(&config).unwrap()),
                &Default::default(),
                true,
            )
            .unwrap(),
        );
        let devices = create_devices(&config, &memory).unwrap();
        assert!(devices.mmio.entries().is_empty() && devices.balloon.is_none());
    }
}
