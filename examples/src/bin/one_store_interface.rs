//! Two limiters behind one store interface, in memory and in Redis: a sliding window of 10
//! requests per minute and a token bucket of 10 refilled at 1 per second.
//!
//! The pattern: the limiters talk to a small store interface, so the same limiter runs on
//! an in-process store in tests and on Redis in production. Here the interface is the
//! `Store` trait below, with one implementation over `rein_memory::MemoryLimiter` and one
//! over `rein_redis::RedisStore`; both run rein-core's decisions, so every line printed for
//! memory is printed again, identical, for Redis (the program checks it). Unlike a
//! read-then-write over separate commands, the Redis side is one atomic script call per
//! decision, so two servers can never both take the last token.
//!
//! The clock is explicit: 12 requests at 0 s, one at 1 s, one at 60 s.
//!
//! Run: `cargo run -p rein-examples --bin one_store_interface [redis-url]`
//!
//! Expected output:
//!
//! ```text
//! memory / sliding window, 10 per minute
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 60 s
//!   at 1 s: denied (retry in 59 s)
//!   at 60 s: allowed (9 left)
//! memory / token bucket, 10 refilled at 1 per second
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 1 s
//!   at 1 s: allowed (0 left)
//!   at 60 s: allowed (9 left)
//! redis / sliding window, 10 per minute
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 60 s
//!   at 1 s: denied (retry in 59 s)
//!   at 60 s: allowed (9 left)
//! redis / token bucket, 10 refilled at 1 per second
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 1 s
//!   at 1 s: allowed (0 left)
//!   at 60 s: allowed (9 left)
//! memory and redis agree on every decision
//! ```

use std::error::Error;

use redis::aio::ConnectionManager;
use rein_core::{Decision, Limit, Micros, Policy, Timestamp};
use rein_examples::{DemoResult, MIN_TTL, PREFIX, at, delete_keys, describe, redis_url};
use rein_memory::MemoryLimiter;
use rein_redis::{NamedPolicy, RedisStore, RedisStoreBuilder};

/// The one interface the limiters use: a decision for `key` at `now`.
trait Store {
    async fn acquire_at(&self, now: Timestamp, key: &str) -> Result<Decision, Box<dyn Error>>;
}

/// In process: one `MemoryLimiter` per policy.
struct Memory(MemoryLimiter<String>);

/// In Redis: the shared store and the policy it applies.
struct Redis {
    store: RedisStore<ConnectionManager>,
    policy: NamedPolicy,
}

impl Store for Memory {
    async fn acquire_at(&self, now: Timestamp, key: &str) -> Result<Decision, Box<dyn Error>> {
        Ok(self.0.acquire_at(now, key, 1)?)
    }
}

impl Store for Redis {
    async fn acquire_at(&self, now: Timestamp, key: &str) -> Result<Decision, Box<dyn Error>> {
        Ok(self.store.acquire_at(now, &self.policy, key, 1).await?)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> DemoResult {
    let limiters = [
        (
            "sliding window, 10 per minute",
            "sliding-10-per-minute",
            Limit::sliding_log(10, Micros::from_secs(60))?,
        ),
        (
            "token bucket, 10 refilled at 1 per second",
            "bucket-10-1ps",
            Limit::token_bucket(10, 1, Micros::from_secs(1))?,
        ),
    ];
    let user = "user-123";
    let url = redis_url();
    let redis = RedisStoreBuilder::new()
        .prefix(PREFIX)
        .min_ttl(MIN_TTL)
        .connect(&url)
        .await?;

    let mut memory_lines = Vec::new();
    for (title, _, limit) in &limiters {
        let store = Memory(MemoryLimiter::new(Policy::single(*limit)));
        memory_lines.push(run(&format!("memory / {title}"), &store, user).await?);
    }
    let mut redis_lines = Vec::new();
    for (title, name, limit) in &limiters {
        let policy = NamedPolicy::new(*name, Policy::single(*limit))?;
        delete_keys(&url, &redis.keys(&policy, user)?).await?;
        let store = Redis {
            store: redis.clone(),
            policy,
        };
        redis_lines.push(run(&format!("redis / {title}"), &store, user).await?);
    }
    for lines in memory_lines.iter().chain(&redis_lines) {
        println!("{}", lines.join("\n"));
    }
    // The same lines after the backend's name: the same decisions.
    let strip = |blocks: &[Vec<String>]| -> Vec<String> {
        blocks
            .iter()
            .flat_map(|b| b.iter().skip(1).cloned())
            .collect()
    };
    if strip(&memory_lines) != strip(&redis_lines) {
        return Err("memory and redis disagree".into());
    }
    println!("memory and redis agree on every decision");
    Ok(())
}

/// The scenario, on any store: a burst of 12 at 0 s, then one request at 1 s and at 60 s.
async fn run(title: &str, store: &impl Store, user: &str) -> Result<Vec<String>, Box<dyn Error>> {
    let mut lines = vec![title.to_owned()];
    let (mut allowed, mut denied, mut first_denial) = (0, 0, None);
    for _ in 0..12 {
        let decision = store.acquire_at(at(0), user).await?;
        if decision.is_allowed() {
            allowed += 1;
        } else {
            denied += 1;
            first_denial.get_or_insert(decision);
        }
    }
    let first = first_denial.map_or_else(|| "none".to_owned(), |d| describe(&d));
    let first = first.trim_start_matches("denied (").trim_end_matches(')');
    lines.push(format!(
        "  at 0 s, 12 requests: {allowed} allowed, {denied} denied, first denial: {first}"
    ));
    for secs in [1, 60] {
        let decision = store.acquire_at(at(secs), user).await?;
        lines.push(format!("  at {secs} s: {}", describe(&decision)));
    }
    Ok(lines)
}
