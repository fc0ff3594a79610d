//! One limit shared by regions far apart: [`split`], a static division of a policy among
//! regions, and the two halves of a quota rebalanced from a home region every window,
//! [`Rebalancer`] (at home) and [`RegionQuota`] (in each region), as sans-IO state machines.
//!
//! Each region keeps its own store (a Redis in the region), so a decision pays a local round
//! trip, never the WAN. What crosses the WAN is control traffic: a demand report per region
//! per window, and one grant per window from the home region. docs/multi-region.md compares
//! this with one global Redis, with a static split and with counters reconciled later, with
//! measurements from the simulator.
//!
//! # Why the rebalanced quota is exact
//! A region enforces, for window `w` (fixed windows of the limit's length, aligned to
//! multiples of it), a fixed-window limit that is never above `q_i(w)`: the grant it received
//! for `w`, or its floor `f_i` without one. The home grants each window once (a home that
//! restarts, or a new one, starts after every window an earlier home may have granted), with
//! `f_i ≤ q_i(w)` and `Σ_i q_i(w) ≤ L`. A store counts cumulatively within a window (every
//! quota in one key: the Redis store does while `L` stays below its integer layout's bound,
//! docs/multi-region.md says which) and
//! admits only while `count + cost ≤` the quota it is given, so whatever quotas a region
//! used during `w`, it admitted at most the largest of them, `≤ q_i(w)`; together the regions
//! admit `≤ Σ q_i(w) ≤ L`. Lost, late or reordered grants only leave a region on its floor:
//! under-admission, never over. The traps are at the windows' edges, because the store's
//! clock (Redis `TIME`), not the region's, decides which window a call counts in: a call
//! sent just before a window ends that runs in the next, or a store clock ahead of the
//! region's, and a store clock behind it, still counting the previous window when the
//! region's has moved on. [`RegionQuota::quota`] gives `min(q(w), q(w + 1))` during the last
//! `guard` of a window and `min(q(w − 1), q(w))` during its first. Set `guard` ≥ the store's
//! deadline plus the largest offset between the clock passed as `now` and the store's
//! clock.

use std::collections::{BTreeMap, VecDeque};

use rein_core::{Algorithm, ConfigError, Limit, Micros, Policy, Timestamp};

/// Divides `policy` among regions in proportion to `weights`: region `i` gets every capacity
/// times `w_i / Σw`, rounded down, and every rate times `w_i / Σw` exactly (a token bucket's
/// period is multiplied by `Σw` and its refill by `w_i`). Windows keep their length.
///
/// The regions' policies together never admit more than `policy`: capacities sum to at most
/// the whole, rates to exactly the whole, so the union of the regions' buckets (or windows)
/// is within the whole's. Unlike [`local_share`](crate::fallback::local_share), a share is never
/// rounded up to 1: a weight too small for a limit is an error, because the sum must hold.
///
/// Errors: no weights, or all zero ([`ConfigError::Zero`]); a region whose share of some
/// limit rounds to zero ([`ConfigError::Zero`]); a token bucket whose period times `Σw`
/// exceeds 2^52 µs ([`ConfigError::TooLarge`]).
///
/// ```
/// use rein::core::{Limit, Micros, Policy};
/// use rein::region::split;
///
/// let policy = Policy::single(Limit::fixed_window(300, Micros::from_secs(1))?);
/// let regions = split(&policy, &[2, 1, 1])?;
/// assert_eq!(regions[0].limits(), [Limit::fixed_window(150, Micros::from_secs(1))?]);
/// assert_eq!(regions[2].limits(), [Limit::fixed_window(75, Micros::from_secs(1))?]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn split(policy: &Policy, weights: &[u32]) -> Result<Vec<Policy>, ConfigError> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return Err(ConfigError::Zero {
            what: "the sum of the region weights",
        });
    }
    weights
        .iter()
        .map(|&w| policy.try_map(|limit| split_limit(limit, u64::from(w), total)))
        .collect()
}

