//! The threads that answer the API's requests: each request being answered has a thread of its
//! own, and a thread that answered waits [`IDLE_TIME`] for another request before it ends, so
//! that a client's next request (an orchestrator configures a VM in a row of them) does not
//! wait for a new thread (0.1-0.2 ms each on this project's host).
//!
//! The threads are started by the API server's thread, so they inherit its seccomp filter;
//! they end when the server stops ([`RequestThreads`] dropped) and are idle.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a thread that answered waits for the next request.
pub const IDLE_TIME: Duration = Duration::from_secs(30);
/// Stack of a request's thread: answering one small request.
const STACK: usize = 256 << 10;

/// A request to answer.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// The request threads of one API server.
pub struct RequestThreads {
    shared: Arc<PoolState>,
}

#[derive(Default)]
struct PoolState {
    queue: Mutex<WorkQueue>,
    /// Signalled when a job is queued for an idle thread, or the server stops.
    wake: Condvar,
}

#[derive(Default)]
struct WorkQueue {
    /// Jobs handed to idle threads, not yet taken.
    jobs: VecDeque<Job>,
    /// Threads waiting for a job.
    idle: usize,
    /// The server stopped: idle threads end.
    stopped: bool,
}

impl RequestThreads {
    /// No threads yet.
    pub fn new() -> Self {
        RequestThreads {
            shared: Arc::new(PoolState::default()),
        }
    }

    /// Runs `job` on an idle thread, or on a new one; fails (and drops `job`) if no thread
    /// can be started.
    pub fn run(&self, job: Job) -> io::Result<()> {
        let mut queue = self.shared.lock();
        if queue.idle > queue.jobs.len() {
            queue.jobs.push_back(job);
            drop(queue);
            self.shared.wake.notify_one();
            return Ok(());
        }
        drop(queue);
        let shared = self.shared.clone();
        std::thread::Builder::new()
            .name("api-request".into())
            .stack_size(STACK)
            .spawn(move || shared.serve(job))
            .map(drop)
    }
}

impl Drop for RequestThreads {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.wake.notify_all();
    }
}

impl PoolState {
    fn lock(&self) -> MutexGuard<'_, WorkQueue> {
        // A job runs outside the lock: nothing can poison it but a bug here.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `job`, then the jobs handed to this thread while it is idle, until it has been idle
    /// for [`IDLE_TIME`] or the server stops.
    fn serve(&self, mut job: Job) {
        loop {
            job();
            let mut queue = self.lock();
            queue.idle += 1;
            let until = Instant::now() + IDLE_TIME;
            let next = loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break Some(job);
                }
                let left = until.saturating_duration_since(Instant::now());
                if queue.stopped || left.is_zero() {
                    break None;
                }
                queue = match self.wake.wait_timeout(queue, left) {
                    Ok((queue, _)) => queue,
                    Err(e) => e.into_inner().0,
                };
            };
            queue.idle -= 1;
            match next {
                Some(next) => job = next,
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread::ThreadId;

    use super::*;

    /// Runs a job that sends its thread's id, and waits for it.
    fn thread_of_a_job(threads: &RequestThreads) -> ThreadId {
        let (send, receive) = mpsc::channel();
        threads
            .run(Box::new(move || {
                send.send(std::thread::current().id()).unwrap()
            }))
            .unwrap();
        receive.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    /// Waits until `threads` has `count` idle threads.
    fn wait_idle(threads: &RequestThreads, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while threads.shared.lock().idle != count {
            assert!(Instant::now() < deadline, "{count} threads never idle");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_request_after_another_is_answered_by_the_same_thread() {
        let threads = RequestThreads::new();
        let first = thread_of_a_job(&threads);
        wait_idle(&threads, 1);
        assert_eq!(thread_of_a_job(&threads), first);
        wait_idle(&threads, 1);
        assert_eq!(thread_of_a_job(&threads), first);
    }

    #[test]
    fn a_request_while_another_is_answered_gets_a_thread_of_its_own() {
        let threads = RequestThreads::new();
        let (release, held) = mpsc::channel::<()>();
        let (send, receive) = mpsc::channel();
        let slow_send = send.clone();
        threads
            .run(Box::new(move || {
                slow_send.send(std::thread::current().id()).unwrap();
                held.recv().unwrap();
            }))
            .unwrap();
        let slow = receive.recv_timeout(Duration::from_secs(10)).unwrap();
        // The slow request holds its thread: the next one does not wait for it.
        threads
            .run(Box::new(move || {
                send.send(std::thread::current().id()).unwrap()
            }))
            .unwrap();
        let quick = receive.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_ne!(quick, slow);
        release.send(()).unwrap();
        wait_idle(&threads, 2);
    }

    #[test]
    fn idle_threads_end_when_the_server_stops() {
        let threads = RequestThreads::new();
        thread_of_a_job(&threads);
        wait_idle(&threads, 1);
        let shared = Arc::downgrade(&threads.shared);
        drop(threads);
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.strong_count() > 0 {
            assert!(Instant::now() < deadline, "an idle thread is still there");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
