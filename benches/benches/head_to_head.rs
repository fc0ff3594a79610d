//! rein beside its peers, on one machine in one run: throughput, latency, memory per key and
//! over-admission.
//!
//! Peers, each labelled as in the tables and charts:
//!
//! - in process: rein's `MemoryLimiter` (token bucket, `QuantaClock`), governor's keyed
//!   limiter (DashMap of atomics, quanta clock), and limitador's `RateLimiter` with its
//!   in-memory storage (`--features limitador`);
//! - through one private `redis-server`: rein's `RedisStore` (one Lua script per decision),
//!   rein's `ResilientLimiter` over that store (fail closed, deny cache on), rein's
//!   `OptimisticStore` (WATCH/MULTI/EXEC, a curiosity), **the articles' naive
//!   read-modify-write limiter** (HGETALL, decide in the client, HSET + PEXPIRE, no
//!   transaction: written here, it is not part of rein), **a plain Lua token bucket** in the
//!   same articles' style (HMGET, float arithmetic, HSET, PEXPIRE, one EVALSHA, the client's
//!   clock), and limitador's `AsyncRedisStorage` and `CachedRedisStorage`
//!   (`--features limitador-redis`, which builds RocksDB: see benches/Cargo.toml).
//!
//! Measures:
//!
//! - **throughput**: in process, 2 threads (one per core) over 100 000 keys for a fixed
//!   time; through Redis, one instance with 64 tasks on a current-thread runtime (one client
//!   core) over 100 000 keys, each task yielding after each decision. The limit always
//!   admits, so every call writes. Five rounds alternate between peers so that all see the
//!   same machine load; the median is shown.
//! - **latency**: one caller deciding sequentially, p50 and p99 per call.
//! - **memory per key**: in process, the heap bytes a limiter holds per key after 100 000
//!   keys were admitted once (a counting global allocator, switched on only for that);
//!   through Redis, `used_memory` growth per key after 20 000 keys (which counts every
//!   structure a peer keeps per key) and the mean `MEMORY USAGE` of the keys it wrote.
//! - **over-admission**: 1, 2 and 4 independent instances (each its own thread, runtime,
//!   connection and limiter) with 16 tasks each, hammering one key whose limit is 100 per
//!   hour, for a fixed time. Admitted is what the callers were told; allowed is what the
//!   limit allows over the run.
//!
//! Run: `cargo bench -p rein-benches --bench head_to_head` (add `--features limitador` or
//! `--features limitador-redis` for limitador). `REIN_BENCH_SECS` (default 1) sets the seconds per throughput round and per
//! over-admission trial. Charts go to `docs/charts/head-to-head-*.svg`. Not a criterion bench:
//! the peers are compared by one measurement method, a wall clock over a fixed run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use redis::aio::MultiplexedConnection;
use rein::{FailurePolicy, PolicyTable, ResilientLimiter};
use rein_core::{Limit, Micros, NamedPolicy, Policy};
use rein_memory::{MemoryLimiter, QuantaClock};
use rein_redis::{
    OptimisticStore, OptimisticStoreBuilder, RedisPolicy, RedisStore, RedisStoreBuilder,
};
use rein_redis_harness::RedisServer;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("head_to_head: run with `cargo bench -p rein-benches --bench head_to_head`");
        return;
    }
    let secs: u64 = std::env::var("REIN_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let run = Duration::from_secs(secs);
    let load_before = load_average();
    let started = Instant::now();
    println!("head to head: {secs} s per round; load average before: {load_before}");

    let memory = memory_section(run);
    let server = RedisServer::start().expect("start redis-server");
    let redis = redis_section(&server, run);
    let over = over_admission_section(&server, run);

    let load_after = load_average();
    println!();
    println!(
        "load average before {load_before}, after {load_after}; took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    print_tables(&memory, &redis, &over);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/charts");
    write_charts(&dir, &memory, &redis, &over).expect("write the charts");
    println!("charts written to {}", dir.display());
}

// ---------------------------------------------------------------------------------------
// In process
// ---------------------------------------------------------------------------------------

/// One in-process limiter, behind the call an application makes per request.
trait MemoryPeer: Sync {
    /// Decides one request for `key`; true if admitted.
    fn admit(&self, key: u64) -> bool;
}