/// The settings the home region and every region agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebalanceConfig {
    /// `L`: what all regions together may admit per window.
    limit: u64,
    /// The window, `W`; windows are aligned to multiples of it.
    window: Micros,
    /// `f_i`: what region `i` may admit per window with no grant (cut off, or before the
    /// first grant). `Σ f_i ≤ L`.
    floors: Vec<u64>,
    /// The weights the floors (and the grant with no demand reported) follow.
    weights: Vec<u32>,
    /// How long before a window ends a region uses `min(q(w), q(w + 1))`, and after it
    /// starts `min(q(w − 1), q(w))`.
    guard: Micros,
}

/// One region's demand in one window, sent from the region to the home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DemandReport {
    /// The region, `0..regions`.
    pub region: usize,
    /// The window's index (its start divided by the window's length).
    pub window: u64,
    /// The cost asked in it, admitted or not.
    pub demanded: u64,
}

/// The quotas of one window, sent from the home to every region. `Σ quotas ≤ L` and each
/// quota is at least its region's floor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaGrant {
    /// The window's index.
    pub window: u64,
    /// What each region may admit in it.
    pub quotas: Vec<u64>,
}

/// The home region's half: collects [`DemandReport`]s and grants each window's quotas once,
/// half a window before it starts: the floors, plus the rest shared max-min fairly by the
/// demand each region reported for the window before last (a region with no such report
/// gets its floor only).
///
/// # Call order and time
/// `handle_report(now, report)` whenever a report arrives; `handle_timeout(now)` at or after
/// [`poll_timeout`](Self::poll_timeout); then `poll_grant()` until `None`, and send each
/// grant to every region. `now` may go back: it is taken at the latest instant seen. Time
/// that jumps ahead grants only the next window (a grant for a window already past is
/// useless), so nothing is granted twice and nothing piles up.
#[derive(Clone, Debug)]
pub struct Rebalancer {
    config: RebalanceConfig,
    /// The latest report per region: `(window, demanded)`.
    demand: Vec<Option<(u64, u64)>>,
    /// The next window to grant.
    next: u64,
    latest: Timestamp,
    grants: VecDeque<QuotaGrant>,
}

/// A region's half: the quota its store enforces at `now`, the demand it reports.
///
/// # Call order and time
/// Before each decision, `record_demand(now, cost)` and `quota(now)` (pass the quota to the
/// store as the window's limit; deny locally when it is 0). `handle_grant(grant)` whenever a
/// grant arrives. `poll_report(now)` at or after [`poll_timeout`](Self::poll_timeout): the
/// demand of the window that just ended, once, to send home. `now` may go back: it is taken
/// at the latest instant seen, nothing panics.
#[derive(Clone, Debug)]
pub struct RegionQuota {
    config: RebalanceConfig,
    region: usize,
    /// Quotas granted, by window; windows already past are dropped.
    granted: BTreeMap<u64, u64>,
    /// Cost asked, by window, until reported.
    demand: BTreeMap<u64, u64>,
    /// The first window not yet reported.
    unreported: u64,
    latest: Timestamp,
}

impl RebalanceConfig {
    /// `limit` per `window` shared by `weights.len()` regions; region `i`'s floor is its
    /// weighted share of `reserve_permille`‰ of `limit` (rounded down), and `guard` is how
    /// long at each edge of a window a region hedges against a call the store counts in the
    /// neighbouring window (one landing late, or a store clock ahead or behind): at least the
    /// store's deadline plus the largest offset between the region's clock and the store's.
    /// `guard` is capped at half a window.
    pub fn new(
        limit: u64,
        window: Micros,
        weights: &[u32],
        reserve_permille: u16,
        guard: Micros,
    ) -> Result<Self, ConfigError> {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        if total == 0 || limit == 0 || window.as_micros() == 0 {
            return Err(ConfigError::Zero {
                what: "the limit, the window, or the sum of the region weights",
            });
        }
        let reserve = muldiv(limit, u64::from(reserve_permille.min(1000)), 1000u64);
        let floors = weights
            .iter()
            .map(|&w| muldiv(reserve, u64::from(w), total))
            .collect();
        Ok(Self {
            limit,
            window,
            floors,
            weights: weights.to_vec(),
            guard: Micros::from_micros(guard.as_micros().min(window.as_micros() / 2)),
        })
    }

