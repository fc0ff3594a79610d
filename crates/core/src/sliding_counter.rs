//! Sliding window counter: Cloudflare's two-counter approximation of a sliding window.
//!
//! It keeps the count of the current aligned window and of the one before, and assumes the
//! previous window's requests were spread evenly over it. At `elapsed` µs into the current
//! window the estimate of the last `window` is
//!
//! ```text
//! previous × (window − elapsed) / window + current
//! ```
//!
//! and a request is admitted while `estimate + cost ≤ limit`. The comparison is made
//! multiplied through by `window`, so it is exact in integers (`limit × window` is
//! validated to stay below 2^52).
//!
//! State is O(1) (24 bytes) whatever the limit, unlike [`SlidingLog`](crate::sliding_log::SlidingLog).
//! The price is accuracy: when the previous window's requests were bunched at its end, the
//! estimate undercounts them, and in the worst case a span of one `window` admits up to
//! `limit + previous × elapsed / window`, which is below `2 × limit`. When they were bunched
//! at its start, it overcounts and admits less than the exact log would. docs/algorithms.md
//! gives the bound and the error measured against the exact log.

use std::num::NonZeroU32;

use crate::algorithm::{capacity_share, commit};
use crate::divisor::Divisor;
use crate::{AcquireError, Algorithm, ConfigError, Decision, Micros, OverCapacity, Timestamp};

/// A validated sliding-window-counter limit: about `limit` cost units per `window`.
///
/// ```
/// use rein_core::sliding_counter::{SlidingCounter, SlidingCounterState};
/// use rein_core::{Algorithm, Micros, Timestamp};
///
/// let limit = SlidingCounter::new(10, Micros::from_secs(1))?;
/// let mut state = SlidingCounterState::default();
/// assert!(limit.acquire(Timestamp::from_micros(900_000), &mut state, 10)?.is_allowed());
/// // Half-way through the next window, half of the previous window still counts.
/// let half = Timestamp::from_micros(1_500_000);
/// assert_eq!(limit.peek(half, &state, 0)?.remaining, 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlidingCounter {
    /// Cost units admitted per sliding window (approximately).
    limit: u64,
    /// Window length in µs.
    window: Divisor,
}

/// The persisted state of one sliding window counter. Memory: 24 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlidingCounterState {
    /// Start of the aligned window `current` counts.
    pub window_start: Timestamp,
    /// Cost admitted in the window starting at `window_start`.
    pub current: u64,
    /// Cost admitted in the window before it.
    pub previous: u64,
}

/// The counters as seen from one instant.
struct View {
    start: u64,
    elapsed: u64,
    previous: u64,
    current: u64,
}

