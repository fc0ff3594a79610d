//! The world's properties that need rein-redis's resilience layer (`ResilientLimiter`):
//! failure policies under partition, deadlines under stalls, the deny and allow caches, and
//! recovery. Each test pins its seeds, prints them and its numbers, and ends with an
//! invariant.

mod common;

use std::num::NonZeroU32;
use std::time::Duration;

use common::{run, suite_runs};
use proptest::prelude::*;
use rein::{BreakerConfig, FailurePolicy, Source};
use rein_core::{Algorithm, Limit, Micros, Policy, Timestamp};
use sim::oracle::{Fraction, Interval};
use sim::world::{EPOCH_SECS, Event, Fault, Guard, Run, Scenario, suite_scenario};

/// The true instant `offset` after the start of demand.
fn at(offset: Duration) -> Timestamp {
    Timestamp::from_micros(EPOCH_SECS * 1_000_000 + 200_000 + offset.as_micros() as u64)
}

fn partition(scenario: &Scenario) -> (Vec<usize>, Duration, Duration) {
    match &scenario.faults[..] {
        [Fault::Partition { nodes, from, until }] => (nodes.clone(), *from, *until),
        other => panic!("expected one partition, got {other:?}"),
    }
}

/// The cut-off nodes' decisions asked and answered during the scenario's one partition.
fn during_partition<'a>(run: &'a Run, scenario: &Scenario) -> impl Iterator<Item = &'a Event> {
    let (cut, from, until) = partition(scenario);
    run.events
        .iter()
        .filter(move |e| cut.contains(&e.node) && e.issued >= at(from) && e.answered <= at(until))
}

/// Checks a per-window bound given as a function of the window's length, by brute force over
/// every pair of admissions of key 0 (the closed span `[t_i, t_j]`): the exact forms of
/// docs/failure.md, with their floors and ceilings, which no single-policy oracle expresses.
fn every_window_within(run: &Run, bound: impl Fn(u64) -> Fraction) -> (bool, Fraction) {
    let mut times: Vec<(u64, u64)> = run
        .log
        .admissions()
        .iter()
        .filter(|a| a.key == 0)
        .map(|a| (a.at.as_micros(), a.cost))
        .collect();
    times.sort_unstable();
    let mut worst = None::<Fraction>;
    for i in 0..times.len() {
        let mut admitted = 0i128;
        for j in i..times.len() {
            admitted += i128::from(times[j].1);
            let b = bound(times[j].0 - times[i].0);
            let excess =
                Fraction::new(admitted * b.denominator() - b.numerator(), b.denominator()).unwrap();
            if worst.is_none_or(|w| excess > w) {
                worst = Some(excess);
            }
        }
    }
    let worst = worst.unwrap_or(Fraction::ZERO);
    (worst <= Fraction::ZERO, worst)
}

/// docs/failure.md, local fallback, token bucket: `C + r·T + k × (C' + ⌊T × r / (p × N)⌋)`.
fn failure_md_fallback_bound(policy: &Policy, cut: u64, n: u64) -> impl Fn(u64) -> Fraction {
    let Limit::TokenBucket(bucket) = policy.limits()[0] else {
        panic!("a token-bucket policy")
    };
    let (per_token, per_micro) = bucket.emission_interval();
    let (c, share) = (bucket.capacity(), (bucket.capacity() / n).max(1));
    move |t| {
        let whole = i128::from(c + cut * (share + t * per_micro / (per_token * n)));
        Fraction::new(
            whole * i128::from(per_token) + i128::from(t * per_micro),
            i128::from(per_token),
        )
        .unwrap()
    }
}

// 3. Partitions: fail closed admits nothing on the cut nodes; local fallback stays within
// Redis's limit plus one share per cut node; fail open is measured.

