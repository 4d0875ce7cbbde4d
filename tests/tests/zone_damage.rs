//! End-to-end: damage to a zone's metadata, made from outside with the file's bytes, never
//! changes a VM's memory silently. A damaged frame-table entry is repaired from its frame's
//! owner and the guest finds its memory as it was; memory that recovery cannot find marks the VM
//! damaged: `vmm zone inspect` lists the lost ranges, `vmm run` refuses the VM until
//! `--accept-damaged` says to go on with zeroes there. A damaged word of the VM directory keeps
//! the VM and its memory as they are until `vmm zone accept-slot` (or `delete-vm --slot`).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

mod vmm_common;

use std::os::unix::fs::FileExt;

use e2e_tests::kvm_available;
use vmm_common::{client, Scratch, VmmRun};

const MEMORY: &str = "32M";
/// Chunks 1 and 2: one of their entries is zeroed, and repaired.
const REPAIRED: &str = "2M+4M:0xA11CE";
/// Chunk 4: its entry and its frame's owner are both damaged, and its memory is lost.
const LOST: &str = "8M+2M:0xB0B";

/// The header words (at these word indices) that give the offsets of the directory, of the
/// frame tables (slot 0 first) and of the owner map.
const DIRECTORY_WORD: u64 = 8;
const TABLES_WORD: u64 = 9;
const OWNERS_WORD: u64 = 19;

/// A zone file as a tool that damages it sees it.
struct ZoneFile(std::fs::File);

impl ZoneFile {
    fn word(&self, offset: u64) -> u64 {
        let mut word = [0u8; 8];
        self.0.read_exact_at(&mut word, offset).unwrap();
        u64::from_le_bytes(word)
    }

    fn set_word(&self, offset: u64, value: u64) {
        self.0.write_all_at(&value.to_le_bytes(), offset).unwrap();
    }

    /// The offset of chunk `chunk`'s entry in the frame table of the zone's first VM.
    fn entry(&self, chunk: u64) -> u64 {
        self.word(TABLES_WORD * 8) + chunk * 8
    }

    /// The offset of the owner word of the 2 MiB frame that the entry `entry` names.
    fn owner(&self, entry: u64) -> u64 {
        self.word(OWNERS_WORD * 8) + (entry - 1) / 512 * 8
    }
}

fn inspect(zone: &str) -> serde_json::Value {
    let run = client(&["zone", "inspect", "--json", zone]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    serde_json::from_str(&run.stdout).unwrap()
}

fn run_vm(zone: &str, workload: &str, extra: &[&str]) -> vmm_common::Finished {
    let mut args = vec![
        "--zone",
        zone,
        "--vm",
        "precious",
        "--memory",
        MEMORY,
        "--workload",
        workload,
    ];
    args.extend_from_slice(extra);
    VmmRun::run(&args)
}

/// A new 64 MiB zone in a scratch directory named after `test`, whose VM ran `workload`: the
/// directory, the zone's path and the zone file to damage.
fn zone_with_vm(test: &str, workload: &str) -> (Scratch, String, ZoneFile) {
    let scratch = Scratch::new(test);
    let zone = scratch.path("zone");
    let created = client(&["zone", "create", &zone, "--size", "64M"]);
    assert_eq!(created.code, Some(0), "{created:#?}");
    run_vm(&zone, workload, &[]).assert_success();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&zone)
        .unwrap();
    (scratch, zone, ZoneFile(file))
}

