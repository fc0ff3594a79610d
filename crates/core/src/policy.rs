//! Several limits decided as one: "10 per second and 1000 per hour".
//!
//! A policy admits a request only if every limit admits it, and then consumes from all of
//! them; if any denies, none consumes. Its decision reports the most restrictive figures,
//! so `retry_after` is the longest wait among the denying limits. That maximum is exact
//! because every algorithm here is monotone: once a limit would admit a request, it keeps
//! admitting it as time passes with nothing else admitted.

use crate::{
    AcquireError, ConfigError, Decision, Limit, LimitState, Micros, Outcome, OverCapacity,
    Timestamp,
};

/// The most limits one policy may hold. Each is checked on every request, and the Redis
/// store passes all of them in one script call.
pub const MAX_LIMITS: usize = 8;

/// One or more limits applied all-or-nothing.
///
/// ```
/// use rein_core::{Limit, Micros, Policy, Timestamp};
///
/// let policy = Policy::new([
///     Limit::token_bucket(10, 10, Micros::from_secs(1))?,   // 10/s, bursts of 10
///     Limit::fixed_window(15, Micros::from_secs(3600))?,    // 15/h
/// ])?;
/// let mut state = policy.new_state();
/// let now = Timestamp::from_micros(0);
/// assert!(policy.acquire(now, &mut state, 10)?.is_allowed());
/// // The hourly window has 5 left, the bucket none: the bucket speaks.
/// let denied = policy.acquire(now, &mut state, 1)?;
/// assert_eq!(denied.retry_after, Micros::from_millis(100));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    limits: Vec<Limit>,
}

/// The state of a [`Policy`]: one [`LimitState`] per limit, in the policy's order.
///
/// A single-limit policy's state lives inline, with no heap allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PolicyState {
    first: LimitState,
    rest: Vec<LimitState>,
}

impl Policy {
    /// A policy of the given limits, in order. Errors if there are none or more than
    /// [`MAX_LIMITS`].
    pub fn new(limits: impl IntoIterator<Item = Limit>) -> Result<Self, ConfigError> {
        let limits: Vec<Limit> = limits.into_iter().collect();
        match limits.len() {
            0 => Err(ConfigError::NoLimits),
            n if n > MAX_LIMITS => Err(ConfigError::TooManyLimits {
                got: n,
                max: MAX_LIMITS,
            }),
            _ => Ok(Self { limits }),
        }
    }

    /// A policy of one limit.
    pub fn single(limit: Limit) -> Self {
        Self {
            limits: vec![limit],
        }
    }

