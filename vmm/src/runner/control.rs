//! The control API's view of a running VMM: [`VmmControl`] on a [`Session`].

use crate::api::model::{MachineInfo, MemoryInfo, VmState};
use crate::api::{ControlError, VmmControl};
use crate::vm::control::{self, RunState, VmControl};

use super::session::{Phase, Session};

/// What a run control error means to an API client.
fn api_error(error: control::ControlError) -> ControlError {
    match error {
        control::ControlError::Stopped => ControlError::InvalidState("the VM has stopped".into()),
        control::ControlError::CalledFromVcpu => ControlError::Internal(error.to_string()),
    }
}

impl Session {
    /// The run control of a started VM; before the start, waits for it (briefly).
    fn started_control(&self) -> Result<&VmControl, ControlError> {
        match (self.phase_after_setup(), self.control()) {
            (Phase::Started, Some(control)) => Ok(control),
            (Phase::Setup, _) => Err(ControlError::InvalidState(
                "the VM has not started yet".into(),
            )),
            _ => Err(ControlError::InvalidState("the VM has stopped".into())),
        }
    }
}

impl VmmControl for Session {
    fn machine_info(&self) -> Result<MachineInfo, ControlError> {
        let state = match (self.phase(), self.control().map(|c| c.state())) {
            (Phase::Setup, _) => VmState::NotStarted,
            (Phase::Started, Some(RunState::Running)) => VmState::Running,
            (Phase::Started, Some(RunState::Paused)) => VmState::Paused,
            _ => VmState::Stopped,
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
    fn before_the_start_the_api_sees_the_machine_and_pauses_wait_for_the_start() {
        let session = Arc::new(session());
        let info = session.machine_info().unwrap();
        assert_eq!((info.state, info.vcpu_count), (VmState::NotStarted, 2));
        let memory = session.memory_info().unwrap();
        assert_eq!((memory.guest.chunks, memory.guest.populated_chunks), (8, 0));
        assert_eq!(
            memory.pool.cores, 1,
            "16 MiB is one tree: one reservation slot"
        );
        let waiting = session.clone();
        let pause = std::thread::spawn(move || waiting.pause());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!pause.is_finished(), "a pause waits for the start");
        // The run ends without the guest ever starting.
        session.finish();
        let stopped = ControlError::InvalidState("the VM has stopped".into());
        assert_eq!(pause.join().unwrap(), Err(stopped.clone()));
        assert_eq!(session.resume(), Err(stopped));
        assert_eq!(session.machine_info().unwrap().state, VmState::Stopped);
        assert_eq!(session.shutdown(), Ok(()));
    }
}
