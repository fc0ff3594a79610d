//! Sliding window log: exact "at most `limit` in any `window`", by remembering every
//! admission still inside the window.
//!
//! A request at `now` is admitted when the cost of the entries stamped in
//! `(now − window, ∞)` plus its own cost is at most `limit`. The log keeps one entry per
//! distinct instant (requests at the same microsecond merge), so its memory grows with the
//! traffic: at most `limit` entries of 16 bytes each, plus the container. This is the
//! algorithm to choose when the boundary burst of [`FixedWindow`](crate::fixed_window::FixedWindow) or the
//! approximation of [`SlidingCounter`](crate::sliding_counter::SlidingCounter) is not acceptable and the
//! limit is modest.
//!
//! # Future stamps (leases)
//! [`acquire_held`](SlidingLog::acquire_held) records units at `now + hold`, the latest
//! instant a lease may spend them, and every decision counts every entry stamped after
//! `now − window`, **future stamps included**; an entry stamped `s` leaves the window at
//! `s + window`, which `retry_after` and `reset_after` account for. Units recorded no
//! earlier than they are used keep the definition for every span (docs/leases.md, "Sliding
//! log"). [`refund_held`](SlidingLog::refund_held) takes unused units back from their stamp.
//!
//! # A clock that goes back
//! Apart from the refunds, the log only changes when it admits something: expired entries
//! are dropped then, not on a denial or a peek. A plain admission is stamped at
//! `max(now, newest entry)`, so stamps never go back with the clock; a decision at a
//! regressed `now` counts from `now − window`, which counts at least what the newest
//! reading would. A refund that removes the newest entry removes its mark too (see the
//! crate's contract).

use std::collections::VecDeque;

use std::num::NonZeroU32;

use crate::algorithm::capacity_share;
use crate::{AcquireError, Algorithm, ConfigError, Decision, Micros, OverCapacity, Timestamp};

