//! The oracle: did the nodes, together, keep each limit's promise?
//!
//! A simulation records every admission with the **true** simulated instant it happened at
//! (not a node's skewed clock) in an [`AdmissionLog`]. The oracle then checks, per key, the
//! guarantee each [`Limit`] documents in `docs/algorithms.md`, over *every* window, and
//! reports the worst one:
//!
//! | limit | guarantee checked, per key | scan |
//! |---|---|---|
//! | token bucket | any closed `[a, b]` ≤ `capacity + refill × (b − a) / period` | Kadane-like |
//! | fixed window | each aligned window ≤ `limit` | one pass |
//! | sliding log | any `(t − window, t]` ≤ `limit` | two pointers |
//! | sliding counter | any `(t − window, t]` ≤ `2 × limit − 1`; measured against `limit` | two pointers |
//!
//! Every bound may be widened by an `extra_allowance` in cost units, added to every
//! window's bound: the slack a design documents (for example what nodes may admit on a
//! local fallback while Redis is unreachable). A verdict is then exact: the arithmetic is
//! in integers (`i128`, with token-bucket quantities scaled by the emission interval's
//! denominator) and the results are [`Fraction`]s, so "over the bound by 1/3 of a token"
//! is a finding, never a rounding artefact. Floats appear only in `to_f64`, for display.
//!
//! The scans are checked against brute force over all windows by this module's proptests,
//! and against rein-core itself: a log of `Policy::acquire` admissions has no excess.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use rein_core::{Algorithm, Limit, Micros, Policy, Timestamp};

/// One admitted request, as the simulated world saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Admission {
    /// The true simulated instant of the admission: when the decision took effect (for the
    /// Redis store, when its script ran), not any node's possibly skewed clock.
    pub at: Timestamp,
    /// The application node that admitted it, `0..nodes`.
    pub node: usize,
    /// The rate-limited key, as a small id the world assigns.
    pub key: u64,
    /// The cost admitted.
    pub cost: u64,
}

/// Every admission of a run, recorded in any order.
///
/// ```
/// use rein_core::{Limit, Micros, Timestamp};
/// use sim::oracle::{Admission, AdmissionLog};
///
/// let mut log = AdmissionLog::new();
/// for (node, ms) in [(0, 0), (1, 0), (0, 500)] {
///     let at = Timestamp::from_micros(ms * 1_000);
///     log.record(Admission { at, node, key: 7, cost: 1 });
/// }
/// // Two per second: the two nodes together admitted three within one second.
/// let limit = Limit::sliding_log(2, Micros::from_secs(1))?;
/// let verdicts = log.check(&limit, 0);
/// assert!(!verdicts[0].is_within_bound());
/// assert_eq!(verdicts[0].worst.map(|w| w.admitted), Some(3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmissionLog {
    admissions: Vec<Admission>,
}

/// An exact rational number: token-bucket bounds are rarely whole (3 per second refills one
/// token every 333 333⅓ µs), and a verdict must not round.
///
/// Always reduced, with a positive denominator, so `==` is equality of values. Ordering is
/// exact too, without the overflow of cross-multiplying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fraction {
    numerator: i128,
    denominator: i128,
}

/// A closed span of instants: the first and the last admission a window counted. The
/// window's bound is for exactly the admissions at instants in `[first, last]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// The instant of the earliest admission counted.
    pub first: Timestamp,
    /// The instant of the latest admission counted.
    pub last: Timestamp,
}

/// A half-open interval of simulated time, `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Interval {
    /// The first instant inside.
    pub start: Timestamp,
    /// The first instant after; an interval with `end <= start` is empty.
    pub end: Timestamp,
}

/// The busiest window found for one key against one bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// Where it is.
    pub span: Span,
    /// The cost admitted in it.
    pub admitted: u64,
    /// What the guarantee allows in it, extra allowance included.
    pub bound: Fraction,
}

/// The oracle's finding for one key against one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// The limit checked.
    pub limit: Limit,
    /// The key checked.
    pub key: u64,
    /// The cost admitted for the key over the whole log.
    pub admitted: u64,
    /// The documented slack added to every window's bound, in cost units.
    pub extra_allowance: u64,
    /// The window with the largest `admitted − bound` (the least headroom, or the most
    /// excess), or `None` when the key admitted nothing. For a token bucket, longer spans
    /// have larger bounds; this is the largest excess in cost units, not in percent.
    pub worst: Option<Window>,
    /// Sliding counter only: its busiest window held against the exact sliding-log rule
    /// (`limit` in any window, plus the allowance). A measurement of the approximation,
    /// not a guarantee: exceeding it is documented behaviour.
    pub against_exact_log: Option<Window>,
    /// Sliding counter only: its busiest aligned window (the counter's current one, which
    /// its estimate counts whole), held to `limit` plus the allowance: a guarantee beside
    /// `worst`'s `2 × limit − 1`, which alone let up to 1.98 × limit in one aligned window
    /// pass. Part of [`is_within_bound`](Self::is_within_bound).
    pub aligned: Option<Window>,
}

/// The oracle's findings for every limit of a policy and every key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyVerdict {
    /// One verdict per limit (in the policy's order) per key (ascending).
    pub verdicts: Vec<Verdict>,
}

