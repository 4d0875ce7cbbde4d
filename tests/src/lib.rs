//! End-to-end tests of llfree-vmm (under `tests/`) and the helpers they share.

pub mod api_process;
pub mod page_fault_handler;

use std::path::{Path, PathBuf};
use std::process::Output;

/// The `vmm` binary the end-to-end tests run: `$LLFREE_VMM_BIN` where set (the nested harness
/// copies it elsewhere), else the one cargo built beside the test binaries, in
/// `target/<profile>/` (`cargo test --workspace` builds it: vmm-cli has integration tests).
/// Panics, saying how to build it, if it is missing or older than a source file of the crates
/// it is built from (`cargo test -p e2e-tests` alone does not rebuild it).
pub fn vmm_binary() -> &'static str {
    static BINARY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("LLFREE_VMM_BIN") {
            return path.to_string_lossy().into_owned();
        }
        // The test binary is target/<profile>/deps/<name>-<hash>.
        let test = std::env::current_exe().expect("the test binary's path");
        let deps = test.parent().expect("the test binary's directory");
        let binary = deps.parent().unwrap_or(deps).join("vmm");
        let build = "build it first: cargo build -p vmm-cli (with --release for release tests), \
                     or run the tests with cargo test --workspace";
        let built = modified(&binary)
            .unwrap_or_else(|| panic!("no vmm binary at {}: {build}", binary.display()));
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let sources = [
            "llfree/src",
            "guest-mem/src",
            "virtio-balloon/src",
            "virtio-mem/src",
            "test-guest",
            "vmm-devices/src",
            "vmm-api/src",
            "vmm/src",
            "vmm-cli/src",
        ];
        if let Some(newer) = sources
            .iter()
            .find_map(|dir| newer_source(&workspace.join(dir), built))
        {
            panic!(
                "{} is older than {}: {build}",
                binary.display(),
                newer.display()
            );
        }
        binary.to_string_lossy().into_owned()
    })
}

/// The `vmm-jailer` binary: `LLFREE_VMM_JAILER_BIN` if set (the nested run's L1), else the
/// one cargo built beside the test binaries (`cargo test --workspace` builds it: vmm-jailer
/// has integration tests). Panics, saying how to build it, if it is missing or older than a
/// source file of its crate.
pub fn jailer_binary() -> String {
    if let Some(path) = std::env::var_os("LLFREE_VMM_JAILER_BIN") {
        return path.to_string_lossy().into_owned();
    }
    let test = std::env::current_exe().expect("the test binary's path");
    let deps = test.parent().expect("the test binary's directory");
    let binary = deps.parent().unwrap_or(deps).join("vmm-jailer");
    let build = "build it first: cargo build -p vmm-jailer (with --release for release tests)";
    let built = modified(&binary)
        .unwrap_or_else(|| panic!("no vmm-jailer at {}: {build}", binary.display()));
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vmm-jailer/src");
    if let Some(newer) = newer_source(&sources, built) {
        panic!(
            "{} is older than {}: {build}",
            binary.display(),
            newer.display()
        );
    }
    binary.to_string_lossy().into_owned()
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// A Rust source, manifest or link script under `dir` changed after `built`, if any; `target`
/// and `src/bin` (other binaries of the crate, e.g. its benches, which the binary checked
/// against is not built from) are skipped.
fn newer_source(dir: &Path, built: std::time::SystemTime) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            let skipped = path.ends_with("target") || path.ends_with("src/bin");
            if !skipped {
                if let Some(newer) = newer_source(&path, built) {
                    return Some(newer);
                }
            }
        } else if path
            .extension()
            .is_some_and(|ext| ext == "rs" || ext == "toml" || ext == "ld")
            && modified(&path).is_some_and(|changed| changed > built)
        {
            return Some(path);
        }
    }
    None
}

/// A small xorshift generator: the crash-injection tests need repeatable, not good, randomness.
#[derive(Debug)]
pub struct Rng(u64);

