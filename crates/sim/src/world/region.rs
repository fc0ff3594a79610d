//! Several regions, a WAN between them, one limit: the multi-region scenarios
//! (docs/multi-region.md).
//!
//! Each region is one turmoil host running its nodes (each a serial worker with its own
//! rein-redis store and connection, as in `node.rs`), and, except with one global Redis, its
//! own simulated Redis host. WAN latency is turmoil's per-link latency
//! (`Sim::set_link_latency`, fixed, so deterministic): a region's host reaches a Redis in
//! another region after `max(one_way_a, one_way_b)`, its own after the local 1–2 ms.
//!
//! What crosses the WAN besides a global Redis's calls is control traffic: demand reports
//! and grants (the rebalanced quota) or count snapshots (asynchronous counters). The runner
//! carries it between simulation steps, delivering each message `max(one_way_a,
//! one_way_b)` after it was sent and dropping it if either end is cut off when it is sent or
//! due. The control plane is rein's own state machines ([`rein::region::Rebalancer`],
//! [`rein::region::RegionQuota`]) or the naive counters here ([`AsyncCounts`]); the data plane is
//! the real store and the real Lua.
//!
//! Every strategy enforces a fixed window `L` per `W` (aligned to multiples of `W`, as the
//! store's windows are), and the oracle checks every aligned window of the global log
//! against `L` plus the strategy's allowance: zero for the global Redis, the static split
//! and the rebalanced quota, `(R − 1) × L` for asynchronous counters (each region believing
//! the others idle), and [`async_bound_violations`] for the tighter bound derived in
//! docs/multi-region.md.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::error::Error;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rein::{
    Source,
    region::{QuotaGrant, RebalanceConfig, Rebalancer, RegionQuota, split},
};
use rein_core::{Limit, Limiter, Micros, NamedPolicy, Policy, Timestamp};
use rein_redis::RedisPolicy;

use super::clock::{self, true_now};
use super::node::{build_store_on, issue, record, run_tasks, store_outcome, user_key};
use super::rng::Rng;
use super::runner::{self, Network, Recorded};
use super::tap::{ScriptTap, tapped_host};
use super::workload::{Request, Workload};
use super::{Event, Outcome, REDIS_PORT};
use crate::oracle::Interval;
use crate::redis::{Clock, Persistence, Shared};
use crate::report::{FaultSpan, ScenarioFacts, ScenarioInputs, ScenarioResult};

/// How regions share the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// One Redis in region 0; every region's nodes call it across the WAN.
    Global,
    /// Each region its own Redis with a fixed weighted share of `L` ([`rein::region::split`]).
    StaticSplit,
    /// Each region its own Redis with a quota granted per window from region 0
    /// ([`rein::region::Rebalancer`], [`rein::region::RegionQuota`]).
    Rebalanced,
    /// Each region its own Redis counting locally, with the others' counts of the current
    /// window learnt from snapshots sent every `sync_every`: a region admits while its own
    /// count stays within `L` minus what it last heard of the others.
    AsyncCounters,
}

/// One region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// One-way WAN latency to the home region (0 for the home itself).
    pub one_way: Duration,
    /// Nodes (serial workers) in the region.
    pub nodes: usize,
    /// Requests per second the whole region is asked to decide.
    pub rate: u64,
}

/// A region cut off from every other region (and from Redis hosts elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The region.
    pub region: usize,
    /// From the start of demand.
    pub from: Duration,
    /// Heals at.
    pub until: Duration,
}

/// Everything that defines one multi-region run.
#[derive(Clone, Debug)]
pub struct RegionScenario {
    /// The report row's name and chart file name.
    pub name: String,
    /// The seed of demand and of turmoil's local jitter.
    pub seed: u64,
    /// How the regions share the limit.
    pub strategy: Strategy,
    /// `L`: the global limit per window.
    pub limit: u64,
    /// `W`.
    pub window: Duration,
    /// The regions; region 0 is home (the global Redis, the rebalancer).
    pub regions: Vec<Region>,
    /// Static split weights, and the weights of the rebalanced floors.
    pub weights: Vec<u32>,
    /// The share of `L` the rebalancer reserves as floors, in ‰.
    pub reserve_permille: u16,
    /// Asynchronous counters: how often each region sends its count.
    pub sync_every: Duration,
    /// How long demand lasts.
    pub span: Duration,
    /// A region cut off, if any.
    pub cut: Option<Cut>,
    /// The store's deadline (a global Redis needs more than the longest WAN round trip).
    pub deadline: Duration,
}

