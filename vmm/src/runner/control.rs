//! The control API's view of a running VMM: [`VmmControl`] on a [`Session`].

use crate::api::model::{MachineInfo, MemoryInfo, VmState};
use crate::api::{ControlError, VmmControl};
use crate::vm::control::{self, RunState, VmControl};

use super::session::Session;

/// What a run control error means to an API client.
fn api_error(error: control::ControlError) -> ControlError {
    match error {
        control::ControlError::Stopped => ControlError::InvalidState("the VM has stopped".into()),
        control::ControlError::CalledFromVcpu => ControlError::Internal(error.to_string()),
    }
}

impl Session {
    fn started_control(&self) -> Result<&VmControl, ControlError> {
        self.control()
            .map(AsRef::as_ref)
            .ok_or_else(|| ControlError::InvalidState("the VM has not started yet".into()))
    }
}

impl VmmControl for Session {
    fn machine_info(&self) -> Result<MachineInfo, ControlError> {
        let state = match self.control().map(|c| c.state()) {
            None => VmState::NotStarted,
            Some(RunState::Running) => VmState::Running,
            Some(RunState::Paused) => VmState::Paused,
            Some(RunState::Stopped) => VmState::Stopped,
        };
        Ok(MachineInfo::new(self.config(), state))
    }

    fn memory_info(&self) -> Result<MemoryInfo, ControlError> {
        Ok(MemoryInfo::collect(self.memory()))
    }

    fn pause(&self) -> Result<(), ControlError> {
        self.started_control()?.pause().map_err(api_error)
    }

    fn resume(&self) -> Result<(), ControlError> {
        self.started_control()?.resume().map_err(api_error)
    }

    fn shutdown(&self) -> Result<(), ControlError> {
        self.request_stop();
        Ok(())
    }
}
