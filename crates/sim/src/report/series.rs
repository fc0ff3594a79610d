//! The data of a chart: admissions per time bucket and per node, and the lines the policy
//! draws on the same scale.
//!
//! A limit is not a single number per bucket, so each limit gets two lines, both exact:
//! - **sustained**: what it lets through per bucket in the long run (a token bucket's
//!   refill, a window's `limit × bucket / window`). Saturated traffic settles here, so a
//!   global line well above it for many buckets is over-admission.
//! - **ceiling**: the most its guarantee allows into one bucket, bursts included (a full
//!   bucket's capacity plus a bucket's refill; a window's whole limit). A single bucket
//!   above the ceiling is a violation on its face; between the two lines, only the oracle
//!   can tell, and the chart's title carries its verdict.

use rein_core::{Algorithm, Limit, Micros, Policy, Timestamp};

use super::describe::{describe_limit, format_duration};
use crate::oracle::{AdmissionLog, Fraction, Interval, gcd, sustained_allowance};

/// Cost admitted per bucket of time, per node, for one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmissionSeries {
    /// The start of bucket 0.
    pub start: Timestamp,
    /// Each bucket's width; bucket `i` is `[start + i × bucket, start + (i + 1) × bucket)`.
    pub bucket: Micros,
    /// `per_node[node][i]`: the cost `node` admitted in bucket `i`. Every node has the
    /// same number of buckets.
    pub per_node: Vec<Vec<u64>>,
}

/// Whether a [`LimitLine`] is a long-run rate or a one-bucket maximum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LineKind {
    /// What the limit lets through per bucket in the long run.
    Sustained,
    /// The most the limit's guarantee allows in any one bucket.
    Ceiling,
}

/// One horizontal line on a chart, in cost per bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitLine {
    /// The legend text.
    pub label: String,
    /// Sustained rate or one-bucket ceiling.
    pub kind: LineKind,
    /// The height, exactly.
    pub per_bucket: Fraction,
}

impl AdmissionSeries {
    /// Buckets `key`'s admissions over `run`. Admissions outside `run` are left out; a node
    /// id at or above `nodes` still gets its own row rather than being lost.
    pub fn from_log(
        log: &AdmissionLog,
        key: u64,
        run: Interval,
        bucket: Micros,
        nodes: usize,
    ) -> Self {
        // A zero-width bucket would divide by zero; one µs is the finest there is.
        let width = bucket.as_micros().max(1);
        let buckets = usize::try_from(run.length().as_micros().div_ceil(width)).unwrap_or(0);
        let mut per_node = vec![vec![0u64; buckets]; nodes];
        for a in log.admissions() {
            if a.key != key || !run.contains(a.at) {
                continue;
            }
            if a.node >= per_node.len() {
                per_node.resize(a.node + 1, vec![0; buckets]);
            }
            let index = a.at.saturating_since(run.start).as_micros() / width;
            // `run.contains` keeps the index below `buckets`.
            if let Some(slot) = usize::try_from(index)
                .ok()
                .and_then(|i| per_node[a.node].get_mut(i))
            {
                *slot = slot.saturating_add(a.cost);
            }
        }
        Self {
            start: run.start,
            bucket: Micros::from_micros(width),
            per_node,
        }
    }

    /// How many buckets there are.
    pub fn buckets(&self) -> usize {
        self.per_node.first().map_or(0, Vec::len)
    }

    /// All nodes together, per bucket.
    pub fn global(&self) -> Vec<u64> {
        let mut global = vec![0u64; self.buckets()];
        for node in &self.per_node {
            for (sum, &cost) in global.iter_mut().zip(node) {
                *sum = sum.saturating_add(cost);
            }
        }
        global
    }
}

impl LimitLine {
    /// The sustained and ceiling lines of every limit of `policy`, for buckets of width
    /// `bucket` starting at `start` (fixed windows need the alignment), with `extra` cost
    /// units of documented slack on every window's bound.
    pub fn for_policy(
        policy: &Policy,
        start: Timestamp,
        bucket: Micros,
        extra_allowance: u64,
    ) -> Vec<LimitLine> {
        policy
            .limits()
            .iter()
            .flat_map(|limit| Self::for_limit(limit, start, bucket, extra_allowance))
            .collect()
    }

