//! A scenario, the runner that plays it in a turmoil world, and what one run measured.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::rc::Rc;
use std::time::Duration;

use rein::{FailurePolicy, Source, lease::LeaseStats};
use rein_core::{Algorithm, Limit, Micros, Policy, Timestamp};

use super::bound::fallback_policy;
use super::clock::{self, Skew, WARMUP};
use super::fault::{Action, Fault};
use super::node::{self, NodeConfig};
use super::overrides::{OPERATOR_HOST, OverrideBound, OverrideSchedule, Written, run_operator};
use super::rng::Rng;
use super::runner::{self, Network, Recorded};
use super::tap::{ScriptTap, tapped_host};
use super::workload::Workload;
use super::{Guard, LimiterKind, Outcome, REDIS_HOST, REDIS_PORT, TimeSource, host_name};
use crate::oracle::{Interval, PolicyVerdict, Verdict, Window};
use crate::redis::{Clock, Persistence, Shared};
use crate::report::{ScenarioFacts, ScenarioInputs, ScenarioResult};

/// Everything that defines one run. Same scenario, same run, byte for byte.
///
/// Build one with [`Scenario::new`] and change the public fields:
///
/// ```
/// use std::time::Duration;
/// use rein_core::{Limit, Micros, Policy};
/// use sim::world::{Fault, Scenario};
///
/// let policy = Policy::single(Limit::token_bucket(10, 20, Micros::from_secs(1))?);
/// let mut scenario = Scenario::new("crash", 7, 2, policy);
/// scenario.span = Duration::from_millis(500);
/// scenario.faults = vec![Fault::RedisCrash {
///     at: Duration::from_millis(200),
///     down: Duration::from_millis(50),
/// }];
/// let run = scenario.run()?;
/// assert!(run.result().is_within_bound());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The name: the report row's label and the chart's file name.
    pub name: String,
    /// The seed of everything random: demand, clock offsets, turmoil's network.
    pub seed: u64,
    /// How many application nodes.
    pub nodes: usize,
    /// How many nodes share one turmoil host (one machine, one link to Redis), in index
    /// order: `⌈nodes / 16⌉` by default, so that up to 16 nodes each have a host of their
    /// own and a larger world has at most 16 hosts. turmoil links every pair of hosts and
    /// scans every link for every host on every tick, so a tick costs `O(hosts³)`: 256
    /// hosts ran about 60× slower per decision than 4 (docs/sim.md, "Cost"). A fault
    /// listed for one node strikes every node of its host
    /// ([`fallback_nodes`](Self::fallback_nodes) counts them all).
    pub nodes_per_host: usize,
    /// The policy every node enforces (under the name `sim`).
    pub policy: Policy,
    /// The shape of the demand.
    pub workload: Workload,
    /// Requests per second each node is asked to decide.
    pub per_node_rate: u64,
    /// How long demand lasts.
    pub span: Duration,
    /// Where decisions read `now`.
    pub time: TimeSource,
    /// Node clocks are offset by up to ± this from true time (node 0 at +, node 1 at −,
    /// the rest drawn uniformly). Matters only for [`TimeSource::Client`].
    pub max_skew: Duration,
    /// Which limiter the nodes run.
    pub limiter: LimiterKind,
    /// The shortest one-way network latency.
    pub min_latency: Duration,
    /// The longest one-way network latency (drawn by turmoil between the two).
    pub max_latency: Duration,
    /// turmoil's tick: the resolution of message delivery.
    pub tick: Duration,
    /// The store's deadline per call.
    pub deadline: Duration,
    /// The store's connect timeout.
    pub connect_timeout: Duration,
    /// Whether Redis keeps its data across a crash.
    pub persistence: Persistence,
    /// The faults, in any order.
    pub faults: Vec<Fault>,
    /// The resilience layer in front of each node's store, or none.
    pub guard: Option<Guard>,
    /// With [`LimiterKind::Leased`], each node's lease settings (default:
    /// `LeaseConfig::default()`).
    pub lease_config: rein::LeaseConfig,
    /// Per-key overrides: every node's store applies them, and an operator host writes key
    /// 0's at the scheduled instants (overrides.rs). `None` (the default): none.
    pub overrides: Option<OverrideSchedule>,
}

