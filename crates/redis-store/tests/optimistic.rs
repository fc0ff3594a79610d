//! The optimistic-transaction store (`WATCH`, read, decide here, `MULTI … EXEC`): exact
//! under real contention (which the conflict counter proves happened), identical to the Lua
//! store decision for decision, all-or-nothing, silent on denials, on the server's clock,
//! and never replaying a call that timed out.

mod common;

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use rein_core::{DecideError, StoreError};
use rein_core::{Decision, Limit, Limiter, Micros, OverCapacity, Policy, Timestamp};
use rein_redis::{OptimisticStoreBuilder, RedisPolicy, RedisStoreBuilder};
use rein_redis_harness::RedisServer;

const LIMIT: u64 = 100;

/// A store with a deadline generous enough for a debug build on a busy machine: these
/// tests are about exactness, not latency.
fn builder() -> OptimisticStoreBuilder {
    OptimisticStoreBuilder::new()
        .deadline(Duration::from_secs(10))
        .rng_seed(12)
}

/// One call of the seeded walk that compares the two stores.
#[derive(Clone, Copy)]
enum Op {
    Peek,
    Refund,
    Acquire,
}

impl Op {
    /// Makes this call on `store` for key `k` at `t`: its decision, or `None` for a refund.
    async fn on<L>(
        self,
        store: &L,
        t: Timestamp,
        policy: &RedisPolicy,
        cost: u64,
    ) -> Option<Decision>
    where
        L: Limiter<Prepared = RedisPolicy>,
    {
        let (now, key) = (Some(t), b"k".as_slice());
        match self {
            Op::Peek => Some(store.peek(now, policy, key, cost).await.expect("peek")),
            Op::Refund => {
                store.refund(now, policy, key, cost).await.expect("refund");
                None
            }
            Op::Acquire => Some(
                store
                    .acquire(now, policy, key, cost)
                    .await
                    .expect("acquire"),
            ),
        }
    }
}

async fn exec_calls(raw: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .expect("INFO");
    rein_redis_harness::parse_commandstat(&info, "exec")
        .expect("INFO commandstats in the known format")
        .calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_of_32_tasks_on_4_connections_each_admit_exactly_the_limit() {
    let server = RedisServer::start().expect("start redis-server");
    // Two independent instances, as two processes would be: own pools, own sockets. Attempts
    // are unbounded in practice and backoff short, so every task ends with a denial and
    // contention stays high.
    let url = server.url();
    let instance = || {
        builder()
            .max_connections(NonZeroUsize::new(4).expect("4 > 0"))
            .max_attempts(NonZeroU32::new(100_000).expect("> 0"))
            .backoff(Duration::ZERO, Duration::from_micros(500))
            .connect(&url)
    };
    let stores = [
        instance().await.expect("connect"),
        instance().await.expect("connect"),
    ];
    for policy in common::unrefilled(LIMIT) {
        let policy = Arc::new(policy);
        let conflicts_before: u64 = stores.iter().map(|s| s.stats().conflicts).sum();
        let takers = stores
            .iter()
            .flat_map(|store| common::spawn_takers(store, 32, &policy, b"shared-key"));
        let admitted = common::taken(takers.collect()).await;
        let conflicts: u64 =
            stores.iter().map(|s| s.stats().conflicts).sum::<u64>() - conflicts_before;
        eprintln!("{}: {conflicts} conflicts", policy.name());
        assert!(
            conflicts >= 10,
            "{}: only {conflicts} aborted transactions: no real contention",
            policy.name()
        );
        assert_eq!(admitted, LIMIT, "{}", policy.name());
    }
}

/// Three processes (this test binary, started again as `cross_process_worker`), 16 tasks
/// each on 4 connections, one key: together they admit exactly the limit. A barrier in Redis
/// starts them together, so their transactions really overlap; the summed conflict counters
/// prove it.
#[test]
fn three_processes_admit_exactly_the_limit_together() {
    const PROCESSES: usize = 3;
    let server = RedisServer::start().expect("start redis-server");
    let children =
        common::spawn_workers("cross_process_worker", PROCESSES, &server, |i, command| {
            command
                .arg("--test-threads=1")
                .env(CHILD_SEED, i.to_string())
                .stdout(std::process::Stdio::piped());
        });
    // Wait until every worker is connected, then start them all at once.
    common::await_ready(&server, "occ-test:ready", PROCESSES);
    server.command(&["SET", "occ-test:go", "1"]).expect("SET");
    let (mut admitted, mut conflicts) = (0, 0);
    for child in children {
        let output = child.wait_with_output().expect("a worker");
        assert!(output.status.success(), "a worker process failed");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .find_map(|l| Some(l.split_once("occ-worker: ")?.1))
            .unwrap_or_else(|| panic!("no result line from a worker: {stdout}"));
        let numbers: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('=')?.1.parse().ok())
            .collect();
        let [a, c] = numbers[..] else {
            panic!("unreadable worker line {line:?}")
        };
        eprintln!("worker: {line}");
        admitted += a;
        conflicts += c;
    }
    assert!(
        conflicts >= 10,
        "only {conflicts} aborted transactions: no real contention"
    );
    assert_eq!(admitted, CROSS_PROCESS_LIMIT);
}

