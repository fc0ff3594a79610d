//! rein-resilient: the limiters above any store, re-exported whole by the `rein` crate
//! (applications depend on `rein`; the paths below are `rein::...`).
//!
//! It sits above the stores (`rein-redis` for limits shared through Redis, `rein-memory`
//! in process), which only store: each implements rein-core's
//! [`Limiter`](rein_core::Limiter) trait, and [`Leasable`](rein_core::Leasable) to be leased
//! over, and nothing more.
//!
//! - [`ResilientLimiter`] over a store: every request gets an answer within the store's
//!   deadline, by the [`FailurePolicy`] the operator chose; each answer says where it came
//!   from ([`Decided`], [`Source`]). Build it with a [`PolicyTable`] (which policy a key
//!   gets) and, if needed, [`BreakerConfig`], [`AllowCacheConfig`], a clock
//!   ([`TokioClock`] by default, [`TimeSource`]). Its counters: [`StatsSnapshot`].
//! - Leases, a builder option of the same limiter
//!   ([`ResilientLimiterBuilder::leases`] with a [`LeaseConfig`], over a
//!   [`Leasable`](rein_core::Leasable) store): hot keys decided from blocks reserved in the
//!   store, at memory speed and with zero over-admission; the same `acquire`, the same
//!   [`Decided`], with [`Source::Lease`] or [`Source::LocalDenial`] when the leases
//!   answered (docs/leases.md). [`lease::LeasedLimiter`] is the same machinery over a bare
//!   store.
//! - The machinery, for those who need it: [`breaker`] (the sans-IO circuit breaker),
//!   [`lease`] (lease settings, terms and statistics), [`region`] (one limit across
//!   regions), [`fallback`] (a node's share of a policy), [`stats`] (counters and latency).
//!
//! docs/failure.md states the exact bounds each failure policy gives during and after an
//! outage; docs/architecture.md draws the crates and the decision path.
//!
//! A rate limiter sits in every request's path, so an outage of Redis must not become an
//! outage of the service, nor a pile-up of waiting requests, nor a replay storm when Redis
//! returns.
//!
//! # Design
//! - **Decisions are sans-IO.** The request path's logic (deny and allow caches, breaker,
//!   failure policy, counters) is one pure state machine, the gate (`gate.rs`), with
//!   explicit time, tested on a number line; the breaker inside it
//!   ([`Breaker`](breaker::Breaker)) is one too, in quinn's shape (`poll_admit`,
//!   `handle_success`/`handle_failure`, `poll_timeout`, `poll_event`). [`ResilientLimiter`]
//!   is the thin driver: read the clock, ask the gate, await the store under the deadline,
//!   hand the outcome back.
//! - **Local time is injected.** Everything local (cache expiry, breaker timers, the
//!   fallback limiter, latency) reads a [`rein_memory::Clock`] (default [`TokioClock`]), and
//!   the only wait is the store's call under `tokio::time`. The same code runs under
//!   turmoil's simulated time with a skewed clock per node.
//! - **Nothing is replayed.** A call that timed out may have run in the store; the failure
//!   policy answers instead, so a request is counted in the store at most once.
//! - **Caches are explicit about their error.** The deny cache repeats the store's denials
//!   and never outlasts them (its expiry counts from before the call was sent). The allow
//!   cache over-admits and is off unless enabled with a `danger_` method, under a bound it
//!   enforces. Both hold a bounded number of entries.
//! - **Counters are the interface.** [`StatsSnapshot`] counts decisions by source and
//!   outcome, store errors by kind, breaker rejections and transitions, and store latency
//!   in a fixed log-scale histogram; with the `metrics` feature the same numbers go to the
//!   `metrics` facade.
//!
//! # What it does not do
//! It does not store anything itself (the local fallback is a `rein-memory` limiter at this
//! node's share), and it does not retry a store call.
//!
//! # Layout
//! - `limiter.rs`: [`ResilientLimiter`], its builder, the async driver.
//! - `gate.rs`: the request path's decisions, sans-IO.
//! - `breaker.rs`: [`breaker::Breaker`]. `fallback.rs`: [`FailurePolicy`] and
//!   [`fallback::local_share`].
//! - `deny_cache.rs`, `allow_cache.rs`, over `bounded.rs` (the bounded map both use).
//! - `table.rs`: [`PolicyTable`]. `decided.rs`: [`Decided`], [`Source`], [`Unavailable`].
//! - `stats.rs`: [`StatsSnapshot`]; `export.rs`: the `metrics` facade export.
//! - `clock.rs`: [`TokioClock`].
//! - `mode.rs`: with leases on or off ([`lease::Leased`], [`lease::Direct`]): where a
//!   leased request is decided.
//! - `lease/`: leases, opt-in (docs/leases.md): [`lease::LeasedLimiter`] decides hot keys locally
//!   from blocks reserved in a [`Leasable`](rein_core::Leasable) store, with zero
//!   over-admission; its sans-IO state machines (`book.rs`, `rate.rs`) are tested inside the
//!   crate, and [`lease::LeaseTerms`] says which policies lease exactly.
//! - `region.rs`: one limit across regions: [`region::split`] (static) and
//!   [`region::Rebalancer`] / [`region::RegionQuota`] (quota rebalanced from a home region
//!   every window); docs/multi-region.md.
#![deny(missing_docs)]