/// The value of the environment variable `env`, if it is set and parses.
pub fn env_value<T: std::str::FromStr>(env: &str) -> Option<T> {
    std::env::var(env).ok().and_then(|value| value.parse().ok())
}

impl Rng {
    /// A generator seeded from `$env` if set, else from the clock; prints the seed (and how to
    /// repeat the run) with `what`.
    pub fn from_env(env: &str, what: &str) -> Self {
        let seed = env_value(env).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("a clock after 1970")
                .as_nanos() as u64
                | 1
        });
        eprintln!("{what}: {env}={seed}");
        Rng(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A duration in `[0, max)`.
    pub fn below(&mut self, max: std::time::Duration) -> std::time::Duration {
        std::time::Duration::from_micros(self.next_u64() % (max.as_micros() as u64).max(1))
    }
}

/// Whether KVM is usable here; prints `SKIP: <test>: ...` and returns `false` when it is not.
pub fn kvm_available(test: &str) -> bool {
    let available = Path::new("/dev/kvm").exists();
    if !available {
        eprintln!("SKIP: {test}: /dev/kvm is absent");
    }
    available
}

/// Whether a jailed VMM can run here: KVM, and a way for an unprivileged process to take
/// KVM's page faults through userfaultfd (/dev/userfaultfd, Linux 6.1, or
/// vm.unprivileged_userfaultfd=1); prints SKIP and why where not.
pub fn jail_can_run(test: &str) -> bool {
    if !kvm_available(test) {
        return false;
    }
    let sysctl =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    let possible = Path::new("/dev/userfaultfd").exists() || sysctl.trim() == "1";
    if !possible {
        eprintln!(
            "SKIP: {test}: no /dev/userfaultfd and vm.unprivileged_userfaultfd=0: an \
             unprivileged VMM cannot populate guest memory lazily here"
        );
    }
    possible
}

/// A mounted cgroup hierarchy (/proc/mounts).
#[derive(Debug)]
pub struct CgroupHierarchy {
    /// Where it is mounted.
    pub dir: PathBuf,
    /// Whether it is the unified (v2) hierarchy.
    pub unified: bool,
    /// Its mount options: for v1, the controllers bound to it among them.
    pub options: Vec<String>,
}