/// What one run recorded.
#[derive(Clone, Debug)]
pub struct RegionRun {
    /// The scenario.
    pub scenario: RegionScenario,
    /// What the nodes recorded (the run dereferences to it).
    pub recorded: Recorded,
    /// The region of each node.
    pub region_of: Vec<usize>,
}

/// One region's view of the asynchronous counters: what it admitted per window, and the
/// latest count it heard from each other region.
#[derive(Clone, Debug)]
pub struct AsyncCounts {
    region: usize,
    limit: u64,
    window: u64,
    own: BTreeMap<u64, u64>,
    /// Per region: `(window, count)` last heard.
    heard: Vec<Option<(u64, u64)>>,
}

impl RegionScenario {
    /// The default multi-region scenario for `strategy`: three regions 0, 25 and 75 ms
    /// one way from home (50 and 150 ms round trips), demand 480, 90 and 30 per second
    /// (80/15/5), 6 nodes each, `L` = 300 per second, static weights 1:1:1, floors 30 % of
    /// `L`, counters synced every 100 ms, 6 s of demand, deadline 50 ms (400 ms for the
    /// global Redis).
    pub fn new(name: impl Into<String>, seed: u64, strategy: Strategy) -> Self {
        let region = |ms, rate| Region {
            one_way: Duration::from_millis(ms),
            nodes: 6,
            rate,
        };
        Self {
            name: name.into(),
            seed,
            strategy,
            limit: 300,
            window: Duration::from_secs(1),
            regions: vec![region(0, 480), region(25, 90), region(75, 30)],
            weights: vec![1, 1, 1],
            reserve_permille: 300,
            sync_every: Duration::from_millis(100),
            span: Duration::from_secs(6),
            cut: None,
            deadline: match strategy {
                Strategy::Global => Duration::from_millis(400),
                _ => rein_core::limiter::DEFAULT_DEADLINE,
            },
        }
    }

    /// The global policy: `L` per `W`, fixed windows.
    ///
    /// # Panics
    /// If `limit` or `window` is zero (or `window` is beyond `rein_core::time::MAX_SPAN`): a
    /// scenario is test input, and such a scenario has no limit to check.
    pub fn policy(&self) -> Policy {
        Policy::single(
            Limit::fixed_window(self.limit, Micros::from(self.window))
                .expect("the scenario's limit is positive"),
        )
    }

    /// The slack the oracle allows on every window: 0 for the exact strategies, `(R − 1) ×
    /// L` for asynchronous counters.
    pub fn allowance(&self) -> u64 {
        match self.strategy {
            Strategy::AsyncCounters => (self.regions.len() as u64 - 1) * self.limit,
            _ => 0,
        }
    }

    /// One-way latency between regions `a` and `b` (the local 1 ms within one).
    pub fn wan(&self, a: usize, b: usize) -> Duration {
        if a == b {
            return LOCAL;
        }
        let one_way = |r: usize| self.regions.get(r).map_or(Duration::ZERO, |g| g.one_way);
        one_way(a).max(one_way(b)).max(LOCAL)
    }

    /// Asynchronous counters: how stale a region's view of another's count can be at the
    /// instant one of its admissions runs (docs/multi-region.md): the sync interval, the
    /// longest one-way WAN, two deadlines (answered before published, issued before run)
    /// and a tick each way.
    pub fn staleness(&self) -> Duration {
        let wan = (0..self.regions.len())
            .flat_map(|a| (0..self.regions.len()).map(move |b| (a, b)))
            .map(|(a, b)| self.wan(a, b))
            .max()
            .unwrap_or_default();
        self.sync_every + wan + 2 * self.deadline + 2 * TICK
    }

