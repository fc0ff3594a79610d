//! One limit of any algorithm, so that stores and policies can hold a mix of them.

use std::num::NonZeroU32;

use crate::{
    AcquireError, Algorithm, ConfigError, Decision, Outcome, Timestamp,
    fixed_window::{FixedWindow, FixedWindowState},
    sliding_counter::{SlidingCounter, SlidingCounterState},
    sliding_log::{SlidingLog, SlidingLogState},
    token_bucket::{TokenBucket, TokenBucketState},
};

/// A limit of one of the four algorithms.
///
/// ```
/// use rein_core::{Limit, Micros, Timestamp};
///
/// let limit = Limit::fixed_window(100, Micros::from_secs(60))?;
/// let mut state = limit.new_state();
/// let decision = limit.acquire(Timestamp::from_micros(0), &mut state, 1)?;
/// assert_eq!((decision.limit, decision.remaining), (100, 99));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// See [`SlidingCounter`].
    SlidingCounter(SlidingCounter),
}

/// The state of a [`Limit`], of the matching algorithm.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LimitState {
    /// See [`TokenBucketState`].
    TokenBucket(TokenBucketState),
    /// See [`FixedWindowState`].
    FixedWindow(FixedWindowState),
    /// See [`SlidingLogState`].
    SlidingLog(SlidingLogState),
    /// See [`SlidingCounterState`].
    SlidingCounter(SlidingCounterState),
}

/// Runs `$body` with `$l` bound to the algorithm, whichever it is: the one place `Limit`
/// lists its variants for a call that has no state.
macro_rules! each {
    ($limit:expr, |$l:ident| $body:expr) => {
        match $limit {
            Limit::TokenBucket($l) => $body,
            Limit::FixedWindow($l) => $body,
            Limit::SlidingLog($l) => $body,
            Limit::SlidingCounter($l) => $body,
        }
    };
}

/// Runs `$body` with `$l` and `$s` bound to the matching algorithm and state, or returns
/// `$mismatch` when they belong to different algorithms.
macro_rules! dispatch {
    ($limit:expr, $state:expr, |$l:ident, $s:ident| $body:expr, $mismatch:expr) => {
        match ($limit, $state) {
            (Limit::TokenBucket($l), LimitState::TokenBucket($s)) => $body,
            (Limit::FixedWindow($l), LimitState::FixedWindow($s)) => $body,
            (Limit::SlidingLog($l), LimitState::SlidingLog($s)) => $body,
            (Limit::SlidingCounter($l), LimitState::SlidingCounter($s)) => $body,
            _ => $mismatch,
        }
    };
}

impl Limit {
    /// A [`TokenBucket`] limit.
    pub fn token_bucket(
        capacity: u64,
        refill: u64,
        period: crate::Micros,
    ) -> Result<Self, crate::ConfigError> {
        TokenBucket::new(capacity, refill, period).map(Self::TokenBucket)
    }

    /// A [`FixedWindow`] limit.
    pub fn fixed_window(limit: u64, window: crate::Micros) -> Result<Self, crate::ConfigError> {
        FixedWindow::new(limit, window).map(Self::FixedWindow)
    }

    /// A [`SlidingLog`] limit.
    pub fn sliding_log(limit: u64, window: crate::Micros) -> Result<Self, crate::ConfigError> {
        SlidingLog::new(limit, window).map(Self::SlidingLog)
    }

    /// A [`SlidingCounter`] limit.
    pub fn sliding_counter(limit: u64, window: crate::Micros) -> Result<Self, crate::ConfigError> {
        SlidingCounter::new(limit, window).map(Self::SlidingCounter)
    }

    /// The capacity: the largest cost a single request may have.
    pub fn capacity(&self) -> u64 {
        each!(self, |l| l.capacity())
    }

