//! Through one private `redis-server`: rein's stores, the articles' naive scripts and
//! limitador's Redis storages; throughput, latency, CPU and memory per key.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use rein::{FailurePolicy, PolicyTable, ResilientLimiter};
use rein_core::{Limit, Limiter, Micros, NamedPolicy, Policy};
use rein_redis::{
    OptimisticStore, OptimisticStoreBuilder, RedisPolicy, RedisStore, RedisStoreBuilder,
};
use rein_redis_harness::RedisServer;

use super::*;

/// The Redis-backed peers, in table order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RedisKind {
    Rein,
    Resilient,
    Optimistic,
    NaiveRmw,
    LuaBucket,
    #[cfg(feature = "limitador-redis")]
    LimitadorRedis,
    #[cfg(feature = "limitador-redis")]
    LimitadorCached,
}

impl RedisKind {
    pub(crate) fn all() -> Vec<Self> {
        let kinds = vec![
            Self::Rein,
            Self::Resilient,
            Self::Optimistic,
            Self::NaiveRmw,
            Self::LuaBucket,
        ];
        #[cfg(feature = "limitador-redis")]
        let kinds = [kinds, vec![Self::LimitadorRedis, Self::LimitadorCached]].concat();
        kinds
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Rein => "rein RedisStore",
            Self::Resilient => "rein ResilientLimiter",
            Self::Optimistic => "rein OptimisticStore",
            Self::NaiveRmw => "naive RMW (articles')",
            Self::LuaBucket => "plain Lua bucket (articles')",
            #[cfg(feature = "limitador-redis")]
            Self::LimitadorRedis => "limitador Redis",
            #[cfg(feature = "limitador-redis")]
            Self::LimitadorCached => "limitador cached Redis",
        }
    }
}

/// What a limit allows in a run: the open limit always admits, the tight one 100 per hour.
#[derive(Clone, Copy)]
pub(crate) enum LimitSpec {
    Open,
    Tight,
}

impl LimitSpec {
    /// (capacity, refill per period, period in seconds) of the token bucket.
    pub(crate) fn bucket(self) -> (u64, u64, u64) {
        match self {
            Self::Open => (1_000_000, 1_000_000, 1),
            Self::Tight => (TIGHT_LIMIT, TIGHT_LIMIT, TIGHT_PERIOD_SECS),
        }
    }

    /// What the limit allows on one key over `elapsed`: the capacity plus whole refills.
    pub(crate) fn allowed(self, elapsed: Duration) -> u64 {
        let (capacity, refill, period) = self.bucket();
        capacity + (elapsed.as_secs_f64() * refill as f64 / period as f64) as u64
    }
}

/// One decision's result as a caller sees it.
pub(crate) enum Outcome {
    Admitted,
    Denied,
    /// The peer gave no decision (timeout, connection error, the optimistic store's
    /// `Contended`, a Redis error).
    NoDecision,
}

/// One instance of a Redis-backed peer, with its own connection(s).
pub(crate) enum RedisPeer {
    Rein {
        store: RedisStore<MultiplexedConnection>,
        policy: RedisPolicy,
    },
    Resilient(ResilientLimiter<RedisStore<MultiplexedConnection>>),
    Optimistic {
        store: OptimisticStore,
        policy: RedisPolicy,
    },
    NaiveRmw {
        conn: MultiplexedConnection,
        bucket: FloatBucket,
    },
    LuaBucket {
        conn: MultiplexedConnection,
        script: redis::Script,
        bucket: FloatBucket,
    },
    #[cfg(feature = "limitador-redis")]
    Limitador {
        limiter: limitador::AsyncRateLimiter,
        namespace: limitador::limit::Namespace,
    },
}

/// The articles' token bucket: a float number of tokens refilled by elapsed milliseconds.
#[derive(Clone, Copy)]
pub(crate) struct FloatBucket {
    pub(crate) capacity: f64,
    pub(crate) tokens_per_ms: f64,
}

impl FloatBucket {
    pub(crate) fn new(spec: LimitSpec) -> Self {
        let (capacity, refill, period) = spec.bucket();
        Self {
            capacity: capacity as f64,
            tokens_per_ms: refill as f64 / (period as f64 * 1000.0),
        }
    }