/// What one run of a [`Scenario`] recorded.
#[derive(Clone, Debug)]
pub struct Run {
    /// The scenario that ran.
    pub scenario: Scenario,
    /// What the nodes recorded (the run dereferences to it).
    pub recorded: Recorded,
    /// Each node's clock offset.
    pub skews: Vec<Skew>,
    /// Script runs Redis got as `EVAL` with the source (after a `NOSCRIPT`).
    pub runs_by_source: u64,
    /// Every script run Redis made, answered or not.
    pub script_runs: u64,
    /// With [`LimiterKind::Leased`], each node's `LeasedLimiter` counters (reservations,
    /// units reserved, returned, stranded…), read after the node shut its limiter down once
    /// every node had served its demand; empty for the other limiters.
    pub leases: BTreeMap<usize, LeaseStats>,
    /// With [`LimiterKind::Leased`] and a [`Fault::Kill`], each killed node's rate shares
    /// (`LeasedLimiter::rate_shares`) read at its death: the rate it strands is their
    /// `stranded_if_dead`.
    pub shares_at_death: BTreeMap<usize, Vec<rein::lease::ShareView>>,
    /// With [`Scenario::overrides`], when each of the operator's writes was made, in order.
    pub override_writes: Vec<Written>,
}

impl Scenario {
    /// A healthy scenario: steady demand of 100 requests per second per node for 2 s,
    /// server time, 1–3 ms latency, 1 ms ticks, the stores' default deadline (50 ms), no faults.
    pub fn new(name: impl Into<String>, seed: u64, nodes: usize, policy: Policy) -> Self {
        Self {
            name: name.into(),
            seed,
            nodes,
            nodes_per_host: default_nodes_per_host(nodes),
            policy,
            workload: Workload::Steady,
            per_node_rate: 100,
            span: Duration::from_secs(2),
            time: TimeSource::Server,
            max_skew: Duration::ZERO,
            limiter: LimiterKind::Rein,
            min_latency: Duration::from_millis(1),
            max_latency: Duration::from_millis(3),
            tick: Duration::from_millis(1),
            deadline: rein_core::limiter::DEFAULT_DEADLINE,
            connect_timeout: Duration::from_millis(100),
            persistence: Persistence::LoseData,
            faults: Vec::new(),
            guard: None,
            lease_config: rein::LeaseConfig::default(),
            overrides: None,
        }
    }

    /// Each node's clock offset: node 0 at `+max_skew`, node 1 at `−max_skew`, others
    /// uniform in between, from the seed. All zero without skew.
    pub fn skews(&self) -> Vec<Skew> {
        let s = self.max_skew.as_micros() as i64;
        let mut rng = Rng::new(self.seed).child(SKEW_STREAM);
        (0..self.nodes)
            .map(|n| Skew {
                offset_us: match n {
                    _ if s == 0 => 0,
                    0 => s,
                    1 => -s,
                    _ => rng.between(0, 2 * s as u64) as i64 - s,
                },
            })
            .collect()
    }

    /// The documented slack on every window's bound, in cost units, for this scenario's
    /// faults (docs/guarantees.md), on top of [`bound`](Self::bound):
    ///
    /// - client time: `⌈rate × (D + deadline)⌉` for a token bucket, `limit × ⌈(D +
    ///   deadline) / window⌉` for a window, where `D` is the spread of node clocks (at most
    ///   `2 × max_skew`) and the deadline bounds how stale a call's `now` is when its
    ///   script runs;
    /// - each Redis crash that loses data: one full capacity;
    /// - an allow cache of `m` reuses per `ttl`: `N × m × (⌈run / ttl⌉ + 1)`, the run being
    ///   the longest window the oracle can look at.
    ///
    /// Local fallback widens the policy instead ([`fallback_bound`](Self::fallback_bound)):
    /// a constant would have to cover the longest time a node stays on its fallback. Fail
    /// open has no bound (the report measures it); fail closed adds nothing.
    pub fn allowance(&self) -> u64 {
        let mut extra = 0;
        if self.time == TimeSource::Client {
            let offsets: Vec<i64> = self.skews().iter().map(|s| s.offset_us).collect();
            let spread = offsets.iter().max().unwrap_or(&0) - offsets.iter().min().unwrap_or(&0);
            let stale = Micros::from_micros(spread as u64 + self.deadline.as_micros() as u64);
            extra += self
                .policy
                .limits()
                .iter()
                .map(|l| stale_allowance(l, stale))
                .max()
                .unwrap_or(0);
        }
        if let Some(allow) = self.guard.as_ref().and_then(|g| g.allow_cache) {
            let ttl = allow.ttl().as_micros().max(1) as u64;
            let run = (WARMUP + self.span + Duration::from_secs(1)).as_micros() as u64;
            extra +=
                self.nodes as u64 * u64::from(allow.max_reuses().get()) * (run.div_ceil(ttl) + 1);
        }
        if self.persistence == Persistence::LoseData {
            let crashes = self
                .faults
                .iter()
                .filter(|f| matches!(f, Fault::RedisCrash { .. }))
                .count() as u64;
            extra += crashes * self.policy.capacity();
        }
        extra
    }

