//! The `vmm` command built inside the e2e-tests package, so that its end-to-end tests run the
//! real command line as a process (`CARGO_BIN_EXE_vmm-cli`); the same entry point as
//! vmm/src/main.rs.

use std::process::ExitCode;

fn main() -> ExitCode {
    vmm::cli::main(std::env::args_os()).into()
}
