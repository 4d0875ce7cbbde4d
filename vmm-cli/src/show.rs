//! Short human views of the API's JSON for `vmm info`, `vmm memory` and `vmm balloon get|stats`
//! (`--json` prints the whole objects instead). They read the JSON loosely: a field a VMM does
//! not send is left out, never an error.

use serde_json::Value;

const MIB: f64 = (1u64 << 20) as f64;

fn u64_of(json: &Value, key: &str) -> Option<u64> {
    json.get(key).and_then(Value::as_u64)
}

fn str_of<'a>(json: &'a Value, key: &str) -> Option<&'a str> {
    json.get(key).and_then(Value::as_str)
}

/// Bytes as MiB, with one decimal only where it is not whole.
fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

/// `count` and `noun`, in the plural unless it is 1.
fn count(count: u64, noun: &str) -> String {
    match count {
        1 => format!("1 {noun}"),
        _ => format!("{count} {noun}s"),
    }
}

/// Lines of "label  text", the labels padded to one width.
fn table(rows: &[(String, String)]) -> String {
    let width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(label, text)| format!("{label:<width$}  {text}\n"))
        .collect()
}

/// `GET /machine`: the state first, then what the VM is.
pub fn machine(json: &Value) -> String {
    let mut rows = vec![(
        "state".to_owned(),
        str_of(json, "state").unwrap_or("?").to_owned(),
    )];
    if let Some(vcpus) = u64_of(json, "vcpu_count") {
        rows.push(("vcpus".into(), vcpus.to_string()));
    }
    if let Some(memory) = u64_of(json, "mem_size_mib") {
        let mut text = format!("{memory} MiB");
        if let Some(backing) = str_of(json, "backing") {
            text.push_str(&format!(", {backing} backing"));
        }
        if let Some(frame) = u64_of(json, "frame_size_kib") {
            text.push_str(&format!(", frames of {}", mib(frame << 10)));
        }
        match str_of(json, "populate") {
            Some("eager") => text.push_str(", populated eagerly (all at the start)"),
            Some("lazy") => text.push_str(", populated lazily (on first touch)"),
            Some("mapped") => text.push_str(", frames mapped at the start, pages on first touch"),
            _ => {}
        }
        rows.push(("memory".into(), text));
    }
    if let Some(vm) = str_of(json, "zone_vm") {
        rows.push(("zone VM".into(), vm.to_owned()));
    }
    if let Some(guest) = str_of(json, "guest") {
        rows.push(("guest".into(), guest.to_owned()));
    }
    if let Some(balloon) = json.get("balloon").and_then(Value::as_bool) {
        rows.push(("balloon".into(), if balloon { "yes" } else { "no" }.into()));
    }
    if let Some(version) = str_of(json, "vmm_version") {
        rows.push(("version".into(), version.to_owned()));
    }
    table(&rows)
}

