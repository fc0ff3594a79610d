//! [`LeaseTerms`]: whether a policy can be leased in blocks (`acquire_held`, returned with
//! `refund_held`), and how long a block it grants stays usable.
//!
//! A lease of `k` units on a window policy is one `acquire_held(cost k, hold 0)`: all-or-nothing across
//! the policy's limits, counted in each limit's current window. The units are exact only
//! while they are spent inside that window, so the block must end at the **earliest**
//! window boundary among the policy's limits. The store does not say where that is: its
//! decision carries one `reset_after`, the *longest* among the limits (`rein_core::Policy`
//! combines by maximum). This file works out, once per policy, whether that one number
//! pins every limit's boundary, and reads the boundary from it for each grant.
//!
//! # Which shapes are leasable (docs/leases.md, "Shapes")
//! Every limit is a fixed window or a sliding counter, and every window divides the
//! largest one `W`. Then all boundaries are multiples of the smallest window `w`, the
//! longest `reset_after` belongs to a limit of window `W`, and it gives the store's instant
//! modulo `W`, hence modulo `w`:
//! - a fixed window of length `W` answers `r = W − (t mod W)`, in `(0, W]`;
//! - a sliding counter answers `r = 2W − (t mod W)` (both counters decay), in `(W, 2W]`.
//!
//! If a limit of window `W` is a sliding counter, its `r` exceeds every fixed window's
//! (`≤ W`) and every shorter counter's, so the reading is unambiguous. If the largest
//! window is only a fixed window while a shorter sliding counter exists, `r` could come
//! from either, and the policy is decided directly ([`Unleasable::AmbiguousReset`]).
//!
//! A policy of sliding logs only is leased with the store's held operations
//! ([`Leasable::acquire_held`](rein_core::Leasable::acquire_held)): a grant's units are
//! stamped at the store's instant plus the hold `V`, the latest a unit may be spent, so a block
//! lives `V` from before it was asked for, whatever the windows. `V` is the smallest window
//! over [`LeaseConfig::log_hold_divisor`](super::LeaseConfig::log_hold_divisor): a spent
//! unit counts up to `V` longer than its use, which costs up to `V / (W + V)` of the
//! capacity leases serve (docs/leases.md, "Sliding log").
//! A policy of one token bucket is leased as rate ([`rate_shares`], `rate.rs`); any other
//! policy with a token bucket, and sliding logs beside other algorithms, are decided
//! directly.

use rein_core::{Decision, Limit, Micros, Policy, rate_share::RateShares};
use thiserror::Error;

/// How a leasable policy's grants are read. Small and `Copy`: the lease book keeps one per
/// key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseTerms {
    /// The policy's capacity (its smallest limit's): the most a block can hold.
    capacity: u64,
    /// The smallest window `w`, µs: a block ends at the next multiple of it.
    smallest: u64,
    /// The largest window `W`, µs, whose limit answers the combined `reset_after`.
    largest: u64,
    /// Whether a limit of window `W` is a sliding counter (its `reset_after` is offset by
    /// one more window).
    largest_is_counter: bool,
    /// For a policy of sliding logs: the hold `V`, µs, of every grant (0: a window policy).
    hold: u64,
}

/// Why a policy is decided directly rather than through leases. Not an error to the
/// caller: the leased limiter decides such policies through the store, and says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
#[non_exhaustive]
pub enum Unleasable {
    /// A token bucket: a block of tokens spent later over-admits by the refill meanwhile.
    /// A policy of one token bucket is leased as rate instead
    /// (`lease/rate.rs`); a token bucket beside other limits, or one whose
    /// share units are not exact, is decided directly.
    #[error("a token bucket cannot be leased in blocks (one alone is leased as rate)")]
    TokenBucket,
    /// A sliding log beside limits of other algorithms: one grant would need a window's
    /// span and a log's stamp at once, which is not proven exact (docs/leases.md).
    #[error("a sliding log beside other algorithms is not leased")]
    SlidingLog,
    /// A window does not divide the largest window: boundaries are not all multiples of
    /// the smallest window, and one `reset_after` cannot place them.
    #[error("the policy's windows do not all divide its largest window")]
    UnalignedWindows,
    /// The largest window is a fixed window while a shorter sliding counter exists: the
    /// combined `reset_after` could come from either.
    #[error("the policy's combined reset_after does not identify its window boundaries")]
    AmbiguousReset,
}

impl LeaseTerms {
    /// The terms of `policy` with the default log hold
    /// ([`DEFAULT_LOG_HOLD_DIVISOR`](super::book::DEFAULT_LOG_HOLD_DIVISOR)), or why it
    /// must be decided directly.
    pub fn new(policy: &Policy) -> Result<Self, Unleasable> {
        Self::with_log_hold_divisor(policy, u64::from(super::book::DEFAULT_LOG_HOLD_DIVISOR))
    }

