//! Claims of core ids by threads, without a lock: the first thread that uses a core claims it with
//! one compare-and-swap, later uses by that thread cost one relaxed load, and the claim lasts
//! until the owner releases it. Per-core state without atomics (ListLocal's lists, LLFree's
//! frame caches) is safe to use for the owner.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// Source of thread tokens; 0 means "no owner".
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TOKEN: Cell<u64> = const { Cell::new(0) };
}

/// A token unique to the calling thread for the life of the process.
#[inline]
fn thread_token() -> u64 {
    TOKEN.with(|token| match token.get() {
        0 => {
            let fresh = NEXT_TOKEN.fetch_add(1, Relaxed);
            token.set(fresh);
            fresh
        }
        known => known,
    })
}

/// The claim on one core id: its owner's token, or 0.
#[derive(Debug, Default)]
pub struct Claim(AtomicU64);

impl Claim {
    /// Whether the calling thread owns the core, claiming it if nobody does.
    #[inline]
    pub fn claim(&self) -> bool {
        let me = thread_token();
        let owner = self.0.load(Relaxed);
        owner == me || (owner == 0 && self.0.compare_exchange(0, me, Acquire, Relaxed).is_ok())
    }

    /// Gives the claim up if the calling thread holds it.
    pub fn release(&self) {
        let _ = self.0.compare_exchange(thread_token(), 0, Release, Relaxed);
    }
}

/// Per-core values that only the thread holding the core's claim may use.
#[derive(Debug)]
pub struct Claimed<T> {
    slots: Box<[CoreSlot<T>]>,
}

/// One core's claim and value, on its own cache line.
#[derive(Debug)]
#[repr(align(64))]
struct CoreSlot<T> {
    claim: Claim,
    /// The owner uses the value right now (so that a nested use finds it busy).
    in_use: Cell<bool>,
    value: UnsafeCell<T>,
}

// SAFETY: a value and its `in_use` flag are only reached through `with`, by the one thread that
// holds the slot's claim (taken with Acquire, given up with Release, so the next owner sees the
// last one's writes), and `with` refuses while the value is in use, so even that thread never has
// two references to it. Values move between threads with the claim, hence `T: Send`.
unsafe impl<T: Send> Sync for Claimed<T> {}

impl<T> Claimed<T> {
    /// One value per core.
    pub fn new(values: impl IntoIterator<Item = T>) -> Self {
        Self {
            slots: values
                .into_iter()
                .map(|value| CoreSlot {
                    claim: Claim::default(),
                    in_use: Cell::new(false),
                    value: UnsafeCell::new(value),
                })
                .collect(),
        }
    }

    /// Runs `f` on the value of `core` (modulo the cores) if the calling thread holds or can
    /// take the core's claim; `None` if another thread holds the claim or the value is in use.
    #[inline]
    pub fn with<R>(&self, core: usize, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let slot = self.slot(core);
        if !slot.claim.claim() {
            return None;
        }
        if slot.in_use.replace(true) {
            return None;
        }
        // SAFETY: this thread holds the claim, so no other thread touches the value (see the
        // `Sync` impl), and `in_use` makes this the only reference until `f` has returned.
        let value = unsafe { &mut *slot.value.get() };
        let result = f(value);
        slot.in_use.set(false);
        Some(result)
    }

    /// Gives up the calling thread's claim on `core`, after running `f` on its value; `None`
    /// (and nothing run) if another thread holds the claim.
    pub fn release<R>(&self, core: usize, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let result = self.with(core, f)?;
        self.slot(core).claim.release();
        Some(result)
    }

    /// The slot of `core`, without a division where the id is in range.
    #[inline]
    fn slot(&self, core: usize) -> &CoreSlot<T> {
        match self.slots.get(core) {
            Some(slot) => slot,
            None => &self.slots[core % self.slots.len()],
        }
    }

    /// Every value, with exclusive access (no thread can use them).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().map(|slot| slot.value.get_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_belongs_to_one_thread_until_released() {
        let claimed = Claimed::new([0usize, 0]);
        assert_eq!(claimed.with(0, |v| *v += 1), Some(()));
        assert_eq!(claimed.with(2, |v| *v), Some(1));
        // Nested use of the same core finds it busy.
        assert_eq!(claimed.with(0, |_| claimed.with(0, |_| ())), Some(None));
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(claimed.with(0, |v| *v), None);
                assert_eq!(claimed.release(0, |_| ()), None);
                assert_eq!(claimed.with(1, |v| *v += 2), Some(()));
            });
        });
        assert_eq!(claimed.release(1, |v| *v), None, "the other thread's");
        assert_eq!(claimed.release(0, |v| *v), Some(1));
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(claimed.with(0, |v| *v), Some(1)));
        });
    }
}
