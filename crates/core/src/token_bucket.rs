//! Token bucket, decided with GCRA (the generic cell rate algorithm).
//!
//! A bucket holds up to `capacity` tokens and gains `refill` tokens every `period`. GCRA
//! keeps one number instead of a token count and a refill time: the **theoretical arrival
//! time** `tat`, the instant at which the bucket would be full again if nothing else were
//! taken. Each token pushes `tat` forward by the `emission_interval` (`period / refill`),
//! and a request is admitted while `tat` stays within `tolerance` (`capacity ×
//! emission_interval`) of `now`. Refill is implicit: time passing is what moves `now`
//! towards `tat`, so there is no clock to tick and a denial writes nothing.
//!
//! The emission interval is rarely a whole number of microseconds (3 per second is
//! 333 333.3 µs), so `tat` is kept exactly as microseconds plus a remainder counted in
//! *units* of `1 / units_per_micro` µs, where the interval is `units_per_token` units. Both
//! come from reducing `period / refill` by their gcd. All arithmetic is in integers
//! below 2^53, so the Lua rendering in rein-redis computes the very same numbers.

use std::num::NonZeroU32;

use crate::algorithm::{capacity_share, commit};
use crate::divisor::Divisor;
use crate::{
    AcquireError, Algorithm, ConfigError, Decision, MAX_MICROS, Micros, Outcome, OverCapacity,
    Timestamp,
};

/// A validated token-bucket limit: `capacity` tokens, `refill` more every `period`.
///
/// ```
/// use rein_core::token_bucket::{TokenBucket, TokenBucketState};
/// use rein_core::{Algorithm, Micros, Timestamp};
///
/// // 10 tokens, refilled at 1 per second.
/// let bucket = TokenBucket::new(10, 1, Micros::from_secs(1))?;
/// let mut state = TokenBucketState::default();
/// let now = Timestamp::from_micros(1_000_000);
/// for _ in 0..10 {
///     assert!(bucket.acquire(now, &mut state, 1)?.is_allowed());
/// }
/// let denied = bucket.acquire(now, &mut state, 1)?;
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after, Micros::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    /// Tokens when full: the largest burst and the largest single cost.
    capacity: u64,
    /// The emission interval in units: how far one token moves `tat`.
    units_per_token: Divisor,
    /// How many units make one microsecond (the interval's reduced denominator).
    units_per_micro: Divisor,
    /// `capacity × units_per_token`: how far ahead of `now` `tat` may run, in units.
    tolerance: u64,
    /// `tolerance` split into whole µs and a remainder in units, as `tat` is stored.
    tolerance_split: (u64, u64),
}

/// The persisted state of one token bucket: its theoretical arrival time.
///
/// The default value (`tat` at the epoch) is a full bucket, as is any `tat` not after
/// `now`. Memory: 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Whole microseconds of the theoretical arrival time.
    pub tat: Timestamp,
    /// The fraction of a microsecond beyond `tat`, in units (`< units_per_micro`).
    pub tat_units: u64,
}

impl TokenBucketState {
    /// `true` when `tat` is behind `now` (not ahead by a unit): the bucket, whatever its
    /// size, holds all its tokens. [`TokenBucket`]'s `is_full`.
    pub fn is_full_at(&self, now: Timestamp) -> bool {
        self.tat < now || (self.tat == now && self.tat_units == 0)
    }
}

impl TokenBucket {
    /// A bucket of `capacity` tokens gaining `refill` tokens every `period`.
    ///
    /// Errors if any of them is zero, if `capacity × period / gcd(refill, period)` (the
    /// tolerance in units) or `refill` exceeds [`MAX_MICROS`], or if the span from empty to
    /// full, `capacity × period / refill` µs rounded up, exceeds
    /// [`MAX_SPAN`](crate::MAX_SPAN) ([`ConfigError::SpanTooLong`]).
    pub fn new(capacity: u64, refill: u64, period: Micros) -> Result<Self, ConfigError> {
        let period = period.as_micros();
        crate::ensure_nonzero("capacity", capacity)?;
        crate::ensure_nonzero("refill", refill)?;
        crate::ensure_nonzero("period", period)?;
        crate::ensure_exact("capacity", capacity)?;
        crate::ensure_exact("refill", refill)?;
        let g = gcd(refill, period);
        let units_per_token = period / g;
        let units_per_micro = refill / g;
        let tolerance =
            crate::exact_product("capacity × emission interval", capacity, units_per_token)?;
        let units_per_micro = Divisor::new(units_per_micro);
        let tolerance_split = units_per_micro.div_rem(tolerance);
        // `tat` runs up to this far ahead of `now`, and is stored as an instant.
        let span = tolerance_split.0 + u64::from(tolerance_split.1 > 0);
        crate::ensure_span("capacity × period / refill", span)?;
        Ok(Self {
            capacity,
            units_per_token: Divisor::new(units_per_token),
            units_per_micro,
            tolerance,
            tolerance_split,
        })
    }

