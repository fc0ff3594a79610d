//! The resilient limiter against a real, private `redis-server` that is killed, paused
//! (`SIGSTOP`) and restarted: deadlines, failure policies with exact counts, no replay, the
//! breaker's recovery, both caches, the policy table, and counters that agree with the
//! `metrics` export. No mocks: every fault is a real process-level fault.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use rein::{
    AllowCacheConfig, BreakerConfig, Decided, FailurePolicy, PolicyTable, RequestError,
    ResilientLimiter, Source, TimeSource, Unavailable, breaker::BreakerState,
};
use rein_core::{
    Limit, LimitState, Limiter, Micros, NamedPolicy, Outcome, OverCapacity, Policy, Timestamp,
};
use rein_memory::FakeClock;
use rein_redis::{RedisPolicy, RedisStore, RedisStoreBuilder};
use rein_redis_harness::RedisServer;
use tokio::time::Instant;

/// The store's deadline in every test here: the default.
const DEADLINE: Duration = Duration::from_millis(50);

/// How much longer than [`DEADLINE`] one decision may take in these tests. The limiter adds
/// only local work (microseconds) to the store's deadline; the rest of the margin covers
/// tokio's 1 ms timer resolution, the limiter's 5 ms safety-net timer should the store's be
/// late, and thread scheduling on a loaded 2-core machine running two tests and their
/// redis-servers (debug build). Any real failure of the guarantee (a retry, a replay, a
/// reconnect waited for, a queue) costs at least one more deadline, 50 ms, and is caught.
const MARGIN: Duration = Duration::from_millis(25);

/// Requests in the outage phases are this far apart, so an outage phase spans several
/// breaker periods.
const GAP: Duration = Duration::from_millis(5);

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

/// `capacity` tokens refilled at one an hour: no refill while a test runs.
fn bucket(name: &str, capacity: u64) -> NamedPolicy {
    let limit = Limit::token_bucket(capacity, 1, Micros::from_secs(3_600)).expect("valid");
    NamedPolicy::new(name, Policy::single(limit)).expect("valid name")
}

/// `limit` per window of `MAX_SPAN`, 2^48 µs (the next boundary is in 2032): its stored
/// count is exactly what was admitted.
fn eon_window(name: &str, limit: u64) -> NamedPolicy {
    let eon = rein_core::time::MAX_SPAN;
    let limit = Limit::fixed_window(limit, eon).expect("valid");
    NamedPolicy::new(name, Policy::single(limit)).expect("valid name")
}

/// A breaker that trips after `failures` and is open for `base` doubling to `max`.
fn breaker(failures: u32, base_ms: u64, max_ms: u64) -> BreakerConfig {
    BreakerConfig::new()
        .with_failure_threshold(nonzero(failures))
        .with_backoff(
            Duration::from_millis(base_ms),
            Duration::from_millis(max_ms),
        )
}

/// A store over a `ConnectionManager` (redis-rs reconnects it by itself).
async fn managed_store(server: &RedisServer) -> RedisStore<ConnectionManager> {
    RedisStoreBuilder::new()
        .deadline(DEADLINE)
        .connect(&server.url())
        .await
        .expect("connect the store")
}

/// A limiter over a [`managed_store`] on `server`, failing by `on_failure` behind
/// `breaker`, under a [`bucket`] of 100.
async fn behind_a_breaker(
    server: &RedisServer,
    on_failure: FailurePolicy,
    breaker: BreakerConfig,
) -> ResilientLimiter<RedisStore<ConnectionManager>> {
    let store = managed_store(server).await;
    let table = PolicyTable::new(bucket("breaker", 100));
    ResilientLimiter::builder(store, table, on_failure)
        .breaker(breaker)
        .build()
        .expect("limiter")
}

/// For the tests on the caller's clock (`TimeSource::LocalClock`): a store over `server`
/// whose keys live at least an hour (the caller's clock does not follow Redis's), a fake
/// clock, and the instant it starts at.
async fn on_a_fake_clock(
    server: &RedisServer,
) -> (RedisStore<ConnectionManager>, FakeClock, Timestamp) {
    let store = RedisStoreBuilder::new()
        .deadline(DEADLINE)
        .min_ttl(Duration::from_secs(3_600))
        .connect(&server.url())
        .await
        .expect("store");
    let t0 = Timestamp::from_micros(1_700_000_000_000_000);
    (store, FakeClock::new(t0), t0)
}

