//! The world's properties (issue 5): many nodes running rein-redis unmodified against the
//! simulated Redis, under faults, judged by the oracle. Each test pins its seeds, prints
//! them and its measured numbers (`--nocapture`), and ends with an invariant.

mod common;

use std::time::Duration;

use common::{run, suite_runs};
use proptest::prelude::*;
use rein_core::{Limit, Micros, Policy};
use sim::redis::Persistence;
use sim::world::{Fault, Scenario, TimeSource, Workload, suite_scenario};

fn exact_limits() -> [Limit; 3] {
    let second = Micros::from_secs(1);
    [
        Limit::token_bucket(20, 100, second).unwrap(),
        Limit::sliding_log(100, second).unwrap(),
        Limit::fixed_window(100, second).unwrap(),
    ]
}

// 1. Healthy Redis, any N, jitter: exact algorithms admit exactly within their bound; the
// sliding counter within its documented `2 × limit − 1` per window.

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, rng_seed: proptest::test_runner::RngSeed::Fixed(5), ..ProptestConfig::default() })]

    #[test]
    fn healthy_redis_admits_no_more_than_any_exact_limit(
        seed in 0u64..1_000,
        // Two nodes or more, so that the demand on the busiest key is past its limit and the
        // bound is tested where it binds.
        nodes in 2usize..=5,
        algorithm in 0usize..3,
        max_latency_ms in 1u64..=8,
        hot in any::<bool>(),
    ) {
        let mut s = Scenario::new("healthy-exact", seed, nodes, Policy::single(exact_limits()[algorithm]));
        s.max_latency = Duration::from_millis(max_latency_ms);
        s.span = Duration::from_millis(1500);
        if hot {
            s.workload = Workload::HotKey { keys: 4 };
        }
        let run = run(&s);
        let result = run.result_with_allowance(0);
        prop_assert_eq!(run.failures(), 0);
        prop_assert!(result.is_within_bound(), "over-admission {}", result.over_admission());
        // Not vacuous: the limit denied some of the demand, and what it admitted is what one
        // exact limiter would have (a limiter denying everything would pass the bound).
        let (admitted, exact) = (run.admitted(), run.exact_admitted());
        prop_assert!(admitted < run.demanded(), "the limit never bound");
        prop_assert!(admitted * 100 >= exact * 97, "admitted {} of an exact {}", admitted, exact);
    }
}

#[test]
fn healthy_redis_sliding_counter_stays_within_its_documented_error() {
    for (_, _, run) in suite_runs("healthy-sliding-counter", [(11, 2), (12, 5)]) {
        let result = run.result_with_allowance(0);
        let against_log = result
            .verdict
            .verdicts
            .iter()
            .filter_map(|v| v.against_exact_log)
            .map(|w| w.excess())
            .max()
            .unwrap_or_default();
        eprintln!("busiest window against the exact log: excess {against_log}");
        assert_eq!(run.failures(), 0);
        assert!(result.is_within_bound(), "{}", result.over_admission());
    }
}

// 2. Skewed client clocks: server time is exact; client time stays within rate × (clock
// spread + deadline).

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, rng_seed: proptest::test_runner::RngSeed::Fixed(6), ..ProptestConfig::default() })]

    #[test]
    fn skewed_clocks_server_time_is_exact_and_client_time_is_within_rate_times_skew(
        seed in 0u64..1_000,
        nodes in 2usize..=5,
        skew_ms in 1u64..=300,
    ) {
        let mut s = suite_scenario("skew-server-time", nodes, seed).unwrap();
        s.max_skew = Duration::from_millis(skew_ms);
        s.span = Duration::from_millis(1500);
        let server = run(&s).result_with_allowance(0);
        prop_assert!(server.is_within_bound(), "server time over-admitted {}", server.over_admission());

        s.time = TimeSource::Client;
        s.name = "skew-client-time".into();
        let client = run(&s);
        let measured = client.result_with_allowance(0);
        eprintln!(
            "client time, skew ±{skew_ms} ms: over-admission {} (allowance {})",
            measured.over_admission(),
            s.allowance()
        );
        prop_assert!(client.result().is_within_bound());
    }
}

// 4. A stall longer than the deadline: every decision returns within deadline + one tick.

#[test]
fn stall_longer_than_the_deadline_never_delays_a_decision_past_deadline_plus_one_tick() {
    for (_, s, run) in suite_runs("stall-past-deadline", [(21, 3), (22, 6)]) {
        let worst = run.max_latency();
        let limit = Micros::from(s.deadline + s.tick);
        eprintln!(
            "slowest decision {} µs, limit {} µs",
            worst.as_micros(),
            limit.as_micros()
        );
        assert!(run.failures() > 0, "the stall was felt");
        assert!(worst <= limit);
        assert!(run.result_with_allowance(0).is_within_bound());
    }
}

