//! The fixed window's boundary burst, and the limiters that prevent it: 100 requests at
//! 0:59 and 100 more at 1:00 against "100 per minute".
//!
//! A fixed window counts requests per calendar minute and resets the count when the minute
//! changes. A client that sends a full window's worth just before the boundary and another
//! just after gets two windows' worth through within a second or two: 200 where the limit
//! says 100 per minute. A token bucket of 100 refilled at 100 per minute admits the first
//! burst and then only what refilled in the second between (1 token); a sliding window
//! (the exact log, or the weighted two-window counter) looks back a whole minute from every
//! request, so the second burst finds the first one still inside it.
//!
//! In memory (`rein::memory::MemoryLimiter`), on an explicit clock: the decisions are
//! rein-core's, the same in Redis.
//!
//! Run: `cargo run -p rein-examples --bin fixed_window_boundary`
//!
//! Expected output:
//!
//! ```text
//! 100 requests at 0:59, 100 more at 1:00; every limiter allows 100 per minute
//! limiter                    at 0:59  at 1:00  admitted within 2 s
//! fixed window                   100      100                  200
//! token bucket                   100        1                  101
//! sliding window (log)           100        0                  100
//! sliding window (counter)       100        0                  100
//! ```

use rein::core::{Limit, Micros, Policy};
use rein::memory::MemoryLimiter;
use rein_examples::{DemoResult, at};

fn main() -> DemoResult {
    let minute = Micros::from_secs(60);
    let limiters = [
        ("fixed window", Limit::fixed_window(100, minute)?),
        ("token bucket", Limit::token_bucket(100, 100, minute)?),
        ("sliding window (log)", Limit::sliding_log(100, minute)?),
        (
            "sliding window (counter)",
            Limit::sliding_counter(100, minute)?,
        ),
    ];
    println!("100 requests at 0:59, 100 more at 1:00; every limiter allows 100 per minute");
    println!(
        "{:<26}{:>8} {:>8} {:>20}",
        "limiter", "at 0:59", "at 1:00", "admitted within 2 s"
    );
    for (name, limit) in limiters {
        let limiter = MemoryLimiter::<String>::new(Policy::single(limit));
        let mut admitted = [0u64; 2];
        for (burst, secs) in [59, 60].into_iter().enumerate() {
            for _ in 0..100 {
                if limiter.acquire_at(at(secs), "client", 1)?.is_allowed() {
                    admitted[burst] += 1;
                }
            }
        }
        let [first, second] = admitted;
        println!("{name:<26}{first:>8} {second:>8} {:>20}", first + second);
    }
    Ok(())
}
