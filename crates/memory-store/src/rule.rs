//! The decision a shard table applies, behind one trait, so that a one-limit policy can
//! store its algorithm's own state.
//!
//! A [`PolicyState`] is 64 bytes whatever it holds, because it must fit any algorithm and
//! any number of limits. A policy of one fixed window needs only the window's 16-byte
//! [`FixedWindowState`], and a token bucket whose emission interval is a whole number of
//! microseconds (50 per second: 20 000 µs) only the 8-byte `tat` of its
//! [`TokenBucketState`]. Storing that instead makes a `u64`-keyed slot 16 to 24 bytes rather
//! than 72, and a random probe into a large table costs a cache miss whatever the slot size,
//! so fewer, denser cache lines are most of the store's speed (docs/performance.md).
//!
//! The answers are the same: a one-limit [`Policy`] calls the limit's own `acquire`,
//! `peek`, `refund` and `is_full` with nothing added but a shape check that a store-made
//! state always passes, and its capacity check in `peek` is the algorithm's own. The
//! property test in `tests/model.rs` compares every shape against `Policy` on a map.

use rein_core::{
    AcquireError, Algorithm, Decision, LimitState, Micros, Outcome, Policy, PolicyState, Timestamp,
    fixed_window::FixedWindow,
    sliding_counter::SlidingCounter,
    sliding_log::SlidingLog,
    token_bucket::{TokenBucket, TokenBucketState},
};

/// rein-core's decision functions for one state type.
pub(crate) trait Rule {
    /// What the table stores per key.
    type State: Clone;

    /// A full state: what every absent key has.
    fn fresh(&self) -> Self::State;

    /// See [`Policy::acquire`].
    fn acquire(
        &self,
        now: Timestamp,
        state: &mut Self::State,
        cost: u64,
    ) -> Result<Decision, AcquireError>;

    /// See [`Policy::try_acquire`].
    fn try_acquire(
        &self,
        now: Timestamp,
        state: &mut Self::State,
        cost: u64,
    ) -> Result<Outcome, AcquireError>;

    /// See [`Policy::peek`].
    fn peek(
        &self,
        now: Timestamp,
        state: &Self::State,
        cost: u64,
    ) -> Result<Decision, AcquireError>;

    /// See [`Policy::refund`].
    fn refund(
        &self,
        now: Timestamp,
        state: &mut Self::State,
        amount: u64,
    ) -> Result<(), AcquireError>;

    /// See [`Policy::is_full`].
    fn is_full(&self, now: Timestamp, state: &Self::State) -> bool;

    /// The state as its policy's, for what [`Policy`] computes on it (an operator's change,
    /// an inspection).
    fn to_policy(&self, state: &Self::State) -> PolicyState;

    /// Back from [`to_policy`](Self::to_policy)'s shape; `None` for another shape (never, for
    /// what `Policy` computes from a state of this rule).
    fn back_from_policy(&self, state: PolicyState) -> Option<Self::State>;

    /// See [`Policy::acquire_held`]: an acquire, but for a sliding log.
    fn acquire_held(
        &self,
        now: Timestamp,
        state: &mut Self::State,
        cost: u64,
        _hold: Micros,
    ) -> Result<Decision, AcquireError> {
        self.acquire(now, state, cost)
    }

    /// See [`Policy::refund_held`]: only into what counted the units at `stamp` (no
    /// default: a plain refund would land a late return in a later window).
    fn refund_held(
        &self,
        now: Timestamp,
        state: &mut Self::State,
        amount: u64,
        stamp: Timestamp,
    ) -> Result<(), AcquireError>;
}

impl Rule for Policy {
    type State = PolicyState;

    fn fresh(&self) -> PolicyState {
        self.new_state()
    }

    #[inline]
    fn acquire(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        Policy::acquire(self, now, state, cost)
    }