    /// The emission interval as the exact fraction `(micros, per)`: one token every
    /// `micros / per` microseconds.
    pub fn emission_interval(&self) -> (u64, u64) {
        (self.units_per_token.get(), self.units_per_micro.get())
    }

    /// The transition alone: where `tat` stands now and where an admission would put it,
    /// and whether the request is admitted. Both [`acquire`](Algorithm::acquire) (which
    /// derives the figures from it) and [`try_acquire`](Algorithm::try_acquire) (which does
    /// not) take their answer from here, so they cannot disagree.
    #[inline(always)]
    fn step(
        &self,
        now: Timestamp,
        state: &TokenBucketState,
        cost: u64,
    ) -> Result<Step, AcquireError> {
        OverCapacity::check(cost, self.capacity)?;
        let now_us = now.as_micros();
        // max(tat, now), as whole µs ahead of now plus a remainder in units.
        let (ahead_us, ahead_units) = if self.is_full(now, state) {
            (0, 0)
        } else {
            // Clamped: decoded state is input too, and must not overflow what follows.
            (
                state.tat.as_micros() - now_us,
                state.tat_units.min(self.units_per_micro.get() - 1),
            )
        };
        let sum = ahead_units + cost * self.units_per_token.get();
        let (whole_us, next_units) = self.units_per_micro.div_rem(sum);
        let next_us = ahead_us + whole_us;
        // The tolerance, split the same way, so the comparison needs no multiplication.
        let verdict = if (next_us, next_units) > self.tolerance_split {
            Verdict::Deny
        } else if cost == 0 {
            Verdict::AdmitFree
        } else if next_us > MAX_MICROS - now_us {
            // The end of time: `tat` would be past the last representable instant, and
            // `Timestamp` would clamp it, forgetting tokens taken (issue 9). Refused
            // for good: while `tat > now` waiting leaves `now + next_us` unchanged, and
            // after that it only grows. Only reachable after the year 2103 (MAX_SPAN).
            Verdict::DenyForever
        } else {
            Verdict::Admit
        };
        Ok(Step {
            now_us,
            ahead_us,
            ahead_units,
            next_us,
            next_units,
            verdict,
        })
    }

    /// The decision and, when it consumes anything, the state to store.
    #[inline(always)]
    fn decide(
        &self,
        now: Timestamp,
        state: &TokenBucketState,
        cost: u64,
    ) -> Result<(Decision, Option<TokenBucketState>), AcquireError> {
        let step = self.step(now, state, cost)?;
        let (ahead_us, ahead_units) = (step.ahead_us, step.ahead_units);
        let before = || {
            (
                self.remaining(ahead_us, ahead_units),
                reset_after(ahead_us, ahead_units),
            )
        };
        Ok(match step.verdict {
            Verdict::Admit => {
                let (next_us, next_units) = (step.next_us, step.next_units);
                let decision = Decision::allowed(
                    self.capacity,
                    self.remaining(next_us, next_units),
                    reset_after(next_us, next_units),
                );
                (decision, Some(step.next_state()))
            }
            Verdict::AdmitFree => {
                let (remaining, reset) = before();
                (Decision::allowed(self.capacity, remaining, reset), None)
            }
            Verdict::DenyForever => {
                let (remaining, reset) = before();
                let decision = Decision::denied(self.capacity, remaining, Micros::MAX, reset);
                (decision, None)
            }
            Verdict::Deny => {
                // Admitted once `tat` is within tolerance: `next_us - tol_us` µs from now,
                // one more if the remainder still exceeds the tolerance's.
                let (tol_us, tol_units) = self.tolerance_split;
                let retry_after = step.next_us - tol_us + u64::from(step.next_units > tol_units);
                let (remaining, reset) = before();
                let decision = Decision::denied(
                    self.capacity,
                    remaining,
                    Micros::from_micros(retry_after),
                    reset,
                );
                (decision, None)
            }
        })
    }

    /// Whole tokens available when `tat` is `ahead_us` µs and `ahead_units` units past now.
    fn remaining(&self, ahead_us: u64, ahead_units: u64) -> u64 {
        // Checked before multiplying: after a clock regression `ahead_us` is unbounded.
        if ahead_us > self.tolerance_split.0 {
            return 0;
        }
        let used = ahead_us * self.units_per_micro.get() + ahead_units;
        self.units_per_token
            .div(self.tolerance.saturating_sub(used))
    }
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;