    /// The floors, by region.
    pub fn floors(&self) -> &[u64] {
        &self.floors
    }

    /// The index of the window holding `now`.
    pub fn window_of(&self, now: Timestamp) -> u64 {
        now.as_micros() / self.window.as_micros()
    }

    /// The start of window `index`.
    pub fn window_start(&self, index: u64) -> Timestamp {
        Timestamp::from_micros(index.saturating_mul(self.window.as_micros()))
    }
}

impl Rebalancer {
    /// The home's half, starting at `now`: the first grant is for the first window whose
    /// grant was not yet due at `now` plus `guard`. A home that restarts, or takes over from
    /// another, may follow one that already granted the next window (its grant is due half
    /// a window before it starts); granting it again, with other quotas, could let one
    /// region use the first grant and another the second, over `L` together. Regions
    /// without the earlier grant use their floors for that window: under-admission only.
    /// `guard` covers an offset between the two homes' clocks up to it.
    pub fn new(config: RebalanceConfig, now: Timestamp) -> Self {
        let regions = config.floors.len();
        let due_by = now
            .saturating_add(Micros::from_micros(config.window.as_micros() / 2))
            .saturating_add(config.guard);
        Self {
            next: config.window_of(due_by) + 1,
            config,
            demand: vec![None; regions],
            latest: now,
            grants: VecDeque::new(),
        }
    }

    /// A region's demand arrived. An older report than one already held is ignored (reports
    /// may arrive out of order over the WAN), and so is one for a window after the next by
    /// this side's clock (it would be kept, and hide every true report after it).
    pub fn handle_report(&mut self, now: Timestamp, report: DemandReport) {
        self.latest = self.latest.max(now);
        let begun = self.config.window_of(self.latest);
        if let Some(slot) = self.demand.get_mut(report.region)
            && report.window <= begun.saturating_add(1)
            && slot.is_none_or(|(w, _)| w <= report.window)
        {
            *slot = Some((report.window, report.demanded));
        }
    }

    /// When the next grant is due: half a window before its window starts, so that it
    /// crosses a WAN of up to half a window in time.
    pub fn poll_timeout(&self) -> Timestamp {
        let start = self.config.window_start(self.next);
        Timestamp::from_micros(
            start
                .as_micros()
                .saturating_sub(self.config.window.as_micros() / 2),
        )
    }

    /// Grants the next window if it is due at `now`.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.latest = self.latest.max(now);
        if self.latest < self.poll_timeout() {
            return;
        }
        // After a long silence, skip to the window after the current one.
        self.next = self.next.max(self.config.window_of(self.latest) + 1);
        let quotas = self.quotas();
        self.grants.push_back(QuotaGrant {
            window: self.next,
            quotas,
        });
        self.next += 1;
    }

    /// The next grant to send to every region.
    pub fn poll_grant(&mut self) -> Option<QuotaGrant> {
        self.grants.pop_front()
    }

    /// Floors, plus the rest of `L` filled max-min fairly up to each region's latest
    /// demand (the region asking least beyond its floor is served first, no region gets
    /// more than an equal part of what is left), and whatever then remains in proportion
    /// to demand (to the weights when no region reported any): headroom for growth. Every
    /// step rounds down, so `Σ ≤ L`.
    fn quotas(&self) -> Vec<u64> {
        let floors = &self.config.floors;
        let mut rest = self.config.limit - floors.iter().sum::<u64>();
        // A region whose latest report is older than the window before last is silent (cut
        // off, or down): it gets its floor only, which is all it may use without our grant,
        // and its share goes to the others. Any quotas with `f_i ≤ q_i`, `Σ ≤ L` are safe,
        // so this costs nothing if the region does hear the grant.
        let demand: Vec<u64> = self
            .demand
            .iter()
            .map(|d| match d {
                Some((window, demanded)) if window.saturating_add(2) >= self.next => *demanded,
                _ => 0,
            })
            .collect();
        let mut quotas = floors.clone();
        // Ascending need, ties by region index: deterministic.
        let mut order: Vec<usize> = (0..quotas.len()).collect();
        order.sort_by_key(|&r| (demand[r].saturating_sub(floors[r]), r));
        let mut left = order.len() as u64;
        for r in order {
            let give = demand[r].saturating_sub(floors[r]).min(rest / left.max(1));
            quotas[r] += give;
            rest -= give;
            left -= 1;
        }
        let by: Vec<u64> = if demand.iter().all(|&d| d == 0) {
            self.config.weights.iter().map(|&w| u64::from(w)).collect()
        } else {
            demand
        };
        // In u128: a region's demand is counted by its own side, up to `u64::MAX` each, and
        // an exact sum keeps `Σ ≤ L` (a saturated one would not).
        let sum: u128 = by.iter().map(|&d| u128::from(d)).sum();
        for (quota, share) in quotas.iter_mut().zip(&by) {
            *quota += muldiv(rest, *share, sum);
        }
        quotas
    }
}