/// `GET /memory`: guest memory, waits, the pool with its trees summarised, one line per vCPU.
pub fn memory(json: &Value) -> String {
    let mut rows = Vec::new();
    let guest = &json["guest"];
    if let (Some(chunks), Some(populated), Some(chunk_kib)) = (
        u64_of(guest, "chunks"),
        u64_of(guest, "populated_chunks"),
        u64_of(guest, "chunk_size_kib"),
    ) {
        let chunk = chunk_kib << 10;
        rows.push((
            "guest".into(),
            format!(
                "{} in {} of {}: {populated} populated ({}), {} discarded",
                mib(chunks * chunk),
                count(chunks, "chunk"),
                mib(chunk),
                mib(populated * chunk),
                u64_of(guest, "discarded_chunks").unwrap_or(0)
            ),
        ));
        if let Some(file) = u64_of(guest, "file_backed_chunks").filter(|&n| n > 0) {
            rows.push(match str_of(guest, "clone_of") {
                Some(base) => (
                    "base".into(),
                    format!(
                        "{} mapped from the frames of zone VM '{base}' ({}; shared with it and \
                         its other clones until written)",
                        count(file, "chunk"),
                        mib(file * chunk)
                    ),
                ),
                None => (
                    "memory file".into(),
                    format!(
                        "{} mapped from the snapshot's memory file ({}; shared with every VM \
                         loaded from it until written)",
                        count(file, "chunk"),
                        mib(file * chunk)
                    ),
                ),
            });
        }
        if let Some(faults) = u64_of(guest, "faults") {
            // Faults count what vCPUs populated; the VMM populates the rest itself.
            let by_vmm = populated.saturating_sub(faults);
            let mut text = format!("{} populated chunks", count(faults, "vCPU fault"));
            if by_vmm > 0 {
                text.push_str(&format!(
                    "; the VMM populated the other {by_vmm} (the guest's image, eager \
                     population, device accesses)"
                ));
            }
            if faults > populated {
                text.push_str("; a chunk discarded and touched again faults again");
            }
            rows.push(("faults".into(), text));
        }
        let waiting = u64_of(guest, "waiting_vcpus").unwrap_or(0)
            + u64_of(guest, "waiting_other_faults").unwrap_or(0);
        rows.push((
            "waiting".into(),
            match waiting {
                0 => "no fault waits for memory".into(),
                _ => format!(
                    "{} and {} wait for memory",
                    count(u64_of(guest, "waiting_vcpus").unwrap_or(0), "vCPU"),
                    count(
                        u64_of(guest, "waiting_other_faults").unwrap_or(0),
                        "other fault"
                    )
                ),
            },
        ));
    }
    let pool = &json["pool"];
    if let (Some(total), Some(free)) = (u64_of(pool, "total_bytes"), u64_of(pool, "free_bytes")) {
        let mut text = format!(
            "{} used of {}, {} free",
            mib(total.saturating_sub(free)),
            mib(total),
            mib(free)
        );
        if let Some(frame_kib) = u64_of(pool, "frame_size_kib") {
            text.push_str(&format!(" (frames of {})", mib(frame_kib << 10)));
        }
        rows.push(("pool".into(), text));
    }
    if let Some(trees) = pool.get("trees").and_then(Value::as_array) {
        const TREE_FRAMES: u64 = 16384;
        let free_of = |tree: &Value| u64_of(tree, "free_4k_frames").unwrap_or(0);
        let full = trees.iter().filter(|t| free_of(t) == 0).count() as u64;
        let empty = trees.iter().filter(|t| free_of(t) >= TREE_FRAMES).count() as u64;
        let reserved = trees
            .iter()
            .filter(|t| t.get("reserved").and_then(Value::as_bool) == Some(true))
            .count() as u64;
        rows.push((
            "trees".into(),
            format!(
                "{} of 64 MiB: {full} full, {} partly used, {empty} free; {reserved} reserved \
                 by a core",
                count(trees.len() as u64, "tree"),
                trees.len() as u64 - full - empty
            ),
        ));
    }
    for vcpu in json
        .get("vcpus")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let index = u64_of(vcpu, "vcpu").unwrap_or(0);
        let mut text = count(u64_of(vcpu, "faults").unwrap_or(0), "fault");
        text.push_str(&match u64_of(vcpu, "reserved_tree") {
            Some(tree) => format!(", reserves tree {tree}"),
            None => ", no tree reserved".into(),
        });
        if let Some(waited) = u64_of(vcpu, "waiting_ms") {
            text.push_str(&format!(", waiting for memory for {waited} ms"));
        }
        rows.push((format!("vCPU {index}"), text));
    }
    let zone = &json["zone"];
    if let (Some(frames), Some(free), Some(frame_kib)) = (
        u64_of(zone, "frames"),
        u64_of(zone, "free_frames"),
        u64_of(zone, "frame_size_kib"),
    ) {
        let frame = frame_kib << 10;
        let vms: Vec<String> = zone["vms"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|vm| {
                let name = vm["name"].as_str().unwrap_or("?");
                let mut held = mib(u64_of(vm, "frames").unwrap_or(0) * frame);
                if let Some(base) = vm["clone_of"].as_str() {
                    held.push_str(&format!(" (a clone of {base})"));
                }
                match u64_of(vm, "waiting_bytes") {
                    Some(bytes) => format!("{name} {held} (waits for {})", mib(bytes)),
                    None => format!("{name} {held}"),
                }
            })
            .collect();
        rows.push((
            "zone".into(),
            format!(
                "{} free of {}; {}: {}",
                mib(free * frame),
                mib(frames * frame),
                count(vms.len() as u64, "VM"),
                vms.join(", ")
            ),
        ));
    }
    if let Some(pmem) = json.get("pmem").filter(|p| !p.is_null()) {
        rows.push((
            "pmem".into(),
            format!(
                "{} MiB, {} flushes",
                u64_of(pmem, "size_mib").unwrap_or(0),
                u64_of(pmem, "flushes").unwrap_or(0)
            ),
        ));
    }
    table(&rows)
}

