//! rein-core: rate-limiting algorithms as pure, exact state transitions.
//!
//! Every algorithm here is a function `(limit, state, now, cost) → (decision, next state)`.
//! The caller supplies `now` as an integer [`Timestamp`] in microseconds and owns the
//! state; this crate reads no clock, does no I/O, spawns nothing and allocates nothing on
//! a token-bucket, fixed-window or sliding-counter decision. That is what lets one set of
//! math run in three places: in process ([`rein-memory`]), inside Redis as Lua
//! ([`rein-redis`], whose scripts render these same functions and are pinned to them by a
//! differential test), and in the simulator, where time is virtual.
//!
//! # Where to start
//! [`Limit`] (one of the four algorithms, built with its numbers: [`Limit::token_bucket`],
//! [`Limit::fixed_window`], ...), [`Policy`] (up to [`MAX_LIMITS`](policy::MAX_LIMITS)
//! limits, all or nothing) and its [`PolicyState`], [`NamedPolicy`] (a policy with the name
//! stores key it by), [`Decision`], and the time types [`Micros`] and [`Timestamp`]. An
//! operator's changes to one key are transitions too: [`Policy::penalize`],
//! [`Policy::with_remaining`] and a [`Block`]. Stores implement
//! [`Limiter`] (and [`Leasable`] to be leased over, [`admin::KeyAdmin`] for an operator's
//! changes to one key). Each algorithm's own type and state are
//! in its module, the rate shares that lease a token bucket in [`rate_share`], and per-key
//! overrides of a policy in [`overrides`]. What a store's author needs besides is with what
//! it qualifies: the store interface's deadlines and error source in [`limiter`], the
//! bounds of time in [`time`], a policy's greatest number of limits in [`policy`].
//!
//! # Algorithms
//! | module | state | admits | memory per key |
//! |---|---|---|---|
//! | [`token_bucket`] (GCRA) | theoretical arrival time | bursts of `capacity`, `refill` per `period` | 16 B |
//! | [`fixed_window`] | window start, count | `limit` per aligned window (2× at a boundary) | 16 B |
//! | [`sliding_log`] | every admission in the window | exactly `limit` in any window | 16 B × admissions |
//! | [`sliding_counter`] | two counts | about `limit` in any window (< 2× worst case) | 24 B |
//!
//! A [`Policy`] combines up to [`MAX_LIMITS`](policy::MAX_LIMITS) limits all-or-nothing.
//!
//! # Contract
//! - `acquire` consumes `cost` only if the decision is [`Outcome::Allowed`]; a denial
//!   leaves the state as it was. `peek` (or a cost of zero) answers without consuming;
//!   `refund` gives capacity back, never beyond full.
//! - `now` need not be monotonic. A clock that goes backwards never admits more than the
//!   latest clock reading the state has seen would have: windows never reopen and elapsed
//!   time saturates at zero. The state is that memory, so two things forget it: a refund
//!   that returns a limit to full, and a store dropping a full state. After either, an
//!   earlier `now` is judged on its own.
//! - Denials are values. `Err` means the request can never fit
//!   ([`AcquireError::InsufficientCapacity`]) or the state belongs to another limit.
//!   Invalid settings are rejected when the limit is built ([`ConfigError`]), among them
//!   any limit whose span (empty to full) exceeds [`MAX_SPAN`].
//! - No limit admits more than its bound at any `now`, up to [`MAX_MICROS`]. Near the end
//!   of representable time, a request whose next state could not be stored exactly is
//!   denied with `retry_after` [`Micros::MAX`] rather than stored clamped.
//! - Every intermediate value stays below 2^53, so it is exact in the doubles of Lua.
//!
//! ```
//! use rein_core::{Limit, Micros, Policy, Timestamp};
//!
//! let policy = Policy::single(Limit::token_bucket(10, 1, Micros::from_secs(1))?);
//! let mut state = policy.new_state();
//! let decision = policy.acquire(Timestamp::from_micros(0), &mut state, 3)?;
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining, 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`rein-memory`]: https://docs.rs/rein-memory
//! [`rein-redis`]: https://docs.rs/rein-redis
#![deny(missing_docs)]

pub mod admin;
mod algorithm;
mod block;
mod decision;
mod divisor;
mod error;
pub mod fixed_window;
mod limit;
pub mod limiter;
pub mod overrides;
pub mod policy;
pub mod rate_share;
pub mod rng;
pub mod sliding_counter;
pub mod sliding_log;
pub mod time;
pub mod token_bucket;

pub use algorithm::Algorithm;
pub use block::Block;
pub use decision::{Decision, Outcome};
pub use error::{AcquireError, ConfigError, OverCapacity};
pub use limit::{Limit, LimitState};
pub use limiter::{
    DecideError, Held, KeyError, Leasable, Limiter, NamedPolicy, PrepareError, StoreError,
};
pub use policy::{Policy, PolicyState};
pub use time::{Micros, Timestamp};

// The bounds of time, in their module (`time`), named here for the crate's own use.
use time::{MAX_MICROS, MAX_SPAN};

/// Checks a limit of `limit` units per `window` (a fixed window's, a sliding log's): both
/// nonzero, `limit` at most [`MAX_MICROS`], `window` at most [`MAX_SPAN`]. Returns the
/// window in µs.
fn limit_per_window(limit: u64, window: Micros) -> Result<u64, ConfigError> {
    ensure_nonzero("limit", limit)?;
    ensure_nonzero("window", window.as_micros())?;
    ensure_exact("limit", limit)?;
    ensure_span("window", window.as_micros())?;
    Ok(window.as_micros())
}

fn ensure_nonzero(what: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::Zero { what })
    } else {
        Ok(())
    }
}

fn ensure_exact(what: &'static str, value: u64) -> Result<(), ConfigError> {
    if value > MAX_MICROS {
        Err(ConfigError::TooLarge {
            what,
            value,
            max: MAX_MICROS,
        })
    } else {
        Ok(())
    }
}

/// Rejects a span (empty to full) longer than [`MAX_SPAN`].
fn ensure_span(what: &'static str, span: u64) -> Result<(), ConfigError> {
    if span > MAX_SPAN.as_micros() {
        Err(ConfigError::SpanTooLong {
            what,
            span,
            max: MAX_SPAN.as_micros(),
        })
    } else {
        Ok(())
    }
}

fn exact_product(what: &'static str, a: u64, b: u64) -> Result<u64, ConfigError> {
    let value = a.saturating_mul(b);
    ensure_exact(what, value)?;
    Ok(value)
}