impl AdmissionLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one admission. Order does not matter: checks sort by time.
    pub fn record(&mut self, admission: Admission) {
        self.admissions.push(admission);
    }

    /// The admissions, in recording order.
    pub fn admissions(&self) -> &[Admission] {
        &self.admissions
    }

    /// How many admissions were recorded.
    pub fn len(&self) -> usize {
        self.admissions.len()
    }

    /// `true` when nothing was admitted.
    pub fn is_empty(&self) -> bool {
        self.admissions.is_empty()
    }

    /// The keys that admitted anything, ascending.
    pub fn keys(&self) -> Vec<u64> {
        self.by_key().into_keys().collect()
    }

    /// The total cost admitted, all keys and nodes.
    pub fn admitted(&self) -> u64 {
        self.admissions
            .iter()
            .fold(0, |sum: u64, a| sum.saturating_add(a.cost))
    }

    /// The cost admitted for `key` at instants in `during`.
    pub fn admitted_during(&self, key: u64, during: Interval) -> u64 {
        self.admissions
            .iter()
            .filter(|a| a.key == key && during.contains(a.at))
            .fold(0, |sum: u64, a| sum.saturating_add(a.cost))
    }

    /// Checks `limit` on every key, each key as its own limiter (ascending by key).
    pub fn check(&self, limit: &Limit, extra_allowance: u64) -> Vec<Verdict> {
        self.by_key()
            .into_iter()
            .map(|(key, events)| check_events(limit, key, &events, extra_allowance))
            .collect()
    }

    /// Checks `limit` on one key; a key with no admissions gets a verdict with no window.
    pub fn check_key(&self, limit: &Limit, key: u64, extra_allowance: u64) -> Verdict {
        check_events(limit, key, &self.events_of(key), extra_allowance)
    }

    /// `key`'s admissions as (instant in µs, cost), one per instant, ascending.
    fn events_of(&self, key: u64) -> Vec<(u64, u64)> {
        merge_instants(
            self.admissions
                .iter()
                .filter(|a| a.key == key)
                .map(|a| (a.at.as_micros(), a.cost))
                .collect(),
        )
    }

    /// Checks every limit of `policy` on every key. A policy admits only what all its
    /// limits admit, so each limit's guarantee must hold on its own.
    pub fn check_policy(&self, policy: &Policy, extra_allowance: u64) -> PolicyVerdict {
        let by_key = self.by_key();
        let verdicts = policy
            .limits()
            .iter()
            .flat_map(|limit| {
                by_key
                    .iter()
                    .map(|(&key, events)| check_events(limit, key, events, extra_allowance))
            })
            .collect();
        PolicyVerdict { verdicts }
    }

    /// Every aligned window of `window` that admitted anything for `key`, ascending, each
    /// held to its own bound: `bound(start of the window)`, in cost units. The fixed
    /// window's guarantee when the limit in force changes during a run (an operator's
    /// override), which no single [`Limit`] states.
    ///
    /// ```
    /// use rein_core::{Micros, Timestamp};
    /// use sim::oracle::{Admission, AdmissionLog};
    ///
    /// let log: AdmissionLog = [0, 1, 1_500]
    ///     .map(|ms| Admission { at: Timestamp::from_micros(ms * 1_000), node: 0, key: 0, cost: 1 })
    ///     .into_iter()
    ///     .collect();
    /// // One a second from the second second on: the first holds two, the second one.
    /// let bound = |start: Timestamp| if start.as_micros() < 1_000_000 { 2 } else { 1 };
    /// let windows = log.aligned_windows(0, Micros::from_secs(1), bound);
    /// assert_eq!(windows.iter().map(|w| w.admitted).collect::<Vec<_>>(), [2, 1]);
    /// assert!(windows.iter().all(|w| w.is_within_bound()));
    /// ```
    pub fn aligned_windows(
        &self,
        key: u64,
        window: Micros,
        bound: impl Fn(Timestamp) -> u64,
    ) -> Vec<Window> {
        let width = window.as_micros().max(1);
        let mut windows: Vec<Window> = Vec::new();
        for (at, cost) in self.events_of(key) {
            let instant = Timestamp::from_micros(at);
            match windows.last_mut() {
                Some(w) if w.span.first.as_micros() / width == at / width => {
                    w.span.last = instant;
                    w.admitted = w.admitted.saturating_add(cost);
                }
                _ => windows.push(Window {
                    span: Span {
                        first: instant,
                        last: instant,
                    },
                    admitted: cost,
                    bound: Fraction::whole(i128::from(bound(Timestamp::from_micros(
                        at - at % width,
                    )))),
                }),
            }
        }
        windows
    }

    /// How much of what `limit` sustains `key` used during `during`: admitted cost over
    /// [`sustained_allowance`]. `None` for an empty interval.
    ///
    /// For recovery properties ("after the partition heals, the key gets ≥ 90 % of its
    /// limit"). A token bucket entering the interval full may exceed 1, by up to its
    /// capacity; a window limit over a span that is not a whole number of windows may
    /// read above or below 1 by up to one window's limit.
    pub fn utilisation(&self, limit: &Limit, key: u64, during: Interval) -> Option<Fraction> {
        utilisation_of(
            self.admitted_during(key, during),
            sustained_allowance(limit, during.length()),
        )
    }

    /// [`utilisation`](Self::utilisation) against a policy: against the smallest sustained
    /// allowance among its limits, the one that binds in the long run.
    pub fn policy_utilisation(
        &self,
        policy: &Policy,
        key: u64,
        during: Interval,
    ) -> Option<Fraction> {
        let allowance = policy
            .limits()
            .iter()
            .map(|limit| sustained_allowance(limit, during.length()))
            .min()?;
        utilisation_of(self.admitted_during(key, during), allowance)
    }

    /// The **occupancy measure** of `key` under `limit` over `during` (docs/leases.md,
    /// "Utilisation under real traffic"): how much of what the limit allows was used,
    /// seen from every instant rather than from aligned windows.
    ///
    /// - A window limit (fixed window, sliding counter, sliding log) of `L` per `W`: the mean,
    ///   over every span `(a − W, a]` with `a` in `[during.start + W, during.end)` (every span
    ///   of one window inside the interval), of `min(admitted in the span, L) / L`. A limiter
    ///   that keeps every span full reads 1; admissions drifting later inside their windows,
    ///   or a span left part-empty by capacity held and not spent, read below 1, which whole
    ///   aligned windows counted from the first admission cannot see. A span holding more
    ///   than `L` (a fixed window's two halves) counts as full, never more.
    /// - A token bucket: the cost admitted in `during` over what its rate refills in that
    ///   time (measure a run from its first second on: the bucket's initial burst is not
    ///   part of any steady state).
    ///
    /// `None` when the interval is too short to hold one span (empty, for a bucket).
    pub fn occupancy(&self, limit: &Limit, key: u64, during: Interval) -> Option<Fraction> {
        let (l, w) = match limit {
            Limit::TokenBucket(_) => return self.utilisation(limit, key, during),
            Limit::FixedWindow(x) => (x.limit(), x.window().as_micros()),
            Limit::SlidingCounter(x) => (x.limit(), x.window().as_micros()),
            Limit::SlidingLog(x) => (x.limit(), x.window().as_micros()),
        };
        let from = during.start.as_micros().saturating_add(w);
        let until = during.end.as_micros();
        if until <= from || l == 0 {
            return None;
        }
        // The span ending at `a` holds an admission at `t` iff `t ≤ a < t + W`: a step up at
        // `t`, down at `t + W`. Sweep the steps, integrating `min(count, L)` over `a`.
        let mut steps: Vec<(u64, i128)> = Vec::new();
        let mut count: i128 = 0;
        for a in self.admissions.iter().filter(|a| a.key == key) {
            let (t, c) = (a.at.as_micros(), i128::from(a.cost));
            let leaves = t.saturating_add(w);
            if leaves <= from || t >= until {
                continue;
            }
            if t <= from {
                count += c;
            } else {
                steps.push((t, c));
            }
            if leaves < until {
                steps.push((leaves, -c));
            }
        }
        steps.sort_unstable();
        let limit = i128::from(l);
        let mut area: i128 = 0;
        let mut at = from;
        for (t, delta) in steps {
            area += count.min(limit) * i128::from(t - at);
            at = t;
            count += delta;
        }
        area += count.min(limit) * i128::from(until - at);
        Fraction::new(area, limit * i128::from(until - from))
    }

    /// Each key's admissions as `(instant µs, cost)`, sorted by instant, one per instant.
    fn by_key(&self) -> BTreeMap<u64, Vec<(u64, u64)>> {
        let mut by_key: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        for a in &self.admissions {
            by_key
                .entry(a.key)
                .or_default()
                .push((a.at.as_micros(), a.cost));
        }
        by_key
            .into_iter()
            .map(|(key, events)| (key, merge_instants(events)))
            .collect()
    }
}

