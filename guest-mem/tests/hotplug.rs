//! Hot-pluggable memory (the memory behind a virtio-mem device): chunks plugged with frames of
//! the pool, unplugged back to it, inaccessible to the guest (real KVM) and to device accesses
//! while unplugged, and kept with their contents by a VM in a zone.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::Arc;

use common::{memory_config, RegionVm, TempFile, Touch, TouchError, MIB};
use guest_mem::zone::{VmLayout, Zone, ZoneConfig, DEFAULT_MAX_VMS};
use guest_mem::{
    Backing, FrameSize, GuestMemory, MemoryConfig, MemoryError, Pool, PoolConfig, Populate,
    Population, RegionError,
};
use vm_memory::{Bytes, GuestAddress};

const CHUNK: u64 = 2 * MIB;
const RAM: u64 = 8 * MIB;
/// The hot-pluggable memory: 16 MiB at 512 MiB (below 4 GiB, where the touch program reaches).
const HOTPLUG: u64 = 512 * MIB;
const HOTPLUG_SIZE: u64 = 16 * MIB;

/// Hot-pluggable memory after RAM, for three vCPUs.
fn config(populate: Populate) -> MemoryConfig {
    MemoryConfig {
        hotplug: Some((GuestAddress(HOTPLUG), HOTPLUG_SIZE)),
        populate,
        ..memory_config(RAM, 3)
    }
}

fn pool(size: u64) -> Arc<Pool> {
    Pool::new(PoolConfig::new(Backing::Anonymous, size)).expect("pool")
}

fn used(pool: &Pool) -> u64 {
    pool.stats().used_bytes
}

#[test]
fn plugged_chunks_take_frames_and_unplugged_ones_give_them_back_and_refuse_access() {
    let pool = pool(RAM + HOTPLUG_SIZE);
    let memory = GuestMemory::new(Arc::clone(&pool), config(Populate::Eager)).expect("memory");
    let mut core = memory.pool().core_frames(0);
    // Eager population fills RAM only.
    assert_eq!(used(&pool), RAM);
    let region = memory.hotplug_region().expect("hot-pluggable memory");
    assert_eq!((region.start().0, region.size()), (HOTPLUG, HOTPLUG_SIZE));
    let all = |memory: &GuestMemory| memory.plugged_chunks(GuestAddress(HOTPLUG), HOTPLUG_SIZE);
    assert_eq!(all(&memory).unwrap(), 0);
    // Unplugged memory: a device access fails (no SIGSEGV, no frame).
    assert!(memory.read_obj::<u64>(GuestAddress(HOTPLUG)).is_err());
    assert!(memory
        .write_obj(1u64, GuestAddress(HOTPLUG + CHUNK))
        .is_err());
    assert_eq!(used(&pool), RAM);

    // Plug 4 MiB at 2 MiB in: frames now, the memory usable.
    let at = GuestAddress(HOTPLUG + CHUNK);
    memory.plug(at, 2 * CHUNK, &mut core).expect("plug");
    assert_eq!(used(&pool), RAM + 2 * CHUNK);
    assert_eq!(all(&memory).unwrap(), 2);
    memory.write_obj(0x5eed_u64, at).expect("write");
    assert_eq!(memory.read_obj::<u64>(at).unwrap(), 0x5eed);
    assert!(memory.read_obj::<u64>(GuestAddress(HOTPLUG)).is_err());

    // Plugging a plugged chunk, unplugging an unplugged one: refused, nothing changed.
    let overlap = memory.plug(GuestAddress(HOTPLUG), 2 * CHUNK, &mut core);
    assert!(
        matches!(
            overlap,
            Err(MemoryError::Region(RegionError::Plugged { chunk: 1 }))
        ),
        "{overlap:?}"
    );
    let unplugged = memory.unplug(GuestAddress(HOTPLUG), 2 * CHUNK, &mut core);
    assert!(
        matches!(
            unplugged,
            Err(MemoryError::Region(RegionError::Unplugged { chunk: 0 }))
        ),
        "{unplugged:?}"
    );
    assert_eq!(used(&pool), RAM + 2 * CHUNK);
    // Ranges that are not whole chunks of hot-pluggable memory.
    for (addr, len) in [
        (HOTPLUG + 4096, CHUNK),
        (HOTPLUG, CHUNK + 4096),
        (HOTPLUG, 0),
        (HOTPLUG + HOTPLUG_SIZE - CHUNK, 2 * CHUNK),
        (0, CHUNK),
        (u64::MAX - CHUNK + 1, CHUNK),
    ] {
        let result = memory.plug(GuestAddress(addr), len, &mut core);
        assert!(
            matches!(result, Err(MemoryError::NotHotplug { .. })),
            "{addr:#x}+{len:#x}: {result:?}"
        );
    }

    // Unplugging gives the frames back; the memory is inaccessible again, and a new plug
    // reads zeroes.
    assert_eq!(memory.unplug(at, 2 * CHUNK, &mut core).expect("unplug"), 2);
    assert_eq!(used(&pool), RAM);
    assert!(memory.read_obj::<u64>(at).is_err());
    memory.plug(at, CHUNK, &mut core).expect("plug again");
    assert_eq!(memory.read_obj::<u64>(at).unwrap(), 0);
    drop(memory);
    assert_eq!(
        used(&pool),
        0,
        "dropping the memory frees plugged frames too"
    );
}

