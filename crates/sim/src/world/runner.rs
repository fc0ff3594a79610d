//! What every world of the simulator shares: how it is built, stepped to its end, and read
//! back ([`Recorded`]). [`Scenario`](super::Scenario) (nodes over one Redis) and
//! [`RegionScenario`](super::RegionScenario) (regions over a WAN) differ in their hosts and
//! in what they do between steps, and in nothing else.

use std::collections::BTreeMap;
use std::error::Error;
use std::time::Duration;

use rein_core::{Micros, Policy, PolicyState, Timestamp};

use super::clock::{self, WARMUP};
use super::workload::Request;
use super::{Event, Outcome};
use crate::oracle::{Admission, AdmissionLog, Interval};

/// The network and time of one world.
pub(super) struct Network {
    /// The scenario's seed: turmoil's RNG, so one seed is one trace.
    pub seed: u64,
    /// Simulated time per step.
    pub tick: Duration,
    /// Each message's latency is drawn from this range.
    pub latency: (Duration, Duration),
    /// turmoil panics when more connections wait on a listener than this, and bounds each
    /// stream's buffer by it.
    pub tcp_capacity: usize,
    /// How long the scenario's demand lasts (after the warm-up).
    pub span: Duration,
}

/// A world on `network`'s terms, at the simulator's epoch. It ends a minute after the
/// demand at the latest: room for every answer, however delayed by faults.
pub(super) fn build(network: &Network) -> turmoil::Sim<'static> {
    turmoil::Builder::new()
        .epoch(clock::epoch())
        .rng_seed(network.seed)
        .tick_duration(network.tick)
        .min_message_latency(network.latency.0)
        .max_message_latency(network.latency.1)
        .tcp_capacity(network.tcp_capacity)
        .simulation_duration(WARMUP + network.span + Duration::from_secs(60))
        .build()
}

/// Steps `world` until every client has ended, calling `between` before each step (the
/// scenario's faults, a region's control plane).
pub(super) fn drive(
    world: &mut turmoil::Sim<'_>,
    mut between: impl FnMut(&mut turmoil::Sim<'_>),
) -> Result<(), Box<dyn Error>> {
    loop {
        between(world);
        if world.step()? {
            return Ok(());
        }
    }
}

/// What the nodes of one run recorded, in either world: every decision, every admission at
/// the instant it took effect, the demand, and where the measured span ends. A world's run
/// ([`Run`](super::Run), [`RegionRun`](super::RegionRun)) adds what only it records, and
/// dereferences to this.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Every decision, in the order nodes recorded them.
    pub events: Vec<Event>,
    /// Every admission at the instant it took effect.
    pub log: AdmissionLog,
    /// The demand, per node.
    pub demand: Vec<Vec<Request>>,
    /// The end of the measured span: just after the last answer, and not before the end of
    /// the demand.
    pub end: Timestamp,
}

impl Recorded {
    /// The record of `events`, for `demand` that lasted `span`.
    pub(super) fn new(events: Vec<Event>, demand: Vec<Vec<Request>>, span: Duration) -> Self {
        let log = events
            .iter()
            .filter_map(|e| match e.outcome {
                Outcome::Admitted { at, .. } => Some(Admission {
                    at,
                    node: e.node,
                    key: e.key,
                    cost: e.cost,
                }),
                _ => None,
            })
            .collect();
        let demand_end = clock::start().saturating_add(span.into());
        let end = events
            .iter()
            .map(|e| e.answered.saturating_add(Micros::from_micros(1)))
            .max()
            .unwrap_or(demand_end)
            .max(demand_end);
        Self {
            events,
            log,
            demand,
            end,
        }
    }

    /// The measured span: from the start of demand to [`end`](Self::end).
    pub fn interval(&self) -> Interval {
        Interval::new(clock::start(), self.end)
    }

    /// The total cost asked for.
    pub fn demanded(&self) -> u64 {
        self.demand.iter().flatten().map(|r| r.cost).sum()
    }

    /// The total cost admitted.
    pub fn admitted(&self) -> u64 {
        self.log.admitted()
    }

    /// How many decisions failed (an error instead of a decision).
    pub fn failures(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Failed(_)))
            .count()
    }

    /// The cost one exact limiter deciding `policy` admits of the requests issued at or
    /// after `from`, given every request at the instant it was issued, in issue order: the
    /// reference for utilisation.
    pub fn exact_admitted_since(&self, policy: &Policy, from: Timestamp) -> u64 {
        let mut asks: Vec<&Event> = self.events.iter().collect();
        asks.sort_by_key(|e| (e.issued, e.node));
        let mut states: BTreeMap<u64, PolicyState> = BTreeMap::new();
        asks.iter()
            .filter(|e| {
                let state = states.entry(e.key).or_insert_with(|| policy.new_state());
                policy
                    .acquire(e.issued, state, e.cost)
                    .is_ok_and(|d| d.is_allowed())
            })
            .filter(|e| e.issued >= from)
            .map(|e| e.cost)
            .sum()
    }

    /// A SHA-1 over every decision, in recording order ([`digest`](super::digest)).
    pub fn digest(&self) -> String {
        super::digest(&self.events)
    }
}
