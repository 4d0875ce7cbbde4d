//! The `vmm` command: see `vmm --help`, and [`vmm_cli`] for the exit statuses.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Firecracker's `process_startup_time_us` counts from here.
    vmm_api::metrics::METRICS.process_started();
    vmm_cli::main(std::env::args_os()).into()
}