#[test]
fn a_request_plugged_with_scattered_frames_keeps_each_chunk_on_its_own_frame() {
    // A request's chunks are mapped, made inaccessible and scrubbed in runs of consecutive
    // frames: scatter the pool's free frames so that runs break everywhere.
    let pool = pool(RAM + 2 * HOTPLUG_SIZE);
    let memory = GuestMemory::new(Arc::clone(&pool), config(Populate::Eager)).expect("memory");
    let mut core = memory.pool().core_frames(0);
    let taken: Vec<_> = std::iter::from_fn(|| pool.alloc(0, FrameSize::Huge)).collect();
    let (kept, freed): (Vec<_>, Vec<_>) = taken.iter().enumerate().partition(|(i, _)| {
        // Free 0, 2, 3, 5, 6, 7, 9, ...: runs of one, two and three frames.
        matches!(i % 7, 1 | 4)
    });
    for (_, frame) in &freed {
        pool.free(0, **frame).expect("free");
    }
    let chunks = HOTPLUG_SIZE / CHUNK;
    assert!(freed.len() as u64 >= chunks);
    let at = |i: u64, offset: u64| GuestAddress(HOTPLUG + i * CHUNK + offset);
    let chunk_at = |i: u64| at(i, 0);
    let fill = |i: u64| 0x0101_0101_0101_0101 * (i + 1);
    memory
        .plug(chunk_at(0), HOTPLUG_SIZE, &mut core)
        .expect("plug");
    assert_eq!(used(&pool), RAM + HOTPLUG_SIZE + kept.len() as u64 * CHUNK);
    let offsets = [0, 4096, CHUNK / 2, CHUNK - 8];
    for i in 0..chunks {
        for offset in offsets {
            memory.write_obj(fill(i), at(i, offset)).expect("write");
        }
    }
    let read = |i: u64, offset: u64| memory.read_obj::<u64>(at(i, offset));
    for i in 0..chunks {
        for offset in offsets {
            assert_eq!(read(i, offset).unwrap(), fill(i), "chunk {i} +{offset:#x}");
        }
    }
    // Unplug three chunks in the middle: their frames only are scrubbed and freed.
    assert_eq!(
        memory
            .unplug(chunk_at(2), 3 * CHUNK, &mut core)
            .expect("unplug"),
        3
    );
    assert_eq!(
        used(&pool),
        RAM + (chunks - 3) * CHUNK + kept.len() as u64 * CHUNK
    );
    memory
        .plug(chunk_at(2), 3 * CHUNK, &mut core)
        .expect("plug again");
    for i in 0..chunks {
        let expected = if (2..5).contains(&i) { 0 } else { fill(i) };
        for offset in offsets {
            assert_eq!(read(i, offset).unwrap(), expected, "chunk {i} +{offset:#x}");
        }
    }
    assert_eq!(
        memory
            .unplug(chunk_at(0), HOTPLUG_SIZE, &mut core)
            .expect("unplug"),
        chunks as usize
    );
    for (_, frame) in &kept {
        pool.free(0, **frame).expect("free");
    }
    assert_eq!(used(&pool), RAM);
    // Every frame given back was scrubbed: a plug of all of them reads zeroes.
    let all: Vec<_> = std::iter::from_fn(|| pool.alloc(0, FrameSize::Huge)).collect();
    for frame in &all {
        pool.free(0, *frame).expect("free");
    }
    memory
        .plug(chunk_at(0), HOTPLUG_SIZE, &mut core)
        .expect("plug all");
    for i in 0..chunks {
        for offset in offsets {
            assert_eq!(read(i, offset).unwrap(), 0, "chunk {i} +{offset:#x}");
        }
    }
}