    /// The algorithm's short name ([`Algorithm::TAG`]): `tb`, `fw`, `sl` or `sc`.
    pub fn tag(&self) -> &'static str {
        fn tag<A: Algorithm>(_: &A) -> &'static str {
            A::TAG
        }
        each!(self, |l| tag(l))
    }

    /// One node's share of this limit when `nodes` nodes enforce it on their own
    /// ([`Algorithm::share`]).
    pub fn share(&self, nodes: NonZeroU32) -> Result<Limit, ConfigError> {
        Ok(match self {
            Limit::TokenBucket(l) => Limit::TokenBucket(l.share(nodes)?),
            Limit::FixedWindow(l) => Limit::FixedWindow(l.share(nodes)?),
            Limit::SlidingLog(l) => Limit::SlidingLog(l.share(nodes)?),
            Limit::SlidingCounter(l) => Limit::SlidingCounter(l.share(nodes)?),
        })
    }

    /// A full (empty-history) state for this limit.
    pub fn new_state(&self) -> LimitState {
        match self {
            Limit::TokenBucket(_) => LimitState::TokenBucket(TokenBucketState::default()),
            Limit::FixedWindow(_) => LimitState::FixedWindow(FixedWindowState::default()),
            Limit::SlidingLog(_) => LimitState::SlidingLog(SlidingLogState::default()),
            Limit::SlidingCounter(_) => LimitState::SlidingCounter(SlidingCounterState::default()),
        }
    }

    /// Consumes `cost` if the limit admits it; a denial changes nothing.
    pub fn acquire(
        &self,
        now: Timestamp,
        state: &mut LimitState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        dispatch!(
            self,
            state,
            |l, s| l.acquire(now, s, cost),
            Err(AcquireError::StateMismatch)
        )
    }

    /// [`acquire`](Self::acquire)'s outcome and state change, without its figures (see
    /// [`Algorithm::try_acquire`]).
    pub fn try_acquire(
        &self,
        now: Timestamp,
        state: &mut LimitState,
        cost: u64,
    ) -> Result<Outcome, AcquireError> {
        dispatch!(
            self,
            state,
            |l, s| l.try_acquire(now, s, cost),
            Err(AcquireError::StateMismatch)
        )
    }

    /// What [`acquire`](Self::acquire) would answer, without consuming.
    pub fn peek(
        &self,
        now: Timestamp,
        state: &LimitState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        dispatch!(
            self,
            state,
            |l, s| l.peek(now, s, cost),
            Err(AcquireError::StateMismatch)
        )
    }

    /// Gives back up to `amount`, never beyond full.
    pub fn refund(
        &self,
        now: Timestamp,
        state: &mut LimitState,
        amount: u64,
    ) -> Result<(), AcquireError> {
        dispatch!(
            self,
            state,
            |l, s| {
                l.refund(now, s, amount);
                Ok(())
            },
            Err(AcquireError::StateMismatch)
        )
    }

    /// Takes up to `amount` at `now` whatever the limit would admit, never past empty: an
    /// operator's penalty ([`Policy::penalize`](crate::Policy::penalize)). Returns what it
    /// took: `amount`, or what was left if that was less.
    pub fn drain(
        &self,
        now: Timestamp,
        state: &mut LimitState,
        amount: u64,
    ) -> Result<u64, AcquireError> {
        let take = amount.min(self.peek(now, state, 0)?.remaining);
        if take == 0 {
            return Ok(0);
        }
        // What is left is admitted by definition of `remaining`, except at the end of
        // representable time, where nothing can be stored: then nothing is taken.
        let taken = self.acquire(now, state, take)?;
        Ok(if taken.is_allowed() { take } else { 0 })
    }

    /// Takes `cost` for units spent at any instant up to `now + hold` (a lease): a sliding
    /// log records them at `now + hold` ([`SlidingLog::acquire_held`]); the other
    /// algorithms count them at `now`, as [`acquire`](Self::acquire) does, which covers
    /// such units only until their window or bucket moves on (docs/leases.md says which
    /// shapes a lease may take).
    pub fn acquire_held(
        &self,
        now: Timestamp,
        state: &mut LimitState,
        cost: u64,
        hold: crate::Micros,
    ) -> Result<Decision, AcquireError> {
        match (self, state) {
            (Limit::SlidingLog(l), LimitState::SlidingLog(s)) => l.acquire_held(now, s, cost, hold),
            (limit, state) => limit.acquire(now, state, cost),
        }
    }

    /// What [`acquire_held`](Self::acquire_held) would answer, recording nothing.
    pub(crate) fn peek_held(
        &self,
        now: Timestamp,
        state: &LimitState,
        cost: u64,
        hold: crate::Micros,
    ) -> Result<Decision, AcquireError> {
        match (self, state) {
            (Limit::SlidingLog(l), LimitState::SlidingLog(s)) => l.peek_held(now, s, cost, hold),
            (limit, state) => limit.peek(now, state, cost),
        }
    }

    /// Gives back up to `amount` units that [`acquire_held`](Self::acquire_held) recorded at
    /// `stamp`: a sliding log from that stamp only ([`SlidingLog::refund_held`]); a fixed
    /// window or a sliding counter only to the window containing `stamp`, and only while
    /// the state still counts that window ([`FixedWindow::refund_in_window`],
    /// [`SlidingCounter::refund_in_window`]), so a return that arrives late never lands in
    /// a later window; a token bucket as [`refund`](Self::refund) does.
    pub fn refund_held(
        &self,
        now: Timestamp,
        state: &mut LimitState,
        amount: u64,
        stamp: Timestamp,
    ) -> Result<(), AcquireError> {
        match (self, state) {
            (Limit::SlidingLog(l), LimitState::SlidingLog(s)) => {
                l.refund_held(now, s, amount, stamp);
                Ok(())
            }
            (Limit::FixedWindow(l), LimitState::FixedWindow(s)) => {
                l.refund_in_window(now, s, amount, stamp);
                Ok(())
            }
            (Limit::SlidingCounter(l), LimitState::SlidingCounter(s)) => {
                l.refund_in_window(now, s, amount, stamp);
                Ok(())
            }
            (limit, state) => limit.refund(now, state, amount),
        }
    }

    /// `true` when the state holds nothing at `now`, so a store may forget it. A state of
    /// the wrong algorithm is never "full": it is not this limit's to drop.
    pub fn is_full(&self, now: Timestamp, state: &LimitState) -> bool {
        dispatch!(self, state, |l, s| l.is_full(now, s), false)
    }
}
