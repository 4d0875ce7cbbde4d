//! Persistent pools in a file: the allocator's metadata in the file's header, guest contents in
//! its frames, surviving unmapping, closing and reopening.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::Arc;

use common::{touch, RegionVm, TempFile, MIB};
use guest_mem::{Backing, GuestMemory, MemoryConfig, Pool, PoolConfig};
use vm_memory::{Bytes, GuestAddress};

fn file_config(path: &TempFile, size: u64, format: bool) -> PoolConfig {
    PoolConfig::new(
        Backing::File {
            path: path.0.clone(),
            format,
        },
        size,
    )
}

fn memory_config() -> MemoryConfig {
    common::memory_config(32 * MIB, 1)
}

#[test]
fn contents_survive_unmapping_closing_and_reopening() {
    let file = TempFile::new("survive");
    let pool = Pool::new(file_config(&file, 64 * MIB, false)).expect("new pool");
    eprintln!("MAP_SYNC (DAX): {}", pool.uses_map_sync());
    let memory = GuestMemory::new(Arc::clone(&pool), memory_config()).expect("memory");
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    assert_eq!(
        vm.run(&memory, 0, touch(2 * MIB, 2 * MIB, 8, 0xC0FFEE)),
        Ok(0)
    );
    memory
        .write_slice(b"persistent hello", GuestAddress(20 * MIB + 4096))
        .expect("write");
    drop(vm);
    let snapshot = memory.detach();
    drop(pool);

    let pool = Pool::new(file_config(&file, 64 * MIB, false)).expect("reopen pool");
    assert_eq!(
        pool.stats().used_bytes,
        10 * 2 * MIB,
        "the frames are still allocated"
    );
    let memory =
        GuestMemory::restore(Arc::clone(&pool), memory_config(), &snapshot).expect("restore");
    let mut text = [0u8; 16];
    memory
        .read_slice(&mut text, GuestAddress(20 * MIB + 4096))
        .expect("read");
    assert_eq!(&text, b"persistent hello");
    let Some(vm) = RegionVm::new(&memory) else {
        return;
    };
    // The guest finds its markers again (the program ORs the old values).
    assert_eq!(
        vm.run(&memory, 0, touch(2 * MIB, 2 * MIB, 8, 0xC0FFEE)),
        Ok(0xC0FFEE)
    );
    drop(vm);
    drop(memory);
    assert_eq!(
        pool.stats().used_bytes,
        0,
        "dropping the memory frees its frames"
    );
    drop(pool);
    let pool = Pool::new(file_config(&file, 64 * MIB, false)).expect("reopen again");
    assert_eq!(pool.stats().used_bytes, 0);
}

#[test]
fn restoring_frames_the_pool_does_not_hold_is_refused() {
    let file = TempFile::new("refuse");
    let pool = Pool::new(file_config(&file, 64 * MIB, false)).expect("pool");
    let memory = GuestMemory::new(Arc::clone(&pool), memory_config()).expect("memory");
    memory.write_obj(1u8, GuestAddress(0)).expect("populate");
    let snapshot = memory.detach();
    // Formatting frees everything (and scrubs the frames).
    drop(pool);
    let pool = Pool::new(file_config(&file, 64 * MIB, true)).expect("format");
    let err = GuestMemory::restore(pool, memory_config(), &snapshot).expect_err("stale");
    assert!(err.to_string().contains("is not allocated"), "{err}");
}

#[test]
fn foreign_and_mismatched_files_give_clear_errors() {
    let file = TempFile::new("foreign");
    std::fs::write(&file.0, b"some precious user data").expect("write");
    let err = Pool::new(file_config(&file, 64 * MIB, false)).expect_err("foreign");
    assert!(
        err.to_string().contains("holds no llfree-vmm pool"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&file.0).expect("read")[..23],
        b"some precious user data"[..],
        "the file is left alone"
    );
    drop(Pool::new(file_config(&file, 64 * MIB, true)).expect("format"));
    let err = Pool::new(file_config(&file, 128 * MIB, false)).expect_err("size");
    assert!(
        err.to_string()
            .contains("holds 67108864 bytes of frames, but 134217728 were requested"),
        "{err}"
    );
}

#[test]
fn a_foreign_file_is_left_byte_for_byte_unchanged() {
    let file = TempFile::new("untouched");
    let contents: Vec<u8> = (0..3 * MIB + 5).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&file.0, &contents).expect("write");
    let err = Pool::new(file_config(&file, 64 * MIB, false)).expect_err("foreign");
    assert!(
        err.to_string().contains("holds no llfree-vmm pool"),
        "{err}"
    );
    assert!(
        std::fs::read(&file.0).expect("read") == contents,
        "the file's size and every byte are as before"
    );
}

#[test]
fn a_truncated_pool_file_is_refused_and_left_alone() {
    let file = TempFile::new("truncated");
    drop(Pool::new(file_config(&file, 64 * MIB, false)).expect("new pool"));
    let full = std::fs::metadata(&file.0).expect("stat").len();
    let short = full - 2 * MIB;
    std::fs::File::options()
        .write(true)
        .open(&file.0)
        .and_then(|f| f.set_len(short))
        .expect("truncate");
    let err = Pool::new(file_config(&file, 64 * MIB, false)).expect_err("truncated");
    assert_eq!(
        err.to_string(),
        format!(
            "pool file {} holds {short} bytes, but its pool needs {full} (truncated?)",
            file.0.display()
        )
    );
    assert_eq!(std::fs::metadata(&file.0).expect("stat").len(), short);
}

#[test]
fn a_pool_whose_creation_was_interrupted_is_created_again() {
    let file = TempFile::new("half-created");
    // What a process killed in the middle of creating a pool leaves: the creation mark, the
    // full size, and not yet the header.
    let mut mark = [0u8; 40];
    mark[..8].copy_from_slice(b"LLFVMPL~");
    std::fs::write(&file.0, mark).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&file.0)
        .expect("open")
        .set_len(80 * MIB)
        .expect("grow");
    let pool = Pool::new(file_config(&file, 64 * MIB, false)).expect("created again");
    assert_eq!(pool.stats().free_bytes, 64 * MIB);
    drop(pool);
    let reopened = Pool::new(file_config(&file, 64 * MIB, false)).expect("reopened");
    assert_eq!(reopened.stats().free_bytes, 64 * MIB);
}
