//! rein-redis end to end, against the ceiling of the same Redis running the same script.
//!
//! Starts a private `redis-server`, then measures, alternating rounds so that both sides see
//! the same machine load:
//!
//! - **throughput**: rein-redis with one multiplexed connection and 64 concurrent tasks on a
//!   single-threaded runtime (one client core, as `redis-benchmark` has), against
//!   `redis-benchmark -P 32 -c 50` sending `EVALSHA` of rein's script with the same KEYS
//!   shape and ARGV. The ratio is the share of the server's script ceiling rein reaches
//!   (goal ≥ 0.9).
//! - **latency**: one task deciding sequentially, p50 and p99, against
//!   `redis-benchmark -c 1` on the same script (goal ≤ 1.2×).
//! - **per algorithm** (token bucket, fixed window, sliding log), the same 64 tasks on one
//!   multiplexed connection each way: rein-redis as shipped (coalescing concurrent
//!   decisions into shared calls), rein-redis with `Coalesce::OFF`, bare redis-rs calling
//!   rein's script once per decision with `Script::invoke_async` (the client's peer: goal
//!   ≤ 1.2× its client CPU), and bare redis-rs calling the naive script once per decision
//!   (the server's peer: server CPU per decision, goal ≥ 1.2× cheaper for the token bucket,
//!   ≥ 1.0× for the others), with the script calls per decision (`INFO commandstats`).
//!
//! The policies always admit, over 100 000 user keys, so every call reads, writes and sets
//! a TTL. Set `REIN_BENCH_SECS` to change the measuring time per round (default 3), and
//! `REIN_BENCH_COALESCE=<in_flight>,<batch>` to try other coalescing settings, and
//! `REIN_BENCH_ONLY=<script>` (`token_bucket`, `fixed_window` or `sliding_log`) to measure one
//! algorithm's rows alone. Not a criterion bench: the comparison needs both clients measured
//! the same way, by wall clock over a fixed run.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rein_benches::naive::{NAIVE_FIXED_WINDOW, NAIVE_SLIDING_LOG, NAIVE_TOKEN_BUCKET};
use rein_benches::{Ratio, median};
use rein_core::{Algorithm, Limit, Limiter, Micros, Policy};
use rein_redis::{Coalesce, RedisPolicy, RedisStore, RedisStoreBuilder, SCRIPTS};
use rein_redis_harness::RedisServer;

const TASKS: usize = 64;
const KEYS: u64 = 100_000;
const ROUNDS: usize = 3;

