//! The world's only source of randomness for demand and fault draws: rein-core's
//! [`SplitMix64`].
//!
//! turmoil has its own seeded RNG for the network; everything the world draws itself
//! (arrival gaps, keys, clock offsets) comes from a [`Rng`] seeded from the scenario's seed,
//! and each node's from a child seeded by its parent ([`Rng::child`]), so adding a node
//! never changes what the others draw.

use rein_core::rng::SplitMix64;

/// The world's draws over a [`SplitMix64`]. Same seed, same sequence, on every platform.
#[derive(Clone, Debug)]
pub struct Rng {
    bits: SplitMix64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            bits: SplitMix64::new(seed),
        }
    }

    /// A child generator for stream `stream` (a node index, a purpose), seeded from this
    /// one's seed without advancing it.
    pub fn child(&self, stream: u64) -> Self {
        let mut mix =
            SplitMix64::new(self.bits.state() ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        Self::new(mix.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.bits.next_u64()
    }

    /// A number in `0..n` (0 when `n` is 0), as [`SplitMix64::below_inclusive`] draws it.
    pub fn below(&mut self, n: u64) -> u64 {
        n.checked_sub(1)
            .map_or(0, |max| self.bits.below_inclusive(max))
    }

    /// A number in `lo..=hi` (`lo` when the range is empty).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below(hi - lo + 1)
        }
    }

    /// `true` with probability `percent / 100`.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_children_differ() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(
            (0..5).map(|_| a.next_u64()).collect::<Vec<_>>(),
            (0..5).map(|_| b.next_u64()).collect::<Vec<_>>()
        );
        let parent = Rng::new(7);
        assert_ne!(parent.child(0).next_u64(), parent.child(1).next_u64());
        assert!((0..100).all(|_| a.between(3, 5) >= 3 && a.between(3, 5) <= 5));
    }
}