    /// Plays the scenario.
    pub fn run(&self) -> Result<RegionRun, Box<dyn Error>> {
        let regions = self.regions.len();
        if regions == 0 || regions > REDIS_HOSTS.len() {
            return Err(format!("1 to {} regions", REDIS_HOSTS.len()).into());
        }
        let window = Micros::from(self.window);
        let policy = self.policy();
        let shares = split(&policy, &self.weights)?;
        let rebalance = RebalanceConfig::new(
            self.limit,
            window,
            &self.weights,
            self.reserve_permille,
            Micros::from(self.deadline),
        )?;
        let origin = Timestamp::from_micros(clock::EPOCH_SECS * 1_000_000);
        let mut world = runner::build(&Network {
            seed: self.seed,
            tick: TICK,
            latency: (LOCAL, LOCAL + TICK),
            tcp_capacity: 64,
            span: self.span,
        });
        let tap = ScriptTap::default();
        let redis_hosts = match self.strategy {
            Strategy::Global => 1,
            _ => regions,
        };
        for host in &REDIS_HOSTS[..redis_hosts] {
            let node = Shared::new(Clock::turmoil());
            world.host(
                *host,
                tapped_host(node, REDIS_PORT, Persistence::KeepData, tap.clone()),
            );
        }
        let events = Rc::new(RefCell::new(Vec::new()));
        let demand_rng = Rng::new(self.seed).child(DEMAND_STREAM);
        let mut demand = Vec::new();
        let mut region_of = Vec::new();
        let mut quotas = Vec::new();
        let mut counts = Vec::new();
        for (r, region) in self.regions.iter().enumerate() {
            let per_node = region.rate / region.nodes.max(1) as u64;
            let requests = Workload::Steady.generate(
                &demand_rng.child(r as u64),
                region.nodes,
                per_node,
                self.span,
            );
            let quota = Rc::new(RefCell::new(RegionQuota::new(rebalance.clone(), r, origin)));
            let count = Rc::new(RefCell::new(AsyncCounts::new(
                r, regions, self.limit, window,
            )));
            quotas.push(quota.clone());
            counts.push(count.clone());
            let mut nodes = Vec::new();
            for requests in requests {
                let mode = match self.strategy {
                    Strategy::Global => Mode::Fixed(policy.clone()),
                    Strategy::StaticSplit => Mode::Fixed(shares[r].clone()),
                    Strategy::Rebalanced => Mode::Rebalanced(quota.clone()),
                    Strategy::AsyncCounters => Mode::Async(count.clone()),
                };
                nodes.push(RegionNode {
                    index: demand.len(),
                    redis: REDIS_HOSTS[if self.strategy == Strategy::Global {
                        0
                    } else {
                        r
                    }],
                    requests: requests.clone(),
                    mode,
                    window,
                    deadline: self.deadline,
                    tap: tap.clone(),
                    events: events.clone(),
                });
                demand.push(requests);
                region_of.push(r);
            }
            world.client(REGION_HOSTS[r], run_tasks(nodes.into_iter().map(run_node)));
        }
        for (r, region) in REGION_HOSTS.iter().enumerate().take(regions) {
            for (h, host) in REDIS_HOSTS[..redis_hosts].iter().enumerate() {
                if h != r {
                    world.set_link_latency(*region, *host, self.wan(r, h));
                }
            }
        }
        let mut control = Control {
            scenario: self,
            home: Rebalancer::new(rebalance, origin),
            quotas,
            counts,
            in_flight: VecDeque::new(),
            next_sync: origin,
            cut_applied: false,
        };
        runner::drive(&mut world, |world| {
            let now = origin.saturating_add(Micros::from(world.elapsed()));
            control.step(world, now, redis_hosts);
        })?;
        Ok(RegionRun {
            scenario: self.clone(),
            recorded: Recorded::new(events.take(), demand, self.span),
            region_of,
        })
    }