    /// Milliseconds until an empty bucket is full again: the key's TTL.
    pub(crate) fn ttl_ms(self) -> u64 {
        (self.capacity / self.tokens_per_ms).ceil() as u64
    }
}

impl RedisPeer {
    /// Connects one instance of `kind` to `url` with limit `spec`. `tasks` sizes the
    /// optimistic store's pool, so that no task waits for a connection.
    pub(crate) async fn connect(kind: RedisKind, url: &str, spec: LimitSpec, tasks: usize) -> Self {
        let (capacity, refill, period) = spec.bucket();
        let limit =
            Limit::token_bucket(capacity, refill, Micros::from_secs(period)).expect("valid bucket");
        let policy = Policy::single(limit);
        match kind {
            RedisKind::Rein => Self::Rein {
                store: rein_store(url).await,
                policy: RedisPolicy::new("h2h", policy).expect("valid name"),
            },
            RedisKind::Resilient => {
                let named = NamedPolicy::new("h2h", policy).expect("valid name");
                let limiter = ResilientLimiter::builder(
                    rein_store(url).await,
                    PolicyTable::new(named),
                    FailurePolicy::FailClosed,
                )
                .build()
                .expect("valid limiter");
                Self::Resilient(limiter)
            }
            RedisKind::Optimistic => Self::Optimistic {
                store: OptimisticStoreBuilder::new()
                    .max_connections(std::num::NonZeroUsize::new(tasks).expect("tasks > 0"))
                    .deadline(DEADLINE)
                    .rng_seed(2026)
                    .connect(url)
                    .await
                    .expect("connect the optimistic store"),
                policy: RedisPolicy::new("h2h", policy).expect("valid name"),
            },
            RedisKind::NaiveRmw => Self::NaiveRmw {
                conn: connection(url).await,
                bucket: FloatBucket::new(spec),
            },
            RedisKind::LuaBucket => Self::LuaBucket {
                conn: connection(url).await,
                script: redis::Script::new(LUA_TOKEN_BUCKET),
                bucket: FloatBucket::new(spec),
            },
            #[cfg(feature = "limitador-redis")]
            RedisKind::LimitadorRedis | RedisKind::LimitadorCached => {
                use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorageBuilder};
                let storage: Box<dyn limitador::storage::AsyncCounterStorage> =
                    if kind == RedisKind::LimitadorRedis {
                        Box::new(
                            AsyncRedisStorage::new(url)
                                .await
                                .expect("connect limitador's Redis storage"),
                        )
                    } else {
                        // Room for every key the runs touch, as for the in-memory peer: its
                        // batcher hands out one permit per pending counter and an insert that
                        // waits for one deadlocks this thread (see `decide`).
                        Box::new(
                            CachedRedisStorageBuilder::new(url)
                                .max_cached_counters(2 * REDIS_KEYS as usize)
                                .build()
                                .await
                                .expect("connect limitador's cached Redis storage"),
                        )
                    };
                let limiter = limitador::AsyncRateLimiter::new_with_storage(storage);
                let (max, window) = match spec {
                    LimitSpec::Open => (OPEN_LIMIT, OPEN_WINDOW_SECS),
                    LimitSpec::Tight => (TIGHT_LIMIT, TIGHT_PERIOD_SECS),
                };
                limiter.add_limit(limitador_limit("h2h", max, window));
                Self::Limitador {
                    limiter,
                    namespace: "h2h".into(),
                }
            }
        }
    }

    /// Decides one request of cost 1 for `key`.
    pub(crate) async fn decide(&self, key: &str) -> Outcome {
        match self {
            Self::Rein { store, policy } => {
                outcome(store.acquire(None, policy, key.as_bytes(), 1).await)
            }
            Self::Resilient(limiter) => match limiter.acquire(key, 1).await {
                Ok(d) if !d.source.is_exact() => Outcome::NoDecision,
                Ok(d) if d.is_allowed() => Outcome::Admitted,
                Ok(_) => Outcome::Denied,
                Err(_) => Outcome::NoDecision,
            },
            Self::Optimistic { store, policy } => {
                outcome(store.acquire(None, policy, key.as_bytes(), 1).await)
            }
            Self::NaiveRmw { conn, bucket } => naive_rmw(conn.clone(), *bucket, key).await,
            Self::LuaBucket {
                conn,
                script,
                bucket,
            } => {
                let reply = script
                    .key(format!("lua:{key}"))
                    .arg(bucket.capacity)
                    .arg(bucket.tokens_per_ms)
                    .arg(now_ms())
                    .arg(1)
                    .invoke_async::<i64>(&mut conn.clone())
                    .await;
                match reply {
                    Ok(1) => Outcome::Admitted,
                    Ok(_) => Outcome::Denied,
                    Err(_) => Outcome::NoDecision,
                }
            }
            #[cfg(feature = "limitador-redis")]
            Self::Limitador { limiter, namespace } => {
                let ctx: limitador::limit::Context =
                    HashMap::from([("user_id".to_owned(), key.to_owned())]).into();
                // limitador 0.14's cached storage holds a DashMap shard's write lock while it
                // awaits a semaphore permit (`Batcher::add`, counters_cache.rs). If that await
                // is pending, the next task on this thread to touch the shard parks the thread
                // on the lock, and the holder never runs again: a deadlock with the load at 0.
                // tokio's cooperative budget makes the await pending after 128 permits in one
                // poll, so the budget is off here; running out of permits is prevented by the
                // cache size (`connect`).
                match tokio::task::unconstrained(
                    limiter.check_rate_limited_and_update(namespace, &ctx, 1),
                )
                .await
                {
                    Ok(r) if r.limited => Outcome::Denied,
                    Ok(_) => Outcome::Admitted,
                    Err(_) => Outcome::NoDecision,
                }
            }
        }
    }
}