impl FromIterator<Admission> for AdmissionLog {
    fn from_iter<I: IntoIterator<Item = Admission>>(iter: I) -> Self {
        Self {
            admissions: iter.into_iter().collect(),
        }
    }
}

impl Extend<Admission> for AdmissionLog {
    fn extend<I: IntoIterator<Item = Admission>>(&mut self, iter: I) {
        self.admissions.extend(iter);
    }
}

/// What `limit` lets through per `length` of time in the long run: `refill × length /
/// period` for a token bucket, `limit × length / window` for the window algorithms.
/// Bursts (a full bucket, a boundary) are not included.
pub fn sustained_allowance(limit: &Limit, length: Micros) -> Fraction {
    let length = i128::from(length.as_micros());
    match limit {
        Limit::TokenBucket(bucket) => {
            // One token per `per_token / per_micro` µs.
            let (per_token, per_micro) = bucket.emission_interval();
            Fraction::of(length * i128::from(per_micro), i128::from(per_token))
        }
        Limit::FixedWindow(l) => window_rate(l.limit(), l.window(), length),
        Limit::SlidingLog(l) => window_rate(l.limit(), l.window(), length),
        Limit::SlidingCounter(l) => window_rate(l.limit(), l.window(), length),
    }
}

impl Fraction {
    /// Zero.
    pub const ZERO: Self = Self {
        numerator: 0,
        denominator: 1,
    };

    /// `numerator / denominator`, reduced; `None` when the denominator is zero.
    pub fn new(numerator: i128, denominator: i128) -> Option<Self> {
        (denominator != 0).then(|| Self::of(numerator, denominator))
    }

    /// A whole number.
    pub const fn whole(n: i128) -> Self {
        Self {
            numerator: n,
            denominator: 1,
        }
    }

    /// The numerator, in lowest terms (carries the sign).
    pub fn numerator(&self) -> i128 {
        self.numerator
    }

    /// The denominator, in lowest terms (always positive).
    pub fn denominator(&self) -> i128 {
        self.denominator
    }

    /// `true` above zero.
    pub fn is_positive(&self) -> bool {
        self.numerator > 0
    }

    /// The largest whole number not above this.
    pub fn floor(&self) -> i128 {
        self.numerator.div_euclid(self.denominator)
    }

    /// The smallest whole number not below this.
    pub fn ceil(&self) -> i128 {
        -(-self.numerator).div_euclid(self.denominator)
    }

    /// The nearest `f64`, for display and charts only: verdicts compare fractions.
    pub fn to_f64(&self) -> f64 {
        self.numerator as f64 / self.denominator as f64
    }

    /// Zero if negative, else itself.
    pub fn at_least_zero(self) -> Self {
        if self.numerator < 0 { Self::ZERO } else { self }
    }

    /// Reduces `numerator / denominator`; the caller guarantees `denominator != 0`.
    fn of(numerator: i128, denominator: i128) -> Self {
        let sign = if denominator < 0 { -1 } else { 1 };
        let g = gcd(numerator.unsigned_abs(), denominator.unsigned_abs()).max(1);
        // `g` divides both, so it fits back into i128.
        let g = g as i128;
        Self {
            numerator: sign * numerator / g,
            denominator: sign * denominator / g,
        }
    }
}

impl Default for Fraction {
    fn default() -> Self {
        Self::ZERO
    }
}

impl Ord for Fraction {
    fn cmp(&self, other: &Self) -> Ordering {
        // Compare whole parts, then the remainders' reciprocals: the continued-fraction
        // expansion. Cross-multiplying could overflow i128 with bounds near 2^105.
        let (mut a, mut b) = (self.numerator, self.denominator);
        let (mut c, mut d) = (other.numerator, other.denominator);
        loop {
            let (qa, ra) = (a.div_euclid(b), a.rem_euclid(b));
            let (qc, rc) = (c.div_euclid(d), c.rem_euclid(d));
            match (qa.cmp(&qc), ra, rc) {
                (Ordering::Equal, 0, 0) => return Ordering::Equal,
                (Ordering::Equal, 0, _) => return Ordering::Less,
                (Ordering::Equal, _, 0) => return Ordering::Greater,
                // ra/b vs rc/d, both in (0, 1), orders as their reciprocals swapped:
                // ra/b < rc/d ⇔ d/rc < b/ra.
                (Ordering::Equal, _, _) => (a, b, c, d) = (d, rc, b, ra),
                (order, _, _) => return order,
            }
        }
    }
}

impl PartialOrd for Fraction {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Fraction {
    /// `7`, `-7` or `10/3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.denominator == 1 {
            write!(f, "{}", self.numerator)
        } else {
            write!(f, "{}/{}", self.numerator, self.denominator)
        }
    }
}

