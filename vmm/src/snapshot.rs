//! Snapshots of a paused VM ([`VmSnapshot`]): what KVM holds about its vCPUs and the VM, the
//! state of every device, the configuration it needs to be built again, and where its memory
//! is ([`MemorySource`]).
//!
//! A VM whose memory lives in a zone leaves it there: the snapshot names the zone and the VM by
//! their identities and seals the VM's memory (see `guest_mem::zone::ZoneVm::set_seal`); the
//! seal breaks when the guest runs again, after which the snapshot can no longer be loaded. A VM
//! snapshotted into a memory file of its own gets a copy, as Firecracker makes one.
//!
//! The file format is in [`mod@file`]; `vmm::runner` takes and loads snapshots.

pub mod file;
pub mod memory_file;
pub mod rebase;

use serde::{Deserialize, Serialize};
use vmm_devices::rate_limiter::RateLimiterConfig;

use crate::arch::x86_64::state::{KvmVcpuState, KvmVmState};
use crate::config::{BalloonDeviceConfig, DriveConfig, HotplugConfig};
use crate::testguest::{ReportSnapshot, Workload};
use vmm_devices::i8042::I8042Snapshot;
use vmm_devices::serial::SerialSnapshot;
use vmm_devices::virtio::state::MmioSnapshot;
use vmm_devices::vmgenid::VmGenIdSnapshot;

/// Errors of a snapshot's contents, checked after it was read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the snapshot is inconsistent: {0}")]
pub struct InconsistentSnapshot(pub String);

/// What a VM runs, as a snapshot keeps it (a Linux kernel is in guest memory by now).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SavedGuest {
    /// The built-in test guest and its workload.
    TestGuest(Workload),
    /// A Linux guest.
    Linux,
}

/// The configuration the VM is built again with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// Bytes of RAM.
    pub memory_size: u64,
    /// vCPUs.
    pub vcpus: usize,
    /// SMT: the vCPUs are two threads per core (their CPUID, saved with them, says so).
    #[serde(default)]
    pub smt: bool,
    /// Bytes of the virtio-pmem device, if it has one.
    pub pmem_size: Option<u64>,
    /// The virtio-pmem device's rate limiter, as the API last set it.
    #[serde(default)]
    pub pmem_rate_limiter: RateLimiterConfig,
    /// The balloon's options, if it has one.
    pub balloon: Option<BalloonDeviceConfig>,
    /// The balloon's statistics interval when the snapshot was taken (an API may have changed
    /// it since the start).
    pub balloon_stats_interval_s: u32,
    /// vCPUs wait for frames when the pool is exhausted.
    pub wait_for_memory: bool,
    /// For at most this many milliseconds (none: as long as it takes).
    #[serde(default)]
    pub memory_wait_limit_ms: Option<u64>,
    /// What the VM runs.
    pub guest: SavedGuest,
    /// The virtio-blk drives, in their slots' order (their images stay where they are), with
    /// the images and rate limiters the API last gave them.
    pub drives: Vec<DriveConfig>,
    /// A virtio-rng entropy device, after the drives, and its rate limiter.
    pub entropy: Option<RateLimiterConfig>,
    /// The network interfaces, after the entropy device.
    pub network_interfaces: Vec<crate::config::NetConfig>,
    /// The vsock device, last.
    pub vsock: Option<crate::config::VsockConfig>,
    /// How the guest reaches MMDS (its document is not kept, as in Firecracker).
    pub mmds: Option<vmm_devices::mmds::MmdsConfig>,
    /// The hot-pluggable memory, after the vsock device, and which of its blocks are plugged.
    #[serde(default)]
    pub hotplug: Option<SavedHotplug>,
}

/// The hot-pluggable memory of a snapshot: its configuration and its plugged blocks (one bit
/// each, from the region's start), which are plugged again before the memory is filled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedHotplug {
    /// The configuration.
    pub config: HotplugConfig,
    /// Plugged blocks, 64 to a word.
    pub plugged: Vec<u64>,
}

impl SavedHotplug {
    /// The guest addresses of the plugged blocks of the region at `start`.
    pub fn plugged_blocks(&self, start: u64) -> impl Iterator<Item = u64> + '_ {
        let block = self.config.block_size;
        (0..self.config.total_size / block)
            .filter(|&index| {
                usize::try_from(index / 64)
                    .ok()
                    .and_then(|at| self.plugged.get(at))
                    .is_some_and(|word| word & (1 << (index % 64)) != 0)
            })
            .map(move |index| start + index * block)
    }
}

