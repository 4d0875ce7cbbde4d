//! An address bus for port I/O or MMIO: maps address ranges to devices.
//!
//! Devices are inserted during setup (`&mut self`); afterwards the bus is shared (e.g. in an
//! `Arc`) and every lookup is a lock-free binary search over an immutable sorted table. Devices
//! take `&self` and synchronize internally, so two vCPUs can reach two devices concurrently.

use std::sync::Arc;

/// A device on a [`Bus`].
pub trait BusDevice: Send + Sync {
    /// Reads `data.len()` bytes at `offset` from the start (`base`) of the device's range.
    fn read(&self, base: u64, offset: u64, data: &mut [u8]);
    /// Writes `data` at `offset` from the start (`base`) of the device's range.
    fn write(&self, base: u64, offset: u64, data: &[u8]);
}

/// Errors of bus setup and bus accesses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// A range of size zero, or one that wraps past the end of the address space.
    #[error("invalid bus range: base {base:#x}, size {size:#x}")]
    InvalidRange {
        /// Base of the rejected range.
        base: u64,
        /// Size of the rejected range.
        size: u64,
    },
    /// The new range overlaps a device already on the bus.
    #[error("bus range {base:#x}+{size:#x} overlaps the device at {existing:#x}")]
    Overlap {
        /// Base of the rejected range.
        base: u64,
        /// Size of the rejected range.
        size: u64,
        /// Base of the device it overlaps.
        existing: u64,
    },
    /// No device covers the accessed address.
    #[error("no device at {0:#x}")]
    NoDevice(u64),
    /// The access starts inside a device but runs past its end.
    #[error("access at {addr:#x} of {len} bytes runs past the device's end")]
    PastDeviceEnd {
        /// Accessed address.
        addr: u64,
        /// Access length.
        len: usize,
    },
}

/// An address range `[base, base + size)` on a bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BusRange {
    /// First address.
    pub base: u64,
    /// Number of addresses; never 0.
    pub size: u64,
}

impl BusRange {
    /// Validates and creates a range.
    pub fn new(base: u64, size: u64) -> Result<Self, BusError> {
        if size == 0 || base.checked_add(size - 1).is_none() {
            return Err(BusError::InvalidRange { base, size });
        }
        Ok(BusRange { base, size })
    }

    /// Last address in the range (inclusive; cannot overflow).
    pub fn last(&self) -> u64 {
        self.base + (self.size - 1)
    }

    fn overlaps(&self, other: &BusRange) -> bool {
        self.base <= other.last() && other.base <= self.last()
    }
}

/// A set of non-overlapping ranges, each served by one device.
#[derive(Default)]
pub struct Bus {
    /// Sorted by base; ranges never overlap.
    devices: Vec<(BusRange, Arc<dyn BusDevice>)>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.devices.iter().map(|(range, _)| range))
            .finish()
    }
}

impl Bus {
    /// Creates an empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `device` at `[base, base + size)`. Fails on an invalid or overlapping range.
    pub fn insert(
        &mut self,
        device: Arc<dyn BusDevice>,
        base: u64,
        size: u64,
    ) -> Result<(), BusError> {
        let range = BusRange::new(base, size)?;
        let index = self.devices.partition_point(|(r, _)| r.base < base);
        let neighbours = [index.checked_sub(1), Some(index)];
        for existing in neighbours.into_iter().flatten() {
            if let Some((r, _)) = self.devices.get(existing) {
                if r.overlaps(&range) {
                    return Err(BusError::Overlap {
                        base,
                        size,
                        existing: r.base,
                    });
                }
            }
        }
        self.devices.insert(index, (range, device));
        Ok(())
    }

    /// Finds the device whose range contains `addr`, with that range.
    pub fn device_at(&self, addr: u64) -> Option<(BusRange, &Arc<dyn BusDevice>)> {
        let index = self.devices.partition_point(|(r, _)| r.base <= addr);
        let (range, device) = self.devices.get(index.checked_sub(1)?)?;
        (addr <= range.last()).then_some((*range, device))
    }