pub(crate) fn outcome(result: Result<rein_core::Decision, rein_core::DecideError>) -> Outcome {
    match result {
        Ok(d) if d.is_allowed() => Outcome::Admitted,
        Ok(_) => Outcome::Denied,
        Err(_) => Outcome::NoDecision,
    }
}

/// **The articles' naive read-modify-write limiter, the baseline not to copy.** It reads
/// the bucket, decides in the client and writes the result back, with no transaction and
/// no script: two callers that read the same state both spend the same token. Written here
/// for the comparison only.
pub(crate) async fn naive_rmw(
    mut conn: MultiplexedConnection,
    bucket: FloatBucket,
    key: &str,
) -> Outcome {
    let key = format!("naive:{key}");
    let Ok(fields) = redis::cmd("HGETALL")
        .arg(&key)
        .query_async::<HashMap<String, String>>(&mut conn)
        .await
    else {
        return Outcome::NoDecision;
    };
    let now = now_ms();
    let field = |name: &str| fields.get(name).and_then(|v| v.parse::<f64>().ok());
    // A missing or unreadable bucket is a full one, as in the articles.
    let mut tokens = field("tokens").unwrap_or(bucket.capacity);
    let last = field("last_refill").unwrap_or(now);
    tokens = (tokens + (now - last).max(0.0) * bucket.tokens_per_ms).min(bucket.capacity);
    let admitted = tokens >= 1.0;
    if admitted {
        tokens -= 1.0;
    }
    let written = redis::pipe()
        .cmd("HSET")
        .arg(&key)
        .arg("tokens")
        .arg(tokens)
        .arg("last_refill")
        .arg(now)
        .ignore()
        .cmd("PEXPIRE")
        .arg(&key)
        .arg(bucket.ttl_ms())
        .ignore()
        .query_async::<()>(&mut conn)
        .await;
    match (written, admitted) {
        (Err(_), _) => Outcome::NoDecision,
        (Ok(()), true) => Outcome::Admitted,
        (Ok(()), false) => Outcome::Denied,
    }
}

pub(crate) async fn rein_store(url: &str) -> RedisStore<MultiplexedConnection> {
    RedisStoreBuilder::new()
        .deadline(DEADLINE)
        .build(connection(url).await)
        .expect("valid store settings")
}

pub(crate) async fn connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// The client's clock in ms since the Unix epoch, as the articles pass it to Redis.
pub(crate) fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