    fn for_limit(
        limit: &Limit,
        start: Timestamp,
        bucket: Micros,
        extra_allowance: u64,
    ) -> [LimitLine; 2] {
        let width = bucket.as_micros().max(1);
        let per = format_duration(Micros::from_micros(width));
        let extra = i128::from(extra_allowance);
        let slack = if extra_allowance > 0 {
            format!(" + {extra_allowance} slack")
        } else {
            String::new()
        };
        let sustained = LimitLine {
            label: format!("{}: sustained per {per}", describe_limit(limit)),
            kind: LineKind::Sustained,
            per_bucket: sustained_allowance(limit, Micros::from_micros(width)),
        };
        // A bucket's admissions lie within a closed span of `width − 1` µs.
        let (ceiling, why) = match limit {
            Limit::TokenBucket(b) => {
                let (per_token, per_micro) = b.emission_interval();
                let (per_token, per_micro) = (i128::from(per_token), i128::from(per_micro));
                let bound = (i128::from(b.capacity()) + extra) * per_token
                    + i128::from(width - 1) * per_micro;
                (
                    Fraction::new(bound, per_token).unwrap_or(Fraction::ZERO),
                    format!("capacity + refill{slack}"),
                )
            }
            Limit::FixedWindow(l) => {
                let windows = aligned_windows_touched(start, width, l.window().as_micros());
                (
                    Fraction::whole((i128::from(l.limit()) + extra) * windows),
                    format!("limit × {windows} window(s){slack}"),
                )
            }
            Limit::SlidingLog(l) => {
                let windows = i128::from(width.div_ceil(l.window().as_micros().max(1)));
                (
                    Fraction::whole((i128::from(l.limit()) + extra) * windows),
                    format!("limit in any window{slack}"),
                )
            }
            Limit::SlidingCounter(l) => {
                let windows = i128::from(width.div_ceil(l.window().as_micros().max(1)));
                (
                    Fraction::whole((2 * i128::from(l.limit()) - 1 + extra) * windows),
                    format!("2 × limit − 1 in any window{slack}"),
                )
            }
        };
        let ceiling = LimitLine {
            label: format!("{}: ceiling per {per} ({why})", describe_limit(limit)),
            kind: LineKind::Ceiling,
            per_bucket: ceiling,
        };
        [sustained, ceiling]
    }
}

/// The most aligned windows of length `window` that one bucket `[s, s + width)` can
/// touch, over the buckets starting at `start + k × width`.
///
/// Bucket starts modulo `window` run through the residues `≡ start (mod g)`, with
/// `g = gcd(width, window)`; the latest of them, `window − g + start mod g`, reaches
/// furthest into the following windows.
fn aligned_windows_touched(start: Timestamp, width: u64, window: u64) -> i128 {
    let window = window.max(1);
    // At most `window`: it fits in a u64.
    let g = gcd(width.into(), window.into()) as u64;
    let latest = window - g + start.as_micros() % g;
    i128::from((latest + width - 1) / window + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::Admission;

    fn at(us: u64) -> Timestamp {
        Timestamp::from_micros(us)
    }

    #[test]
    fn admissions_fall_into_their_node_and_bucket() {
        let log: AdmissionLog = [
            (0, 0, 1),
            (1, 99_999, 2),
            (0, 100_000, 3),
            (3, 250_000, 4),
            (0, 300_000, 50),
        ]
        .into_iter()
        .map(|(node, us, cost)| Admission {
            at: at(us),
            node,
            key: 1,
            cost,
        })
        .chain([Admission {
            at: at(0),
            node: 0,
            key: 2,
            cost: 9,
        }])
        .collect();
        let run = Interval::new(at(0), at(300_000));
        let series = AdmissionSeries::from_log(&log, 1, run, Micros::from_millis(100), 2);
        assert_eq!(series.buckets(), 3);
        assert_eq!(series.per_node.len(), 4, "node 3 kept");
        assert_eq!(series.per_node[0], [1, 3, 0]);
        assert_eq!(series.per_node[1], [2, 0, 0]);
        assert_eq!(series.per_node[3], [0, 0, 4]);
        assert_eq!(series.global(), [3, 3, 4]);
        let empty =
            AdmissionSeries::from_log(&log, 1, Interval::new(at(5), at(5)), Micros::ZERO, 0);
        assert_eq!((empty.buckets(), empty.global()), (0, vec![]));
    }

    #[test]
    fn limit_lines_are_exact_per_bucket() {
        let ms = Micros::from_millis;
        let line = |limit: Limit, start: u64, extra: u64| {
            let policy = Policy::single(limit);
            let lines = LimitLine::for_policy(&policy, at(start), ms(100), extra);
            (lines[0].per_bucket, lines[1].per_bucket)
        };
        let whole = Fraction::whole;
        // 10 per second, capacity 20: 1 per 100 ms; ceiling 20 + 99 999 µs of refill.
        let bucket = Limit::token_bucket(20, 10, Micros::from_secs(1)).unwrap();
        assert_eq!(
            line(bucket, 0, 0),
            (
                whole(1),
                Fraction::new(20 * 100_000 + 99_999, 100_000).unwrap()
            )
        );
        // Aligned buckets sit in one fixed window; shifted ones straddle two.
        let fixed = Limit::fixed_window(50, Micros::from_secs(1)).unwrap();
        assert_eq!(line(fixed, 0, 0), (Fraction::whole(5), whole(50)));
        assert_eq!(line(fixed, 50_000, 0), (Fraction::whole(5), whole(100)));
        assert_eq!(line(fixed, 50_000, 1), (Fraction::whole(5), whole(102)));
        let short = Limit::sliding_counter(3, ms(30)).unwrap();
        assert_eq!(line(short, 0, 0), (Fraction::whole(10), whole(5 * 4)));
    }

    #[test]
    fn aligned_windows_touched_counts_straddles() {
        assert_eq!(aligned_windows_touched(at(0), 100, 1_000), 1);
        assert_eq!(aligned_windows_touched(at(50), 100, 1_000), 2);
        assert_eq!(aligned_windows_touched(at(0), 1_000, 1_000), 1);
        assert_eq!(aligned_windows_touched(at(0), 300, 1_000), 2);
        assert_eq!(aligned_windows_touched(at(0), 2_000, 1_000), 2);
        assert_eq!(aligned_windows_touched(at(1), 2_000, 1_000), 3);
    }
}