    /// Returns the device and offset for an access of `len` bytes at `addr`.
    fn resolve(&self, addr: u64, len: usize) -> Result<(BusRange, &Arc<dyn BusDevice>), BusError> {
        let (range, device) = self.device_at(addr).ok_or(BusError::NoDevice(addr))?;
        let fits = (len as u64)
            .checked_sub(1)
            .and_then(|extra| addr.checked_add(extra))
            .is_some_and(|end| end <= range.last());
        if !fits {
            return Err(BusError::PastDeviceEnd { addr, len });
        }
        Ok((range, device))
    }

    /// Dispatches a read of `data.len()` bytes at `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> Result<(), BusError> {
        let (range, device) = self.resolve(addr, data.len())?;
        device.read(range.base, addr - range.base, data);
        Ok(())
    }

    /// Dispatches a write of `data` at `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        let (range, device) = self.resolve(addr, data.len())?;
        device.write(range.base, addr - range.base, data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records the last access and answers reads with its offset.
    #[derive(Default)]
    struct Recorder {
        last_write: Mutex<Option<(u64, u64, Vec<u8>)>>,
    }

    impl BusDevice for Recorder {
        fn read(&self, _base: u64, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&self, base: u64, offset: u64, data: &[u8]) {
            *self.last_write.lock().unwrap() = Some((base, offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatches_to_the_device_with_base_and_offset() {
        let mut bus = Bus::new();
        let a = Arc::new(Recorder::default());
        let b = Arc::new(Recorder::default());
        bus.insert(a.clone(), 0x1000, 0x100).unwrap();
        bus.insert(b.clone(), 0x3f8, 8).unwrap();

        let mut data = [0u8; 4];
        bus.read(0x1010, &mut data).unwrap();
        assert_eq!(data, [0x10; 4]);
        bus.write(0x3fd, &[7]).unwrap();
        assert_eq!(*b.last_write.lock().unwrap(), Some((0x3f8, 5, vec![7])));
        assert!(a.last_write.lock().unwrap().is_none());
    }

    #[test]
    fn rejects_bad_and_overlapping_ranges() {
        let mut bus = Bus::new();
        let dev = Arc::new(Recorder::default());
        assert!(matches!(
            bus.insert(dev.clone(), 0x10, 0),
            Err(BusError::InvalidRange { .. })
        ));
        assert!(matches!(
            bus.insert(dev.clone(), u64::MAX, 2),
            Err(BusError::InvalidRange { .. })
        ));
        bus.insert(dev.clone(), u64::MAX, 1).unwrap();
        bus.insert(dev.clone(), 0x100, 0x100).unwrap();
        for (base, size) in [(0x80, 0x81), (0x1ff, 1), (0x150, 0x10), (0x0, 0x1000)] {
            assert_eq!(
                bus.insert(dev.clone(), base, size),
                Err(BusError::Overlap {
                    base,
                    size,
                    existing: 0x100
                })
            );
        }
        bus.insert(dev.clone(), 0x80, 0x80).unwrap();
        bus.insert(dev, 0x200, 0x10).unwrap();
    }

    #[test]
    fn misses_and_accesses_past_the_end_are_errors() {
        let mut bus = Bus::new();
        bus.insert(Arc::new(Recorder::default()), 0x100, 0x10)
            .unwrap();
        let mut data = [0u8; 4];
        assert_eq!(bus.read(0xff, &mut data), Err(BusError::NoDevice(0xff)));
        assert_eq!(bus.read(0x110, &mut data), Err(BusError::NoDevice(0x110)));
        assert_eq!(
            bus.write(0x10e, &[0; 4]),
            Err(BusError::PastDeviceEnd {
                addr: 0x10e,
                len: 4
            })
        );
        assert!(bus.read(0x10c, &mut data).is_ok());
        assert!(matches!(
            bus.write(0x100, &[]),
            Err(BusError::PastDeviceEnd { .. })
        ));
    }

    #[test]
    fn shared_bus_is_usable_from_many_threads() {
        let mut bus = Bus::new();
        bus.insert(Arc::new(Recorder::default()), 0, 0x1000)
            .unwrap();
        let bus = Arc::new(bus);
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let bus = bus.clone();
                std::thread::spawn(move || {
                    let mut data = [0u8; 1];
                    for _ in 0..1000 {
                        bus.read(i, &mut data).unwrap();
                        assert_eq!(data[0], i as u8);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
