//! Exact division by a divisor fixed when a limit is built, without a `div` instruction.
//!
//! A 64-bit `div` costs tens of cycles on common x86 cores, and a decision divides by the
//! same few numbers (the emission interval, the window) every time. Multiplying by a
//! precomputed reciprocal and correcting once gives the same quotient and remainder in a few
//! cycles. The Lua rendering needs none of this: it only has to produce the same integers.

/// `d` and `⌊(2^64 − 1) / d⌋`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Divisor {
    d: u64,
    reciprocal: u64,
}

impl Divisor {
    /// Callers validate `d ≥ 1`; a zero is mapped to 1 rather than panicking.
    pub(crate) const fn new(d: u64) -> Self {
        let d = if d == 0 { 1 } else { d };
        Self {
            d,
            reciprocal: u64::MAX / d,
        }
    }

    /// `d` itself.
    #[inline]
    pub(crate) const fn get(self) -> u64 {
        self.d
    }

    /// `(n / d, n % d)`, exactly, for every `n`.
    #[inline]
    pub(crate) fn div_rem(self, n: u64) -> (u64, u64) {
        // `reciprocal ≤ 2^64 / d`, so the estimate never exceeds the true quotient, and it
        // falls short by less than `n (d + 1) / (d · 2^64) < 2`: at most two corrections.
        let mut q = ((u128::from(n) * u128::from(self.reciprocal)) >> 64) as u64;
        let mut r = n - q * self.d;
        while r >= self.d {
            q += 1;
            r -= self.d;
        }
        (q, r)
    }

    /// `n / d`.
    #[inline]
    pub(crate) fn div(self, n: u64) -> u64 {
        self.div_rem(n).0
    }

    /// `n % d`.
    #[inline]
    pub(crate) fn rem(self, n: u64) -> u64 {
        self.div_rem(n).1
    }
}

#[cfg(test)]
mod tests {
    use super::Divisor;

    #[test]
    fn quotient_and_remainder_match_hardware_division_at_the_edges() {
        let divisors = [
            1,
            2,
            3,
            7,
            1_000,
            333_333,
            (1 << 52) - 1,
            1 << 52,
            u64::MAX / 3,
            u64::MAX,
        ];
        let mut numerators = vec![0, 1, 2, 999, (1 << 52) - 1, 1 << 53, u64::MAX - 1, u64::MAX];
        // A cheap deterministic spread in between (an LCG; no RNG dependency in the core).
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            numerators.push(x >> (x % 64));
        }
        for d in divisors {
            let divisor = Divisor::new(d);
            for &n in &numerators {
                assert_eq!(divisor.div_rem(n), (n / d, n % d), "{n} / {d}");
                for k in [n / d, (n / d).saturating_sub(1)] {
                    if let Some(m) = k.checked_mul(d) {
                        assert_eq!(divisor.div_rem(m), (k, 0), "{m} / {d}");
                        if let Some(m1) = m.checked_sub(1) {
                            assert_eq!(divisor.div_rem(m1), (m1 / d, m1 % d), "{m1} / {d}");
                        }
                    }
                }
            }
        }
    }
}