impl RegionQuota {
    /// Region `region`'s half, starting at `now` with no grant (its floor).
    pub fn new(config: RebalanceConfig, region: usize, now: Timestamp) -> Self {
        Self {
            unreported: config.window_of(now),
            config,
            region,
            granted: BTreeMap::new(),
            demand: BTreeMap::new(),
            latest: now,
        }
    }

    /// A grant arrived. Grants for windows already past are dropped; the home grants each
    /// window once, so a second grant for one window is a duplicate.
    pub fn handle_grant(&mut self, grant: &QuotaGrant) {
        let current = self.config.window_of(self.latest);
        if grant.window >= current
            && let Some(&quota) = grant.quotas.get(self.region)
        {
            self.granted.insert(grant.window, quota);
        }
    }

    /// `cost` was asked at `now`.
    pub fn record_demand(&mut self, now: Timestamp, cost: u64) {
        self.latest = self.latest.max(now);
        let window = self.config.window_of(self.latest);
        let asked = self.demand.entry(window).or_default();
        *asked = asked.saturating_add(cost);
    }

    /// The most the region's store may have admitted in the current window when it decides
    /// at `now`: the grant for the window (the floor without one); during its last `guard`,
    /// the smaller of that and the next window's (a call that lands after the window ends),
    /// and during its first `guard`, the smaller of that and the previous window's (a store
    /// whose clock is behind the region's, still counting the previous window).
    pub fn quota(&mut self, now: Timestamp) -> u64 {
        self.latest = self.latest.max(now);
        let window = self.config.window_of(self.latest);
        // The previous window's grant is kept for the hedge at this one's start.
        self.granted.retain(|&w, _| w.saturating_add(1) >= window);
        let floor = self.config.floors.get(self.region).copied().unwrap_or(0);
        let of = |w: u64| self.granted.get(&w).copied().unwrap_or(floor);
        let guard = self.config.guard;
        let mut quota = of(window);
        let start = self.config.window_start(window);
        if window > 0 && self.latest.saturating_since(start) < guard {
            quota = quota.min(of(window - 1));
        }
        let end = self.config.window_start(window + 1);
        if end.saturating_since(self.latest) <= guard {
            quota = quota.min(of(window + 1));
        }
        quota
    }

    /// When the current window ends: a report is due then.
    pub fn poll_timeout(&self) -> Timestamp {
        self.config
            .window_start(self.config.window_of(self.latest) + 1)
    }

    /// The demand of the latest window that has ended, once; windows older than that are
    /// never reported (the home uses only the latest).
    pub fn poll_report(&mut self, now: Timestamp) -> Option<DemandReport> {
        self.latest = self.latest.max(now);
        let current = self.config.window_of(self.latest);
        if self.unreported >= current {
            return None;
        }
        let window = current - 1;
        self.unreported = current;
        let demanded = self.demand.get(&window).copied().unwrap_or(0);
        self.demand.retain(|&w, _| w >= current);
        Some(DemandReport {
            region: self.region,
            window,
            demanded,
        })
    }
}

