//! The 512-bit bitfield of one 2 MiB child: one bit per 4 KiB frame, 1 = allocated.
//!
//! The bitfield is eight `u64` words in one cache line. Orders 0 to 6 occupy an aligned run of
//! bits inside one word and are set or cleared by a single compare-and-swap. Orders 7 and 8 span
//! two or four whole words, which are claimed one after the other and rolled back when a race is
//! lost.

use std::sync::atomic::{AtomicU64, Ordering};

/// Words per bitfield.
pub const WORDS: usize = 8;
/// Bits per word.
const WORD_BITS: usize = 64;

/// The bitfield of one child, aligned to a cache line.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Bitfield([AtomicU64; WORDS]);

/// A failed clear of a bitfield range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearError {
    /// Not every bit of the range was set; nothing was cleared.
    NotSet,
    /// A race (a concurrent double free) cleared some of the words of a multi-word range first;
    /// this call cleared `cleared_frames` frames before it noticed.
    Partial {
        /// Frames this call cleared.
        cleared_frames: usize,
    },
}

/// Bits at the positions where an aligned run of `1 << order` bits may start.
const fn run_starts(order: usize) -> u64 {
    let mut mask = 0u64;
    let mut bit = 0;
    while bit < WORD_BITS {
        mask |= 1 << bit;
        bit += 1 << order;
    }
    mask
}

/// Start positions for orders 0 to 6.
const RUN_STARTS: [u64; 7] = [
    run_starts(0),
    run_starts(1),
    run_starts(2),
    run_starts(3),
    run_starts(4),
    run_starts(5),
    run_starts(6),
];

/// A mask of `1 << order` bits starting at bit 0 (orders 0 to 6).
#[inline]
const fn run_mask(order: usize) -> u64 {
    if order >= 6 {
        u64::MAX
    } else {
        (1u64 << (1 << order)) - 1
    }
}

/// Index of the first aligned run of `1 << order` zero bits in `word`, if any.
#[inline]
fn first_free_run(word: u64, order: usize) -> Option<usize> {
    let mut free = !word;
    let mut width = 1;
    while width < (1 << order) {
        free &= free >> width;
        width <<= 1;
    }
    let starts = free & RUN_STARTS[order];
    (starts != 0).then(|| starts.trailing_zeros() as usize)
}

impl Bitfield {
    /// Allocates an aligned run of `1 << order` bits, searching from word `start_word`.
    /// Returns the index of the first bit.
    #[inline]
    pub fn set_first_zeros(&self, start_word: usize, order: usize) -> Option<usize> {
        if order <= 6 {
            self.set_in_word(start_word, order)
        } else {
            self.set_words(order)
        }
    }

    /// Orders 0 to 6: one compare-and-swap inside one word.
    #[inline]
    fn set_in_word(&self, start_word: usize, order: usize) -> Option<usize> {
        for i in 0..WORDS {
            let index = (start_word + i) % WORDS;
            let word = &self.0[index];
            let mut current = word.load(Ordering::Relaxed);
            if current == u64::MAX {
                continue;
            }
            while let Some(bit) = first_free_run(current, order) {
                let new = current | (run_mask(order) << bit);
                stop!();
                match word.compare_exchange(current, new, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => return Some(index * WORD_BITS + bit),
                    Err(actual) => current = actual,
                }
            }
        }
        None
    }