#[test]
fn partition_fail_closed_cut_off_nodes_admit_nothing() {
    for (_, s, run) in suite_runs("partition-fail-closed", [(301, 4), (302, 5)]) {
        let (cut, _, _) = partition(&s);
        let (asked, admitted) = during_partition(&run, &s).fold((0, 0), |(n, a), e| {
            (
                n + 1,
                a + usize::from(matches!(e.outcome, sim::world::Outcome::Admitted { .. })),
            )
        });
        eprintln!(
            "cut-off nodes {cut:?}: {asked} requests during the partition, {admitted} admitted"
        );
        assert!(
            asked > 0,
            "the cut-off nodes had demand during the partition"
        );
        assert_eq!(admitted, 0);
        assert!(run.result_with_allowance(0).is_within_bound());
    }
}

#[test]
fn partition_local_fallback_stays_within_limit_plus_one_share_per_cut_node() {
    for (nodes, s, run) in suite_runs("partition-local-fallback", [(311, 4), (312, 6)]) {
        let (cut, _, _) = partition(&s);
        let bound = s.fallback_bound(&cut).unwrap();
        let verdict = run.log.check_policy(&bound, 0);
        let measured = run.result_with_allowance(0);
        eprintln!(
            "k = {} of N = {nodes}: over-admission against the limit alone {}, against \
             limit + k shares {} (excess {})",
            cut.len(),
            measured.over_admission(),
            verdict.over_admission(),
            verdict.worst().map(|v| v.excess()).unwrap_or_default()
        );
        let (exact_form, worst) = every_window_within(
            &run,
            failure_md_fallback_bound(&s.policy, cut.len() as u64, nodes as u64),
        );
        eprintln!("docs/failure.md's exact form: worst excess {worst}");
        assert!(run.by_source()[3] > 0, "the fallback decided");
        assert!(verdict.is_within_bound());
        assert!(exact_form);
        assert!(
            run.result().is_within_bound(),
            "the constant-allowance form holds too"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 4,
        rng_seed: proptest::test_runner::RngSeed::Fixed(3),
        ..ProptestConfig::default()
    })]

    #[test]
    fn partition_of_any_subset_with_local_fallback_stays_within_limit_plus_k_shares(
        seed in 0u64..1_000,
        nodes in 2usize..=6,
        subset in any::<u8>(),
        from_ms in 100u64..800,
        length_ms in 100u64..900,
    ) {
        let mut s = suite_scenario("partition-local-fallback", nodes, seed).unwrap();
        let mut cut: Vec<usize> = (0..nodes).filter(|n| subset & (1 << n) != 0).collect();
        if cut.is_empty() {
            cut.push(0);
        }
        s.faults = vec![Fault::Partition {
            nodes: cut.clone(),
            from: Duration::from_millis(from_ms),
            until: Duration::from_millis(from_ms + length_ms),
        }];
        // Without the deny cache every request of a cut node asks Redis and falls back: with
        // it, a key Redis keeps denying can be answered from the cache for the whole cut.
        if let Some(guard) = s.guard.as_mut() {
            guard.deny_cache = false;
        }
        let run = run(&s);
        let verdict = run.log.check_policy(&s.fallback_bound(&cut).unwrap(), 0);
        eprintln!("cut {cut:?} of {nodes}: against limit + k shares {}", verdict.over_admission());
        prop_assert!(run.by_source()[3] > 0, "the fallback decided nothing: the bound went untested");
        prop_assert!(verdict.is_within_bound());
        let bound = failure_md_fallback_bound(&s.policy, cut.len() as u64, nodes as u64);
        prop_assert!(every_window_within(&run, bound).0);
    }
}

// 3b. One-way faults. Replies lost: Redis counts a call the node never hears about, and the
// node falls back for it; what Redis counted but nobody was told only lowers what Redis
// admits, so the partition's bound holds. Requests lost: Redis hears nothing, as in a
// partition.