/// One limit's share for weight `w` of `total`.
fn split_limit(limit: &Limit, w: u64, total: u64) -> Result<Limit, ConfigError> {
    let part = |whole: u64| match muldiv(whole, w, total) {
        0 => Err(ConfigError::Zero {
            what: "a region's share of a capacity (its weight is too small for the limit)",
        }),
        part => Ok(part),
    };
    match limit {
        Limit::TokenBucket(b) => {
            // `per_micro` tokens per `per_token` µs; the region refills `per_micro × w` per
            // `per_token × Σw`, exactly `w / Σw` of the rate.
            let (per_token, per_micro) = b.emission_interval();
            let period = per_token.checked_mul(total).ok_or(ConfigError::TooLarge {
                what: "period × the sum of the region weights",
                value: u64::MAX,
                max: rein_core::time::MAX_MICROS,
            })?;
            Limit::token_bucket(
                part(b.capacity())?,
                per_micro.saturating_mul(w),
                Micros::from_micros(period),
            )
        }
        Limit::FixedWindow(x) => Limit::fixed_window(part(x.limit())?, x.window()),
        Limit::SlidingLog(x) => Limit::sliding_log(part(x.limit())?, x.window()),
        Limit::SlidingCounter(x) => Limit::sliding_counter(part(x.limit())?, x.window()),
    }
}

