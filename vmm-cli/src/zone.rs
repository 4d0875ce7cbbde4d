//! `vmm zone`: create, inspect, delete VMs from and clean up persistent zones.

use std::path::Path;

use guest_mem::zone::{RecoveryKind, RecoveryReport, Zone, ZoneConfig, ZoneError, ZoneInfo};
use guest_mem::FrameSize;
use serde_json::json;
use vmm::config::format_size;

use crate::args::{FrameSizeArg, ZoneAction};
use crate::exit::{zone_error_status, ExitStatus};

/// LLFree cores of a zone opened by these commands (they allocate nothing).
const CORES: usize = 1;

/// Runs a `vmm zone` subcommand.
pub(super) fn run(action: ZoneAction) -> ExitStatus {
    let result = match action {
        ZoneAction::Create {
            path,
            size,
            frame_size,
            max_vms,
        } => create(&path, size, frame_size, max_vms),
        ZoneAction::Inspect { path, json } => inspect(&path, json),
        ZoneAction::DeleteVm { path, name, slot } => Zone::open(&path, CORES)
            .and_then(|zone| match slot {
                Some(slot) => zone.delete_slot(slot),
                // clap asks for a name where no slot is given.
                None => zone.delete_vm(name.as_deref().unwrap_or_default()),
            })
            .map(|frames| {
                let which = match (name, slot) {
                    (_, Some(slot)) => format!("the VM of slot {slot}"),
                    (name, None) => format!("VM '{}'", name.unwrap_or_default()),
                };
                println!(
                    "deleted {which} from {}: {} freed",
                    path.display(),
                    count(frames, "frame", "frames")
                )
            }),
        ZoneAction::AcceptSlot { path, slot } => Zone::open(&path, CORES)
            .and_then(|zone| zone.accept_slot(slot))
            .map(|name| {
                println!(
                    "accepted slot {slot} of {} as it reads: VM '{name}' can be attached again",
                    path.display()
                )
            }),
        ZoneAction::Gc { path } => Zone::open(&path, CORES).and_then(|zone| {
            let released = zone.release_free_frames()?;
            let recovery = zone.recovery();
            println!(
                "{}: {} recovery: {}; released the memory of {}",
                path.display(),
                recovery.kind.name(),
                repairs(&recovery),
                count(released, "free frame", "free frames"),
            );
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitStatus::Success,
        Err(e) => {
            eprintln!("error: {e}");
            zone_error_status(&e)
        }
    }
}

fn create(path: &Path, size: u64, frame_size: FrameSizeArg, max_vms: u64) -> Result<(), ZoneError> {
    let frame_size = match frame_size {
        FrameSizeArg::Huge => FrameSize::Huge,
        FrameSizeArg::Giant => FrameSize::Giant,
    };
    Zone::create(
        path,
        &ZoneConfig {
            size,
            frame_size,
            max_vms,
        },
    )?;
    println!(
        "created zone {}: {} in {} frames, room for {max_vms} VMs",
        path.display(),
        format_size(size),
        frame_size.name()
    );
    Ok(())
}

fn inspect(path: &Path, as_json: bool) -> Result<(), ZoneError> {
    let zone = Zone::open(path, CORES)?;
    let info = zone.info()?;
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&info)).expect("JSON")
        );
    } else {
        print_text(path, &info);
    }
    Ok(())
}

