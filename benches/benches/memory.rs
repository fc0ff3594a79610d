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
//! - With `REIN_BENCH_CPU_TIME=1`, also `keyed_u64_cpu` and `keyed_string_cpu`: the keyed
//!   benches measured in the thread's CPU time, steadier on a machine shared with other work.
//!
//! Run: `cargo bench -p rein-benches --bench memory`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::Instant;

use criterion::measurement::{Measurement, WallTime};
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use rein_benches::ThreadCpuTime;
use rein_core::{Limit, Micros, Policy};
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

fn wall_time(c: &mut Criterion) {
    keyed_u64(c, "keyed_u64");
    keyed_string(c, "keyed_string");
    keyed_u64_system_clock(c);
    clock(c);
    contention(c);
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
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let start = Barrier::new(3);
            let begun = std::thread::scope(|s| {
                for thread in 0..2u64 {
                    let (start, decide) = (&start, &decide);
                    s.spawn(move || {
                        start.wait();
                        for i in 0..iters {
                            // Both threads walk the same keys, from different offsets.
                            black_box(decide((i + thread * 3) % CONTENDED_KEYS));
                        }
                    });
                }
                start.wait();
                Instant::now()
            });
            // Leaving the scope joined both threads: the time since the barrier is theirs.
            begun.elapsed()
        });
    });
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
const FIFTY: NonZeroU32 = NonZeroU32::new(50).unwrap();

criterion_group! {
    name = wall;
    config = rein_benches::quick();
    targets = wall_time
}
criterion_group! {
    name = cpu;
    config = rein_benches::quick_cpu();
    targets = cpu_time
}
criterion_main!(wall, cpu);