fn main() {
    let Some(measure) = rein_benches::bench_run("redis", 3) else {
        return;
    };
    let secs = measure.as_secs();
    let server = RedisServer::start().expect("start redis-server");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    // `REIN_BENCH_COALESCE=<in_flight>,<batch>` tries other settings than the default.
    let coalesce = std::env::var("REIN_BENCH_COALESCE")
        .ok()
        .and_then(|v| {
            let (in_flight, batch) = v.split_once(',')?;
            Some(Coalesce {
                in_flight: in_flight.trim().parse().ok()?,
                batch: batch.trim().parse().ok()?,
            })
        })
        .unwrap_or_default();
    println!("coalescing: {coalesce:?}");
    let limit = Limit::token_bucket(1_000_000, 1_000_000, Micros::from_secs(1)).expect("valid");
    let policy = Arc::new(RedisPolicy::new("bench", Policy::single(limit)).expect("valid name"));
    let store = rt.block_on(store_over(&server, coalesce));
    let sha: String = rt
        .block_on(async {
            let client = redis::Client::open(server.url())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            // A policy of one token bucket runs the lean token-bucket script.
            let (_, source) = SCRIPTS
                .iter()
                .find(|(name, _)| *name == "token_bucket")
                .ok_or_else(|| redis::RedisError::from((redis::ErrorKind::Client, "no script")))?;
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(*source)
                .query_async(&mut conn)
                .await
        })
        .expect("SCRIPT LOAD");
    let Limit::TokenBucket(bucket) = limit else {
        unreachable!("built as a token bucket")
    };
    let (units_per_token, units_per_micro) = bucket.emission_interval();
    let tolerance = bucket.capacity() * units_per_token;
    // The same KEYS and ARGV the store sends for one decision: now ('' = TIME), min_ttl,
    // the parameters RedisPolicy precomputes for the lean script, then the operation and
    // cost (v3 key layout).
    let script_args: Vec<String> = ["1", "rein:v3:{__rand_int__}:bench:0:tb", "", "0"]
        .iter()
        .map(|s| s.to_string())
        .chain(
            [
                bucket.capacity(),
                units_per_token,
                units_per_micro,
                tolerance / units_per_micro,
                tolerance % units_per_micro,
            ]
            .map(|n| n.to_string()),
        )
        .chain(["acquire", "1"].map(str::to_owned))
        .collect();

    let server_pid: String = rt
        .block_on(async {
            let client = redis::Client::open(server.url())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("INFO")
                .arg("server")
                .query_async::<String>(&mut conn)
                .await
        })
        .expect("INFO server")
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .map(|pid| pid.trim().to_owned())
        .expect("process_id in INFO");

    // Warm up both: connections, script cache, 100k keys written.
    rt.block_on(rein_throughput(&store, &policy, Duration::from_secs(1)));
    let warm = ["-P", "32", "-c", "50", "-n", "100000"];
    redis_benchmark(&server, &sha, &script_args, &warm);

    let bare_conn = rt.block_on(async {
        let client = redis::Client::open(server.url()).expect("client");
        client
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    });
    // `REIN_BENCH_ONLY=<script>` (token_bucket, fixed_window, sliding_log) measures that
    // algorithm's rows alone.
    let only = std::env::var("REIN_BENCH_ONLY").ok();
    if only.is_none() {
        let mut rein = Vec::new();
        let mut ceiling = Vec::new();
        let mut rein_lat = Vec::new();
        let mut ceiling_lat = Vec::new();
        for _ in 0..ROUNDS {
            let (before, server_before) = (cpu("self"), cpu(&server_pid));
            let (count, elapsed) = rt.block_on(rein_throughput(&store, &policy, measure));
            let (after, server_after) = (cpu("self"), cpu(&server_pid));
            rein.push(Round::new(
                count,
                elapsed,
                after.own - before.own,
                server_after.own - server_before.own,
            ));

            // Sized to run about as long as rein's round did.
            let n = (count.max(50_000)).to_string();
            let pipelined = ["-P", "32", "-c", "50", "-n", n.as_str()];
            let (before, server_before) = (cpu("self"), cpu(&server_pid));
            let started = Instant::now();
            redis_benchmark(&server, &sha, &script_args, &pipelined);
            let elapsed = started.elapsed();
            let (after, server_after) = (cpu("self"), cpu(&server_pid));
            ceiling.push(Round::new(
                count.max(50_000),
                elapsed,
                after.children - before.children,
                server_after.own - server_before.own,
            ));

            rein_lat.push(rt.block_on(rein_latency(&store, &policy, 20_000)));
            let single = redis_benchmark(&server, &sha, &script_args, &["-c", "1", "-n", "20000"]);
            ceiling_lat.push((single.p50_ms * 1000.0, single.p99_ms * 1000.0));
        }

        let (rein_rps, ceiling_rps) = (med(&rein, |r| r.rps), med(&ceiling, |r| r.rps));
        let (rein_client, ceiling_client) =
            (med(&rein, |r| r.client_us), med(&ceiling, |r| r.client_us));
        let (rein_server, ceiling_server) =
            (med(&rein, |r| r.server_us), med(&ceiling, |r| r.server_us));
        let lat = |l: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
            median(&l.iter().map(f).collect::<Vec<_>>())
        };
        let (r50, r99) = (lat(&rein_lat, |l| l.0), lat(&rein_lat, |l| l.1));
        let (c50, c99) = (lat(&ceiling_lat, |l| l.0), lat(&ceiling_lat, |l| l.1));
        println!();
        println!("rein-redis vs redis-benchmark, same server, same script (EVALSHA {sha})");
        println!("median of {ROUNDS} rounds; {secs} s per throughput round; {KEYS} keys");
        println!();
        println!("| measure | rein-redis | redis-benchmark | ratio | goal |");
        println!("|---|---|---|---|---|");
        println!(
            "| throughput, decisions/s ({TASKS} tasks, 1 conn / -P 32 -c 50) | {rein_rps:.0} | \
             {ceiling_rps:.0} | {:.2} | >= 0.9 |",
            rein_rps / ceiling_rps
        );
        println!(
            "| client CPU per decision, µs | {rein_client:.1} | {ceiling_client:.1} | {:.2} | |",
            rein_client / ceiling_client
        );
        println!(
            "| server CPU per decision, µs | {rein_server:.1} | {ceiling_server:.1} | {:.2} | |",
            rein_server / ceiling_server
        );
        println!(
            "| latency p50, µs (1 task / -c 1) | {r50:.1} | {c50:.1} | {:.2} | <= 1.2 |",
            r50 / c50
        );
        println!(
            "| latency p99, µs (1 task / -c 1) | {r99:.1} | {c99:.1} | {:.2} | <= 1.2 |",
            r99 / c99
        );
        println!();
        let rps = |rounds: &[Round]| rounds.iter().map(|r| r.rps.round()).collect::<Vec<_>>();
        println!(
            "rounds: rein {:?} /s, redis-benchmark {:?} /s",
            rps(&rein),
            rps(&ceiling)
        );
        println!("rounds: rein p50/p99 {rein_lat:.1?} µs, redis-benchmark {ceiling_lat:.1?} µs");
    }
    // Per algorithm, the same 64 tasks on one connection each way: rein-redis as shipped
    // (coalescing), rein-redis with coalescing off, bare redis-rs calling rein's script
    // once per decision (the client's peer), and bare redis-rs calling the naive script
    // once per decision (the server's peer).
    let off_store = rt.block_on(store_over(&server, Coalesce::OFF));
    println!();
    println!(
        "per algorithm, {TASKS} tasks on one connection each way, median of {ROUNDS} rounds \
         of {secs} s: server CPU against the naive script, client CPU against bare redis-rs \
         calling rein's script"
    );
    println!();
    println!("| measure | rein-redis | peer | peer ÷ rein | goal |");
    println!("|---|---|---|---|---|");
    for (name, limit, script, params, naive, goal) in [
        (
            "token bucket",
            limit,
            "token_bucket",
            script_args[4..9].to_vec(),
            (
                NAIVE_TOKEN_BUCKET,
                ["", "1000", "1000000", "2000"].as_slice(),
            ),
            1.2,
        ),
        (
            "fixed window",
            // Ten million a minute per key never denies here, and fits the integer form
            // (integer_window.rs), as any limit below half the window in µs does.
            Limit::fixed_window(10_000_000, Micros::from_secs(60)).expect("valid"),
            "fixed_window",
            vec!["10000000".to_owned(), "60000000".to_owned()],
            (NAIVE_FIXED_WINDOW, ["60000", "10000000"].as_slice()),
            1.0,
        ),
        (
            "sliding log",
            // A minute's window: the logs grow to realistic lengths (the line after the
            // rows says how long), where a log's cost shows.
            Limit::sliding_log(1_000, Micros::from_secs(60)).expect("valid"),
            "sliding_log",
            vec!["1000".to_owned(), "60000000".to_owned()],
            (NAIVE_SLIDING_LOG, ["", "60000", "1000"].as_slice()),
            1.0,
        ),
    ] {
        if only.as_deref().is_some_and(|only| only != script) {
            continue;
        }
        let policy =
            Arc::new(RedisPolicy::new("bench", Policy::single(limit)).expect("valid name"));
        let (_, source) = SCRIPTS
            .iter()
            .find(|(n, _)| *n == script)
            .expect("a lean script");
        let mut argv: Vec<String> = vec![String::new(), "0".to_owned()];
        argv.extend(params);
        argv.extend(["acquire", "1"].map(str::to_owned));
        let bare = Arc::new(Bare {
            script: redis::Script::new(source),
            argv,
            tag: script,
            allowed: |reply| reply.get(1) == Some(&1),
        });
        let naive = Arc::new(Bare {
            script: redis::Script::new(naive.0),
            argv: naive.1.iter().map(|s| s.to_string()).collect(),
            tag: match script {
                "token_bucket" => "naive_tb",
                "fixed_window" => "naive_fw",
                _ => "naive_sl",
            },
            allowed: |reply| reply == [1],
        });
        let naive_tag = naive.tag;
        let warm = Duration::from_secs(1);
        rt.block_on(bare_throughput(&bare, &bare_conn, warm));
        rt.block_on(bare_throughput(&naive, &bare_conn, warm));
        rt.block_on(rein_throughput(&store, &policy, warm));
        rt.block_on(rein_throughput(&off_store, &policy, warm));
        let mut rounds: [Vec<Round>; 4] = Default::default();
        // Per side, the scripts' own time per decision (`INFO commandstats`, EVALSHA's µs).
        let mut script_us: [Vec<f64>; 4] = Default::default();
        let mut calls_per_decision = Vec::new();
        for _ in 0..ROUNDS {
            for (i, side) in rounds.iter_mut().enumerate() {
                let (before, server_before) = (cpu("self"), cpu(&server_pid));
                let stat_before = server.commandstat("evalsha").expect("INFO commandstats");
                let (count, elapsed) = rt.block_on(async {
                    match i {
                        0 => rein_throughput(&store, &policy, measure).await,
                        1 => rein_throughput(&off_store, &policy, measure).await,
                        2 => bare_throughput(&bare, &bare_conn, measure).await,
                        _ => bare_throughput(&naive, &bare_conn, measure).await,
                    }
                });
                let stat = server.commandstat("evalsha").expect("INFO commandstats");
                let (after, server_after) = (cpu("self"), cpu(&server_pid));
                let calls = stat.calls - stat_before.calls;
                if i == 0 {
                    calls_per_decision.push(calls as f64 / count.max(1) as f64);
                }
                script_us[i].push((stat.usec - stat_before.usec) as f64 / count.max(1) as f64);
                side.push(Round::new(
                    count,
                    elapsed,
                    after.own - before.own,
                    server_after.own - server_before.own,
                ));
            }
        }
        let [rein, off, bare, naive] = &rounds;
        // The sides ran one after another in every round: each comparison is the median of
        // the rounds' own ratios, with their spread.
        let per =
            |rounds: &[Round], f: fn(&Round) -> f64| -> Vec<f64> { rounds.iter().map(f).collect() };
        let row = |measure: &str, rein: &[f64], peer: &[f64], goal: &str| {
            println!(
                "| {name}: {measure} | {:.2} | {:.2} | {} | {goal} |",
                median(rein),
                median(peer),
                Ratio::of(peer, rein)
            )
        };
        let goal_text = format!(">= {goal}");
        let server_us = |r: &Round| r.server_us;
        let client_us = |r: &Round| r.client_us;
        row(
            "server CPU per decision, µs, vs the naive script",
            &per(rein, server_us),
            &per(naive, server_us),
            &goal_text,
        );
        row(
            "the same, coalescing off",
            &per(off, server_us),
            &per(naive, server_us),
            "",
        );
        row(
            "script µs per decision (INFO commandstats), vs the naive script",
            &script_us[0],
            &script_us[3],
            "",
        );
        // Client CPU: rein ÷ peer, so the goal reads as written.
        let client = |measure: &str, rein: &[f64], goal: &str| {
            let peer = per(bare, client_us);
            println!(
                "| {name}: {measure} (rein ÷ peer) | {:.2} | {:.2} | {} | {goal} |",
                median(rein),
                median(&peer),
                Ratio::of(rein, &peer)
            )
        };
        client(
            "client CPU per decision, µs, vs bare redis-rs (rein's script)",
            &per(rein, client_us),
            "<= 1.2",
        );
        client("the same, coalescing off", &per(off, client_us), "");
        let rps = |r: &Round| r.rps;
        println!(
            "| {name}: throughput, decisions/s, vs the naive script (rein ÷ peer) | \
             {:.0} | {:.0} | {} | |",
            med(rein, rps),
            med(naive, rps),
            Ratio::of(&per(rein, rps), &per(naive, rps))
        );
        println!(
            "| {name}: script calls per decision, coalescing | {:.3} | 1 | | |",
            median(&calls_per_decision)
        );
        let (rein_bytes, naive_bytes) =
            rt.block_on(memory_usage(&store, &policy, &bare_conn, naive_tag));
        println!(
            "| {name}: one key's MEMORY USAGE at the end, bytes | {rein_bytes} | \
             {naive_bytes} | | |"
        );
        if script == "sliding_log" {
            // A log's cost depends on its length, which depends on this run's rate: say it.
            let (rein_len, naive_len) = rt.block_on(log_lengths(&store, &policy, &bare_conn));
            println!(
                "| {name}: entries per log at the end (mean of 100 keys) | {rein_len:.1} | \
                 {naive_len:.1} | | |"
            );
        }
    }
}

