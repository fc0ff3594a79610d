//! The optimistic-transaction store against the Lua store, same private server, same run.
//!
//! For 1, 8 and 64 concurrent tasks, on one hot key and spread over 10 000 keys, each store
//! decides for a fixed time and the bench reports decisions/s, retries (aborted `EXEC`s)
//! per decision, the share of calls that got no decision (`Contended` or `Timeout`), and
//! p50/p99 latency per call. Rounds alternate between the two stores so both see the same
//! machine load; the table shows the median round, and the optimistic store's rate as a
//! ratio to the Lua store's taken round by round (median and spread).
//!
//! The policy is one token bucket that always admits (10^6 per second), so every call
//! writes: the path on which the optimistic store pays its second round trip and its
//! conflicts. Both stores use their default settings (deadline 50 ms; the optimistic store
//! 8 attempts and 1–8 ms backoff) except the optimistic store's pool, sized to the task
//! count so that no task waits for a connection. The Lua store shares one multiplexed
//! connection, as in production. One client thread (current-thread runtime), as in
//! benches/redis.rs.
//!
//! Run: `cargo bench -p rein-benches --bench optimistic` (`REIN_BENCH_SECS`, default 2,
//! sets the seconds per round; `REIN_BENCH_OCC_ATTEMPTS`, default 8, the optimistic
//! store's `max_attempts`; `REIN_BENCH_ONE_KEY=1` runs only the one-key rows).

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use rein_benches::Ratio;
use rein_core::{Limit, Limiter, Micros, Policy};
use rein_redis::{
    OptimisticStore, OptimisticStoreBuilder, RedisPolicy, RedisStore, RedisStoreBuilder,
};
use rein_redis_harness::RedisServer;

const ROUNDS: usize = 3;
const SPREAD_KEYS: u64 = 10_000;

fn main() {
    let Some(run) = rein_benches::bench_run("optimistic", 2) else {
        return;
    };
    let attempts = rein_benches::env_number("REIN_BENCH_OCC_ATTEMPTS", 8);
    let attempts = NonZeroU32::new(attempts).expect("REIN_BENCH_OCC_ATTEMPTS > 0");
    let one_key_only = std::env::var_os("REIN_BENCH_ONE_KEY").is_some_and(|v| v != "0");
    let server = RedisServer::start().expect("start redis-server");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let limit = Limit::token_bucket(1_000_000, 1_000_000, Micros::from_secs(1)).expect("valid");
    let policy = Arc::new(RedisPolicy::new("bench", Policy::single(limit)).expect("valid name"));
    let lua = rt.block_on(async {
        let client = redis::Client::open(server.url()).expect("client");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        RedisStoreBuilder::new().build(conn).expect("store")
    });

    println!();
    println!("Optimistic (WATCH/MULTI/EXEC) vs Lua store, one private redis-server, same run");
    println!(
        "median of {ROUNDS} alternating rounds of {} s; token bucket always admitting",
        run.as_secs()
    );
    println!("optimistic store: max_attempts {attempts}");
    println!();
    println!(
        "| keys | tasks | store | decisions/s | vs Lua, per round: median (spread) | \
         retries/decision | no decision | p50 µs | p99 µs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let spreads: &[bool] = if one_key_only {
        &[false]
    } else {
        &[false, true]
    };
    for &spread in spreads {
        for tasks in [1usize, 8, 64] {
            let occ = rt.block_on(async {
                OptimisticStoreBuilder::new()
                    .max_connections(NonZeroUsize::new(tasks).expect("tasks > 0"))
                    .max_attempts(attempts)
                    .rng_seed(2026)
                    .connect(&server.url())
                    .await
                    .expect("connect")
            });
            let stores = [Store::Lua(lua.clone()), Store::Occ(occ)];
            let mut rounds: [Vec<Round>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..ROUNDS {
                for (store, rounds) in stores.iter().zip(&mut rounds) {
                    rounds.push(rt.block_on(measure(store, &policy, tasks, spread, run)));
                }
            }
            let keys = if spread { "10 000" } else { "1" };
            // The two stores alternate: each round's ratio compares runs seconds apart.
            let rates = |rounds: &[Round]| rounds.iter().map(|r| r.rps).collect::<Vec<_>>();
            let vs_lua = [
                Ratio::of(&rates(&rounds[0]), &rates(&rounds[0])),
                Ratio::of(&rates(&rounds[1]), &rates(&rounds[0])),
            ];
            for ((name, rounds), vs_lua) in ["Lua (EVALSHA)", "optimistic"]
                .iter()
                .zip(&mut rounds)
                .zip(vs_lua)
            {
                rounds.sort_by(|a, b| a.rps.total_cmp(&b.rps));
                let r = &rounds[rounds.len() / 2];
                println!(
                    "| {keys} | {tasks} | {name} | {:.0} | {vs_lua} | {:.2} | {:.1} % | {:.0} | \
                     {:.0} |",
                    r.rps,
                    r.retries_per_decision,
                    r.failed_share * 100.0,
                    r.p50_us,
                    r.p99_us
                );
            }
        }
    }
}

#[derive(Clone)]
enum Store {
    Lua(RedisStore<MultiplexedConnection>),
    Occ(OptimisticStore),
}

struct Round {
    rps: f64,
    retries_per_decision: f64,
    failed_share: f64,
    p50_us: f64,
    p99_us: f64,
}

/// `tasks` tasks deciding for `run`; a decision is any `Ok` (all are admissions here).
async fn measure(
    store: &Store,
    policy: &Arc<RedisPolicy>,
    tasks: usize,
    spread: bool,
    run: Duration,
) -> Round {
    let conflicts_before = match store {
        Store::Occ(s) => s.stats().conflicts,
        Store::Lua(_) => 0,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let started = Instant::now();
    for task in 0..tasks as u64 {
        let (store, policy, stop) = (store.clone(), policy.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let mut key = task.wrapping_mul(0x9e37_79b9_7f4a_7c15) % SPREAD_KEYS;
            let (mut latencies, mut failed) = (Vec::new(), 0u64);
            while !stop.load(Ordering::Relaxed) {
                key = if spread {
                    (key + 7_919) % SPREAD_KEYS
                } else {
                    0
                };
                let t = Instant::now();
                let ok = match &store {
                    Store::Lua(s) => s
                        .acquire(None, &policy, key.to_le_bytes().as_ref(), 1)
                        .await
                        .is_ok(),
                    Store::Occ(s) => s
                        .acquire(None, &policy, key.to_le_bytes().as_ref(), 1)
                        .await
                        .is_ok(),
                };
                latencies.push(t.elapsed());
                failed += u64::from(!ok);
            }
            (latencies, failed)
        }));
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut failed = 0;
    for handle in handles {
        let (l, f) = handle.await.expect("task");
        latencies.extend(l);
        failed += f;
    }
    let elapsed = started.elapsed();
    let calls = latencies.len() as u64;
    let decisions = calls - failed;
    let conflicts = match store {
        Store::Occ(s) => s.stats().conflicts - conflicts_before,
        Store::Lua(_) => 0,
    };
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Round {
        rps: decisions as f64 / elapsed.as_secs_f64(),
        retries_per_decision: conflicts as f64 / decisions.max(1) as f64,
        failed_share: failed as f64 / calls.max(1) as f64,
        p50_us: at(0.50),
        p99_us: at(0.99),
    }
}