impl SlidingCounter {
    /// About `limit` cost units per `window`. Errors if either is zero, if
    /// `limit × window` exceeds [`MAX_MICROS`](crate::MAX_MICROS), or if `window` exceeds
    /// [`MAX_SPAN`](crate::MAX_SPAN).
    pub fn new(limit: u64, window: Micros) -> Result<Self, ConfigError> {
        crate::ensure_nonzero("limit", limit)?;
        crate::ensure_nonzero("window", window.as_micros())?;
        crate::exact_product("limit × window", limit, window.as_micros())?;
        crate::ensure_span("window", window.as_micros())?;
        Ok(Self {
            limit,
            window: Divisor::new(window.as_micros()),
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

    fn decide(
        &self,
        now: Timestamp,
        state: &SlidingCounterState,
        cost: u64,
    ) -> Result<(Decision, Option<SlidingCounterState>), AcquireError> {
        OverCapacity::check(cost, self.limit)?;
        let v = self.view(now, state);
        let now = now.as_micros();
        let budget = self.limit * self.window.get();
        let weighted_previous = v.previous * (self.window.get() - v.elapsed);
        let used = weighted_previous + v.current * self.window.get();
        if used + cost * self.window.get() <= budget {
            let current = v.current + cost;
            let next = (cost > 0).then_some(SlidingCounterState {
                window_start: Timestamp::from_micros(v.start),
                current,
                previous: v.previous,
            });
            let remaining = self.window.div(budget - weighted_previous) - current;
            let reset = self
                .reset_at(v.start, v.previous, current)
                .saturating_sub(now);
            let decision = Decision::allowed(self.limit, remaining, Micros::from_micros(reset));
            return Ok((decision, next));
        }
        let remaining = self.window.div(budget.saturating_sub(weighted_previous));
        let remaining = remaining.saturating_sub(v.current);
        let retry = self.admitted_at(&v, cost).saturating_sub(now);
        let reset = self
            .reset_at(v.start, v.previous, v.current)
            .saturating_sub(now);
        let decision = Decision::denied(
            self.limit,
            remaining,
            Micros::from_micros(retry),
            Micros::from_micros(reset),
        );
        Ok((decision, None))
    }

    /// The counters at `now`, rolled over to `now`'s window. A clock that went back before
    /// the stored window is read as the stored window's start: regressions never uncount.
    fn view(&self, now: Timestamp, state: &SlidingCounterState) -> View {
        let stored = state.window_start.as_micros();
        let now = now.as_micros().max(stored);
        let start = now - self.window.rem(now);
        // Decoded state is input too: counts beyond the limit are read as the limit, which
        // keeps every product below 2^53 and changes no decision.
        let (current, previous) = (
            state.current.min(self.limit),
            state.previous.min(self.limit),
        );
        let (previous, current) = if start == stored {
            (previous, current)
        } else if start == stored + self.window.get() {
            (current, 0)
        } else {
            (0, 0)
        };
        View {
            start,
            elapsed: now - start,
            previous,
            current,
        }
    }

    /// Gives back up to `amount` units counted in the window that contains `stamp` (an
    /// instant of the store's clock from when they were taken): from the current counter
    /// if that is the window counting at `now`, from the previous one if it just ended,
    /// and not at all if it is older. Units never go back into a later window than the one
    /// that counted them, so a late return under-admits at worst, never over-admits.
    pub fn refund_in_window(
        &self,
        now: Timestamp,
        state: &mut SlidingCounterState,
        amount: u64,
        stamp: Timestamp,
    ) {
        let stamp = stamp.as_micros();
        let window = stamp - self.window.rem(stamp);
        let v = self.view(now, state);
        let (current, previous) = if window == v.start {
            (v.current.saturating_sub(amount), v.previous)
        } else if v.start.checked_sub(self.window.get()) == Some(window) {
            (v.current, v.previous.saturating_sub(amount))
        } else {
            return;
        };
        if (current, previous) != (v.current, v.previous) {
            *state = SlidingCounterState {
                window_start: Timestamp::from_micros(v.start),
                current,
                previous,
            };
        }
    }

    /// The first instant at which `cost` fits, for a request denied in view `v`.
    fn admitted_at(&self, v: &View, cost: u64) -> u64 {
        let w = self.window.get();
        // Later in this window, the previous window's weight `previous × (w − e)` must
        // fall to `room × w`, i.e. `w − e ≤ room × w / previous`.
        if let Some(room) = self.limit.checked_sub(v.current + cost) {
            let fits = (room * w / v.previous.max(1)).min(w);
            if fits > 0 {
                return v.start + (w - fits);
            }
        }
        // In the next window, the current count becomes the previous one.
        let fits = match v.current {
            0 => w,
            current => ((self.limit - cost) * w / current).min(w),
        };
        v.start + w + (w - fits)
    }

    /// When both counters will have decayed to nothing; zero (already) when they have. Not
    /// `start`: after a clock regression `start` can be later than `now`.
    fn reset_at(&self, start: u64, previous: u64, current: u64) -> u64 {
        if current > 0 {
            start + 2 * self.window.get()
        } else if previous > 0 {
            start + self.window.get()
        } else {
            0
        }
    }
}

impl Algorithm for SlidingCounter {
    type State = SlidingCounterState;

    const TAG: &'static str = "sc";

    /// The limit per window.
    fn capacity(&self) -> u64 {
        self.limit()
    }

    /// Counts `cost` if the estimate leaves room for it; otherwise changes nothing.
    fn acquire(
        &self,
        now: Timestamp,
        state: &mut SlidingCounterState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        commit(state, self.decide(now, state, cost))
    }

    /// What [`acquire`](Self::acquire) would answer, without counting anything.
    fn peek(
        &self,
        now: Timestamp,
        state: &SlidingCounterState,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        self.decide(now, state, cost).map(|(decision, _)| decision)
    }

    /// Uncounts up to `amount` from the current window, never below zero.
    fn refund(&self, now: Timestamp, state: &mut SlidingCounterState, amount: u64) {
        let v = self.view(now, state);
        if v.current > 0 {
            *state = SlidingCounterState {
                window_start: Timestamp::from_micros(v.start),
                current: v.current.saturating_sub(amount),
                previous: v.previous,
            };
        }
    }

    /// `true` when neither window counts anything at `now`.
    fn is_full(&self, now: Timestamp, state: &SlidingCounterState) -> bool {
        let v = self.view(now, state);
        v.current == 0 && v.previous == 0
    }

    fn share(&self, nodes: NonZeroU32) -> Result<Self, ConfigError> {
        Self::new(capacity_share(self.limit(), nodes), self.window())
    }
}