    /// The terms of `policy`, a sliding log's hold being its smallest window over
    /// `log_hold_divisor` ([`LeaseConfig::log_hold_divisor`](super::LeaseConfig)), or why
    /// it must be decided directly.
    pub fn with_log_hold_divisor(
        policy: &Policy,
        log_hold_divisor: u64,
    ) -> Result<Self, Unleasable> {
        let logs: Vec<u64> = policy
            .limits()
            .iter()
            .filter_map(|l| match l {
                Limit::SlidingLog(log) => Some(log.window().as_micros()),
                _ => None,
            })
            .collect();
        if logs.len() == policy.limits().len() {
            // `Policy` holds at least one limit.
            let smallest = logs.iter().copied().min().unwrap_or(1);
            let largest = logs.iter().copied().max().unwrap_or(1);
            return Ok(Self {
                capacity: policy.capacity(),
                smallest,
                largest,
                largest_is_counter: false,
                hold: (smallest / log_hold_divisor.max(1)).max(1),
            });
        }
        let mut windows = Vec::with_capacity(policy.limits().len());
        for limit in policy.limits() {
            match limit {
                Limit::TokenBucket(_) => return Err(Unleasable::TokenBucket),
                Limit::SlidingLog(_) => return Err(Unleasable::SlidingLog),
                Limit::FixedWindow(l) => windows.push((l.window().as_micros(), false)),
                Limit::SlidingCounter(l) => windows.push((l.window().as_micros(), true)),
            }
        }
        // `Policy` holds at least one limit.
        let largest = windows.iter().map(|&(w, _)| w).max().unwrap_or(1);
        let smallest = windows.iter().map(|&(w, _)| w).min().unwrap_or(1);
        if windows.iter().any(|&(w, _)| largest % w != 0) {
            return Err(Unleasable::UnalignedWindows);
        }
        let largest_is_counter = windows.iter().any(|&(w, c)| c && w == largest);
        if !largest_is_counter && windows.iter().any(|&(_, c)| c) {
            return Err(Unleasable::AmbiguousReset);
        }
        Ok(Self {
            capacity: policy.capacity(),
            smallest,
            largest,
            largest_is_counter,
            hold: 0,
        })
    }

    /// For a policy of sliding logs, the hold of every grant: ask with
    /// [`Leasable::acquire_held`](rein_core::Leasable::acquire_held) and give back with
    /// [`Leasable::refund_held`](rein_core::Leasable::refund_held). `None` for windows.
    pub fn hold(&self) -> Option<Micros> {
        (self.hold > 0).then(|| Micros::from_micros(self.hold))
    }

    /// Whether units a block did not spend are still worth giving back after its end: a
    /// sliding counter's window lives on as the next one's previous counter, whose weight a
    /// return into it lightens (`refund_in_window`), where a fixed window's is over.
    pub fn returns_after_end(&self) -> bool {
        self.largest_is_counter
    }

    /// The policy's capacity: the largest block, and the largest cost.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The smallest window: the longest any block can live.
    pub fn smallest_window(&self) -> Micros {
        Micros::from_micros(self.smallest)
    }

    /// For a grant (an allowed `acquire` of a positive cost) decided at the store's instant
    /// `t`: the time from `t` to the earliest window boundary among the policy's limits,
    /// in `(0, w]`. `None` when `reset_after` is not one a grant of this policy can carry
    /// (for example a failure policy's answer, whose `reset_after` is zero, from a
    /// `Leasable` that gives one): such an answer did not come from the store's windows and
    /// must not be spent as a lease.
    pub fn span(&self, grant: &Decision) -> Option<Micros> {
        if !grant.is_allowed() {
            return None;
        }
        let r = grant.reset_after.as_micros();
        if self.hold > 0 {
            // A held grant's own stamp leaves the window `hold + W` after the decision, and
            // the combined reset is at least that: anything shorter (a failure policy's
            // answer from a store that gives one) was not stamped for a lease.
            return (r >= self.hold + self.smallest).then(|| Micros::from_micros(self.hold));
        }
        let big = self.largest;
        // `phase` = t mod W, from the largest window's own reading.
        let phase = if self.largest_is_counter {
            (big < r && r <= 2 * big).then(|| 2 * big - r)?
        } else {
            (0 < r && r <= big).then(|| big - r)?
        };
        Some(Micros::from_micros(self.smallest - phase % self.smallest))
    }
}