/// The cgroup hierarchies mounted here.
pub fn cgroup_hierarchies() -> Vec<CgroupHierarchy> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (dir, kind, options) = (fields.get(1)?, fields.get(2)?, fields.get(3)?);
            (*kind == "cgroup" || *kind == "cgroup2").then(|| CgroupHierarchy {
                dir: PathBuf::from(dir),
                unified: *kind == "cgroup2",
                options: options.split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// The v1 hierarchy of `controller`, where one is mounted.
pub fn cgroup_v1_hierarchy(controller: &str) -> Option<PathBuf> {
    cgroup_hierarchies()
        .into_iter()
        .find(|h| !h.unified && h.options.iter().any(|o| o == controller))
        .map(|h| h.dir)
}

/// Removes cgroup `<parent>/<id>` from every hierarchy, and `<parent>` where it is empty then.
pub fn remove_cgroup(parent: &str, id: &str) {
    for hierarchy in cgroup_hierarchies() {
        let dir = hierarchy.dir.join(parent);
        let _ = std::fs::remove_dir(dir.join(id));
        let _ = std::fs::remove_dir(dir);
    }
}

/// Says how far a long test got, at once: written to the process's stderr directly, past the
/// test harness's capture (which shows a test's output only once it ended), so that a run of
/// minutes is never silent. `test` is the test's name.
pub fn progress(test: &str, text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "  {test}: {text}");
}

/// Whether the host has hardware virtualization (`vmx` or `svm` in /proc/cpuinfo), which a
/// stock Linux guest needs; otherwise why not (e.g. PVM, which only runs our own guest code).
pub fn hardware_virtualization() -> Result<(), String> {
    if !vmm::arch::x86_64::host_has_hardware_virtualization() {
        return Err("no vmx or svm in /proc/cpuinfo (e.g. PVM): a stock kernel cannot boot".into());
    }
    Ok(())
}

/// A scratch directory for one test, removed on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh, empty directory named after `test` (and this process) in the temp directory.
    pub fn new(test: &str) -> Self {
        let path = std::env::temp_dir().join(format!("vmm-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    /// The path of `name` in the directory.
    pub fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How a `vmm` process ended.
#[derive(Debug)]
pub struct Finished {
    /// The exit status; `None` when a signal ended it.
    pub code: Option<i32>,
    /// What it wrote on stdout.
    pub stdout: String,
    /// What it wrote on stderr.
    pub stderr: String,
}

impl From<Output> for Finished {
    fn from(output: Output) -> Self {
        Finished {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Finished {
    /// Asserts exit status `code` and exactly one `error:` line on stderr containing `text`.
    pub fn assert_fails(&self, code: i32, text: &str) {
        assert_eq!(self.code, Some(code), "{self:#?}");
        assert_eq!(self.stderr.lines().count(), 1, "one line: {self:#?}");
        assert!(
            without_name(&self.stderr).starts_with("error: ") && self.stderr.contains(text),
            "{self:#?}"
        );
    }

    /// Asserts that `vmm run` was stopped by its owner before the guest finished: exit status
    /// `code` and one `stopped:` line on stderr naming `cause` (after any notes).
    pub fn assert_stopped(&self, code: i32, cause: &str) {
        assert_eq!(self.code, Some(code), "{self:#?}");
        assert_eq!(
            self.stderr_besides_notes(),
            format!("stopped: {cause} ended the VM before the guest finished\n"),
            "{self:#?}"
        );
    }

    /// Asserts that the guest reset the VM `how` (status 7 and its one line on stderr,
    /// besides notes): [`THROUGH_THE_KEYBOARD`] (a reboot, a panic with panic=N) or
    /// [`BY_A_TRIPLE_FAULT`].
    pub fn assert_guest_reset(&self, how: &str) {
        assert_eq!(self.code, Some(7), "{self:#?}");
        assert_eq!(
            self.stderr_besides_notes(),
            guest_reset_line(how),
            "{self:#?}"
        );
    }

    /// Asserts a clean exit (status 0, nothing on stderr but notes).
    pub fn assert_success(&self) {
        assert_eq!(self.code, Some(0), "{self:#?}");
        assert!(self.stderr_besides_notes().is_empty(), "{self:#?}");
    }

    /// Stderr without the VMM's name (`[NAME] ` with `--vm`) and the notes of `vmm run`: pausing at a checkpoint ("paused at checkpoint
    /// ID; resume with ...") or after a snapshot load ("paused after the load; ..."), progress ("progress: ...") and, for `--kernel` on a host without
    /// hardware virtualization, the warning that a stock Linux kernel does not boot there.
    pub fn stderr_besides_notes(&self) -> String {
        self.stderr
            .lines()
            .map(without_name)
            .filter(|line| !line.starts_with("paused at checkpoint "))
            .filter(|line| !line.starts_with("paused after the load; "))
            .filter(|line| !line.starts_with("progress: "))
            .filter(|line| !line.starts_with(NO_HARDWARE_VIRTUALIZATION_WARNING))
            .map(|line| format!("{line}\n"))
            .collect()
    }
}

/// `line` without the `[NAME] ` a VMM named by `--vm` or `--id` starts its lines with.
pub fn without_name(line: &str) -> &str {
    line.strip_prefix('[')
        .and_then(|rest| rest.split_once("] "))
        .map_or(line, |(_, text)| text)
}

/// How a guest resets its VM, as `vmm run` says: through the i8042 (reboot=k, the default).
pub const THROUGH_THE_KEYBOARD: &str = "through the i8042 keyboard controller";
/// How a guest resets its VM, as `vmm run` says: by a triple fault of vCPU 0.
pub const BY_A_TRIPLE_FAULT: &str = "by a triple fault of vCPU 0";

/// The line `vmm run` prints when the guest resets the VM `how` (exit status 7).
pub fn guest_reset_line(how: &str) -> String {
    format!(
        "the guest reset the VM {how} (reboot, a panic with panic=N, or a crash); a microVM \
         does not restart\n"
    )
}

/// The start of the warning `vmm run --kernel` gives on a host without hardware virtualization.
pub const NO_HARDWARE_VIRTUALIZATION_WARNING: &str =
    "warning: this host's CPU has no hardware virtualization";

/// A minimal ELF kernel's code ([`elf_kernel`]) for the Firecracker-mode tests: prints its
/// command line (from the zero page at RSI), a newline and its initrd's bytes on COM1, then
/// polls the i8042 until Ctrl-Alt-Del's Delete key (scan code 0x71) arrives and resets the
/// machine through it, as Linux's reboot=k does.
pub const CTRL_ALT_DEL_GUEST: &[u8] = &[
    0x8b, 0x9e, 0x28, 0x02, 0x00, 0x00, // mov ebx, [rsi + 0x228] (cmd_line_ptr)
    0x8a, 0x03, // 1: mov al, [rbx]
    0x84, 0xc0, // test al, al
    0x74, 0x0a, // jz 2f
    0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
    0xee, // out dx, al
    0x48, 0xff, 0xc3, // inc rbx
    0xeb, 0xf0, // jmp 1b
    0x66, 0xba, 0xf8, 0x03, // 2: mov dx, 0x3f8
    0xb0, 0x0a, // mov al, '\n'
    0xee, // out dx, al
    0x8b, 0x9e, 0x18, 0x02, 0x00, 0x00, // mov ebx, [rsi + 0x218] (ramdisk_image)
    0x8b, 0x8e, 0x1c, 0x02, 0x00, 0x00, // mov ecx, [rsi + 0x21c] (ramdisk_size)
    0x85, 0xc9, // test ecx, ecx
    0x74, 0x0a, // jz 4f
    0x8a, 0x03, // 3: mov al, [rbx]
    0xee, // out dx, al
    0x48, 0xff, 0xc3, // inc rbx
    0xff, 0xc9, // dec ecx
    0x75, 0xf6, // jnz 3b
    0xe4, 0x64, // 4: in al, 0x64
    0xa8, 0x01, // test al, 1 (output buffer full)
    0x74, 0xfa, // jz 4b
    0xe4, 0x60, // in al, 0x60
    0x3c, 0x71, // cmp al, 0x71 (Delete)
    0x75, 0xf4, // jne 4b
    0xb0, 0xfe, // mov al, 0xfe
    0xe6, 0x64, // out 0x64, al (CPU reset)
    0xeb, 0xfe, // 5: jmp 5b
];

/// The files of a Firecracker-style boot in `scratch`: the [`CTRL_ALT_DEL_GUEST`] kernel, an
/// initrd holding `initrd`, and a 1 MiB root drive image; their paths.
pub fn ctrl_alt_del_guest_files(scratch: &Scratch, initrd: &str) -> (String, String, String) {
    let (kernel, initrd_path, rootfs) = (
        scratch.path("vmlinux"),
        scratch.path("initrd"),
        scratch.path("rootfs.ext4"),
    );
    std::fs::write(&kernel, elf_kernel(CTRL_ALT_DEL_GUEST)).unwrap();
    std::fs::write(&initrd_path, initrd).unwrap();
    std::fs::write(&rootfs, vec![0u8; 1 << 20]).unwrap();
    (kernel, initrd_path, rootfs)
}

/// Whether `tool` can be run (its `--version` or `version`); prints SKIP for `test` where not.
/// CI (`CI` set) must have it: there a missing tool fails the test.
pub fn tool_available(test: &str, tool: &str, version_arg: &str) -> bool {
    let found = std::process::Command::new(tool)
        .arg(version_arg)
        .output()
        .is_ok();
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: {tool} is missing in CI (.ci/run installs it)"
        );
        eprintln!("SKIP: {test}: {tool} is not installed");
    }
    found
}

/// Moves the calling test thread into a network namespace of its own, where it makes the taps
/// `taps` (`ip tuntap add`): a VMM the thread starts opens them there, and nothing reaches the
/// host's network. False (and SKIP for `test`) without the right to; CI must have `ip`.
pub fn private_network(test: &str, taps: &[&str]) -> bool {
    // SAFETY: unshare(CLONE_NEWNET) moves only the calling thread into a new namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!(
            "SKIP: {test}: no network namespace of its own: {}",
            std::io::Error::last_os_error()
        );
        return false;
    }
    if !tool_available(test, "ip", "-V") {
        return false;
    }
    for tap in taps {
        let status = std::process::Command::new("ip")
            .args(["tuntap", "add", "dev", tap, "mode", "tap"])
            .status()
            .expect("run ip");
        assert!(status.success(), "{test}: ip tuntap add dev {tap} mode tap");
    }
    true
}

/// Fills `out` with the pseudo-random bytes at position `at` of the sequence both ends of the
/// vsock tests send (`vsock-tool`), so that each can check what the other got.
pub fn vsock_pattern(at: u64, out: &mut [u8]) {
    for (i, byte) in (at..).zip(out.iter_mut()) {
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        x ^= x >> 29;
        *byte = x.to_le_bytes()[1];
    }
}

/// Runs the Firecracker Go SDK program of `tests/firecracker-sdk` (built at `program`) with
/// `args` and `env`, and checks that every step passed; returns its output.
pub fn run_sdk_program(program: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let run = std::process::Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run the SDK program");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    eprintln!("{stdout}");
    assert!(
        run.status.success() && stdout.contains("ok: all steps passed"),
        "the SDK program failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
    stdout
}

/// Physical load address and entry of [`elf_kernel`] (where vmlinux is linked).
pub const ELF_KERNEL_LOAD: u64 = 0x100_0000;

/// An ELF64 executable with one PT_LOAD segment of `code` at physical [`ELF_KERNEL_LOAD`], entered at its
/// start (as a vmlinux: virtual addresses in the kernel map, physical ones in p_paddr).
pub fn elf_kernel(code: &[u8]) -> Vec<u8> {
    const HEADERS: usize = 0x1000;
    let mut image = vec![0u8; HEADERS + code.len()];
    let mut put = |offset: usize, bytes: &[u8]| {
        image[offset..offset + bytes.len()].copy_from_slice(bytes);
    };
    put(0, b"\x7fELF\x02\x01\x01"); // 64-bit, little endian, version 1
    put(16, &2u16.to_le_bytes()); // ET_EXEC
    put(18, &0x3eu16.to_le_bytes()); // EM_X86_64
    put(20, &1u32.to_le_bytes());
    put(24, &ELF_KERNEL_LOAD.to_le_bytes()); // e_entry
    put(32, &64u64.to_le_bytes()); // e_phoff
    put(52, &64u16.to_le_bytes()); // e_ehsize
    put(54, &56u16.to_le_bytes()); // e_phentsize
    put(56, &1u16.to_le_bytes()); // e_phnum
    put(64, &1u32.to_le_bytes()); // PT_LOAD
    put(68, &5u32.to_le_bytes()); // R+X
    put(72, &(HEADERS as u64).to_le_bytes()); // p_offset
    put(80, &(0xffff_ffff_8000_0000 + ELF_KERNEL_LOAD).to_le_bytes()); // p_vaddr
    put(88, &ELF_KERNEL_LOAD.to_le_bytes()); // p_paddr
    put(96, &(code.len() as u64).to_le_bytes()); // p_filesz
    put(104, &(code.len() as u64).to_le_bytes()); // p_memsz
    put(112, &0x1000u64.to_le_bytes()); // p_align
    put(HEADERS, code);
    image
}
