//! rein-redis: exact rate limits shared through Redis, one atomic script call per decision.
//!
//! Many application servers share a limit by keeping its state in Redis. Each decision,
//! for any algorithm of [rein-core](rein_core), any cost, a peek, a refund, or a policy of
//! several limits all-or-nothing, is **one** `EVALSHA` of one Lua script. The script reads
//! the state, decides with the same integer math as rein-core and writes the new state, so
//! concurrent servers can never both take the last token. A denial writes nothing.
//!
//! ```no_run
//! use rein_core::{Limit, Micros, Policy};
//! use rein_redis::{NamedPolicy, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("rediss://rein:secret@redis.internal:6380/").await?;
//! let per_user = NamedPolicy::new(
//!     "api",
//!     Policy::new([
//!         Limit::token_bucket(20, 5, Micros::from_secs(1))?,  // bursts of 20, 5 per second
//!         Limit::fixed_window(10_000, Micros::from_secs(86_400))?, // and 10 000 a day
//!     ])?,
//! )?;
//! match store.acquire(&per_user, "user-42", 1).await {
//!     Ok(d) if d.is_allowed() => { /* serve */ }
//!     Ok(d) => { /* 429, Retry-After: d.retry_after */ }
//!     Err(e) => { /* Redis failed: fail open or closed, your call */ }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Key design decision: the scripts are a rendering of rein-core, pinned by a test
//!
//! The Lua under `lua/` is not a second guess at the algorithms: each script renders named
//! rein-core functions, with the same variable names (`tat`, `tat_units`,
//! `units_per_token`, `window_start`, ...), and stores each limit's state as one string of
//! the state's integers, so a stored state decodes into rein-core's types
//! ([`RedisStore::state`]). A differential property test runs random policies and operation
//! sequences (costs, peeks, refunds, clocks that go backwards or sit at the end of time)
//! against a real Redis and against rein-core, and requires identical decisions and
//! identical stored state after every step. The arithmetic is exact because rein-core keeps
//! every quantity below 2^52, where Lua's doubles are exact integers.
//!
//! The scripts are written for Redis's CPU, which every application server shares: a policy
//! of one token bucket, fixed window or sliding log runs a small straight-line script of its
//! own, any other policy one loop over its limits (`policy.lua`), each with its parameters
//! precomputed once per [`NamedPolicy`], one `GET` per limit and one `SET ... PX` per
//! written limit ([`SCRIPTS`]; docs/redis.md, docs/performance.md).
//!
//! Other choices, each explained in docs/redis.md: `now` comes from Redis's `TIME` by
//! default (one clock for all servers); keys are `prefix:v2:{sha1(user key)}:policy:i:algo`,
//! so one policy's keys share a Cluster slot; every written key expires when its limit is
//! full again; a call that timed out is never replayed, because it may have run.
//!
//! # What this crate does not do
//!
//! - **No failure policy.** When Redis is slow or down, calls return typed errors
//!   ([`AcquireError::Timeout`], [`AcquireError::Connection`]), never a made-up decision.
//!   Failing open, closed or to a local limiter, circuit breaking and caching denials
//!   belong in a layer above this store: [`ResilientLimiter`], below.
//! - **No in-process limiting.** For limits that need not be shared between processes, use
//!   `rein-memory`: nanoseconds instead of a network round trip.
//! - **No retries.** Except the `NOSCRIPT` reload, which is safe because the script had
//!   not run.
//! - **No other runtime than tokio.** Deadlines are tokio timers, and a store built with
//!   a connector reconnects in a spawned tokio task.
//!
//! # Resilience: the layer above the store
//!
//! [`ResilientLimiter`] wraps a store for the request path. Every call answers within the
//! store's deadline, from Redis or, when Redis cannot answer, by the [`FailurePolicy`] the
//! operator chose: fail open, fail closed, or a local [`rein_memory`] limiter at this node's
//! share of the policy ([`local_share`]). A sans-IO circuit breaker ([`Breaker`]) stops
//! calls to a failing Redis and probes it back; an exact deny cache repeats Redis's recent
//! denials without a round trip; an opt-in allow cache
//! ([`danger_allow_cache`](ResilientLimiterBuilder::danger_allow_cache)) reuses admissions
//! within a stated over-admission bound. Each answer carries its [`Source`], a
//! [`PolicyTable`] picks each key's policy, and [`StatsSnapshot`] (and, with the `metrics`
//! feature, the `metrics` facade) counts all of it. docs/failure.md gives the exact bounds.
//!
//! # Layout
//!
//! - `store.rs`: [`RedisStore`] and [`RedisStoreBuilder`]: encode, call, decode.
//! - `connect.rs`: constructors from URLs (standalone, Cluster, TLS, AUTH).
//! - `link.rs`: the connection, and replacing it through the caller's connector.
//! - `script.rs`: the scripts ([`SCRIPTS`]), their arguments and their reply.
//! - `key.rs`: key layout. `policy.rs`: [`NamedPolicy`]. `state.rs`: reading state back.
//! - `error.rs`: one error enum per operation.
//! - `resilience/`: [`ResilientLimiter`] and its parts (breaker, caches, fallback, policy
//!   table, counters).
#![deny(missing_docs)]

mod connect;
mod error;
mod key;
mod link;
mod policy;
mod resilience;
mod script;
mod state;
mod store;

pub use error::{AcquireError, ConfigError, ConnectError, KeyError, RefundError, StateError};
pub use policy::NamedPolicy;
pub use resilience::{
    AllowCacheConfig, Breaker, BreakerConfig, BreakerEvent, BreakerState, Decided, FailurePolicy,
    LATENCY_BOUNDS_US, LATENCY_BUCKETS, LatencySnapshot, PolicyTable, RequestError,
    ResilienceConfigError, ResilientLimiter, ResilientLimiterBuilder, Source, SourceCounts,
    StatsSnapshot, Ticket, TimeSource, TokioClock, Unavailable, local_share,
};
pub use script::{SCRIPT_SOURCE, SCRIPTS};
pub use store::{RedisStore, RedisStoreBuilder};

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
