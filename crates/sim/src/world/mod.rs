//! The world: N application nodes running rein-redis against one simulated Redis, in a
//! deterministic turmoil simulation, with scripted faults and an oracle.
//!
//! # How a run goes
//!
//! 1. A [`Scenario`] names everything: seed, node count, policy, [`Workload`], whether
//!    nodes pass their own (skewed) clocks or let Redis read its `TIME`
//!    ([`TimeSource`]), the network's latency, its [`Fault`]s, and optionally a [`Guard`]:
//!    rein's `ResilientLimiter` (failure policy, breaker, deny and allow caches) in
//!    front of each node's store.
//! 2. [`Scenario::run`] builds a turmoil world (epoch and RNG seed fixed), adds the Redis
//!    host (with a [`tap`](ScriptTap) noting when each script ran) and one client per
//!    node, and steps it, applying each fault between steps at its scheduled time.
//! 3. Every decision becomes an [`Event`] with true simulated instants; every admission
//!    goes into an [`AdmissionLog`](crate::oracle::AdmissionLog) at the instant it took
//!    effect. The [`Run`] checks it with the oracle against the bound the scenario's
//!    faults document ([`Scenario::allowance`]), renders it as a report row, and hashes the
//!    whole trace into a digest that two runs of one seed must share.
//!
//! # Layout
//!
//! - `scenario.rs`: [`Scenario`], its hosts and faults, [`Run`]. `runner.rs`: what every
//!   world shares (built, stepped to its end, read back as [`Recorded`]). `bound.rs`: the global bound with
//!   nodes on local fallback ([`fallback_limit`]).
//! - `node.rs`: an application node. `naive.rs`: the read-modify-write baseline limiter
//!   (read a bucket, decide on the client, write it back: racy across nodes).
//! - `workload.rs`: demand. `fault.rs`: faults. `tap.rs`: the Redis host with its tap.
//! - `overrides.rs`: per-key overrides an operator host changes during a run, and the
//!   per-window bound they are held to ([`OverrideBound`]).
//! - `clock.rs`: true and skewed time. `rng.rs`: the seeded generator.
//! - `suite.rs`: the default scenarios of the report.
//! - `region.rs`: several regions, a WAN, one limit ([`RegionScenario`]): one global Redis,
//!   a static split, a rebalanced quota, asynchronous counters (docs/multi-region.md).

mod bound;
mod clock;
mod fault;
mod naive;
mod node;
mod overrides;
mod region;
mod rng;
mod runner;
mod scenario;
mod suite;
mod tap;
mod workload;

use rein::{AllowCacheConfig, BreakerConfig, FailurePolicy, Source};
use rein_core::Timestamp;

pub use bound::{fallback_limit, fallback_policy};
pub use clock::{EPOCH_SECS, Skew};
pub use fault::Fault;
pub use naive::NaiveBucket;
pub use overrides::{OverrideBound, OverrideChange, OverrideSchedule, Written};
pub use region::{
    AsyncCounts, Cut, REGION_SUITE, Region, RegionRun, RegionScenario, Strategy, region_scenario,
};
pub use rng::Rng;
pub use runner::Recorded;
pub use scenario::{Run, Scenario};
pub use suite::{SUITE, suite_scenario};
pub use tap::{ScriptTap, tapped_host};
pub use workload::{Request, Workload};

/// Where a decision's `now` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSource {
    /// The script reads the simulated Redis's `TIME` (`RedisStore::acquire`): one clock.
    Server,
    /// Each node passes its own skewed clock (`RedisStore::acquire_at`).
    Client,
}

/// Which limiter the nodes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimiterKind {
    /// rein-redis's `RedisStore`, unmodified.
    Rein,
    /// A read-modify-write token bucket decided on the client ([`NaiveBucket`]): the
    /// baseline whose race rein's atomic script removes.
    Naive,
    /// rein's `LeasedLimiter` over the same `RedisStore` (no guard): hot keys are decided
    /// locally from blocks reserved in Redis (token buckets from rate shares), on the node's
    /// (skewed) clock. Its counters end up in [`Run::leases`].
    Leased,
    /// rein-redis's `OptimisticStore` (`WATCH`, read, decide in the client, `MULTI`/`EXEC`),
    /// one connection per node, retrying aborted transactions: the design whose retry storm
    /// under contention the simulator shows.
    Optimistic,
}