/// For a policy of one token bucket whose share units are exact: its rate shares. Such a
/// policy is leased as rate (sub-buckets, `rate.rs`) rather than in blocks.
pub fn rate_shares(policy: &Policy) -> Option<RateShares> {
    match policy.limits() {
        [Limit::TokenBucket(bucket)] => RateShares::new(bucket).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use rein_core::{Limit, Outcome, Timestamp};

    use super::*;

    fn policy(limits: &[Limit]) -> Policy {
        Policy::new(limits.iter().copied()).unwrap()
    }

    fn fw(limit: u64, ms: u64) -> Limit {
        Limit::fixed_window(limit, Micros::from_millis(ms)).unwrap()
    }

    fn sc(limit: u64, ms: u64) -> Limit {
        Limit::sliding_counter(limit, Micros::from_millis(ms)).unwrap()
    }

    #[test]
    fn a_policy_of_sliding_logs_is_leased_for_a_fiftieth_of_its_smallest_window_by_default() {
        let log = |limit, ms| Limit::sliding_log(limit, Micros::from_millis(ms)).unwrap();
        let policy = policy(&[log(10, 1_000), log(100, 60_000)]);
        let terms = LeaseTerms::new(&policy).unwrap();
        let hold = Micros::from_millis(20);
        assert_eq!(terms.hold(), Some(hold));
        // The divisor is a setting.
        let twentieth = LeaseTerms::with_log_hold_divisor(&policy, 20).unwrap();
        assert_eq!(twentieth.hold(), Some(Micros::from_millis(50)));
        let mut state = policy.new_state();
        let now = Timestamp::from_micros(7_000_000);
        // Whatever the log already holds, a held grant carries its own stamp's end.
        for _ in 0..3 {
            let grant = policy.acquire_held(now, &mut state, 2, hold).unwrap();
            assert_eq!(terms.span(&grant), Some(hold));
        }
        // A plain admission of one log (a failure policy's local share) or fail open's is
        // not a grant. (Of several logs, a longer window's reset may pass for one: a local
        // share's grant is then spent, within the fallback's own slack, docs/failure.md.)
        let one = self::policy(&[log(10, 1_000)]);
        let plain = one.acquire(now, &mut one.new_state(), 2).unwrap();
        assert_eq!(LeaseTerms::new(&one).unwrap().span(&plain), None);
        let open = Decision {
            reset_after: Micros::ZERO,
            ..plain
        };
        assert_eq!(terms.span(&open), None);
        assert_eq!(
            LeaseTerms::new(&self::policy(&[fw(5, 100)]))
                .unwrap()
                .hold(),
            None
        );
    }

    #[test]
    fn only_window_policies_whose_reset_pins_every_boundary_are_leasable() {
        let bucket = Limit::token_bucket(5, 1, Micros::from_secs(1)).unwrap();
        let log = Limit::sliding_log(5, Micros::from_secs(1)).unwrap();
        assert_eq!(
            LeaseTerms::new(&policy(&[bucket])),
            Err(Unleasable::TokenBucket)
        );
        assert_eq!(
            LeaseTerms::new(&policy(&[fw(5, 10), log])),
            Err(Unleasable::SlidingLog)
        );
        assert_eq!(
            LeaseTerms::new(&policy(&[fw(5, 300), fw(50, 1_000)])),
            Err(Unleasable::UnalignedWindows)
        );
        assert_eq!(
            LeaseTerms::new(&policy(&[sc(5, 100), fw(50, 1_000)])),
            Err(Unleasable::AmbiguousReset)
        );
        for ok in [
            vec![fw(5, 100)],
            vec![sc(5, 100)],
            vec![fw(5, 100), fw(50, 1_000)],
            vec![fw(5, 100), sc(50, 1_000)],
            vec![sc(5, 100), sc(50, 1_000), fw(70, 1_000)],
        ] {
            assert!(LeaseTerms::new(&policy(&ok)).is_ok(), "{ok:?}");
        }
    }

    /// The span read from the store's own combined decision, at every phase of the largest
    /// window, is the distance to the next boundary of the smallest window.
    #[test]
    fn the_span_of_a_grant_is_the_time_to_the_earliest_window_boundary() {
        for limits in [
            vec![fw(100, 100)],
            vec![sc(100, 100)],
            vec![fw(100, 100), fw(1_000, 1_000)],
            vec![fw(100, 100), sc(1_000, 1_000)],
            vec![sc(100, 100), sc(1_000, 1_000)],
        ] {
            let p = policy(&limits);
            let terms = LeaseTerms::new(&p).unwrap();
            for ms in (0..3_000).step_by(7) {
                let t = 10_000_000 + ms * 1_000;
                let mut state = p.new_state();
                let grant = p.acquire(Timestamp::from_micros(t), &mut state, 3).unwrap();
                let expected = 100_000 - t % 100_000;
                assert_eq!(
                    terms.span(&grant),
                    Some(Micros::from_micros(expected)),
                    "{limits:?} at {t}"
                );
            }
        }
    }

    #[test]
    fn an_answer_that_no_grant_of_the_policy_can_carry_has_no_span() {
        let terms = LeaseTerms::new(&policy(&[sc(100, 100)])).unwrap();
        let fail_open = crate::lease::failure_policys(Outcome::Allowed);
        assert_eq!(terms.span(&fail_open), None);
        let denied = Decision {
            outcome: Outcome::Denied,
            reset_after: Micros::from_millis(150),
            ..fail_open
        };
        assert_eq!(terms.span(&denied), None);
    }
}