impl Interval {
    /// `[start, end)`.
    pub fn new(start: Timestamp, end: Timestamp) -> Self {
        Self { start, end }
    }

    /// How long it lasts; zero when empty.
    pub fn length(&self) -> Micros {
        self.end.saturating_since(self.start)
    }

    /// `true` when `at` is inside.
    pub fn contains(&self, at: Timestamp) -> bool {
        self.start <= at && at < self.end
    }
}

impl Window {
    /// `admitted − bound` in cost units: positive is over-admission, negative is headroom.
    pub fn excess(&self) -> Fraction {
        Fraction::of(
            i128::from(self.admitted) * self.bound.denominator - self.bound.numerator,
            self.bound.denominator,
        )
    }

    /// `excess / bound`: over-admission as a share of the bound (negative: headroom).
    pub fn excess_ratio(&self) -> Fraction {
        // (admitted·d − n)/d ÷ n/d; bounds are at least one cost unit, so n > 0.
        Fraction::new(
            i128::from(self.admitted) * self.bound.denominator - self.bound.numerator,
            self.bound.numerator,
        )
        .unwrap_or(Fraction::ZERO)
    }

    /// Over-admission as a share of the bound, zero when within it. × 100 for percent.
    pub fn over_admission(&self) -> Fraction {
        self.excess_ratio().at_least_zero()
    }

    /// `true` when `admitted ≤ bound`.
    pub fn is_within_bound(&self) -> bool {
        !self.excess().is_positive()
    }
}

impl Verdict {
    /// `true` when no window exceeds the guarantee (always, for a key with no admissions).
    pub fn is_within_bound(&self) -> bool {
        self.worst.is_none_or(|w| w.is_within_bound())
            && self.aligned.is_none_or(|w| w.is_within_bound())
    }

    /// The worst window's excess in cost units (negative: headroom); zero with no window.
    /// A sliding counter's aligned window, when it is over, counts instead.
    pub fn excess(&self) -> Fraction {
        match self.aligned {
            Some(a) if !a.is_within_bound() => a.excess(),
            _ => self.worst.map_or(Fraction::ZERO, |w| w.excess()),
        }
    }

    /// The worst window's over-admission as a share of its bound; zero when within (a
    /// sliding counter's aligned window counted too).
    pub fn over_admission(&self) -> Fraction {
        let worst = self.worst.map_or(Fraction::ZERO, |w| w.over_admission());
        let aligned = self.aligned.map_or(Fraction::ZERO, |w| w.over_admission());
        if aligned > worst { aligned } else { worst }
    }
}

impl PolicyVerdict {
    /// `true` when every limit's guarantee holds on every key.
    pub fn is_within_bound(&self) -> bool {
        self.verdicts.iter().all(Verdict::is_within_bound)
    }

    /// The verdict whose worst window has the largest excess relative to its bound (ties:
    /// the first, in limit then key order). Relative, because limits of one policy differ
    /// in scale. When all hold, it is the one closest to its bound.
    pub fn worst(&self) -> Option<&Verdict> {
        self.verdicts
            .iter()
            .filter_map(|v| v.worst.map(|w| (v, w.excess_ratio())))
            .fold(
                None,
                |best: Option<(&Verdict, Fraction)>, (v, ratio)| match best {
                    Some((_, best_ratio)) if best_ratio >= ratio => best,
                    _ => Some((v, ratio)),
                },
            )
            .map(|(v, _)| v)
    }

    /// The worst over-admission as a share of its bound; zero when every bound holds.
    pub fn over_admission(&self) -> Fraction {
        self.worst().map_or(Fraction::ZERO, Verdict::over_admission)
    }
}

/// Checks one key's admissions, sorted by instant and merged per instant.
fn check_events(limit: &Limit, key: u64, events: &[(u64, u64)], extra_allowance: u64) -> Verdict {
    let extra = i128::from(extra_allowance);
    let (worst, against_exact_log, aligned) = match limit {
        Limit::TokenBucket(bucket) => {
            let (per_token, per_micro) = bucket.emission_interval();
            let capacity = i128::from(bucket.capacity());
            (
                worst_bucket_span(events, capacity + extra, per_token, per_micro),
                None,
                None,
            )
        }
        Limit::FixedWindow(l) => {
            let bound = Fraction::whole(i128::from(l.limit()) + extra);
            (
                busiest_aligned_window(events, l.window().as_micros(), bound),
                None,
                None,
            )
        }
        Limit::SlidingLog(l) => {
            let bound = Fraction::whole(i128::from(l.limit()) + extra);
            (
                busiest_sliding_window(events, l.window().as_micros(), bound),
                None,
                None,
            )
        }
        Limit::SlidingCounter(l) => {
            // docs/algorithms.md: any window holds < 2 × limit, i.e. at most 2 × limit − 1.
            let limit = i128::from(l.limit());
            let guarantee = Fraction::whole(2 * limit - 1 + extra);
            let busiest = busiest_sliding_window(events, l.window().as_micros(), guarantee);
            let exact = busiest.map(|w| Window {
                bound: Fraction::whole(limit + extra),
                ..w
            });
            let aligned = busiest_aligned_window(
                events,
                l.window().as_micros(),
                Fraction::whole(limit + extra),
            );
            (busiest, exact, aligned)
        }
    };
    Verdict {
        limit: *limit,
        key,
        admitted: events
            .iter()
            .fold(0, |sum: u64, &(_, cost)| sum.saturating_add(cost)),
        extra_allowance,
        worst,
        against_exact_log,
        aligned,
    }
}

