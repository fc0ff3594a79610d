//! The scenario report: `cargo run -p sim --release` plays the default suite in the
//! simulated world (no external service), prints one table of results, and writes one SVG
//! chart per scenario.
//!
//! Every run is a function of its seed: the seed is printed first for each scenario, and
//! `--seed` replays it. See docs/sim.md for how the world is built and docs/guarantees.md
//! for the bound each scenario is judged against.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use sim::report::{render_text, write_chart};
use sim::world::{SUITE, suite_scenario};

const HELP: &str = "\
sim: rein's deterministic scenario report

USAGE:
    cargo run -p sim --release -- [OPTIONS]

OPTIONS:
    --scenario NAME   run only NAME; repeat, or give a comma-separated list (default: all)
    --nodes N         application nodes per scenario, 1 to 1024 (default: 4)
    --nodes-per-host K  nodes sharing one simulated host and its link to Redis
                      (default: ceil(N / 16), so at most 16 hosts; see docs/sim.md, Cost)
    --timing          print each run's wall time and wall time per decision
    --seed S          the seed of every scenario (default: 1); same seed, same report
    --out DIR         where the SVG charts go (default: report/)
    --list            list the scenarios and exit
    --help            this text

Each scenario prints its seed, then the table shows per scenario: nodes, policy, faults,
demanded, admitted, what an exact limiter would have admitted, the bound, over- and
under-admission, time on fallback and p50/p99 decision latency in simulated time. The
charts show admissions per 100 ms per node and in total against the limit, with fault
intervals shaded. The exit status is 1 if any scenario broke its documented bound.
";

/// Scenarios with no bound to keep, only an over-admission to measure.
const UNBOUNDED: &[&str] = &["naive-baseline", "partition-fail-open"];

struct Options {
    scenarios: Vec<String>,
    nodes: usize,
    nodes_per_host: Option<usize>,
    seed: u64,
    out: PathBuf,
    timing: bool,
}

fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => return ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}\n\n{HELP}");
            return ExitCode::from(2);
        }
    };
    let mut results = Vec::new();
    let mut broken = false;
    for name in &options.scenarios {
        let Some(mut scenario) = suite_scenario(name, options.nodes, options.seed) else {
            eprintln!("error: unknown scenario {name:?}; --list shows them");
            return ExitCode::from(2);
        };
        if let Some(per_host) = options.nodes_per_host {
            scenario.nodes_per_host = per_host;
        }
        println!("seed {} — {name}", scenario.seed);
        // The real clock, outside the simulation: how long the simulation took to run.
        let started = Instant::now();
        let run = match scenario.run() {
            Ok(run) => run,
            Err(e) => {
                eprintln!("error: scenario {name} failed to run: {e}");
                return ExitCode::FAILURE;
            }
        };
        if options.timing {
            let took = started.elapsed();
            let decisions = run.events.len().max(1);
            println!(
                "  timing: {} nodes on {} hosts, {} decisions in {:.3} s: {:.1} µs per decision",
                scenario.nodes,
                scenario.nodes.div_ceil(scenario.nodes_per_host.max(1)),
                run.events.len(),
                took.as_secs_f64(),
                took.as_secs_f64() * 1e6 / decisions as f64
            );
        }
        let result = run.result();
        // The naive baseline and failing open have no bound: they are measured.
        if !result.is_within_bound() && !UNBOUNDED.contains(&name.as_str()) {
            broken = true;
        }
        match write_chart(&result, &options.out) {
            Ok(path) => println!("  chart: {}", path.display()),
            Err(e) => eprintln!("  chart not written: {e}"),
        }
        results.push(result);
    }
    println!();
    print!("{}", render_text(&results));
    if broken {
        eprintln!("error: a scenario broke its documented bound");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Parses the arguments by hand (no argument-parsing dependency for a few flags). `Ok(None)`
/// when the work is done already (`--help`, `--list`).
fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut options = Options {
        scenarios: Vec::new(),
        nodes: 4,
        nodes_per_host: None,
        seed: 1,
        out: PathBuf::from("report"),
        timing: false,
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value"));
        match arg.as_str() {
            "--help" | "-h" => {
                print!("{HELP}");
                return Ok(None);
            }
            "--list" => {
                for name in SUITE {
                    println!("{name}");
                }
                return Ok(None);
            }
            "--scenario" => options.scenarios.extend(
                value("--scenario")?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            ),
            "--nodes" => {
                options.nodes = value("--nodes")?
                    .parse()
                    .ok()
                    .filter(|&n| (1..=1024).contains(&n))
                    .ok_or("--nodes takes a number from 1 to 1024")?;
            }
            "--nodes-per-host" => {
                options.nodes_per_host = Some(
                    value("--nodes-per-host")?
                        .parse()
                        .ok()
                        .filter(|&n| n >= 1)
                        .ok_or("--nodes-per-host takes a number from 1")?,
                );
            }
            "--timing" => options.timing = true,
            "--seed" => {
                options.seed = value("--seed")?
                    .parse()
                    .map_err(|_| "--seed takes an unsigned integer")?;
            }
            "--out" => options.out = PathBuf::from(value("--out")?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if options.scenarios.is_empty() {
        options.scenarios = SUITE.iter().map(|s| (*s).to_owned()).collect();
    }
    Ok(Some(options))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> impl Iterator<Item = String> {
        list.iter()
            .map(|s| (*s).to_owned())
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn scenarios_repeat_or_split_on_commas_and_numbers_parse() {
        let options = parse(args(&[
            "--scenario",
            "a,b",
            "--scenario",
            "c",
            "--nodes",
            "3",
            "--seed",
            "9",
            "--out",
            "x",
            "--nodes-per-host",
            "2",
            "--timing",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(options.scenarios, ["a", "b", "c"]);
        assert_eq!((options.nodes, options.seed), (3, 9));
        assert_eq!(options.out, PathBuf::from("x"));
        assert_eq!((options.nodes_per_host, options.timing), (Some(2), true));
        assert!(parse(args(&["--nodes-per-host", "0"])).is_err());
        assert!(parse(args(&["--nodes", "0"])).is_err());
        assert!(parse(args(&["--bogus"])).is_err());
        assert_eq!(
            parse(args(&[])).unwrap().unwrap().scenarios.len(),
            SUITE.len()
        );
    }
}
