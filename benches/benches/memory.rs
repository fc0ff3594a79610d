//! rein-memory's `MemoryLimiter` against governor's keyed limiter, both reading a real clock.
//!
//! - `keyed_u64`, `keyed_string`: one decision per iteration over 100 000 distinct keys
//!   (`u64`, and `String`s like "10.1.134.7"), visited in the same seeded pseudo-random
//!   order by both. Same quota: bursts of 50, refilled at 50 per second (governor's
//!   `Quota::per_second(50)`, rein's token bucket of capacity 50, refill 50 per second).
//!   Each side pays for its clock: rein's `acquire(key, 1)` reads its `QuantaClock`
//!   (the wall clock at start plus the TSC), governor's `check_key` its default clock
//!   (quanta as well).
//! - `keyed_u64_system_clock`: rein as in `keyed_u64` but reading `SystemClock`
//!   (`SystemTime::now()` on every call, the limiter's default).
//! - `clock`: one clock reading alone, for each of the clocks above.
//! - `contention`: two threads deciding at once over 8 shared keys, so they collide on the
//!   same locks or atomics. One iteration is one decision on each thread, timed on the
//!   wall clock; the throughput line is the pair's combined rate.
//! - `keyed_u64/rein_try`, `keyed_string/rein_try`: rein as above through `try_acquire`,
//!   which answers only allowed or denied (as governor's `check_key` does on an admission)
//!   and computes none of the decision's figures.
//! - `contention_scaling/{rein,rein_try,governor}/{hot,spread}/{1,2,4}`: 1, 2 or 4 threads
//!   deciding at once, either all on one key (`hot`: the same lock or atomic, nearly every
//!   decision a denial) or each on its own 1 024 keys (`spread`: threads meet only on a
//!   shared shard). One iteration is one decision on every thread, timed on the wall clock;
//!   the throughput line is their combined rate. The machine has 2 cores, so 4 threads
//!   also measure time-slicing.
//! - Every keyed id reads precomputed keys (`u64`s, or references to `String`s built before
//!   the measurement), so no id pays for formatting or allocating a key: both limiters are
//!   charged the same key load and nothing else.
//! - With `REIN_BENCH_CPU_TIME=1`, also `keyed_u64_cpu` and `keyed_string_cpu`: the keyed
//!   benches measured in the thread's CPU time, steadier on a machine shared with other work.
//!
//! Run: `cargo bench -p rein-benches --bench memory`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::measurement::{Measurement, WallTime};
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use rein_benches::ThreadCpuTime;
use rein_core::{Limit, Micros, Outcome, Policy};
use rein_memory::{Clock as _, MemoryLimiter, QuantaClock, SystemClock};

fn keyed_u64<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let keys: Vec<u64> = rein_benches::key_sequence(KEYS, SEQUENCE_LEN, SEED)
        .into_iter()
        .map(u64::from)
        .collect();
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Elements(1));

    let rein = rein_limiter::<u64>();
    cycle(&mut group, "rein", &keys, |key| {
        allowed(rein.acquire(key, 1))
    });

    let rein = rein_limiter::<u64>();
    cycle(&mut group, "rein_try", &keys, |key| {
        rein.try_acquire(key, 1) == Ok(Outcome::Allowed)
    });

    let governor: DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(quota());
    cycle(&mut group, "governor", &keys, |key| {
        governor.check_key(key).is_ok()
    });
    group.finish();
}

fn keyed_string<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let names = rein_benches::ip_keys(KEYS);
    let order = rein_benches::key_sequence(KEYS, SEQUENCE_LEN, SEED);
    let keys: Vec<&String> = order.iter().map(|&i| &names[i as usize]).collect();
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Elements(1));

    let rein = rein_limiter::<String>();
    cycle(&mut group, "rein", &keys, |key| {
        allowed(rein.acquire(key.as_str(), 1))
    });

    let rein = rein_limiter::<String>();
    cycle(&mut group, "rein_try", &keys, |key| {
        rein.try_acquire(key.as_str(), 1) == Ok(Outcome::Allowed)
    });

    let governor: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(quota());
    cycle(&mut group, "governor", &keys, |key| {
        governor.check_key(key).is_ok()
    });
    group.finish();
}