/// Token bucket: the closed span `[a, b]` maximising `S[a..=b] − capacity − (b − a) / T`
/// with `T = per_token / per_micro` µs per token.
///
/// Multiplied through by `per_token`, the score of a span ending at event `j` is
/// `Σ cost·per_token − (t_j − t_i)·per_micro`, and the best span ending at `j` either
/// starts at `j` or extends the best span ending at `j − 1`, paying for the gap: Kadane's
/// recurrence. An interval's bound only grows as it widens, so the worst interval starts
/// and ends at admissions, and the scan over them is exhaustive.
fn worst_bucket_span(
    events: &[(u64, u64)],
    capacity: i128,
    per_token: u64,
    per_micro: u64,
) -> Option<Window> {
    let (per_token, per_micro) = (i128::from(per_token), i128::from(per_micro));
    // (score, first instant, admitted) of the best span ending at the previous event.
    let mut current: Option<(i128, u64, u64)> = None;
    let mut previous_at = 0;
    let mut best: Option<(i128, Span, u64)> = None;
    for &(at, cost) in events {
        let gained = i128::from(cost) * per_token;
        current = Some(match current {
            // Extending must carry a positive score past the gap; otherwise start afresh.
            Some((score, first, admitted))
                if score - i128::from(at - previous_at) * per_micro > 0 =>
            {
                (
                    score - i128::from(at - previous_at) * per_micro + gained,
                    first,
                    admitted.saturating_add(cost),
                )
            }
            _ => (gained, at, cost),
        });
        previous_at = at;
        if let Some((score, first, admitted)) = current
            && best.is_none_or(|(best_score, _, _)| score > best_score)
        {
            let span = Span {
                first: Timestamp::from_micros(first),
                last: Timestamp::from_micros(at),
            };
            best = Some((score, span, admitted));
        }
    }
    best.map(|(_, span, admitted)| {
        let width = i128::from(span.last.as_micros() - span.first.as_micros());
        Window {
            span,
            admitted,
            bound: Fraction::of(capacity * per_token + width * per_micro, per_token),
        }
    })
}

/// Fixed window: the aligned window `[k·window, (k + 1)·window)` holding the most cost.
fn busiest_aligned_window(events: &[(u64, u64)], window: u64, bound: Fraction) -> Option<Window> {
    let mut best: Option<Window> = None;
    let mut current: Option<Window> = None;
    for &(at, cost) in events {
        let instant = Timestamp::from_micros(at);
        current = Some(match current {
            Some(w) if w.span.first.as_micros() / window == at / window => Window {
                span: Span {
                    last: instant,
                    ..w.span
                },
                admitted: w.admitted.saturating_add(cost),
                bound,
            },
            _ => Window {
                span: Span {
                    first: instant,
                    last: instant,
                },
                admitted: cost,
                bound,
            },
        });
        best = busier(best, current);
    }
    best
}

/// Sliding window: the `(t − window, t]` holding the most cost. The busiest such window
/// can always be slid right until `t` is an admission, so only those `t` are scanned; the
/// left pointer drops admissions at or before `t − window`.
fn busiest_sliding_window(events: &[(u64, u64)], window: u64, bound: Fraction) -> Option<Window> {
    let mut best: Option<Window> = None;
    let mut oldest = 0;
    let mut admitted: u64 = 0;
    for &(at, cost) in events {
        admitted = admitted.saturating_add(cost);
        // Never passes the newest event: it is at `at`, inside any window ending there.
        while events[oldest].0.saturating_add(window) <= at {
            admitted = admitted.saturating_sub(events[oldest].1);
            oldest += 1;
        }
        let current = Window {
            span: Span {
                first: Timestamp::from_micros(events[oldest].0),
                last: Timestamp::from_micros(at),
            },
            admitted,
            bound,
        };
        best = busier(best, Some(current));
    }
    best
}

/// The window with more admitted cost (the earlier on a tie); both share one bound.
fn busier(best: Option<Window>, candidate: Option<Window>) -> Option<Window> {
    match (best, candidate) {
        (Some(b), Some(c)) if c.admitted <= b.admitted => Some(b),
        (b, None) => b,
        (_, c) => c,
    }
}

/// Sorts `(instant, cost)` pairs and merges those at one instant: a window either holds
/// an instant or not, so they are one event to every scan.
fn merge_instants(mut events: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    events.sort_unstable_by_key(|&(at, _)| at);
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(events.len());
    for (at, cost) in events {
        match merged.last_mut() {
            Some(last) if last.0 == at => last.1 = last.1.saturating_add(cost),
            _ => merged.push((at, cost)),
        }
    }
    merged
}

/// `limit × length / window`.
fn window_rate(limit: u64, window: Micros, length: i128) -> Fraction {
    // Limits are built with a non-zero window, so the denominator is never zero.
    Fraction::of(
        i128::from(limit) * length,
        i128::from(window.as_micros()).max(1),
    )
}

/// `admitted / allowance`, or `None` when the allowance is zero (an empty interval).
fn utilisation_of(admitted: u64, allowance: Fraction) -> Option<Fraction> {
    Fraction::new(
        i128::from(admitted) * allowance.denominator,
        allowance.numerator,
    )
}

