use std::fs;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::Parser;
use guest_mem::{Populate, Scrub};
use vmm::boot::DEFAULT_CMDLINE;
use vmm::config::{BackingKind, GuestConfig};
use vmm::layout::CMDLINE_MAX_SIZE;

use super::*;
use crate::args::{Cli, Command};
use vmm::testguest::DEFAULT_PATTERN;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("vmm-cli-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn file(&self, name: &str) -> PathBuf {
        let path = self.0.join(name);
        fs::write(&path, b"contents").unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn run_args(flags: &[&str]) -> Result<RunArgs, clap::Error> {
    let cli = Cli::try_parse_from(["vmm", "run"].iter().chain(flags))?;
    match cli.command {
        Some(Command::Run(args)) => Ok(*args),
        other => panic!("not run: {other:?}"),
    }
}

fn config(flags: &[&str]) -> Result<VmConfig, RunConfigError> {
    VmConfig::try_from(run_args(flags).expect("flags parse"))
}

fn config_err(flags: &[&str]) -> String {
    config(flags).expect_err("must fail").to_string()
}

fn usage_err(flags: &[&str]) -> (ErrorKind, String) {
    let err = run_args(flags).expect_err("must fail");
    (err.kind(), err.to_string())
}

#[test]
fn defaults_are_a_small_lazy_test_guest() {
    let config = config(&[]).unwrap();
    assert_eq!(config.memory_size, 512 << 20);
    assert_eq!(config.backing, BackingKind::Anonymous);
    assert_eq!(
        (config.populate, config.scrub),
        (Populate::Lazy, Scrub::PunchHole)
    );
    assert_eq!(config.vcpus, 1);
    assert_eq!((config.api_socket.as_ref(), config.balloon), (None, None));
    assert_eq!(config.ram_regions().len(), 1);
    let GuestConfig::TestGuest(workload) = config.guest else {
        panic!("not the test guest")
    };
    assert_eq!(workload.steps().len(), 2);
    assert_eq!(workload.steps()[0].pattern, DEFAULT_PATTERN);
}

#[test]
fn every_flag_reaches_the_config() {
    let dir = TempDir::new("flags");
    let kernel = dir.file("vmlinux");
    let initrd = dir.file("initrd");
    let socket = dir.0.join("api.sock");
    let pool = dir.0.join("pool");
    let config = config(&[
        "--memory=4G",
        "--backing",
        &format!("file:{}", pool.display()),
        "--populate=eager",
        "--vcpus=4",
        "--kernel",
        kernel.to_str().unwrap(),
        "--initrd",
        initrd.to_str().unwrap(),
        "--cmdline=console=ttyS0 quiet",
        "--api-socket",
        socket.to_str().unwrap(),
        "--balloon=size=1G,free_page_reporting=on",
    ])
    .unwrap();
    assert_eq!(config.memory_size, 4 << 30);
    assert_eq!(config.backing, BackingKind::File(pool));
    assert_eq!((config.populate, config.vcpus), (Populate::Eager, 4));
    assert_eq!(
        config.guest,
        GuestConfig::Linux(LinuxConfig {
            kernel,
            initrd: Some(initrd),
            cmdline: "console=ttyS0 quiet".into()
        })
    );
    assert_eq!(config.api_socket, Some(socket));
    let balloon = config.balloon.unwrap();
    assert!(balloon.free_page_reporting && !balloon.deflate_on_oom);
    assert_eq!(balloon.size, 1 << 30);
    assert_eq!(
        config.ram_regions().len(),
        2,
        "4 GiB is split around the MMIO gap"
    );
}

#[test]
fn a_kernel_gets_the_default_command_line() {
    let dir = TempDir::new("cmdline");
    let kernel = dir.file("bzImage");
    let config = config(&["--kernel", kernel.to_str().unwrap(), "--vcpus=200"]).unwrap();
    let GuestConfig::Linux(linux) = config.guest else {
        panic!("not linux")
    };
    assert_eq!(linux.cmdline, DEFAULT_CMDLINE);
}

#[test]
fn malformed_flags_are_usage_errors() {
    let cases: &[(&[&str], ErrorKind, &str)] = &[
        (
            &["--memory=1X"],
            ErrorKind::ValueValidation,
            "'1X' is not a size",
        ),
        (&["--memory="], ErrorKind::ValueValidation, "empty size"),
        (
            &["--backing=zram"],
            ErrorKind::ValueValidation,
            "unknown backing 'zram'",
        ),
        (
            &["--backing=file:"],
            ErrorKind::ValueValidation,
            "needs a path",
        ),
        (
            &["--populate=sometimes"],
            ErrorKind::InvalidValue,
            "sometimes",
        ),
        (&["--vcpus=two"], ErrorKind::ValueValidation, "two"),
        (&["--vcpus=-1"], ErrorKind::ValueValidation, "-1"),
        (
            &["--initrd=/x"],
            ErrorKind::MissingRequiredArgument,
            "--kernel",
        ),
        (
            &["--cmdline=quiet"],
            ErrorKind::MissingRequiredArgument,
            "--kernel",
        ),
        (
            &["--kernel=/k", "--workload=read:all"],
            ErrorKind::ArgumentConflict,
            "--workload",
        ),
        (
            &["--workload=touch:all"],
            ErrorKind::ValueValidation,
            "unknown workload step",
        ),
        (
            &["--balloon=size=1M,size=2M"],
            ErrorKind::ValueValidation,
            "given twice",
        ),
        (
            &["--balloon=deflate_on_oom=yes"],
            ErrorKind::ValueValidation,
            "expected on or off",
        ),
        (
            &["--balloon="],
            ErrorKind::ValueValidation,
            "no balloon options",
        ),
        (&["--memroy=1G"], ErrorKind::UnknownArgument, "--memroy"),
        (
            &["--vcpus=1", "--vcpus=2"],
            ErrorKind::ArgumentConflict,
            "--vcpus",
        ),
    ];
    for (flags, kind, text) in cases {
        let (got_kind, message) = usage_err(flags);
        assert_eq!(got_kind, *kind, "{flags:?}: {message}");
        assert!(message.contains(text), "{flags:?}: {message}");
    }
}

#[test]
fn vcpu_counts_are_bounded() {
    assert_eq!(
        config_err(&["--vcpus=0"]),
        "--vcpus 0: must be between 1 and 254"
    );
    assert_eq!(
        config_err(&["--vcpus=255"]),
        "--vcpus 255: must be between 1 and 254"
    );
    assert_eq!(
        config_err(&["--vcpus=65"]),
        "--vcpus 65: the built-in test guest runs on at most 64 vCPUs"
    );
    assert_eq!(config(&["--vcpus=64", "--memory=8M"]).unwrap().vcpus, 64);
}

#[test]
fn memory_is_bounded_and_any_number_of_mib() {
    assert_eq!(
        config_err(&["--memory=2M"]),
        "--memory 2 MiB: must be between 4 MiB and 1 TiB"
    );
    assert_eq!(
        config_err(&["--memory=2T"]),
        "--memory 2 TiB: must be between 4 MiB and 1 TiB"
    );
    assert_eq!(
        config_err(&["--memory=5000K"]),
        "--memory 5000 KiB: must be a whole number of MiB"
    );
    // The last frame partly used: 5 MiB in three 2 MiB frames, 1536 MiB in two 1 GiB frames.
    let small = config(&["--memory=5M"]).unwrap();
    assert_eq!(
        small.backed_memory_size(guest_mem::FrameSize::Huge),
        6 << 20
    );
    assert_eq!(small.ram_regions()[0].size, 5 << 20);
    let giant = config(&["--memory=1536M", "--backing=hugetlb-1g"]).unwrap();
    assert_eq!(giant.backing.frame_size(), guest_mem::FrameSize::Giant);
    assert_eq!(
        giant.backed_memory_size(guest_mem::FrameSize::Giant),
        2 << 30
    );
}

#[test]
fn backing_paths_are_checked() {
    let dir = TempDir::new("backing");
    let existing = dir.file("pool");
    assert!(config(&["--backing", &format!("file:{}", existing.display())]).is_ok());
    let err = config_err(&["--backing", &format!("file:{}", dir.0.display())]);
    assert!(err.ends_with(": is a directory"), "{err}");
    assert!(err.starts_with("--backing file:/"), "{err}");
    let err = config_err(&[
        "--backing",
        &format!("file:{}/no/such/pool", dir.0.display()),
    ]);
    assert!(err.ends_with("its directory does not exist"), "{err}");
    let err = config_err(&["--backing", "file:/dev/null"]);
    assert_eq!(
        err,
        "--backing file:/dev/null: is not a regular file (a device DAX takes --backing dax:PATH)"
    );
    let err = config_err(&["--backing", &format!("dax:{}/dax0.0", dir.0.display())]);
    assert!(err.contains("No such file or directory"), "{err}");
    let err = config_err(&["--backing", &format!("dax:{}", dir.0.display())]);
    assert!(err.ends_with("is neither a DAX device nor a file"), "{err}");
    let dax_file = config(&["--backing", &format!("dax:{}", existing.display())]).unwrap();
    assert_eq!(dax_file.scrub, Scrub::PunchHole);
    // A character device cannot punch holes: its frames are zeroed instead.
    let char_device = config(&["--backing=dax:/dev/zero"]).unwrap();
    assert_eq!(char_device.scrub, Scrub::ZeroOnFree);
}

#[test]
fn kernel_and_initrd_must_be_readable_files() {
    let dir = TempDir::new("kernel");
    let kernel = dir.file("vmlinux");
    let missing = dir.0.join("missing");
    let err = config_err(&["--kernel", missing.to_str().unwrap()]);
    assert!(err.starts_with("--kernel /"), "{err}");
    assert!(err.contains("No such file or directory"), "{err}");
    let err = config_err(&["--kernel", dir.0.to_str().unwrap()]);
    assert!(err.ends_with("is not a regular file"), "{err}");
    let empty = dir.0.join("empty");
    fs::write(&empty, b"").unwrap();
    let err = config_err(&["--kernel", empty.to_str().unwrap()]);
    assert_eq!(err, format!("--kernel {}: is empty", empty.display()));
    let err = config_err(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--initrd",
        missing.to_str().unwrap(),
    ]);
    assert!(err.starts_with("--initrd /"), "{err}");
}

