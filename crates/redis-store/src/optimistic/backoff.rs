//! Jittered exponential backoff between conflicting attempts, from a seeded RNG.
//!
//! After a conflict every loser retries; without jitter they would all read again at the
//! same moment and collide again. Each wait is drawn uniformly from `[0, window]`
//! ("full jitter"), the window doubling per attempt from `base` up to `max`.
//!
//! The RNG is SplitMix64 over one atomic counter: lock-free, and deterministic for a given
//! seed and order of draws (the order of draws depends on task scheduling, so a run is
//! reproducible only as far as its scheduling is).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rein_core::rng::{GAMMA, mix};

/// Backoff settings and the RNG they draw from.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    state: AtomicU64,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Duration, seed: u64) -> Self {
        Self {
            base,
            max: max.max(base),
            state: AtomicU64::new(seed),
        }
    }

    /// The wait after the `conflicts`-th conflict of one call (1 for the first).
    pub(crate) fn delay(&self, conflicts: u32) -> Duration {
        let doublings = conflicts.saturating_sub(1).min(31);
        let window = self.base.saturating_mul(1u32 << doublings).min(self.max);
        let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        if window_ns == 0 {
            return Duration::ZERO;
        }
        // Modulo bias is below 2^-32 for any window under 4 s: irrelevant for jitter.
        Duration::from_nanos(self.next_u64() % (window_ns + 1))
    }

    fn next_u64(&self) -> u64 {
        // SplitMix64's step, taken atomically: the counter advances by GAMMA, the draw is the
        // advanced counter through the mixer.
        mix(self
            .state
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_double_up_to_the_maximum() {
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(4), 7);
        for _ in 0..1_000 {
            assert!(backoff.delay(1) <= Duration::from_millis(1));
            assert!(backoff.delay(2) <= Duration::from_millis(2));
            assert!(backoff.delay(30) <= Duration::from_millis(4));
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_waits() {
        let a = Backoff::new(Duration::from_millis(1), Duration::from_millis(8), 42);
        let b = Backoff::new(Duration::from_millis(1), Duration::from_millis(8), 42);
        let c = Backoff::new(Duration::from_millis(1), Duration::from_millis(8), 43);
        let draws = |x: &Backoff| (1..20).map(|n| x.delay(n)).collect::<Vec<_>>();
        assert_eq!(draws(&a), draws(&b));
        assert_ne!(draws(&a), draws(&c));
    }

    #[test]
    fn draws_spread_over_the_window() {
        let backoff = Backoff::new(Duration::from_millis(8), Duration::from_millis(8), 1);
        let draws: Vec<_> = (0..1_000).map(|_| backoff.delay(1)).collect();
        let low = draws
            .iter()
            .filter(|d| **d < Duration::from_millis(4))
            .count();
        assert!((400..600).contains(&low), "{low} of 1000 in the lower half");
    }

    #[test]
    fn a_zero_base_never_waits() {
        let backoff = Backoff::new(Duration::ZERO, Duration::ZERO, 1);
        assert_eq!(backoff.delay(5), Duration::ZERO);
    }
}
