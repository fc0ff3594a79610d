//! A token bucket of 10 refilled at 1 per second, in Redis: 12 requests in quick succession,
//! a 5-second pause, then 5 more. Requests 1–10 are admitted, 11 and 12 denied, and the
//! pause refills exactly 5 tokens, so 13–17 are admitted.
//!
//! The pattern is the optimistic transaction: `WATCH` the bucket, read it, compute the
//! refill, `MULTI … EXEC`, retry if another client wrote first. Both of rein's Redis stores
//! run the same demo side by side and must agree: the optimistic store (that pattern, done
//! with an exclusive connection per call, the server's clock, bounded jittered retries and
//! no write on a denial) and the default Lua store (one atomic script call, no retries).
//! The pause is 5 s on an explicit clock rather than a sleep, so the output is exact.
//!
//! Run: `cargo run -p rein-examples --bin token_bucket_burst [redis-url]`
//!
//! Expected output:
//!
//! ```text
//! token bucket: 10 tokens, refilled at 1 per second, client user123, in Redis
//! request     optimistic store        Lua store
//! Request 1:  allowed (9 left)        allowed (9 left)
//! Request 2:  allowed (8 left)        allowed (8 left)
//! Request 3:  allowed (7 left)        allowed (7 left)
//! Request 4:  allowed (6 left)        allowed (6 left)
//! Request 5:  allowed (5 left)        allowed (5 left)
//! Request 6:  allowed (4 left)        allowed (4 left)
//! Request 7:  allowed (3 left)        allowed (3 left)
//! Request 8:  allowed (2 left)        allowed (2 left)
//! Request 9:  allowed (1 left)        allowed (1 left)
//! Request 10: allowed (0 left)        allowed (0 left)
//! Request 11: denied (retry in 1 s)   denied (retry in 1 s)
//! Request 12: denied (retry in 1 s)   denied (retry in 1 s)
//! Waiting 5 s for the bucket to refill...
//! Request 13: allowed (4 left)        allowed (4 left)
//! Request 14: allowed (3 left)        allowed (3 left)
//! Request 15: allowed (2 left)        allowed (2 left)
//! Request 16: allowed (1 left)        allowed (1 left)
//! Request 17: allowed (0 left)        allowed (0 left)
//! ```

use rein::core::{Limit, Limiter, Micros, Policy, Timestamp};
use rein::redis::RedisPolicy;
use rein_examples::{
    DemoResult, PREFIX, at, delete_keys, describe, lua_store, optimistic_store, redis_url,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> DemoResult {
    let url = redis_url();
    // Each store under its own prefix, so each has its own bucket: on one prefix they
    // would share it (they read and write the same values).
    let optimistic = optimistic_store(&url, &format!("{PREFIX}:occ")).await?;
    let lua = lua_store(&url, PREFIX).await?;
    let policy = RedisPolicy::new(
        "bucket-10-1ps",
        Policy::single(Limit::token_bucket(10, 1, Micros::from_secs(1))?),
    )?;
    let client = "user123";
    let mut keys = optimistic.keys(&policy, client)?;
    keys.extend(lua.keys(&policy, client)?);
    delete_keys(&url, &keys).await?;

    println!("token bucket: 10 tokens, refilled at 1 per second, client {client}, in Redis");
    println!("{:<12}{:<24}Lua store", "request", "optimistic store");
    // Twelve requests at the start, five more after a 5-second pause.
    let schedule = (1..=12)
        .map(|i| (i, at(0)))
        .chain((13..=17).map(|i| (i, at(5))));
    for (i, now) in schedule {
        if i == 13 {
            println!("Waiting 5 s for the bucket to refill...");
        }
        let (a, b) = both(&optimistic, &lua, now, &policy, client).await?;
        let label = format!("Request {i}:");
        println!("{label:<12}{:<24}{}", describe(&a), describe(&b));
        if a != b {
            return Err(format!("the stores disagree on request {i}: {a:?} vs {b:?}").into());
        }
    }
    Ok(())
}

async fn both(
    optimistic: &rein::redis::OptimisticStore,
    lua: &rein::redis::RedisStore<rein::redis::client::aio::ConnectionManager>,
    now: Timestamp,
    policy: &RedisPolicy,
    client: &str,
) -> Result<(rein::core::Decision, rein::core::Decision), Box<dyn std::error::Error>> {
    let a = optimistic
        .acquire(Some(now), policy, client.as_bytes(), 1)
        .await?;
    let b = lua.acquire(Some(now), policy, client.as_bytes(), 1).await?;
    Ok((a, b))
}
