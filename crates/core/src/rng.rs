//! SplitMix64 (Steele, Lea and Flood, 2014): the one seeded generator rein draws from where
//! it needs numbers that spread, not secrets: the breaker's open periods, the optimistic
//! store's backoff, the simulator's demand and faults.
//!
//! A Weyl sequence (a counter stepped by [`GAMMA`]) through a mixer ([`mix`]). The same
//! seed gives the same sequence on every platform; nothing here is cryptographic.
//!
//! ```
//! use rein_core::rng::SplitMix64;
//!
//! let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
//! assert_eq!(a.next_u64(), b.next_u64());
//! assert!(a.below_inclusive(10) <= 10);
//! ```

/// The Weyl step: 2^64 divided by the golden ratio, odd.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The output mixer: a bijection of `u64` that spreads every input bit over the output.
#[inline]
pub const fn mix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A SplitMix64 generator: its whole state is the Weyl counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The counter as it stands: the seed of a generator that continues this one's
    /// sequence.
    pub const fn state(&self) -> u64 {
        self.0
    }

    /// The next 64 bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// A number in `0..=max`. Drawn by modulo: the bias is below `max / 2^64`, under 2^-40
    /// for any `max` below 2^24.
    pub fn below_inclusive(&mut self, max: u64) -> u64 {
        match max.checked_add(1) {
            Some(n) => self.next_u64() % n,
            None => self.next_u64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_the_published_one() {
        // The first outputs of SplitMix64 seeded with 0 (the reference implementation's).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.state(), GAMMA.wrapping_mul(2));
    }

    #[test]
    fn draws_stay_in_range_at_both_ends() {
        let mut r = SplitMix64::new(42);
        assert!((0..1_000).all(|_| r.below_inclusive(3) <= 3));
        assert_eq!(r.below_inclusive(0), 0);
        // The whole range has no modulus: the draw is the next output itself.
        let mut same = r.clone();
        assert_eq!(r.below_inclusive(u64::MAX), same.next_u64());
    }
}