/// The worker half of `three_processes_admit_exactly_the_limit_together`, run only by it
/// (ignored otherwise, so that a plain run reports it as not run rather than as a pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker of three_processes_admit_exactly_the_limit_together: spawned with its environment"]
async fn cross_process_worker() {
    let (Ok(url), Ok(seed)) = (std::env::var(common::WORKER_URL), std::env::var(CHILD_SEED)) else {
        panic!("run by three_processes_admit_exactly_the_limit_together, with its environment");
    };
    let store = OptimisticStoreBuilder::new()
        .deadline(Duration::from_secs(10))
        .max_connections(NonZeroUsize::new(4).expect("> 0"))
        .max_attempts(NonZeroU32::new(100_000).expect("> 0"))
        .backoff(Duration::ZERO, Duration::from_micros(500))
        .rng_seed(seed.parse().expect("a seed"))
        .connect(&url)
        .await
        .expect("connect");
    let mut raw = common::raw_at(&url).await;
    let () = redis::cmd("INCR")
        .arg("occ-test:ready")
        .query_async(&mut raw)
        .await
        .map(|_: u64| ())
        .expect("INCR");
    while redis::cmd("EXISTS")
        .arg("occ-test:go")
        .query_async::<u64>(&mut raw)
        .await
        .expect("EXISTS")
        == 0
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let limit =
        Limit::token_bucket(CROSS_PROCESS_LIMIT, 1, Micros::from_secs(3600)).expect("valid");
    let policy = Arc::new(RedisPolicy::new("xproc", Policy::single(limit)).expect("valid"));
    let admitted = common::taken(common::spawn_takers(&store, 16, &policy, b"shared-key")).await;
    println!(
        "occ-worker: admitted={admitted} conflicts={}",
        store.stats().conflicts
    );
}

