//! The `vmm` command: see `vmm --help`, and [`vmm::cli`] for the exit statuses.

use std::process::ExitCode;

fn main() -> ExitCode {
    vmm::cli::main(std::env::args_os()).into()
}
