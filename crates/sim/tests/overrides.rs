//! Overrides changed while a node cannot reach Redis (issue 25): the suite's
//! `overrides-during-partition`, checked window by window against the bound
//! `sim::world::OverrideBound` states, and against what each node is documented to do
//! (docs/operations.md, "Overrides"): the nodes that reach Redis follow a change within
//! `staleness` plus their calls' deadlines; the node cut off decides by its local fallback,
//! at its share of the policy's own limit, whatever override it cached; back on Redis, it
//! may decide by its cached copy until its next re-read.

use std::collections::BTreeMap;
use std::time::Duration;

use rein::Source;
use rein_core::{Limit, Micros, Timestamp};
use sim::oracle::Window;
use sim::world::{EPOCH_SECS, Event, Fault, Outcome, Run, Scenario, suite_scenario};

/// The true instant `offset` after the start of demand.
fn at(offset: Duration) -> Timestamp {
    Timestamp::from_micros(EPOCH_SECS * 1_000_000 + 200_000 + offset.as_micros() as u64)
}

/// Seconds from the start of demand, for messages.
fn secs(t: Timestamp) -> f64 {
    (t.as_micros() as f64 - at(Duration::ZERO).as_micros() as f64) / 1e6
}

fn ms(d: Micros) -> f64 {
    d.as_micros() as f64 / 1e3
}

fn scenario(seed: u64) -> Scenario {
    suite_scenario("overrides-during-partition", 3, seed).expect("a suite scenario")
}

/// The one partition: its nodes and its true span.
fn partition(s: &Scenario) -> (Vec<usize>, Timestamp, Timestamp) {
    match &s.faults[..] {
        [Fault::Partition { nodes, from, until }] => (nodes.clone(), at(*from), at(*until)),
        other => panic!("expected one partition, got {other:?}"),
    }
}

/// The fixed window's limit of a policy of one.
fn fixed_limit(limits: &[Limit]) -> u64 {
    match limits {
        [Limit::FixedWindow(w)] => w.limit(),
        other => panic!("expected one fixed window, got {other:?}"),
    }
}

/// Redis's admissions (those it decided, answered to a node) that went beyond the limit in
/// force when they ran: the n-th admission of an aligned window, n above the limit the
/// operator's last answered write had set. Each was decided by a node's older copy.
fn beyond_the_limit_in_force(run: &Run) -> Vec<Event> {
    let s = &run.scenario;
    let window = match s.policy.limits() {
        [Limit::FixedWindow(w)] => w.window().as_micros(),
        _ => unreachable!(),
    };
    let schedule = s.overrides.as_ref().expect("overrides");
    let mut in_force = vec![(Timestamp::from_micros(0), fixed_limit(s.policy.limits()))];
    for (change, written) in schedule.changes.iter().zip(&run.override_writes) {
        let limit = match &change.value {
            Some(rein_core::overrides::Override::Limits(p)) => fixed_limit(p.limits()),
            other => panic!("the scenario sets limits, not {other:?}"),
        };
        in_force.push((written.answered, limit));
    }
    let mut redis: Vec<(Timestamp, Event)> = run
        .events
        .iter()
        .filter(|e| e.source == Some(Source::Store))
        .filter_map(|e| match e.outcome {
            Outcome::Admitted { at, .. } => Some((at, *e)),
            _ => None,
        })
        .collect();
    redis.sort_by_key(|(t, e)| (*t, e.node));
    let mut count: BTreeMap<u64, u64> = BTreeMap::new();
    let mut beyond = Vec::new();
    for (t, e) in redis {
        let n = count.entry(t.as_micros() / window).or_default();
        *n += e.cost;
        let limit = in_force
            .iter()
            .rev()
            .find(|(since, _)| *since <= t)
            .map_or(0, |&(_, l)| l);
        if *n > limit {
            beyond.push(Event {
                outcome: Outcome::Admitted {
                    at: t,
                    traced: true,
                },
                ..e
            });
        }
    }
    beyond
}

/// When each of `events` was admitted.
fn last(events: &[&Event]) -> Vec<Timestamp> {
    events
        .iter()
        .filter_map(|e| match e.outcome {
            Outcome::Admitted { at, .. } => Some(at),
            _ => None,
        })
        .collect()
}