    #[inline]
    fn try_acquire(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        cost: u64,
    ) -> Result<Outcome, AcquireError> {
        Policy::try_acquire(self, now, state, cost)
    }

    #[inline]
    fn peek(
        &self,
        now: Timestamp,
        state: &PolicyState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        Policy::peek(self, now, state, cost)
    }

    fn refund(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        amount: u64,
    ) -> Result<(), AcquireError> {
        Policy::refund(self, now, state, amount)
    }

    fn to_policy(&self, state: &PolicyState) -> PolicyState {
        state.clone()
    }

    fn back_from_policy(&self, state: PolicyState) -> Option<PolicyState> {
        Some(state)
    }

    fn is_full(&self, now: Timestamp, state: &PolicyState) -> bool {
        Policy::is_full(self, now, state)
    }

    fn acquire_held(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        cost: u64,
        hold: Micros,
    ) -> Result<Decision, AcquireError> {
        Policy::acquire_held(self, now, state, cost, hold)
    }

    fn refund_held(
        &self,
        now: Timestamp,
        state: &mut PolicyState,
        amount: u64,
        stamp: Timestamp,
    ) -> Result<(), AcquireError> {
        Policy::refund_held(self, now, state, amount, stamp)
    }
}

/// A one-limit policy's state.
fn one_limit(state: LimitState) -> PolicyState {
    // One state is never empty nor too many.
    PolicyState::from_states([state]).unwrap_or_else(|| unreachable!("one limit state"))
}

/// Every algorithm is a rule over its own state (its refund cannot fail), each naming how it
/// gives back units a lease held. A macro rather than a blanket impl, which coherence would
/// not allow next to the impl for `Policy`.
macro_rules! algorithm_rules {
    ($($algorithm:ident => $refund_held:path $({ $($extra:tt)* })?),*) => {$(
        impl Rule for $algorithm {
            type State = <$algorithm as Algorithm>::State;

            fn fresh(&self) -> Self::State {
                Self::State::default()
            }

            #[inline]
            fn acquire(
                &self,
                now: Timestamp,
                state: &mut Self::State,
                cost: u64,
            ) -> Result<Decision, AcquireError> {
                Algorithm::acquire(self, now, state, cost)
            }

            #[inline]
            fn try_acquire(
                &self,
                now: Timestamp,
                state: &mut Self::State,
                cost: u64,
            ) -> Result<Outcome, AcquireError> {
                Algorithm::try_acquire(self, now, state, cost)
            }

            #[inline]
            fn peek(
                &self,
                now: Timestamp,
                state: &Self::State,
                cost: u64,
            ) -> Result<Decision, AcquireError> {
                Algorithm::peek(self, now, state, cost)
            }

            fn refund(
                &self,
                now: Timestamp,
                state: &mut Self::State,
                amount: u64,
            ) -> Result<(), AcquireError> {
                Algorithm::refund(self, now, state, amount);
                Ok(())
            }

            fn refund_held(
                &self,
                now: Timestamp,
                state: &mut Self::State,
                amount: u64,
                stamp: Timestamp,
            ) -> Result<(), AcquireError> {
                $refund_held(self, now, state, amount, stamp);
                Ok(())
            }

            fn is_full(&self, now: Timestamp, state: &Self::State) -> bool {
                Algorithm::is_full(self, now, state)
            }

            fn to_policy(&self, state: &Self::State) -> PolicyState {
                one_limit(LimitState::$algorithm(state.clone()))
            }

            fn back_from_policy(&self, state: PolicyState) -> Option<Self::State> {
                match state.iter().collect::<Vec<_>>().as_slice() {
                    [LimitState::$algorithm(state)] => Some(state.clone()),
                    _ => None,
                }
            }

            $($($extra)*)?
        }
    )*};
}

/// A bucket's return of held units: it has no windows, so a plain refund.
fn bucket_refund_held(
    bucket: &TokenBucket,
    now: Timestamp,
    state: &mut <TokenBucket as Algorithm>::State,
    amount: u64,
    _stamp: Timestamp,
) {
    Algorithm::refund(bucket, now, state, amount);
}

