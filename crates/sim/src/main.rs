//! The project's main job. Until the scenario report lands, it replays seed 001's demo:
//! a bucket of 10 tokens refilled at 1 per second takes 12 requests in a burst, waits 5
//! seconds, then takes 5 more, and every decision is printed with its figures.
//!
//! Time is virtual (an explicit `Timestamp` advanced by the demo), so the "wait" costs
//! nothing and the output is the same on every run.

use rein_core::{Limit, Micros, Policy, Timestamp};

fn main() {
    let policy = match Limit::token_bucket(10, 1, Micros::from_secs(1)) {
        Ok(limit) => Policy::single(limit),
        Err(e) => {
            eprintln!("invalid demo policy: {e}");
            std::process::exit(2);
        }
    };
    let mut state = policy.new_state();
    let mut now = Timestamp::from_micros(1_700_000_000_000_000);
    println!("token bucket: capacity 10, refill 1 per second (seed 001)");
    println!(
        "{:>7}  {:>9}  {:>7}  {:>9}  {:>11}  {:>11}",
        "request", "t (s)", "allowed", "remaining", "retry_after", "reset_after"
    );
    let print = |n: u32, now: Timestamp, state: &mut rein_core::PolicyState, t: f64| match policy
        .acquire(now, state, 1)
    {
        Ok(d) => println!(
            "{n:>7}  {t:>9.3}  {:>7}  {:>9}  {:>10.3}s  {:>10.3}s",
            d.is_allowed(),
            d.remaining,
            d.retry_after.as_micros() as f64 / 1e6,
            d.reset_after.as_micros() as f64 / 1e6,
        ),
        Err(e) => println!("{n:>7}  {t:>9.3}  error: {e}"),
    };
    for n in 1..=12 {
        print(n, now, &mut state, 0.0);
    }
    println!("waiting 5 s for tokens to refill ...");
    now = now.saturating_add(Micros::from_secs(5));
    for n in 13..=17 {
        print(n, now, &mut state, 5.0);
    }
}