/// The limit the three worker processes share.
const CROSS_PROCESS_LIMIT: u64 = 300;
const CHILD_SEED: &str = "REIN_OCC_TEST_WORKER_SEED";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_attempts_is_a_contended_error_that_wrote_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let store = builder()
        .max_connections(NonZeroUsize::new(16).expect("> 0"))
        .max_attempts(NonZeroU32::new(1).expect("> 0"))
        .connect(&server.url())
        .await
        .expect("connect");
    // One token back per minute: none while the test runs (well under a minute).
    let capacity = 100_000;
    let limit = Limit::token_bucket(capacity, 1, Micros::from_secs(60)).expect("valid");
    let policy = Arc::new(RedisPolicy::new("hot", Policy::single(limit)).expect("valid"));
    let (admitted, contended) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (store, policy) = (store.clone(), policy.clone());
        let (admitted, contended) = (admitted.clone(), contended.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                match store.acquire(None, &policy, b"hot-key", 1).await {
                    Ok(d) => {
                        assert!(d.is_allowed(), "the bucket never runs dry here");
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(DecideError::Unavailable(StoreError::Contended { attempts })) => {
                        assert_eq!(attempts, 1);
                        contended.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let (admitted, contended) = (
        admitted.load(Ordering::SeqCst),
        contended.load(Ordering::SeqCst),
    );
    let stats = store.stats();
    eprintln!("{admitted} admitted, {contended} contended, {stats:?}");
    assert!(
        contended > 0,
        "one attempt each, 16 tasks, and never a conflict"
    );
    assert_eq!(admitted + contended, 16 * 40);
    assert_eq!((stats.contended, stats.conflicts), (contended, contended));
    // Exactly the admitted calls took a token: the contended ones wrote nothing.
    // A peek of 0 reports what is left now (a peek of 1 reports what would be left after it).
    let remaining = store
        .peek(None, &policy, b"hot-key", 0)
        .await
        .expect("peek")
        .remaining;
    assert_eq!(remaining, capacity - admitted);
}

/// A lost race whose backoff would outlast the deadline is `Contended` at once, not a
/// `Timeout` at the deadline: the resilient limiter's breaker counts a timeout as the store
/// failing, so one hot key would open it for every other key. Here 16 tasks race on one key
/// with a backoff window of days and a deadline of 2 s: every conflict must give up at once, as contended, having
/// written nothing (before, each slept into its deadline and failed as `Timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backoff_past_the_deadline_gives_up_as_contended_not_timed_out() {
    let server = RedisServer::start().expect("start redis-server");
    let days = Duration::from_secs(1_000_000);
    let store = builder()
        .deadline(Duration::from_secs(2))
        .backoff(days, days)
        .max_connections(NonZeroUsize::new(16).expect("> 0"))
        .max_attempts(NonZeroU32::new(64).expect("> 0"))
        .connect(&server.url())
        .await
        .expect("connect");
    // One token back per minute: none while the test runs.
    let limit = Limit::token_bucket(1_000_000, 1, Micros::from_secs(60)).expect("valid");
    let policy = Arc::new(RedisPolicy::new("hot", Policy::single(limit)).expect("valid"));
    let started = std::time::Instant::now();
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for _ in 0..40 {
                    outcomes.push(store.acquire(None, &policy, b"hot-key", 1).await);
                }
                outcomes
            })
        })
        .collect();
    let mut admitted = 0;
    let mut contended = 0;
    for task in calls {
        for outcome in task.await.expect("task") {
            match outcome {
                Ok(d) => {
                    assert!(d.is_allowed(), "the bucket never runs dry here");
                    admitted += 1;
                }
                Err(DecideError::Unavailable(StoreError::Contended { attempts })) => {
                    assert_eq!(attempts, 1, "given up at the first conflict");
                    contended += 1;
                }
                Err(e) => panic!("a lost race ended as {e} after {:?}", started.elapsed()),
            }
        }
    }
    eprintln!(
        "{admitted} admitted, {contended} contended, {:?}",
        store.stats()
    );
    assert!(contended > 0, "16 tasks on one key and never a conflict");
    let remaining = store
        .peek(None, &policy, b"hot-key", 0)
        .await
        .expect("peek")
        .remaining;
    let taken = 1_000_000 - remaining;
    assert_eq!(taken, admitted, "a contended call wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_limit_policy_is_all_or_nothing_and_a_denial_writes_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let store = builder().connect(&server.url()).await.expect("connect");
    let mut raw = common::raw(&server).await;
    let policy = common::mixed_policy("mixed");
    let key = "user-7";
    assert!(common::admits(&store, &policy, key.as_ref(), 2).await);
    assert!(common::admits(&store, &policy, key.as_ref(), 1).await);
    let keys = store.keys(&policy, key).expect("keys");
    let values = |keys: Vec<String>, mut raw: MultiplexedConnection| async move {
        let mut out = Vec::new();
        for key in keys {
            let value: Option<Vec<u8>> = common::query(&mut raw, &["GET", &key]).await;
            let ttl: i64 = common::query(&mut raw, &["PTTL", &key]).await;
            out.push((value.expect("every limit was written"), ttl > 0));
        }
        out
    };
    let before = values(keys.clone(), raw.clone()).await;
    let execs = exec_calls(&mut raw).await;
    let state = store.state(&policy, key).await.expect("state");

    common::the_window_denies(&store, &policy, key.as_ref()).await;
    assert_eq!(
        exec_calls(&mut raw).await,
        execs,
        "a denial sent a transaction"
    );
    assert_eq!(
        values(keys.clone(), raw.clone()).await,
        before,
        "a denial changed a value"
    );
    assert_eq!(store.state(&policy, key).await.expect("state"), state);

    // The connection that saw the denial still watches user-7's keys (the `UNWATCH` is
    // sent with its next use): a write to them now must not abort that next use, which
    // is about another user.
    let () = redis::cmd("SET")
        .arg(&keys[0])
        .arg(before[0].0.as_slice())
        .arg("KEEPTTL")
        .query_async(&mut raw)
        .await
        .expect("SET");
    assert_eq!(store.idle_connections(), 1);
    let other = "user-8";
    assert!(common::admits(&store, &policy, other.as_ref(), 1).await);
    assert_eq!(store.stats().conflicts, 0);
}

