//! Three methods side by side, in Redis: a token bucket, a fixed window counter and a
//! sliding window, each allowing 5 requests per 10 seconds, fed the same requests.
//!
//! - **Token bucket** (5 tokens, 1 back every 2 s): smooth rate with bursts up to the
//!   bucket size; more state and arithmetic.
//! - **Fixed window counter** (5 per calendar 10 s): the simplest (a counter per window),
//!   but a burst at the end of one window and another at the start of the next both pass.
//! - **Sliding window** (the exact log, 5 in any 10 s): strict "last N seconds" semantics;
//!   one entry stored per admitted request.
//!
//! The last line is the lesson: the most requests admitted within any 10 seconds. The
//! fixed window let 9 through between 8 s and 10 s (the bursts on both sides of its
//! boundary); the sliding window never more than 5; the token bucket 7, by design: "5 per
//! 10 s" for a bucket is a rate (1 per 2 s) plus a burst allowance (5), not a cap per
//! window.
//!
//! All three are rein-core's algorithms decided by rein's one Lua script, each call
//! atomic (check and consume cannot be split by another client), with keys that expire when
//! their limit is full again. The clock is explicit, so the output is exact.
//!
//! Run: `cargo run -p rein-examples --bin three_methods [redis-url]`
//!
//! Expected output:
//!
//! ```text
//! 5 requests per 10 s, client user:1001, in Redis
//! time      token bucket             fixed window             sliding window
//! 0 s       allowed (4 left)         allowed (4 left)         allowed (4 left)
//! 8 s       allowed (4 left)         allowed (3 left)         allowed (3 left)
//! 8 s       allowed (3 left)         allowed (2 left)         allowed (2 left)
//! 8 s       allowed (2 left)         allowed (1 left)         allowed (1 left)
//! 8 s       allowed (1 left)         allowed (0 left)         allowed (0 left)
//! 10 s      allowed (1 left)         allowed (4 left)         allowed (0 left)
//! 10 s      allowed (0 left)         allowed (3 left)         denied (retry in 8 s)
//! 10 s      denied (retry in 2 s)    allowed (2 left)         denied (retry in 8 s)
//! 10 s      denied (retry in 2 s)    allowed (1 left)         denied (retry in 8 s)
//! 10 s      denied (retry in 2 s)    allowed (0 left)         denied (retry in 8 s)
//! 12 s      allowed (0 left)         denied (retry in 8 s)    denied (retry in 6 s)
//! 18 s      allowed (2 left)         denied (retry in 2 s)    allowed (3 left)
//! 18 s      allowed (1 left)         denied (retry in 2 s)    allowed (2 left)
//! 20 s      allowed (1 left)         allowed (4 left)         allowed (2 left)
//! admitted  11 of 14                 11 of 14                 9 of 14
//! max/10 s  7                        9                        5
//! ```

use rein::core::{Limit, Limiter, Micros, Policy};
use rein::redis::RedisPolicy;
use rein_examples::{DemoResult, PREFIX, at, delete_keys, describe, lua_store, redis_url};

#[tokio::main(flavor = "current_thread")]
async fn main() -> DemoResult {
    let url = redis_url();
    let store = lua_store(&url, PREFIX).await?;
    let window = Micros::from_secs(10);
    let methods = [
        RedisPolicy::new(
            "token-bucket",
            Policy::single(Limit::token_bucket(5, 1, Micros::from_secs(2))?),
        )?,
        RedisPolicy::new(
            "fixed-window",
            Policy::single(Limit::fixed_window(5, window)?),
        )?,
        RedisPolicy::new(
            "sliding-window",
            Policy::single(Limit::sliding_log(5, window)?),
        )?,
    ];
    let client = "user:1001";
    for policy in &methods {
        delete_keys(&url, &store.keys(policy, client)?).await?;
    }

    println!("5 requests per 10 s, client {client}, in Redis");
    println!(
        "{:<10}{:<25}{:<25}sliding window",
        "time", "token bucket", "fixed window"
    );
    // One early request, a burst at the end of the first calendar window and another at
    // the start of the next, then a few stragglers.
    let times = [0, 8, 8, 8, 8, 10, 10, 10, 10, 10, 12, 18, 18, 20];
    let mut admitted: [Vec<u64>; 3] = Default::default();
    for secs in times {
        let mut line = format!("{:<10}", format!("{secs} s"));
        for (i, policy) in methods.iter().enumerate() {
            let decision = store
                .acquire(Some(at(secs)), policy, client.as_bytes(), 1)
                .await?;
            if decision.is_allowed() {
                admitted[i].push(secs);
            }
            let cell = describe(&decision);
            if i + 1 < methods.len() {
                line.push_str(&format!("{cell:<25}"));
            } else {
                line.push_str(&cell);
            }
        }
        println!("{line}");
    }
    let n = times.len();
    let [a, b, c] = admitted.each_ref().map(|t| format!("{} of {n}", t.len()));
    println!("{:<10}{a:<25}{b:<25}{c}", "admitted");
    let [a, b, c] = admitted
        .each_ref()
        .map(|t| most_in_any_window(t, 10).to_string());
    println!("{:<10}{a:<25}{b:<25}{c}", "max/10 s");
    Ok(())
}

/// The most admissions in any span of `window` seconds, `(t - window, t]`.
fn most_in_any_window(admitted: &[u64], window: u64) -> usize {
    admitted
        .iter()
        .map(|&end| {
            admitted
                .iter()
                .filter(|&&t| t <= end && t + window > end)
                .count()
        })
        .max()
        .unwrap_or(0)
}