algorithm_rules!(
    TokenBucket => bucket_refund_held,
    FixedWindow => FixedWindow::refund_in_window,
    SlidingCounter => SlidingCounter::refund_in_window,
    SlidingLog => SlidingLog::refund_held {
        fn acquire_held(
            &self,
            now: Timestamp,
            state: &mut Self::State,
            cost: u64,
            hold: Micros,
        ) -> Result<Decision, AcquireError> {
            SlidingLog::acquire_held(self, now, state, cost, hold)
        }
    }
);

/// A token bucket whose emission interval is a whole number of µs
/// ([`TokenBucket::emission_interval`] is `(micros, 1)`), stored as its `tat` alone.
///
/// With one unit per microsecond every remainder in the bucket's arithmetic is taken modulo
/// 1, so `tat_units` is zero in every state it produces; the full state is rebuilt around
/// the stored `tat` for each call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WholeMicroBucket(TokenBucket);

impl WholeMicroBucket {
    /// `Some` when `bucket`'s emission interval is a whole number of µs.
    pub(crate) fn new(bucket: TokenBucket) -> Option<Self> {
        (bucket.emission_interval().1 == 1).then_some(Self(bucket))
    }

    #[inline]
    fn state(tat: Timestamp) -> TokenBucketState {
        TokenBucketState { tat, tat_units: 0 }
    }
}

impl Rule for WholeMicroBucket {
    type State = Timestamp;

    fn fresh(&self) -> Timestamp {
        TokenBucketState::default().tat
    }

    #[inline]
    fn acquire(
        &self,
        now: Timestamp,
        tat: &mut Timestamp,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let mut state = Self::state(*tat);
        let decision = Algorithm::acquire(&self.0, now, &mut state, cost)?;
        debug_assert_eq!(state.tat_units, 0);
        *tat = state.tat;
        Ok(decision)
    }

    #[inline]
    fn try_acquire(
        &self,
        now: Timestamp,
        tat: &mut Timestamp,
        cost: u64,
    ) -> Result<Outcome, AcquireError> {
        let mut state = Self::state(*tat);
        let outcome = Algorithm::try_acquire(&self.0, now, &mut state, cost)?;
        debug_assert_eq!(state.tat_units, 0);
        *tat = state.tat;
        Ok(outcome)
    }

    #[inline]
    fn peek(&self, now: Timestamp, tat: &Timestamp, cost: u64) -> Result<Decision, AcquireError> {
        Algorithm::peek(&self.0, now, &Self::state(*tat), cost)
    }

    fn refund(&self, now: Timestamp, tat: &mut Timestamp, amount: u64) -> Result<(), AcquireError> {
        let mut state = Self::state(*tat);
        Algorithm::refund(&self.0, now, &mut state, amount);
        debug_assert_eq!(state.tat_units, 0);
        *tat = state.tat;
        Ok(())
    }

    /// A bucket has no windows: a plain refund.
    fn refund_held(
        &self,
        now: Timestamp,
        tat: &mut Timestamp,
        amount: u64,
        _stamp: Timestamp,
    ) -> Result<(), AcquireError> {
        self.refund(now, tat, amount)
    }

    fn is_full(&self, now: Timestamp, tat: &Timestamp) -> bool {
        Algorithm::is_full(&self.0, now, &Self::state(*tat))
    }

    fn to_policy(&self, tat: &Timestamp) -> PolicyState {
        one_limit(LimitState::TokenBucket(Self::state(*tat)))
    }

    fn back_from_policy(&self, state: PolicyState) -> Option<Timestamp> {
        match state.iter().collect::<Vec<_>>().as_slice() {
            [LimitState::TokenBucket(s)] if s.tat_units == 0 => Some(s.tat),
            _ => None,
        }
    }
}
