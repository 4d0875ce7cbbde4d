//! `vmm run`'s engine: boots the configured guest and runs it to its end.
//!
//! PLACEHOLDER until the VMM core is wired to the CLI: [`run`] refuses with
//! [`RunError::NotWired`] instead of pretending to run a VM. The integration replaces this file,
//! keeping [`run`]'s signature, [`RunOutcome`] and [`RunError::exit_status`], which the CLI maps
//! to exit statuses.

use crate::cli::{ExitStatus, VmConfig};

/// How a VM run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// The guest finished its work (test guest: every step passed; Linux: powered off).
    Success,
    /// The guest reported a failure, described here.
    GuestFailure(String),
}

/// Why a VM could not be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The VMM core is not connected to the CLI yet.
    #[error("vmm run is not wired yet: the VMM core is not connected to the command line")]
    NotWired,
}

impl RunError {
    /// The exit status for this error.
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            RunError::NotWired => ExitStatus::Runtime,
        }
    }
}

/// Boots and runs the VM `config` describes, until the guest ends or is shut down.
pub fn run(config: VmConfig) -> Result<RunOutcome, RunError> {
    let _ = config;
    Err(RunError::NotWired)
}
