//! Times a VMM (ours, or any other) running the real-Linux tests' guest (tests/linux-nested),
//! from the outside, so that VMMs compare on the same terms:
//!
//! ```text
//! linux-guest-bench boot RUNS -- VMM ARGS...       time from the start until the guest's init
//!                                                  prints "LLFREE-L2 ready"
//! linux-guest-bench reporting RUNS -- VMM ARGS...  time from the guest's "LLFREE-L2 freed"
//!                                                  until the VMM's resident memory (VmRSS)
//!                                                  is 96 MiB below what it was at "filled"
//! ```
//!
//! The guest must run `llfree.test=idle` (boot) or `llfree.test=fill llfree.mib=128`
//! (reporting). Each run kills the VMM at its end. Prints one line per run and a summary
//! (median, min, max).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How long any one wait may take.
const TIMEOUT: Duration = Duration::from_secs(300);
/// What the VMM must give back after the guest frees 128 MiB.
const REPORTED_KIB: u64 = 96 * 1024;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, runs, command) = match args.as_slice() {
        [mode, runs, dashes, command @ ..] if dashes == "--" && !command.is_empty() => {
            match runs.parse::<usize>() {
                Ok(runs) if runs > 0 => (mode.as_str(), runs, command),
                _ => return usage(),
            }
        }
        _ => return usage(),
    };
    let measure = match mode {
        "boot" => boot,
        "reporting" => reporting,
        _ => return usage(),
    };
    let mut times = Vec::with_capacity(runs);
    for run in 1..=runs {
        match measure(command) {
            Ok(time) => {
                println!("{mode} run {run}: {:.1} ms", ms(time));
                times.push(time);
            }
            Err(why) => {
                eprintln!("error: {mode} run {run}: {why}");
                return ExitCode::FAILURE;
            }
        }
    }
    times.sort();
    println!(
        "{mode}: median {:.1} ms, min {:.1} ms, max {:.1} ms over {runs} runs: {}",
        ms(times[times.len() / 2]),
        ms(times[0]),
        ms(times[times.len() - 1]),
        command.join(" ")
    );
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!("usage: linux-guest-bench boot|reporting RUNS -- VMM ARGS...");
    ExitCode::from(2)
}

fn ms(time: Duration) -> f64 {
    time.as_secs_f64() * 1000.0
}

/// The VMM's process and its stdout, line by line as they come.
struct Vmm {
    child: Child,
    lines: Receiver<String>,
}

impl Vmm {
    fn start(command: &[String]) -> Result<Self, String> {
        let mut child = Command::new(&command[0])
            .args(&command[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", command[0]))?;
        let stdout = child.stdout.take().expect("piped");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Vmm { child, lines })
    }

    /// Waits for a line containing `text`.
    fn wait_for(&self, text: &str) -> Result<String, String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return Ok(line),
                Ok(_) => {}
                Err(_) => return Err(format!("no line with {text:?}")),
            }
        }
    }

    /// The VMM's resident memory in KiB.
    fn rss_kib(&self) -> Result<u64, String> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .map_err(|e| e.to_string())?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kib| kib.trim().trim_end_matches(" kB").parse().ok())
            .ok_or_else(|| "no VmRSS".into())
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn boot(command: &[String]) -> Result<Duration, String> {
    let started = Instant::now();
    let vmm = Vmm::start(command)?;
    vmm.wait_for("LLFREE-L2 ready")?;
    Ok(started.elapsed())
}

fn reporting(command: &[String]) -> Result<Duration, String> {
    let vmm = Vmm::start(command)?;
    vmm.wait_for("LLFREE-L2 filled")?;
    let filled = vmm.rss_kib()?;
    vmm.wait_for("LLFREE-L2 freed")?;
    let freed = Instant::now();
    while vmm.rss_kib()? + REPORTED_KIB > filled {
        if freed.elapsed() > TIMEOUT {
            return Err(format!(
                "VmRSS {} KiB, {filled} KiB at 'filled'",
                vmm.rss_kib()?
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(freed.elapsed())
}
