//! rein-redis: exact rate limits shared through Redis, one atomic script call per decision.
//!
//! An application reaches this crate as `rein::redis`, through its one dependency `rein`
//! (the default `redis` feature); the examples here name it `rein_redis` and rein-core
//! `rein_core` (`rein::core`).
//!
//! Many application servers share a limit by keeping its state in Redis. Each decision,
//! for any algorithm of [rein-core](rein_core), any cost, a peek, a refund, or a policy of
//! several limits all-or-nothing, is **one** `EVALSHA` of one Lua script. The script reads
//! the state, decides with the same integer math as rein-core and writes the new state, so
//! concurrent servers can never both take the last token. A denial counts nothing (it writes
//! nothing, except a fixed window kept as one integer, which adds first and takes a denial
//! back in the same script: docs/redis.md, "Stored state"). Under
//! load, concurrent decisions of a policy of one token bucket, fixed window or sliding log
//! share a call, each still atomic
//! ([`Coalesce`]): the server then spends less per decision than on the naive scripts
//! rein replaces (docs/performance.md).
//!
//! ```no_run
//! use rein_core::{Limit, Limiter, Micros, Policy};
//! use rein_redis::{RedisPolicy, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("rediss://rein:secret@redis.internal:6380/").await?;
//! let per_user = RedisPolicy::new(
//!     "api",
//!     Policy::new([
//!         Limit::token_bucket(20, 5, Micros::from_secs(1))?,  // bursts of 20, 5 per second
//!         Limit::fixed_window(10_000, Micros::from_secs(86_400))?, // and 10 000 a day
//!     ])?,
//! )?;
//! match store.acquire(None, &per_user, b"user-42", 1).await {
//!     Ok(d) if d.is_allowed() => { /* serve */ }
//!     Ok(d) => { /* 429, Retry-After: d.retry_after */ }
//!     Err(e) => { /* Redis failed (DecideError::Unavailable): fail open or closed */ }
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
//! precomputed once per [`NamedPolicy`](rein_core::NamedPolicy), one `GET` and at most one
//! `SET ... PX` per decision ([`SCRIPTS`]; docs/redis.md, docs/performance.md).
//!
//! Other choices, each explained in docs/redis.md: `now` comes from Redis's `TIME` by
//! default (one clock for all servers); a policy's whole state is one key,
//! `prefix:v3:{sha1(user key)}:policy:0:algo` for one limit and
//! `prefix:v4:{sha1(user key)}:policy:algo+algo...` for several, so a Cluster slot
//! migration can never split a decision's state between two nodes (issue 22); every
//! written key expires when its limits are full again; a call that timed out is never
//! replayed, because it may have run.
//!
//! # What this crate does not do
//!
//! - **No failure policy.** When Redis is slow or down, calls return a typed
//!   [`StoreError`](rein_core::StoreError) (`Timeout`, `Connection`, ...), never a made-up
//!   decision. Failing open, closed or to a local limiter, circuit breaking and caching
//!   denials belong in the layer above every store: the `rein` crate's `ResilientLimiter`
//!   (docs/architecture.md).
//! - **No in-process limiting.** For limits that need not be shared between processes, use
//!   `rein-memory`: nanoseconds instead of a network round trip.
//! - **No retries of an unknown outcome.** A call is resent only after a reply that proves
//!   the script did not run: `NOSCRIPT` (resent as `EVAL`), and on a Cluster `MOVED`, `ASK`
//!   and transient states such as `TRYAGAIN` (followed within the call's deadline).
//! - **No other runtime than tokio.** Deadlines are tokio timers, and a store built with
//!   a connector reconnects in a spawned tokio task.
//!
//! [`RedisStore`] implements rein-core's [`Limiter`](rein_core::Limiter), the one trait
//! every way of deciding shares; its prepared policy is a [`RedisPolicy`].
//!
//! # Layout
//!
//! - `store.rs`: [`RedisStore`] and [`RedisStoreBuilder`]: encode, call, decode.
//! - `connect.rs`: constructors from URLs (standalone, Cluster, TLS, AUTH).
//! - `link.rs`: the connection, and replacing it through the caller's connector.
//! - `redirect.rs`: which failed replies are resent, and where (pure). `route.rs`: sending
//!   one attempt, to the slot or to a named Cluster node.
//! - `script.rs`: the scripts ([`SCRIPTS`]), their arguments and their reply.
//! - `key.rs`: key layout. `policy.rs`: [`RedisPolicy`]. `state.rs`: reading state back.
//! - `error.rs`: the errors only this store has (connecting, reading state, settings).
#![deny(missing_docs)]

mod admin;
mod coalesce;
mod connect;
mod endpoint;
mod error;
mod integer_window;
mod key;
mod link;
mod optimistic;
mod overrides;
mod policy;
mod redirect;
mod route;
mod script;
mod settings;
mod state;
mod store;
pub mod watch;

/// redis-rs, the client these stores are built on, at the version they use: its
/// connection types name a store (`RedisStore<client::aio::ConnectionManager>` is what
/// [`RedisStore::connect`] returns, to keep in a struct or an axum `State`), and its
/// `Client` makes a connection of your own for [`RedisStoreBuilder::build`] or
/// [`RedisStoreBuilder::connect_with`], with no `redis` dependency to keep in step.
pub use redis as client;

pub use coalesce::Coalesce;
pub use endpoint::{AnyConnection, Endpoint};
pub use error::{ConnectError, SettingsError, StateError};
pub use optimistic::{OptimisticStats, OptimisticStore, OptimisticStoreBuilder};
pub use overrides::DEFAULT_OVERRIDES_STALENESS;
pub use policy::RedisPolicy;
pub use script::{SCRIPT_SOURCE, SCRIPTS};
pub use store::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, MAX_DURATION, OverrideList, RedisStore,
    RedisStoreBuilder,
};

/// Checks a key prefix as [`RedisStoreBuilder::prefix`] will when the store connects: 1 to
/// 64 printable ASCII bytes, no spaces or braces ([`SettingsError::InvalidPrefix`]). For
/// configuration loaders that report every error before anything connects.
///
/// ```
/// assert!(rein_redis::check_key_prefix("myapp:rl").is_ok());
/// assert!(rein_redis::check_key_prefix("my{app}").is_err());
/// ```
pub fn check_key_prefix(prefix: &str) -> Result<(), SettingsError> {
    key::validate_prefix(prefix)
}