    const TAG: &'static str = "tb";

    /// The number of tokens when full.
    fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Takes `cost` tokens if they are all there; otherwise changes nothing.
    ///
    /// At the end of time, when the `tat` an admission would store is past
    /// [`MAX_MICROS`], the request is denied with `retry_after` [`Micros::MAX`] (it can
    /// never be admitted): clamping that `tat` would refill the bucket early.
    #[inline]
    fn acquire(
        &self,
        now: Timestamp,
        state: &mut TokenBucketState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        commit(state, self.decide(now, state, cost))
    }

    /// [`acquire`](Self::acquire)'s outcome and state change, without its figures: no
    /// division beyond the one that advances `tat`.
    #[inline]
    fn try_acquire(
        &self,
        now: Timestamp,
        state: &mut TokenBucketState,
        cost: u64,
    ) -> Result<Outcome, AcquireError> {
        let step = self.step(now, state, cost)?;
        Ok(match step.verdict {
            Verdict::Admit => {
                *state = step.next_state();
                Outcome::Allowed
            }
            Verdict::AdmitFree => Outcome::Allowed,
            Verdict::Deny | Verdict::DenyForever => Outcome::Denied,
        })
    }

    /// What [`acquire`](Self::acquire) would answer, without taking anything.
    fn peek(
        &self,
        now: Timestamp,
        state: &TokenBucketState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        self.decide(now, state, cost).map(|(decision, _)| decision)
    }

    /// Gives back up to `amount` tokens, never beyond a full bucket.
    fn refund(&self, now: Timestamp, state: &mut TokenBucketState, amount: u64) {
        if self.is_full(now, state) {
            return;
        }
        let units = amount.min(self.capacity) * self.units_per_token.get();
        let (mut us, mut rem) = (state.tat.as_micros(), state.tat_units);
        let (back_us, back_rem) = self.units_per_micro.div_rem(units);
        if rem < back_rem {
            rem += self.units_per_micro.get();
            us = us.saturating_sub(1);
        }
        rem -= back_rem;
        us = us.saturating_sub(back_us);
        *state = if us < now.as_micros() || (us == now.as_micros() && rem == 0) {
            TokenBucketState::default()
        } else {
            TokenBucketState {
                tat: Timestamp::from_micros(us),
                tat_units: rem,
            }
        };
    }

    /// `true` when the bucket holds all its tokens at `now`, so the state carries no
    /// information and a store may forget it.
    fn is_full(&self, now: Timestamp, state: &TokenBucketState) -> bool {
        state.is_full_at(now)
    }

    /// One token every `units_per_token / units_per_micro` µs; `nodes` times slower is
    /// `units_per_micro` tokens every `units_per_token × nodes` µs, exactly.
    fn share(&self, nodes: NonZeroU32) -> Result<Self, ConfigError> {
        let (units_per_token, units_per_micro) = self.emission_interval();
        let n = u64::from(nodes.get());
        let period = units_per_token
            .checked_mul(n)
            .filter(|p| *p <= MAX_MICROS)
            .ok_or(ConfigError::TooLarge {
                what: "period × expected nodes",
                value: units_per_token.saturating_mul(n),
                max: MAX_MICROS,
            })?;
        Self::new(
            capacity_share(self.capacity, nodes),
            units_per_micro,
            Micros::from_micros(period),
        )
    }
}

/// One decision's arithmetic, before any figure is derived from it.
struct Step {
    now_us: u64,
    /// `max(tat, now) - now`: whole µs, and the remainder in units.
    ahead_us: u64,
    ahead_units: u64,
    /// Where `tat` would stand, relative to now, after taking the cost.
    next_us: u64,
    next_units: u64,
    verdict: Verdict,
}

impl Step {
    /// The state an admission stores.
    #[inline(always)]
    fn next_state(&self) -> TokenBucketState {
        TokenBucketState {
            tat: Timestamp::from_micros(self.now_us + self.next_us),
            tat_units: self.next_units,
        }
    }
}

enum Verdict {
    /// Admitted: store the next state.
    Admit,
    /// Admitted at no cost: nothing to store.
    AdmitFree,
    /// Denied until `tat` is back within tolerance.
    Deny,
    /// Denied for good: the next `tat` is past the end of time.
    DenyForever,
}

/// Time until `tat` (given relative to now) is reached, rounded up to a whole µs.
fn reset_after(ahead_us: u64, ahead_units: u64) -> Micros {
    Micros::from_micros(ahead_us + u64::from(ahead_units > 0))
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
