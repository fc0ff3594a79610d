//! [`Algorithm`]: what every rate-limiting algorithm provides, written once in its own
//! module.
//!
//! Each algorithm (`token_bucket.rs`, `fixed_window.rs`, `sliding_log.rs`,
//! `sliding_counter.rs`) implements this trait next to its math; [`Limit`](crate::Limit)
//! holds any of them and delegates every call through one dispatch, and the stores build on
//! the trait rather than on a `match` of their own. Adding an algorithm, or a capability
//! such as [`share`](Algorithm::share), is then one implementation per algorithm, in the
//! algorithm's module.

use std::fmt::Debug;
use std::hash::Hash;
use std::num::NonZeroU32;

use crate::{AcquireError, ConfigError, Decision, Outcome, Timestamp};

/// A rate-limiting algorithm: its parameters (`self`) and the transitions of its state.
///
/// # Contract
/// The same as rein-core's (see the crate docs): `acquire` consumes `cost` only on
/// [`Outcome::Allowed`](crate::Outcome::Allowed), a denial leaves the state as it was;
/// `peek` never changes anything; `refund` never goes beyond full; `now` need not be
/// monotonic; every intermediate value stays below 2^53. `Err` means the cost exceeds the
/// capacity ([`AcquireError::InsufficientCapacity`]).
pub trait Algorithm: Copy + Debug + Eq + Hash + Send + Sync + 'static {
    /// The per-key state; its `Default` is a full limit (no history).
    type State: Clone + Debug + Default + Eq + Hash + Send + Sync + 'static;

    /// A short name for keys and reports (`tb`, `fw`, `sl`, `sc`). Stable: the Redis
    /// store puts it in every key.
    const TAG: &'static str;

    /// The capacity: the largest cost a single request may have.
    fn capacity(&self) -> u64;

    /// Consumes `cost` if the limit admits it at `now`; a denial changes nothing.
    fn acquire(
        &self,
        now: Timestamp,
        state: &mut Self::State,
        cost: u64,
    ) -> Result<Decision, AcquireError>;

    /// [`acquire`](Self::acquire) without the figures: the same outcome and the same change
    /// to the state, for callers that only need to know whether the request was admitted.
    /// The token bucket and the fixed window answer it without computing `remaining`,
    /// `retry_after` or `reset_after`; the default computes the whole decision.
    #[inline]
    fn try_acquire(
        &self,
        now: Timestamp,
        state: &mut Self::State,
        cost: u64,
    ) -> Result<Outcome, AcquireError> {
        self.acquire(now, state, cost).map(|d| d.outcome)
    }

    /// What [`acquire`](Self::acquire) would answer, consuming nothing.
    fn peek(
        &self,
        now: Timestamp,
        state: &Self::State,
        cost: u64,
    ) -> Result<Decision, AcquireError>;

    /// Gives back up to `amount`, never beyond full.
    fn refund(&self, now: Timestamp, state: &mut Self::State, amount: u64);

    /// `true` when the state holds nothing at `now`, so a store may forget it.
    fn is_full(&self, now: Timestamp, state: &Self::State) -> bool;

    /// One node's share when `nodes` nodes enforce this limit independently (the local
    /// fallback during an outage): the capacity divided by `nodes`, rounded down but at
    /// least 1, and a rate divided exactly, so that the shares together never admit more
    /// than the whole (docs/failure.md). Errors if the share's parameters are not exact.
    fn share(&self, nodes: NonZeroU32) -> Result<Self, ConfigError>;
}

/// The per-node capacity of [`Algorithm::share`]: `capacity / nodes`, at least 1.
pub(crate) fn capacity_share(capacity: u64, nodes: NonZeroU32) -> u64 {
    (capacity / u64::from(nodes.get())).max(1)
}

/// `acquire` for an algorithm whose decision computes the next state whole: store it if
/// there is one.
pub(crate) fn commit<S>(
    state: &mut S,
    decided: Result<(Decision, Option<S>), AcquireError>,
) -> Result<Decision, AcquireError> {
    let (decision, next) = decided?;
    if let Some(next) = next {
        *state = next;
    }
    Ok(decision)
}
