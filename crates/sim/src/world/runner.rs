//! What every world of the simulator shares: how it is built, stepped to its end, and read
//! back. [`Scenario`](super::Scenario) (nodes over one Redis) and
//! [`RegionScenario`](super::RegionScenario) (regions over a WAN) differ in their hosts and
//! in what they do between steps, and in nothing else.

use std::error::Error;
use std::time::Duration;

use rein_core::{Micros, Timestamp};

use super::clock::{self, WARMUP};
use super::{Event, Outcome};
use crate::oracle::{Admission, AdmissionLog};

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

/// The admissions among `events`, each at the instant it took effect, for the oracle.
pub(super) fn admissions(events: &[Event]) -> AdmissionLog {
    events
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
        .collect()
}

/// The end of a run whose demand lasted `span`: just after its last answer, and not before
/// the demand's end.
pub(super) fn end_of(events: &[Event], span: Duration) -> Timestamp {
    let demand_end = clock::start().saturating_add(span.into());
    events
        .iter()
        .map(|e| e.answered.saturating_add(Micros::from_micros(1)))
        .max()
        .unwrap_or(demand_end)
        .max(demand_end)
}