/// The greatest common divisor of `a` and `b` (`a` when `b` is zero).
pub(crate) fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use rein_core::{Limit, Micros, Policy, Timestamp};

    use super::*;

    fn at(us: u64) -> Timestamp {
        Timestamp::from_micros(us)
    }

    fn secs(s: u64) -> Micros {
        Micros::from_secs(s)
    }

    #[test]
    fn occupancy_is_the_mean_over_every_span_of_one_window_capped_at_the_limit() {
        let log2 = Limit::sliding_log(2, secs(1)).unwrap();
        let during = Interval::new(at(0), at(3_000_000));
        // Spans end in [1 s, 3 s): the two at 0 have left by then; two at 1.5 s fill the
        // spans ending in [1.5 s, 2.5 s), half of them.
        let events = log_of(&[(0, 2), (1_500_000, 2)]);
        assert_eq!(events.occupancy(&log2, 1, during), Fraction::new(1, 2));
        // A span holding more than the limit counts as full, not more.
        let burst = log_of(&[(1_000_000, 5)]);
        assert_eq!(burst.occupancy(&log2, 1, during), Fraction::new(1, 2));
        // Admissions drifting later in their windows: one at the start of each whole
        // second reads full, each at its end leaves the spans before it part-empty.
        let early = log_of(&[(1_000_000, 2), (2_000_000, 2)]);
        assert_eq!(early.occupancy(&log2, 1, during), Some(Fraction::whole(1)));
        let late = log_of(&[(1_900_000, 2), (2_900_000, 2)]);
        assert_eq!(late.occupancy(&log2, 1, during), Fraction::new(11, 20));
        // A token bucket: 300 admitted in [1 s, 3 s) of a 150/s rate.
        let bucket = Limit::token_bucket(30, 150, secs(1)).unwrap();
        let steady = log_of(&[(0, 30), (1_000_000, 150), (2_999_999, 150)]);
        let from_one = Interval::new(at(1_000_000), at(3_000_000));
        assert_eq!(
            steady.occupancy(&bucket, 1, from_one),
            Some(Fraction::whole(1))
        );
        assert_eq!(
            events.occupancy(&log2, 1, Interval::new(at(0), at(1))),
            None
        );
    }

    fn log_of(events: &[(u64, u64)]) -> AdmissionLog {
        events
            .iter()
            .enumerate()
            .map(|(i, &(us, cost))| Admission {
                at: at(us),
                node: i % 3,
                key: 1,
                cost,
            })
            .collect()
    }

    fn only(log: &AdmissionLog, limit: Limit, extra: u64) -> Verdict {
        let verdicts = log.check(&limit, extra);
        assert_eq!(verdicts.len(), 1, "one key");
        verdicts[0]
    }

    #[test]
    fn an_empty_log_is_within_every_bound() {
        let log = AdmissionLog::new();
        let limit = Limit::token_bucket(10, 1, secs(1)).unwrap();
        assert!(log.check(&limit, 0).is_empty());
        let verdict = log.check_key(&limit, 9, 0);
        assert_eq!((verdict.admitted, verdict.worst), (0, None));
        assert!(verdict.is_within_bound());
        assert_eq!(verdict.over_admission(), Fraction::ZERO);
        let policy = Policy::single(limit);
        let verdict = log.check_policy(&policy, 0);
        assert!(verdict.is_within_bound() && verdict.worst().is_none());
        let during = Interval::new(at(0), at(0));
        assert_eq!(log.utilisation(&limit, 9, during), None);
    }

    #[test]
    fn a_full_bucket_spent_at_one_instant_is_exactly_the_bound() {
        let limit = Limit::token_bucket(5, 1, secs(1)).unwrap();
        let verdict = only(&log_of(&[(1_000_000, 3), (1_000_000, 2)]), limit, 0);
        let worst = verdict.worst.unwrap();
        assert_eq!(worst.admitted, 5);
        assert_eq!(worst.bound, Fraction::whole(5));
        assert_eq!(worst.excess(), Fraction::ZERO);
        assert!(verdict.is_within_bound());
    }

    #[test]
    fn a_bucket_over_by_a_fraction_of_a_token_is_caught() {
        // 3 per second: the 4th token arrives after 333 333⅓ µs, so a 4th admission at
        // 333 333 µs is 1/3 µs early: over by 1/3 µs worth of refill, 1e-6 of a token.
        let limit = Limit::token_bucket(3, 3, secs(1)).unwrap();
        let early = only(&log_of(&[(0, 3), (333_333, 1)]), limit, 0);
        let worst = early.worst.unwrap();
        assert_eq!(worst.span.first, at(0));
        assert_eq!(worst.span.last, at(333_333));
        assert_eq!(worst.excess(), Fraction::new(1, 1_000_000).unwrap());
        assert!(!early.is_within_bound());
        // At 333 334 µs it is on time, with 2/3 µs of refill to spare.
        let on_time = only(&log_of(&[(0, 3), (333_334, 1)]), limit, 0);
        assert!(on_time.is_within_bound());
        assert_eq!(on_time.excess(), Fraction::ZERO);
        // The allowance widens every interval's bound.
        let allowed = only(&log_of(&[(0, 3), (333_333, 1)]), limit, 1);
        assert!(allowed.is_within_bound());
    }

    #[test]
    fn a_bucket_reports_the_span_with_the_largest_excess() {
        // Capacity 2, 1 per second. Two nodes each spend a full bucket at 10 s, then both
        // keep admitting 1 per second: excess 2 at 10 s, and 2 + 1 per second afterwards.
        let mut events = vec![(10_000_000, 2), (10_000_000, 2)];
        for s in 11..=13 {
            events.push((s * 1_000_000, 1));
            events.push((s * 1_000_000, 1));
        }
        let limit = Limit::token_bucket(2, 1, secs(1)).unwrap();
        let worst = only(&log_of(&events), limit, 0).worst.unwrap();
        assert_eq!(
            worst.span,
            Span {
                first: at(10_000_000),
                last: at(13_000_000)
            }
        );
        assert_eq!(worst.admitted, 10);
        assert_eq!(worst.bound, Fraction::whole(5));
        assert_eq!(worst.excess(), Fraction::whole(5));
        assert_eq!(worst.over_admission(), Fraction::whole(1));
    }

    #[test]
    fn a_fixed_window_allows_the_documented_boundary_burst_and_a_log_does_not() {
        // docs/algorithms.md: 5 per 10 s, 1 at 3 s, 4 at 9 s, 5 at 10 s.
        let log = log_of(&[(3_000_000, 1), (9_000_000, 4), (10_000_000, 5)]);
        let fixed = only(&log, Limit::fixed_window(5, secs(10)).unwrap(), 0);
        assert!(fixed.is_within_bound());
        assert_eq!(fixed.worst.unwrap().excess(), Fraction::ZERO);
        let sliding = only(&log, Limit::sliding_log(5, secs(10)).unwrap(), 0);
        let worst = sliding.worst.unwrap();
        assert_eq!((worst.admitted, worst.excess()), (10, Fraction::whole(5)));
        assert_eq!(worst.span.first, at(3_000_000));
        // A sixth in the first window is over.
        let log = log_of(&[(3_000_000, 2), (9_000_000, 4), (10_000_000, 5)]);
        let fixed = only(&log, Limit::fixed_window(5, secs(10)).unwrap(), 0);
        assert_eq!(fixed.excess(), Fraction::whole(1));
        assert_eq!(fixed.over_admission(), Fraction::new(1, 5).unwrap());
    }

    #[test]
    fn a_sliding_window_is_half_open() {
        let limit = Limit::sliding_log(1, Micros::from_micros(10)).unwrap();
        // 10 µs apart: (0, 10] no longer holds 0.
        assert!(only(&log_of(&[(0, 1), (10, 1)]), limit, 0).is_within_bound());
        assert!(!only(&log_of(&[(0, 1), (9, 1)]), limit, 0).is_within_bound());
    }

    #[test]
    fn a_sliding_counter_is_held_to_its_documented_worst_case_and_measured_against_a_log() {
        // docs/algorithms.md, 10 per 10 s: 18 admitted within 9.5 s.
        let log = log_of(&[
            (49_000_000, 10),
            (51_000_000, 1),
            (55_000_000, 4),
            (58_500_000, 3),
        ]);
        let verdict = only(&log, Limit::sliding_counter(10, secs(10)).unwrap(), 0);
        let worst = verdict.worst.unwrap();
        assert_eq!((worst.admitted, worst.bound), (18, Fraction::whole(19)));
        assert!(verdict.is_within_bound());
        let exact = verdict.against_exact_log.unwrap();
        assert_eq!((exact.admitted, exact.excess()), (18, Fraction::whole(8)));
        // 2 × limit in one window breaks the guarantee.
        let log = log_of(&[(9_999_999, 10), (10_000_000, 10)]);
        let verdict = only(&log, Limit::sliding_counter(10, secs(10)).unwrap(), 0);
        assert_eq!(verdict.excess(), Fraction::whole(1));
        // So does more than the limit in one aligned window, within 2 × limit − 1 in any
        // sliding one (before, it passed).
        let log = log_of(&[(51_000_000, 8), (58_000_000, 7)]);
        let verdict = only(&log, Limit::sliding_counter(10, secs(10)).unwrap(), 0);
        assert!(verdict.worst.unwrap().is_within_bound());
        assert!(!verdict.is_within_bound());
        assert_eq!(verdict.excess(), Fraction::whole(5));
    }

    #[test]
    fn keys_are_checked_apart_and_recording_order_does_not_matter() {
        let limit = Limit::fixed_window(2, secs(1)).unwrap();
        let log: AdmissionLog = [(5, 300), (5, 100), (8, 200), (5, 200)]
            .into_iter()
            .map(|(key, ms)| Admission {
                at: at(ms * 1_000),
                node: 0,
                key,
                cost: 1,
            })
            .collect();
        let verdicts = log.check(&limit, 0);
        assert_eq!(verdicts.iter().map(|v| v.key).collect::<Vec<_>>(), [5, 8]);
        assert_eq!(verdicts[0].excess(), Fraction::whole(1));
        assert_eq!(
            verdicts[0].worst.unwrap().span,
            Span {
                first: at(100_000),
                last: at(300_000)
            }
        );
        assert!(verdicts[1].is_within_bound());
        assert_eq!(log.keys(), [5, 8]);
        assert_eq!(log.admitted(), 4);
    }

    #[test]
    fn a_policy_is_checked_limit_by_limit_and_reports_the_relatively_worst() {
        let policy = Policy::new([
            Limit::token_bucket(100, 100, secs(1)).unwrap(),
            Limit::fixed_window(4, secs(60)).unwrap(),
        ])
        .unwrap();
        let log = log_of(&[(0, 2), (1, 2), (2, 2)]);
        let verdict = log.check_policy(&policy, 0);
        assert_eq!(verdict.verdicts.len(), 2);
        assert!(!verdict.is_within_bound());
        let worst = verdict.worst().unwrap();
        assert!(matches!(worst.limit, Limit::FixedWindow(_)));
        assert_eq!(verdict.over_admission(), Fraction::new(1, 2).unwrap());
    }

    #[test]
    fn utilisation_is_admitted_over_the_sustained_allowance() {
        // A bucket of 10 at 10 per second, offered 1 request per ms from full: 10 at once,
        // then one per 100 ms refill, so 19 in the first second and exactly the rate after.
        let limit = Limit::token_bucket(10, 10, secs(1)).unwrap();
        let policy = Policy::single(limit);
        let mut state = policy.new_state();
        let mut log = AdmissionLog::new();
        for ms in 0..10_000 {
            if policy
                .acquire(at(ms * 1_000), &mut state, 1)
                .unwrap()
                .is_allowed()
            {
                log.record(Admission {
                    at: at(ms * 1_000),
                    node: 0,
                    key: 1,
                    cost: 1,
                });
            }
        }
        let steady = Interval::new(at(1_000_000), at(10_000_000));
        assert_eq!(log.utilisation(&limit, 1, steady), Some(Fraction::whole(1)));
        assert_eq!(
            log.policy_utilisation(&policy, 1, steady),
            Some(Fraction::whole(1))
        );
        let first = Interval::new(at(0), at(1_000_000));
        assert_eq!(
            log.utilisation(&limit, 1, first),
            Some(Fraction::new(19, 10).unwrap())
        );
        // A sliding log of 5 per 2 s sustains 2.5 per second.
        let window = Limit::sliding_log(5, secs(2)).unwrap();
        assert_eq!(
            sustained_allowance(&window, secs(1)),
            Fraction::new(5, 2).unwrap()
        );
    }

    #[test]
    fn fractions_reduce_round_and_print() {
        let third = Fraction::new(2, -6).unwrap();
        assert_eq!((third.numerator(), third.denominator()), (-1, 3));
        assert_eq!((third.floor(), third.ceil()), (-1, 0));
        assert_eq!(third.to_string(), "-1/3");
        assert_eq!(Fraction::new(7, 0), None);
        assert_eq!(Fraction::whole(7).to_string(), "7");
        assert_eq!(Fraction::new(7, 2).unwrap().ceil(), 4);
        assert!(Fraction::new(1, 3).unwrap() < Fraction::new(1, 2).unwrap());
        let big = Fraction::new(i128::MAX / 2, (1 << 60) + 1).unwrap();
        let bigger = Fraction::new(i128::MAX / 2, 1 << 60).unwrap();
        assert!(big < bigger);
    }

    /// Exactly what a window of the given shape contains, by summing everything.
    fn sum_where(events: &[(u64, u64)], inside: impl Fn(u64) -> bool) -> u64 {
        events
            .iter()
            .filter(|&&(t, _)| inside(t))
            .map(|&(_, c)| c)
            .sum()
    }

    #[derive(Clone, Copy, Debug)]
    enum Shape {
        Bucket {
            capacity: u64,
            refill: u64,
            period: u64,
        },
        Fixed {
            limit: u64,
            window: u64,
        },
        Log {
            limit: u64,
            window: u64,
        },
        Counter {
            limit: u64,
            window: u64,
        },
    }

    impl Shape {
        fn limit(self) -> Limit {
            match self {
                Shape::Bucket {
                    capacity,
                    refill,
                    period,
                } => Limit::token_bucket(capacity, refill, Micros::from_micros(period)),
                Shape::Fixed { limit, window } => {
                    Limit::fixed_window(limit, Micros::from_micros(window))
                }
                Shape::Log { limit, window } => {
                    Limit::sliding_log(limit, Micros::from_micros(window))
                }
                Shape::Counter { limit, window } => {
                    Limit::sliding_counter(limit, Micros::from_micros(window))
                }
            }
            .unwrap()
        }
    }

    fn any_shape() -> impl Strategy<Value = Shape> {
        prop_oneof![
            (1..12u64, 1..6u64, 1..60u64).prop_map(|(capacity, refill, period)| {
                Shape::Bucket {
                    capacity,
                    refill,
                    period,
                }
            }),
            (1..12u64, 1..60u64).prop_map(|(limit, window)| Shape::Fixed { limit, window }),
            (1..12u64, 1..60u64).prop_map(|(limit, window)| Shape::Log { limit, window }),
            (1..12u64, 1..60u64).prop_map(|(limit, window)| Shape::Counter { limit, window }),
        ]
    }

    /// The largest `admitted − bound` over all windows of the shape, by brute force, with
    /// the token bucket's bound taken from `refill / period` directly (not the reduced
    /// emission interval the oracle uses).
    fn brute_force_excess(shape: Shape, events: &[(u64, u64)], extra: u64) -> Option<Fraction> {
        let horizon = events.iter().map(|&(t, _)| t).max()?;
        let whole = |n: u64, bound: u64| Fraction::whole(i128::from(n) - i128::from(bound));
        match shape {
            Shape::Bucket {
                capacity,
                refill,
                period,
            } => {
                // Every closed [a, b] with a, b admission instants: O(n³).
                let mut best: Option<Fraction> = None;
                for &(a, _) in events {
                    for &(b, _) in events.iter().filter(|&&(b, _)| b >= a) {
                        let admitted = sum_where(events, |t| a <= t && t <= b);
                        let excess = Fraction::new(
                            i128::from(admitted * period)
                                - i128::from((capacity + extra) * period)
                                - i128::from((b - a) * refill),
                            i128::from(period),
                        )
                        .unwrap();
                        best = best.max(Some(excess));
                    }
                }
                best
            }
            Shape::Fixed { limit, window } => events
                .iter()
                .map(|&(t, _)| sum_where(events, |u| u / window == t / window))
                .max()
                .map(|n| whole(n, limit + extra)),
            // Every (t − window, t] for every µs t, not only at admissions.
            Shape::Log { limit, window } => (0..=horizon + window)
                .map(|t| sum_where(events, |u| u + window > t && u <= t))
                .max()
                .map(|n| whole(n, limit + extra)),
            Shape::Counter { limit, window } => (0..=horizon + window)
                .map(|t| sum_where(events, |u| u + window > t && u <= t))
                .max()
                .map(|n| whole(n, 2 * limit - 1 + extra)),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn fast_scans_agree_with_brute_force(
            shape in any_shape(),
            events in vec((0..300u64, 1..6u64), 0..24),
            extra in 0..3u64,
        ) {
            let log = log_of(&events);
            let verdict = log.check_key(&shape.limit(), 1, extra);
            let brute = brute_force_excess(shape, &events, extra);
            prop_assert_eq!(verdict.worst.map(|w| w.excess()), brute);
            prop_assert_eq!(verdict.admitted, events.iter().map(|&(_, c)| c).sum::<u64>());
            // The reported window really holds what it says, and is of the right shape.
            if let Some(w) = verdict.worst {
                let (first, last) = (w.span.first.as_micros(), w.span.last.as_micros());
                prop_assert!(first <= last);
                prop_assert_eq!(w.admitted, sum_where(&events, |t| first <= t && t <= last));
                match shape {
                    Shape::Bucket { capacity, refill, period } => {
                        let bound = Fraction::new(
                            i128::from((capacity + extra) * period + (last - first) * refill),
                            i128::from(period),
                        );
                        prop_assert_eq!(Some(w.bound), bound);
                    }
                    Shape::Fixed { window, .. } => prop_assert_eq!(first / window, last / window),
                    Shape::Log { window, .. } | Shape::Counter { window, .. } => {
                        prop_assert!(last - first < window);
                    }
                }
            }
            if let Shape::Counter { limit, .. } = shape {
                let exact = verdict.against_exact_log.map(|w| w.excess());
                let expected = verdict.worst.map(|w| {
                    Fraction::whole(i128::from(w.admitted) - i128::from(limit + extra))
                });
                prop_assert_eq!(exact, expected);
            }
        }

        /// The oracle agrees that rein-core is exact: whatever a policy admits, on any
        /// demand over several keys, is within every one of its limits' guarantees.
        #[test]
        fn what_rein_core_admits_has_no_excess(
            shapes in vec(any_shape(), 1..=3),
            demand in vec((0..40u64, 0..3u64, 0..12u64), 0..120),
        ) {
            let policy = Policy::new(shapes.iter().map(|s| s.limit())).unwrap();
            let mut states = [policy.new_state(), policy.new_state(), policy.new_state()];
            let mut now = 1_000;
            let mut log = AdmissionLog::new();
            for (i, &(advance, key, cost)) in demand.iter().enumerate() {
                now += advance;
                let cost = cost.min(policy.capacity());
                let decision = policy.acquire(at(now), &mut states[key as usize], cost).unwrap();
                if decision.is_allowed() && cost > 0 {
                    log.record(Admission { at: at(now), node: i % 4, key, cost });
                }
            }
            let verdict = log.check_policy(&policy, 0);
            prop_assert!(verdict.is_within_bound(), "{:?}", verdict.worst());
            prop_assert_eq!(verdict.over_admission(), Fraction::ZERO);
        }

        #[test]
        fn fractions_order_like_cross_multiplication(
            (a, b, c, d) in (-1000..1000i128, 1..1000i128, -1000..1000i128, 1..1000i128),
        ) {
            let (x, y) = (Fraction::new(a, b).unwrap(), Fraction::new(c, d).unwrap());
            prop_assert_eq!(x.cmp(&y), (a * d).cmp(&(c * b)));
        }
    }
}