    /// The policy a run is judged against before [`allowance`](Self::allowance): the
    /// scenario's own, widened by [`fallback_bound`](Self::fallback_bound) over
    /// [`fallback_nodes`](Self::fallback_nodes) when the guard falls back locally.
    pub fn bound(&self) -> Policy {
        self.fallback_bound(&self.fallback_nodes())
            .unwrap_or_else(|| self.policy.clone())
    }

    /// The nodes this scenario's faults can send to their failure policy: those a
    /// partition, a stall, a pause or a one-way fault cuts off, and every node when Redis
    /// crashes or the network's latency can exceed the deadline. Ascending.
    pub fn fallback_nodes(&self) -> Vec<usize> {
        let mut cut = BTreeSet::new();
        for fault in &self.faults {
            match fault {
                Fault::Partition { nodes, .. }
                | Fault::Stall { nodes, .. }
                | Fault::Pause { nodes, .. }
                | Fault::Kill { nodes, .. }
                | Fault::RepliesLost { nodes, .. }
                | Fault::RequestsLost { nodes, .. } => cut.extend(nodes.iter().copied()),
                Fault::RedisCrash { .. } => cut.extend(0..self.nodes),
                // Two one-way trips within the deadline cannot time out.
                Fault::Latency { max, .. } if 2 * *max >= self.deadline => {
                    cut.extend(0..self.nodes)
                }
                Fault::Latency { .. } | Fault::ScriptFlush { .. } => {}
            }
        }
        // A fault strikes a host's link: every node on the host of a node it lists.
        let per_host = self.per_host();
        let hosts: BTreeSet<usize> = cut.iter().map(|&n| n / per_host).collect();
        (0..self.nodes)
            .filter(|n| hosts.contains(&(n / per_host)))
            .collect()
    }

    /// [`nodes_per_host`](Self::nodes_per_host), at least one.
    fn per_host(&self) -> usize {
        self.nodes_per_host.max(1)
    }

    /// The global bound with local fallback, as one policy: each limit widened by the nodes
    /// in `cut` deciding alone on their share, on their own (skewed) clocks
    /// ([`fallback_limit`](super::fallback_limit), the one statement of this bound; its
    /// doc derives it). `None` without local fallback.
    pub fn fallback_bound(&self, cut: &[usize]) -> Option<Policy> {
        let Some(Guard {
            on_failure: FailurePolicy::LocalFallback { expected_nodes },
            ..
        }) = &self.guard
        else {
            return None;
        };
        let skews = self.skews();
        let offsets: Vec<i64> = cut
            .iter()
            .filter_map(|&n| skews.get(n).map(|s| s.offset_us))
            .collect();
        fallback_policy(&self.policy, *expected_nodes, &offsets).ok()
    }

    /// The global bound with the allow cache, as one token bucket: the policy's bucket
    /// plus `N × m` reuses per `ttl` and a burst of `2 × N × m` (from `reuses ≤ N × m ×
    /// (⌈T / ttl⌉ + 1)` over any `T`). `None` without an allow cache or a bucket policy.
    pub fn allow_cache_bound(&self) -> Option<Policy> {
        let allow = self.guard.as_ref()?.allow_cache?;
        let Limit::TokenBucket(b) = self.policy.limits().first()? else {
            return None;
        };
        let (per_token, per_micro) = b.emission_interval();
        let ttl = allow.ttl().as_micros() as u64;
        let reuses = self.nodes as u64 * u64::from(allow.max_reuses().get());
        Limit::token_bucket(
            b.capacity() + 2 * reuses,
            per_micro * ttl + reuses * per_token,
            Micros::from_micros(per_token * ttl),
        )
        .ok()
        .map(Policy::single)
    }

