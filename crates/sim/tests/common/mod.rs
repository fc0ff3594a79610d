//! What the world's tests share: one run of a scenario, printed and checked, and the runs of
//! a suite scenario at pinned seeds.

#![allow(dead_code)]

use sim::world::{Run, Scenario, suite_scenario};

/// Runs `scenario`, printing its seed, its summary and who decided, and checks that the
/// tap saw every admission take effect (the script run or the `EXEC` that made it).
pub fn run(scenario: &Scenario) -> Run {
    eprintln!("seed {} ({})", scenario.seed, scenario.name);
    let run = scenario.run().expect("the world runs");
    eprintln!("{} | sources {:?}", run.summary(), run.by_source());
    assert_eq!(
        run.untraced(),
        0,
        "every admission's script run or EXEC was seen"
    );
    run
}

/// The suite scenario `name` at each `(seed, nodes)` of `cases`, with its [`run`], one
/// after the other.
pub fn suite_runs<const N: usize>(
    name: &'static str,
    cases: [(u64, usize); N],
) -> impl Iterator<Item = (usize, Scenario, Run)> {
    cases.into_iter().map(move |(seed, nodes)| {
        let s = suite_scenario(name, nodes, seed).expect("a scenario of the suite");
        let run = run(&s);
        (nodes, s, run)
    })
}