    /// The limits, in order.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// A policy of `f` applied to each limit, in order: a share of each, a wider bound of
    /// each. The first error `f` returns is the result.
    pub fn try_map(
        &self,
        f: impl FnMut(&Limit) -> Result<Limit, ConfigError>,
    ) -> Result<Self, ConfigError> {
        let limits = self.limits.iter().map(f).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { limits })
    }

    /// The largest cost a single request may have: the smallest capacity.
    pub fn capacity(&self) -> u64 {
        self.limits.iter().map(Limit::capacity).min().unwrap_or(0)
    }

    /// A full state for this policy.
    pub fn new_state(&self) -> PolicyState {
        let mut limits = self.limits.iter().map(Limit::new_state);
        // `new` and `single` guarantee at least one limit; the fallback is never used.
        let first = limits
            .next()
            .unwrap_or(LimitState::TokenBucket(Default::default()));
        PolicyState {
            first,
            rest: limits.collect(),
        }
    }

    /// Consumes `cost` from every limit if all admit it; otherwise consumes nothing.
    pub fn acquire(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        self.check_shape(state)?;
        if let [limit] = self.limits.as_slice() {
            return limit.acquire(now, &mut state.first, cost);
        }
        let preview = self.peek(now, state, cost)?;
        if !preview.is_allowed() || cost == 0 {
            return Ok(preview);
        }
        let mut combined = None;
        for (index, (limit, limit_state)) in self.limits.iter().zip(state.iter_mut()).enumerate() {
            let decision = limit.acquire(now, limit_state, cost)?;
            combined = Some(combine(combined, index, decision));
        }
        Ok(combined.map_or(preview, |c| c.decision))
    }

    /// [`acquire`](Self::acquire)'s outcome and state change, without its figures: for a
    /// single limit, that limit's [`try_acquire`](crate::Algorithm::try_acquire); for
    /// several, the outcome of `acquire`.
    pub fn try_acquire(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        cost: u64,
    ) -> Result<Outcome, AcquireError> {
        self.check_shape(state)?;
        if let [limit] = self.limits.as_slice() {
            return limit.try_acquire(now, &mut state.first, cost);
        }
        self.acquire(now, state, cost).map(|d| d.outcome)
    }

    /// What [`acquire`](Self::acquire) would answer, without consuming.
    pub fn peek(
        &self,
        now: Timestamp,
        state: &PolicyState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        self.preview(now, state, cost, None)
    }

    /// [`peek`](Self::peek), or with `hold` what [`acquire_held`](Self::acquire_held)
    /// would answer (a sliding log's figures count the held stamp).
    fn preview(
        &self,
        now: Timestamp,
        state: &PolicyState,
        cost: u64,
        hold: Option<Micros>,
    ) -> Result<Decision, AcquireError> {
        self.check_shape(state)?;
        let capacity = self.capacity();
        OverCapacity::check(cost, capacity)?;
        let mut combined = None;
        for (index, (limit, limit_state)) in self.limits.iter().zip(state.iter()).enumerate() {
            let decision = match hold {
                Some(hold) => limit.peek_held(now, limit_state, cost, hold)?,
                None => limit.peek(now, limit_state, cost)?,
            };
            combined = Some(combine(combined, index, decision));
        }
        combined
            .map(|c| c.decision)
            .ok_or(AcquireError::StateMismatch)
    }

    /// Gives back up to `amount` to every limit, never beyond full.
    pub fn refund(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        amount: u64,
    ) -> Result<(), AcquireError> {
        self.check_shape(state)?;
        for (limit, limit_state) in self.limits.iter().zip(state.iter_mut()) {
            limit.refund(now, limit_state, amount)?;
        }
        Ok(())
    }

    /// [`acquire`](Self::acquire) for a lease: takes `cost` from every limit if all admit
    /// it, recording it in each sliding log at `now + hold` (see [`Limit::acquire_held`]).
    /// The admission check is the same as `acquire`'s; the stamp to give back unused units
    /// from ([`refund_held`](Self::refund_held)) is `now + hold`.
    pub fn acquire_held(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        cost: u64,
        hold: Micros,
    ) -> Result<Decision, AcquireError> {
        self.check_shape(state)?;
        if let [limit] = self.limits.as_slice() {
            return limit.acquire_held(now, &mut state.first, cost, hold);
        }
        let preview = self.preview(now, state, cost, Some(hold))?;
        if !preview.is_allowed() || cost == 0 {
            return Ok(preview);
        }
        let mut combined = None;
        for (index, (limit, limit_state)) in self.limits.iter().zip(state.iter_mut()).enumerate() {
            let decision = limit.acquire_held(now, limit_state, cost, hold)?;
            combined = Some(combine(combined, index, decision));
        }
        Ok(combined.map_or(preview, |c| c.decision))
    }

    /// Gives back up to `amount` units that [`acquire_held`](Self::acquire_held) recorded
    /// at `stamp` to every limit (see [`Limit::refund_held`]).
    pub fn refund_held(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        amount: u64,
        stamp: Timestamp,
    ) -> Result<(), AcquireError> {
        self.check_shape(state)?;
        for (limit, limit_state) in self.limits.iter().zip(state.iter_mut()) {
            limit.refund_held(now, limit_state, amount, stamp)?;
        }
        Ok(())
    }

    /// An operator's penalty: takes up to `amount` from every limit at `now`, whatever
    /// they would admit, each never past empty (a bad login costs 5, with 3 left: none
    /// left). Unlike [`acquire`](Self::acquire), it is never denied and never an error for
    /// an amount above the capacity. Returns the figures of a zero-cost peek after it.
    /// [`Block`](crate::Block) is the tool to deny for longer than the limits would.
    pub fn penalize(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        amount: u64,
    ) -> Result<Decision, AcquireError> {
        self.check_shape(state)?;
        for (limit, limit_state) in self.limits.iter().zip(state.iter_mut()) {
            limit.drain(now, limit_state, amount)?;
        }
        self.peek(now, state, 0)
    }

    /// An operator's "this key has `remaining` left": the state of a key reset at `now`
    /// and then charged, in every limit, its capacity less `remaining` (all of it when
    /// `remaining` is 0; nothing in a limit whose capacity is at most `remaining`). What
    /// was counted before is forgotten, as by a reset. Returns the figures of a zero-cost
    /// peek of the new state.
    pub fn with_remaining(
        &self,
        now: Timestamp,
        remaining: u64,
    ) -> Result<(PolicyState, Decision), AcquireError> {
        let mut state = self.new_state();
        for (limit, limit_state) in self.limits.iter().zip(state.iter_mut()) {
            limit.drain(now, limit_state, limit.capacity().saturating_sub(remaining))?;
        }
        let decision = self.peek(now, &state, 0)?;
        Ok((state, decision))
    }

    /// `true` when every limit is full at `now`, so a store may forget the state.
    pub fn is_full(&self, now: Timestamp, state: &PolicyState) -> bool {
        state.len() == self.limits.len()
            && self
                .limits
                .iter()
                .zip(state.iter())
                .all(|(l, s)| l.is_full(now, s))
    }

    fn check_shape(&self, state: &PolicyState) -> Result<(), AcquireError> {
        if state.len() != self.limits.len() {
            return Err(AcquireError::StateMismatch);
        }
        Ok(())
    }
}