/// `GET /balloon`: target and actual size, options, and the driver's violations that are not
/// zero.
pub fn balloon(json: &Value) -> String {
    let mut rows = Vec::new();
    if let Some(target) = u64_of(json, "amount_mib") {
        let actual = u64_of(json, "actual_mib")
            .map(|actual| format!(", the guest gave {actual} MiB"))
            .unwrap_or_default();
        rows.push(("target".into(), format!("{target} MiB{actual}")));
    }
    let flag = |key: &str| json.get(key).and_then(Value::as_bool) == Some(true);
    let options: Vec<&str> = [
        ("deflate_on_oom", "deflate on OOM"),
        ("free_page_reporting", "free page reporting"),
    ]
    .into_iter()
    .filter(|(key, _)| flag(key))
    .map(|(_, name)| name)
    .collect();
    rows.push((
        "options".into(),
        if options.is_empty() {
            "none".into()
        } else {
            options.join(", ")
        },
    ));
    rows.push((
        "statistics".into(),
        match u64_of(json, "stats_polling_interval_s") {
            Some(0) | None => "off".into(),
            Some(seconds) => format!("every {seconds} s"),
        },
    ));
    let violations: Vec<String> = json
        .get("driver_violations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(name, n)| n.as_u64().filter(|&n| n > 0).map(|n| format!("{name} {n}")))
        .collect();
    if !violations.is_empty() {
        rows.push(("violations".into(), violations.join(", ")));
    }
    if flag("needs_reset") {
        rows.push((
            "state".into(),
            "broken by its driver: waits for the guest to reset it".into(),
        ));
    }
    table(&rows)
}

/// `GET /hotplug/memory`: plugged and requested against the total, and the block and slot.
pub fn hotplug(json: &Value) -> String {
    let mib = |key: &str| u64_of(json, key).map_or("?".into(), |n| format!("{n} MiB"));
    table(&[
        ("plugged".into(), mib("plugged_size_mib")),
        ("requested".into(), mib("requested_size_mib")),
        ("total".into(), mib("total_size_mib")),
        (
            "blocks".into(),
            format!("{}, slots {}", mib("block_size_mib"), mib("slot_size_mib")),
        ),
    ])
}

/// `GET /balloon/statistics`: the sizes and the guest's memory figures it reported.
pub fn balloon_stats(json: &Value) -> String {
    let mut rows = Vec::new();
    if let (Some(target), Some(actual)) = (u64_of(json, "target_mib"), u64_of(json, "actual_mib")) {
        rows.push((
            "balloon".into(),
            format!("target {target} MiB, the guest gave {actual} MiB"),
        ));
    }
    for (key, label) in [
        ("total_memory", "total"),
        ("free_memory", "free"),
        ("available_memory", "available"),
        ("disk_caches", "disk caches"),
    ] {
        if let Some(bytes) = u64_of(json, key) {
            rows.push((label.into(), mib(bytes)));
        }
    }
    for (key, label) in [
        ("swap_in", "swapped in"),
        ("swap_out", "swapped out"),
        ("major_faults", "major faults"),
        ("minor_faults", "minor faults"),
        ("hugetlb_allocations", "hugetlb allocations"),
        ("hugetlb_failures", "hugetlb failures"),
    ] {
        if let Some(n) = u64_of(json, key) {
            rows.push((label.into(), n.to_string()));
        }
    }
    if rows.len() == 1 {
        rows.push(("guest".into(), "has reported no statistics yet".into()));
    }
    if json.get("clamped").and_then(Value::as_bool) == Some(true) {
        rows.push((
            "note".into(),
            "the guest reported more than its RAM; shown as its RAM".into(),
        ));
    }
    table(&rows)
}

#[cfg(test)]
mod tests;
