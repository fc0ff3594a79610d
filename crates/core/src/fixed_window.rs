//! Fixed window: at most `limit` per window, windows aligned to multiples of `window`
//! since the Unix epoch.
//!
//! The cheapest exact counter, with a known weakness: windows do not overlap, so a client
//! can spend a whole window's limit just before a boundary and another just after it,
//! admitting up to `2 × limit` within any span of one `window` length. Use
//! [`SlidingLog`](crate::sliding_log::SlidingLog) when that matters.

use std::num::NonZeroU32;

use crate::algorithm::{capacity_share, commit};
use crate::divisor::Divisor;
use crate::{
    AcquireError, Algorithm, ConfigError, Decision, Micros, Outcome, OverCapacity, Timestamp,
};

/// A validated fixed-window limit: `limit` cost units per aligned `window`.
///
/// ```
/// use rein_core::fixed_window::{FixedWindow, FixedWindowState};
/// use rein_core::{Algorithm, Micros, Timestamp};
///
/// let per_minute = FixedWindow::new(100, Micros::from_secs(60))?;
/// let mut state = FixedWindowState::default();
/// // 59 s into a minute: the window closes in 1 s, whatever happened before.
/// let now = Timestamp::from_micros(59_000_000);
/// assert!(per_minute.acquire(now, &mut state, 100)?.is_allowed());
/// let denied = per_minute.acquire(now, &mut state, 1)?;
/// assert_eq!(denied.retry_after, Micros::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    /// Cost units admitted per window.
    limit: u64,
    /// Window length in µs.
    window: Divisor,
}

/// The persisted state of one fixed window. Memory: 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    /// Start of the window `count` belongs to.
    pub window_start: Timestamp,
    /// Cost admitted in that window.
    pub count: u64,
}

impl FixedWindow {
    /// `limit` cost units per `window`. Errors if either is zero, if `limit` exceeds
    /// [`MAX_MICROS`](crate::MAX_MICROS), or if `window` exceeds [`MAX_SPAN`](crate::MAX_SPAN).
    pub fn new(limit: u64, window: Micros) -> Result<Self, ConfigError> {
        let window = crate::limit_per_window(limit, window)?;
        Ok(Self {
            limit,
            window: Divisor::new(window),
        })
    }

