//! The `vmm-jailer` command's flags as a user meets them: bad values end it with status 1 and
//! the flag named, before anything is created (the jail itself: tests/tests/jailer.rs).

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::process::Command;

fn jailer(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vmm-jailer"))
        .args(args)
        .output()
        .expect("run vmm-jailer");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_values_end_it_with_status_1_before_anything_is_created() {
    let base = std::env::temp_dir().join(format!("vmm-jailer-flags-{}", std::process::id()));
    let base = base.to_str().unwrap();
    let common = ["--uid", "1", "--gid", "1", "--chroot-base-dir", base];
    let cases: &[(&[&str], &str)] = &[
        (&["--id", "a/b", "--exec-file", "/bin/true"], "--id 'a/b'"),
        (
            &["--id", "a", "--exec-file", "/no/such/file"],
            "--exec-file /no/such/file",
        ),
        (
            &["--id", "a", "--exec-file", "/dev/null"],
            "not a regular file",
        ),
        (
            &["--id", "a", "--exec-file", "/bin/true", "--cgroup", "x"],
            "--cgroup 'x'",
        ),
    ];
    for (args, said) in cases {
        let all: Vec<&str> = args.iter().chain(&common).copied().collect();
        let (code, stderr) = jailer(&all);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
    assert!(!std::path::Path::new(base).exists());
    // A missing flag is clap's usage error.
    let (code, stderr) = jailer(&["--id", "a"]);
    assert_eq!(code, Some(2), "{stderr}");
}
