//! Per-chunk bitmaps of 4 KiB pieces the guest has given away (balloon inflation).
//!
//! The bits outlive the calls that set them: a chunk whose pieces have all been given away,
//! possibly over many calls, can give its frame back to the pool.

use std::ops::Deref;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::zone::ZoneWords;

/// Where the bits live: this process's heap, or a VM's bitmaps in a zone (which outlive it).
#[derive(Debug)]
enum Words {
    Heap(Box<[AtomicU64]>),
    Zone(ZoneWords),
}

impl Deref for Words {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        match self {
            Words::Heap(words) => words,
            Words::Zone(words) => words,
        }
    }
}

/// Bitmaps of given-away 4 KiB pieces, one per chunk, with a count of set bits each.
#[derive(Debug)]
pub struct PieceMap {
    words: Words,
    counts: Box<[AtomicU32]>,
    pieces_per_chunk: usize,
}

impl PieceMap {
    /// Bitmaps for `chunks` chunks of `pieces_per_chunk` pieces (a multiple of 64): empty, or
    /// the ones a VM in a zone kept (`persistent`, as many words), counted again.
    pub fn new(chunks: usize, pieces_per_chunk: usize, persistent: Option<ZoneWords>) -> Self {
        debug_assert_eq!(pieces_per_chunk % 64, 0);
        let words = match persistent {
            Some(words) => Words::Zone(words),
            None => Words::Heap(
                (0..chunks * pieces_per_chunk / 64)
                    .map(|_| AtomicU64::new(0))
                    .collect(),
            ),
        };
        debug_assert_eq!(words.len(), chunks * pieces_per_chunk / 64);
        let counts = words
            .chunks(pieces_per_chunk / 64)
            .map(|chunk| {
                let set = chunk.iter().map(|w| w.load(Ordering::Relaxed).count_ones());
                AtomicU32::new(set.sum())
            })
            .collect();
        Self {
            words,
            counts,
            pieces_per_chunk,
        }
    }

    /// Pieces in one chunk.
    pub fn pieces_per_chunk(&self) -> usize {
        self.pieces_per_chunk
    }

    /// Given-away pieces of `chunk`.
    pub fn count(&self, chunk: usize) -> usize {
        self.counts[chunk].load(Ordering::Acquire) as usize
    }

    /// Marks pieces `[first, first + count)` of `chunk` as given away. Returns how many were newly
    /// marked and whether the whole chunk is given away now.
    pub fn set(&self, chunk: usize, first: usize, count: usize) -> (usize, bool) {
        let newly = self.update(chunk, first, count, |word, mask| {
            ((word.fetch_or(mask, Ordering::AcqRel) & mask) ^ mask).count_ones()
        });
        let total = self.counts[chunk].fetch_add(newly as u32, Ordering::AcqRel) as usize + newly;
        (newly, total == self.pieces_per_chunk)
    }

    /// Takes pieces `[first, first + count)` of `chunk` back; returns how many were marked.
    pub fn clear(&self, chunk: usize, first: usize, count: usize) -> usize {
        let cleared = self.update(chunk, first, count, |word, mask| {
            (word.fetch_and(!mask, Ordering::AcqRel) & mask).count_ones()
        });
        self.counts[chunk].fetch_sub(cleared as u32, Ordering::AcqRel);
        cleared
    }

    fn update(
        &self,
        chunk: usize,
        first: usize,
        count: usize,
        apply: impl Fn(&AtomicU64, u64) -> u32,
    ) -> usize {
        assert!(
            first + count <= self.pieces_per_chunk,
            "piece range out of chunk"
        );
        let base = chunk * self.pieces_per_chunk + first;
        let (mut bit, end) = (base, base + count);
        let mut changed = 0;
        while bit < end {
            let shift = bit % 64;
            let n = (64 - shift).min(end - bit);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << shift
            };
            changed += apply(&self.words[bit / 64], mask) as usize;
            bit += n;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_accumulate_over_calls_until_the_chunk_is_full() {
        let map = PieceMap::new(2, 512, None);
        assert_eq!(map.set(1, 0, 100), (100, false));
        assert_eq!(map.set(1, 50, 100), (50, false));
        assert_eq!(map.count(0), 0);
        assert_eq!(map.clear(1, 140, 20), 10);
        assert_eq!(map.count(1), 140);
        assert_eq!(map.set(1, 3, 509), (372, true));
        assert_eq!(map.count(1), 512);
    }
}