struct ReinMemory(MemoryLimiter<u64, QuantaClock>);

impl ReinMemory {
    fn new(capacity: u64, period: Micros) -> Self {
        let limit = Limit::token_bucket(capacity, capacity, period).expect("valid bucket");
        Self(
            MemoryLimiter::builder(Policy::single(limit))
                .clock(QuantaClock::new())
                .build(),
        )
    }
}

impl MemoryPeer for ReinMemory {
    fn admit(&self, key: u64) -> bool {
        self.0
            .acquire(&key, 1)
            .expect("cost 1 fits the capacity")
            .is_allowed()
    }
}

struct Governor(DefaultKeyedRateLimiter<u64>);

impl Governor {
    fn new(per_second: u32) -> Self {
        let rate = NonZeroU32::new(per_second).expect("rate > 0");
        Self(RateLimiter::keyed(Quota::per_second(rate)))
    }
}

impl MemoryPeer for Governor {
    fn admit(&self, key: u64) -> bool {
        self.0.check_key(&key).is_ok()
    }
}

#[cfg(feature = "limitador")]
struct LimitadorMemory {
    limiter: limitador::RateLimiter,
    namespace: limitador::limit::Namespace,
}

#[cfg(feature = "limitador")]
impl LimitadorMemory {
    fn new(max_counters: u64) -> Self {
        let limiter = limitador::RateLimiter::new(max_counters);
        limiter.add_limit(limitador_limit("h2h-memory", OPEN_LIMIT, OPEN_WINDOW_SECS));
        Self {
            limiter,
            namespace: "h2h-memory".into(),
        }
    }
}

#[cfg(feature = "limitador")]
impl MemoryPeer for LimitadorMemory {
    fn admit(&self, key: u64) -> bool {
        // limitador's request descriptor: variables by name, as a proxy would pass them.
        let ctx: limitador::limit::Context =
            HashMap::from([("user_id".to_owned(), key.to_string())]).into();
        !self
            .limiter
            .check_rate_limited_and_update(&self.namespace, &ctx, 1)
            .expect("in-memory storage does not fail")
            .limited
    }
}

/// The in-process peers, built fresh, each with a limit that always admits here (10^6 per
/// second for the buckets, 10^9 per minute for limitador's window).
fn memory_peers() -> Vec<(&'static str, Box<dyn MemoryPeer>)> {
    let peers: Vec<(&'static str, Box<dyn MemoryPeer>)> = vec![
        (
            "rein MemoryLimiter",
            Box::new(ReinMemory::new(1_000_000, Micros::from_secs(1))),
        ),
        ("governor (keyed)", Box::new(Governor::new(1_000_000))),
    ];
    #[cfg(feature = "limitador")]
    let peers = {
        let mut peers = peers;
        peers.push((
            "limitador (memory)",
            Box::new(LimitadorMemory::new(2 * MEMORY_KEYS)),
        ));
        peers
    };
    peers
}

struct MemoryRow {
    name: &'static str,
    decisions_per_sec: f64,
    cpu_ns: f64,
    p50_ns: f64,
    p99_ns: f64,
    bytes_per_key: f64,
}

fn memory_section(run: Duration) -> Vec<MemoryRow> {
    let keys = rein_benches::key_sequence(MEMORY_KEYS as u32, 1 << 16, 2026);
    let peers = memory_peers();
    // Every key once, so the timed runs find a populated table.
    for (_, peer) in &peers {
        for key in 0..MEMORY_KEYS {
            peer.admit(key);
        }
    }
    let mut rounds: Vec<Vec<MemoryRound>> = vec![Vec::new(); peers.len()];
    for _ in 0..ROUNDS {
        for (i, (_, peer)) in peers.iter().enumerate() {
            rounds[i].push(memory_throughput(peer.as_ref(), &keys, run));
        }
    }
    let mut rows = Vec::new();
    for (i, (name, peer)) in peers.iter().enumerate() {
        let (p50_ns, p99_ns) = memory_latency(peer.as_ref(), &keys);
        rows.push(MemoryRow {
            name,
            decisions_per_sec: median(&rounds[i].iter().map(|r| r.per_sec).collect::<Vec<_>>()),
            cpu_ns: median(&rounds[i].iter().map(|r| r.cpu_ns).collect::<Vec<_>>()),
            p50_ns,
            p99_ns,
            bytes_per_key: 0.0,
        });
    }
    drop(peers);
    // Memory per key: each peer built and filled inside the counting window, alone.
    for (i, row) in rows.iter_mut().enumerate() {
        row.bytes_per_key = heap_per_key(i);
    }
    rows
}

