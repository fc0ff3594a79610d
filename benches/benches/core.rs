//! rein-core's decisions alone: one `acquire` per iteration, no store, no clock read.
//!
//! - `core_allow`: limits generous enough that every request is admitted, so each
//!   iteration takes the path that computes and writes a new state.
//! - `core_deny`: limits of 10 per hour, spent during warm-up, so each iteration takes the
//!   path that computes `retry_after` and writes nothing.
//!
//! Each group has one id per algorithm (`token_bucket`, `fixed_window`, `sliding_log`,
//! `sliding_counter`, each called through its own type), `token_bucket_try` and
//! `fixed_window_try` (the same decisions through `try_acquire`, which answers only the
//! outcome and computes none of the figures), then `policy_token_bucket` (the
//! same bucket through `Policy`, as the stores call it) and `policy_2_limits` (a token
//! bucket and a fixed window decided together). Time moves 1 µs per iteration by a counter
//! increment, which is part of the measured time (well under a nanosecond).
//!
//! With `REIN_BENCH_CPU_TIME=1`, the same again as `core_allow_cpu` and `core_deny_cpu`,
//! measured in the thread's CPU time (see `rein_benches::ThreadCpuTime`).
//!
//! Run: `cargo bench -p rein-benches --bench core`.

use std::hint::black_box;

use criterion::measurement::Measurement;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use rein_benches::ThreadCpuTime;
use rein_core::{
    AcquireError, Algorithm, Limit, Micros, Policy, Timestamp,
    fixed_window::{FixedWindow, FixedWindowState},
    sliding_counter::{SlidingCounter, SlidingCounterState},
    sliding_log::{SlidingLog, SlidingLogState},
    token_bucket::{TokenBucket, TokenBucketState},
};

fn allow_heavy<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Elements(1));
    // One admission per µs against a refill of one per µs, or a window limit of one per µs.
    let second = Micros::from_secs(1);
    let bucket = ok(TokenBucket::new(1_000_000, 1_000_000, second));
    let window = ok(FixedWindow::new(1_000_000, second));
    // A 1 ms log holds 1000 entries; each admission retires one and appends one.
    let log = ok(SlidingLog::new(1_000, Micros::from_millis(1)));
    // Twice the steady rate: the weighted estimate never reaches the limit.
    let counter = ok(SlidingCounter::new(2_000_000, second));
    all_algorithms(&mut group, bucket, window, log, counter);
    group.finish();
}

fn deny_heavy<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Elements(1));
    let hour = Micros::from_secs(3_600);
    let bucket = ok(TokenBucket::new(10, 10, hour));
    let window = ok(FixedWindow::new(10, hour));
    let log = ok(SlidingLog::new(10, hour));
    let counter = ok(SlidingCounter::new(10, hour));
    all_algorithms(&mut group, bucket, window, log, counter);
    group.finish();
}

fn all_algorithms<M: Measurement>(
    group: &mut BenchmarkGroup<'_, M>,
    bucket: TokenBucket,
    window: FixedWindow,
    log: SlidingLog,
    counter: SlidingCounter,
) {
    decide(
        group,
        "token_bucket",
        TokenBucketState::default(),
        |now, s| bucket.acquire(now, s, 1),
    );
    decide(
        group,
        "token_bucket_try",
        TokenBucketState::default(),
        |now, s| bucket.try_acquire(now, s, 1),
    );
    decide(
        group,
        "fixed_window",
        FixedWindowState::default(),
        |now, s| window.acquire(now, s, 1),
    );
    decide(
        group,
        "fixed_window_try",
        FixedWindowState::default(),
        |now, s| window.try_acquire(now, s, 1),
    );
    decide(
        group,
        "sliding_log",
        SlidingLogState::default(),
        |now, s| log.acquire(now, s, 1),
    );
    decide(
        group,
        "sliding_counter",
        SlidingCounterState::default(),
        |now, s| counter.acquire(now, s, 1),
    );
    let single = Policy::single(Limit::TokenBucket(bucket));
    decide(
        group,
        "policy_token_bucket",
        single.new_state(),
        |now, s| single.acquire(now, s, 1),
    );
    let pair = ok(Policy::new([
        Limit::TokenBucket(bucket),
        Limit::FixedWindow(window),
    ]));
    decide(group, "policy_2_limits", pair.new_state(), |now, s| {
        pair.acquire(now, s, 1)
    });
}

/// Benchmarks one decision per iteration on one state, with `now` 1 µs later each time.
fn decide<S, D, M: Measurement>(
    group: &mut BenchmarkGroup<'_, M>,
    name: &str,
    mut state: S,
    acquire: impl Fn(Timestamp, &mut S) -> Result<D, AcquireError>,
) {
    group.bench_function(name, |b| {
        let mut micros = START;
        b.iter(|| {
            micros += 1;
            black_box(acquire(
                black_box(Timestamp::from_micros(micros)),
                &mut state,
            ))
        });
    });
}

/// Unwraps a limit built from the constants above, which are all valid.
fn ok<T, E: std::fmt::Debug>(built: Result<T, E>) -> T {
    built.expect("bench limits are valid")
}

/// Where time starts: mid-2023, so windows and buckets see realistic timestamps.
const START: u64 = 1_690_000_000_000_000;

fn wall_time(c: &mut Criterion) {
    allow_heavy(c, "core_allow");
    deny_heavy(c, "core_deny");
}

fn cpu_time(c: &mut Criterion<ThreadCpuTime>) {
    if rein_benches::cpu_time_requested() {
        allow_heavy(c, "core_allow_cpu");
        deny_heavy(c, "core_deny_cpu");
    }
}

rein_benches::quick_main!(wall_time, cpu_time);
