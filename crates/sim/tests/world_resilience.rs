//! The world's properties that need rein-redis's resilience layer (`ResilientLimiter`):
//! failure policies under partition, deadlines under stalls, the deny and allow caches, and
//! recovery. Each test pins its seeds, prints them and its numbers, and ends with an
//! invariant.

use std::num::NonZeroU32;
use std::time::Duration;

use rein_core::{Limit, Micros, Policy, Timestamp};
use rein_redis::{BreakerConfig, FailurePolicy, Source};
use sim::oracle::{Fraction, Interval};
use sim::world::{EPOCH_SECS, Fault, Guard, Run, Scenario, suite_scenario};

fn run(scenario: &Scenario) -> Run {
    eprintln!("seed {} ({})", scenario.seed, scenario.name);
    let run = scenario.run().expect("the world runs");
    eprintln!("{} | sources {:?}", run.summary(), run.by_source());
    assert_eq!(run.untraced(), 0, "every admission's script run was seen");
    run
}

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

// 3. Partitions: fail closed admits nothing on the cut nodes; local fallback stays within
// Redis's limit plus one share per cut node; fail open is measured.

#[test]
fn partition_fail_closed_cut_off_nodes_admit_nothing() {
    for (seed, nodes) in [(301, 4), (302, 5)] {
        let s = suite_scenario("partition-fail-closed", nodes, seed).unwrap();
        let run = run(&s);
        let (cut, from, until) = partition(&s);
        let during = run
            .events
            .iter()
            .filter(|e| cut.contains(&e.node) && e.issued >= at(from) && e.answered <= at(until));
        let (asked, admitted) = during.fold((0, 0), |(n, a), e| {
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
    for (seed, nodes) in [(311, 4), (312, 6)] {
        let s = suite_scenario("partition-local-fallback", nodes, seed).unwrap();
        let run = run(&s);
        let (cut, _, _) = partition(&s);
        let bound = s.fallback_bound(cut.len() as u64).unwrap();
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
        assert!(run.by_source()[3] > 0, "the fallback decided");
        assert!(verdict.is_within_bound());
        assert!(
            run.result().is_within_bound(),
            "the constant-allowance form holds too"
        );
    }
}

#[test]
fn partition_fail_open_admits_every_cut_off_request_and_is_measured() {
    let s = suite_scenario("partition-fail-open", 4, 321).unwrap();
    let run = run(&s);
    let (cut, from, until) = partition(&s);
    let fail_open = run
        .events
        .iter()
        .filter(|e| cut.contains(&e.node) && e.issued >= at(from) && e.answered <= at(until))
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
    for (seed, nodes) in [(701, 3), (702, 6)] {
        let s = suite_scenario("deny-cache", nodes, seed).unwrap();
        let run = run(&s);
        assert!(run.by_source()[1] > 0, "the deny cache answered");
        assert!(run.result_with_allowance(0).is_within_bound());
    }
}

#[test]
fn allow_cache_over_admits_within_its_stated_bound() {
    for (seed, nodes) in [(711, 3), (712, 5)] {
        let s = suite_scenario("allow-cache", nodes, seed).unwrap();
        let run = run(&s);
        let bound = s.allow_cache_bound().unwrap();
        let verdict = run.log.check_policy(&bound, 0);
        eprintln!(
            "allow cache reused {} times; over-admission against the limit {}; against its \
             bound {}",
            run.by_source()[2],
            run.result_with_allowance(0).over_admission(),
            verdict.over_admission()
        );
        assert!(run.by_source()[2] > 0, "the allow cache reused");
        assert!(verdict.is_within_bound());
    }
}

// 8. Recovery: back on Redis within the breaker's longest backoff plus a probe; then no
// capacity is lost over a healthy minute of saturating demand.

#[test]
fn after_a_partition_heals_every_node_is_back_on_redis_within_max_backoff_plus_one_probe() {
    for (seed, nodes) in [(801, 3), (802, 5)] {
        let s = suite_scenario("recovery-after-partition", nodes, seed).unwrap();
        let run = run(&s);
        let (_, _, until) = partition(&s);
        let breaker = s.guard.as_ref().unwrap().breaker;
        // The longest backoff, the probe in flight when Redis came back (probe timeout: the
        // deadline), the successful probe's round trip, and the wait for a request to
        // arrive (at most 1.5 mean gaps of the workload, plus a tick).
        let bound = breaker.max_backoff_value()
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
        BreakerConfig::new().backoff(Duration::from_millis(50), Duration::from_millis(400));
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