    /// The strategy and the cut in words.
    pub fn describe(&self) -> String {
        let strategy = match self.strategy {
            Strategy::Global => "one global Redis".to_owned(),
            Strategy::StaticSplit => format!("static split {:?}", self.weights),
            Strategy::Rebalanced => format!(
                "quota rebalanced per window, floors {} ‰",
                self.reserve_permille
            ),
            Strategy::AsyncCounters => {
                format!(
                    "async counters, sync every {} ms",
                    self.sync_every.as_millis()
                )
            }
        };
        match self.cut {
            Some(c) => format!(
                "{strategy}; region {} cut off at {:.1}–{:.1} s",
                c.region,
                c.from.as_secs_f64(),
                c.until.as_secs_f64()
            ),
            None => strategy,
        }
    }

    fn cut_at(&self, now: Timestamp) -> Option<usize> {
        let c = self.cut?;
        let since = now.saturating_since(clock::start()).as_micros();
        let inside = now >= clock::start()
            && since >= c.from.as_micros() as u64
            && since < c.until.as_micros() as u64;
        inside.then_some(c.region)
    }
}

impl std::ops::Deref for RegionRun {
    type Target = Recorded;

    fn deref(&self) -> &Recorded {
        &self.recorded
    }
}

impl RegionRun {
    /// What one exact global limiter would have admitted given each request at the instant
    /// it was issued: the reference for utilisation.
    pub fn exact_admitted(&self) -> u64 {
        let start = clock::start();
        self.exact_admitted_since(&self.scenario.policy(), start)
    }

    /// Utilisation counted from `after` the start of demand on (the rebalanced quota needs
    /// two windows of reports before its first grant from demand): admitted ÷ what an
    /// exact global limiter admitted, both from then on, in percent.
    pub fn utilisation_after_percent(&self, after: Duration) -> f64 {
        let from = clock::start().saturating_add(after.into());
        let admitted: u64 = self
            .log
            .admissions()
            .iter()
            .filter(|a| a.at >= from)
            .map(|a| a.cost)
            .sum();
        let exact = self.exact_admitted_since(&self.scenario.policy(), from);
        100.0 * admitted as f64 / exact.max(1) as f64
    }

    /// Admitted ÷ what an exact global limiter would have admitted, in percent (above 100
    /// when the strategy over-admits).
    pub fn utilisation_percent(&self) -> f64 {
        100.0 * self.admitted() as f64 / self.exact_admitted().max(1) as f64
    }

    /// The most any aligned window admitted above `L`, in cost units (0 when none did).
    pub fn over_admission(&self) -> u64 {
        let verdict = self.log.check_policy(&self.scenario.policy(), 0);
        verdict.worst().and_then(|v| v.worst).map_or(0, |w| {
            u64::try_from(w.excess().ceil().max(0)).unwrap_or(u64::MAX)
        })
    }

    /// Decision latencies of region `r`'s nodes (all regions with `None`).
    pub fn latencies(&self, region: Option<usize>) -> Vec<Micros> {
        self.events
            .iter()
            .filter(|e| region.is_none_or(|r| self.region_of[e.node] == r))
            .map(|e| e.answered.saturating_since(e.issued))
            .collect()
    }

    /// The cost region `r` admitted during `during`.
    pub fn admitted_by_region(&self, region: usize, during: Interval) -> u64 {
        self.log
            .admissions()
            .iter()
            .filter(|a| self.region_of[a.node] == region && during.contains(a.at))
            .map(|a| a.cost)
            .sum()
    }

    /// The run as a report row and chart, judged against `L` plus the strategy's allowance.
    pub fn result(&self) -> ScenarioResult {
        let s = &self.scenario;
        let policy = s.policy();
        let start = clock::start();
        let facts = ScenarioFacts {
            name: s.name.clone(),
            seed: s.seed,
            nodes: self.region_of.len(),
            faults: s.describe(),
            fault_spans: s
                .cut
                .iter()
                .map(|c| FaultSpan {
                    during: Interval::new(
                        start.saturating_add(c.from.into()),
                        start.saturating_add(c.until.into()),
                    ),
                    label: format!("region {} cut off", c.region),
                })
                .collect(),
            run: self.interval(),
            demanded: self.demanded(),
            exact_admitted: self.exact_admitted(),
            extra_allowance: s.allowance(),
            fallback: self.failure_time(),
        };
        ScenarioResult::measure(ScenarioInputs {
            facts,
            policy: &policy,
            bound: &policy,
            log: &self.log,
            chart_key: 0,
            latencies: self.latencies(None),
        })
    }