/// A store over plain `MultiplexedConnection`s that it replaces through its connector.
async fn reconnecting_store(
    server: &RedisServer,
    connects: Arc<AtomicUsize>,
) -> RedisStore<MultiplexedConnection> {
    let port = server.port();
    RedisStoreBuilder::new()
        .deadline(DEADLINE)
        .connect_with(move || {
            connects.fetch_add(1, Ordering::SeqCst);
            async move {
                let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                let info = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
                let config = redis::AsyncConnectionConfig::new();
                let (conn, driver) =
                    MultiplexedConnection::new_with_config(&info, stream, config).await?;
                tokio::spawn(driver);
                Ok(conn)
            }
        })
        .await
        .expect("connect the store")
}

/// One decision, asserting it came back within the deadline bound.
async fn timed<S: Limiter>(limiter: &ResilientLimiter<S>, key: &str, cost: u64) -> Decided {
    let started = Instant::now();
    let decided = limiter.acquire(key, cost).await.expect("a valid request");
    let took = started.elapsed();
    assert!(
        took <= DEADLINE + MARGIN,
        "a decision took {took:?}, more than {DEADLINE:?} + {MARGIN:?} ({decided:?})"
    );
    decided
}

/// Requests for `key`, [`GAP`] apart, each within the deadline bound, until one is decided
/// by Redis: that decision and how long it took from `ready`. A recovery that never comes
/// fails after 10 s rather than hangs.
async fn back_on_redis<S: Limiter>(
    limiter: &ResilientLimiter<S>,
    key: &str,
    ready: Instant,
) -> (Decided, Duration) {
    loop {
        let decided = timed(limiter, key, 1).await;
        if decided.source == Source::Store {
            return (decided, ready.elapsed());
        }
        assert!(
            ready.elapsed() < Duration::from_secs(10),
            "never back on Redis"
        );
        tokio::time::sleep(GAP).await;
    }
}

/// What an outage phase saw.
struct Outage {
    decisions: Vec<Decided>,
    /// How long the phase lasted.
    took: Duration,
    /// The most tasks alive in the runtime at any point of the phase.
    max_tasks: usize,
}

/// `count` requests of cost 1 for `key`, [`GAP`] apart, each within the deadline bound.
async fn outage<S: Limiter>(limiter: &ResilientLimiter<S>, key: &str, count: usize) -> Outage {
    let metrics = tokio::runtime::Handle::current().metrics();
    let started = Instant::now();
    let mut decisions = Vec::with_capacity(count);
    let mut max_tasks = metrics.num_alive_tasks();
    for _ in 0..count {
        decisions.push(timed(limiter, key, 1).await);
        max_tasks = max_tasks.max(metrics.num_alive_tasks());
        tokio::time::sleep(GAP).await;
    }
    Outage {
        decisions,
        took: started.elapsed(),
        max_tasks,
    }
}

fn kill(server: &mut RedisServer) {
    tokio::task::block_in_place(|| server.kill()).expect("kill redis-server");
}

/// Checks what every failure-policy test checks after its outage phase of `requests`, over
/// the set-up of [`ten_decided_then_killed`]: its [`DECIDED_BEFORE`] requests admitted by
/// the store, Redis calls stopped once the breaker opened (at most [`BREAKER_FAILURES`]
/// failures, then one probe per open period, each at least [`BREAKER_BASE_MS`] long), and
/// nothing piled up.
fn assert_calls_stopped_and_nothing_piled_up<S: Limiter>(
    limiter: &ResilientLimiter<S>,
    outage: &Outage,
    requests: u64,
    tasks_before: usize,
) {
    let (k, base) = (
        u64::from(BREAKER_FAILURES),
        Duration::from_millis(BREAKER_BASE_MS),
    );
    let stats = limiter.stats();
    assert_eq!(
        stats.store.allowed, DECIDED_BEFORE,
        "the requests before the kill, admitted by the store"
    );
    // One store call for each request decided before the kill.
    let calls = stats.store_calls - DECIDED_BEFORE;
    let probes_at_most = (outage.took.as_millis() / base.as_millis()) as u64 + 1;
    assert!(
        calls <= k + probes_at_most,
        "{calls} calls to a dead Redis in {:?}: more than {k} + {probes_at_most} probes",
        outage.took
    );
    assert_eq!(
        stats.store_errors, calls,
        "every call to the dead Redis failed"
    );
    assert_eq!(
        stats.breaker_rejections,
        requests - calls,
        "every other request was answered without calling Redis"
    );
    assert!(stats.breaker_opened >= 1);
    assert_ne!(limiter.breaker_state(), BreakerState::Closed);
    // The limiter spawns nothing; the store's connection keeps at most a driver and one
    // reconnect attempt alive. A pile-up would grow with the ~100 requests.
    assert!(
        outage.max_tasks <= tasks_before + 3,
        "tasks grew from {tasks_before} to {} during the outage",
        outage.max_tasks
    );
}

