//! Leases in the simulated world (issue 10): nodes running rein's `LeasedLimiter` over the
//! real store admit hot keys from blocks reserved in Redis, on skewed clocks, through a
//! partition, through lost replies and through a node's process paused for longer than any
//! block lives; the oracle checks every window (for a sliding log, every span) of every key
//! against the limit itself, with no allowance. A Redis restart that loses its data is the
//! one fault that forgives anything: see the second test. Seeds are pinned and printed.

mod common;

use std::time::Duration;

use common::run;
use rein_core::{Limit, Micros, Policy};
use sim::oracle::Interval;
use sim::world::{Fault, LimiterKind, Outcome, Run, Scenario, Workload, suite_scenario};

/// A paused node must not spend a block it held before the pause, whose end passed while it
/// was stopped: it admits nothing while paused, and nothing from a lease at resume until a
/// reservation made after it could have been answered (two one-way latencies; a reply held
/// through the pause answers a reservation sent before it, so its block is over too). It
/// does lease again after that (`leases_again`), except a token bucket's node under demand
/// above the rate: its share ended during the pause, and a share taken again starts empty
/// and grows only as the others shrink at their renewals, which the run's last few hundred
/// milliseconds may not see. A stale block spent at resume shows here whatever the windows'
/// slack, which the oracle needs the windows to be full to see.
fn stale_spends(
    run: &Run,
    nodes: &[usize],
    (from, until): (Duration, Duration),
    leases_again: bool,
) -> Vec<String> {
    let start = run.interval().start;
    let at = |d: Duration| start.saturating_add(Micros::from(d));
    let round_trip = at(until + 2 * run.scenario.min_latency);
    let mut failed = Vec::new();
    for &node in nodes {
        let leases = |lo, hi| {
            run.events
                .iter()
                .filter(|e| e.node == node && e.source.is_none())
                .filter(|e| matches!(e.outcome, Outcome::Admitted { .. }))
                .filter(|e| lo <= e.answered && e.answered < hi)
                .count()
        };
        let during = run.admitted_by(&[node], Interval::new(at(from), at(until)));
        let stale = leases(at(until), round_trip);
        let after = leases(round_trip, run.end);
        eprintln!(
            "node {node}: {during} admitted while paused, {stale} leased at resume before a new reservation could be answered, {after} leased later"
        );
        if during > 0 || stale > 0 || (leases_again && after == 0) {
            failed.push(format!(
                "seed {}: paused node {node}: {during} while paused, {stale} stale, {after} later",
                run.scenario.seed
            ));
        }
    }
    failed
}

/// Hot keys, demand well above the limit, on clocks up to 250 ms apart.
fn scenario(seed: u64, nodes: usize, limit: Limit, faults: Vec<Fault>) -> Scenario {
    let mut s = Scenario::new("leased", seed, nodes, Policy::single(limit));
    s.limiter = LimiterKind::Leased;
    s.workload = Workload::HotKey { keys: 2 };
    s.per_node_rate = 120;
    s.max_skew = Duration::from_millis(250);
    s.faults = faults;
    s
}

fn fw() -> Limit {
    Limit::fixed_window(150, Micros::from_secs(1)).unwrap()
}

fn sc() -> Limit {
    Limit::sliding_counter(150, Micros::from_secs(1)).unwrap()
}

fn sl() -> Limit {
    Limit::sliding_log(150, Micros::from_secs(1)).unwrap()
}