    /// When the first [`Fault::Kill`] strikes, from the start of demand.
    pub fn killed_at(&self) -> Option<Duration> {
        self.faults.iter().find_map(|f| match f {
            Fault::Kill { at, .. } => Some(*at),
            _ => None,
        })
    }

    /// The faults in words, `none` without any.
    pub fn describe_faults(&self) -> String {
        let mut words: Vec<String> = self.faults.iter().map(Fault::describe).collect();
        if self.time == TimeSource::Client {
            words.push(format!("client clocks ±{} ms", self.max_skew.as_millis()));
        }
        if let Some(schedule) = &self.overrides {
            words.push(schedule.describe());
        }
        if let Some(guard) = &self.guard {
            let mut g = match guard.on_failure {
                FailurePolicy::FailOpen => "fail open".to_owned(),
                FailurePolicy::FailClosed => "fail closed".to_owned(),
                FailurePolicy::LocalFallback { expected_nodes } => {
                    format!("local fallback at limit ÷ {expected_nodes}")
                }
            };
            if !guard.deny_cache {
                g.push_str(", no deny cache");
            }
            if let Some(allow) = guard.allow_cache {
                g.push_str(&format!(
                    ", allow cache {} per {} ms",
                    allow.max_reuses(),
                    allow.ttl().as_millis()
                ));
            }
            words.push(g);
        }
        if words.is_empty() {
            "none".to_owned()
        } else {
            words.join("; ")
        }
    }

    /// Plays the scenario in a fresh turmoil world and returns what it recorded.
    pub fn run(&self) -> Result<Run, Box<dyn Error>> {
        let policy = rein_core::NamedPolicy::new("sim", self.policy.clone())?;
        let demand = self.workload.generate(
            &Rng::new(self.seed).child(DEMAND_STREAM),
            self.nodes,
            self.per_node_rate,
            self.span,
        );
        let skews = self.skews();
        let mut world = runner::build(&Network {
            seed: self.seed,
            tick: self.tick,
            latency: (self.min_latency, self.max_latency),
            // Every node may connect at once, or reconnect at once after a fault: room for
            // all of them twice over.
            tcp_capacity: TCP_CAPACITY.max(2 * self.nodes),
            span: self.span,
        });
        let redis = Shared::new(Clock::turmoil());
        let tap = ScriptTap::default();
        world.host(
            REDIS_HOST,
            tapped_host(redis.clone(), REDIS_PORT, self.persistence, tap.clone()),
        );
        let events = Rc::new(RefCell::new(Vec::new()));
        let leases = Rc::new(RefCell::new(BTreeMap::new()));
        let shares_at_death = Rc::new(RefCell::new(BTreeMap::new()));
        let serving = Rc::new(Cell::new(demand.len()));
        let per_host = self.per_host();
        // Each host's nodes, hosts in node order (turmoil's addresses and link order follow
        // registration order).
        let mut hosts: Vec<(String, Vec<NodeConfig>)> = Vec::new();
        for (index, requests) in demand.iter().enumerate() {
            let killed = self
                .faults
                .iter()
                .filter_map(|f| f.kill_of(index, per_host))
                .min();
            let config = NodeConfig {
                index,
                // A killed node serves nothing due from its death on.
                requests: requests
                    .iter()
                    .filter(|r| killed.is_none_or(|at| r.due < at))
                    .copied()
                    .collect(),
                killed: killed.map(|at| clock::start().saturating_add(at.into())),
                lease_config: self.lease_config,
                policy: policy.clone(),
                limiter: self.limiter,
                time: self.time,
                skew: skews[index],
                deadline: self.deadline,
                connect_timeout: self.connect_timeout,
                tap: tap.clone(),
                guard: self.guard.clone(),
                events: events.clone(),
                leases: leases.clone(),
                shares_at_death: shares_at_death.clone(),
                serving: serving.clone(),
                pauses: self
                    .faults
                    .iter()
                    .filter_map(|f| f.pause_of(index, per_host))
                    .collect(),
                overrides: self.overrides.as_ref().map(|o| o.staleness),
            };
            let name = host_name(index, per_host);
            match hosts.last_mut() {
                Some((last, configs)) if *last == name => configs.push(config),
                _ => hosts.push((name, vec![config])),
            }
        }
        for (name, configs) in hosts {
            world.client(name, node::run_host(configs));
        }
        // Registered last, so that a world without overrides is the one it always was.
        let written = Rc::new(RefCell::new(Vec::new()));
        if let Some(schedule) = &self.overrides {
            world.client(
                OPERATOR_HOST,
                run_operator(
                    schedule.clone(),
                    policy.name().to_owned(),
                    self.deadline,
                    self.connect_timeout,
                    written.clone(),
                ),
            );
        }
        let mut schedule: Vec<(Duration, Action)> = self
            .faults
            .iter()
            .flat_map(|f| f.actions(self.max_latency))
            .collect();
        // Stable: actions at one instant apply in the order the faults were listed.
        schedule.sort_by_key(|(at, _)| *at);
        let mut next = 0;
        runner::drive(&mut world, |world| {
            while let Some((at, action)) = schedule.get(next) {
                if WARMUP + *at > world.elapsed() {
                    break;
                }
                action.apply(world, &redis, per_host);
                next += 1;
            }
        })?;
        Ok(Run {
            scenario: self.clone(),
            recorded: Recorded::new(events.take(), demand, self.span),
            skews,
            runs_by_source: tap.runs_by_source(),
            script_runs: tap.runs(),
            leases: leases.take(),
            shares_at_death: shares_at_death.take(),
            override_writes: written.take(),
        })
    }
}