mod allow_cache;
mod bounded;
pub mod breaker;
mod clock;
mod decided;
mod deny_cache;
#[cfg(feature = "metrics")]
mod export;
pub mod fallback;
mod gate;
pub mod lease;
mod limiter;
mod mode;
mod owner;
pub mod region;
pub mod stats;
mod table;

use thiserror::Error;

use rein_core::{KeyError, PrepareError};

// The front door: what an application uses first. The machinery of the breaker, leases,
// regions and the counters is in the modules of those names.
pub use allow_cache::AllowCacheConfig;
pub use breaker::BreakerConfig;
pub use clock::TokioClock;
pub use decided::{Decided, Source, Unavailable};
pub use fallback::FailurePolicy;
pub use lease::LeaseConfig;
pub use limiter::{ResilientLimiter, ResilientLimiterBuilder, TablePolicy, TimeSource};
pub use stats::StatsSnapshot;
pub use table::PolicyTable;

// The limits themselves, and the stores: what a program needs beside the limiter, from
// this one crate.
/// rein-core: the limits' exact math with explicit time (`Policy::acquire` at a
/// `rein::core::Timestamp`), the [`Decision`](rein_core::Decision) every answer carries, and
/// the [`Limiter`](rein_core::Limiter) trait every store implements (to call a store
/// directly, or to write code over any store).
pub use rein_core as core;
pub use rein_core::{Limit, Micros, NamedPolicy, OverCapacity, Policy};
/// rein-memory: limits in one process (`rein::memory::MemoryStore`), also the local
/// fallback the failure policy uses.
pub use rein_memory as memory;
/// rein-redis: limits shared between servers through Redis
/// (`rein::redis::RedisStore`). With the `redis` feature, on by default.
#[cfg(feature = "redis")]
pub use rein_redis as redis;

/// docs/failure.md, compiled with the doctests so that its example keeps up with the API.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/failure.md")]
struct FailureDoc;

/// docs/redis.md, compiled with the doctests so that its examples, written as an
/// application writes them (through `rein::redis`), keep up with the API.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../docs/redis.md")]
struct RedisDoc;

/// docs/optimistic.md, compiled with the doctests as docs/redis.md is.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../docs/optimistic.md")]
struct OptimisticDoc;

/// docs/architecture.md, compiled with the doctests: its listing of the traits must at least
/// name types that exist with these signatures.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/architecture.md")]
struct ArchitectureDoc;