/// Where the VM's memory is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemorySource {
    /// In its zone, sealed: nothing was copied.
    Zone {
        /// The zone's identity.
        zone_id: u128,
        /// The VM's name in the zone.
        vm: String,
        /// The VM's identity in the zone.
        vm_id: u64,
        /// The seal the snapshot put on the VM's memory.
        seal: u64,
    },
    /// Copied into a memory file: the memory regions one after the other, each as large as
    /// the region (chunks the guest never touched are holes), then a trailer with `identity`
    /// ([`memory_file`]).
    File {
        /// The regions as (guest address, bytes).
        regions: Vec<(u64, u64)>,
        /// The identity the memory file's trailer carries: this snapshot's own.
        identity: u64,
        /// The CRC32 of the memory ([`memory_file::MemoryChecksum`]).
        checksum: u32,
    },
}

/// Every device's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStates {
    /// The serial port.
    pub serial: SerialSnapshot,
    /// The i8042 (Linux guests).
    pub keyboard: Option<I8042Snapshot>,
    /// The VM generation id (Linux guests).
    pub vmgenid: Option<VmGenIdSnapshot>,
    /// The test guest's report device.
    pub report: Option<ReportSnapshot>,
    /// The virtio-mmio devices, by slot.
    pub virtio: Vec<MmioSnapshot>,
}

/// A paused VM.
#[derive(Debug, Serialize, Deserialize)]
pub struct VmSnapshot {
    /// Its configuration.
    pub machine: Machine,
    /// Where its memory is.
    pub memory: MemorySource,
    /// Each vCPU, by index.
    pub vcpus: Vec<KvmVcpuState>,
    /// The interrupt controllers, PIT and clock.
    pub vm: KvmVmState,
    /// The devices.
    pub devices: DeviceStates,
}

impl VmSnapshot {
    /// Checks that the parts fit together (the file's checksums only say it is what was
    /// written); each device checks its own state when it is restored.
    pub fn check(&self) -> Result<(), InconsistentSnapshot> {
        let bad = |why: String| Err(InconsistentSnapshot(why));
        let machine = &self.machine;
        let memory = machine.memory_size;
        if !(crate::layout::MIN_MEMORY..=crate::layout::MAX_MEMORY).contains(&memory)
            || !memory.is_multiple_of(1 << 20)
            || machine.pmem_size.is_some_and(|size| {
                size == 0 || size > crate::layout::MAX_MEMORY || !size.is_multiple_of(2 << 20)
            })
        {
            return bad(format!(
                "{memory} bytes of memory, pmem {:?}",
                machine.pmem_size
            ));
        }
        if machine.vcpus == 0 || machine.vcpus > crate::config::MAX_VCPUS {
            return bad(format!("{} vCPUs", machine.vcpus));
        }
        if self.vcpus.len() != machine.vcpus {
            return bad(format!(
                "{} vCPU states for {} vCPUs",
                self.vcpus.len(),
                machine.vcpus
            ));
        }
        let virtio = usize::from(machine.balloon.is_some())
            + usize::from(machine.pmem_size.is_some())
            + machine.drives.len()
            + usize::from(machine.entropy.is_some())
            + machine.network_interfaces.len()
            + usize::from(machine.vsock.is_some())
            + usize::from(machine.hotplug.is_some());
        if self.devices.virtio.len() != virtio {
            return bad(format!(
                "{} virtio devices saved, the configuration has {virtio}",
                self.devices.virtio.len()
            ));
        }
        let (test_guest, linux) = match machine.guest {
            SavedGuest::TestGuest(_) => (true, false),
            SavedGuest::Linux => (false, true),
        };
        if self.devices.report.is_some() != test_guest
            || self.devices.keyboard.is_some() != linux
            || self.devices.vmgenid.is_some() != linux
        {
            return bad("the devices do not fit the guest".into());
        }
        if let Some(vmgenid) = &self.devices.vmgenid {
            if vmgenid.gsi > crate::layout::IRQ_MAX
                || !vmgenid
                    .address
                    .is_multiple_of(vmm_devices::vmgenid::VMGENID_ALIGN)
            {
                return bad(format!("the VM generation id {vmgenid:?}"));
            }
        }
        if let Some(hotplug) = &machine.hotplug {
            let blocks = hotplug.config.total_size / hotplug.config.block_size.max(1);
            let frame = if hotplug.config.block_size.is_multiple_of(1 << 30) {
                guest_mem::FrameSize::Giant
            } else {
                guest_mem::FrameSize::Huge
            };
            if hotplug.config.check(frame).is_err()
                || hotplug.plugged.len() as u64 != blocks.div_ceil(64)
            {
                return bad(format!("hot-pluggable memory {hotplug:?}"));
            }
        }
        if let MemorySource::File { regions, .. } = &self.memory {
            if machine.pmem_size.is_some() {
                return bad("a VM with virtio-pmem in a memory file".into());
            }
            let hotplug = machine.hotplug.as_ref().map(|h| {
                crate::layout::hotplug_region(machine.memory_size, None, h.config.total_size)
            });
            let expected: Vec<(u64, u64)> = crate::layout::saved_ram_regions(machine.memory_size)
                .iter()
                .chain(&hotplug)
                .map(|r| (r.start, r.size))
                .collect();
            if *regions != expected {
                return bad("the memory file's regions do not fit the memory size".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