/// How many requests [`ten_decided_then_killed`] has the store decide before the kill.
const DECIDED_BEFORE: u64 = 10;
/// The outage tests' breaker: it opens after this many failures...
const BREAKER_FAILURES: u32 = 3;
/// ... for at least this long (ms) at first...
const BREAKER_BASE_MS: u64 = 100;
/// ... and at most this long (ms).
const BREAKER_MAX_MS: u64 = 200;

/// A limiter over a private server with the breaker of the outage tests, failing by
/// `on_failure` under a policy of capacity 100; ten requests on `k` decided by the store;
/// then the server killed. Also the tasks alive before the kill.
async fn ten_decided_then_killed(
    on_failure: FailurePolicy,
) -> (
    RedisServer,
    ResilientLimiter<RedisStore<ConnectionManager>>,
    usize,
) {
    let mut server = RedisServer::start().expect("start redis-server");
    let breaker = breaker(BREAKER_FAILURES, BREAKER_BASE_MS, BREAKER_MAX_MS);
    let limiter = behind_a_breaker(&server, on_failure, breaker).await;
    for _ in 0..DECIDED_BEFORE {
        assert_eq!(timed(&limiter, "k", 1).await.source, Source::Store);
    }
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    kill(&mut server);
    (server, limiter, tasks_before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_open_within_the_deadline_and_stops_being_called() {
    let (_server, limiter, tasks_before) = ten_decided_then_killed(FailurePolicy::FailOpen).await;
    let outage = outage(&limiter, "k", 100).await;
    for decided in &outage.decisions {
        assert!(decided.is_allowed());
        assert!(matches!(decided.source, Source::FailOpen(_)), "{decided:?}");
    }
    let stats = limiter.stats();
    assert_eq!(stats.fail_open.allowed, 100);
    assert_eq!((stats.decisions, stats.allowed), (110, 110));
    assert_calls_stopped_and_nothing_piled_up(&limiter, &outage, 100, tasks_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_closed_within_the_deadline() {
    let (_server, limiter, tasks_before) = ten_decided_then_killed(FailurePolicy::FailClosed).await;
    let outage = outage(&limiter, "k", 100).await;
    for decided in &outage.decisions {
        assert!(!decided.is_allowed());
        assert!(
            matches!(decided.source, Source::FailClosed(_)),
            "{decided:?}"
        );
        // Retry when the breaker may let a call through: never beyond the longest period.
        assert!(decided.decision.retry_after <= Micros::from_millis(200));
    }
    let rejected = outage
        .decisions
        .iter()
        .filter(|d| d.source == Source::FailClosed(Unavailable::BreakerOpen))
        .count();
    let stats = limiter.stats();
    assert_eq!(stats.breaker_rejections, rejected as u64);
    assert_eq!(stats.fail_closed.denied, 100);
    assert_eq!((stats.decisions, stats.denied), (110, 100));
    assert_calls_stopped_and_nothing_piled_up(&limiter, &outage, 100, tasks_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_falls_back_to_exactly_the_local_share() {
    // Capacity 100 shared by 4 nodes: 25 each, refilled at 1 per 4 hours. What Redis
    // admitted before the kill does not reduce the local share: the fallback starts full.
    let on_failure = FailurePolicy::LocalFallback {
        expected_nodes: nonzero(4),
    };
    let (_server, limiter, tasks_before) = ten_decided_then_killed(on_failure).await;
    // A peek while Redis is away: the local share answers it, and it takes nothing.
    let started = Instant::now();
    let peek = limiter.peek("k", 25).await.expect("a valid request");
    assert!(started.elapsed() <= DEADLINE + MARGIN, "{peek:?}");
    assert!(matches!(peek.source, Source::Fallback(_)), "{peek:?}");
    assert!(peek.is_allowed(), "{peek:?}");
    assert_eq!(peek.decision.remaining, 0, "what the share keeps after 25");
    let outage = outage(&limiter, "k", 60).await;
    let admitted = outage.decisions.iter().filter(|d| d.is_allowed()).count();
    assert_eq!(admitted, 25, "exactly ⌊100 / 4⌋ admitted locally");
    assert!(outage.decisions[..25].iter().all(Decided::is_allowed));
    for decided in &outage.decisions {
        assert!(matches!(decided.source, Source::Fallback(_)), "{decided:?}");
        assert_eq!(decided.decision.limit, 25, "the share's capacity");
    }
    // A cost that fits the policy but not the share is denied, not an error.
    let big = timed(&limiter, "other", 30).await;
    assert!(!big.is_allowed());
    assert!(matches!(big.source, Source::Fallback(_)));
    // Another key has its own share.
    assert!(timed(&limiter, "other", 25).await.is_allowed());
    let stats = limiter.stats();
    assert_eq!(
        stats.fallback.allowed, 27,
        "the peek, 25 in the outage, the other key"
    );
    assert_eq!(stats.fallback.denied, 36);
    assert_calls_stopped_and_nothing_piled_up(&limiter, &outage, 63, tasks_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_then_resumed_counts_every_request_at_most_once() {
    let server = RedisServer::start().expect("start redis-server");
    let store = managed_store(&server).await;
    let policy = eon_window("paused", 1_000);
    let table = PolicyTable::new(policy.clone());
    let limiter = ResilientLimiter::builder(store.clone(), table, FailurePolicy::FailClosed)
        .breaker(breaker(3, 100, 200))
        .build()
        .expect("limiter");
    for _ in 0..20 {
        assert_eq!(timed(&limiter, "k", 1).await.source, Source::Store);
    }
    server.pause().expect("SIGSTOP");
    // Longer than several deadlines and breaker periods: calls time out, the breaker opens,
    // probes time out.
    let paused = outage(&limiter, "k", 60).await;
    assert!(paused.decisions.iter().all(|d| !d.is_allowed()));
    server.resume().expect("SIGCONT");
    // Back to Redis by itself, then 20 more.
    let back = Instant::now();
    while timed(&limiter, "k", 1).await.source != Source::Store {
        assert!(
            back.elapsed() < Duration::from_secs(1),
            "Redis not used again"
        );
        tokio::time::sleep(GAP).await;
    }
    for _ in 0..20 {
        assert_eq!(timed(&limiter, "k", 1).await.source, Source::Store);
    }
    let stats = limiter.stats();
    assert!(
        stats.timeouts >= 3,
        "the pause was seen as timeouts: {stats:?}"
    );
    assert_eq!(stats.store_errors, stats.timeouts, "and only as timeouts");
    // Every call that timed out had been written to the socket, and Redis ran each once
    // when it resumed; nothing was sent twice. A replay would make the count larger, a
    // call lost by the limiter smaller.
    let state = store
        .state(&RedisPolicy::prepare(&policy), "k")
        .await
        .expect("state");
    let count = match state.iter().next() {
        Some(LimitState::FixedWindow(window)) => window.count,
        other => panic!("unexpected state {other:?}"),
    };
    assert_eq!(stats.store.allowed, 41);
    assert_eq!(count, stats.store.allowed + stats.timeouts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_is_used_again_within_a_second() {
    let mut server = RedisServer::start().expect("start redis-server");
    let connects = Arc::new(AtomicUsize::new(0));
    let store = reconnecting_store(&server, Arc::clone(&connects)).await;
    let table = PolicyTable::new(bucket("restart", 100));
    let limiter = ResilientLimiter::builder(store, table, FailurePolicy::FailClosed)
        .breaker(breaker(2, 100, 400))
        .build()
        .expect("limiter");
    for _ in 0..5 {
        assert_eq!(timed(&limiter, "k", 1).await.source, Source::Store);
    }
    kill(&mut server);
    let down = outage(&limiter, "k", 60).await;
    assert!(down.decisions.iter().all(|d| !d.is_allowed()));
    assert_eq!(limiter.stats().breaker_opened as usize, {
        // Every failed probe reopens it.
        limiter.stats().breaker_half_opened as usize + 1
    });
    // One connect attempt per probe at most, not one per request.
    let connects_down = connects.load(Ordering::SeqCst);
    assert!(connects_down <= 1 + limiter.stats().store_calls as usize - 5);
    tokio::task::block_in_place(|| server.restart()).expect("restart redis-server");
    let (decided, recovered_in) = back_on_redis(&limiter, "k", Instant::now()).await;
    // docs/failure.md quotes what this prints (`-- --nocapture`).
    eprintln!("recovered in {recovered_in:?} behind connect_with's reconnecting store");
    // The longest open period (400 ms) plus a probe: well within a second.
    assert!(recovered_in < Duration::from_secs(1), "{recovered_in:?}");
    // The restarted server is empty: a fresh limit.
    assert_eq!(decided.decision.remaining, 99);
    let stats = limiter.stats();
    assert_eq!(stats.breaker_state, BreakerState::Closed);
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    assert_eq!(stats.breaker_closed, 1);
    assert_eq!(stats.store.allowed, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_behind_the_default_connection_manager_is_used_again_within_a_second() {
    let mut server = RedisServer::start().expect("start redis-server");
    // `RedisStore::connect` caps the manager's reconnect backoff at 100 ms; redis-rs's
    // default doubles it after every failed attempt, so probes could meet the manager asleep
    // for seconds after Redis was back.
    let limiter = behind_a_breaker(&server, FailurePolicy::FailClosed, breaker(2, 100, 200)).await;
    assert_eq!(timed(&limiter, "k", 1).await.source, Source::Store);
    kill(&mut server);
    // Down for about a second: long enough for the manager's default backoff to reach
    // seconds between connect attempts.
    let down = outage(&limiter, "k", 150).await;
    assert!(down.took >= Duration::from_millis(750));
    tokio::task::block_in_place(|| server.restart()).expect("restart redis-server");
    // The longest open period (200 ms), the manager's longest sleep between connects
    // (100 ms), a probe that meets that sleep and times out (55 ms), and the next period
    // and probe: about 0.6 s at worst.
    let (_, recovered_in) = back_on_redis(&limiter, "k", Instant::now()).await;
    eprintln!("recovered in {recovered_in:?} behind RedisStore::connect's connection manager");
    assert!(recovered_in < Duration::from_secs(1), "{recovered_in:?}");
    assert_eq!(limiter.stats().breaker_state, BreakerState::Closed);
}

/// The explicit-time mode makes the deny cache's end exact: at `sent_at + retry_after - 1µs`
/// it still answers, at `sent_at + retry_after` Redis is asked and admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_denies_locally_until_retry_after_and_never_longer() {
    let server = RedisServer::start().expect("start redis-server");
    let (store, clock, t0) = on_a_fake_clock(&server).await;
    // 2 tokens, one more every 10 s.
    let limit = Limit::token_bucket(2, 1, Micros::from_secs(10)).expect("valid");
    let policy = NamedPolicy::new("deny", Policy::single(limit)).expect("valid name");
    let limiter = ResilientLimiter::builder(
        store.clone(),
        PolicyTable::new(policy.clone()),
        FailurePolicy::FailClosed,
    )
    .clock(clock.clone())
    .time_source(TimeSource::LocalClock)
    .build()
    .expect("limiter");
    for _ in 0..2 {
        assert_eq!(timed(&limiter, "k", 1).await.source, Source::Store);
    }
    let denied = timed(&limiter, "k", 1).await;
    assert_eq!(denied.source, Source::Store);
    assert_eq!(denied.decision.retry_after, Micros::from_secs(10));
    assert_eq!(limiter.stats().store_calls, 3);

    // Up to the last microsecond: answered locally, with the wait counted down, for the
    // denied cost and any larger one. Redis agrees.
    let last = t0.saturating_add(Micros::from_micros(10_000_000 - 1));
    clock.set(last);
    for cost in [1, 2] {
        let cached = timed(&limiter, "k", cost).await;
        assert_eq!(cached.source, Source::DenyCache);
        assert_eq!(cached.decision.outcome, Outcome::Denied);
        assert_eq!(cached.decision.retry_after, Micros::from_micros(1));
    }
    let redis_then = store
        .peek(Some(last), &RedisPolicy::prepare(&policy), b"k", 1)
        .await
        .expect("peek");
    assert!(!redis_then.is_allowed());
    assert_eq!(limiter.stats().store_calls, 3, "no call while cached");

    // At the end of Redis's denial: Redis is asked, and admits.
    clock.set(t0.saturating_add(Micros::from_secs(10)));
    let admitted = timed(&limiter, "k", 1).await;
    assert_eq!(admitted.source, Source::Store);
    assert!(admitted.is_allowed());

    // A denial covers only costs at least as large: cost 2 is denied for 20 s, but cost 1
    // (denied for 10 s) is still asked of Redis.
    let two = timed(&limiter, "k", 2).await;
    assert_eq!(
        (two.source, two.decision.retry_after),
        (Source::Store, Micros::from_secs(20))
    );
    let one = timed(&limiter, "k", 1).await;
    assert_eq!(
        (one.source, one.decision.retry_after),
        (Source::Store, Micros::from_secs(10))
    );
    let stats = limiter.stats();
    assert_eq!(stats.deny_cache.denied, 2);
    assert_eq!(stats.store_calls, 6);
    assert_eq!(
        stats.store,
        rein::stats::SourceCounts {
            allowed: 3,
            denied: 3
        }
    );
}

/// A refund goes to Redis and drops the key's cached denial: the next request is asked of
/// Redis (not denied from the cache) and admitted with the refunded capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_returns_capacity_in_redis_and_drops_the_cached_denial() {
    let server = RedisServer::start().expect("start redis-server");
    let store = managed_store(&server).await;
    let policy = bucket("refund", 3);
    let limiter = ResilientLimiter::builder(
        store.clone(),
        PolicyTable::new(policy.clone()),
        FailurePolicy::FailClosed,
    )
    .build()
    .expect("limiter");
    for _ in 0..3 {
        assert!(timed(&limiter, "k", 1).await.is_allowed());
    }
    assert_eq!(timed(&limiter, "k", 1).await.source, Source::Store);
    assert_eq!(timed(&limiter, "k", 1).await.source, Source::DenyCache);

    limiter.refund("k", 2).await.expect("refund");
    let after = timed(&limiter, "k", 2).await;
    assert_eq!((after.source, after.is_allowed()), (Source::Store, true));
    assert_eq!(after.decision.remaining, 0);
    let denied = timed(&limiter, "k", 1).await;
    assert_eq!((denied.source, denied.is_allowed()), (Source::Store, false));
}

/// Three nodes with allow caches share a capacity of 40. Each reuses exactly `max_reuses`
/// per window while Redis has capacity, Redis admits exactly its 40, and the reuses stay
/// within `N × max_reuses × (⌈T / ttl⌉ + 1)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allow_cache_over_admits_no_more_than_its_bound() {
    const NODES: u64 = 3;
    const MAX_REUSES: u64 = 4;
    let server = RedisServer::start().expect("start redis-server");
    let (store, clock, t0) = on_a_fake_clock(&server).await;
    let policy = bucket("allow", 40);
    let ttl = Duration::from_secs(1);
    let nodes: Vec<_> = (0..NODES)
        .map(|i| {
            ResilientLimiter::builder(
                store.clone(),
                PolicyTable::new(policy.clone()),
                FailurePolicy::FailClosed,
            )
            .name(format!("node-{i}"))
            .clock(clock.clone())
            .time_source(TimeSource::LocalClock)
            .danger_allow_cache(AllowCacheConfig::new(ttl, nonzero(MAX_REUSES as u32)))
            .build()
            .expect("limiter")
        })
        .collect();
    let mut reuses_per_phase = Vec::new();
    // Three windows: at t0, t0 + ttl, t0 + 2 ttl; ten requests per node in each,
    // round-robin over the nodes.
    for phase in 0..3u64 {
        clock.set(t0.saturating_add(Micros::from_secs(phase)));
        let mut reuses = 0;
        for _ in 0..10 {
            for node in &nodes {
                if timed(node, "k", 1).await.source == Source::AllowCache {
                    reuses += 1;
                }
            }
        }
        reuses_per_phase.push(reuses);
    }
    let stats: Vec<_> = nodes.iter().map(ResilientLimiter::stats).collect();
    let redis_allowed: u64 = stats.iter().map(|s| s.store.allowed).sum();
    let reused: u64 = stats.iter().map(|s| s.allow_cache.allowed).sum();
    assert_eq!(redis_allowed, 40, "Redis admitted exactly its capacity");
    // While Redis has room, each node reuses exactly its budget per window; in the last
    // window the remaining capacity Redis reported (3, 2, 1) caps each node's reuses.
    assert_eq!(reuses_per_phase, [12, 12, 6]);
    assert_eq!(reused, 30);
    let windows = 2 + 1; // ⌈T / ttl⌉ + 1 for T = 2 ttl
    assert!(reused <= NODES * MAX_REUSES * windows);
    let state = store
        .peek(
            Some(t0.saturating_add(Micros::from_secs(2))),
            &RedisPolicy::prepare(&policy),
            b"k",
            0,
        )
        .await;
    assert_eq!(state.expect("peek").remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_table_routes_keys_by_prefix_and_by_name() {
    let server = RedisServer::start().expect("start redis-server");
    let store = managed_store(&server).await;
    let table = PolicyTable::new(bucket("api", 5))
        .with_policy(bucket("login", 2))
        .expect("unique")
        .route_prefix("login:", "login")
        .expect("known policy");
    let limiter = ResilientLimiter::builder(store, table, FailurePolicy::FailClosed)
        .build()
        .expect("limiter");
    let outcomes: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(timed(&limiter, "login:bob", 1).await.is_allowed());
        }
        v
    };
    assert_eq!(outcomes, [true, true, false]);
    assert_eq!(timed(&limiter, "bob", 1).await.decision.limit, 5);
    let named = limiter
        .acquire_as("login", "bob", 1)
        .await
        .expect("decision");
    assert_eq!((named.decision.limit, named.decision.remaining), (2, 1));
    assert_eq!(
        limiter.acquire_as("nope", "bob", 1).await,
        Err(RequestError::UnknownPolicy("nope".into()))
    );
    assert!(matches!(
        limiter.acquire("bob", 6).await,
        Err(RequestError::InsufficientCapacity(OverCapacity {
            cost: 6,
            capacity: 5
        }))
    ));
    assert!(matches!(
        limiter.acquire("", 1).await,
        Err(RequestError::InvalidKey(_))
    ));
    assert_eq!(limiter.stats().invalid_requests, 3);
    // The limiter and its futures go anywhere: spawned on the runtime, from a clone.
    let spawned = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire("carol", 1).await }
    });
    let decided = spawned.await.expect("task").expect("decision");
    assert_eq!(
        (decided.source, decided.decision.remaining),
        (Source::Store, 4)
    );
    // A zero cost asks Redis and leaves the caches alone, even for a denied key.
    let peek = timed(&limiter, "login:bob", 0).await;
    assert_eq!((peek.source, peek.decision.remaining), (Source::Store, 0));
    assert_eq!(
        timed(&limiter, "login:bob", 1).await.source,
        Source::DenyCache
    );
}

/// Many requests arrive together when the open period ends: exactly one probes Redis, and
/// the others are answered at once while it is out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_breaker_lets_exactly_one_of_many_concurrent_requests_probe() {
    const TASKS: usize = 32;
    let server = RedisServer::start().expect("start redis-server");
    let limiter = behind_a_breaker(&server, FailurePolicy::FailClosed, breaker(1, 100, 100)).await;
    assert_eq!(timed(&limiter, "k", 1).await.source, Source::Store);
    server.pause().expect("SIGSTOP");
    let tripped = timed(&limiter, "k", 1).await;
    assert_eq!(tripped.source, Source::FailClosed(Unavailable::Timeout));
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    tokio::time::sleep(Duration::from_millis(120)).await;
    let before = limiter.stats();
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let decided = timed(&limiter, &format!("k{i}"), 1).await;
                (decided, started.elapsed())
            })
        })
        .collect();
    let mut answers: Vec<(Decided, Duration)> = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("task"));
    }
    server.resume().expect("SIGCONT");
    let after = limiter.stats();
    assert_eq!(after.store_calls - before.store_calls, 1, "one probe");
    assert_eq!(
        after.breaker_rejections - before.breaker_rejections,
        TASKS as u64 - 1
    );
    let (probe, rejected): (Vec<&(Decided, Duration)>, Vec<_>) = answers
        .iter()
        .partition(|(d, _)| d.source == Source::FailClosed(Unavailable::Timeout));
    assert_eq!((probe.len(), rejected.len()), (1, TASKS - 1));
    // Contention happened: every other request was answered while the probe was still out
    // (it waited for its deadline).
    let probe_done = probe[0].1;
    assert!(probe_done >= DEADLINE);
    assert!(rejected.iter().all(|(d, done)| {
        d.source == Source::FailClosed(Unavailable::BreakerOpen) && *done < probe_done
    }));
    assert_eq!((after.breaker_half_opened, after.breaker_opened), (1, 2));
}