/// `MEMORY USAGE` of user key 0's state: rein's (its policy's one key) and the naive
/// script's.
async fn memory_usage(
    store: &RedisStore<redis::aio::MultiplexedConnection>,
    policy: &RedisPolicy,
    con: &redis::aio::MultiplexedConnection,
    naive_tag: &str,
) -> (u64, u64) {
    // The rounds' tasks need not have met key 0 (nor, with a bucket full again a
    // microsecond later, kept it): decide it once, then read both at once.
    let _ = store
        .acquire(None, policy, 0u64.to_le_bytes().as_ref(), 1)
        .await
        .expect("a decision");
    let rein_key = store
        .keys(policy, 0u64.to_le_bytes())
        .expect("valid key")
        .remove(0);
    let naive_key = format!("bare:{{0}}:bench:0:{naive_tag}");
    let mut con = con.clone();
    let mut usage = async |key: &str| -> u64 {
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query_async::<Option<u64>>(&mut con)
            .await
            .expect("MEMORY USAGE")
            .unwrap_or(0)
    };
    (usage(&rein_key).await, usage(&naive_key).await)
}

/// The mean number of entries in 100 keys' logs spread over the key space: rein's (read
/// through `RedisStore::state`) and the naive script's sorted sets (`ZCARD`).
async fn log_lengths(
    store: &RedisStore<redis::aio::MultiplexedConnection>,
    policy: &RedisPolicy,
    con: &redis::aio::MultiplexedConnection,
) -> (f64, f64) {
    const SAMPLE: u64 = 100;
    let (mut rein, mut naive) = (0usize, 0u64);
    for key in (0..KEYS).step_by((KEYS / SAMPLE) as usize) {
        let state = store.state(policy, key.to_le_bytes()).await.expect("state");
        rein += state
            .iter()
            .map(|limit| match limit {
                rein_core::LimitState::SlidingLog(log) => log.entries().len(),
                _ => 0,
            })
            .sum::<usize>();
        let members: u64 = redis::cmd("ZCARD")
            .arg(format!("bare:{{{key}}}:bench:0:naive_sl"))
            .query_async(&mut con.clone())
            .await
            .expect("ZCARD");
        naive += members;
    }
    (rein as f64 / SAMPLE as f64, naive as f64 / SAMPLE as f64)
}

