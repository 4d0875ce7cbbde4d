//! Recovery time of a persistent LLFree (paper §5.7).
//!
//! The metadata lives in a `MAP_SHARED` file mapping ([`llfree::FileRegion`]). The zone is
//! formatted and half of it allocated at random, then:
//! * **clean**: after a clean shutdown (the allocator dropped), [`Init::Recover`] is timed;
//! * **crash**: a forked child recovers the zone and allocates and frees frames in a loop until
//!   the parent kills it with `SIGKILL` at a random moment; the following [`Init::Recover`], which
//!   must rebuild the counters from the bitfields, is timed.
//!
//! The timed call includes the page faults of the fresh mapping, as a restart would.

use crate::rng::Rng;
use llfree::{Config, CoreId, FileRegion, Init, InitError, LLFree, Order, Recovery};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;

/// The recovery benchmark failed.
#[derive(Debug, Error)]
pub enum RecoverError {
    /// A file, mapping, pipe or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// The failed operation.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// LLFree rejected the configuration or the metadata.
    #[error("llfree: {0}")]
    Init(#[from] InitError),
    /// An allocation while preparing the zone failed.
    #[error("llfree: {0}")]
    Alloc(#[from] llfree::Error),
    /// The recovered state is not what the benchmark expects.
    #[error("unexpected state: {0}")]
    Unexpected(String),
}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> RecoverError {
    move |source| RecoverError::Io { what, source }
}

/// How the previous user of the zone ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// The allocator was dropped.
    Clean,
    /// The process was killed with `SIGKILL`.
    Crash,
}

/// Parameters of the benchmark.
#[derive(Debug, Clone)]
pub struct RecoverParams {
    /// Frames in the zone (a multiple of 512).
    pub frames: usize,
    /// Timed recoveries per shutdown kind.
    pub runs: usize,
    /// The crash child runs for a random time up to this long after its recovery.
    pub max_crash_delay: Duration,
    /// Directory of the metadata file (e.g. a tmpfs, hugetlbfs or DAX mount).
    pub dir: PathBuf,
    /// Seed of the random choices.
    pub seed: u64,
}

/// One timed recovery.
#[derive(Debug, Clone, Copy)]
pub struct RecoverSample {
    /// How the zone was left.
    pub shutdown: Shutdown,
    /// The run, from 0.
    pub run: usize,
    /// Duration of `LLFree::persistent(.., Init::Recover)`.
    pub duration: Duration,
    /// Free frames after the recovery.
    pub free_frames: usize,
}

/// The metadata file; removed on drop.
struct MetaFile {
    path: PathBuf,
    file: File,
}

impl MetaFile {
    fn create(dir: &Path, frames: usize) -> Result<Self, RecoverError> {
        let path = dir.join(format!(
            "llfree-recover-{}-{frames}.meta",
            std::process::id()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io_error("create the metadata file"))?;
        let meta = Self { path, file };
        meta.file
            .set_len(LLFree::metadata_size(frames) as u64)
            .map_err(io_error("size the metadata file"))?;
        Ok(meta)
    }

    fn open(&self, frames: usize, init: Init) -> Result<LLFree, RecoverError> {
        let region = FileRegion::map(&self.file, 0, LLFree::metadata_size(frames))
            .map_err(io_error("map the metadata file"))?;
        Ok(LLFree::persistent(
            Config::new(1, frames),
            Box::new(region),
            init,
        )?)
    }
}

impl Drop for MetaFile {
    fn drop(&mut self) {
        // Best effort: a leftover file in a temporary directory is harmless.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs the benchmark; returns the clean samples, then the crash samples.
pub fn run(params: &RecoverParams) -> Result<Vec<RecoverSample>, RecoverError> {
    let meta = MetaFile::create(&params.dir, params.frames)?;
    let mut rng = Rng::new(params.seed);
    prepare(&meta, params.frames, &mut rng)?;
    let mut samples = Vec::new();
    for run in 0..params.runs {
        samples.push(timed_recovery(&meta, params.frames, Shutdown::Clean, run)?);
    }
    let max_ms = params.max_crash_delay.as_millis().max(1) as usize;
    for run in 0..params.runs {
        let delay = Duration::from_millis(1 + rng.below(max_ms) as u64);
        crash_child(&meta, params.frames, rng.next_u64(), delay)?;
        samples.push(timed_recovery(&meta, params.frames, Shutdown::Crash, run)?);
    }
    Ok(samples)
}

/// Formats the zone and leaves half of it allocated at random, then shuts down cleanly.
fn prepare(meta: &MetaFile, frames: usize, rng: &mut Rng) -> Result<(), RecoverError> {
    let llfree = meta.open(frames, Init::Fresh)?;
    let mut held = (0..frames * 3 / 4)
        .map(|_| llfree.get(CoreId(0), Order::BASE))
        .collect::<Result<Vec<_>, _>>()?;
    let surplus = held.len() - frames / 2;
    rng.choose_front(&mut held, surplus);
    held[..surplus]
        .iter()
        .try_for_each(|&frame| llfree.put(CoreId(0), frame, Order::BASE))?;
    Ok(())
}

fn timed_recovery(
    meta: &MetaFile,
    frames: usize,
    shutdown: Shutdown,
    run: usize,
) -> Result<RecoverSample, RecoverError> {
    let start = Instant::now();
    let llfree = meta.open(frames, Init::Recover)?;
    let duration = start.elapsed();
    let expected = match shutdown {
        Shutdown::Clean => Recovery::Clean,
        Shutdown::Crash => Recovery::Crash,
    };
    if llfree.recovery() != expected {
        return Err(RecoverError::Unexpected(format!(
            "after a {shutdown:?} shutdown the allocator recovered as {:?}",
            llfree.recovery()
        )));
    }
    Ok(RecoverSample {
        shutdown,
        run,
        duration,
        free_frames: llfree.free_frames(),
    })
}

/// Forks a child that recovers the zone and then allocates and frees frames until it is killed
/// with `SIGKILL` `delay` after its recovery.
fn crash_child(
    meta: &MetaFile,
    frames: usize,
    seed: u64,
    delay: Duration,
) -> Result<(), RecoverError> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two file descriptors for pipe(2) to fill.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io_error("create a pipe")(io::Error::last_os_error()));
    }
    // SAFETY: pipe(2) returned two fresh descriptors that nothing else owns.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only uses memory it owns or inherited copies of, and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io_error("fork")(io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(read_end);
        churn(meta, frames, File::from(write_end), seed);
    }
    drop(write_end);
    let mut ready = [0u8];
    let started = File::from(read_end).read_exact(&mut ready);
    if started.is_ok() {
        std::thread::sleep(delay);
    }
    // SAFETY: `pid` is our child, which has not been reaped yet.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out pointer.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err(io_error("wait for the crash child")(
            io::Error::last_os_error(),
        ));
    }
    started.map_err(|_| {
        RecoverError::Unexpected("the crash child failed to recover the zone".into())
    })?;
    if !libc::WIFSIGNALED(status) || libc::WTERMSIG(status) != libc::SIGKILL {
        return Err(RecoverError::Unexpected(format!(
            "the crash child ended with status {status:#x}"
        )));
    }
    Ok(())
}

