//! Lease-mode decisions against direct Redis decisions, in one run over one private
//! `redis-server` (docs/leases.md, "Measured").
//!
//! For a fixed window (leased in blocks) and a token bucket (leased as rate), each never
//! exhausted here:
//! - `lease`: one task deciding one hot key through a `LeasedLimiter`: almost every decision
//!   is a local lease hit.
//! - `lease_front_door`: the same through the front door, `ResilientLimiter` with leases
//!   on (`acquire_as(policy, key, cost)`): what the gate's checks, its counters and the
//!   policy table add to a lease hit.
//! - `direct`: the same policy decided by the Redis store itself, one call each.
//!
//! After criterion, per algorithm, a throughput run (8 tasks on 4 hot keys for 1 s, each
//! mode) prints decisions/s, the local latency distribution (p50/p99 of single lease
//! decisions), and Redis calls per thousand decisions (reservations, returns and direct
//! calls).

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use rein::lease::{Leased, LeasedLimiter};
use rein::{FailurePolicy, LeaseConfig, PolicyTable, ResilientLimiter};
use rein_core::{Limit, Limiter, NamedPolicy, Policy};
use rein_redis::{RedisStore, RedisStoreBuilder};
use rein_redis_harness::RedisServer;
use tokio::runtime::Runtime;

/// Limits the bench never exhausts: 2^40 per the longest window, and a bucket of 10^8
/// refilled at 10^8 per second (small enough for exact rate shares).
fn policies() -> [(&'static str, NamedPolicy); 2] {
    let window = Limit::fixed_window(1 << 40, rein_core::time::MAX_SPAN).expect("valid");
    let bucket = Limit::token_bucket(100_000_000, 100_000_000, rein_core::Micros::from_secs(1))
        .expect("valid");
    [
        (
            "fixed_window",
            NamedPolicy::new("bench-fw", Policy::single(window)).expect("valid"),
        ),
        (
            "token_bucket",
            NamedPolicy::new("bench-tb", Policy::single(bucket)).expect("valid"),
        ),
    ]
}

type Store = RedisStore<redis::aio::ConnectionManager>;

struct Setup {
    runtime: Runtime,
    _server: RedisServer,
    store: Store,
    leased: LeasedLimiter<Store>,
    /// The front door: the resilient limiter with leases on, both policies in its table.
    front: ResilientLimiter<Store, Leased<Store>>,
}

fn setup() -> Setup {
    let server = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let url = server.url();
    let (store, leased, front) = runtime.block_on(async {
        let connect = || async {
            RedisStoreBuilder::new()
                // Generous: the machine is shared; a timeout here is counted, not fatal.
                .deadline(Duration::from_millis(500))
                .connect(&url)
                .await
                .expect("connect")
        };
        let leased = LeasedLimiter::builder(connect().await)
            .config(LeaseConfig {
                // A fair share is capacity / nodes: huge here; the block follows demand.
                ..LeaseConfig::default()
            })
            .build()
            .expect("valid lease settings");
        let [(_, window), (_, bucket)] = policies();
        let table = PolicyTable::new(window)
            .with_policy(bucket)
            .expect("two policies");
        let front = ResilientLimiter::builder(connect().await, table, FailurePolicy::FailClosed)
            .leases(LeaseConfig::default())
            .build()
            .expect("a limiter");
        (connect().await, leased, front)
    });
    Setup {
        runtime,
        _server: server,
        store,
        leased,
        front,
    }
}

fn decisions(c: &mut Criterion) {
    let s = setup();
    for (algorithm, policy) in policies() {
        decide_hot_key(c, &s, algorithm, &policy);
    }
    for (algorithm, policy) in policies() {
        throughput_run(&s, algorithm, &policy);
    }
}

fn decide_hot_key(c: &mut Criterion, s: &Setup, algorithm: &str, policy: &NamedPolicy) {
    let leased_policy = s.leased.prepare(policy).expect("prepare");
    let direct_policy = s.store.prepare(policy).expect("prepare");
    let mut group = c.benchmark_group(format!("decide_hot_key/{algorithm}"));
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    group.sample_size(20);
    let runtime = &s.runtime;
    sequential(&mut group, "lease", runtime, || {
        s.leased.acquire_leased(None, &leased_policy, b"hot", 1)
    });
    sequential(&mut group, "lease_front_door", runtime, || {
        s.front.acquire_as(policy.name(), "hot-front", 1)
    });
    sequential(&mut group, "direct", runtime, || {
        Limiter::acquire(&s.store, None, &direct_policy, b"hot-direct", 1)
    });
    group.finish();
}

/// Benches `decide` one call after another on `runtime`: criterion's `n` calls, timed
/// together, each answer checked and kept from the optimiser.
fn sequential<F, T, E>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    mode: &str,
    runtime: &Runtime,
    mut decide: impl FnMut() -> F,
) where
    F: Future<Output = Result<T, E>>,
    E: Debug,
{
    group.bench_function(BenchmarkId::new(mode, "redis"), |b| {
        b.iter_custom(|n| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..n {
                    std::hint::black_box(decide().await.expect("a decision"));
                }
                start.elapsed()
            })
        })
    });
}