#[test]
fn a_plug_the_pool_cannot_serve_plugs_nothing() {
    // Room for RAM and two hot-pluggable chunks.
    let pool = pool(RAM + 2 * CHUNK);
    let memory = GuestMemory::new(Arc::clone(&pool), config(Populate::Eager)).expect("memory");
    let mut core = memory.pool().core_frames(0);
    let result = memory.plug(GuestAddress(HOTPLUG), 3 * CHUNK, &mut core);
    assert!(
        matches!(result, Err(MemoryError::Region(RegionError::Exhausted(_)))),
        "{result:?}"
    );
    assert_eq!(used(&pool), RAM);
    assert_eq!(
        memory
            .plugged_chunks(GuestAddress(HOTPLUG), HOTPLUG_SIZE)
            .unwrap(),
        0
    );
    memory
        .plug(GuestAddress(HOTPLUG), 2 * CHUNK, &mut core)
        .expect("what fits");
}

#[test]
fn a_vcpu_uses_plugged_memory_and_touching_unplugged_memory_fails_without_a_frame() {
    let pool = pool(RAM + HOTPLUG_SIZE);
    let memory = GuestMemory::new(Arc::clone(&pool), config(Populate::Lazy)).expect("memory");
    let mut core = memory.pool().core_frames(0);
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    let plugged = GuestAddress(HOTPLUG + 4 * CHUNK);
    memory.plug(plugged, CHUNK, &mut core).expect("plug");
    let touch = |start: u64| Touch {
        start,
        count: 16,
        stride: 4096,
        marker: 0xab,
    };
    vm.run(&memory, 0, touch(plugged.0))
        .expect("plugged memory");
    assert_eq!(memory.read_obj::<u32>(plugged).unwrap(), 0xab);
    let before = used(&pool);
    // KVM fails the access (EFAULT), or (PVM) leaves it to the VMM as an MMIO exit: either
    // way the guest reaches no memory.
    let refused = |result: &Result<u32, TouchError>| matches!(result, Err(TouchError::Other(e)) if e.contains("Bad address") || e.contains("Mmio"));
    let result = vm.run(&memory, 1, touch(HOTPLUG));
    assert!(refused(&result), "touching unplugged memory: {result:?}");
    assert_eq!(used(&pool), before, "no frame for unplugged memory");
    // Unplugged under the guest's feet: the next touch fails too.
    memory.unplug(plugged, CHUNK, &mut core).expect("unplug");
    let result = vm.run(&memory, 2, touch(plugged.0));
    assert!(
        refused(&result),
        "touching memory unplugged under the guest: {result:?}"
    );
    assert_eq!(used(&pool), before - CHUNK);
}

#[test]
fn a_vm_in_a_zone_keeps_its_plugged_memory_and_nothing_else_across_a_reopen() {
    let path = TempFile::new("zone-hotplug");
    let zone_config = ZoneConfig {
        size: 64 * MIB,
        frame_size: FrameSize::Huge,
        max_vms: DEFAULT_MAX_VMS,
    };
    Zone::create(&path.0, &zone_config).expect("create");
    let layout = VmLayout {
        chunk_size: FrameSize::Huge,
        regions: vec![(0, RAM), (HOTPLUG, HOTPLUG_SIZE)],
    };
    let open = |zone: &Arc<Zone>| {
        let vm = zone.attach("plugger", &layout).expect("attach");
        GuestMemory::new_in_zone(vm, config(Populate::Lazy), &Population::default())
            .expect("memory")
    };
    let zone = Zone::open(&path.0, 2).expect("open");
    let memory = open(&zone);
    let mut core = memory.pool().core_frames(memory.vmm_core());
    memory
        .plug(GuestAddress(HOTPLUG), 3 * CHUNK, &mut core)
        .expect("plug");
    memory
        .write_slice(b"plugged, kept", GuestAddress(HOTPLUG + CHUNK))
        .expect("write");
    memory
        .unplug(GuestAddress(HOTPLUG + 2 * CHUNK), CHUNK, &mut core)
        .expect("unplug");
    let free = zone.info().expect("info").free_frames;
    drop((core, memory));
    drop(zone);

    let zone = Zone::open(&path.0, 2).expect("reopen");
    let info = zone.info().expect("info");
    assert_eq!((info.leaked_frames, info.lost_frames), (0, 0));
    assert_eq!(info.free_frames, free, "the plugged frames stay the VM's");
    let memory = open(&zone);
    let plugged = memory
        .plugged_chunks(GuestAddress(HOTPLUG), HOTPLUG_SIZE)
        .unwrap();
    assert_eq!(plugged, 2);
    let mut text = [0u8; 13];
    memory
        .read_slice(&mut text, GuestAddress(HOTPLUG + CHUNK))
        .expect("read");
    assert_eq!(&text, b"plugged, kept");
    assert!(memory
        .read_obj::<u8>(GuestAddress(HOTPLUG + 2 * CHUNK))
        .is_err());
    // Another layout (no hot-pluggable memory) is another VM's.
    let plain = VmLayout {
        chunk_size: FrameSize::Huge,
        regions: vec![(0, RAM)],
    };
    drop(memory);
    assert!(zone.attach("plugger", &plain).is_err());
}