    /// Cost units admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Micros {
        Micros::from_micros(self.window.get())
    }

    /// The transition alone: the current window, what it holds, and whether `cost` fits.
    /// [`acquire`](Algorithm::acquire) derives its figures from this and
    /// [`try_acquire`](Algorithm::try_acquire) does not, so they cannot disagree.
    #[inline(always)]
    fn step(
        &self,
        now: Timestamp,
        state: &FixedWindowState,
        cost: u64,
    ) -> Result<Step, AcquireError> {
        OverCapacity::check(cost, self.limit)?;
        let (start, count) = self.current(now, state);
        let remaining = self.limit.saturating_sub(count);
        Ok(Step {
            start,
            count,
            remaining,
            admitted: cost <= remaining,
        })
    }

    #[inline(always)]
    fn decide(
        &self,
        now: Timestamp,
        state: &FixedWindowState,
        cost: u64,
    ) -> Result<(Decision, Option<FixedWindowState>), AcquireError> {
        let Step {
            start,
            count,
            remaining,
            admitted,
        } = self.step(now, state, cost)?;
        // `start` is never before `now`'s window, so this is at least 1 µs.
        let window_end = start.as_micros() + self.window.get() - now.as_micros();
        let reset = |count: u64| Micros::from_micros(if count > 0 { window_end } else { 0 });
        if admitted {
            let count = count + cost;
            let next = (cost > 0).then_some(FixedWindowState {
                window_start: start,
                count,
            });
            return Ok((
                Decision::allowed(self.limit, remaining - cost, reset(count)),
                next,
            ));
        }
        // `cost <= limit`, so the next window admits it.
        let retry_after = Micros::from_micros(window_end);
        Ok((
            Decision::denied(self.limit, remaining, retry_after, reset(count)),
            None,
        ))
    }

    /// The window that counts at `now`, and what it holds. A clock that went back to an
    /// earlier window keeps counting in the stored one: regressions never reopen a window.
    /// Gives back up to `amount` units counted in the window that contains `stamp` (an
    /// instant of the store's clock from when they were taken), and only if that is the
    /// window counting at `now`: units returned after their window ended are not counted
    /// in the next one, so a late return under-admits at worst, never over-admits.
    ///
    /// ```
    /// use rein_core::fixed_window::{FixedWindow, FixedWindowState};
    /// use rein_core::{Algorithm, Micros, Timestamp};
    ///
    /// let limit = FixedWindow::new(10, Micros::from_secs(1))?;
    /// let mut state = FixedWindowState::default();
    /// let at = |ms: u64| Timestamp::from_micros(ms * 1_000);
    /// limit.acquire(at(100), &mut state, 10)?;
    /// // 4 of them go back while their window runs: counted no more.
    /// limit.refund_in_window(at(900), &mut state, 4, at(100));
    /// assert_eq!(limit.peek(at(900), &state, 4)?.is_allowed(), true);
    /// // A return that arrives in the next window changes nothing there.
    /// limit.acquire(at(1_100), &mut state, 10)?;
    /// limit.refund_in_window(at(1_200), &mut state, 4, at(100));
    /// assert_eq!(limit.peek(at(1_200), &state, 1)?.is_allowed(), false);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_in_window(
        &self,
        now: Timestamp,
        state: &mut FixedWindowState,
        amount: u64,
        stamp: Timestamp,
    ) {
        let stamp = stamp.as_micros();
        let (start, _) = self.current(now, state);
        if stamp - self.window.rem(stamp) == start.as_micros() {
            self.refund(now, state, amount);
        }
    }

    fn current(&self, now: Timestamp, state: &FixedWindowState) -> (Timestamp, u64) {
        let now = now.max(state.window_start).as_micros();
        let start = Timestamp::from_micros(now - self.window.rem(now));
        if start == state.window_start {
            (start, state.count)
        } else {
            (start, 0)
        }
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    const TAG: &'static str = "fw";

    /// The limit per window.
    fn capacity(&self) -> u64 {
        self.limit()
    }

    /// Counts `cost` if it fits in the current window; otherwise changes nothing.
    #[inline]
    fn acquire(
        &self,
        now: Timestamp,
        state: &mut FixedWindowState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        commit(state, self.decide(now, state, cost))
    }

    /// [`acquire`](Self::acquire)'s outcome and state change, without its figures.
    #[inline]
    fn try_acquire(
        &self,
        now: Timestamp,
        state: &mut FixedWindowState,
        cost: u64,
    ) -> Result<Outcome, AcquireError> {
        let step = self.step(now, state, cost)?;
        if !step.admitted {
            return Ok(Outcome::Denied);
        }
        if cost > 0 {
            *state = FixedWindowState {
                window_start: step.start,
                count: step.count + cost,
            };
        }
        Ok(Outcome::Allowed)
    }

    /// What [`acquire`](Self::acquire) would answer, without counting anything.
    fn peek(
        &self,
        now: Timestamp,
        state: &FixedWindowState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        self.decide(now, state, cost).map(|(decision, _)| decision)
    }

    /// Uncounts up to `amount` from the current window, never below zero.
    fn refund(&self, now: Timestamp, state: &mut FixedWindowState, amount: u64) {
        let (start, count) = self.current(now, state);
        if count > 0 {
            *state = FixedWindowState {
                window_start: start,
                count: count.saturating_sub(amount),
            };
        }
    }

    /// `true` when nothing is counted in the current window.
    fn is_full(&self, now: Timestamp, state: &FixedWindowState) -> bool {
        self.current(now, state).1 == 0
    }

    fn share(&self, nodes: NonZeroU32) -> Result<Self, ConfigError> {
        Self::new(capacity_share(self.limit(), nodes), self.window())
    }
}

/// One decision's arithmetic, before any figure is derived from it.
struct Step {
    /// The window that counts at `now`, and the cost it holds.
    start: Timestamp,
    count: u64,
    /// `limit - count`, at least zero.
    remaining: u64,
    /// Whether the cost fits.
    admitted: bool,
}