/// The JSON form of `vmm zone inspect --json`.
fn to_json(info: &ZoneInfo) -> serde_json::Value {
    let frame = info.frame_size.bytes();
    json!({
        "id": format!("{:032x}", info.id),
        "size_bytes": info.size,
        "frame_size_kib": frame >> 10,
        "frames": info.frames,
        "free_frames": info.free_frames,
        "used_frames": info.frames - info.free_frames,
        "max_vms": info.max_vms,
        "map_sync": info.map_sync,
        "leaked_frames": info.leaked_frames,
        "lost_frames": info.lost_frames,
        "other_processes": info.processes.iter().filter(|p| !p.this).map(|p| p.pid)
            .collect::<Vec<_>>(),
        "recovery": {
            "kind": info.recovery.kind.name(),
            "freed_leaked_frames": info.recovery.leaked_frames,
            "took_back_lost_frames": info.recovery.lost_frames,
            "dead_processes": info.recovery.dead_processes,
            "repaired_entries": info.recovery.repaired_entries,
            "damaged_chunks": info.recovery.damaged_chunks,
            "orphaned_frames": info.recovery.orphaned_frames,
            "micros": info.recovery.nanos / 1000,
        },
        "damaged_slots": info.damaged_slots.iter().map(|slot| json!({
            "slot": slot.slot,
            "recorded_name": slot.name,
            "damage": slot.what,
            "frames": slot.frames,
        })).collect::<Vec<_>>(),
        "damaged_vms": info.vms.iter().filter(|vm| !vm.damaged.is_empty()).map(|vm| json!({
            "name": vm.name,
            "lost": vm.damaged.iter()
                .map(|(start, size)| json!({"start": start, "size": size}))
                .collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "vms": info.vms.iter().map(|vm| json!({
            "name": vm.name,
            "id": format!("{:016x}", vm.id),
            "memory_bytes": vm.layout.bytes(),
            "regions": vm.layout.regions.iter()
                .map(|(start, size)| json!({"start": start, "size": size}))
                .collect::<Vec<_>>(),
            "frames": vm.frames,
            "given_away_pieces": vm.given_away_pieces,
            "owner_pid": vm.owner,
            "waiting": vm.waiting.map(|(since, bytes)| json!({
                "since_unix_ms": since,
                "for_seconds": waited_seconds(since),
                "bytes": bytes,
            })),
            "damaged": !vm.damaged.is_empty(),
            "clone_of": vm.clone_of,
        })).collect::<Vec<_>>(),
    })
}

/// What a recovery repaired, naming only what it found ("nothing to repair" on a healthy zone).
fn repairs(recovery: &RecoveryReport) -> String {
    let found: Vec<String> = [
        (
            recovery.leaked_frames,
            "freed",
            "leaked frame",
            "leaked frames",
        ),
        (
            recovery.lost_frames,
            "took back",
            "lost frame",
            "lost frames",
        ),
        (
            recovery.dead_processes,
            "recovered",
            "dead VMM process",
            "dead VMM processes",
        ),
    ]
    .into_iter()
    .filter(|(n, ..)| *n > 0)
    .map(|(n, verb, one, many)| format!("{verb} {}", count(n, one, many)))
    .collect();
    if found.is_empty() {
        "nothing to repair".into()
    } else {
        found.join(", ")
    }
}

/// "1 frame", "2 frames".
fn count(n: u64, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// Seconds from `since` (milliseconds since the Unix epoch) to now.
fn waited_seconds(since: u64) -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| u64::try_from(now.as_millis()).unwrap_or(u64::MAX));
    now.saturating_sub(since) as f64 / 1000.0
}

fn print_text(path: &Path, info: &ZoneInfo) {
    let frame = info.frame_size.bytes();
    let sync = match info.map_sync {
        true => " (DAX, MAP_SYNC)",
        false => "",
    };
    println!("zone {}{sync}, id {:032x}", path.display(), info.id);
    println!(
        "  size {} in {} frames: {} used, {} free",
        format_size(info.size),
        info.frame_size.name(),
        info.frames - info.free_frames,
        info.free_frames
    );
    let after = match info.recovery.kind {
        RecoveryKind::Fresh => "after its creation",
        RecoveryKind::Clean => "after a clean shutdown",
        RecoveryKind::Crash => "after a crash",
        RecoveryKind::Attached => "beside other processes",
    };
    println!(
        "  opened {after} in {} µs: {}",
        info.recovery.nanos / 1000,
        repairs(&info.recovery)
    );
    let recovery = &info.recovery;
    if recovery.repaired_entries + recovery.damaged_chunks + recovery.orphaned_frames > 0 {
        println!(
            "  its metadata was damaged: repaired {} frame-table entries or owners, marked {} \
             chunks lost, found {} frames of data that nothing named",
            recovery.repaired_entries, recovery.damaged_chunks, recovery.orphaned_frames
        );
    }
    let others: Vec<String> = info
        .processes
        .iter()
        .filter(|p| !p.this)
        .map(|p| p.pid.to_string())
        .collect();
    if !others.is_empty() {
        println!("  open in processes {}", others.join(", "));
    }
    println!(
        "  now: {}, {}",
        count(info.leaked_frames, "leaked frame", "leaked frames"),
        count(info.lost_frames, "lost frame", "lost frames")
    );
    println!("  VMs: {} of {}", info.vms.len(), info.max_vms);
    for slot in &info.damaged_slots {
        println!(
            "    DAMAGED slot {}{}: {}; its {} stay allocated, and no VM is attached to it or \
             created until you decide: `vmm zone accept-slot {} {}` takes it as it reads, `vmm \
             zone delete-vm {} --slot {}` deletes it",
            slot.slot,
            slot.name
                .as_ref()
                .map_or(String::new(), |name| format!(" (recorded name '{name}')")),
            slot.what,
            count(slot.frames, "frame", "frames"),
            path.display(),
            slot.slot,
            path.display(),
            slot.slot
        );
    }
    for vm in &info.vms {
        let owner = vm
            .owner
            .map_or(String::new(), |pid| format!(", in use by {pid}"));
        let own = match vm.clone_of {
            Some(_) => " of its own",
            None => "",
        };
        println!(
            "    {}: {} of guest memory, {} ({}){own}, {} KiB given to the balloon{owner}",
            vm.name,
            format_size(vm.layout.bytes()),
            count(vm.frames, "frame", "frames"),
            format_size(vm.frames * frame),
            vm.given_away_pieces * 4
        );
        if let Some(base) = &vm.clone_of {
            let shared = info
                .vms
                .iter()
                .find(|other| other.name == *base)
                .map_or(0, |base| base.frames);
            println!(
                "      a clone of '{base}': it maps the base's {} privately (shared until \
                 written; ephemeral: it goes with its process)",
                count(shared, "frame", "frames")
            );
        }
        if let Some((since, bytes)) = vm.waiting {
            println!(
                "      WAITING for {} of memory for {:.1} s (the zone is exhausted)",
                format_size(bytes),
                waited_seconds(since)
            );
        }
        if !vm.damaged.is_empty() {
            println!(
                "      DAMAGED: its memory at guest physical {} is lost (attach it with \
                 --accept-damaged to go on with zeroes there, or delete it)",
                guest_mem::zone::format_ranges(&vm.damaged)
            );
        }
    }
}