    /// One line of measured numbers.
    pub fn summary(&self) -> String {
        let pct = |r: Option<usize>, n: u64| {
            crate::report::LatencySamples::new(self.latencies(r))
                .percentile(n, 100)
                .map_or(0, |m| m.as_micros() / 1_000)
        };
        format!(
            "{}: seed {} admitted {} exact {} utilisation {:.1} % over-admission {} \
             failures {} p50 {} ms p99 {} ms (far region p50 {} ms)",
            self.scenario.name,
            self.scenario.seed,
            self.admitted(),
            self.exact_admitted(),
            self.utilisation_percent(),
            self.over_admission(),
            self.failures(),
            pct(None, 50),
            pct(None, 99),
            pct(Some(self.scenario.regions.len() - 1), 50),
        )
    }

    /// Asynchronous counters: the aligned windows that break the bound derived in
    /// docs/multi-region.md, `admitted(w) ≤ L + Σ_{j ≠ i} a_j(w, (t − τ, t])`, where `t` is the
    /// last admission of window `w`, `i` its region, `τ` the [staleness](RegionScenario::staleness)
    /// and `a_j` what region `j` admitted in that span of `w`; a region cut off from `i` (or
    /// `i` cut off) during `w` counts all it admitted in `w`. Each returned item is
    /// `(window start, admitted, bound)`.
    pub fn async_bound_violations(&self) -> Vec<(Timestamp, u64, u64)> {
        let s = &self.scenario;
        let w = Micros::from(s.window).as_micros();
        let tau = Micros::from(s.staleness()).as_micros();
        let mut by_window: BTreeMap<u64, Vec<(Timestamp, usize, u64)>> = BTreeMap::new();
        for a in self.log.admissions() {
            by_window.entry(a.at.as_micros() / w).or_default().push((
                a.at,
                self.region_of[a.node],
                a.cost,
            ));
        }
        let mut violations = Vec::new();
        for (index, mut admissions) in by_window {
            admissions.sort();
            let total: u64 = admissions.iter().map(|a| a.2).sum();
            let Some(&(last, i, _)) = admissions.last() else {
                continue;
            };
            let window_start = Timestamp::from_micros(index * w);
            let window_end = Timestamp::from_micros((index + 1) * w);
            let cut_during = s.cut.filter(|c| {
                let from = clock::start().saturating_add(c.from.into());
                // The cut's effect lasts until fresh snapshots arrive.
                let until = clock::start()
                    .saturating_add(c.until.into())
                    .saturating_add(Micros::from_micros(tau));
                from < window_end && until > window_start
            });
            let unseen: u64 = admissions
                .iter()
                .filter(|&&(at, j, _)| {
                    j != i
                        && (cut_during.is_some_and(|c| c.region == j || c.region == i)
                            || at.as_micros() + tau > last.as_micros())
                })
                .map(|a| a.2)
                .sum();
            let bound = s.limit + unseen;
            if total > bound {
                violations.push((window_start, total, bound));
            }
        }
        violations
    }

    fn failure_time(&self) -> Vec<Micros> {
        let mut total = vec![0u64; self.region_of.len()];
        for e in &self.events {
            if matches!(e.outcome, Outcome::Failed(_)) {
                total[e.node] += e.answered.saturating_since(e.issued).as_micros();
            }
        }
        total.into_iter().map(Micros::from_micros).collect()
    }
}

impl AsyncCounts {
    fn new(region: usize, regions: usize, limit: u64, window: Micros) -> Self {
        Self {
            region,
            limit,
            window: window.as_micros().max(1),
            own: BTreeMap::new(),
            heard: vec![None; regions],
        }
    }