/// The median over rounds of one figure.
fn med(rounds: &[Round], f: fn(&Round) -> f64) -> f64 {
    median(&rounds.iter().map(f).collect::<Vec<_>>())
}

/// One throughput round: the rate, and CPU per decision of each side.
struct Round {
    rps: f64,
    client_us: f64,
    server_us: f64,
}

impl Round {
    fn new(count: u64, elapsed: Duration, client_cpu: f64, server_cpu: f64) -> Self {
        let count = count.max(1) as f64;
        Self {
            rps: count / elapsed.as_secs_f64(),
            client_us: client_cpu * 1e6 / count,
            server_us: server_cpu * 1e6 / count,
        }
    }
}

/// Decisions per second from `TASKS` tasks sharing one store (one connection).
async fn rein_throughput(
    store: &RedisStore<redis::aio::MultiplexedConnection>,
    policy: &Arc<RedisPolicy>,
    run: Duration,
) -> (u64, Duration) {
    throughput(run, |mut walk| {
        let (store, policy) = (store.clone(), policy.clone());
        tokio::spawn(async move {
            while let Some(key) = walk.next_key() {
                let decision = store
                    .acquire(None, &policy, key.to_le_bytes().as_ref(), 1)
                    .await;
                assert!(decision.expect("a decision").is_allowed());
                walk.decided();
            }
        })
    })
    .await
}