// 5. Redis crash losing all data: over-admission ≤ one full capacity per key per crash.

#[test]
fn redis_crash_with_data_loss_over_admits_at_most_one_capacity_per_crash() {
    for (seed, nodes, crashes) in [(31, 3, 1), (32, 4, 2)] {
        let mut s = suite_scenario("redis-crash-data-loss", nodes, seed).unwrap();
        s.workload = Workload::HotKey { keys: 3 };
        s.faults = (0..crashes)
            .map(|i| Fault::RedisCrash {
                at: Duration::from_millis(500 + 700 * i),
                down: Duration::from_millis(30),
            })
            .collect();
        let run = run(&s);
        assert!(run.failures() > 0, "the crash was felt");
        let result = run.result();
        assert_eq!(result.facts.extra_allowance, crashes * s.policy.capacity());
        assert!(result.is_within_bound(), "{}", result.over_admission());
        // Not vacuous: the crash lost the counts, so the limit alone is exceeded.
        let lost = run.result_with_allowance(0);
        assert!(
            !lost.is_within_bound(),
            "the lost counts over-admitted nothing"
        );
    }
}

#[test]
fn redis_restart_keeping_data_over_admits_nothing() {
    let mut s = suite_scenario("redis-crash-data-loss", 3, 33).unwrap();
    s.persistence = Persistence::KeepData;
    let run = run(&s);
    assert!(run.failures() > 0, "the crash was felt");
    assert!(run.result().facts.extra_allowance == 0 && run.result().is_within_bound());
}

// 6. Script cache loss (failover, SCRIPT FLUSH): the NOSCRIPT path loses no decision.

#[test]
fn script_cache_loss_fails_no_decision() {
    for (_, _, run) in suite_runs("script-cache-loss", [(41, 2), (42, 5)]) {
        eprintln!("{} calls found the script cache empty", run.runs_by_source);
        assert!(run.runs_by_source > 0, "the flushes were felt");
        assert_eq!(run.failures(), 0);
        assert!(run.result_with_allowance(0).is_within_bound());
    }
}

// 9. Determinism: one seed, one trace.

#[test]
fn same_seed_gives_a_byte_identical_trace_and_another_seed_differs() {
    let mut s = suite_scenario("redis-crash-data-loss", 3, 91).unwrap();
    s.workload = Workload::Bursty { burst: 4 };
    s.max_skew = Duration::from_millis(20);
    s.time = TimeSource::Client;
    s.span = Duration::from_millis(1500);
    let first = run(&s).digest();
    let again = run(&s).digest();
    s.seed = 92;
    let other = run(&s).digest();
    eprintln!("digests: {first} {again} {other}");
    assert_eq!(first, again);
    assert_ne!(first, other);
}

/// Two runs that differ only in who decided (Redis, a cache, the failure policy) must not
/// share a digest: the trace is the decisions *and* their sources.
#[test]
fn a_decision_with_another_source_changes_the_digest() {
    let mut s = suite_scenario("partition-local-fallback", 3, 93).unwrap();
    s.span = Duration::from_millis(1500);
    let run = run(&s);
    let digest = run.digest();
    let sources: Vec<_> = run.events.iter().map(|e| e.source).collect();
    // Swap two sources the run really had, so the values are real ones: Redis and the
    // fallback (and the deny cache, if it answered).
    let i = sources
        .iter()
        .position(|s| *s != sources[0])
        .expect("more than one source");
    let mut swapped = run.clone();
    swapped.events[0].source = sources[i];
    swapped.events[i].source = sources[0];
    eprintln!("swapped {:?} and {:?}", sources[0], sources[i]);
    assert_ne!(swapped.digest(), digest);
    let mut dropped = run.clone();
    dropped.events[0].source = None;
    assert_ne!(dropped.digest(), digest);
    assert_eq!(run.clone().digest(), digest);
}

// 10. The baseline: a read-modify-write bucket decided on the client over-admits where rein
// is exact.

#[test]
fn naive_read_modify_write_bucket_over_admits_where_rein_is_exact() {
    for (seed, nodes) in [(101, 3), (102, 6)] {
        let naive = run(&suite_scenario("naive-baseline", nodes, seed).unwrap());
        let rein = run(&suite_scenario("healthy-token-bucket", nodes, seed).unwrap());
        let (naive, rein) = (naive.result(), rein.result());
        eprintln!(
            "same demand ({}): naive admitted {} (over-admission {}), rein admitted {} (over-admission {})",
            naive.facts.demanded,
            naive.admitted,
            naive.over_admission(),
            rein.admitted,
            rein.over_admission()
        );
        assert_eq!(naive.facts.demanded, rein.facts.demanded);
        assert!(rein.is_within_bound());
        assert!(!naive.is_within_bound(), "the race did not show");
    }
}