/// `⌊a × b / c⌋` without overflow (`c > 0`; the result is at most `a` when `b ≤ c`).
fn muldiv(a: u64, b: u64, c: impl Into<u128>) -> u64 {
    u64::try_from(u128::from(a) * u128::from(b) / c.into().max(1)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SECOND: Micros = Micros::from_secs(1);

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_micros(ms * 1_000)
    }

    fn config() -> RebalanceConfig {
        // 300 per second for three regions, half of it reserved as floors 1:1:1.
        RebalanceConfig::new(300, SECOND, &[1, 1, 1], 500, Micros::from_millis(50)).unwrap()
    }

    #[test]
    fn split_capacities_sum_to_at_most_the_whole_and_rates_exactly() {
        let policy = Policy::new([
            Limit::token_bucket(100, 10, SECOND).unwrap(),
            Limit::sliding_log(7, SECOND).unwrap(),
        ])
        .unwrap();
        let parts = split(&policy, &[3, 2, 2]).unwrap();
        let buckets: Vec<Limit> = parts.iter().map(|p| p.limits()[0]).collect();
        assert_eq!(
            buckets[0],
            Limit::token_bucket(42, 30, Micros::from_secs(7)).unwrap()
        );
        assert_eq!(
            buckets[1],
            Limit::token_bucket(28, 20, Micros::from_secs(7)).unwrap()
        );
        assert_eq!(parts[0].limits()[1], Limit::sliding_log(3, SECOND).unwrap());
        assert_eq!(parts[2].limits()[1], Limit::sliding_log(2, SECOND).unwrap());
        // A weight too small for a capacity is an error, not a share rounded up.
        assert!(matches!(
            split(&policy, &[100, 1]),
            Err(ConfigError::Zero { .. })
        ));
        assert!(matches!(split(&policy, &[]), Err(ConfigError::Zero { .. })));
        assert!(matches!(
            split(&policy, &[0, 0]),
            Err(ConfigError::Zero { .. })
        ));
    }

    /// Reports are the network's: demands up to `u64::MAX` still give `Σ ≤ L` (a saturated
    /// sum gave each region all that was left), and a report for a far-future window is
    /// ignored (kept, it hid every true report after it).
    #[test]
    fn untrusted_reports_keep_the_sum_and_cannot_silence_a_region() {
        let config = config();
        let mut home = Rebalancer::new(config.clone(), at(0));
        let report = |region, window, demanded| DemandReport {
            region,
            window,
            demanded,
        };
        home.handle_report(at(100), report(0, 0, u64::MAX));
        home.handle_report(at(100), report(1, 0, u64::MAX));
        home.handle_report(at(100), report(2, u64::MAX, 1));
        home.handle_report(at(101), report(2, 0, 120));
        home.handle_timeout(at(500));
        let grant = home.poll_grant().expect("a grant");
        assert!(grant.quotas.iter().sum::<u64>() <= 300, "{grant:?}");
        assert!(
            grant.quotas[2] >= 100,
            "region 2's true report counts: {grant:?}"
        );
    }

    /// A number line: the home grants window 1 at 500 ms, from demand reported for window 0.
    #[test]
    fn grants_follow_reported_demand_on_top_of_the_floors() {
        let config = config();
        let mut home = Rebalancer::new(config.clone(), at(0));
        let mut home_region = RegionQuota::new(config.clone(), 0, at(0));
        assert_eq!(home_region.quota(at(10)), 50, "the floor before any grant");
        assert_eq!(home.poll_timeout(), at(500));
        home.handle_timeout(at(499));
        assert_eq!(home.poll_grant(), None);
        home.handle_report(
            at(100),
            DemandReport {
                region: 0,
                window: 0,
                demanded: 480,
            },
        );
        home.handle_report(
            at(100),
            DemandReport {
                region: 2,
                window: 0,
                demanded: 30,
            },
        );
        // An older report does not replace a newer one.
        home.handle_report(
            at(101),
            DemandReport {
                region: 2,
                window: 0,
                demanded: 30,
            },
        );
        home.handle_timeout(at(500));
        let grant = home.poll_grant().unwrap();
        // Floors 50 each; region 2 asks no more than its floor, region 0 gets the other 150.
        assert_eq!(
            grant,
            QuotaGrant {
                window: 1,
                quotas: vec![200, 50, 50]
            }
        );
        home_region.handle_grant(&grant);
        assert_eq!(home_region.quota(at(900)), 50, "still window 0");
        assert_eq!(
            home_region.quota(at(960)),
            50,
            "guard: min of windows 0 and 1"
        );
        // The first 50 ms of window 1 hedge too (a store clock behind may still count
        // window 0), then its grant holds.
        assert_eq!(
            home_region.quota(at(1_000)),
            50,
            "guard: min of windows 0 and 1"
        );
        assert_eq!(home_region.quota(at(1_049)), 50);
        assert_eq!(home_region.quota(at(1_050)), 200);
        // Window 2 has no grant yet: the last 50 ms of window 1 hedge to the floor.
        assert_eq!(home_region.quota(at(1_949)), 200);
        assert_eq!(home_region.quota(at(1_950)), 50);
        assert_eq!(home_region.quota(at(2_000)), 50);
        // Max-min fair beyond the floors: region 2 needs nothing more, region 1 its 40,
        // region 0 the remaining 110.
        home.handle_report(
            at(1_100),
            DemandReport {
                region: 1,
                window: 1,
                demanded: 90,
            },
        );
        home.handle_timeout(at(1_500));
        assert_eq!(
            home.poll_grant(),
            Some(QuotaGrant {
                window: 2,
                quotas: vec![160, 90, 50]
            })
        );
    }

    /// A region that stopped reporting (cut off) is granted its floor, which is all it can
    /// use without a grant, and the others get its share.
    #[test]
    fn a_silent_region_is_granted_its_floor_and_its_share_goes_to_the_others() {
        let mut home = Rebalancer::new(config(), at(0));
        let report = |region, window, demanded| DemandReport {
            region,
            window,
            demanded,
        };
        home.handle_report(at(100), report(0, 0, 480));
        home.handle_report(at(100), report(1, 0, 90));
        home.handle_timeout(at(500));
        assert_eq!(home.poll_grant().unwrap().quotas, [160, 90, 50]);
        // Region 1 goes silent: no report for window 1. Its report for window 0 still counts
        // for window 2's grant, not for window 3's.
        home.handle_report(at(1_100), report(0, 1, 480));
        home.handle_timeout(at(1_500));
        assert_eq!(home.poll_grant().unwrap().quotas, [160, 90, 50]);
        home.handle_report(at(2_100), report(0, 2, 480));
        home.handle_timeout(at(2_500));
        assert_eq!(home.poll_grant().unwrap().quotas, [200, 50, 50]);
    }

    #[test]
    fn a_region_reports_each_ended_window_once_and_time_going_back_is_harmless() {
        let mut region = RegionQuota::new(config(), 1, at(0));
        region.record_demand(at(10), 3);
        region.record_demand(at(20), 4);
        assert_eq!(region.poll_report(at(999)), None);
        assert_eq!(region.poll_timeout(), at(1_000));
        region.record_demand(at(1_001), 5);
        assert_eq!(
            region.poll_report(at(1_001)),
            Some(DemandReport {
                region: 1,
                window: 0,
                demanded: 7
            })
        );
        assert_eq!(region.poll_report(at(1_002)), None);
        // A clock that steps back counts in the latest window seen.
        region.record_demand(at(5), 1);
        assert_eq!(region.quota(at(0)), 50);
        assert_eq!(
            region.poll_report(at(2_000)),
            Some(DemandReport {
                region: 1,
                window: 1,
                demanded: 6
            })
        );
        let mut home = Rebalancer::new(config(), at(5_000));
        home.handle_timeout(at(0));
        assert_eq!(home.poll_grant(), None);
        // A long silence grants the next window only.
        home.handle_timeout(at(60_000));
        assert_eq!(home.poll_grant().map(|g| g.window), Some(61));
        assert_eq!(home.poll_grant(), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, rng_seed: proptest::test_runner::RngSeed::Fixed(12), ..ProptestConfig::default() })]

        /// The contract: whatever grants are lost or late, whatever demand is reported and
        /// however often the home restarts, the quotas the regions use in any window sum to
        /// at most `L`.
        #[test]
        fn quotas_used_in_any_window_sum_to_at_most_the_limit(
            steps in proptest::collection::vec((0u64..400, 0u64..1_000, 0usize..3, any::<bool>(), 0u8..16), 1..200),
            reserve in 0u16..=1000,
        ) {
            let config = RebalanceConfig::new(300, SECOND, &[5, 3, 1], reserve, Micros::from_millis(50)).unwrap();
            let mut home = Rebalancer::new(config.clone(), at(0));
            let mut regions: Vec<RegionQuota> =
                (0..3).map(|r| RegionQuota::new(config.clone(), r, at(0))).collect();
            // The largest quota each region used in each window.
            let mut used: BTreeMap<(u64, usize), u64> = BTreeMap::new();
            let mut now = 0;
            for (advance, demand, region, lose, restart) in steps {
                now += advance;
                let t = at(now);
                // The home restarts (or another takes over), its state lost.
                if restart == 0 {
                    home = Rebalancer::new(config.clone(), t);
                }
                regions[region].record_demand(t, demand);
                let quota = regions[region].quota(t);
                // A call sent now is decided in the window of the store's clock: up to the
                // guard later (its deadline, a store clock ahead) or earlier (a store clock
                // behind the region's).
                let early = Timestamp::from_micros(now.saturating_sub(50) * 1_000);
                for run in [early, t, t.saturating_add(Micros::from_millis(50))] {
                    let slot = used.entry((config.window_of(run), region)).or_default();
                    *slot = (*slot).max(quota);
                }
                if let Some(report) = regions[region].poll_report(t) {
                    home.handle_report(t, report);
                }
                home.handle_timeout(t);
                while let Some(grant) = home.poll_grant() {
                    prop_assert!(grant.quotas.iter().sum::<u64>() <= 300);
                    for (r, q) in regions.iter_mut().enumerate() {
                        if !(lose && r == region) {
                            q.handle_grant(&grant);
                        }
                    }
                }
            }
            let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
            for ((window, _), quota) in used {
                *per_window.entry(window).or_default() += quota;
            }
            for (window, sum) in per_window {
                prop_assert!(sum <= 300, "window {window}: {sum}");
            }
        }
    }
}