impl std::ops::Deref for Run {
    type Target = Recorded;

    fn deref(&self) -> &Recorded {
        &self.recorded
    }
}

impl std::ops::DerefMut for Run {
    fn deref_mut(&mut self) -> &mut Recorded {
        &mut self.recorded
    }
}

impl Run {
    /// The occupancy measure
    /// ([`AdmissionLog::occupancy`](crate::oracle::AdmissionLog::occupancy)) of key 0 from
    /// `from` after the start of demand to its end, against the policy's binding limit (the
    /// highest figure among its limits); `None` for a span too short to measure. A token
    /// bucket is measured from `from`, windows over the spans of one window that start at
    /// or after it.
    pub fn occupancy(&self, from: Duration) -> Option<crate::oracle::Fraction> {
        let start = clock::start();
        let during = Interval::new(
            start.saturating_add(from.into()),
            start.saturating_add(self.scenario.span.into()),
        );
        self.scenario
            .policy
            .limits()
            .iter()
            .filter_map(|limit| self.log.occupancy(limit, 0, during))
            .max()
    }

    /// The run's occupancy figure (docs/leases.md, "Utilisation under real traffic"):
    /// [`occupancy`](Self::occupancy) from the start of demand, or from its first second
    /// for a policy with a token bucket (whose first burst is no steady state).
    pub fn steady_occupancy(&self) -> Option<crate::oracle::Fraction> {
        let bucket = self
            .scenario
            .policy
            .limits()
            .iter()
            .any(|l| matches!(l, Limit::TokenBucket(_)));
        self.occupancy(if bucket {
            Duration::from_secs(1)
        } else {
            Duration::ZERO
        })
    }

    /// Tokens' worth of rate the killed nodes' shares stranded: reserved from their death
    /// until the shares lapsed, used by no node.
    pub fn rate_stranded_by_killed(&self) -> u64 {
        self.shares_at_death
            .values()
            .flatten()
            .map(|v| v.stranded_if_dead)
            .sum()
    }