/// Decisions per second of 2 threads (one per core) sharing `peer`, over `keys`, and the
/// CPU time the two threads spent per decision (which descheduling does not inflate).
fn memory_throughput(peer: &dyn MemoryPeer, keys: &[u32], run: Duration) -> MemoryRound {
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let total: (u64, f64) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2usize)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let mask = keys.len() - 1;
                    let mut i = t * keys.len() / 2;
                    let mut done = 0u64;
                    let cpu = thread_cpu_secs();
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            std::hint::black_box(peer.admit(u64::from(keys[i & mask])));
                            i += 1;
                        }
                        done += 256;
                    }
                    (done, thread_cpu_secs() - cpu)
                })
            })
            .collect();
        std::thread::sleep(run);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .fold((0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    MemoryRound {
        per_sec: total.0 as f64 / started.elapsed().as_secs_f64(),
        cpu_ns: total.1 * 1e9 / total.0.max(1) as f64,
    }
}

/// One in-process throughput round: decisions per wall second, CPU ns per decision.
#[derive(Clone, Copy)]
struct MemoryRound {
    per_sec: f64,
    cpu_ns: f64,
}

/// p50 and p99 in ns of one decision, one thread, each call timed alone (the two clock
/// reads, ~20-40 ns here, are included for every peer alike).
fn memory_latency(peer: &dyn MemoryPeer, keys: &[u32]) -> (f64, f64) {
    let mut samples: Vec<Duration> = Vec::with_capacity(MEMORY_LATENCY_CALLS);
    let mask = keys.len() - 1;
    for i in 0..MEMORY_LATENCY_CALLS {
        let key = u64::from(keys[i & mask]);
        let t = Instant::now();
        std::hint::black_box(peer.admit(key));
        samples.push(t.elapsed());
    }
    let (p50, p99) = percentiles(&mut samples);
    (p50 * 1e3, p99 * 1e3)
}

/// Heap bytes per key held by peer number `index` of [`memory_peers`] after
/// [`MEMORY_KEYS`] distinct keys were admitted once.
fn heap_per_key(index: usize) -> f64 {
    ALLOCATOR.start();
    let peer = memory_peers().swap_remove(index);
    // Only the chosen peer is live; the others were built and dropped above.
    for key in 0..MEMORY_KEYS {
        peer.1.admit(key);
    }
    let bytes = ALLOCATOR.live();
    drop(peer);
    ALLOCATOR.stop();
    bytes as f64 / MEMORY_KEYS as f64
}

/// Counts the bytes live on the heap while [`CountingAllocator::start`]ed, so that the
/// timed benches pay one relaxed load per allocation and nothing else.
struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

impl CountingAllocator {
    fn start(&self) {
        LIVE.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
    }

    fn stop(&self) {
        COUNTING.store(false, Ordering::SeqCst);
    }

    fn live(&self) -> isize {
        LIVE.load(Ordering::SeqCst)
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counter is bookkeeping only.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        new
    }
}

// ---------------------------------------------------------------------------------------
// Through Redis
// ---------------------------------------------------------------------------------------

/// The Redis-backed peers, in table order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RedisKind {
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
    fn all() -> Vec<Self> {
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

    fn label(self) -> &'static str {
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
enum LimitSpec {
    Open,
    Tight,
}

impl LimitSpec {
    /// (capacity, refill per period, period in seconds) of the token bucket.
    fn bucket(self) -> (u64, u64, u64) {
        match self {
            Self::Open => (1_000_000, 1_000_000, 1),
            Self::Tight => (TIGHT_LIMIT, TIGHT_LIMIT, TIGHT_PERIOD_SECS),
        }
    }

    /// What the limit allows on one key over `elapsed`: the capacity plus whole refills.
    fn allowed(self, elapsed: Duration) -> u64 {
        let (capacity, refill, period) = self.bucket();
        capacity + (elapsed.as_secs_f64() * refill as f64 / period as f64) as u64
    }
}

/// One decision's result as a caller sees it.
enum Outcome {
    Admitted,
    Denied,
    /// The peer gave no decision (timeout, connection error, the optimistic store's
    /// `Contended`, a Redis error).
    NoDecision,
}

/// One instance of a Redis-backed peer, with its own connection(s).
enum RedisPeer {
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
struct FloatBucket {
    capacity: f64,
    tokens_per_ms: f64,
}

impl FloatBucket {
    fn new(spec: LimitSpec) -> Self {
        let (capacity, refill, period) = spec.bucket();
        Self {
            capacity: capacity as f64,
            tokens_per_ms: refill as f64 / (period as f64 * 1000.0),
        }
    }

    /// Milliseconds until an empty bucket is full again: the key's TTL.
    fn ttl_ms(self) -> u64 {
        (self.capacity / self.tokens_per_ms).ceil() as u64
    }
}

impl RedisPeer {
    /// Connects one instance of `kind` to `url` with limit `spec`. `tasks` sizes the
    /// optimistic store's pool, so that no task waits for a connection.
    async fn connect(kind: RedisKind, url: &str, spec: LimitSpec, tasks: usize) -> Self {
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
    async fn decide(&self, key: &str) -> Outcome {
        match self {
            Self::Rein { store, policy } => outcome(store.acquire(policy, key, 1).await),
            Self::Resilient(limiter) => match limiter.acquire(key, 1).await {
                Ok(d) if !d.source.is_exact() => Outcome::NoDecision,
                Ok(d) if d.is_allowed() => Outcome::Admitted,
                Ok(_) => Outcome::Denied,
                Err(_) => Outcome::NoDecision,
            },
            Self::Optimistic { store, policy } => outcome(store.acquire(policy, key, 1).await),
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

fn outcome(result: Result<rein_core::Decision, rein_core::DecideError>) -> Outcome {
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
async fn naive_rmw(mut conn: MultiplexedConnection, bucket: FloatBucket, key: &str) -> Outcome {
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

async fn rein_store(url: &str) -> RedisStore<MultiplexedConnection> {
    RedisStoreBuilder::new()
        .deadline(DEADLINE)
        .build(connection(url).await)
        .expect("valid store settings")
}

async fn connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// The client's clock in ms since the Unix epoch, as the articles pass it to Redis.
fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

struct RedisRow {
    kind: RedisKind,
    decisions_per_sec: f64,
    no_decision_share: f64,
    client_cpu_us: f64,
    server_cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
    redis_keys_per_key: f64,
    used_memory_per_key: f64,
    memory_usage_per_redis_key: f64,
}

/// Throughput, latency and memory per key of each Redis-backed peer, one instance each.
fn redis_section(server: &RedisServer, run: Duration) -> Vec<RedisRow> {
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
    let mut rows = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        let mut r = rounds[i].clone();
        r.sort_by(|a, b| a.per_sec().total_cmp(&b.per_sec()));
        let mid = &r[r.len() / 2];
        let (p50, p99) = percentiles(&mut latencies[i]);
        let (redis_keys_per_key, used_memory_per_key, memory_usage_per_redis_key) =
            current_thread(redis_memory(kind, &url));
        rows.push(RedisRow {
            kind,
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
fn current_thread<F: std::future::Future>(future: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    tokio::task::LocalSet::new().block_on(&rt, future)
}

#[derive(Clone, Default)]
struct Throughput {
    decided: u64,
    no_decision: u64,
    elapsed: Duration,
    client_cpu: f64,
    server_cpu: f64,
}

impl Throughput {
    fn per_sec(&self) -> f64 {
        self.decided as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// [`REDIS_TASKS`] tasks on this thread deciding over [`REDIS_KEYS`] keys for `run`.
async fn redis_throughput(peer: &Rc<RedisPeer>, run: Duration) -> Throughput {
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
async fn redis_latency(peer: &RedisPeer, n: u64) -> Vec<Duration> {
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
async fn redis_memory(kind: RedisKind, url: &str) -> (f64, f64, f64) {
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
async fn settle(kind: RedisKind) {
    #[cfg(feature = "limitador-redis")]
    if kind == RedisKind::LimitadorCached {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
    let _ = kind;
}

async fn used_memory(admin: &mut MultiplexedConnection) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(admin)
        .await
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO")
}

async fn server_pid(admin: &mut MultiplexedConnection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(admin)
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .map(|pid| pid.trim().to_owned())
        .expect("process_id in INFO")
}

// ---------------------------------------------------------------------------------------
// Over-admission
// ---------------------------------------------------------------------------------------

struct OverRow {
    kind: RedisKind,
    instances: usize,
    admitted: u64,
    allowed: u64,
    no_decision: u64,
    attempts: u64,
}

/// Each Redis-backed peer with 1, 2 and 4 instances on one key.
fn over_admission_section(server: &RedisServer, run: Duration) -> Vec<OverRow> {
    let url = server.url();
    let mut rows = Vec::new();
    for kind in RedisKind::all() {
        for instances in [1usize, 2, 4] {
            let key = format!("hot-{kind:?}-{instances}");
            rows.push(over_admission(kind, instances, &url, &key, run));
        }
    }
    rows
}

/// `instances` independent instances, each its own thread, current-thread runtime,
/// connection(s) and limiter, with [`HOT_TASKS`] tasks each deciding on `key` for `run`.
fn over_admission(
    kind: RedisKind,
    instances: usize,
    url: &str,
    key: &str,
    run: Duration,
) -> OverRow {
    let ready = Barrier::new(instances);
    let results: Vec<(u64, u64, u64, Duration)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..instances)
            .map(|_| {
                let ready = &ready;
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("tokio runtime");
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async {
                        let peer = Rc::new(
                            RedisPeer::connect(kind, url, LimitSpec::Tight, HOT_TASKS).await,
                        );
                        // All instances start together, as replicas under one burst would.
                        ready.wait();
                        hammer(&peer, key, run).await
                    })
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("instance"))
            .collect()
    });
    let elapsed = results.iter().map(|r| r.3).max().unwrap_or_default();
    OverRow {
        kind,
        instances,
        admitted: results.iter().map(|r| r.0).sum(),
        allowed: LimitSpec::Tight.allowed(elapsed),
        no_decision: results.iter().map(|r| r.2).sum(),
        attempts: results.iter().map(|r| r.0 + r.1 + r.2).sum(),
    }
}

/// [`HOT_TASKS`] tasks deciding on `key` for `run`: (admitted, denied, no decision, time).
async fn hammer(peer: &Rc<RedisPeer>, key: &str, run: Duration) -> (u64, u64, u64, Duration) {
    let stop = Rc::new(std::cell::Cell::new(false));
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..HOT_TASKS {
        let (peer, stop, key) = (peer.clone(), stop.clone(), key.to_owned());
        handles.push(tokio::task::spawn_local(async move {
            let mut counts = (0u64, 0u64, 0u64);
            while !stop.get() {
                match peer.decide(&key).await {
                    Outcome::Admitted => counts.0 += 1,
                    Outcome::Denied => counts.1 += 1,
                    Outcome::NoDecision => counts.2 += 1,
                }
                // A denial from rein's deny cache completes without awaiting anything;
                // without a yield one task would keep the runtime to itself.
                tokio::task::yield_now().await;
            }
            counts
        }));
    }
    tokio::time::sleep(run).await;
    stop.set(true);
    let mut total = (0, 0, 0, Duration::ZERO);
    for handle in handles {
        let (a, d, n) = handle.await.expect("task");
        total.0 += a;
        total.1 += d;
        total.2 += n;
    }
    total.3 = started.elapsed();
    total
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

fn print_tables(memory: &[MemoryRow], redis: &[RedisRow], over: &[OverRow]) {
    let base = memory.first().map_or(1.0, |r| r.decisions_per_sec);
    println!();
    println!("In process: 2 threads, {MEMORY_KEYS} keys; latency one thread, per call");
    println!();
    let base_cpu = memory.first().map_or(1.0, |r| r.cpu_ns);
    println!(
        "| peer | decisions/s | vs rein | CPU ns/decision | vs rein | p50 ns | p99 ns | heap \
         bytes/key |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in memory {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.0} | {:.1} |",
            r.name,
            r.decisions_per_sec,
            r.decisions_per_sec / base,
            r.cpu_ns,
            r.cpu_ns / base_cpu,
            r.p50_ns,
            r.p99_ns,
            r.bytes_per_key
        );
    }
    let base = redis.first().map_or(1.0, |r| r.decisions_per_sec);
    println!();
    println!(
        "Through Redis: 1 instance, {REDIS_TASKS} tasks, {REDIS_KEYS} keys; latency 1 task; \
         memory after {MEMORY_REDIS_KEYS} keys"
    );
    println!();
    println!(
        "| peer | decisions/s | vs rein store | no decision | client CPU µs/dec | server CPU \
         µs/dec | p50 µs | p99 µs | Redis keys/key | used_memory B/key | MEMORY USAGE B/Redis key |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in redis {
        println!(
            "| {} | {:.0} | {:.2} | {:.1} % | {:.1} | {:.1} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} |",
            r.kind.label(),
            r.decisions_per_sec,
            r.decisions_per_sec / base,
            r.no_decision_share * 100.0,
            r.client_cpu_us,
            r.server_cpu_us,
            r.p50_us,
            r.p99_us,
            r.redis_keys_per_key,
            r.used_memory_per_key,
            r.memory_usage_per_redis_key
        );
    }
    println!();
    println!(
        "Over-admission: one key, limit {TIGHT_LIMIT} per {TIGHT_PERIOD_SECS} s, {HOT_TASKS} \
         tasks per instance"
    );
    println!();
    println!("| peer | instances | attempts | admitted | allowed | over-admitted | no decision |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in over {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.kind.label(),
            r.instances,
            r.attempts,
            r.admitted,
            r.allowed,
            r.admitted.saturating_sub(r.allowed),
            r.no_decision
        );
    }
}

fn write_charts(
    dir: &std::path::Path,
    memory: &[MemoryRow],
    redis: &[RedisRow],
    over: &[OverRow],
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let mut names: Vec<String> = memory
        .iter()
        .map(|r| format!("{} (in process)", r.name))
        .collect();
    names.extend(redis.iter().map(|r| r.kind.label().to_owned()));
    let rates: Vec<f64> = memory
        .iter()
        .map(|r| r.decisions_per_sec)
        .chain(redis.iter().map(|r| r.decisions_per_sec))
        .collect();
    let svg = bar_chart(
        "Head to head: decisions per second (log scale; same machine, same run)",
        "decisions per second (in process: 2 threads; Redis: 1 instance, 64 tasks)",
        &names,
        &[("decisions/s", PALETTE[0], rates)],
        true,
        None,
    )?;
    std::fs::write(dir.join("head-to-head-throughput.svg"), svg)?;

    let p50: Vec<f64> = memory
        .iter()
        .map(|r| r.p50_ns / 1e3)
        .chain(redis.iter().map(|r| r.p50_us))
        .collect();
    let p99: Vec<f64> = memory
        .iter()
        .map(|r| r.p99_ns / 1e3)
        .chain(redis.iter().map(|r| r.p99_us))
        .collect();
    let svg = bar_chart(
        "Head to head: latency of one decision, one caller (log scale)",
        "µs per decision",
        &names,
        &[("p50", PALETTE[0], p50), ("p99", PALETTE[1], p99)],
        true,
        None,
    )?;
    std::fs::write(dir.join("head-to-head-latency.svg"), svg)?;

    let kinds: Vec<RedisKind> = redis.iter().map(|r| r.kind).collect();
    let series: Vec<(&str, RGBColor, Vec<f64>)> = [1usize, 2, 4]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let label = match n {
                1 => "1 instance",
                2 => "2 instances",
                _ => "4 instances",
            };
            let values = kinds
                .iter()
                .map(|&k| {
                    over.iter()
                        .find(|r| r.kind == k && r.instances == n)
                        .map_or(0.0, |r| r.admitted as f64)
                })
                .collect();
            (label, PALETTE[i], values)
        })
        .collect();
    let names: Vec<String> = kinds.iter().map(|k| k.label().to_owned()).collect();
    let svg = bar_chart(
        &format!("Head to head: admitted on one key, limit {TIGHT_LIMIT} per hour (log scale)"),
        &format!(
            "requests admitted by all instances together ({HOT_TASKS} tasks each); dashed: \
             what the limit allows ({TIGHT_LIMIT})"
        ),
        &names,
        &series,
        true,
        Some(TIGHT_LIMIT as f64),
    )?;
    std::fs::write(dir.join("head-to-head-overadmission.svg"), svg)?;
    Ok(())
}

/// Horizontal grouped bars: one group per name (top to bottom), one bar per series, each
/// labelled with its value. `reference` draws a dashed vertical line (1.0 = the limit).
fn bar_chart(
    title: &str,
    x_desc: &str,
    names: &[String],
    series: &[(&str, RGBColor, Vec<f64>)],
    log: bool,
    reference: Option<f64>,
) -> Result<String, Box<dyn std::error::Error>> {
    let values = || series.iter().flat_map(|s| s.2.iter().copied());
    let max = values().fold(0.0f64, f64::max).max(1e-9);
    let min = values().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
    let height = 140 + (names.len() * (18 + 18 * series.len())) as u32;
    let chart = BarChart {
        title,
        x_desc,
        names,
        series,
        reference,
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        if log {
            // At least a third of a decade below the smallest bar, so that every bar shows.
            let lo = 10f64.powf((min.min(max).log10() - 0.3).floor());
            let hi = 10f64.powf((max * 4.0).log10().ceil());
            chart.render(&root, (lo..hi).log_scale(), lo)?;
        } else {
            let hi = (max * 1.3).max(reference.unwrap_or(0.0) * 1.3);
            chart.render(&root, 0f64..hi, 0.0)?;
        }
        root.present()?;
    }
    Ok(svg)
}

struct BarChart<'a> {
    title: &'a str,
    x_desc: &'a str,
    names: &'a [String],
    series: &'a [(&'a str, RGBColor, Vec<f64>)],
    reference: Option<f64>,
}

impl BarChart<'_> {
    /// Draws on `root` with `x` as the value axis; bars start at `floor`.
    fn render<X>(
        &self,
        root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
        x: X,
        floor: f64,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
        X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
    {
        let groups = self.names.len() as f64;
        let mut chart = ChartBuilder::on(root)
            .caption(self.title, ("sans-serif", 22))
            .margin(16)
            .margin_right(60)
            .x_label_area_size(50)
            .y_label_area_size(210)
            .build_cartesian_2d(x, 0f64..groups)?;
        // The project's mesh style (crates/sim/src/report/chart.rs); names are drawn below.
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .axis_desc_style(("sans-serif", 15))
            .label_style(("sans-serif", 13))
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(215, 215, 215))
            .disable_y_mesh()
            .x_label_formatter(&|v| format_value(*v))
            .y_label_formatter(&|_| String::new())
            .draw()?;
        let n = self.series.len() as f64;
        // Group i spans [groups - i - 1, groups - i); its bars fill the middle 80 %.
        let bar = |i: usize, j: usize| {
            let top = groups - i as f64 - 0.1 - 0.8 * j as f64 / n;
            (top - 0.8 / n + 0.03, top)
        };
        let font = ("sans-serif", 13).into_font();
        let value_style = font.color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        for (j, (label, colour, values)) in self.series.iter().enumerate() {
            let colour = *colour;
            chart
                .draw_series(values.iter().enumerate().map(|(i, &v)| {
                    let (bottom, top) = bar(i, j);
                    Rectangle::new([(floor, bottom), (v.max(floor), top)], colour.filled())
                }))?
                .label(*label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 16, y + 5)], colour.filled())
                });
            chart.draw_series(values.iter().enumerate().map(|(i, &v)| {
                let (bottom, top) = bar(i, j);
                Text::new(
                    format!(" {}", format_value(v)),
                    (v.max(floor), (bottom + top) / 2.0),
                    value_style.clone(),
                )
            }))?;
        }
        if let Some(x) = self.reference {
            chart.draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, groups)],
                6,
                4,
                RGBColor(200, 0, 0).stroke_width(2),
            ))?;
        }
        if self.series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.9))
                .border_style(RGBColor(215, 215, 215))
                .label_font(("sans-serif", 13))
                .draw()?;
        }
        // Group names left of the axis, right-aligned at each group's centre.
        let name_style = font.color(&BLACK).pos(Pos::new(HPos::Right, VPos::Center));
        let (x0, _) = chart.plotting_area().get_pixel_range();
        for (i, name) in self.names.iter().enumerate() {
            let (_, y) = chart.backend_coord(&(floor, groups - i as f64 - 0.5));
            root.draw(&Text::new(
                name.as_str(),
                (x0.start - 8, y),
                name_style.clone(),
            ))?;
        }
        Ok(())
    }
}