/// How many answers 8 tasks on 4 hot keys (`{prefix}-0` to `-3`) get from `$decide` in
/// `run`, each task with its own clone of the `$shared` values. Only answers count: an
/// error (a timeout on a busy machine) does not. A macro, not a function: the tasks are
/// spawned, and a closure returning a `'static` future would clone per decision.
macro_rules! answers_in {
    ($runtime:expr, $run:expr, $prefix:literal, ($($shared:ident),*), |$key:ident| $decide:expr) => {
        $runtime.block_on(async {
            let count = Arc::new(AtomicU64::new(0));
            let end = Instant::now() + $run;
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    $(let $shared = $shared.clone();)*
                    let count = count.clone();
                    let key = format!(concat!($prefix, "-{}"), i % 4);
                    tokio::spawn(async move {
                        let $key = key.as_bytes();
                        while Instant::now() < end {
                            if std::hint::black_box($decide.await).is_ok() {
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("a task");
            }
            count.load(Ordering::Relaxed)
        })
    };
}

/// 8 tasks on 4 hot keys for 1 s per mode; then single-decision latencies.
fn throughput_run(s: &Setup, algorithm: &str, policy: &NamedPolicy) {
    let leased_policy = Arc::new(s.leased.prepare(policy).expect("prepare"));
    let direct_policy = Arc::new(s.store.prepare(policy).expect("prepare"));
    let before = s.leased.stats();
    let run = Duration::from_secs(1);
    let (leased, store) = (s.leased.clone(), Arc::new(s.store.clone()));
    let leased_count = answers_in!(&s.runtime, run, "tp", (leased, leased_policy), |key| {
        leased.acquire_leased(None, &leased_policy, key, 1)
    });
    let after = s.leased.stats();
    let direct_count = answers_in!(&s.runtime, run, "tpd", (store, direct_policy), |key| {
        Limiter::acquire(&*store, None, &*direct_policy, key, 1)
    });
    let calls = (after.reservations - before.reservations)
        + (after.returns - before.returns)
        + (after.direct - before.direct);
    println!(
        "{algorithm}: throughput, 8 tasks on 4 hot keys, 1 s each: lease {leased_count}/s, direct Redis \
         {direct_count}/s ({:.1}x); lease mode Redis calls per 1000 decisions: {:.2}",
        leased_count as f64 / direct_count.max(1) as f64,
        calls as f64 * 1000.0 / leased_count.max(1) as f64,
    );
    // Single lease decisions, timed one by one (includes two clock reads, ~50 ns).
    let mut latencies: Vec<u64> = s.runtime.block_on(async {
        let mut v = Vec::with_capacity(100_000);
        for _ in 0..100_000 {
            let start = Instant::now();
            let d = s
                .leased
                .acquire_leased(None, &leased_policy, b"lat", 1)
                .await;
            v.push(start.elapsed().as_nanos() as u64);
            let _ = std::hint::black_box(d.expect("a decision"));
        }
        v
    });
    latencies.sort_unstable();
    let q = |p: usize| latencies[latencies.len() * p / 1000];
    println!(
        "{algorithm}: lease decision latency (100 000, one task): p50 {} ns, p99 {} ns, p99.9 {} ns",
        q(500),
        q(990),
        q(999)
    );
}

criterion_group!(benches, decisions);
criterion_main!(benches);