    /// Orders 7 and 8: two or four whole words, rolled back when a race is lost.
    fn set_words(&self, order: usize) -> Option<usize> {
        let words = 1 << (order - 6);
        for first in (0..WORDS).step_by(words) {
            let group = &self.0[first..first + words];
            if group.iter().any(|w| w.load(Ordering::Relaxed) != 0) {
                continue;
            }
            let claimed = group
                .iter()
                .take_while(|w| {
                    stop!();
                    w.compare_exchange(0, u64::MAX, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                })
                .count();
            if claimed == words {
                return Some(first * WORD_BITS);
            }
            for word in &group[..claimed] {
                word.store(0, Ordering::Release);
            }
        }
        None
    }

    /// Frees the aligned run of `1 << order` bits starting at `bit`. Fails if any bit is not set.
    #[inline]
    pub fn clear(&self, bit: usize, order: usize) -> Result<(), ClearError> {
        if order <= 6 {
            let mask = run_mask(order) << (bit % WORD_BITS);
            let word = &self.0[bit / WORD_BITS];
            stop!();
            word.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                (w & mask == mask).then_some(w & !mask)
            })
            .map(|_| ())
            .map_err(|_| ClearError::NotSet)
        } else {
            let first = bit / WORD_BITS;
            let group = &self.0[first..first + (1 << (order - 6))];
            if group.iter().any(|w| w.load(Ordering::Acquire) != u64::MAX) {
                return Err(ClearError::NotSet);
            }
            for (i, word) in group.iter().enumerate() {
                stop!();
                if word
                    .compare_exchange(u64::MAX, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    return Err(ClearError::Partial {
                        cleared_frames: i * WORD_BITS,
                    });
                }
            }
            Ok(())
        }
    }

    /// Whether all bits of the aligned run of `1 << order` bits at `bit` are zero.
    pub fn is_zero(&self, bit: usize, order: usize) -> bool {
        if order <= 6 {
            let mask = run_mask(order) << (bit % WORD_BITS);
            self.0[bit / WORD_BITS].load(Ordering::Acquire) & mask == 0
        } else {
            let first = bit / WORD_BITS;
            self.0[first..first + (1 << (order - 6))]
                .iter()
                .all(|w| w.load(Ordering::Acquire) == 0)
        }
    }

    /// Whether all bits of the aligned run of `1 << order` bits at `bit` are set.
    pub fn is_full(&self, bit: usize, order: usize) -> bool {
        if order <= 6 {
            let mask = run_mask(order) << (bit % WORD_BITS);
            self.0[bit / WORD_BITS].load(Ordering::Acquire) & mask == mask
        } else {
            let first = bit / WORD_BITS;
            self.0[first..first + (1 << (order - 6))]
                .iter()
                .all(|w| w.load(Ordering::Acquire) == u64::MAX)
        }
    }

    /// Number of set bits (allocated frames).
    pub fn count_ones(&self) -> usize {
        self.0
            .iter()
            .map(|w| w.load(Ordering::Acquire).count_ones() as usize)
            .sum()
    }

    /// Clears every bit (initialisation).
    pub fn reset(&self) {
        for word in &self.0 {
            word.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_free_run_is_aligned() {
        assert_eq!(first_free_run(0, 0), Some(0));
        assert_eq!(first_free_run(0b1, 0), Some(1));
        assert_eq!(first_free_run(0b10, 1), Some(2));
        assert_eq!(first_free_run(0b1000, 2), Some(4));
        assert_eq!(first_free_run(u64::MAX, 0), None);
        assert_eq!(first_free_run(1 << 63, 6), None);
        assert_eq!(first_free_run(0, 6), Some(0));
        // A free run of four bits at 2..6 is not aligned to order 2.
        assert_eq!(first_free_run(!0b11_1100, 2), None);
    }

    #[test]
    fn set_and_clear_every_order() {
        let field = Bitfield::default();
        for order in 0..=8 {
            let bit = field.set_first_zeros(0, order).unwrap();
            assert_eq!(bit % (1 << order), 0);
            assert!(!field.is_zero(bit, order));
            assert_eq!(field.clear(bit, order), Ok(()));
            assert!(field.is_zero(bit, order));
            assert_eq!(field.clear(bit, order), Err(ClearError::NotSet));
        }
        assert_eq!(field.count_ones(), 0);
    }

    #[test]
    fn fills_all_512_frames() {
        let field = Bitfield::default();
        for i in 0..512 {
            assert_eq!(field.set_first_zeros(0, 0), Some(i));
        }
        assert_eq!(field.set_first_zeros(3, 0), None);
        assert_eq!(field.count_ones(), 512);
    }

    #[test]
    fn search_starts_at_the_hint_word() {
        let field = Bitfield::default();
        assert_eq!(field.set_first_zeros(5, 0), Some(5 * 64));
        assert_eq!(field.set_first_zeros(7, 3), Some(7 * 64));
    }

    #[test]
    fn multi_word_orders_skip_used_words() {
        let field = Bitfield::default();
        assert_eq!(field.set_first_zeros(0, 0), Some(0));
        assert_eq!(field.set_first_zeros(0, 8), Some(256));
        assert_eq!(field.set_first_zeros(0, 8), None);
        assert_eq!(field.set_first_zeros(0, 7), Some(128));
        assert_eq!(field.clear(0, 7), Err(ClearError::NotSet));
    }
}