    /// The cost admitted from held lease blocks, with no store call (with
    /// [`LimiterKind::Leased`]; zero for the other limiters).
    pub fn admitted_from_leases(&self) -> u64 {
        if self.scenario.limiter != LimiterKind::Leased {
            return 0;
        }
        self.events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Admitted { .. }) && e.source.is_none())
            .map(|e| e.cost)
            .sum()
    }

    /// How many of `nodes`' decisions admitted anything, at instants in `during`.
    pub fn admitted_by(&self, nodes: &[usize], during: Interval) -> u64 {
        self.log
            .admissions()
            .iter()
            .filter(|a| nodes.contains(&a.node) && during.contains(a.at))
            .map(|a| a.cost)
            .sum()
    }

    /// Script runs whose reply no node acted on: Redis charged (or denied) a request and
    /// the node timed out or lost its connection first, then asked its failure policy. A
    /// lost reply makes these; the rest come from calls in flight when a fault struck.
    pub fn unanswered_runs(&self) -> u64 {
        let answered = self
            .events
            .iter()
            .filter(|e| match e.source {
                Some(source) => source == Source::Store,
                // Without a guard a call either got Redis's decision or failed.
                None => !matches!(e.outcome, Outcome::Failed(_)),
            })
            .count() as u64;
        self.script_runs.saturating_sub(answered)
    }

    /// Admissions whose script run the tap did not see (expected: none).
    pub fn untraced(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Admitted { traced: false, .. }))
            .count()
    }

    /// How many decisions each source made, in [`Source`] order (redis, deny cache, allow
    /// cache, fallback, fail open, fail closed).
    pub fn by_source(&self) -> [usize; 6] {
        let mut counts = [0; 6];
        for e in &self.events {
            let slot = match e.source {
                Some(Source::Store) => 0,
                Some(Source::DenyCache) => 1,
                Some(Source::AllowCache) => 2,
                Some(Source::Fallback(_)) => 3,
                Some(Source::FailOpen(_)) => 4,
                Some(Source::FailClosed(_)) => 5,
                _ => continue,
            };
            counts[slot] += 1;
        }
        counts
    }

    /// Time each node spent on its failure path: from a decision the failure policy made
    /// (or, without a guard, a failed call) until the next one Redis or a cache made.
    pub fn fallback_time(&self) -> Vec<Micros> {
        let mut total = vec![0u64; self.scenario.nodes];
        let mut since: Vec<Option<Timestamp>> = vec![None; self.scenario.nodes];
        for e in &self.events {
            // Redis, a cache, or (the naive baseline) the client's own decision: not the
            // failure path. A failed call or a failure-policy answer is.
            let exact = match e.source {
                Some(source) => source.unavailable().is_none(),
                None => !matches!(e.outcome, Outcome::Failed(_)),
            };
            let n = e.node;
            match (since[n], exact) {
                (None, false) => since[n] = Some(e.issued),
                (Some(from), true) => {
                    total[n] += e.issued.saturating_since(from).as_micros();
                    since[n] = None;
                }
                _ => {}
            }
        }
        for (n, from) in since.iter().enumerate() {
            if let Some(from) = from {
                total[n] += self.end.saturating_since(*from).as_micros();
            }
        }
        total.into_iter().map(Micros::from_micros).collect()
    }

    /// The first instant after `after` at which `node` got a decision from Redis.
    pub fn back_on_redis(&self, node: usize, after: Timestamp) -> Option<Timestamp> {
        self.events
            .iter()
            .filter(|e| e.node == node && e.issued >= after && e.source == Some(Source::Store))
            .map(|e| e.answered)
            .min()
    }

    /// Every decision's latency, request to answer, in simulated time.
    pub fn latencies(&self) -> Vec<Micros> {
        self.events
            .iter()
            .map(|e| e.answered.saturating_since(e.issued))
            .collect()
    }

    /// The slowest decision.
    pub fn max_latency(&self) -> Micros {
        self.latencies().into_iter().max().unwrap_or_default()
    }

    /// What one exact limiter would have admitted, given each request at the instant it
    /// was issued, in issue order: the reference for under-admission.
    pub fn exact_admitted(&self) -> u64 {
        let start = clock::start();
        self.exact_admitted_since(&self.scenario.policy, start)
    }

    /// The run as a report row and chart, judged against [`Scenario::bound`] plus
    /// [`Scenario::allowance`]; with overrides, each aligned window against its own
    /// [`override_bound`](Self::override_bound) instead (the chart draws the policy's own
    /// limit).
    pub fn result(&self) -> ScenarioResult {
        if let Some(bound) = self.override_bound() {
            let mut result = self.judged(&self.scenario.policy, 0);
            let windows = bound.check(&self.log);
            // The window with the largest excess (the least headroom); the first on a tie.
            let worst = windows
                .iter()
                .copied()
                .fold(None, |best: Option<Window>, w| match best {
                    Some(b) if b.excess() >= w.excess() => Some(b),
                    _ => Some(w),
                });
            result.verdict = PolicyVerdict {
                verdicts: self
                    .scenario
                    .policy
                    .limits()
                    .first()
                    .map(|&limit| Verdict {
                        limit,
                        key: 0,
                        admitted: windows.iter().map(|w| w.admitted).sum(),
                        extra_allowance: 0,
                        worst,
                        against_exact_log: None,
                        aligned: None,
                    })
                    .into_iter()
                    .collect(),
            };
            return result;
        }
        self.judged(&self.scenario.bound(), self.scenario.allowance())
    }

    /// With [`Scenario::overrides`], what each aligned window of key 0 may admit given the
    /// operator's writes as they were made (overrides.rs derives it); `None` without
    /// overrides, or for a scenario outside the shapes that bound is stated for.
    pub fn override_bound(&self) -> Option<OverrideBound> {
        OverrideBound::new(&self.scenario, &self.override_writes)
    }

    /// The run judged against the scenario's own policy plus a given allowance (0: the
    /// exact bound, to measure).
    pub fn result_with_allowance(&self, extra_allowance: u64) -> ScenarioResult {
        self.judged(&self.scenario.policy, extra_allowance)
    }

    /// The run judged against `bound` plus `extra_allowance` on every window.
    fn judged(&self, bound: &Policy, extra_allowance: u64) -> ScenarioResult {
        let start = clock::start();
        let facts = ScenarioFacts {
            name: self.scenario.name.clone(),
            seed: self.scenario.seed,
            nodes: self.scenario.nodes,
            faults: self.scenario.describe_faults(),
            fault_spans: self.scenario.faults.iter().map(|f| f.span(start)).collect(),
            run: self.interval(),
            demanded: self.demanded(),
            exact_admitted: self.exact_admitted(),
            extra_allowance,
            fallback: self.fallback_time(),
        };
        ScenarioResult::measure(ScenarioInputs {
            facts,
            policy: &self.scenario.policy,
            bound,
            log: &self.log,
            chart_key: 0,
            latencies: self.latencies(),
        })
    }

    /// One line of measured numbers, for a test's stderr.
    pub fn summary(&self) -> String {
        let result = self.result();
        let exact = self.result_with_allowance(0);
        format!(
            "{}: seed {} nodes {} demanded {} admitted {} exact {} allowance {} \
             over-admission (vs exact bound) {} excess {} failures {} max latency {} µs",
            self.scenario.name,
            self.scenario.seed,
            self.scenario.nodes,
            self.demanded(),
            self.admitted(),
            result.facts.exact_admitted,
            result.facts.extra_allowance,
            exact.over_admission(),
            exact
                .verdict
                .worst()
                .map(|v| v.excess())
                .unwrap_or_default(),
            self.failures(),
            self.max_latency().as_micros(),
        )
    }
}

