//! A small, fast, seedable pseudo-random generator (SplitMix64) for the benchmarks' random
//! choices, so that runs are reproducible.

/// SplitMix64: a 64-bit state advanced by a Weyl sequence and scrambled.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// Creates a generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A random number in `0..bound` (`bound > 0`), by multiply-shift (bias below 2^-32 for
    /// bounds below 2^32).
    pub fn below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next_u64()) * bound as u128) >> 64) as usize
    }

    /// Moves a uniformly random choice of `count` items (in random order) to the front of
    /// `items`: the first `count` steps of Fisher-Yates.
    pub fn choose_front<T>(&mut self, items: &mut [T], count: usize) {
        for i in 0..count.min(items.len()) {
            items.swap(i, i + self.below(items.len() - i));
        }
    }

    /// Shuffles `items` uniformly (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_bounds_and_covers_them() {
        let mut rng = Rng::new(1);
        let mut seen = [0usize; 7];
        for _ in 0..7000 {
            seen[rng.below(7)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn choose_front_picks_distinct_items() {
        let mut items: Vec<u32> = (0..100).collect();
        Rng::new(3).choose_front(&mut items, 10);
        let mut front = items[..10].to_vec();
        front.sort_unstable();
        front.dedup();
        assert_eq!(front.len(), 10);
        assert_ne!(&items[..10], &(0..10).collect::<Vec<_>>()[..]);
        items.sort_unstable();
        assert_eq!(items, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn shuffle_is_a_permutation_and_seeded() {
        let mut a: Vec<u32> = (0..1000).collect();
        let mut b = a.clone();
        Rng::new(7).shuffle(&mut a);
        Rng::new(7).shuffle(&mut b);
        assert_eq!(a, b);
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
        a.sort_unstable();
        assert_eq!(a, (0..1000).collect::<Vec<_>>());
    }
}
