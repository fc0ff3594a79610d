//! Two limiters behind one store interface, in memory and in Redis: a sliding window of 10
//! requests per minute and a token bucket of 10 refilled at 1 per second.
//!
//! The pattern: the limiters talk to a small store interface, so the same limiter runs on
//! an in-process store in tests and on Redis in production. rein's interface is the
//! `rein::core::Limiter` trait (prepare a named policy once, then `acquire`, `peek`,
//! `refund`), and the scenario below is one generic function run on three implementations:
//! `rein::memory::MemoryStore`, `rein::redis::RedisStore` (one atomic script call per
//! decision) and `rein::redis::OptimisticStore` (`WATCH`, read, decide, `MULTI … EXEC`).
//! All three decide with rein-core, so every block prints the same lines, which the program
//! checks. Unlike a read-then-write over separate commands, neither Redis store lets two
//! servers take the last token.
//!
//! The clock is explicit: 12 requests at 0 s, one at 1 s, one at 60 s.
//!
//! Run: `cargo run -p rein-examples --bin one_store_interface [redis-url]`
//!
//! Expected output:
//!
//! ```text
//! memory / sliding-10-per-minute
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 60 s
//!   at 1 s: denied (retry in 59 s)
//!   at 60 s: allowed (9 left)
//! memory / bucket-10-1ps
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 1 s
//!   at 1 s: allowed (0 left)
//!   at 60 s: allowed (9 left)
//! redis (Lua script) / sliding-10-per-minute
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 60 s
//!   at 1 s: denied (retry in 59 s)
//!   at 60 s: allowed (9 left)
//! redis (Lua script) / bucket-10-1ps
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 1 s
//!   at 1 s: allowed (0 left)
//!   at 60 s: allowed (9 left)
//! redis (optimistic) / sliding-10-per-minute
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 60 s
//!   at 1 s: denied (retry in 59 s)
//!   at 60 s: allowed (9 left)
//! redis (optimistic) / bucket-10-1ps
//!   at 0 s, 12 requests: 10 allowed, 2 denied, first denial: retry in 1 s
//!   at 1 s: allowed (0 left)
//!   at 60 s: allowed (9 left)
//! all three stores agree on every decision
//! ```

use std::error::Error;

use rein::core::{Limit, Limiter, Micros, NamedPolicy, Policy};
use rein::memory::MemoryStore;
use rein_examples::{
    DemoResult, PREFIX, at, delete_keys, describe, lua_store, optimistic_store, redis_url,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> DemoResult {
    let limiters = [
        NamedPolicy::new(
            "sliding-10-per-minute",
            Policy::single(Limit::sliding_log(10, Micros::from_secs(60))?),
        )?,
        NamedPolicy::new(
            "bucket-10-1ps",
            Policy::single(Limit::token_bucket(10, 1, Micros::from_secs(1))?),
        )?,
    ];
    let user = "user-123";
    let url = redis_url();
    // The two Redis stores under their own prefixes: on one prefix they would share the
    // limits (they read and write the same values).
    let redis = lua_store(&url, &format!("{PREFIX}:lua")).await?;
    let optimistic = optimistic_store(&url, &format!("{PREFIX}:occ")).await?;
    for policy in &limiters {
        let prepared = redis.prepare(policy)?;
        let mut keys = redis.keys(&prepared, user)?;
        keys.extend(optimistic.keys(&prepared, user)?);
        delete_keys(&url, &keys).await?;
    }

    let mut blocks = Vec::new();
    for policy in &limiters {
        blocks.push(run("memory", &MemoryStore::new(), policy, user).await?);
    }
    for policy in &limiters {
        blocks.push(run("redis (Lua script)", &redis, policy, user).await?);
    }
    for policy in &limiters {
        blocks.push(run("redis (optimistic)", &optimistic, policy, user).await?);
    }
    for lines in &blocks {
        println!("{}", lines.join("\n"));
    }
    // The same lines after each block's title: the same decisions on every store.
    let decisions = |block: &[String]| block[1..].to_vec();
    for (i, block) in blocks.iter().enumerate() {
        if decisions(block) != decisions(&blocks[i % limiters.len()]) {
            return Err(format!("{} disagrees with memory", block[0]).into());
        }
    }
    println!("all three stores agree on every decision");
    Ok(())
}

/// The scenario, on any store: a burst of 12 at 0 s, then one request at 1 s and at 60 s.
async fn run(
    store_name: &str,
    store: &impl Limiter,
    policy: &NamedPolicy,
    user: &str,
) -> Result<Vec<String>, Box<dyn Error>> {
    let prepared = store.prepare(policy)?;
    let mut lines = vec![format!("{store_name} / {}", policy.name())];
    let (mut allowed, mut denied, mut first_denial) = (0, 0, None);
    for _ in 0..12 {
        let decision = store
            .acquire(Some(at(0)), &prepared, user.as_bytes(), 1)
            .await?;
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
        let decision = store
            .acquire(Some(at(secs)), &prepared, user.as_bytes(), 1)
            .await?;
        lines.push(format!("  at {secs} s: {}", describe(&decision)));
    }
    Ok(lines)
}