/// Decisions counted over `run` from `TASKS` tasks, each spawned by `spawn` with its own
/// [`Walk`] over the keys; and the time they were counted over.
async fn throughput(
    run: Duration,
    spawn: impl Fn(Walk) -> tokio::task::JoinHandle<()>,
) -> (u64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS as u64)
        .map(|task| {
            spawn(Walk {
                key: task.wrapping_mul(0x9e37_79b9_7f4a_7c15) % KEYS,
                stop: stop.clone(),
                done: done.clone(),
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(run).await;
    let count = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("task");
    }
    (count, elapsed)
}

/// One task's way through the keys in [`throughput`]: from its own start, 7 919 keys on
/// each time, until the run stops; and its count of decisions.
struct Walk {
    key: u64,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
}

impl Walk {
    /// The next key to decide on, or `None` once the run has stopped.
    fn next_key(&mut self) -> Option<u64> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        self.key = (self.key + 7_919) % KEYS;
        Some(self.key)
    }

    /// Counts one decision.
    fn decided(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a user of bare redis-rs would write: the script and its ARGV, keys formatted per call.
struct Bare {
    script: redis::Script,
    argv: Vec<String>,
    /// Ends each key, so that each script has keys of its own.
    tag: &'static str,
    /// Whether a reply admits.
    allowed: fn(&[i64]) -> bool,
}

/// Decisions per second from `TASKS` tasks calling the script through bare redis-rs on one
/// multiplexed connection, on the same keys as [`rein_throughput`].
async fn bare_throughput(
    bare: &Arc<Bare>,
    conn: &redis::aio::MultiplexedConnection,
    run: Duration,
) -> (u64, Duration) {
    throughput(run, |mut walk| {
        let (bare, mut conn) = (bare.clone(), conn.clone());
        tokio::spawn(async move {
            while let Some(key) = walk.next_key() {
                let mut invocation = bare
                    .script
                    .key(format!("bare:{{{key}}}:bench:0:{}", bare.tag));
                for arg in &bare.argv {
                    invocation.arg(arg);
                }
                let reply: redis::Value =
                    invocation.invoke_async(&mut conn).await.expect("EVALSHA");
                // The naive scripts answer one integer, rein's an array of them.
                let reply: Vec<i64> = match reply {
                    redis::Value::Int(n) => vec![n],
                    other => redis::from_redis_value(other).expect("integers"),
                };
                assert!((bare.allowed)(&reply), "{} denied: {reply:?}", bare.tag);
                walk.decided();
            }
        })
    })
    .await
}

/// A store over one multiplexed connection to `server`.
async fn store_over(
    server: &RedisServer,
    coalesce: Coalesce,
) -> RedisStore<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(server.url()).expect("client");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    RedisStoreBuilder::new()
        .deadline(Duration::from_secs(1))
        .coalesce(coalesce)
        .build(conn)
        .expect("store")
}

/// p50 and p99 in µs of `n` sequential decisions.
async fn rein_latency(
    store: &RedisStore<redis::aio::MultiplexedConnection>,
    policy: &RedisPolicy,
    n: u64,
) -> (f64, f64) {
    let mut samples = Vec::with_capacity(n as usize);
    for i in 0..n {
        let key = (i * 7_919) % KEYS;
        let started = Instant::now();
        let decision = store.acquire(None, policy, &key.to_le_bytes(), 1).await;
        samples.push(started.elapsed());
        assert!(decision.expect("a decision").is_allowed());
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (at(0.50).as_secs_f64() * 1e6, at(0.99).as_secs_f64() * 1e6)
}

struct BenchResult {
    p50_ms: f64,
    p99_ms: f64,
}

/// Runs `redis-benchmark` with `EVALSHA <sha> <script_args...>` and parses its CSV line.
fn redis_benchmark(
    server: &RedisServer,
    sha: &str,
    script_args: &[String],
    options: &[&str],
) -> BenchResult {
    let port = server.port().to_string();
    let output = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-r",
            &KEYS.to_string(),
            "--csv",
        ])
        .args(options)
        .arg("EVALSHA")
        .arg(sha)
        .args(script_args)
        .output()
        .expect("redis-benchmark (apt-get install redis-tools)");
    let text = String::from_utf8_lossy(&output.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",...
    let line = text
        .lines()
        .find(|l| l.starts_with("\"EVALSHA") || l.starts_with("\"evalsha"))
        .unwrap_or_else(|| panic!("no result from redis-benchmark: {text}"));
    let fields: Vec<f64> = line
        .split(',')
        .skip(1)
        .map(|f| f.trim_matches('"').parse().expect("a number"))
        .collect();
    // rps, avg, min, p50, p95, p99, max
    BenchResult {
        p50_ms: fields[3],
        p99_ms: fields[5],
    }
}

/// CPU time (user + system) of a process, and of its waited-for children, from
/// `/proc/<pid>/stat` (Linux), in seconds. The share of a core each side burns per decision
/// is the figure that stays comparable when other work loads the machine.
#[derive(Clone, Copy, Default)]
struct Cpu {
    own: f64,
    children: f64,
}

fn cpu(pid: &str) -> Cpu {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name, from field 3 (state) on.
    let fields: Vec<f64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let ticks = |i: usize| fields.get(i).copied().unwrap_or(0.0) / clock_ticks();
    Cpu {
        own: ticks(11) + ticks(12),
        children: ticks(13) + ticks(14),
    }
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}
