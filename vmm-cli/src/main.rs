//! The `vmm` command: see `vmm --help`, and [`vmm_cli`] for the exit statuses.

use std::process::ExitCode;

fn main() -> ExitCode {
    vmm_cli::main(std::env::args_os()).into()
}