/// Every counter, from the snapshot and from the `metrics` facade, equals what the test did.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_and_the_metrics_export_agree_with_what_happened() {
    use metrics_util::MetricKind;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let mut server = RedisServer::start().expect("start redis-server");
    let store = managed_store(&server).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The handles are registered with the recorder in force when the limiter is built.
    let limiter = metrics::with_local_recorder(&recorder, || {
        ResilientLimiter::builder(
            store,
            PolicyTable::new(bucket("metered", 3)),
            FailurePolicy::FailClosed,
        )
        .name("metered")
        // Two failures trip it, and no probe comes during the test.
        .breaker(breaker(2, 60_000, 60_000))
        .build()
        .expect("limiter")
    });

    for _ in 0..3 {
        assert_eq!(timed(&limiter, "a", 1).await.source, Source::Store);
    }
    assert_eq!(timed(&limiter, "a", 1).await.source, Source::Store);
    for _ in 0..2 {
        assert_eq!(timed(&limiter, "a", 1).await.source, Source::DenyCache);
    }
    assert!(limiter.acquire("", 1).await.is_err());
    kill(&mut server);
    for _ in 0..5 {
        let decided = timed(&limiter, "b", 1).await;
        assert!(matches!(decided.source, Source::FailClosed(_)));
    }

    let stats = limiter.stats();
    assert_eq!((stats.decisions, stats.allowed, stats.denied), (11, 3, 8));
    assert_eq!((stats.store.allowed, stats.store.denied), (3, 1));
    assert_eq!(stats.deny_cache.denied, 2);
    assert_eq!(stats.fail_closed.denied, 5);
    assert_eq!(stats.store_calls, 6);
    assert_eq!(stats.store_errors, 2);
    assert_eq!(stats.timeouts + stats.connection_errors, 2);
    assert_eq!(stats.breaker_rejections, 3);
    assert_eq!(
        (
            stats.breaker_opened,
            stats.breaker_half_opened,
            stats.breaker_closed
        ),
        (1, 0, 0)
    );
    assert_eq!(stats.breaker_state, BreakerState::Open);
    assert_eq!(stats.invalid_requests, 1);
    assert_eq!(stats.store_latency.count(), 6);

    // The facade's view, keyed by name and labels (the `limiter` label is "metered").
    let mut exported = std::collections::BTreeMap::new();
    let mut latencies = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let labels: Vec<String> = key
            .labels()
            .filter(|l| l.key() != "limiter")
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        assert!(
            key.labels()
                .any(|l| l.key() == "limiter" && l.value() == "metered")
        );
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => {
                exported.insert(name, n as f64);
            }
            (MetricKind::Gauge, DebugValue::Gauge(g)) => {
                exported.insert(name, g.into_inner());
            }
            (MetricKind::Histogram, DebugValue::Histogram(values)) => latencies = values.len(),
            other => panic!("unexpected metric {other:?}"),
        }
    }
    let expect = |name: &str| exported.get(name).copied().unwrap_or(0.0) as u64;
    let decisions = |source: &str, outcome: &str| {
        expect(&format!(
            "rein_decisions_total{{source={source},outcome={outcome}}}"
        ))
    };
    assert_eq!(decisions("store", "allowed"), stats.store.allowed);
    assert_eq!(decisions("store", "denied"), stats.store.denied);
    assert_eq!(decisions("deny_cache", "denied"), stats.deny_cache.denied);
    assert_eq!(decisions("fail_closed", "denied"), stats.fail_closed.denied);
    let all_decisions: u64 = exported
        .iter()
        .filter(|(k, _)| k.starts_with("rein_decisions_total"))
        .map(|(_, v)| *v as u64)
        .sum();
    assert_eq!(all_decisions, stats.decisions);
    assert_eq!(expect("rein_store_calls_total{}"), stats.store_calls);
    let errors = expect("rein_store_errors_total{kind=timeout}")
        + expect("rein_store_errors_total{kind=connection}");
    assert_eq!(errors, stats.store_errors);
    assert_eq!(expect("rein_store_errors_total{kind=server}"), 0);
    assert_eq!(
        expect("rein_breaker_rejections_total{}"),
        stats.breaker_rejections
    );
    assert_eq!(expect("rein_breaker_transitions_total{to=open}"), 1);
    assert_eq!(expect("rein_breaker_transitions_total{to=closed}"), 0);
    assert_eq!(expect("rein_breaker_state{}"), 2, "open");
    assert_eq!(expect("rein_invalid_requests_total{}"), 1);
    assert_eq!(latencies as u64, stats.store_latency.count());
}

