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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command, VmConfig};
    use crate::runner::memory::{create_memory, create_pool};

    fn session() -> Session {
        let cli = Cli::try_parse_from(["vmm", "run", "--memory", "16M", "--vcpus", "2"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        let config = VmConfig::try_from(args).unwrap();
        let memory = create_memory(&config, create_pool(&config).unwrap()).unwrap();
        Session::new(config, Arc::new(memory))
    }

    #[test]
    fn before_the_start_the_api_sees_the_machine_and_stops_it_but_cannot_pause() {
        let session = session();
        let info = session.machine_info().unwrap();
        assert_eq!((info.state, info.vcpu_count), (VmState::NotStarted, 2));
        let memory = session.memory_info().unwrap();
        assert_eq!((memory.guest.chunks, memory.guest.populated_chunks), (8, 0));
        assert_eq!(
            memory.pool.cores, 1,
            "16 MiB is one tree: one reservation slot"
        );
        let not_started = ControlError::InvalidState("the VM has not started yet".into());
        assert_eq!(session.pause(), Err(not_started.clone()));
        assert_eq!(session.resume(), Err(not_started));
        assert_eq!(session.shutdown(), Ok(()));
    }
}
