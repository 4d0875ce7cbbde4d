//! Why a device step (balloon, virtio-mem) failed: its device's error code and a detail.

/// A failed device step: a code of `balloon_error` or `hotplug_error` and a detail.
pub struct Failure(pub u64, pub u64);

/// What a device step gives: a value, or why it failed.
pub type Outcome = Result<u64, Failure>;

impl Failure {
    /// The error code.
    pub fn code(&self) -> u64 {
        self.0
    }

    /// The detail.
    pub fn detail(&self) -> u64 {
        self.1
    }
}