    /// What this region may still let its own count reach in `now`'s window: `L` minus
    /// the others' counts last heard for that window.
    fn allowance(&self, now: Timestamp) -> u64 {
        let window = now.as_micros() / self.window;
        let others: u64 = self
            .heard
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != self.region)
            .filter_map(|(_, h)| h.filter(|(w, _)| *w == window).map(|(_, c)| c))
            .sum();
        self.limit.saturating_sub(others)
    }

    fn record(&mut self, at: Timestamp, cost: u64) {
        *self.own.entry(at.as_micros() / self.window).or_default() += cost;
    }

    fn snapshot(&self, now: Timestamp) -> (u64, u64) {
        let window = now.as_micros() / self.window;
        (window, self.own.get(&window).copied().unwrap_or(0))
    }

    fn hear(&mut self, from: usize, window: u64, count: u64) {
        if let Some(slot) = self.heard.get_mut(from)
            && slot.is_none_or(|(w, c)| (w, c) <= (window, count))
        {
            *slot = Some((window, count));
        }
    }
}

/// The runner's half of the world: control messages over the WAN, between steps.
struct Control<'a> {
    scenario: &'a RegionScenario,
    home: Rebalancer,
    quotas: Vec<Rc<RefCell<RegionQuota>>>,
    counts: Vec<Rc<RefCell<AsyncCounts>>>,
    /// `(due, from, to, message)`, in send order (delivery scans for due ones).
    in_flight: VecDeque<(Timestamp, usize, usize, Message)>,
    next_sync: Timestamp,
    cut_applied: bool,
}

#[derive(Clone, Debug)]
enum Message {
    Report(rein::region::DemandReport),
    Grant(QuotaGrant),
    Count { window: u64, count: u64 },
}

impl Control<'_> {
    fn step(&mut self, world: &mut turmoil::Sim<'_>, now: Timestamp, redis_hosts: usize) {
        let s = self.scenario;
        let cut = s.cut_at(now);
        // The data plane: a cut region loses its links to Redis hosts in other regions.
        if let Some(c) = s.cut
            && cut.is_some() != self.cut_applied
        {
            for (h, host) in REDIS_HOSTS[..redis_hosts].iter().enumerate() {
                if h != c.region {
                    if cut.is_some() {
                        world.partition(REGION_HOSTS[c.region], *host);
                    } else {
                        world.repair(REGION_HOSTS[c.region], *host);
                    }
                }
            }
            self.cut_applied = cut.is_some();
        }
        let severed = |a: usize, b: usize| a != b && cut.is_some_and(|c| c == a || c == b);
        // Deliver what is due, in send order.
        let mut kept = VecDeque::new();
        while let Some((due, from, to, message)) = self.in_flight.pop_front() {
            if due > now {
                kept.push_back((due, from, to, message));
                continue;
            }
            if severed(from, to) {
                continue;
            }
            match message {
                Message::Report(report) => self.home.handle_report(now, report),
                Message::Grant(grant) => self.quotas[to].borrow_mut().handle_grant(&grant),
                Message::Count { window, count } => {
                    self.counts[to].borrow_mut().hear(from, window, count)
                }
            }
        }
        self.in_flight = kept;
        let mut send = |from: usize, to: usize, message: Message| {
            if !severed(from, to) {
                let due = now.saturating_add(s.wan(from, to).into());
                self.in_flight.push_back((due, from, to, message));
            }
        };
        match s.strategy {
            Strategy::Rebalanced => {
                for (r, quota) in self.quotas.iter().enumerate() {
                    if let Some(report) = quota.borrow_mut().poll_report(now) {
                        send(r, 0, Message::Report(report));
                    }
                }
                self.home.handle_timeout(now);
                while let Some(grant) = self.home.poll_grant() {
                    for r in 0..s.regions.len() {
                        send(0, r, Message::Grant(grant.clone()));
                    }
                }
            }
            Strategy::AsyncCounters if now >= self.next_sync => {
                self.next_sync = now.saturating_add(s.sync_every.into());
                for (r, counts) in self.counts.iter().enumerate() {
                    let (window, count) = counts.borrow().snapshot(now);
                    for to in (0..s.regions.len()).filter(|&to| to != r) {
                        send(r, to, Message::Count { window, count });
                    }
                }
            }
            _ => {}
        }
    }
}