/// How much more than its bound a limit may admit when calls judge at `now`s up to `stale`
/// apart from when they take effect: `⌈rate × stale⌉` tokens for a bucket, one limit per
/// window `stale` can reach into for the window algorithms.
fn stale_allowance(limit: &Limit, stale: Micros) -> u64 {
    let stale = stale.as_micros();
    match limit {
        Limit::TokenBucket(b) => {
            let (per_token, per_micro) = b.emission_interval();
            (stale * per_micro).div_ceil(per_token)
        }
        Limit::FixedWindow(w) => w.limit() * stale.div_ceil(w.window().as_micros()),
        Limit::SlidingLog(w) => w.limit() * stale.div_ceil(w.window().as_micros()),
        Limit::SlidingCounter(w) => w.limit() * stale.div_ceil(w.window().as_micros()),
    }
}

/// Nodes per turmoil host by default: every node its own host up to this many hosts.
fn default_nodes_per_host(nodes: usize) -> usize {
    nodes.div_ceil(MAX_HOSTS).max(1)
}

/// The most hosts a world gets by default: turmoil's cost per tick grows with the cube of
/// the hosts (every pair is a link, every host scans every link), measured in docs/sim.md.
const MAX_HOSTS: usize = 16;

/// turmoil's default capacity of a listener's queue and of a stream's buffer.
const TCP_CAPACITY: usize = 64;

const DEMAND_STREAM: u64 = 1;
const SKEW_STREAM: u64 = 2;