/// The resilience layer a node puts in front of its store (rein-redis's
/// `ResilientLimiter`), or none: the node then calls the store directly.
#[derive(Clone, Debug)]
pub struct Guard {
    /// What to answer when Redis gives no decision.
    pub on_failure: FailurePolicy,
    /// Whether the deny cache is on (the limiter's default).
    pub deny_cache: bool,
    /// The opt-in allow cache, if enabled.
    pub allow_cache: Option<AllowCacheConfig>,
    /// The circuit breaker's settings.
    pub breaker: BreakerConfig,
}

impl Guard {
    /// A guard with `on_failure`, the deny cache on, no allow cache, and the breaker's
    /// defaults.
    pub fn new(on_failure: FailurePolicy) -> Self {
        Self {
            on_failure,
            deny_cache: true,
            allow_cache: None,
            breaker: BreakerConfig::new(),
        }
    }
}

/// One decision a node made, at true simulated instants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The node, `0..nodes`.
    pub node: usize,
    /// The key.
    pub key: u64,
    /// The cost asked.
    pub cost: u64,
    /// When the node asked its limiter.
    pub issued: Timestamp,
    /// When the limiter answered.
    pub answered: Timestamp,
    /// What it answered.
    pub outcome: Outcome,
    /// Who decided: Redis, a cache or the failure policy (`None` for a failed call, and
    /// for the naive baseline).
    pub source: Option<Source>,
}

/// A SHA-1 over every decision (node, key, cost, instants, outcome, and who decided: Redis,
/// a cache or the failure policy, with why Redis gave no answer) in recording order: two
/// runs of one scenario must agree on it, byte for byte, and two runs that differ only in
/// where decisions came from must not. Both worlds' runs digest their events with it.
pub fn digest(events: &[Event]) -> String {
    use std::fmt::Write as _;
    let mut trace = String::new();
    for e in events {
        // Every field of the event, the source included: `Debug` of `Source` names the
        // variant and its `Unavailable` reason, which is what tells a fallback from a
        // cache or from Redis.
        let _ = writeln!(
            trace,
            "{} {} {} {} {} {:?} {:?}",
            e.node,
            e.key,
            e.cost,
            e.issued.as_micros(),
            e.answered.as_micros(),
            e.outcome,
            e.source
        );
    }
    sha1_smol::Sha1::from(trace).digest().to_string()
}

/// What a decision came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; `at` is when it took effect (for Redis, when the script ran).
    Admitted {
        /// The instant it took effect.
        at: Timestamp,
        /// `false` when the tap had no script run for this call and `at` is the answer's
        /// instant instead (never expected; counted by [`Run::untraced`]).
        traced: bool,
    },
    /// Denied.
    Denied,
    /// No decision: the limiter returned an error.
    Failed(Failure),
}

/// Why a decision failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The deadline passed.
    Timeout,
    /// Redis was unreachable or the connection broke.
    Connection,
    /// Anything else (a server error, an unexpected reply).
    Other,
}

/// The simulated Redis's host name.
pub const REDIS_HOST: &str = "redis";
/// The simulated Redis's port (no real socket is opened).
pub const REDIS_PORT: u16 = 6379;

/// The name of node `n` (its turmoil host's name when it has a host of its own).
pub fn node_name(n: usize) -> String {
    format!("node{n}")
}

/// The name of the turmoil host node `n` runs on, with `per_host` nodes to a host: the
/// node's own name when every node has a host, else `host{n / per_host}`.
pub fn host_name(n: usize, per_host: usize) -> String {
    match per_host {
        0 | 1 => node_name(n),
        _ => format!("host{}", n / per_host),
    }
}