/// A hot key of the optimistic store that loses its race on every attempt is that key's
/// trouble, not the store's: the failure policy answers it, counted as `contended`, and the
/// breaker counts the call as answered, so every other key is still decided by the store
/// (before, five lost races in a row opened the breaker, and fail closed then denied every
/// key, and `connection_errors` counted them).
#[tokio::test]
async fn a_contended_key_is_answered_by_the_failure_policy_without_opening_the_breaker() {
    use rein_redis_harness::{Fault, Faulty};

    let clock = FakeClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = Faulty::new(rein_memory::MemoryStore::new(), Fault::ContendedFor(b"hot"));
    let limiter = ResilientLimiter::builder(
        store,
        PolicyTable::new(bucket("api", 100)),
        FailurePolicy::FailClosed,
    )
    .clock(clock)
    .breaker(breaker(2, 100, 100))
    .build()
    .expect("a limiter");
    for _ in 0..5 {
        let hot = limiter.acquire(b"hot", 1).await.expect("a decision");
        assert_eq!(hot.source, Source::FailClosed(Unavailable::Contended));
    }
    let cold = limiter.acquire(b"cold", 1).await.expect("a decision");
    assert_eq!(cold.source, Source::Store);
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.contended,
            stats.connection_errors,
            stats.store_errors,
            stats.breaker_state
        ),
        (5, 0, 5, BreakerState::Closed)
    );
}
