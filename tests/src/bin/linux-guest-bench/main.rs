//! Times a VMM (ours, or any other) running the real-Linux tests' guest (tests/linux-nested),
//! from the outside, so that VMMs compare on the same terms:
//!
//! ```text
//! linux-guest-bench boot RUNS -- VMM ARGS...       time from the start until the guest's init
//!                                                  prints "LLFREE-L2 ready", until its first
//!                                                  console line, and the part of the first
//!                                                  that lies before the guest kernel's clock
//!                                                  (the VMM's start, loading, the kernel's
//!                                                  entry: the time less the ready line's
//!                                                  uptime; only as good as the guest's clock,
//!                                                  which nested under TCG does not keep the
//!                                                  wall clock's rate)
//! linux-guest-bench reporting RUNS -- VMM ARGS...  time from the guest's "LLFREE-L2 freed"
//!                                                  until the VMM's resident memory (VmRSS)
//!                                                  is 96 MiB below what it was at "filled"
//! linux-guest-bench hotplug RUNS --api SOCKET|--qmp SOCKET [--balloon] -- VMM ARGS...
//!                                                  plug and unplug 1 GiB of virtio-mem
//!                                                  memory, and inflate and deflate the
//!                                                  balloon by 1 GiB (see hotplug.rs)
//! linux-guest-bench balloon RUNS --api SOCKET -- VMM ARGS...
//!                                                  inflate and deflate the balloon by 1 GiB
//!                                                  through Firecracker's API, ours or
//!                                                  Firecracker's (see balloon.rs)
//! ```
//!
//! The guest must run `llfree.test=idle` (boot), `llfree.test=fill llfree.mib=128`
//! (reporting) or `llfree.test=hotplug` (hotplug, balloon). Each run kills the VMM at its end. Prints
//! one line per run, a summary of each time (median, min, max) and the command.

mod balloon;
mod hotplug;
mod qmp;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How long any one wait may take.
const TIMEOUT: Duration = Duration::from_secs(300);
/// What the VMM must give back after the guest frees 128 MiB.
const REPORTED_KIB: u64 = 96 * 1024;

/// What one run measured: each time with its name.
type Measured = Vec<(&'static str, Duration)>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dashes) = args.iter().position(|arg| arg == "--") else {
        return usage();
    };
    let (mode, runs, options, command) = match (&args[..dashes], &args[dashes + 1..]) {
        ([mode, runs, options @ ..], command) if !command.is_empty() => {
            match runs.parse::<usize>() {
                Ok(runs) if runs > 0 => (mode.as_str(), runs, options, command),
                _ => return usage(),
            }
        }
        _ => return usage(),
    };
    let measure = match mode {
        "boot" if options.is_empty() => Mode::Boot,
        "reporting" if options.is_empty() => Mode::Reporting,
        "hotplug" => match hotplug::Options::parse(options) {
            Ok(options) => Mode::Hotplug(options),
            Err(why) => {
                eprintln!("error: {why}");
                return usage();
            }
        },
        "balloon" => match balloon::Options::parse(options) {
            Ok(options) => Mode::Balloon(options),
            Err(why) => {
                eprintln!("error: {why}");
                return usage();
            }
        },
        _ => return usage(),
    };
    let mut runs_measured: Vec<Measured> = Vec::with_capacity(runs);
    for run in 1..=runs {
        match measure.run(command) {
            Ok(measured) => {
                let times: Vec<String> = measured
                    .iter()
                    .map(|(name, time)| format!("{name} {:.1} ms", ms(*time)))
                    .collect();
                println!("{mode} run {run}: {}", times.join(", "));
                runs_measured.push(measured);
            }
            Err(why) => {
                eprintln!("error: {mode} run {run}: {why}");
                return ExitCode::FAILURE;
            }
        }
    }
    for (index, (name, _)) in runs_measured[0].iter().enumerate() {
        let mut times: Vec<Duration> = runs_measured.iter().map(|m| m[index].1).collect();
        times.sort();
        println!(
            "{name}: median {:.1} ms, min {:.1} ms, max {:.1} ms over {runs} runs",
            ms(times[times.len() / 2]),
            ms(times[0]),
            ms(times[times.len() - 1]),
        );
    }
    println!("{mode} command: {}", command.join(" "));
    ExitCode::SUCCESS
}

/// What the runs measure.
enum Mode {
    Boot,
    Reporting,
    Hotplug(hotplug::Options),
    Balloon(balloon::Options),
}

impl Mode {
    fn run(&self, command: &[String]) -> Result<Measured, String> {
        match self {
            Mode::Boot => boot(command),
            Mode::Reporting => Ok(vec![("reporting", reporting(command)?)]),
            Mode::Hotplug(options) => hotplug::measure(command, options),
            Mode::Balloon(options) => balloon::measure(command, options),
        }
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: linux-guest-bench boot|reporting RUNS -- VMM ARGS...\n       \
         linux-guest-bench hotplug RUNS --api SOCKET|--qmp SOCKET [--balloon] -- VMM ARGS...\n       \
         linux-guest-bench balloon RUNS --api SOCKET -- VMM ARGS..."
    );
    ExitCode::from(2)
}

fn ms(time: Duration) -> f64 {
    time.as_secs_f64() * 1000.0
}

/// The VMM's process and its stdout, line by line as they come.
struct Vmm {
    child: Child,
    /// Each line with when it came.
    lines: Receiver<(Instant, String)>,
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
                if sender.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Ok(Vmm { child, lines })
    }

    /// Waits for a line containing `text`; returns it with when it came.
    fn wait_for(&self, text: &str) -> Result<(Instant, String), String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((came, line)) if line.contains(text) => return Ok((came, line)),
                Ok(_) => {}
                Err(_) => return Err(format!("no line with {text:?}")),
            }
        }
    }

    /// Waits for the guest's "memtotal kib=KIB" line (llfree.test=hotplug) whose KIB
    /// satisfies `done`; returns when it came, and KIB.
    fn wait_memtotal(&self, done: impl Fn(u64) -> bool) -> Result<(Instant, u64), String> {
        loop {
            let (came, line) = self.wait_for("LLFREE-L2 memtotal")?;
            let kib = line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("kib="))
                .and_then(|kib| kib.parse().ok())
                .ok_or_else(|| format!("no kib= in {line:?}"))?;
            if done(kib) {
                return Ok((came, kib));
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

fn boot(command: &[String]) -> Result<Measured, String> {
    let started = Instant::now();
    let vmm = Vmm::start(command)?;
    // Every line contains "": the first one, whatever it says.
    let (first, _) = vmm.wait_for("")?;
    let (ready, line) = vmm.wait_for("LLFREE-L2 ready")?;
    let uptime = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("uptime="))
        .and_then(|seconds| seconds.parse::<f64>().ok())
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
        .ok_or_else(|| format!("no uptime= in {line:?}"))?;
    let boot = ready - started;
    Ok(vec![
        ("boot", boot),
        ("first console line", first - started),
        (
            "before the kernel's clock",
            boot.saturating_sub(Duration::from_secs_f64(uptime)),
        ),
    ])
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
