use super::*;
use crate::testguest::protocol::step_kind;

/// A scratch file, removed on drop.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn new(name: &str, bytes: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!("guest-image-{name}-{}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        ScratchFile(path)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn linux(kernel: &Path, cmdline: &str) -> LinuxConfig {
    LinuxConfig::new(kernel.to_owned(), None, Some(cmdline.to_owned())).unwrap()
}

/// What runs for `linux` in a 64 MiB VM with one vCPU and no balloon.
fn guest_of(linux: LinuxConfig) -> Result<GuestConfig, ImageError> {
    guest_for_kernel(linux, 64 << 20, 1, None, None, &WorkloadSpec::default())
}

#[test]
fn the_image_runs_as_the_test_guest_with_the_workload_of_its_command_line() {
    let image = ScratchFile::new("same", IMAGE);
    assert!(is_image(&image.0).unwrap());
    // Through a symbolic link, as kernels often are.
    let link = image.0.with_extension("link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&image.0, &link).unwrap();
    assert!(is_image(&link).unwrap());
    std::fs::remove_file(&link).unwrap();
    let guest = guest_of(linux(&image.0, "console=ttyS0 workload=read:all reboot=k")).unwrap();
    let GuestConfig::TestGuest(workload) = guest else {
        panic!("{guest:?}");
    };
    let kinds: Vec<u32> = workload.steps().iter().map(|s| s.kind).collect();
    assert_eq!(kinds, [step_kind::READ]);
    // Without workload=: the default (write and verify everything).
    let guest = guest_of(linux(&image.0, "console=ttyS0")).unwrap();
    assert!(matches!(guest, GuestConfig::TestGuest(w) if w.steps().len() == 2));
    // With self-boot: a kernel, booted as Firecracker boots it (its workload is the guest's).
    let guest = guest_of(linux(&image.0, "console=ttyS0 self-boot workload=bad")).unwrap();
    assert!(matches!(guest, GuestConfig::Linux(_)));
}

#[test]
fn other_kernels_are_linux_and_an_old_image_or_bad_workload_is_refused() {
    let other = ScratchFile::new("other", b"\x7fELF not the test guest");
    let guest = guest_of(linux(&other.0, "console=ttyS0")).unwrap();
    assert!(matches!(guest, GuestConfig::Linux(_)));
    let mut changed = IMAGE.to_vec();
    *changed.last_mut().unwrap() ^= 0xff;
    let old = ScratchFile::new("old", &changed);
    let err = is_image(&old.0).unwrap_err();
    assert!(err.to_string().contains("another vmm version"), "{err}");
    let image = ScratchFile::new("bad-workload", IMAGE);
    let err = guest_of(linux(&image.0, "workload=fly:all")).unwrap_err();
    assert!(
        err.to_string().contains("unknown workload step 'fly:all'"),
        "{err}"
    );
    let err = guest_of(LinuxConfig::new(image.0.clone(), Some(image.0.clone()), None).unwrap())
        .unwrap_err();
    assert_eq!(err.to_string(), "the test guest image takes no initrd");
}