/// Leased as rate: a burst of 30, 150 per second.
fn tb() -> Limit {
    Limit::token_bucket(30, 150, Micros::from_secs(1)).unwrap()
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[test]
fn leased_nodes_never_admit_over_the_limit_healthy_cut_off_deaf_or_paused_on_skewed_clocks() {
    let second = Micros::from_secs(1);
    let cut = |nodes: Vec<usize>| Fault::Partition {
        nodes,
        from: ms(600),
        until: ms(1_400),
    };
    let deaf = |nodes: Vec<usize>| Fault::RepliesLost {
        nodes,
        from: ms(600),
        until: ms(1_400),
    };
    // Paused from 0.85 s to 2.15 s: longer than any block lives (a window's blocks end at
    // its boundary, at most 1 s; a log's a twentieth of its window after the grant), across
    // two boundaries, early in a window, while hot on both keys. Twice per algorithm: with
    // demand above the limit (the oracle's case), and with a limit of 600 above the demand,
    // so that the node holds a block on each key whatever the instant it stops (with demand
    // above the limit, blocks are crumbs, often spent when it stops).
    let paused = |nodes: Vec<usize>| Fault::Pause {
        nodes,
        from: ms(850),
        until: ms(2_150),
    };
    #[rustfmt::skip]
    let cases = [
        (901, 4, fw(), vec![]),
        (902, 3, sc(), vec![]),
        (903, 4, fw(), vec![cut(vec![1, 2])]),
        (904, 4, sc(), vec![deaf(vec![0, 3])]),
        (905, 4, sl(), vec![]),
        (906, 4, sl(), vec![cut(vec![1, 2])]),
        (907, 4, sl(), vec![deaf(vec![0, 3])]),
        (908, 4, fw(), vec![paused(vec![1])]),
        (909, 4, sc(), vec![paused(vec![1])]),
        (910, 4, sl(), vec![paused(vec![1])]),
        (914, 4, Limit::fixed_window(600, second).unwrap(), vec![paused(vec![1])]),
        (915, 4, Limit::sliding_counter(600, second).unwrap(), vec![paused(vec![1])]),
        (916, 4, Limit::sliding_log(600, second).unwrap(), vec![paused(vec![1])]),
        (917, 4, tb(), vec![]),
        (918, 4, tb(), vec![cut(vec![1, 2])]),
        (919, 4, tb(), vec![deaf(vec![0, 3])]),
        (920, 4, tb(), vec![paused(vec![1])]),
        (921, 4, Limit::token_bucket(120, 600, second).unwrap(), vec![paused(vec![1])]),
    ];
    let mut failed = Vec::new();
    for (seed, nodes, limit, faults) in cases {
        let s = scenario(seed, nodes, limit, faults);
        let run = run(&s);
        let result = run.result_with_allowance(0);
        let leased = run.admitted_from_leases();
        eprintln!(
            "{}: admitted {} of {} allowed, {leased} from leases, over-admission {}",
            limit.tag(),
            run.admitted(),
            run.exact_admitted(),
            result.over_admission()
        );
        if !result.is_within_bound() {
            failed.push(format!(
                "seed {seed}: over-admission {}",
                result.over_admission()
            ));
        }
        if let Some(Fault::Pause { nodes, from, until }) = s.faults.first() {
            let saturated_bucket = matches!(limit, Limit::TokenBucket(_)) && seed == 920;
            failed.extend(stale_spends(
                &run,
                nodes,
                (*from, *until),
                !saturated_bucket,
            ));
        }
        if leased * 2 <= run.admitted() {
            failed.push(format!(
                "seed {seed}: only {leased} of {} admissions came from leases",
                run.admitted()
            ));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Redis crashes at 1.45 s, late in a window whose admissions it then forgets, with every
/// block and every log entry (future stamps included), and restarts empty 100 ms later.
/// Direct decisions alone may then admit up to the limit again where the lost state
/// already held up to the limit: the oracle's allowance for a crash that loses data is one
/// capacity on every window and span (`Scenario::allowance`). Held blocks add nothing to
/// that: their units were in the lost state (counted before the crash, spent after it),
/// so real admissions in any window or span stay within what the lost state held (at most
/// `L`) plus what the empty store admits (at most `L`). Asserted: a leased world's
/// over-admission is within that same allowance, for each leasable algorithm; the same
/// scenario decided directly is run beside it for the comparison.
#[test]
fn after_a_redis_restart_that_loses_data_leases_stay_within_the_direct_decisions_allowance() {
    let crash = || Fault::RedisCrash {
        at: ms(1_450),
        down: ms(100),
    };
    for (seed, limit) in [(911, fw()), (912, sc()), (913, sl()), (922, tb())] {
        let leased = scenario(seed, 4, limit, vec![crash()]);
        let mut direct = leased.clone();
        direct.limiter = LimiterKind::Rein;
        direct.name = "direct".to_owned();
        let allowance = leased.allowance();
        assert_eq!(
            allowance,
            limit.capacity(),
            "one capacity for one crash that loses data"
        );
        let (leased_run, direct_run) = (run(&leased), run(&direct));
        // The worst window's (or span's) admissions over the limit, in units.
        let over = |run: &Run| {
            let exact = run.result_with_allowance(0);
            exact
                .verdict
                .worst()
                .map(|v| v.excess())
                .unwrap_or_default()
        };
        eprintln!(
            "{}: restart: leased admitted {} ({} from leases), over-admission {}; \
             direct admitted {}, over-admission {}; allowance {allowance}",
            limit.tag(),
            leased_run.admitted(),
            leased_run.admitted_from_leases(),
            over(&leased_run),
            direct_run.admitted(),
            over(&direct_run),
        );
        for run in [&leased_run, &direct_run] {
            let result = run.result_with_allowance(allowance);
            assert!(
                result.is_within_bound(),
                "seed {seed} {}: over-admission {} beyond the allowance {allowance}",
                run.scenario.name,
                result.over_admission()
            );
        }
    }
}

/// The report's lease scenarios (the main job's suite, seed 1, 4 nodes): nothing over the
/// limit itself, and the nodes' lease counters, read after each node shut its limiter down,
/// account for the units a window's or a log's blocks reserved: spent from a lease,
/// returned or counted stranded, but for a unit or two of a block whose end passed after
/// the node's timers stopped (a release does not count such a block: see the report's
/// stranded column, main.rs). A token bucket's share is rate, not units, so only its
/// admissions are checked: every one counted as a lease hit was seen as one.
#[test]
fn the_reports_lease_scenarios_admit_nothing_over_and_account_for_every_reserved_unit() {
    for name in [
        "leased-fixed-window",
        "leased-sliding-log",
        "leased-partition-fixed-window",
        "leased-partition-token-bucket",
        "leased-pause-sliding-log",
    ] {
        let s = suite_scenario(name, 4, 1).expect("a suite scenario");
        let run = run(&s);
        assert!(run.result().is_within_bound(), "{name}: over the limit");
        assert_eq!(
            run.result().facts.extra_allowance,
            0,
            "{name}: no allowance"
        );
        assert_eq!(run.leases.len(), 4, "{name}: every node's counters");
        let sum = |field: fn(&rein::lease::LeaseStats) -> u64| -> u64 {
            run.leases.values().map(field).sum()
        };
        let leased = run.admitted_from_leases();
        let (reserved, returned, stranded) = (
            sum(|s| s.units_reserved),
            sum(|s| s.units_returned),
            sum(|s| s.units_stranded),
        );
        eprintln!(
            "{name}: {leased} leased, {reserved} reserved, {returned} returned, {stranded} stranded"
        );
        assert_eq!(sum(|s| s.leased), leased, "{name}: lease hits");
        assert!(leased * 2 > run.admitted(), "{name}: mostly from leases");
        if !name.contains("token-bucket") {
            // Reserved units are spent, returned or stranded; the book counts as stranded
            // only those whose block it serviced or released before its end passed.
            assert!(reserved >= leased + returned + stranded, "{name}");
            assert!(reserved - leased - returned - stranded <= 2, "{name}");
        }
    }
}

/// Leases under real traffic (issue 23): one key, demand about three times the limit split
/// unevenly, a node that comes and goes (silences of 400 ms), a hot node that shifts every
/// second, and the hot node killed half-way through its second (its blocks and shares never
/// given back). Every algorithm: zero over-admission against the limit itself. By the
/// occupancy measure (every span of one window; a token bucket from its first second),
/// over the whole run and, after a kill, from the kill on: at least 95 % for the fixed
/// window, the sliding log and the token bucket. The sliding counter does not reach 95 %
/// by this measure on these 4 s runs, and neither do direct decisions on the same demand
/// (0.93–0.94: a counter's spans are part-empty for a window after its first, front-loaded
/// one), so for it the test asserts what leasing costs: at most 3 points below the same
/// scenario decided directly (docs/leases.md, "Utilisation under real traffic").
#[test]
fn leases_keep_95_percent_occupancy_under_bursty_shifting_and_killed_demand_with_nothing_over() {
    let mut failed = Vec::new();
    for shape in ["bursty", "shifting", "killed"] {
        for algorithm in [
            "fixed-window",
            "sliding-counter",
            "sliding-log",
            "token-bucket",
        ] {
            let name = format!("leased-{shape}-{algorithm}");
            let s = suite_scenario(&name, 4, 23).expect("a suite scenario");
            let run = run(&s);
            let result = run.result_with_allowance(0);
            let steady = run.steady_occupancy().expect("a measurable run");
            // The killed shape measures after its kill: a run too short to, fails.
            let after = s.killed_at().map(|at| {
                run.occupancy(at)
                    .expect("occupancy measurable after the kill")
            });
            eprintln!(
                "{name}: occupancy {:.3}{}, admitted {} ({} from leases), over-admission {}",
                steady.to_f64(),
                after.map_or(String::new(), |a| format!(
                    ", after the kill {:.3}",
                    a.to_f64()
                )),
                run.admitted(),
                run.admitted_from_leases(),
                result.over_admission()
            );
            if !result.is_within_bound() {
                failed.push(format!(
                    "{name}: over-admission {}",
                    result.over_admission()
                ));
            }
            if let (Some(at), Some(Fault::Kill { nodes, .. })) = (s.killed_at(), s.faults.first()) {
                // Dead is dead: nothing admitted from the kill on, and its shares are read.
                let from = run.interval().start.saturating_add(Micros::from(at));
                let after = run.admitted_by(nodes, Interval::new(from, run.end));
                if after > 0 || run.shares_at_death.is_empty() {
                    failed.push(format!("{name}: {after} admitted by a killed node"));
                }
            }
            let floor = if algorithm == "sliding-counter" {
                let mut direct = s.clone();
                direct.limiter = LimiterKind::Rein;
                let direct = run_direct(&direct);
                eprintln!("{name}: decided directly, occupancy {direct:.3}");
                direct - 0.03
            } else {
                0.95
            };
            for (what, figure) in [("steady", Some(steady)), ("after the kill", after)] {
                if let Some(f) = figure.filter(|f| f.to_f64() < floor) {
                    failed.push(format!(
                        "{name}: occupancy {what} {:.3} < {floor:.3}",
                        f.to_f64()
                    ));
                }
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// The steady occupancy of `scenario` decided directly.
fn run_direct(scenario: &Scenario) -> f64 {
    run(scenario)
        .steady_occupancy()
        .expect("a measurable run")
        .to_f64()
}