/// How a node picks the limit its store enforces.
enum Mode {
    /// A fixed policy: the global one, or the region's static share.
    Fixed(Policy),
    /// The region's rebalanced quota for the current window.
    Rebalanced(Rc<RefCell<RegionQuota>>),
    /// `L` minus the others' counts last heard.
    Async(Rc<RefCell<AsyncCounts>>),
}

struct RegionNode {
    index: usize,
    redis: &'static str,
    requests: Vec<Request>,
    mode: Mode,
    window: Micros,
    deadline: Duration,
    tap: ScriptTap,
    events: Rc<RefCell<Vec<Event>>>,
}

async fn run_node(node: RegionNode) -> turmoil::Result {
    let current: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let store = build_store_on(
        node.redis,
        node.deadline,
        node.deadline,
        None,
        current.clone(),
    )
    .await?;
    // One prepared policy per limit value: the quota changes per window, the Redis key
    // (which names the policy, not its numbers) does not, so the window's count carries over
    // when the quota changes.
    let mut prepared: BTreeMap<u64, RedisPolicy> = BTreeMap::new();
    for request in &node.requests {
        let issued = issue(request, &[]).await;
        let limit = match &node.mode {
            Mode::Fixed(policy) => policy.capacity(),
            Mode::Rebalanced(quota) => {
                let mut quota = quota.borrow_mut();
                quota.record_demand(issued, request.cost);
                quota.quota(issued)
            }
            Mode::Async(counts) => counts.borrow().allowance(issued),
        };
        let (outcome, source) = if limit < request.cost {
            // Nothing left for this region in this window: denied here, no call.
            (Outcome::Denied, None)
        } else {
            let policy = match prepared.entry(limit) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let policy = match &node.mode {
                        Mode::Fixed(policy) => policy.clone(),
                        _ => Policy::single(Limit::fixed_window(limit, node.window)?),
                    };
                    e.insert(RedisPolicy::prepare(&NamedPolicy::new("sim", policy)?))
                }
            };
            let result = store
                .acquire(None, policy, user_key(request.key).as_ref(), request.cost)
                .await;
            let answered = true_now();
            let outcome = store_outcome(result, &current, &node.tap, (issued, answered));
            if let (Mode::Async(counts), Outcome::Admitted { at, .. }) = (&node.mode, outcome) {
                counts.borrow_mut().record(at, request.cost);
            }
            let source = (!matches!(outcome, Outcome::Failed(_))).then_some(Source::Store);
            (outcome, source)
        };
        record(
            &node.events,
            node.index,
            request,
            (issued, true_now()),
            outcome,
            source,
        );
    }
    Ok(())
}

/// The multi-region scenarios of the report, in order.
pub const REGION_SUITE: &[&str] = &[
    "multi-region-global",
    "multi-region-static-split",
    "multi-region-rebalanced",
    "multi-region-async",
    "multi-region-global-cut",
    "multi-region-static-split-cut",
    "multi-region-rebalanced-cut",
    "multi-region-async-cut",
];

/// The multi-region scenario `name` with `seed`; `None` for an unknown name. The `-cut`
/// variants cut region 1 (50 ms away, demand above its floor) off from 2.5 s to 4.5 s.
pub fn region_scenario(name: &str, seed: u64) -> Option<RegionScenario> {
    let base = name.strip_suffix("-cut").unwrap_or(name);
    let strategy = match base {
        "multi-region-global" => Strategy::Global,
        "multi-region-static-split" => Strategy::StaticSplit,
        "multi-region-rebalanced" => Strategy::Rebalanced,
        "multi-region-async" => Strategy::AsyncCounters,
        _ => return None,
    };
    let mut s = RegionScenario::new(name, seed, strategy);
    if base != name {
        s.cut = Some(Cut {
            region: 1,
            from: Duration::from_millis(2500),
            until: Duration::from_millis(4500),
        });
    }
    Some(s)
}

/// Latency within a region (turmoil draws 1–2 ms).
const LOCAL: Duration = Duration::from_millis(1);
const TICK: Duration = Duration::from_millis(1);
const REGION_HOSTS: [&str; 3] = ["region0", "region1", "region2"];
const REDIS_HOSTS: [&str; 3] = ["redis0", "redis1", "redis2"];
const DEMAND_STREAM: u64 = 11;
