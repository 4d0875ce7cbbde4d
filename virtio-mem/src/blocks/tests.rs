//! The request semantics on real guest memory: an LLFree pool of 2 MiB frames and guest-mem's
//! hot-pluggable region, the backend the VMM uses.

use std::sync::Arc;

use guest_mem::{Backing, GuestMemory, MemoryConfig, MemoryError, Pool, PoolConfig, RegionError};
use vm_memory::GuestAddress;

use super::*;

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 2 * MIB;
const RAM: u64 = 4 * MIB;
const REGION: u64 = 1 << 30;
const BLOCKS: u64 = 16;

/// Plugs through guest-mem, as the VMM's backend does.
struct Memory(GuestMemory);

impl MemBackend for Memory {
    type Error = MemoryError;

    fn plug(&self, addr: u64, len: u64) -> Result<(), PlugError<MemoryError>> {
        let mut core = self.0.pool().core_frames(0);
        match self.0.plug(GuestAddress(addr), len, &mut core) {
            Ok(()) => Ok(()),
            Err(MemoryError::Region(RegionError::Exhausted(_))) => Err(PlugError::NoMemory),
            Err(e) => Err(PlugError::Failed(e)),
        }
    }

    fn unplug(&self, addr: u64, len: u64) -> Result<(), MemoryError> {
        let mut core = self.0.pool().core_frames(0);
        self.0.unplug(GuestAddress(addr), len, &mut core).map(drop)
    }
}

fn layout() -> RegionLayout {
    RegionLayout {
        addr: REGION,
        size: BLOCKS * BLOCK,
        block_size: BLOCK,
    }
}

/// A device over 16 blocks of real hot-pluggable memory, the pool holding `frames_mib` for
/// them (RAM is populated lazily and never touched here).
fn device(frames_mib: u64) -> (Blocks<Memory>, Arc<Pool>) {
    let pool = Pool::new(PoolConfig::new(Backing::Anonymous, frames_mib * MIB)).unwrap();
    let config = MemoryConfig {
        hotplug: Some((GuestAddress(REGION), BLOCKS * BLOCK)),
        ..MemoryConfig::new(vec![(GuestAddress(0), RAM)], 1)
    };
    let memory = GuestMemory::new(Arc::clone(&pool), config).unwrap();
    (
        Blocks::new(layout(), Memory(memory), |_| false).unwrap(),
        pool,
    )
}

fn plugged_in_memory(blocks: &Blocks<Memory>) -> u64 {
    let chunks = blocks
        .backend()
        .0
        .plugged_chunks(GuestAddress(REGION), BLOCKS * BLOCK);
    chunks.unwrap() as u64 * BLOCK
}

fn at(block: u64) -> u64 {
    REGION + block * BLOCK
}

