//! Sliding window log: exact "at most `limit` in any `window`", by remembering every
//! admission still inside the window.
//!
//! A request at `now` is admitted when the cost admitted in `(now − window, now]` plus its
//! own cost is at most `limit`. The log keeps one entry per distinct admission instant
//! (requests at the same microsecond merge), so its memory grows with the traffic: at most
//! `limit` entries of 16 bytes each, plus the container. This is the algorithm to choose
//! when the boundary burst of [`FixedWindow`](crate::FixedWindow) or the approximation of
//! [`SlidingCounter`](crate::SlidingCounter) is not acceptable and the limit is modest.
//!
//! Apart from [`refund`](SlidingLog::refund), the log only changes when it admits
//! something: expired entries are dropped then, not on a denial or a peek, so the newest
//! entry marks the latest admission the log has seen. That mark is what makes a regressed
//! clock harmless: a request is judged at `max(now, newest entry)`. A refund that removes
//! the newest entry removes its mark too (see the crate's contract).

use std::collections::VecDeque;

use std::num::NonZeroU32;

use crate::algorithm::capacity_share;
use crate::{AcquireError, Algorithm, ConfigError, Decision, DecodeError, Micros, Timestamp};

/// A validated sliding-log limit: `limit` cost units in any span of `window`.
///
/// ```
/// use rein_core::{Algorithm, Micros, SlidingLog, SlidingLogState, Timestamp};
///
/// let limit = SlidingLog::new(2, Micros::from_secs(10))?;
/// let mut log = SlidingLogState::default();
/// let at = |s: u64| Timestamp::from_micros(s * 1_000_000);
/// assert!(limit.acquire(at(1), &mut log, 1)?.is_allowed());
/// assert!(limit.acquire(at(5), &mut log, 1)?.is_allowed());
/// // The admission at 1 s leaves the window at 11 s, not at a window boundary.
/// let denied = limit.acquire(at(9), &mut log, 1)?;
/// assert_eq!(denied.retry_after, Micros::from_secs(2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    /// Cost units admitted in any window.
    limit: u64,
    /// Window length in µs.
    window: u64,
}

/// One admission instant and the cost admitted at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogEntry {
    /// When the cost was admitted.
    pub at: Timestamp,
    /// How much was admitted at that microsecond.
    pub cost: u64,
}

/// The persisted state of one sliding log: admissions, oldest first.
///
/// Memory: 16 bytes per distinct admission instant inside the window (at most `limit`),
/// plus 40 bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlidingLogState {
    /// Admissions in increasing `at` order, each `at` distinct.
    entries: VecDeque<LogEntry>,
    /// Sum of `entries[..].cost`, so a decision need not add them up.
    total: u64,
}

impl SlidingLog {
    /// `limit` cost units in any `window`. Errors if either is zero, if `limit` exceeds
    /// [`MAX_MICROS`], or if `window` exceeds [`MAX_SPAN`](crate::MAX_SPAN).
    pub fn new(limit: u64, window: Micros) -> Result<Self, ConfigError> {
        crate::ensure_nonzero("limit", limit)?;
        crate::ensure_nonzero("window", window.as_micros())?;
        crate::ensure_exact("limit", limit)?;
        crate::ensure_span("window", window.as_micros())?;
        Ok(Self {
            limit,
            window: window.as_micros(),
        })
    }