fn keyed_u64_system_clock(c: &mut Criterion) {
    let keys: Vec<u64> = rein_benches::key_sequence(KEYS, SEQUENCE_LEN, SEED)
        .into_iter()
        .map(u64::from)
        .collect();
    let mut group = c.benchmark_group("keyed_u64_system_clock");
    group.throughput(Throughput::Elements(1));
    let rein: MemoryLimiter<u64> = MemoryLimiter::new(policy());
    cycle(&mut group, "rein", &keys, |key| {
        allowed(rein.acquire(key, 1))
    });
    group.finish();
}

fn clock(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    group.throughput(Throughput::Elements(1));
    group.bench_function("rein_system", |b| b.iter(|| SystemClock.now()));
    let quanta = QuantaClock::new();
    group.bench_function("rein_quanta", |b| b.iter(|| quanta.now()));
    let governor = DefaultClock::default();
    group.bench_function("governor_default", |b| b.iter(|| governor.now()));
    group.finish();
}

fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("contention");
    group.throughput(Throughput::Elements(2));

    let rein = rein_limiter::<u64>();
    two_threads(&mut group, "rein", |key| allowed(rein.acquire(&key, 1)));

    let governor: DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(quota());
    two_threads(&mut group, "governor", |key| {
        governor.check_key(&key).is_ok()
    });
    group.finish();
}

/// 1, 2 and 4 threads deciding at once, on one hot key or on spread keys.
fn contention_scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("contention_scaling");
    for threads in [1, 2, 4] {
        group.throughput(Throughput::Elements(threads));
        for keys in [Keys::Hot, Keys::Spread] {
            let id = |who: &str| BenchmarkId::new(format!("{who}/{}", keys.name()), threads);
            let rein = rein_limiter::<u64>();
            scaling(&mut group, id("rein"), threads, keys, |key| {
                allowed(rein.acquire(&key, 1))
            });
            let rein = rein_limiter::<u64>();
            scaling(&mut group, id("rein_try"), threads, keys, |key| {
                rein.try_acquire(&key, 1) == Ok(Outcome::Allowed)
            });
            let governor: DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(quota());
            scaling(&mut group, id("governor"), threads, keys, |key| {
                governor.check_key(&key).is_ok()
            });
        }
    }
    group.finish();
}

fn wall_time(c: &mut Criterion) {
    keyed_u64(c, "keyed_u64");
    keyed_string(c, "keyed_string");
    keyed_u64_system_clock(c);
    clock(c);
    contention(c);
    contention_scaling(c);
}

fn cpu_time(c: &mut Criterion<ThreadCpuTime>) {
    if rein_benches::cpu_time_requested() {
        keyed_u64(c, "keyed_u64_cpu");
        keyed_string(c, "keyed_string_cpu");
    }
}

/// Benchmarks `decide` on the keys in order, one key per iteration, wrapping around.
fn cycle<T, M: Measurement>(
    group: &mut BenchmarkGroup<'_, M>,
    name: &str,
    keys: &[T],
    decide: impl Fn(&T) -> bool,
) {
    group.bench_function(name, |b| {
        let mut i = 0;
        b.iter(|| {
            // `keys.len()` is a power of two: wrapping is a mask, not a division.
            let key = &keys[i & (keys.len() - 1)];
            i += 1;
            black_box(decide(black_box(key)))
        });
    });
}

/// Benchmarks two threads each making `iters` decisions over the same few keys at once.
fn two_threads(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    decide: impl Fn(u64) -> bool + Sync,
) {
    // Both threads walk the same keys, from different offsets.
    let key = |thread: u64, i: u64| (i + thread * 3) % CONTENDED_KEYS;
    group.bench_function(name, |b| {
        b.iter_custom(|iters| on_threads(iters, 2, key, &decide))
    });
}