/// Runs `name`, a one-way fault on nodes with local fallback, at each `(seed, nodes)` of
/// `cases`, and checks that the fallback decided and the partition's bound held (limit plus
/// a share per cut node, and docs/failure.md's exact form): each run's script runs no node
/// heard of.
fn one_way_fault_keeps_the_partition_bound<const N: usize>(
    name: &'static str,
    cases: [(u64, usize); N],
) -> Vec<u64> {
    let mut unanswered = Vec::new();
    for (nodes, s, run) in suite_runs(name, cases) {
        let cut = s.fallback_nodes();
        let verdict = run.log.check_policy(&s.fallback_bound(&cut).unwrap(), 0);
        let (exact_form, worst) = every_window_within(
            &run,
            failure_md_fallback_bound(&s.policy, cut.len() as u64, nodes as u64),
        );
        eprintln!(
            "{name} for {cut:?}: {} script runs no node heard of; against limit + k shares {}; \
             docs/failure.md's exact form: worst excess {worst}",
            run.unanswered_runs(),
            verdict.over_admission()
        );
        assert!(run.by_source()[3] > 0, "the fallback decided");
        assert!(verdict.is_within_bound());
        assert!(exact_form);
        assert!(run.result().is_within_bound());
        unanswered.push(run.unanswered_runs());
    }
    unanswered
}

#[test]
fn replies_lost_local_fallback_keeps_the_partition_bound_though_redis_counted_them() {
    let unanswered = one_way_fault_keeps_the_partition_bound(
        "replies-lost-local-fallback",
        [(331, 4), (332, 6)],
    );
    assert!(
        unanswered.iter().all(|&runs| runs > 0),
        "Redis counted calls whose replies were lost: {unanswered:?}"
    );
}

#[test]
fn requests_lost_local_fallback_keeps_the_partition_bound_with_no_unanswered_run() {
    let unanswered = one_way_fault_keeps_the_partition_bound(
        "requests-lost-local-fallback",
        [(341, 4), (342, 6)],
    );
    assert_eq!(unanswered, [0, 0], "every call Redis ran was answered");
}

#[test]
fn partition_fail_open_admits_every_cut_off_request_and_is_measured() {
    let s = suite_scenario("partition-fail-open", 4, 321).unwrap();
    let run = run(&s);
    let fail_open = during_partition(&run, &s)
        .map(|e| matches!(e.source, Some(Source::FailOpen(_))))
        .collect::<Vec<_>>();
    let measured = run.result_with_allowance(0);
    eprintln!(
        "fail open: {} requests of the cut-off nodes admitted unchecked; over-admission {}",
        fail_open.len(),
        measured.over_admission()
    );
    assert!(!fail_open.is_empty() && fail_open.iter().all(|&open| open));
    assert!(run.admitted() > run.exact_admitted());
}

// 4. A stall longer than the deadline, behind the resilience layer too.

#[test]
fn stall_behind_the_resilient_limiter_answers_within_deadline_plus_one_tick() {
    let mut s = suite_scenario("stall-past-deadline", 4, 401).unwrap();
    let expected_nodes = NonZeroU32::new(4).unwrap();
    s.guard = Some(Guard::new(FailurePolicy::LocalFallback { expected_nodes }));
    let run = run(&s);
    let worst = run.max_latency();
    eprintln!("slowest decision {} µs", worst.as_micros());
    assert!(
        run.by_source()[3] > 0,
        "the stall sent decisions to the fallback"
    );
    assert!(worst <= Micros::from(s.deadline + s.tick));
}

// 7. The deny cache is exact; the allow cache stays within its stated bound.

#[test]
fn deny_cache_over_admits_nothing() {
    for (_, _, run) in suite_runs("deny-cache", [(701, 3), (702, 6)]) {
        assert!(run.by_source()[1] > 0, "the deny cache answered");
        assert!(run.result_with_allowance(0).is_within_bound());
    }
}