#[test]
fn plugs_up_to_the_requested_size_and_unplugs_give_frames_back() {
    let (mut dev, pool) = device(32);
    let plug = |addr, blocks| MemRequest::Plug { addr, blocks };
    // Nothing requested yet: a plug is refused for now.
    assert_eq!(dev.handle(plug(at(0), 1)), MemResponse::Nack);
    dev.set_requested_size(6 * MIB).unwrap();
    assert_eq!(dev.handle(plug(at(0), 2)), MemResponse::Ack(None));
    assert_eq!(pool.stats().used_bytes, 4 * MIB);
    // Beyond the requested size: NACK; within it: ACK.
    assert_eq!(dev.handle(plug(at(4), 2)), MemResponse::Nack);
    assert_eq!(dev.handle(plug(at(4), 1)), MemResponse::Ack(None));
    assert_eq!(dev.plugged_size(), 6 * MIB);
    assert_eq!(plugged_in_memory(&dev), 6 * MIB);
    let state = |dev: &mut Blocks<Memory>, block, blocks| {
        dev.handle(MemRequest::State {
            addr: at(block),
            blocks,
        })
    };
    assert_eq!(
        state(&mut dev, 0, 2),
        MemResponse::Ack(Some(BlockState::Plugged))
    );
    assert_eq!(
        state(&mut dev, 1, 4),
        MemResponse::Ack(Some(BlockState::Mixed))
    );
    assert_eq!(
        state(&mut dev, 5, 11),
        MemResponse::Ack(Some(BlockState::Unplugged))
    );

    // Unplug one block: its frame goes back; unplugging it again is an error.
    let unplug = |addr, blocks| MemRequest::Unplug { addr, blocks };
    assert_eq!(dev.handle(unplug(at(1), 1)), MemResponse::Ack(None));
    assert_eq!(pool.stats().used_bytes, 4 * MIB);
    assert_eq!(dev.handle(unplug(at(1), 1)), MemResponse::Error);
    assert_eq!(dev.handle(unplug(at(0), 2)), MemResponse::Error, "mixed");
    assert_eq!(dev.handle(MemRequest::UnplugAll), MemResponse::Ack(None));
    assert_eq!((dev.plugged_size(), pool.stats().used_bytes), (0, 0));
    assert_eq!(plugged_in_memory(&dev), 0);
    let counters = dev.counters();
    assert_eq!(
        (
            counters.plugs,
            counters.unplugs,
            counters.nacks,
            counters.errors
        ),
        (2, 2, 2, 2)
    );
}

#[test]
fn invalid_requests_are_errors_and_change_nothing() {
    let (mut dev, pool) = device(32);
    dev.set_requested_size(BLOCKS * BLOCK).unwrap();
    assert_eq!(
        dev.handle(MemRequest::Plug {
            addr: at(3),
            blocks: 1
        }),
        MemResponse::Ack(None)
    );
    for request in [
        MemRequest::Plug {
            addr: at(0) + 4096,
            blocks: 1,
        },
        MemRequest::Plug {
            addr: at(0),
            blocks: 0,
        },
        MemRequest::Plug {
            addr: REGION - BLOCK,
            blocks: 1,
        },
        MemRequest::Plug {
            addr: at(15),
            blocks: 2,
        },
        MemRequest::Plug {
            addr: at(2),
            blocks: 2,
        },
        MemRequest::Plug {
            addr: u64::MAX - BLOCK + 1,
            blocks: u16::MAX,
        },
        MemRequest::Plug { addr: 0, blocks: 1 },
        MemRequest::Unplug {
            addr: at(4),
            blocks: 1,
        },
        MemRequest::Unplug {
            addr: at(3),
            blocks: u16::MAX,
        },
        MemRequest::State {
            addr: at(16),
            blocks: 1,
        },
        MemRequest::State {
            addr: at(0) + 1,
            blocks: 1,
        },
        MemRequest::Unknown(4),
        MemRequest::Unknown(u16::MAX),
    ] {
        assert_eq!(dev.handle(request), MemResponse::Error, "{request:?}");
    }
    assert_eq!(dev.plugged_size(), BLOCK);
    assert_eq!(pool.stats().used_bytes, BLOCK);
}

#[test]
fn a_plug_the_host_has_no_memory_for_is_refused_for_now() {
    // Frames for two blocks.
    let (mut dev, pool) = device(4);
    dev.set_requested_size(8 * MIB).unwrap();
    assert_eq!(
        dev.handle(MemRequest::Plug {
            addr: at(0),
            blocks: 3
        }),
        MemResponse::Nack
    );
    assert_eq!((dev.plugged_size(), pool.stats().used_bytes), (0, 0));
    assert_eq!(
        dev.handle(MemRequest::Plug {
            addr: at(0),
            blocks: 2
        }),
        MemResponse::Ack(None)
    );
}

