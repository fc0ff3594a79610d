//! One limit of any algorithm, so that stores and policies can hold a mix of them.

use crate::{
    AcquireError, Decision, DecodeError, FixedWindow, FixedWindowState, SlidingCounter,
    SlidingCounterState, SlidingLog, SlidingLogState, Timestamp, TokenBucket, TokenBucketState,
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
        match self {
            Limit::TokenBucket(l) => l.capacity(),
            Limit::FixedWindow(l) => l.limit(),
            Limit::SlidingLog(l) => l.limit(),
            Limit::SlidingCounter(l) => l.limit(),
        }
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

    /// `true` when the state holds nothing at `now`, so a store may forget it. A state of
    /// the wrong algorithm is never "full": it is not this limit's to drop.
    pub fn is_full(&self, now: Timestamp, state: &LimitState) -> bool {
        dispatch!(self, state, |l, s| l.is_full(now, s), false)
    }
}

impl LimitState {
    /// Appends the encoding: a tag byte (1 token bucket, 2 fixed window, 3 sliding log,
    /// 4 sliding counter) and the state's own bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            LimitState::TokenBucket(s) => {
                out.push(TAG_TOKEN_BUCKET);
                out.extend_from_slice(&s.to_bytes());
            }
            LimitState::FixedWindow(s) => {
                out.push(TAG_FIXED_WINDOW);
                out.extend_from_slice(&s.to_bytes());
            }
            LimitState::SlidingLog(s) => {
                out.push(TAG_SLIDING_LOG);
                out.extend_from_slice(&s.to_bytes());
            }
            LimitState::SlidingCounter(s) => {
                out.push(TAG_SLIDING_COUNTER);
                out.extend_from_slice(&s.to_bytes());
            }
        }
    }

    /// Decodes one state from the front of `bytes`; returns it and the bytes it used.
    pub fn decode(bytes: &[u8]) -> Result<(Self, usize), DecodeError> {
        let (&tag, rest) = bytes.split_first().ok_or(DecodeError::WrongLength)?;
        let fixed = |n: usize| rest.get(..n).ok_or(DecodeError::WrongLength);
        let (state, used) = match tag {
            TAG_TOKEN_BUCKET => (
                LimitState::TokenBucket(TokenBucketState::from_bytes(fixed(16)?)?),
                16,
            ),
            TAG_FIXED_WINDOW => (
                LimitState::FixedWindow(FixedWindowState::from_bytes(fixed(16)?)?),
                16,
            ),
            TAG_SLIDING_COUNTER => (
                LimitState::SlidingCounter(SlidingCounterState::from_bytes(fixed(24)?)?),
                24,
            ),
            TAG_SLIDING_LOG => {
                let count =
                    u64::from_le_bytes(*rest.first_chunk::<8>().ok_or(DecodeError::WrongLength)?);
                let len = usize::try_from(count)
                    .ok()
                    .and_then(|c| c.checked_mul(16))
                    .and_then(|n| n.checked_add(8))
                    .ok_or(DecodeError::WrongLength)?;
                (
                    LimitState::SlidingLog(SlidingLogState::from_bytes(fixed(len)?)?),
                    len,
                )
            }
            other => return Err(DecodeError::UnknownTag(other)),
        };
        Ok((state, used + 1))
    }
}

const TAG_TOKEN_BUCKET: u8 = 1;
const TAG_FIXED_WINDOW: u8 = 2;
const TAG_SLIDING_LOG: u8 = 3;
const TAG_SLIDING_COUNTER: u8 = 4;