/// The crash child: recover, report readiness, then allocate and free until killed.
fn churn(meta: &MetaFile, frames: usize, mut ready: File, seed: u64) -> ! {
    let Ok(llfree) = meta.open(frames, Init::Recover) else {
        // SAFETY: ends the forked child without running the parent's destructors.
        unsafe { libc::_exit(2) }
    };
    if ready.write_all(&[1]).is_err() {
        // SAFETY: as above.
        unsafe { libc::_exit(3) }
    }
    let mut rng = Rng::new(seed);
    let mut held = Vec::with_capacity(1024);
    loop {
        if held.len() < held.capacity() && (held.is_empty() || rng.below(2) == 0) {
            if let Ok(frame) = llfree.get(CoreId(0), Order::BASE) {
                held.push(frame);
            }
        } else {
            let frame = held.swap_remove(rng.below(held.len()));
            // A failure cannot happen for a frame we hold; the loop only ends by SIGKILL.
            let _ = llfree.put(CoreId(0), frame, Order::BASE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_after_clean_shutdown_and_crash() {
        let params = RecoverParams {
            frames: 1 << 15,
            runs: 3,
            max_crash_delay: Duration::from_millis(5),
            dir: std::env::temp_dir(),
            seed: 1,
        };
        let samples = run(&params).unwrap();
        assert_eq!(samples.len(), 6);
        for sample in &samples[..3] {
            assert_eq!(sample.shutdown, Shutdown::Clean);
            assert_eq!(sample.free_frames, params.frames / 2);
        }
        for sample in &samples[3..] {
            assert_eq!(sample.shutdown, Shutdown::Crash);
            // The child holds at most 1024 frames when it is killed, each crash.
            assert!(
                sample.free_frames + 3 * 1024 >= params.frames / 2,
                "{sample:?}"
            );
        }
    }

    #[test]
    fn bad_directory_is_an_error() {
        let params = RecoverParams {
            frames: 512,
            runs: 1,
            max_crash_delay: Duration::from_millis(1),
            dir: PathBuf::from("/nonexistent/llfree"),
            seed: 1,
        };
        assert!(matches!(run(&params), Err(RecoverError::Io { .. })));
    }
}