pub(crate) struct RedisRow {
    pub(crate) kind: RedisKind,
    /// Decisions per second against rein's store, round by round.
    pub(crate) vs_rein: Ratio,
    pub(crate) decisions_per_sec: f64,
    pub(crate) no_decision_share: f64,
    pub(crate) client_cpu_us: f64,
    pub(crate) server_cpu_us: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) redis_keys_per_key: f64,
    pub(crate) used_memory_per_key: f64,
    pub(crate) memory_usage_per_redis_key: f64,
}

/// Throughput, latency and memory per key of each Redis-backed peer, one instance each.
pub(crate) fn redis_section(server: &RedisServer, run: Duration) -> Vec<RedisRow> {
    let url = server.url();
    let kinds = RedisKind::all();
    let (rounds, mut latencies) = current_thread(async {
        let mut admin = connection(&url).await;
        let server_pid = server_pid(&mut admin).await;
        let mut peers = Vec::new();
        for &kind in &kinds {
            let peer = Rc::new(RedisPeer::connect(kind, &url, LimitSpec::Open, REDIS_TASKS).await);
            // Warm up: connections, script caches, the keys written once.
            redis_throughput(&peer, run / 2).await;
            peers.push(peer);
        }
        let mut rounds: Vec<Vec<Throughput>> = vec![Vec::new(); kinds.len()];
        let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
        for _ in 0..ROUNDS {
            for (i, peer) in peers.iter().enumerate() {
                let (client, server) = (thread_cpu_secs(), process_cpu_secs(&server_pid));
                let mut t = redis_throughput(peer, run).await;
                t.client_cpu = thread_cpu_secs() - client;
                t.server_cpu = process_cpu_secs(&server_pid) - server;
                rounds[i].push(t);
                latencies[i].extend(redis_latency(peer, REDIS_LATENCY_CALLS).await);
            }
        }
        (rounds, latencies)
    });
    // Each peer's memory on a runtime of its own: dropping a runtime ends the tasks a peer
    // spawned (limitador's cached storage flushes from a task that outlives the storage),
    // which would otherwise write into the next peer's measurement.
    let rates = |i: usize| {
        rounds[i]
            .iter()
            .map(Throughput::per_sec)
            .collect::<Vec<_>>()
    };
    let mut rows = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        let vs_rein = Ratio::of(&rates(i), &rates(0));
        let mut r = rounds[i].clone();
        r.sort_by(|a, b| a.per_sec().total_cmp(&b.per_sec()));
        let mid = &r[r.len() / 2];
        let (p50, p99) = percentiles(&mut latencies[i]);
        let (redis_keys_per_key, used_memory_per_key, memory_usage_per_redis_key) =
            current_thread(redis_memory(kind, &url));
        rows.push(RedisRow {
            kind,
            vs_rein,
            decisions_per_sec: mid.per_sec(),
            no_decision_share: mid.no_decision as f64
                / (mid.decided + mid.no_decision).max(1) as f64,
            client_cpu_us: mid.client_cpu * 1e6 / mid.decided.max(1) as f64,
            server_cpu_us: mid.server_cpu * 1e6 / mid.decided.max(1) as f64,
            p50_us: p50,
            p99_us: p99,
            redis_keys_per_key,
            used_memory_per_key,
            memory_usage_per_redis_key,
        });
    }
    rows
}

/// Runs `future` on a fresh current-thread runtime (one client core) with a `LocalSet`,
/// and drops the runtime, with every task spawned on it, before returning.
pub(crate) fn current_thread<F: std::future::Future>(future: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    tokio::task::LocalSet::new().block_on(&rt, future)
}

#[derive(Clone, Default)]
pub(crate) struct Throughput {
    pub(crate) decided: u64,
    pub(crate) no_decision: u64,
    pub(crate) elapsed: Duration,
    pub(crate) client_cpu: f64,
    pub(crate) server_cpu: f64,
}

