//! rein-memory: rein's rate limits for many keys, kept in this process's memory.
//!
//! An application reaches this crate as `rein::memory`, through its one dependency `rein`;
//! the examples here name it `rein_memory` and rein-core `rein_core` (`rein::core`).
//!
//! # Where to start
//! - [`MemoryLimiter`]: one policy over many keys, decided synchronously; the fastest path.
//! - [`MemoryStore`]: rein-core's `Limiter` (and `Leasable`, `KeyAdmin`) in process, for
//!   any policy it prepares: what `rein::ResilientLimiter`, the HTTP layer and tests run
//!   over when the limit is one process's.
//!
//! [`MemoryLimiter`] applies one [`rein_core::Policy`] to any number of keys (client IPs,
//! API tokens, user ids), each with its own state, and decides with rein-core's exact
//! math: its answers are the ones [`Policy::acquire`](rein_core::Policy::acquire) gives on
//! one state per key, under any number of threads. It takes `now` explicitly
//! (`acquire_at`) or reads a [`Clock`] (`acquire`), so the same store serves a server, a
//! test with a [`FakeClock`], and the local fallback of rein-redis when Redis is away.
//!
//! What it does not do: share limits between processes. Each process that uses it admits
//! the full policy on its own, so N replicas admit N times the limit. Use [`rein-redis`]
//! when the limit is global. It does not wait either: a denial says when to retry
//! ([`Decision::retry_after`](rein_core::Decision::retry_after)), and sleeping is the
//! caller's choice.
//!
//! # Design
//! - **Sharded locks, not atomics.** Keys are spread over a power-of-two number of shards,
//!   each a `std::sync::Mutex` around a hashbrown table hashed with foldhash. A state is
//!   updated under its shard's lock, which is what makes it exact for every algorithm,
//!   including the sliding log whose state is a queue; a lock-free compare-and-swap would
//!   only fit the 8- and 16-byte states, and still needs a lock around the table. The
//!   critical section is one probe and one decision, with no await. A one-limit policy's
//!   keys store the algorithm's own state (8 to 40 bytes, not a 64-byte `PolicyState`),
//!   because a random probe into a big table costs a cache miss per slot touched.
//!   docs/performance.md measures it against governor's DashMap of atomics.
//! - **Bounded memory.** At most `max_keys` keys are stored. A key whose state is full is
//!   the same as an absent one, so a full shard first drops those for free, and only then
//!   evicts the keys nearest to full (soonest full again, then, since every key of one
//!   fixed window is full again at its end, those that used least), an eighth of the shard
//!   at a time. See
//!   [`MemoryLimiter`] for the per-key cost and for what eviction gives up.
//! - **Time is an input.** Every decision has an `_at(now, …)` form; the clock is an
//!   adapter: [`SystemClock`] (the default, `SystemTime::now()`), [`QuantaClock`] (the wall
//!   clock once, then the CPU's counter: 2-3× cheaper to read, see its doc for the price)
//!   and [`FakeClock`] for tests. A clock that goes backwards never admits more than its
//!   latest reading would have, even for keys that were dropped meanwhile.
//!
//! ```
//! use rein_core::{Limit, Micros, Policy};
//! use rein_memory::MemoryLimiter;
//!
//! let policy = Policy::new([
//!     Limit::token_bucket(10, 10, Micros::from_secs(1))?, // 10/s, bursts of 10
//!     Limit::fixed_window(1_000, Micros::from_secs(3_600))?, // and 1000 an hour
//! ])?;
//! let limiter = MemoryLimiter::<String>::new(policy);
//! let decision = limiter.acquire("api-key-123", 1)?;
//! assert!(decision.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`rein-redis`]: https://docs.rs/rein-redis
#![deny(missing_docs)]

mod block;
mod clock;
mod limiter;
mod overrides;
mod rate;
mod rule;
mod shard;
mod store;

pub use clock::{Clock, FakeClock, QuantaClock, SystemClock};
pub use limiter::{MemoryLimiter, MemoryLimiterBuilder};
pub use store::{MemoryPolicy, MemoryStore};