    /// Cost units admitted in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Micros {
        Micros::from_micros(self.window)
    }

    /// The decision, and how many leading entries have expired.
    fn decide(
        &self,
        now: Timestamp,
        state: &SlidingLogState,
        cost: u64,
    ) -> Result<(Decision, usize), AcquireError> {
        if cost > self.limit {
            return Err(AcquireError::InsufficientCapacity {
                cost,
                capacity: self.limit,
            });
        }
        let at = self.judged_at(now, state).as_micros();
        let now = now.as_micros();
        let mut expired = 0;
        let mut live = state.total;
        for entry in &state.entries {
            if entry.at.as_micros() + self.window > at {
                break;
            }
            expired += 1;
            live -= entry.cost;
        }
        let newest_end = |extra: Option<u64>| {
            let newest = extra.or(state.entries.back().map(|e| e.at.as_micros()));
            match newest {
                Some(t) if t + self.window > at => Micros::from_micros(t + self.window - now),
                _ => Micros::ZERO,
            }
        };
        let remaining = self.limit.saturating_sub(live);
        if cost <= remaining {
            let reset = newest_end((cost > 0).then_some(at));
            return Ok((
                Decision::allowed(self.limit, remaining - cost, reset),
                expired,
            ));
        }
        // Walk the live entries oldest first until enough cost has left the window.
        let mut still_in = live;
        let mut retry = Micros::ZERO;
        for entry in state.entries.iter().skip(expired) {
            still_in -= entry.cost;
            if still_in + cost <= self.limit {
                retry = Micros::from_micros(entry.at.as_micros() + self.window - now);
                break;
            }
        }
        Ok((
            Decision::denied(self.limit, remaining, retry, newest_end(None)),
            expired,
        ))
    }

    /// The instant a request at `now` is judged at: never before the newest admission.
    fn judged_at(&self, now: Timestamp, state: &SlidingLogState) -> Timestamp {
        state.entries.back().map_or(now, |last| now.max(last.at))
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    const TAG: &'static str = "sl";

    /// The limit per window.
    fn capacity(&self) -> u64 {
        self.limit()
    }

    /// Records `cost` at `now` if the window has room; otherwise changes nothing.
    fn acquire(
        &self,
        now: Timestamp,
        state: &mut SlidingLogState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let (decision, expired) = self.decide(now, state, cost)?;
        if decision.is_allowed() && cost > 0 {
            let at = self.judged_at(now, state);
            for _ in 0..expired {
                if let Some(old) = state.entries.pop_front() {
                    state.total -= old.cost;
                }
            }
            match state.entries.back_mut() {
                Some(last) if last.at == at => last.cost += cost,
                _ => state.entries.push_back(LogEntry { at, cost }),
            }
            state.total += cost;
        }
        Ok(decision)
    }

    /// What [`acquire`](Self::acquire) would answer, without recording anything.
    fn peek(
        &self,
        now: Timestamp,
        state: &SlidingLogState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        self.decide(now, state, cost).map(|(decision, _)| decision)
    }

    /// Removes up to `amount` of the most recent admissions still in the window.
    fn refund(&self, now: Timestamp, state: &mut SlidingLogState, amount: u64) {
        let horizon = self.judged_at(now, state).as_micros();
        let mut amount = amount;
        while amount > 0 {
            let Some(last) = state.entries.back_mut() else {
                break;
            };
            if last.at.as_micros() + self.window <= horizon {
                break;
            }
            let taken = amount.min(last.cost);
            last.cost -= taken;
            state.total -= taken;
            amount -= taken;
            if last.cost == 0 {
                state.entries.pop_back();
            }
        }
    }

    /// `true` when no admission is inside the window at `now`.
    fn is_full(&self, now: Timestamp, state: &SlidingLogState) -> bool {
        let at = self.judged_at(now, state).as_micros();
        state
            .entries
            .back()
            .is_none_or(|last| last.at.as_micros() + self.window <= at)
    }

    fn share(&self, nodes: NonZeroU32) -> Result<Self, ConfigError> {
        Self::new(capacity_share(self.limit(), nodes), self.window())
    }
}

impl SlidingLogState {
    /// The admissions, oldest first (expired ones are dropped on the next admission).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = &LogEntry> {
        self.entries.iter()
    }

    /// Builds a log from admissions, which must be in strictly increasing `at` order with
    /// non-zero costs (as [`entries`](Self::entries) yields them).
    pub fn from_entries(entries: impl IntoIterator<Item = LogEntry>) -> Result<Self, DecodeError> {
        let mut log = Self::default();
        for entry in entries {
            let ordered = log.entries.back().is_none_or(|last| last.at < entry.at);
            if !ordered || entry.cost == 0 {
                return Err(DecodeError::OutOfRange);
            }
            log.total = log
                .total
                .checked_add(entry.cost)
                .ok_or(DecodeError::OutOfRange)?;
            log.entries.push_back(entry);
        }
        Ok(log)
    }
}