/// Three worlds on one server, each under its own prefix: the Lua store alone, this store
/// alone, and both taking turns on the same keys (picked by the walk). After every step all
/// three must have answered the same and hold the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_and_state_match_the_lua_store_step_by_step() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let occ_at = |prefix: &'static str| {
        builder()
            .prefix(prefix)
            .min_ttl(Duration::from_secs(3600))
            .connect(&url)
    };
    let lua_at = |prefix: &'static str| {
        RedisStoreBuilder::new()
            .prefix(prefix)
            .min_ttl(Duration::from_secs(3600))
            .deadline(Duration::from_secs(5))
            .connect(&url)
    };
    let occ = occ_at("occ").await.expect("connect");
    let lua = lua_at("lua").await.expect("connect");
    let (mix_occ, mix_lua) = (
        occ_at("mix").await.expect("connect"),
        lua_at("mix").await.expect("connect"),
    );
    let second = Micros::from_secs(1);
    let single = |name: &str, limit: Result<Limit, _>| {
        RedisPolicy::new(name, Policy::single(limit.expect("valid"))).expect("valid")
    };
    // The generic script (several limits) and each lean single-limit script.
    let policies = [
        common::mixed_policy("mixed"),
        RedisPolicy::new(
            "fast",
            Policy::new([
                Limit::token_bucket(5, 2, second).expect("valid"),
                Limit::sliding_log(4, second).expect("valid"),
                Limit::sliding_counter(6, second).expect("valid"),
                Limit::fixed_window(7, second).expect("valid"),
            ])
            .expect("valid"),
        )
        .expect("valid"),
        single("tb", Limit::token_bucket(5, 3, second)),
        single("fw", Limit::fixed_window(4, second)),
        single("sl", Limit::sliding_log(4, second)),
        single("sc", Limit::sliding_counter(4, second)),
    ];
    // A seeded walk: clock steps of 0 to 400 ms (sometimes backwards), costs 0 to 3.
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for policy in &policies {
        let mut now = 1_700_000_000_000_000_u64;
        for step in 0..300 {
            match next(10) {
                0 => now = now.saturating_sub(next(50_000)),
                _ => now += next(400_000),
            }
            let t = Timestamp::from_micros(now);
            let cost = next(4);
            let mix_by_occ = next(2) == 0;
            let label = format!(
                "{} step {step} at {now} cost {cost} (mixed world: {})",
                policy.name(),
                if mix_by_occ { "optimistic" } else { "Lua" }
            );
            let op = match next(6) {
                0 => Op::Peek,
                1 => Op::Refund,
                _ => Op::Acquire,
            };
            let decisions = [
                op.on(&occ, t, policy, cost).await,
                op.on(&lua, t, policy, cost).await,
                if mix_by_occ {
                    op.on(&mix_occ, t, policy, cost).await
                } else {
                    op.on(&mix_lua, t, policy, cost).await
                },
            ];
            assert_eq!(decisions[0], decisions[1], "{label}: optimistic vs Lua");
            assert_eq!(decisions[2], decisions[1], "{label}: mixed vs Lua");
            let lua_state = lua.state(policy, "k").await.expect("lua state");
            assert_eq!(
                occ.state(policy, "k").await.expect("occ"),
                lua_state,
                "{label}"
            );
            assert_eq!(
                mix_occ.state(policy, "k").await.expect("mix"),
                lua_state,
                "{label}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn now_is_the_servers_time() {
    let server = RedisServer::start().expect("start redis-server");
    let store = builder().connect(&server.url()).await.expect("connect");
    let mut raw = common::raw(&server).await;
    // One token per hour: after taking it, the bucket's `tat` is now + 1 h on the clock used.
    let limit = Limit::token_bucket(1, 1, Micros::from_secs(3600)).expect("valid");
    let policy = RedisPolicy::new("clock", Policy::single(limit)).expect("valid");
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut raw)
        .await
        .expect("TIME");
    let server_now = secs * 1_000_000 + micros;
    assert!(common::admits(&store, &policy, b"k", 1).await);
    let state = store.state(&policy, "k").await.expect("state");
    let Some(rein_core::LimitState::TokenBucket(bucket)) = state.iter().next() else {
        panic!("a token bucket state: {state:?}");
    };
    let used = bucket.tat.as_micros() - 3_600_000_000;
    assert!(
        (server_now..server_now + 5_000_000).contains(&used),
        "decided at {used}, server time {server_now}"
    );
    // Its key expires when the bucket is full again: in an hour.
    let key = &store.keys(&policy, "k").expect("keys")[0];
    let ttl: u64 = common::query(&mut raw, &["PTTL", key]).await;
    assert!((3_590_000..=3_600_000).contains(&ttl), "PTTL {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_is_not_replayed_and_its_connection_is_closed() {
    let server = RedisServer::start().expect("start redis-server");
    let store = OptimisticStoreBuilder::new()
        .deadline(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .expect("connect");
    let limit = Limit::token_bucket(1, 1, Micros::from_secs(3600)).expect("valid");
    let policy = RedisPolicy::new("once", Policy::single(limit)).expect("valid");
    assert_eq!(store.idle_connections(), 1);

    server.pause().expect("SIGSTOP");
    let timed_out = store.acquire(None, &policy, b"k", 1).await;
    server.resume().expect("SIGCONT");
    common::assert_matches!(
        timed_out,
        Err(DecideError::Unavailable(StoreError::Timeout(_)))
    );
    assert_eq!(
        store.idle_connections(),
        0,
        "the timed-out connection was kept"
    );

    // The timed-out call never reached EXEC and was not sent again: the one token is there.
    assert!(common::admits(&store, &policy, b"k", 1).await);
    assert!(!common::admits(&store, &policy, b"k", 1).await);
    assert_eq!(store.idle_connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_connection_counts_against_the_deadline() {
    let server = RedisServer::start().expect("start redis-server");
    let deadline = Duration::from_millis(200);
    let store = OptimisticStoreBuilder::new()
        .deadline(deadline)
        .max_connections(NonZeroUsize::new(1).expect("> 0"))
        .connect(&server.url())
        .await
        .expect("connect");
    let limit = Limit::token_bucket(10, 1, Micros::from_secs(1)).expect("valid");
    let policy = RedisPolicy::new("busy", Policy::single(limit)).expect("valid");
    server.pause().expect("SIGSTOP");
    // The first call holds the only connection, waiting for a frozen server; the second
    // waits for the connection. Both must give up at their deadline, not later.
    let started = tokio::time::Instant::now();
    let (a, b) = tokio::join!(
        store.acquire(None, &policy, b"k", 1),
        store.acquire(None, &policy, b"k", 1)
    );
    let waited = started.elapsed();
    server.resume().expect("SIGCONT");
    common::assert_matches!(a, Err(DecideError::Unavailable(StoreError::Timeout(_))));
    common::assert_matches!(b, Err(DecideError::Unavailable(StoreError::Timeout(_))));
    assert!(waited < deadline * 2, "waited {waited:?}");
    // Nothing was written: both calls died before any EXEC.
    assert_eq!(store.stats().transactions, 0);
    let left = store
        .peek(None, &policy, b"k", 0)
        .await
        .expect("peek")
        .remaining;
    assert_eq!(left, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_store_and_this_one_share_keys_and_stay_exact_together() {
    let server = RedisServer::start().expect("start redis-server");
    // Same default prefix, same keys, same values: 16 tasks on each store, one key. A
    // script's write aborts a transaction that read before it, like any other write.
    let lua = common::store(&server).await;
    let occ = builder()
        .max_connections(NonZeroUsize::new(8).expect("> 0"))
        .max_attempts(NonZeroU32::new(100_000).expect("> 0"))
        .backoff(Duration::ZERO, Duration::from_micros(500))
        .connect(&server.url())
        .await
        .expect("connect");
    for policy in common::unrefilled(LIMIT) {
        let policy = Arc::new(policy);
        let conflicts_before = occ.stats().conflicts;
        let by_lua = common::spawn_takers(&lua, 16, &policy, b"shared");
        let by_occ = common::spawn_takers(&occ, 16, &policy, b"shared");
        let (by_lua, by_occ) = (common::taken(by_lua).await, common::taken(by_occ).await);
        let conflicts = occ.stats().conflicts - conflicts_before;
        eprintln!(
            "{}: Lua {by_lua}, optimistic {by_occ}, {conflicts} conflicts",
            policy.name()
        );
        // The scripts' writes aborted the transactions that read before them: the two
        // really interleaved. (The scripts win nearly every race: one round trip, never
        // retried, against two and a backoff.)
        assert!(
            conflicts > 0,
            "{}: no transaction met a script's write",
            policy.name()
        );
        assert_eq!(by_lua + by_occ, LIMIT, "{}", policy.name());
        // Both read the same state back.
        assert_eq!(
            occ.state(&policy, "shared").await.expect("occ state"),
            lua.state(&policy, "shared").await.expect("lua state"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_is_an_error_not_a_full_limit() {
    let server = RedisServer::start().expect("start redis-server");
    let occ = builder().connect(&server.url()).await.expect("connect");
    let policy = common::mixed_policy("mixed");
    let mut raw = common::raw(&server).await;
    let keys = occ.keys(&policy, "k").expect("keys");
    // The policy's 4 limits share one key (format v4, parts joined by ';'). A foreign
    // string where a token bucket's state belongs (a bare integer would be a valid `tat`),
    // and values of the wrong number of parts, or a part of another algorithm's shape.
    for foreign in ["hello;;;", "1:0", "1:0;;;;", ";;1:2:3;"] {
        let () = redis::cmd("SET")
            .arg(&keys[0])
            .arg(foreign)
            .query_async(&mut raw)
            .await
            .expect("SET");
        let err = occ
            .acquire(None, &policy, b"k", 1)
            .await
            .expect_err("must not misread");
        common::assert_matches!(
            err,
            DecideError::Unavailable(StoreError::UnexpectedReply(_)),
            "{foreign:?}"
        );
    }
    // Another type altogether: Redis refuses the GET (WRONGTYPE).
    let () = common::query(&mut raw, &["DEL", &keys[0]]).await;
    let () = redis::cmd("HSET")
        .arg(&keys[0])
        .arg("tat")
        .arg("1")
        .query_async(&mut raw)
        .await
        .map(|_: u64| ())
        .expect("HSET");
    let err = occ
        .acquire(None, &policy, b"k", 1)
        .await
        .expect_err("must not misread");
    common::assert_matches!(err, DecideError::Unavailable(StoreError::Server(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_fails_before_redis() {
    let server = RedisServer::start().expect("start redis-server");
    let store = builder().connect(&server.url()).await.expect("connect");
    let policy = common::mixed_policy("mixed");
    assert!(matches!(
        store.acquire(None, &policy, b"k", 4).await,
        Err(DecideError::InsufficientCapacity(OverCapacity {
            cost: 4,
            capacity: 3
        }))
    ));
    assert!(matches!(
        store.acquire(None, &policy, b"", 1).await,
        Err(DecideError::InvalidKey(_))
    ));
    // Not a read either: `transactions` counts only the `EXEC`s that follow one.
    assert_eq!(store.stats().transactions, 0);
    for command in ["watch", "get", "time"] {
        let calls = server
            .commandstat_calls(command)
            .expect("INFO commandstats");
        assert_eq!(calls, 0, "the store sent {command}");
    }
}

/// A connect that takes longer than a call's deadline (a TLS handshake to a Redis a few
/// milliseconds away, here a connector that waits 80 ms against a deadline of 50) still
/// completes, in a task of its own, and waits in the pool for the next call. Before, it was
/// made inside the call and dropped with it: once Redis had closed the pooled connections,
/// every call timed out, for good.
#[tokio::test]
async fn a_connect_slower_than_the_deadline_lands_in_the_pool_for_the_next_call() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let store = OptimisticStoreBuilder::new()
        .deadline(Duration::from_millis(50))
        .connect_with(move || {
            let client = redis::Client::open(url.as_str()).expect("client");
            async move {
                tokio::time::sleep(Duration::from_millis(80)).await;
                client.get_multiplexed_async_connection().await
            }
        })
        .await
        .expect("the first connection");
    let policy = RedisPolicy::new(
        "slow",
        Policy::single(Limit::fixed_window(100, Micros::from_secs(60)).expect("valid")),
    )
    .expect("policy");
    assert!(store.acquire(None, &policy, b"k", 1).await.is_ok());
    // Redis closes its clients (a restart, or its idle `timeout`).
    server
        .command(&["CLIENT", "KILL", "TYPE", "normal"])
        .expect("CLIENT KILL");
    let mut answered = None;
    for _ in 0..20 {
        if let Ok(decision) = store.acquire(None, &policy, b"k", 1).await {
            answered = Some(decision);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        answered.is_some_and(|d| d.is_allowed()),
        "never reconnected"
    );
}

/// The pool's connects are bounded: against a Redis gone silent (a partition that drops
/// packets), at most `max_connections` are in flight however many calls find no
/// connection; against one that refuses them, none is tried for 100 ms after one failed,
/// the calls between failing at once. (Before, every call that found no idle connection
/// started one: a connect per call.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_are_bounded_in_flight_and_paced_after_a_failure() {
    use std::sync::atomic::AtomicUsize;
    let server = RedisServer::start().expect("start redis-server");
    let policy = RedisPolicy::new(
        "paced",
        Policy::single(Limit::fixed_window(100, Micros::from_secs(60)).expect("valid")),
    )
    .expect("policy");
    for silent in [true, false] {
        // The first connect reaches Redis; the later ones hang, or are refused (port 1).
        let url = server.url();
        let (made, in_flight, most) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let counters = (Arc::clone(&made), Arc::clone(&in_flight), Arc::clone(&most));
        let store = OptimisticStoreBuilder::new()
            .deadline(Duration::from_millis(20))
            .connect_timeout(Duration::from_secs(1))
            .max_connections(NonZeroUsize::new(2).expect("nonzero"))
            .connect_with(move || {
                let (made, in_flight, most) = counters.clone();
                let first = made.fetch_add(1, Ordering::SeqCst) == 0;
                let url = if first || !silent {
                    url.clone()
                } else {
                    String::new()
                };
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let made = if first {
                        redis::Client::open(url.as_str())?
                            .get_multiplexed_async_connection()
                            .await
                    } else if silent {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into())
                    } else {
                        redis::Client::open("redis://127.0.0.1:1/")?
                            .get_multiplexed_async_connection()
                            .await
                    };
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    made
                }
            })
            .await
            .expect("the first connection");
        assert!(store.acquire(None, &policy, b"k", 1).await.is_ok());
        // Redis closes its clients: the pooled connection fails its next call and is closed.
        server
            .command(&["CLIENT", "KILL", "TYPE", "normal"])
            .expect("CLIENT KILL");
        for _ in 0..30 {
            assert!(store.acquire(None, &policy, b"k", 1).await.is_err());
        }
        let (made, most) = (made.load(Ordering::SeqCst), most.load(Ordering::SeqCst));
        eprintln!("silent {silent}: {made} connects, at most {most} at once");
        if silent {
            assert!(most <= 2, "{most} connects in flight at once");
        } else {
            // The first, then one after each 100 ms of failing calls (these take far less).
            assert!(made <= 3, "{made} connects for 30 calls");
        }
    }
}
