//! The Virtual Machine Generation ID device (Microsoft's "Virtual Machine Generation ID"
//! specification, the device Linux's `vmgenid` driver binds): 16 random bytes in guest memory
//! that change whenever the VM may have been duplicated, and an interrupt that tells the guest
//! they did. Linux then mixes the new id into its random pool and reseeds it ("crng reseeded
//! due to virtual machine fork"), so that clones of one snapshot do not share their random
//! numbers.
//!
//! The device has no registers: the VMM writes a new id before the guest first runs and on
//! every load of a snapshot, and raises the interrupt after a load. Its ACPI description (the
//! `VMGENCTR` device with its `ADDR` package, and the event device whose interrupt notifies
//! it) is the VMM's, which knows where it put both.

use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::entropy::host_random;

/// Bytes of the generation id.
pub const VMGENID_SIZE: usize = 16;
/// Alignment the specification asks of the id's address.
pub const VMGENID_ALIGN: u64 = 8;

/// Errors of the generation id device.
#[derive(Debug, thiserror::Error)]
pub enum VmGenIdError {
    /// The id's address is not 8-byte aligned.
    #[error("the generation id's address {0:#x} is not 8-byte aligned")]
    Unaligned(u64),
    /// The eventfd of its interrupt cannot be created or written.
    #[error("the generation id's interrupt eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    /// The host gave no random bytes.
    #[error("no random bytes from the host for a new generation id: {0}")]
    Random(#[source] std::io::Error),
    /// The id cannot be written to guest memory.
    #[error("cannot write the generation id at {address:#x}: {source}")]
    Write {
        /// Its guest address.
        address: u64,
        /// The guest memory's error.
        source: vm_memory::GuestMemoryError,
    },
}

/// What a snapshot keeps of the device: where the id is and which interrupt announces a new
/// one (the id itself is in guest memory, and a load replaces it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmGenIdSnapshot {
    /// Guest physical address of the 16-byte id.
    pub address: u64,
    /// The GSI of the event device that notifies the guest.
    pub gsi: u32,
}

/// The generation id device.
#[derive(Debug)]
pub struct VmGenId {
    address: u64,
    gsi: u32,
    irq_evt: EventFd,
}

impl VmGenId {
    /// A device whose id lies at `address`, announced through `gsi`.
    pub fn new(address: u64, gsi: u32) -> Result<Self, VmGenIdError> {
        if !address.is_multiple_of(VMGENID_ALIGN) {
            return Err(VmGenIdError::Unaligned(address));
        }
        Ok(Self {
            address,
            gsi,
            irq_evt: EventFd::new(EFD_NONBLOCK).map_err(VmGenIdError::EventFd)?,
        })
    }

    /// The device a snapshot describes.
    pub fn restore(saved: &VmGenIdSnapshot) -> Result<Self, VmGenIdError> {
        Self::new(saved.address, saved.gsi)
    }

    /// What a snapshot keeps of it.
    pub fn save_state(&self) -> VmGenIdSnapshot {
        VmGenIdSnapshot {
            address: self.address,
            gsi: self.gsi,
        }
    }

    /// Guest physical address of the id.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// The GSI that announces a new id.
    pub fn gsi(&self) -> u32 {
        self.gsi
    }

    /// The eventfd that raises [`Self::gsi`] (for KVM's irqfd).
    pub fn irq_evt(&self) -> &EventFd {
        &self.irq_evt
    }

    /// Writes a new random id into `memory` and returns it.
    pub fn new_generation<M: GuestMemoryBackend>(
        &self,
        memory: &M,
    ) -> Result<[u8; VMGENID_SIZE], VmGenIdError> {
        let mut id = [0; VMGENID_SIZE];
        host_random(&mut id).map_err(VmGenIdError::Random)?;
        memory
            .write_slice(&id, GuestAddress(self.address))
            .map_err(|source| VmGenIdError::Write {
                address: self.address,
                source,
            })?;
        Ok(id)
    }

    /// Tells the guest that the id changed: raises the event device's interrupt, whose
    /// handler notifies the generation id device.
    pub fn notify_guest(&self) -> Result<(), VmGenIdError> {
        self.irq_evt.write(1).map_err(VmGenIdError::EventFd)
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::GuestMemoryMmap;

    use super::*;

    #[test]
    fn every_generation_writes_a_new_id_where_the_device_says() {
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let device = VmGenId::new(0xf_f000, 23).unwrap();
        let first = device.new_generation(&memory).unwrap();
        let mut read = [0; VMGENID_SIZE];
        memory
            .read_slice(&mut read, GuestAddress(0xf_f000))
            .unwrap();
        assert_eq!(read, first);
        let second = device.new_generation(&memory).unwrap();
        assert_ne!(first, second, "two random 128-bit ids are equal");
        memory
            .read_slice(&mut read, GuestAddress(0xf_f000))
            .unwrap();
        assert_eq!(read, second);
    }

    #[test]
    fn a_bad_address_is_refused() {
        assert!(matches!(
            VmGenId::new(0xf_f004, 23),
            Err(VmGenIdError::Unaligned(0xf_f004))
        ));
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let outside = VmGenId::new(2 << 20, 23).unwrap();
        assert!(matches!(
            outside.new_generation(&memory),
            Err(VmGenIdError::Write {
                address: 0x20_0000,
                ..
            })
        ));
    }

    #[test]
    fn the_snapshot_names_address_and_interrupt() {
        let device = VmGenId::new(0xf_f000, 23).unwrap();
        let saved = device.save_state();
        assert_eq!(
            saved,
            VmGenIdSnapshot {
                address: 0xf_f000,
                gsi: 23
            }
        );
        let restored = VmGenId::restore(&saved).unwrap();
        assert_eq!((restored.address(), restored.gsi()), (0xf_f000, 23));
        restored.notify_guest().unwrap();
        assert_eq!(restored.irq_evt().read().unwrap(), 1);
    }
}
