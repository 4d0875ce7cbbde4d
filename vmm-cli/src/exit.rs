//! Exit statuses of the `vmm` command.

use std::process::ExitCode;

use guest_mem::pool::BackingError;
use guest_mem::zone::ZoneError;
use guest_mem::PoolError;
use vmm::runner::{DeviceError, RunError, SnapshotError, ZoneSetupError};
use vmm::testguest::TestGuestError;
use vmm::vm::VmError;
use vmm_api::ServerError;

/// The help text that lists the exit statuses (shown by `vmm --help` and `vmm run --help`).
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  success: the guest finished its work (or the API request succeeded)
  1  the guest reported a failure (e.g. a test guest verification failed)
  2  usage or configuration error: bad flags, missing files, invalid sizes
  3  host unsupported: no usable /dev/kvm, or too few huge pages
  4  runtime error: the VMM failed while setting up or running the VM, or the API socket
     could not be reached
  5  the API answered with an error (non-2xx); its fault message is printed
  6  `vmm run`: an API client stopped the VM (PUT /actions Shutdown) before the guest finished
  7  `vmm run`: the guest reset the VM (Linux: `reboot`, a panic with panic=N, a triple
     fault): a microVM does not restart, the VMM ends
  8  `vmm run --wait-for-memory=DURATION`: a fault waited longer than DURATION for guest
     memory (its pool or zone stayed exhausted); the VM was stopped
130  `vmm run`: SIGINT (Ctrl-C) stopped the VM before the guest finished (128 + 2, as shells do)
143  `vmm run`: SIGTERM stopped the VM before the guest finished (128 + 15)
148  a thread of the VMM made a system call its seccomp filter denies (stderr names the
     thread and the call); `--no-seccomp` turns the filters off";

/// What `vmm` exits with. See [`EXIT_STATUS_HELP`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitStatus {
    /// The guest finished its work, or the API request succeeded.
    Success = 0,
    /// The guest reported a failure.
    GuestFailure = 1,
    /// Bad flags, missing files, invalid sizes.
    Usage = 2,
    /// No usable /dev/kvm, or too few huge pages.
    HostUnsupported = 3,
    /// The VMM failed while setting up or running the VM, or the API was unreachable.
    Runtime = 4,
    /// The API answered with an error status.
    ApiError = 5,
    /// An API client stopped the VM before the guest finished.
    StoppedByApi = 6,
    /// The guest reset the VM (reboot, a panic with panic=N, a triple fault).
    GuestReset = 7,
    /// A fault waited longer for guest memory than `--wait-for-memory=` allows.
    MemoryWaitExpired = 8,
    /// SIGINT stopped the VM before the guest finished.
    Interrupted = 130,
    /// SIGTERM stopped the VM before the guest finished.
    Terminated = 143,
}

impl ExitStatus {
    /// The numeric exit status.
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(status: ExitStatus) -> Self {
        ExitCode::from(status.code())
    }
}

/// The exit status of a `vmm run` that failed with `error`: a configuration the library
/// refused is a usage error, a host without KVM or huge pages is unsupported, anything else
/// failed at run time.
pub fn run_error_status(error: &RunError) -> ExitStatus {
    match error {
        RunError::Boot { .. }
        | RunError::PoolExhaustedAtStart { .. }
        | RunError::Devices(DeviceError::BalloonOption(_)) => ExitStatus::Usage,
        RunError::Pool(e) => pool_error_status(e),
        RunError::Zone(ZoneSetupError::Zone(e)) => zone_error_status(e),
        RunError::Zone(ZoneSetupError::Misaligned { .. }) => ExitStatus::Usage,
        RunError::Api(
            ServerError::InUse(_) | ServerError::NotASocket(_) | ServerError::Socket { .. },
        ) => ExitStatus::Usage,
        RunError::Vm(VmError::KvmUnavailable(_))
        | RunError::TestGuest(TestGuestError::Vm(VmError::KvmUnavailable(_))) => {
            ExitStatus::HostUnsupported
        }
        RunError::TestGuest(
            TestGuestError::Workload(_) | TestGuestError::MemoryTooLarge { .. },
        ) => ExitStatus::Usage,
        RunError::Snapshot(
            SnapshotError::Vcpus(_) | SnapshotError::Vm(_) | SnapshotError::MemoryFile { .. },
        ) => ExitStatus::Runtime,
        RunError::Snapshot(SnapshotError::Zone { source, .. }) => zone_error_status(source),
        RunError::Snapshot(_) => ExitStatus::Usage,
        RunError::MemoryWaitExpired { .. } => ExitStatus::MemoryWaitExpired,
        _ => ExitStatus::Runtime,
    }
}

/// The exit status of a pool error: the host lacks huge pages, the pool file is unusable, or
/// something failed at run time.
fn pool_error_status(error: &PoolError) -> ExitStatus {
    match error {
        PoolError::Backing(
            BackingError::HugePagesUnsupported { .. } | BackingError::NotEnoughHugePages { .. },
        ) => ExitStatus::HostUnsupported,
        PoolError::Backing(
            BackingError::File { .. }
            | BackingError::InUse(_)
            | BackingError::DeviceTooSmall { .. }
            | BackingError::FileTooSmall { .. },
        )
        | PoolError::Header { .. }
        | PoolError::SizeMismatch { .. }
        | PoolError::CannotPunch(_) => ExitStatus::Usage,
        _ => ExitStatus::Runtime,
    }
}

/// The exit status of a zone error: failing to read, write or sync the file is a run-time
/// error, as is a zone in use by another process; anything about what the file holds or what
/// was asked of it is a usage error.
pub fn zone_error_status(error: &ZoneError) -> ExitStatus {
    match error {
        ZoneError::Io { .. }
        | ZoneError::Allocator { .. }
        | ZoneError::VmInUse { .. }
        | ZoneError::OpenElsewhere { .. }
        | ZoneError::NoSlots { .. }
        | ZoneError::TooManyProcesses(_)
        | ZoneError::Backing(BackingError::InUse(_)) => ExitStatus::Runtime,
        _ => ExitStatus::Usage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_documented_with_its_number() {
        let all = [
            ExitStatus::Success,
            ExitStatus::GuestFailure,
            ExitStatus::Usage,
            ExitStatus::HostUnsupported,
            ExitStatus::Runtime,
            ExitStatus::ApiError,
            ExitStatus::StoppedByApi,
            ExitStatus::GuestReset,
            ExitStatus::MemoryWaitExpired,
        ];
        for (expected, status) in all.into_iter().enumerate() {
            assert_eq!(status.code() as usize, expected);
        }
        for status in all
            .into_iter()
            .chain([ExitStatus::Interrupted, ExitStatus::Terminated])
        {
            let line = format!("\n{:>3}  ", status.code());
            assert!(EXIT_STATUS_HELP.contains(&line), "{status:?} undocumented");
        }
    }
}
