//! What one scenario measured, as one value that a table row and a chart are drawn from.
//!
//! A scenario author hands over what only the world knows ([`ScenarioInputs`]: the
//! admission log and decision latencies, and the [`ScenarioFacts`] a row repeats as given:
//! the faults, the demand, what an exact limiter would have admitted, time on fallback), and
//! [`ScenarioResult::measure`] derives the rest: the oracle's verdict, the admission time
//! series and the limit lines to chart against. The facts are declared once and moved into
//! the result whole.

use rein_core::{Micros, Policy, Timestamp};

use super::describe::describe_policy;
use super::series::{AdmissionSeries, LimitLine};
use crate::oracle::{AdmissionLog, Fraction, Interval, PolicyVerdict, Verdict, Window};

/// The width of one point of the admission time series: the brief's 100 ms.
pub const CHART_BUCKET: Micros = Micros::from_millis(100);

/// A fault that lasted a while: a partition, a stall, Redis down. Shaded on the chart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSpan {
    /// When it was in force, in true simulated time.
    pub during: Interval,
    /// A short label for the chart, e.g. `partition: nodes 0–2 | redis`.
    pub label: String,
}

/// Decision latencies in simulated µs, sorted, for exact nearest-rank percentiles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencySamples {
    sorted: Vec<Micros>,
}

/// What the world knows of a run that a row repeats as given: what ran, under which
/// faults, and what only the world could count (the demand, what an exact limiter would
/// have admitted, time on fallback).
#[derive(Clone, Debug)]
pub struct ScenarioFacts {
    /// The scenario's name: the table row's label and the chart's file name.
    pub name: String,
    /// The seed the run was made with, so the row can be replayed.
    pub seed: u64,
    /// How many application nodes ran.
    pub nodes: usize,
    /// The faults in words, e.g. `partition nodes 0–2 from Redis at 2–4 s`, or `none`.
    pub faults: String,
    /// The faults with a duration, to shade on the chart.
    pub fault_spans: Vec<FaultSpan>,
    /// The simulated span measured: the series and the fallback share cover it.
    pub run: Interval,
    /// Total cost requested, admitted or not.
    pub demanded: u64,
    /// What an exact, single limiter would have admitted given the same demand.
    pub exact_admitted: u64,
    /// Documented slack on every window's bound, in cost units (0 for none).
    pub extra_allowance: u64,
    /// Time each node spent on its fallback, indexed by node.
    pub fallback: Vec<Micros>,
}

/// Everything a scenario author supplies; see [`ScenarioResult::measure`].
#[derive(Clone, Debug)]
pub struct ScenarioInputs<'a> {
    /// What the row repeats as given.
    pub facts: ScenarioFacts,
    /// The policy every node enforced: the one described and charted.
    pub policy: &'a Policy,
    /// The policy the verdict checks: `policy`, or a wider one a design documents for the
    /// run's faults (nodes deciding alone on a local fallback add their shares).
    pub bound: &'a Policy,
    /// Every admission, at its true simulated instant.
    pub log: &'a AdmissionLog,
    /// The key whose admissions are charted (the chart's limit lines are one key's).
    pub chart_key: u64,
    /// Every decision's latency in simulated time, from request to answer.
    pub latencies: Vec<Micros>,
}

/// One scenario's measurements: a row of the table and the data of its chart.
#[derive(Clone, Debug)]
pub struct ScenarioResult {
    /// What the run's author gave: name, seed, faults, demand, fallback time.
    pub facts: ScenarioFacts,
    /// The policy in words.
    pub policy: String,
    /// Total cost admitted, all nodes and keys.
    pub admitted: u64,
    /// The oracle's findings, every limit and key.
    pub verdict: PolicyVerdict,
    /// Decision latencies.
    pub latencies: LatencySamples,
    /// Admissions of the charted key per [`CHART_BUCKET`], per node.
    pub series: AdmissionSeries,
    /// What the policy allows per bucket, to chart against.
    pub limit_lines: Vec<LimitLine>,
}