#[test]
fn command_lines_must_fit_and_be_printable() {
    let dir = TempDir::new("long-cmdline");
    let kernel = dir.file("vmlinux");
    let kernel = kernel.to_str().unwrap();
    let long = format!("--cmdline={}", "x".repeat(CMDLINE_MAX_SIZE));
    assert_eq!(
        config_err(&["--kernel", kernel, &long]),
        "--cmdline: 2048 bytes; at most 2047 fit"
    );
    assert_eq!(
        config_err(&["--kernel", kernel, "--cmdline=a\nb"]),
        "--cmdline: '\\n' is not a printable ASCII character"
    );
}

#[test]
fn workloads_are_resolved_against_the_vm() {
    let err = config_err(&["--memory=8M", "--workload=write:2M+8M"]);
    assert!(
        err.starts_with("--workload: workload step 'write:2M+8M'"),
        "{err}"
    );
    let err = config_err(&["--workload=read@1:all"]);
    assert!(
        err.contains("runs on vCPU 1, but the VM has 1 vCPUs"),
        "{err}"
    );
}

#[test]
fn balloon_workload_steps_need_the_balloon() {
    assert_eq!(
        config_err(&["--workload=write:all,inflate:4M"]),
        "--workload: workload step 'inflate:4M' drives the balloon: add --balloon (e.g. \
         --balloon size=0)"
    );
    assert_eq!(
        config_err(&["--balloon=size=0", "--workload=report:2M+2M"]),
        "--workload: workload step 'report:2M+2M' needs --balloon free_page_reporting=on"
    );
    let config = config(&[
        "--balloon=stats_polling_interval_s=2",
        "--workload=inflate:4M,answer-stats",
    ])
    .unwrap();
    let GuestConfig::TestGuest(workload) = config.guest else {
        panic!("a test guest")
    };
    assert_eq!(workload.steps().len(), 3, "probe, inflate, stats");
}

