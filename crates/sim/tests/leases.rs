//! Leases in the simulated world (issue 10): nodes running rein's `LeasedLimiter` over the
//! real store admit hot keys from blocks reserved in Redis, on skewed clocks, through a
//! partition and through lost replies; the oracle checks every window of every key against
//! the limit itself, with no allowance. Seeds are pinned and printed.

use std::time::Duration;

use rein_core::{Limit, Micros, Policy};
use sim::world::{Fault, LimiterKind, Outcome, Run, Scenario, Workload};

fn run(scenario: &Scenario) -> Run {
    eprintln!("seed {} ({})", scenario.seed, scenario.name);
    let run = scenario.run().expect("the world runs");
    eprintln!("{}", run.summary());
    assert_eq!(
        run.untraced(),
        0,
        "every direct admission's script run was seen"
    );
    run
}

/// Admissions decided from a held block (no store call): those with no source.
fn from_leases(run: &Run) -> usize {
    run.events
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Admitted { .. }) && e.source.is_none())
        .count()
}

#[test]
fn leased_nodes_never_admit_over_the_limit_healthy_cut_off_or_deaf_on_skewed_clocks() {
    let second = Micros::from_secs(1);
    let cut = |nodes: Vec<usize>| Fault::Partition {
        nodes,
        from: Duration::from_millis(600),
        until: Duration::from_millis(1_400),
    };
    let deaf = |nodes: Vec<usize>| Fault::RepliesLost {
        nodes,
        from: Duration::from_millis(600),
        until: Duration::from_millis(1_400),
    };
    #[rustfmt::skip]
    let cases = [
        (901, 4, Limit::fixed_window(150, second).unwrap(), vec![]),
        (902, 3, Limit::sliding_counter(150, second).unwrap(), vec![]),
        (903, 4, Limit::fixed_window(150, second).unwrap(), vec![cut(vec![1, 2])]),
        (904, 4, Limit::sliding_counter(150, second).unwrap(), vec![deaf(vec![0, 3])]),
    ];
    for (seed, nodes, limit, faults) in cases {
        let mut s = Scenario::new("leased", seed, nodes, Policy::single(limit));
        s.limiter = LimiterKind::Leased;
        s.workload = Workload::HotKey { keys: 2 };
        // Demand well above the limit, on clocks up to 250 ms apart.
        s.per_node_rate = 120;
        s.max_skew = Duration::from_millis(250);
        s.faults = faults;
        let run = run(&s);
        let result = run.result_with_allowance(0);
        let leased = from_leases(&run);
        eprintln!(
            "admitted {} of {} allowed, {leased} from leases, over-admission {}",
            run.admitted(),
            run.exact_admitted(),
            result.over_admission()
        );
        assert!(
            result.is_within_bound(),
            "seed {seed}: over-admission {}",
            result.over_admission()
        );
        assert!(
            leased * 2 > run.admitted() as usize,
            "seed {seed}: most admissions came from leases ({leased} of {})",
            run.admitted()
        );
    }
}