/// A validated sliding-log limit: `limit` cost units in any span of `window`.
///
/// ```
/// use rein_core::sliding_log::{SlidingLog, SlidingLogState};
/// use rein_core::{Algorithm, Micros, Timestamp};
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
    /// [`MAX_MICROS`](crate::MAX_MICROS), or if `window` exceeds [`MAX_SPAN`](crate::MAX_SPAN).
    pub fn new(limit: u64, window: Micros) -> Result<Self, ConfigError> {
        let window = crate::limit_per_window(limit, window)?;
        Ok(Self { limit, window })
    }

    /// Cost units admitted in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Micros {
        Micros::from_micros(self.window)
    }

    /// Takes `cost` as [`acquire`](Algorithm::acquire) does, but records it at
    /// `now + hold`: the latest instant a lease granted now may spend it. The check is the
    /// same (entries stamped after `now − window`, future ones included); only the stamp
    /// differs, placed in order among the entries (merged with one at the same instant).
    /// Pass the stamp, `now + hold`, to [`refund_held`](Self::refund_held).
    ///
    /// ```
    /// use rein_core::sliding_log::{SlidingLog, SlidingLogState};
    /// use rein_core::{Micros, Timestamp};
    ///
    /// let limit = SlidingLog::new(2, Micros::from_secs(10))?;
    /// let mut log = SlidingLogState::default();
    /// let at = |s: u64| Timestamp::from_micros(s * 1_000_000);
    /// // A lease of 2 at 0 s, spendable for 1 s: stamped at 1 s, it leaves at 11 s.
    /// let granted = limit.acquire_held(at(0), &mut log, 2, Micros::from_secs(1))?;
    /// assert_eq!(granted.reset_after, Micros::from_secs(11));
    /// assert_eq!(limit.acquire_held(at(10), &mut log, 1, Micros::ZERO)?.retry_after,
    ///            Micros::from_secs(1));
    /// // One unit was not used: it goes back from its stamp.
    /// limit.refund_held(at(2), &mut log, 1, at(1));
    /// assert!(limit.acquire_held(at(2), &mut log, 1, Micros::ZERO)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_held(
        &self,
        now: Timestamp,
        state: &mut SlidingLogState,
        cost: u64,
        hold: Micros,
    ) -> Result<Decision, AcquireError> {
        let stamp = now.saturating_add(hold);
        let (decision, expired) = self.decide(now, state, cost, stamp)?;
        if decision.is_allowed() && cost > 0 {
            state.expire(expired);
            state.insert(stamp, cost);
        }
        Ok(decision)
    }

    /// What [`acquire_held`](Self::acquire_held) would answer, recording nothing.
    pub(crate) fn peek_held(
        &self,
        now: Timestamp,
        state: &SlidingLogState,
        cost: u64,
        hold: Micros,
    ) -> Result<Decision, AcquireError> {
        let stamp = now.saturating_add(hold);
        self.decide(now, state, cost, stamp).map(|(d, _)| d)
    }

    /// Gives back up to `amount` of the units recorded at `stamp` (by
    /// [`acquire_held`](Self::acquire_held)), and nothing else: units of other instants
    /// may have been spent later than theirs. Nothing happens if no entry has that stamp.
    pub fn refund_held(
        &self,
        _now: Timestamp,
        state: &mut SlidingLogState,
        amount: u64,
        stamp: Timestamp,
    ) {
        let Ok(index) = state.entries.binary_search_by_key(&stamp, |e| e.at) else {
            return;
        };
        let entry = &mut state.entries[index];
        let taken = amount.min(entry.cost);
        entry.cost -= taken;
        state.total -= taken;
        if entry.cost == 0 {
            state.entries.remove(index);
        }
    }

    /// The decision for `cost` at `now` if it is recorded at `stamp`, and how many leading
    /// entries have expired.
    fn decide(
        &self,
        now: Timestamp,
        state: &SlidingLogState,
        cost: u64,
        stamp: Timestamp,
    ) -> Result<(Decision, usize), AcquireError> {
        OverCapacity::check(cost, self.limit)?;
        let now = now.as_micros();
        let mut expired = 0;
        let mut live = state.total;
        for entry in &state.entries {
            if entry.at.as_micros() + self.window > now {
                break;
            }
            expired += 1;
            live -= entry.cost;
        }
        // When the newest entry (or this admission's, if later) leaves the window.
        let newest_end = |extra: Option<u64>| {
            let newest = state.entries.back().map(|e| e.at.as_micros());
            let newest = match (newest, extra) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            match newest {
                Some(t) if t + self.window > now => Micros::from_micros(t + self.window - now),
                _ => Micros::ZERO,
            }
        };
        let remaining = self.limit.saturating_sub(live);
        if cost <= remaining {
            let reset = newest_end((cost > 0).then_some(stamp.as_micros()));
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

    /// Where a plain admission at `now` is stamped: never before the newest entry, so a
    /// clock that goes back never stamps an admission earlier than one already made.
    fn stamp_at(&self, now: Timestamp, state: &SlidingLogState) -> Timestamp {
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

    /// Records `cost` at `max(now, newest entry)` if the window has room; otherwise
    /// changes nothing.
    fn acquire(
        &self,
        now: Timestamp,
        state: &mut SlidingLogState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let stamp = self.stamp_at(now, state);
        let (decision, expired) = self.decide(now, state, cost, stamp)?;
        if decision.is_allowed() && cost > 0 {
            state.expire(expired);
            state.insert(stamp, cost);
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
        let stamp = self.stamp_at(now, state);
        self.decide(now, state, cost, stamp)
            .map(|(decision, _)| decision)
    }

    /// Removes up to `amount` of the most recent admissions still in the window.
    fn refund(&self, now: Timestamp, state: &mut SlidingLogState, amount: u64) {
        let now = now.as_micros();
        let mut amount = amount;
        while amount > 0 {
            let Some(last) = state.entries.back_mut() else {
                break;
            };
            if last.at.as_micros() + self.window <= now {
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

    /// `true` when no entry is inside the window at `now` (future stamps are).
    fn is_full(&self, now: Timestamp, state: &SlidingLogState) -> bool {
        state
            .entries
            .back()
            .is_none_or(|last| last.at.as_micros() + self.window <= now.as_micros())
    }

    fn share(&self, nodes: NonZeroU32) -> Result<Self, ConfigError> {
        Self::new(capacity_share(self.limit(), nodes), self.window())
    }
}

impl SlidingLogState {
    /// Drops the `count` oldest entries.
    fn expire(&mut self, count: usize) {
        for _ in 0..count {
            if let Some(old) = self.entries.pop_front() {
                self.total -= old.cost;
            }
        }
    }

    /// Adds `cost` at `at`, in order: merged with an entry at the same instant, appended
    /// when newest (every plain admission), else inserted (a held one before a later
    /// stamp).
    fn insert(&mut self, at: Timestamp, cost: u64) {
        self.total += cost;
        match self.entries.back_mut() {
            Some(last) if last.at == at => last.cost += cost,
            Some(last) if last.at > at => match self.entries.binary_search_by_key(&at, |e| e.at) {
                Ok(i) => self.entries[i].cost += cost,
                Err(i) => self.entries.insert(i, LogEntry { at, cost }),
            },
            _ => self.entries.push_back(LogEntry { at, cost }),
        }
    }

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

/// A log read back from a store that no sequence of decisions could have produced (see
/// [`SlidingLogState::from_entries`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// A field is out of range: log entries out of order, a zero cost, a total that
    /// overflows.
    #[error("state field out of range")]
    OutOfRange,
}