impl LatencySamples {
    /// The samples, in any order.
    pub fn new(samples: impl IntoIterator<Item = Micros>) -> Self {
        let mut sorted: Vec<Micros> = samples.into_iter().collect();
        sorted.sort_unstable();
        Self { sorted }
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// `true` with no samples.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The nearest-rank percentile for the share `numerator / denominator` (p99 is
    /// `(99, 100)`): the ⌈n × share⌉-th smallest sample, at least the first. Always one of
    /// the samples, never an interpolation. `None` with no samples or a zero denominator.
    pub fn percentile(&self, numerator: u64, denominator: u64) -> Option<Micros> {
        let n = self.sorted.len() as u128;
        let denominator = u128::from(denominator);
        if n == 0 || denominator == 0 {
            return None;
        }
        let rank = (n * u128::from(numerator))
            .div_ceil(denominator)
            .clamp(1, n);
        // rank ≤ n, which came from a usize.
        self.sorted.get(rank as usize - 1).copied()
    }

    /// The median (nearest rank).
    pub fn p50(&self) -> Option<Micros> {
        self.percentile(50, 100)
    }

    /// The 99th percentile (nearest rank).
    pub fn p99(&self) -> Option<Micros> {
        self.percentile(99, 100)
    }

    /// The slowest decision.
    pub fn max(&self) -> Option<Micros> {
        self.sorted.last().copied()
    }
}

impl ScenarioResult {
    /// Runs the oracle over the log and derives the series and limit lines.
    pub fn measure(inputs: ScenarioInputs<'_>) -> Self {
        let ScenarioInputs {
            facts,
            policy,
            bound,
            log,
            chart_key,
            latencies,
        } = inputs;
        let allowance = facts.extra_allowance;
        let verdict = log.check_policy(bound, allowance);
        let series =
            AdmissionSeries::from_log(log, chart_key, facts.run, CHART_BUCKET, facts.nodes);
        let start = facts.run.start;
        let mut limit_lines = LimitLine::for_policy(policy, start, CHART_BUCKET, allowance);
        // A widened bound is drawn too, so the chart shows what the verdict checked.
        if bound != policy {
            limit_lines.extend(
                LimitLine::for_policy(bound, start, CHART_BUCKET, allowance)
                    .into_iter()
                    .map(|line| LimitLine {
                        label: format!("bound, {}", line.label),
                        ..line
                    }),
            );
        }
        Self {
            facts,
            policy: describe_policy(policy),
            admitted: log.admitted(),
            verdict,
            latencies: LatencySamples::new(latencies),
            series,
            limit_lines,
        }
    }

    /// `true` when every limit's guarantee (plus the allowance) held on every key: the
    /// invariant every simulation asserts.
    pub fn is_within_bound(&self) -> bool {
        self.verdict.is_within_bound()
    }

    /// The verdict and window with the largest excess relative to its bound.
    pub fn worst(&self) -> Option<(&Verdict, Window)> {
        let verdict = self.verdict.worst()?;
        Some((verdict, verdict.worst?))
    }

    /// Over-admission: the worst window's excess over its bound, as a share of the bound;
    /// zero when every bound held.
    pub fn over_admission(&self) -> Fraction {
        self.verdict.over_admission()
    }

    /// Under-admission: how much less than an exact limiter was admitted, as a share of
    /// what it would have admitted; zero when at least as much was admitted (or when an
    /// exact limiter would have admitted nothing).
    pub fn under_admission(&self) -> Fraction {
        let exact = self.facts.exact_admitted;
        let shortfall = exact.saturating_sub(self.admitted);
        Fraction::new(i128::from(shortfall), i128::from(exact)).unwrap_or(Fraction::ZERO)
    }

    /// Time on fallback, summed over nodes.
    pub fn fallback_time(&self) -> Micros {
        Micros::from_micros(
            self.facts
                .fallback
                .iter()
                .fold(0, |sum: u64, m| sum.saturating_add(m.as_micros())),
        )
    }

    /// Time on fallback as a share of node-time (nodes × run length); zero for a run of
    /// no length or no nodes.
    pub fn fallback_share(&self) -> Fraction {
        let node_time = i128::from(self.facts.run.length().as_micros())
            * i128::try_from(self.facts.nodes).unwrap_or(0);
        Fraction::new(i128::from(self.fallback_time().as_micros()), node_time)
            .unwrap_or(Fraction::ZERO)
    }

    /// The first instant of the run, the zero of the chart's time axis.
    pub fn start(&self) -> Timestamp {
        self.facts.run.start
    }
}

/// A run measured against the policy it enforced (`bound` is `policy`): the tests' common
/// case.
#[cfg(test)]
pub(crate) fn measured(
    facts: ScenarioFacts,
    policy: &Policy,
    log: &AdmissionLog,
    chart_key: u64,
    latencies: Vec<Micros>,
) -> ScenarioResult {
    ScenarioResult::measure(ScenarioInputs {
        facts,
        policy,
        bound: policy,
        log,
        chart_key,
        latencies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(us: &[u64]) -> LatencySamples {
        LatencySamples::new(us.iter().map(|&u| Micros::from_micros(u)))
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let us = |u| Some(Micros::from_micros(u));
        // The textbook example: 15, 20, 35, 40, 50.
        let five = samples(&[50, 15, 40, 35, 20]);
        assert_eq!(five.percentile(5, 100), us(15));
        assert_eq!(five.percentile(30, 100), us(20));
        assert_eq!(five.percentile(40, 100), us(20));
        assert_eq!(five.p50(), us(35));
        assert_eq!(five.percentile(100, 100), us(50));
        assert_eq!(five.percentile(0, 100), us(15));
        let hundred = samples(&(1..=100).rev().collect::<Vec<_>>());
        assert_eq!((hundred.p50(), hundred.p99()), (us(50), us(99)));
        assert_eq!(hundred.max(), us(100));
        assert_eq!(samples(&[7]).p99(), us(7));
        assert_eq!(samples(&[]).p50(), None);
        assert_eq!(five.percentile(1, 0), None);
    }
}
