//! Thread stop-points for deterministic interleaving tests.
//!
//! The allocator calls [`point`] (through the `stop!` macro) between the atomic steps of every
//! operation. In unit tests, [`run`] executes closures on threads that pause at each point and
//! proceed in a fixed order given by a schedule, so each race is replayed exactly. Outside tests
//! the macro expands to nothing.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex};

/// The shared schedule of one interleaving test.
struct Schedule {
    /// Thread ids in the order in which they may pass their next stop point.
    order: Vec<usize>,
    /// Position in `order`.
    next: usize,
    /// Threads that finished; their remaining turns are skipped.
    done: Vec<bool>,
    /// The thread that passed the last point and has not reached its next one yet.
    running: Option<usize>,
}

impl Schedule {
    /// Skips turns of finished threads.
    fn skip_done(&mut self) {
        while self.next < self.order.len() && self.done[self.order[self.next]] {
            self.next += 1;
        }
    }
}

type SharedSchedule = Arc<(Mutex<Schedule>, Condvar)>;

thread_local! {
    static CURRENT: RefCell<Option<(SharedSchedule, usize)>> = const { RefCell::new(None) };
}

/// Waits until the schedule lets this thread pass. A thread that passed runs alone until its next
/// point (or its end). Threads outside [`run`] pass at once; once the schedule is used up, all
/// threads run freely.
pub(crate) fn point() {
    CURRENT.with(|current| {
        let Some((shared, id)) = current.borrow().clone() else {
            return;
        };
        let (lock, cond) = &*shared;
        let mut schedule = lock.lock().unwrap();
        if schedule.running == Some(id) {
            schedule.running = None;
            cond.notify_all();
        }
        loop {
            schedule.skip_done();
            if schedule.next >= schedule.order.len() {
                return;
            }
            if schedule.running.is_none() && schedule.order[schedule.next] == id {
                break;
            }
            schedule = cond.wait(schedule).unwrap();
        }
        schedule.next += 1;
        schedule.running = Some(id);
    });
}

/// Runs `threads` closures, one per thread id, interleaved at their stop points in `order`.
pub(crate) fn run<F>(threads: usize, order: &[usize], f: F)
where
    F: Fn(usize) + Sync,
{
    assert!(order.iter().all(|id| *id < threads));
    let shared: SharedSchedule = Arc::new((
        Mutex::new(Schedule {
            order: order.to_vec(),
            next: 0,
            done: vec![false; threads],
            running: None,
        }),
        Condvar::new(),
    ));
    std::thread::scope(|scope| {
        for id in 0..threads {
            let shared = shared.clone();
            let f = &f;
            scope.spawn(move || {
                CURRENT.with(|c| *c.borrow_mut() = Some((shared.clone(), id)));
                point();
                f(id);
                CURRENT.with(|c| *c.borrow_mut() = None);
                let (lock, cond) = &*shared;
                let mut schedule = lock.lock().unwrap();
                schedule.done[id] = true;
                if schedule.running == Some(id) {
                    schedule.running = None;
                }
                cond.notify_all();
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_orders_threads() {
        let log = Mutex::new(Vec::new());
        run(2, &[1, 0, 1, 0, 0, 1], |id| {
            log.lock().unwrap().push(id);
            point();
            log.lock().unwrap().push(id + 10);
        });
        assert_eq!(*log.lock().unwrap(), vec![1, 0, 11, 10]);
    }
}
