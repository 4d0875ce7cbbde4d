//! End-to-end: the real-Linux harness (tests/linux-nested/run.sh) stops at a stage that fails.
//! Its L2 kernel stage is run sourced, with the kernel's build stood in for by shell functions
//! (no kernel source is unpacked): a `make` that fails stops the harness with its error, and
//! the kernel cache is left as it was; a build that succeeds lands in the cache whole.

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::Command;

use e2e_tests::Scratch;

/// Runs the harness's L2 kernel stage with the cache in `cache`, `make` standing in as
/// `make_body` (shell code); returns its exit status and what it printed.
fn l2_kernel_stage(cache: &str, make_body: &str) -> (Option<i32>, String, String) {
    let harness = Path::new(env!("CARGO_MANIFEST_DIR")).join("linux-nested/run.sh");
    let script = format!(
        r#"set -euo pipefail
source "$1"
CACHE=$2
dpkg-query() {{ echo 6.1-test; }}
tar() {{
    mkdir -p "$4/scripts/kconfig" "$4/arch/x86/boot/compressed"
    printf '#!/bin/sh\ngrep -E "^CONFIG_" "$3" >"$2"\n' >"$4/scripts/kconfig/merge_config.sh"
    chmod +x "$4/scripts/kconfig/merge_config.sh"
}}
make() {{ {make_body}; }}
nice() {{ "$@"; }}
kernel=$(l2_kernel)
echo "went on with $kernel""#
    );
    let output = Command::new("bash")
        .args(["-c", &script, "harness"])
        .arg(&harness)
        .arg(cache)
        .output()
        .expect("bash");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The names in directory `dir`, sorted.
fn names(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_failed_kernel_build_stops_the_harness_and_leaves_the_cache_as_it_was() {
    let scratch = Scratch::new("nested-harness");
    let cache = scratch.path("cache");
    let old = scratch.path("cache/l2-0000000000000000");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(format!("{old}/bzImage"), b"an older kernel").unwrap();

    let (status, stdout, stderr) = l2_kernel_stage(
        &cache,
        r#"echo "make: the build was stopped" >&2; return 2"#,
    );
    assert_ne!(status, Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.contains("went on"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("make: the build was stopped"),
        "{stdout}\n{stderr}"
    );
    // The older kernel is there as it was; the failed build's tree is kept aside, and no
    // kernel of this configuration is in the cache.
    assert_eq!(
        std::fs::read(format!("{old}/bzImage")).unwrap(),
        b"an older kernel"
    );
    let left = names(&cache);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left[0].starts_with("building-l2-"), "{left:?}");

    // A build that succeeds is moved into the cache whole.
    let (status, stdout, stderr) = l2_kernel_stage(
        &cache,
        r#"if [ "${!#}" = bzImage ]; then
               echo kernel >arch/x86/boot/bzImage
               echo elf >arch/x86/boot/compressed/vmlinux.bin
           fi"#,
    );
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    let built = stdout
        .trim()
        .strip_prefix("went on with ")
        .unwrap()
        .to_owned();
    let dir = Path::new(&built).parent().unwrap();
    assert_eq!(std::fs::read(&built).unwrap(), b"kernel\n");
    assert_eq!(std::fs::read(dir.join("vmlinux")).unwrap(), b"elf\n");
    assert!(!dir.join("build").exists());
    let left = names(&cache);
    assert!(
        left.iter().all(|name| !name.starts_with("building-")),
        "{left:?}"
    );
}
