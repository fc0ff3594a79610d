//! A sliding window of 5 requests per minute, hit 7 times in quick succession, in Redis:
//! 5 admitted, 2 denied.
//!
//! The pattern: a sorted set of request timestamps per client; drop the ones older than
//! the window, count the rest, admit if under the limit. rein's sliding log is that
//! algorithm, decided in one atomic script call (the check and the insert cannot be split
//! by another client), with each entry scored by the *server's* or the caller's clock in
//! microseconds, and with an exact `retry_after`: when the oldest entry leaves the window.
//! The requests here are 100 ms apart on an explicit clock, so the output is the same on
//! every run.
//!
//! Run: `cargo run -p rein-examples --bin sliding_window [redis-url]`
//!
//! Expected output:
//!
//! ```text
//! sliding window: 5 requests per minute, client user123, in Redis
//! Request 1 at 0.1 s: allowed (4 left)
//! Request 2 at 0.2 s: allowed (3 left)
//! Request 3 at 0.3 s: allowed (2 left)
//! Request 4 at 0.4 s: allowed (1 left)
//! Request 5 at 0.5 s: allowed (0 left)
//! Request 6 at 0.6 s: denied (retry in 59.5 s)
//! Request 7 at 0.7 s: denied (retry in 59.4 s)
//! 5 admitted, 2 denied
//! ```

use rein::core::{Limit, Limiter, Micros, Policy};
use rein::redis::RedisPolicy;
use rein_examples::{DemoResult, PREFIX, at_millis, delete_keys, describe, lua_store, redis_url};

#[tokio::main(flavor = "current_thread")]
async fn main() -> DemoResult {
    let url = redis_url();
    let store = lua_store(&url, PREFIX).await?;
    let policy = RedisPolicy::new(
        "sliding-5-per-minute",
        Policy::single(Limit::sliding_log(5, Micros::from_secs(60))?),
    )?;
    let client = "user123";
    delete_keys(&url, &store.keys(&policy, client)?).await?;

    println!("sliding window: 5 requests per minute, client {client}, in Redis");
    let (mut admitted, mut denied) = (0, 0);
    for i in 1..=7u64 {
        let decision = store
            .acquire(Some(at_millis(i * 100)), &policy, client.as_ref(), 1)
            .await?;
        if decision.is_allowed() {
            admitted += 1;
        } else {
            denied += 1;
        }
        println!("Request {i} at 0.{i} s: {}", describe(&decision));
    }
    println!("{admitted} admitted, {denied} denied");
    Ok(())
}