#[test]
fn damaged_zone_metadata_is_repaired_or_the_loss_is_reported_and_must_be_accepted() {
    if !kvm_available(
        "damaged_zone_metadata_is_repaired_or_the_loss_is_reported_and_must_be_accepted",
    ) {
        return;
    }
    let (_scratch, zone, file) =
        zone_with_vm("zone-damage", &format!("write:{REPAIRED},write:{LOST}"));

    // One entry zeroed: repaired from its frame's owner; the guest finds its memory.
    file.set_word(file.entry(2), 0);
    let info = inspect(&zone);
    assert_eq!(info["recovery"]["repaired_entries"], 1, "{info:#}");
    assert_eq!(info["damaged_vms"], serde_json::json!([]), "{info:#}");
    run_vm(&zone, &format!("verify:{REPAIRED},verify:{LOST}"), &[]).assert_success();

    // An entry and its frame's owner both damaged: the chunk's memory is lost, and said so.
    let entry = file.word(file.entry(4));
    file.set_word(file.owner(entry), 0);
    file.set_word(file.entry(4), 4);
    let info = inspect(&zone);
    assert_eq!(info["recovery"]["damaged_chunks"], 1, "{info:#}");
    assert_eq!(info["recovery"]["orphaned_frames"], 1, "{info:#}");
    let lost =
        serde_json::json!([{"name": "precious", "lost": [{"start": 8 << 20, "size": 2 << 20}]}]);
    assert_eq!(info["damaged_vms"], lost, "{info:#}");
    let text = client(&["zone", "inspect", &zone]);
    assert!(
        text.stdout.contains("DAMAGED") && text.stdout.contains("0x800000-0xa00000 (2 MiB)"),
        "{text:#?}"
    );
    let refused = run_vm(&zone, &format!("verify:{REPAIRED}"), &[]);
    assert_ne!(refused.code, Some(0), "{refused:#?}");
    assert!(
        refused.stderr.contains("is damaged")
            && refused.stderr.contains("0x800000-0xa00000 (2 MiB)")
            && refused.stderr.contains("--accept-damaged"),
        "{refused:#?}"
    );

    // Accepted: the rest of the memory is there, the lost chunk reads as zeroes.
    let accepted = run_vm(
        &zone,
        &format!("verify:{REPAIRED},verify-zero:8M+2M"),
        &["--accept-damaged"],
    );
    assert_eq!(accepted.code, Some(0), "{accepted:#?}");
    assert_eq!(
        accepted.stderr.trim(),
        format!(
            "[precious] warning: zone {zone}: VM 'precious' attached with its lost memory \
             (now zeroes) accepted: 0x800000-0xa00000 (2 MiB)"
        ),
        "{accepted:#?}"
    );
    let info = inspect(&zone);
    assert_eq!(info["damaged_vms"], serde_json::json!([]), "{info:#}");
    assert_eq!(
        (info["leaked_frames"].as_u64(), info["lost_frames"].as_u64()),
        (Some(0), Some(0)),
        "{info:#}"
    );
}

#[test]
fn a_damaged_directory_word_keeps_the_vm_and_its_memory_until_a_person_decides() {
    if !kvm_available("a_damaged_directory_word_keeps_the_vm_and_its_memory_until_a_person_decides")
    {
        return;
    }
    let (_scratch, zone, file) = zone_with_vm("zone-slot-damage", &format!("write:{REPAIRED}"));
    // All ones in the first slot's flags word (which read as "ephemeral" made the VM vanish
    // at the end of its next run).
    file.set_word(file.word(DIRECTORY_WORD * 8) + 0xf8, u64::MAX);
    let info = inspect(&zone);
    assert_eq!(info["vms"], serde_json::json!([]), "{info:#}");
    let slot = &info["damaged_slots"][0];
    assert_eq!(
        (
            &slot["slot"],
            &slot["recorded_name"],
            &slot["damage"],
            &slot["frames"]
        ),
        (
            &serde_json::json!(0),
            &serde_json::json!("precious"),
            &serde_json::json!("its flags word fails its check"),
            // Chunks 1 and 2, and chunk 0 with the guest's own code and page tables.
            &serde_json::json!(3)
        ),
        "{info:#}"
    );
    assert_eq!(info["free_frames"], 29, "{info:#}");
    let refused = run_vm(&zone, &format!("verify:{REPAIRED}"), &[]);
    assert_eq!(refused.code, Some(2), "{refused:#?}");
    assert!(
        refused
            .stderr
            .contains("VM slot 0 (recorded name 'precious') is damaged")
            && refused.stderr.contains("vmm zone accept-slot"),
        "{refused:#?}"
    );
    // Still there after the refused run, and given back as it reads.
    assert_eq!(inspect(&zone)["damaged_slots"][0]["frames"], 3);
    let accepted = client(&["zone", "accept-slot", &zone, "0"]);
    assert_eq!(accepted.code, Some(0), "{accepted:#?}");
    run_vm(&zone, &format!("verify:{REPAIRED}"), &[]).assert_success();
    let info = inspect(&zone);
    assert_eq!(info["vms"][0]["name"], "precious", "{info:#}");
    assert_eq!(info["damaged_slots"], serde_json::json!([]), "{info:#}");
    run_vm(&zone, &format!("verify:{REPAIRED}"), &[]).assert_success();
}
