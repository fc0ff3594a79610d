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
//!   admits, so every call writes. Five rounds alternate between peers (A B C A B C ...) so
//!   that all see the same machine load; each peer's median rate is shown, and its ratio to
//!   rein's taken round by round, as the median and the spread of those five ratios.
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
//!
//! Layout: `in_process.rs`, `through_redis.rs` and `over_admission.rs` measure; `report.rs`
//! prints the tables and draws the charts; this file runs them and holds what they share.

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub(crate) use rein_benches::{Ratio, median};
use rein_redis_harness::RedisServer;

mod in_process;
mod over_admission;
mod report;
mod through_redis;

use in_process::*;
use over_admission::*;
use report::*;
use through_redis::*;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() {
    let Some(run) = rein_benches::bench_run("head_to_head", 1) else {
        return;
    };
    let load_before = load_average();
    let started = Instant::now();
    println!(
        "head to head: {} s per round; load average before: {load_before}",
        run.as_secs()
    );

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
// Helpers
// ---------------------------------------------------------------------------------------

#[cfg(feature = "limitador")]
pub(crate) fn limitador_limit(
    namespace: &str,
    max: u64,
    window_secs: u64,
) -> limitador::limit::Limit {
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
pub(crate) fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        samples
            .get(((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    (at(0.50), at(0.99))
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU seconds (user + system) this thread has run (`RUSAGE_THREAD`, Linux).
pub(crate) fn thread_cpu_secs() -> f64 {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; on failure it stays zero.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// CPU seconds (user + system) of process `pid`, from `/proc/<pid>/stat`.
pub(crate) fn process_cpu_secs(pid: &str) -> f64 {
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
pub(crate) const ROUNDS: usize = 5;
/// Keys in the in-process runs, as in benches/memory.rs.
pub(crate) const MEMORY_KEYS: u64 = 100_000;
/// Timed single calls per in-process peer.
pub(crate) const MEMORY_LATENCY_CALLS: usize = 200_000;
/// Concurrent tasks of one Redis-backed instance, as in benches/redis.rs.
pub(crate) const REDIS_TASKS: usize = 64;
/// Keys the Redis throughput runs cycle over, as in benches/redis.rs.
pub(crate) const REDIS_KEYS: u64 = 100_000;
/// Sequential calls per latency round, per Redis-backed peer.
pub(crate) const REDIS_LATENCY_CALLS: u64 = 2_000;
/// Keys written to measure Redis memory per key.
pub(crate) const MEMORY_REDIS_KEYS: u64 = 20_000;
/// Tasks per instance in the over-admission trials.
pub(crate) const HOT_TASKS: usize = 16;
/// The over-admission limit: 100 per hour, so that nothing refills during a trial.
pub(crate) const TIGHT_LIMIT: u64 = 100;
pub(crate) const TIGHT_PERIOD_SECS: u64 = 3_600;
/// rein's stores' deadline: 1 s as in benches/redis.rs, so that a loaded machine's stalls
/// show as latency rather than as timeouts (the default, 50 ms, is for production).
pub(crate) const DEADLINE: Duration = Duration::from_secs(1);
/// limitador's always-admitting limit (a fixed window).
#[cfg(feature = "limitador")]
pub(crate) const OPEN_LIMIT: u64 = 1_000_000_000;
#[cfg(feature = "limitador")]
pub(crate) const OPEN_WINDOW_SECS: u64 = 60;

/// The articles' token bucket as one Lua script: HMGET the float state, refill by the
/// client's clock, HSET it back with a TTL. Atomic (one script), but floats and the
/// client's clock, where rein's scripts use integers and Redis `TIME`.
pub(crate) const LUA_TOKEN_BUCKET: &str = r"
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