/// 1234567 → "1.23 M", 0.0123 → "0.012": three significant digits at most.
fn format_value(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.3} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

#[cfg(feature = "limitador")]
fn limitador_limit(namespace: &str, max: u64, window_secs: u64) -> limitador::limit::Limit {
    let by_user: limitador::limit::Expression = "user_id".try_into().expect("a CEL variable");
    limitador::limit::Limit::new(
        namespace,
        max,
        window_secs,
        Vec::<limitador::limit::Predicate>::new(),
        [by_user],
    )
}

/// p50 and p99 of `samples`, in µs.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        samples
            .get(((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    (at(0.50), at(0.99))
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU seconds (user + system) this thread has run (`RUSAGE_THREAD`, Linux).
fn thread_cpu_secs() -> f64 {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; on failure it stays zero.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// CPU seconds (user + system) of process `pid`, from `/proc/<pid>/stat`.
fn process_cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<f64> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after the command name; the
    // kernel's USER_HZ is 100 on every Linux this runs on.
    (fields.get(11).copied().unwrap_or(0.0) + fields.get(12).copied().unwrap_or(0.0)) / 100.0
}

// ---------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------

/// Rounds per throughput measurement; the median is reported.
const ROUNDS: usize = 5;
/// Keys in the in-process runs, as in benches/memory.rs.
const MEMORY_KEYS: u64 = 100_000;
/// Timed single calls per in-process peer.
const MEMORY_LATENCY_CALLS: usize = 200_000;
/// Concurrent tasks of one Redis-backed instance, as in benches/redis.rs.
const REDIS_TASKS: usize = 64;
/// Keys the Redis throughput runs cycle over, as in benches/redis.rs.
const REDIS_KEYS: u64 = 100_000;
/// Sequential calls per latency round, per Redis-backed peer.
const REDIS_LATENCY_CALLS: u64 = 2_000;
/// Keys written to measure Redis memory per key.
const MEMORY_REDIS_KEYS: u64 = 20_000;
/// Tasks per instance in the over-admission trials.
const HOT_TASKS: usize = 16;
/// The over-admission limit: 100 per hour, so that nothing refills during a trial.
const TIGHT_LIMIT: u64 = 100;
const TIGHT_PERIOD_SECS: u64 = 3_600;
/// rein's stores' deadline: 1 s as in benches/redis.rs, so that a loaded machine's stalls
/// show as latency rather than as timeouts (the default, 50 ms, is for production).
const DEADLINE: Duration = Duration::from_secs(1);
/// limitador's always-admitting limit (a fixed window).
#[cfg(feature = "limitador")]
const OPEN_LIMIT: u64 = 1_000_000_000;
#[cfg(feature = "limitador")]
const OPEN_WINDOW_SECS: u64 = 60;
const WIDTH: u32 = 1200;
const PALETTE: [RGBColor; 3] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(118, 183, 178),
];

/// The articles' token bucket as one Lua script: HMGET the float state, refill by the
/// client's clock, HSET it back with a TTL. Atomic (one script), but floats and the
/// client's clock, where rein's scripts use integers and Redis `TIME`.
const LUA_TOKEN_BUCKET: &str = r"
local capacity = tonumber(ARGV[1])
local tokens_per_ms = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'last_refill')
local tokens = tonumber(state[1]) or capacity
local last = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - last) * tokens_per_ms)
local allowed = 0
if tokens >= requested then
  tokens = tokens - requested
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'last_refill', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / tokens_per_ms))
return allowed
";