#[test]
fn balloons_must_fit_in_ram() {
    assert_eq!(
        config_err(&["--memory=64M", "--balloon=size=128M"]),
        "--balloon size=128 MiB: larger than guest RAM (64 MiB)"
    );
    assert!(config(&["--memory=64M", "--balloon=size=64M"]).is_ok());
}

#[test]
fn api_socket_paths_are_checked() {
    let dir = TempDir::new("socket");
    let long = dir.0.join("s".repeat(120));
    let err = config_err(&["--api-socket", long.to_str().unwrap()]);
    assert!(
        err.ends_with("longer than 107 bytes (the Unix socket limit)"),
        "{err}"
    );
    let orphan = dir.0.join("no/such/dir/api.sock");
    let err = config_err(&["--api-socket", orphan.to_str().unwrap()]);
    assert!(err.ends_with("its directory does not exist"), "{err}");
    let file = dir.file("not-a-socket");
    let err = config_err(&["--api-socket", file.to_str().unwrap()]);
    assert!(
        err.ends_with("exists and is not a socket (refusing to replace it)"),
        "{err}"
    );
    assert!(config(&["--api-socket=relative.sock"]).is_ok());
}

#[test]
fn zones_need_a_vm_name_and_an_existing_file() {
    let dir = TempDir::new("zone");
    let zone = dir.file("zone");
    let zone = zone.to_str().unwrap();
    let config = config(&["--zone", zone, "--vm", "web-1", "--pmem", "64M"]).unwrap();
    let target = config.zone.as_ref().unwrap();
    assert_eq!(
        (target.path.to_str(), target.vm.as_str()),
        (Some(zone), "web-1")
    );
    assert_eq!(config.pmem_size, Some(64 << 20));
    let pmem = config.pmem_region().unwrap();
    assert_eq!((pmem.start, pmem.size), (1 << 32, 64 << 20));
    assert_eq!(config.memory_regions(guest_mem::FrameSize::Huge).len(), 2);
    assert_eq!(
        usage_err(&["--zone", zone]).0,
        ErrorKind::MissingRequiredArgument
    );
    assert_eq!(
        usage_err(&["--zone", zone, "--vm", "a", "--backing", "hugetlb-2m"]).0,
        ErrorKind::ArgumentConflict
    );
    assert_eq!(
        usage_err(&["--pmem", "64M"]).0,
        ErrorKind::MissingRequiredArgument
    );
    let missing = dir.0.join("missing");
    let err = config_err(&["--zone", missing.to_str().unwrap(), "--vm", "a"]);
    assert!(
        err.starts_with("--zone ") && err.contains("vmm zone create"),
        "{err}"
    );
    let err = config_err(&["--zone", zone, "--vm", "a/b"]);
    assert!(err.starts_with("--vm a/b: "), "{err}");
    let err = config_err(&["--zone", zone, "--vm", "a", "--pmem", "3M"]);
    assert!(
        err.starts_with("--pmem 3 MiB: must be a multiple of 2 MiB"),
        "{err}"
    );
}