impl PolicyState {
    /// A policy state from limit states, in the policy's order. `None` if empty or longer
    /// than [`MAX_LIMITS`].
    pub fn from_states(states: impl IntoIterator<Item = LimitState>) -> Option<Self> {
        let mut states = states.into_iter();
        let first = states.next()?;
        let rest: Vec<_> = states.collect();
        (rest.len() < MAX_LIMITS).then_some(Self { first, rest })
    }

    /// The limit states, in the policy's order.
    pub fn iter(&self) -> impl Iterator<Item = &LimitState> {
        std::iter::once(&self.first).chain(&self.rest)
    }

    /// The limit states, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut LimitState> {
        std::iter::once(&mut self.first).chain(&mut self.rest)
    }

    /// How many limit states there are.
    pub fn len(&self) -> usize {
        1 + self.rest.len()
    }

    /// Always `false`: a policy state holds at least one limit state.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// The policy's decision so far, and whether the limit it names (`limit_index`) denied.
#[derive(Clone, Copy)]
struct Combined {
    decision: Decision,
    deciding_denied: bool,
}

/// Folds one more limit's decision into the policy's: denied if any denies, the longest
/// wait, the longest reset, and the figures (`limit`, `remaining`, `limit_index`) of a
/// denying limit if any denies, else of any limit: the one with the fewest remaining, the
/// first on a tie. So a denial always names a limit that denied it. (An admitting limit's
/// `remaining` counts the request as taken, which a denied policy does not take: compared
/// with a denier's, it could name a limit that admitted, with a `remaining` it does not
/// have.)
fn combine(acc: Option<Combined>, index: usize, mut next: Decision) -> Combined {
    // A policy holds at most MAX_LIMITS (8) limits.
    next.limit_index = index as u8;
    let next_denied = !next.is_allowed();
    let Some(Combined {
        decision: acc,
        deciding_denied,
    }) = acc
    else {
        return Combined {
            decision: next,
            deciding_denied: next_denied,
        };
    };
    let outcome = if acc.is_allowed() && next.is_allowed() {
        Outcome::Allowed
    } else {
        Outcome::Denied
    };
    // `false < true`: a denying limit sorts before every admitting one.
    let named = if (!next_denied, next.remaining) < (!deciding_denied, acc.remaining) {
        (next, next_denied)
    } else {
        (acc, deciding_denied)
    };
    Combined {
        decision: Decision {
            outcome,
            limit: named.0.limit,
            remaining: named.0.remaining,
            retry_after: acc.retry_after.max(next.retry_after),
            reset_after: acc.reset_after.max(next.reset_after),
            limit_index: named.0.limit_index,
        },
        deciding_denied: named.1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Micros;

    #[test]
    fn the_limit_with_the_fewest_remaining_is_named_by_its_index() {
        let policy = Policy::new([
            Limit::fixed_window(10, Micros::from_secs(60)).unwrap(),
            Limit::fixed_window(3, Micros::from_secs(60)).unwrap(),
            Limit::fixed_window(3, Micros::from_secs(1)).unwrap(),
        ])
        .unwrap();
        let mut state = policy.new_state();
        let now = Timestamp::from_micros(0);
        // 9, 2, 2 left: the second limit, the first of the two tied.
        let d = policy.acquire(now, &mut state, 1).unwrap();
        assert_eq!((d.limit, d.remaining, d.limit_index), (3, 2, 1));
        let d = policy.acquire(now, &mut state, 2).unwrap();
        assert_eq!((d.limit, d.remaining, d.limit_index), (3, 0, 1));
        let denied = policy.peek(now, &state, 1).unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.limit_index, 1);
        // One second on, the third limit is full again; the second still denies.
        let later = Timestamp::from_micros(1_000_000);
        let d = policy.peek(later, &state, 0).unwrap();
        assert_eq!((d.remaining, d.limit_index), (0, 1));
        // A tie between an admitting and a denying limit names the denying one: 1 left in
        // the first (0 after this request), none in the second.
        let tied = Policy::new([
            Limit::fixed_window(3, Micros::from_secs(60)).unwrap(),
            Limit::fixed_window(2, Micros::from_secs(3_600)).unwrap(),
        ])
        .unwrap();
        let mut state = tied.new_state();
        tied.acquire(now, &mut state, 2).unwrap();
        let denied = tied.peek(now, &state, 1).unwrap();
        assert_eq!((denied.remaining, denied.limit_index), (0, 1));
        assert!(!denied.is_allowed());
        let single = Policy::single(Limit::fixed_window(3, Micros::from_secs(1)).unwrap());
        let mut one = single.new_state();
        assert_eq!(single.acquire(now, &mut one, 1).unwrap().limit_index, 0);
    }

    /// A denial names the limit that denied, with what it has left, though an admitting
    /// limit would have fewer once charged: after 7, 10 a minute denies a cost of 5 (3
    /// left) and 12 a day would admit it (0 left, had it been taken, which it is not).
    #[test]
    fn a_denial_names_a_limit_that_denied() {
        let minute = Limit::fixed_window(10, Micros::from_secs(60)).unwrap();
        let day = Limit::fixed_window(12, Micros::from_secs(86_400)).unwrap();
        let policy = Policy::new([minute, day]).unwrap();
        let (now, mut state) = (Timestamp::from_micros(0), policy.new_state());
        assert!(policy.acquire(now, &mut state, 7).unwrap().is_allowed());
        let denied = policy.acquire(now, &mut state, 5).unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(
            (denied.limit, denied.remaining, denied.limit_index),
            (10, 3, 0)
        );
    }

    #[test]
    fn try_map_maps_each_limit_in_order_or_answers_the_first_error() {
        let minute = Micros::from_secs(60);
        let policy = Policy::new([
            Limit::fixed_window(10, minute).unwrap(),
            Limit::sliding_log(4, minute).unwrap(),
        ])
        .unwrap();
        let halved = policy
            .try_map(|limit| match limit {
                Limit::FixedWindow(w) => Limit::fixed_window(w.limit() / 2, w.window()),
                Limit::SlidingLog(w) => Limit::sliding_log(w.limit() / 2, w.window()),
                _ => unreachable!("only windows and logs here"),
            })
            .unwrap();
        assert_eq!(
            halved.limits(),
            [
                Limit::fixed_window(5, minute).unwrap(),
                Limit::sliding_log(2, minute).unwrap(),
            ]
        );
        let mut seen = 0;
        let failed = policy.try_map(|limit| {
            seen += 1;
            Limit::fixed_window(limit.capacity(), Micros::ZERO)
        });
        assert!(failed.is_err(), "a zero window is refused");
        assert_eq!(seen, 1, "mapping stops at the first error");
    }
}