/// Which keys the threads of `contention_scaling` decide on.
#[derive(Clone, Copy)]
enum Keys {
    /// All threads on key 0: after the first 50, every decision is a denial.
    Hot,
    /// Each thread walks its own `SPREAD_KEYS` keys (disjoint between threads), so threads
    /// meet only when two keys share a shard.
    Spread,
}

impl Keys {
    fn name(self) -> &'static str {
        match self {
            Keys::Hot => "hot",
            Keys::Spread => "spread",
        }
    }

    /// The key thread `thread` decides on in its `i`th iteration.
    fn key(self, thread: u64, i: u64) -> u64 {
        match self {
            Keys::Hot => 0,
            Keys::Spread => thread * SPREAD_KEYS + (i.wrapping_mul(SPREAD_STRIDE) % SPREAD_KEYS),
        }
    }
}

/// Benchmarks `threads` threads each making `iters` decisions at once; one iteration is one
/// decision on every thread.
fn scaling(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    threads: u64,
    keys: Keys,
    decide: impl Fn(u64) -> bool + Sync,
) {
    let key = move |thread, i| keys.key(thread, i);
    group.bench_function(id, |b| {
        b.iter_custom(|iters| on_threads(iters, threads, key, &decide))
    });
}

/// `threads` threads each making `iters` decisions at once, thread `t` in its `i`th on
/// `key(t, i)`: the time on the wall clock from their common start to the last join.
fn on_threads(
    iters: u64,
    threads: u64,
    key: impl Fn(u64, u64) -> u64 + Copy + Send,
    decide: &(impl Fn(u64) -> bool + Sync),
) -> Duration {
    let start = Barrier::new(threads as usize + 1);
    let begun = std::thread::scope(|s| {
        for thread in 0..threads {
            let start = &start;
            s.spawn(move || {
                start.wait();
                for i in 0..iters {
                    black_box(decide(key(thread, i)));
                }
            });
        }
        start.wait();
        Instant::now()
    });
    // Leaving the scope joined every thread: the time since the barrier is theirs.
    begun.elapsed()
}

/// rein as benchmarked against governor: default shards and key bound, the quanta clock.
fn rein_limiter<K: std::hash::Hash + Eq>() -> MemoryLimiter<K, QuantaClock> {
    MemoryLimiter::builder(policy())
        .clock(QuantaClock::new())
        .build()
}

/// Bursts of 50, refilled at 50 per second: governor's `Quota::per_second(50)`.
fn policy() -> Policy {
    let bucket = Limit::token_bucket(50, 50, Micros::from_secs(1));
    Policy::single(bucket.expect("50 per second is a valid token bucket"))
}

fn quota() -> Quota {
    Quota::per_second(FIFTY)
}

fn allowed(decision: Result<rein_core::Decision, rein_core::AcquireError>) -> bool {
    decision.is_ok_and(|d| d.is_allowed())
}

/// Distinct keys in the keyed benches.
const KEYS: u32 = 100_000;
/// Precomputed key visits (a power of two): 4 MiB of `u64`, read in order, so the order
/// itself streams through the cache instead of competing with the tables for it.
const SEQUENCE_LEN: usize = 1 << 19;
/// The access order's seed, shared by both stores.
const SEED: u64 = 0x5eed_0001;
/// Keys both threads of the contention bench fight over.
const CONTENDED_KEYS: u64 = 8;
/// Keys per thread in `contention_scaling/*/spread`: few enough to stay in cache, so the
/// group measures the locks, not memory.
const SPREAD_KEYS: u64 = 1_024;
/// An odd step, so a thread visits its keys in a scattered order that still covers them all.
const SPREAD_STRIDE: u64 = 389;
const FIFTY: NonZeroU32 = NonZeroU32::new(50).unwrap();

rein_benches::quick_main!(wall_time, cpu_time);