/// Why [`ResilientLimiter::acquire`] returned no decision: the request itself can never be
/// admitted. Store failures are never an `Err` here; the failure policy answers them.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The cost exceeds the capacity of the key's policy (its smallest limit); see
    /// [`OverCapacity`].
    #[error(transparent)]
    InsufficientCapacity(#[from] OverCapacity),
    /// The key cannot be used; see [`KeyError`].
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// [`acquire_as`](ResilientLimiter::acquire_as) named a policy the table does not hold.
    /// Fix: add it with [`PolicyTable::with_policy`], or correct the name.
    #[error("no policy named {0:?} in the table")]
    UnknownPolicy(String),
    /// The store does not run this operation: a leased token bucket's direct decision
    /// ([`Leasable::share_rate`](rein_core::Leasable::share_rate)) on a store without rate
    /// shares, which a leased limiter then decides with plain `acquire`. Never a store
    /// failure: the breaker learns nothing from it, and no failure policy answers it.
    #[error("the store does not implement {operation}")]
    Unsupported {
        /// The operation.
        operation: &'static str,
    },
    /// The store refused a leased token bucket's direct decision as a rate share it does
    /// not allow (see [`ShareError`](rein_core::rate_share::ShareError)); a share above
    /// the key's capacity is [`InsufficientCapacity`](Self::InsufficientCapacity). Never a
    /// store failure: the breaker learns nothing from it, and no failure policy answers it.
    #[error(transparent)]
    InvalidShare(rein_core::rate_share::ShareError),
}

/// A request error as [`Limiter`](rein_core::Limiter)'s, for code that decides through
/// the inherent calls and answers in the trait's terms (rein-server). A policy the table
/// does not hold is [`DecideError::ForeignPolicy`](rein_core::DecideError::ForeignPolicy):
/// the trait names policies by a prepared [`TablePolicy`], and refuses one this limiter did
/// not prepare that way.
impl From<RequestError> for rein_core::DecideError {
    fn from(error: RequestError) -> Self {
        match error {
            RequestError::InsufficientCapacity(over) => over.into(),
            RequestError::InvalidKey(e) => Self::InvalidKey(e),
            RequestError::UnknownPolicy(_) => Self::ForeignPolicy,
            RequestError::Unsupported { operation } => Self::Unsupported { operation },
            RequestError::InvalidShare(e) => Self::InvalidShare(e),
        }
    }
}

/// A [`PolicyTable`] or [`ResilientLimiter`] that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ResilienceConfigError {
    /// Two policies in one table have the same name. Names must be unique: they select
    /// policies and are part of their store keys.
    #[error("the table already holds a policy named {0:?}")]
    DuplicatePolicy(String),
    /// A prefix rule names a policy the table does not hold. Add the policy first.
    #[error("no policy named {0:?} in the table")]
    UnknownPolicy(String),
    /// A prefix rule's prefix is empty (use the default policy instead) or already routed.
    #[error("invalid or duplicate key prefix {0:?}")]
    InvalidPrefix(String),
    /// A duration that must be positive is zero (the breaker's backoff, the allow cache's
    /// window).
    #[error("{0} must be longer than zero")]
    ZeroDuration(&'static str),
    /// The store could not prepare a policy of the table; see [`PrepareError`].
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    /// A policy has no exact share for the expected node count (a token bucket's period
    /// times `N` above 2^52 µs). Fix: a lower `expected_nodes`, or a faster refill.
    #[error("policy {policy:?} has no exact local share: {source}")]
    Share {
        /// The policy's name.
        policy: String,
        /// Why its share could not be built.
        source: rein_core::ConfigError,
    },
    /// The leases' settings cannot run over this limiter; see
    /// [`LeaseConfigError`](crate::lease::LeaseConfigError).
    #[error(transparent)]
    Leases(#[from] crate::lease::LeaseConfigError),
}