#[test]
fn the_requested_size_is_whole_blocks_of_the_region_and_the_config_space_shows_it() {
    let (mut dev, _pool) = device(32);
    for bad in [MIB, BLOCKS * BLOCK + BLOCK, u64::MAX] {
        assert!(dev.set_requested_size(bad).is_err(), "{bad:#x}");
    }
    dev.set_requested_size(8 * MIB).unwrap();
    dev.handle(MemRequest::Plug {
        addr: at(2),
        blocks: 1,
    });
    let space = dev.config_space();
    let le64 = |offset: u64| {
        let at = offset as usize;
        u64::from_le_bytes(space[at..at + 8].try_into().unwrap())
    };
    assert_eq!(le64(config::BLOCK_SIZE), BLOCK);
    assert_eq!(le64(config::ADDR), REGION);
    assert_eq!(le64(config::REGION_SIZE), BLOCKS * BLOCK);
    assert_eq!(le64(config::USABLE_REGION_SIZE), BLOCKS * BLOCK);
    assert_eq!(le64(config::PLUGGED_SIZE), BLOCK);
    assert_eq!(le64(config::REQUESTED_SIZE), 8 * MIB);
}

#[test]
fn layouts_are_checked_and_plugged_blocks_are_taken_over() {
    let good = layout();
    for bad in [
        RegionLayout {
            block_size: 3 * MIB,
            ..good
        },
        RegionLayout {
            block_size: 2048,
            ..good
        },
        RegionLayout { size: 0, ..good },
        RegionLayout {
            size: BLOCK + 4096,
            ..good
        },
        RegionLayout {
            addr: REGION + 4096,
            ..good
        },
        RegionLayout {
            addr: u64::MAX - BLOCK + 1,
            ..good
        },
    ] {
        let blocks = Blocks::new(bad, (), |_| false);
        assert!(blocks.is_err(), "{bad:?}");
    }
    let blocks = Blocks::new(good, (), |addr| addr == at(1) || addr == at(15)).unwrap();
    assert_eq!(
        (blocks.plugged_size(), blocks.requested_size()),
        (2 * BLOCK, 2 * BLOCK)
    );
    assert!(blocks.is_plugged(15) && !blocks.is_plugged(14));
}

/// No backend: for layouts alone.
impl MemBackend for () {
    type Error = String;

    fn plug(&self, _: u64, _: u64) -> Result<(), PlugError<String>> {
        Err(PlugError::Failed("no memory here".into()))
    }

    fn unplug(&self, _: u64, _: u64) -> Result<(), String> {
        Err("no memory here".into())
    }
}

#[test]
fn a_hostile_driver_never_plugs_beyond_the_requested_size() {
    let (mut dev, pool) = device(32);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for step in 0..4000 {
        if step % 100 == 0 {
            dev.set_requested_size((next() % (BLOCKS + 1)) * BLOCK)
                .unwrap();
        }
        let addr = match next() % 4 {
            0 => next(),
            _ => REGION + (next() % (BLOCKS + 2)) * BLOCK + (next() % 2) * 4096 * (next() % 2),
        };
        let blocks = (next() % 5) as u16;
        let request = match next() % 5 {
            0 => MemRequest::Plug { addr, blocks },
            1 => MemRequest::Unplug { addr, blocks },
            2 => MemRequest::State { addr, blocks },
            3 if next() % 10 == 0 => MemRequest::UnplugAll,
            _ => MemRequest::Unknown((next() % 8) as u16),
        };
        let before = dev.plugged_size();
        let response = dev.handle(request);
        if matches!(request, MemRequest::Plug { .. }) && response == MemResponse::Ack(None) {
            assert!(dev.plugged_size() <= dev.requested_size(), "{request:?}");
        }
        if response != MemResponse::Ack(None) {
            assert_eq!(dev.plugged_size(), before, "{request:?} -> {response:?}");
        }
        assert_eq!(plugged_in_memory(&dev), dev.plugged_size());
        assert_eq!(pool.stats().used_bytes, dev.plugged_size());
    }
}