impl Throughput {
    pub(crate) fn per_sec(&self) -> f64 {
        self.decided as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// [`REDIS_TASKS`] tasks on this thread deciding over [`REDIS_KEYS`] keys for `run`.
pub(crate) async fn redis_throughput(peer: &Rc<RedisPeer>, run: Duration) -> Throughput {
    let stop = Rc::new(std::cell::Cell::new(false));
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..REDIS_TASKS as u64 {
        let (peer, stop) = (peer.clone(), stop.clone());
        handles.push(tokio::task::spawn_local(async move {
            let mut key = task.wrapping_mul(0x9e37_79b9_7f4a_7c15) % REDIS_KEYS;
            let (mut decided, mut failed) = (0u64, 0u64);
            while !stop.get() {
                key = (key + 7_919) % REDIS_KEYS;
                match peer.decide(&format!("user-{key}")).await {
                    Outcome::Admitted | Outcome::Denied => decided += 1,
                    Outcome::NoDecision => failed += 1,
                }
                // limitador's cached storage decides without awaiting anything: without a
                // yield one task would keep the runtime, its timer and the storage's flusher
                // to itself.
                tokio::task::yield_now().await;
            }
            (decided, failed)
        }));
    }
    tokio::time::sleep(run).await;
    stop.set(true);
    let mut total = Throughput::default();
    for handle in handles {
        let (decided, failed) = handle.await.expect("task");
        total.decided += decided;
        total.no_decision += failed;
    }
    total.elapsed = started.elapsed();
    total
}

/// `n` sequential decisions from one caller, each timed.
pub(crate) async fn redis_latency(peer: &RedisPeer, n: u64) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n as usize);
    for i in 0..n {
        let key = format!("user-{}", (i * 7_919) % REDIS_KEYS);
        let t = Instant::now();
        peer.decide(&key).await;
        samples.push(t.elapsed());
    }
    samples
}

/// For a fresh instance of `kind` on an empty database: Redis keys per user key,
/// `used_memory` growth per user key, and mean `MEMORY USAGE` of the keys written.
pub(crate) async fn redis_memory(kind: RedisKind, url: &str) -> (f64, f64, f64) {
    let admin = &mut connection(url).await;
    // The tight limit: rein's keys expire when their bucket is full again, which under the
    // open limit is a millisecond after the call, and an expired key costs nothing.
    let peer = RedisPeer::connect(kind, url, LimitSpec::Tight, REDIS_TASKS).await;
    // One call first, so that script caches and connections are not counted.
    peer.decide("warm-up").await;
    settle(kind).await;
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async(admin)
        .await
        .expect("FLUSHALL");
    let before = used_memory(admin).await;
    for i in 0..MEMORY_REDIS_KEYS {
        peer.decide(&format!("user-{i}")).await;
    }
    settle(kind).await;
    let after = used_memory(admin).await;
    let dbsize: u64 = redis::cmd("DBSIZE")
        .query_async(admin)
        .await
        .expect("DBSIZE");
    let (_, sample): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("COUNT")
        .arg(200)
        .query_async(admin)
        .await
        .expect("SCAN");
    let mut usage = Vec::new();
    for key in &sample {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(admin)
            .await
            .expect("MEMORY USAGE");
        usage.extend(bytes);
    }
    let mean_usage = usage.iter().sum::<u64>() as f64 / usage.len().max(1) as f64;
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async(admin)
        .await
        .expect("FLUSHALL");
    let n = MEMORY_REDIS_KEYS as f64;
    (dbsize as f64 / n, (after - before) as f64 / n, mean_usage)
}

/// Lets limitador's cached storage flush its batch to Redis (its period is 1 s).
pub(crate) async fn settle(kind: RedisKind) {
    #[cfg(feature = "limitador-redis")]
    if kind == RedisKind::LimitadorCached {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
    let _ = kind;
}

pub(crate) async fn used_memory(admin: &mut MultiplexedConnection) -> i64 {
    let bytes = info_field(admin, "memory", "used_memory").await;
    bytes.parse().expect("used_memory a number")
}

pub(crate) async fn server_pid(admin: &mut MultiplexedConnection) -> String {
    info_field(admin, "server", "process_id").await
}

/// The value of `field` in `INFO <section>`.
async fn info_field(admin: &mut MultiplexedConnection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(admin)
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|value| value.trim().to_owned())
        .unwrap_or_else(|| panic!("{field} in INFO {section}"))
}