#[test]
fn allow_cache_over_admits_within_its_stated_bound() {
    for (nodes, s, run) in suite_runs("allow-cache", [(711, 3), (712, 5)]) {
        let bound = s.allow_cache_bound().unwrap();
        let verdict = run.log.check_policy(&bound, 0);
        eprintln!(
            "allow cache reused {} times; over-admission against the limit {}; against its \
             bound {}",
            run.by_source()[2],
            run.result_with_allowance(0).over_admission(),
            verdict.over_admission()
        );
        // docs/failure.md's exact form: C + r·T + N × m × (⌈T / ttl⌉ + 1) × c̄, c̄ = 1.
        let Limit::TokenBucket(bucket) = s.policy.limits()[0] else {
            unreachable!()
        };
        let (per_token, per_micro) = bucket.emission_interval();
        let allow = s.guard.as_ref().unwrap().allow_cache.unwrap();
        let (ttl, m) = (
            allow.ttl().as_micros() as u64,
            u64::from(allow.max_reuses().get()),
        );
        let (exact_form, worst) = every_window_within(&run, |t| {
            let whole = bucket.capacity() + nodes as u64 * m * (t.div_ceil(ttl) + 1);
            Fraction::new(
                i128::from(whole * per_token + t * per_micro),
                i128::from(per_token),
            )
            .unwrap()
        });
        eprintln!("docs/failure.md's exact form: worst excess {worst}");
        assert!(run.by_source()[2] > 0, "the allow cache reused");
        assert!(verdict.is_within_bound());
        assert!(exact_form);
    }
}

// 8. Recovery: back on Redis within the breaker's longest backoff plus a probe; then no
// capacity is lost over a healthy minute of saturating demand.

#[test]
fn after_a_partition_heals_every_node_is_back_on_redis_within_max_backoff_plus_one_probe() {
    for (nodes, s, run) in suite_runs("recovery-after-partition", [(801, 3), (802, 5)]) {
        let (_, _, until) = partition(&s);
        let breaker = s.guard.as_ref().unwrap().breaker;
        // The longest backoff, the probe in flight when Redis came back (probe timeout: the
        // deadline), the successful probe's round trip, and the wait for a request to
        // arrive (at most 1.5 mean gaps of the workload, plus a tick).
        let bound = breaker.max_backoff()
            + s.deadline
            + 2 * s.max_latency
            + Duration::from_micros(1_500_000 / s.per_node_rate)
            + 2 * s.tick;
        for node in 0..nodes {
            let back = run
                .back_on_redis(node, at(until))
                .map(|t| Duration::from_micros(t.as_micros() - at(until).as_micros()));
            eprintln!("node {node} back on Redis after {back:?} (bound {bound:?})");
            assert!(back.is_some_and(|b| b <= bound));
        }
    }
}

#[test]
fn after_recovery_a_healthy_minute_of_saturating_demand_uses_at_least_95_percent() {
    let policy = Policy::single(Limit::token_bucket(10, 20, Micros::from_secs(1)).unwrap());
    let mut s = Scenario::new("recovery-healthy-minute", 811, 2, policy);
    s.per_node_rate = 30;
    s.span = Duration::from_secs(63);
    let mut guard = Guard::new(FailurePolicy::LocalFallback {
        expected_nodes: NonZeroU32::new(2).unwrap(),
    });
    guard.breaker =
        BreakerConfig::new().with_backoff(Duration::from_millis(50), Duration::from_millis(400));
    s.guard = Some(guard);
    s.faults = vec![Fault::Partition {
        nodes: vec![0, 1],
        from: Duration::from_millis(500),
        until: Duration::from_millis(1500),
    }];
    let run = run(&s);
    let minute = Interval::new(at(Duration::from_secs(2)), at(Duration::from_secs(62)));
    let used = run.log.policy_utilisation(&s.policy, 0, minute).unwrap();
    eprintln!("utilisation over the healthy minute: {:.4}", used.to_f64());
    assert!(used >= Fraction::new(95, 100).unwrap());
    assert!(run.result().is_within_bound());
}