#[test]
fn overrides_changed_during_a_partition_stay_within_their_bound() {
    let (mut lagged, mut stale_copies) = (0, 0);
    for seed in [2501, 2502] {
        let s = scenario(seed);
        eprintln!("seed {seed} ({}): {}", s.name, s.describe_faults());
        let run = s.run().expect("the world runs");
        eprintln!("{} | sources {:?}", run.summary(), run.by_source());
        assert_eq!(run.untraced(), 0, "every admission's script run was seen");
        assert_eq!(run.override_writes.len(), 2, "the operator wrote twice");
        let schedule = s.overrides.as_ref().expect("overrides");
        let guard = s.guard.as_ref().expect("a guard");
        let (cut, from, until) = partition(&s);
        let lag = Micros::from(schedule.staleness + 2 * s.deadline);

        // The bound, window by window: each held, and the windows inside the phases at it
        // exactly (so a bound one unit tighter fails: checked below).
        let bound = run
            .override_bound()
            .expect("the scenario has a stated bound");
        let windows = bound.check(&run.log);
        for w in &windows {
            eprintln!(
                "  window from {:.1} s: {} admitted, bound {}",
                secs(Timestamp::from_micros(
                    w.span.first.as_micros() - w.span.first.as_micros() % 1_000_000
                )),
                w.admitted,
                w.bound
            );
        }
        assert!(windows.len() >= 5, "every window admitted");
        assert!(windows.iter().all(Window::is_within_bound));
        assert!(
            run.result().is_within_bound(),
            "the report's verdict agrees"
        );
        let at_bound = windows
            .iter()
            .filter(|w| w.excess() == sim::oracle::Fraction::ZERO)
            .count();
        assert!(
            at_bound >= 3,
            "the bound is met exactly in {at_bound} windows"
        );
        let tighter = run
            .log
            .aligned_windows(0, bound.window(), |start| bound.at(start).saturating_sub(1));
        assert!(
            !tighter.iter().all(Window::is_within_bound),
            "one unit less would be broken"
        );

        // The node cut off: nothing decided in Redis while cut off (a call already on its
        // way may still run), and on its fallback at most a share of the policy's own
        // limit per window, which it uses whole in the window the partition covers:
        // neither the raised override's share nor the lowered one's.
        let share = fixed_limit(s.policy.limits()) / s.nodes as u64;
        let redis_while_cut = run.events.iter().filter(|e| {
            cut.contains(&e.node)
                && e.source == Some(Source::Store)
                && matches!(e.outcome, Outcome::Admitted { at, .. }
                    if at > from.saturating_add(s.max_latency.into()) && at < until)
        });
        assert_eq!(redis_while_cut.count(), 0);
        let mut fallback: BTreeMap<u64, u64> = BTreeMap::new();
        for e in &run.events {
            if let (Some(Source::Fallback(_)), Outcome::Admitted { at, .. }) = (e.source, e.outcome)
            {
                assert!(cut.contains(&e.node), "only the node cut off fell back");
                *fallback.entry(at.as_micros() / 1_000_000).or_default() += e.cost;
            }
        }
        eprintln!(
            "  node 0 on its fallback, per window from: {:?} (share {share})",
            fallback
                .iter()
                .map(|(&second, &n)| (secs(Timestamp::from_micros(second * 1_000_000)), n))
                .collect::<Vec<_>>()
        );
        assert!(fallback.values().all(|&n| n <= share));
        let inside = (from.as_micros() / 1_000_000 + 1)..(until.as_micros() / 1_000_000);
        assert!(!inside.is_empty());
        for second in inside {
            assert_eq!(
                fallback.get(&second),
                Some(&share),
                "a full window on fallback"
            );
        }

        // Beyond the limit in force: only by a copy not yet re-read. The nodes that reach
        // Redis stop within `staleness + 2 × deadline` of the write; the node cut off, within
        // that of being back on Redis, which is within the recovery the bound allows.
        let lowered = run.override_writes[1].answered;
        let back = run
            .back_on_redis(cut[0], until)
            .expect("back on Redis after the heal");
        let recovery = Micros::from(
            guard.breaker.max_backoff()
                + 2 * s.deadline
                + Duration::from_micros(1_500_000 / s.per_node_rate)
                + 2 * s.tick,
        );
        let beyond = beyond_the_limit_in_force(&run);
        let (stale, connected): (Vec<_>, Vec<_>) =
            beyond.iter().partition(|e| cut.contains(&e.node));
        let connected_last = last(&connected).into_iter().max();
        eprintln!(
            "  nodes that reach Redis: {} admitted beyond the lowered limit, the last {:?} ms \
             after the write (bound {} ms)",
            connected.len(),
            connected_last.map(|t| ms(t.saturating_since(lowered))),
            ms(lag)
        );
        for t in last(&connected) {
            assert!(t < lowered.saturating_add(lag));
        }
        let stale_last = last(&stale).into_iter().max();
        eprintln!(
            "  node 0: back on Redis {} ms after the heal (bound {} ms); {} admitted by its \
             cached copy of the raised override, the last {:?} ms after it was back (bound {} \
             ms)",
            ms(back.saturating_since(until)),
            ms(recovery),
            stale.len(),
            stale_last.map(|t| ms(t.saturating_since(back))),
            ms(lag)
        );
        assert!(back.saturating_since(until) <= recovery);
        for t in last(&stale) {
            assert!(t >= until && t < back.saturating_add(lag));
        }
        lagged += connected.len();
        stale_copies += stale.len();
    }
    // Both ways of deciding by an old copy happened, so the checks above checked something.
    assert!(
        lagged > 0,
        "a node that reaches Redis decided by its old copy"
    );
    assert!(
        stale_copies > 0,
        "the node cut off decided by its cached copy once back"
    );
}
