//! The global bound with nodes on local fallback: the one place it is written down.
//!
//! The oracle, the report, the properties and docs/guarantees.md all use
//! [`fallback_limit`]; nothing else states this bound. The derivation:
//!
//! - Redis decides on its own `TIME` (the true time the oracle judges by), and every
//!   admission the log attributes to Redis is one Redis counted, so Redis's admissions alone
//!   keep the limit exactly. A call whose reply was lost (a one-way fault, a stall) was
//!   counted by Redis and not admitted: it only lowers what Redis admits.
//! - A node on fallback decides alone with its share of the limit (`share(x) =
//!   max(1, ⌊x / N⌋)` of each capacity, `1/N` of each rate) on **its own clock**, which is
//!   true time plus a fixed offset `s_i`. It decides without awaiting anything, so each
//!   admission takes effect at the true instant its local clock read.
//! - Shifting a clock by a constant moves a bucket's or a sliding log's guarantee by
//!   nothing (both hold for every interval, and a constant shift maps intervals to intervals
//!   of the same length). A fixed window's guarantee holds per window **aligned to the
//!   node's clock** (and a sliding counter's count too, below), and a window aligned to true time meets two of those unless `s_i` is a
//!   whole number of windows: one node then admits up to `2 × share(L)` in it. That is what
//!   the old `L + k × ⌊L/N⌋` missed (`tests/bounds.rs`: one node of 6, 300 ms ahead and cut
//!   off 250 ms before its window turns over, brings a window to exactly 132 against the
//!   old 116).
//!
//! So, with `k` nodes on fallback whose clocks are offset by `s_1 … s_k` from Redis's:
//!
//! | limit | the cluster admits at most, per key |
//! |---|---|
//! | token bucket `C`, `r` per `p` | a bucket of `C + k·share(C)`, refilled at `r·(N + k)/N` |
//! | sliding log `L` per `W` | `L + k·share(L)` in any `(t − W, t]` |
//! | sliding counter `L` per `W` | a counter of `L + share(L)·Σ m_i`: see below |
//! | fixed window `L` per `W` | `L + share(L)·Σ m_i` per aligned window (below) |
//!
//! For a fixed window, `m_i = 1` if `s_i mod W = 0`, else `2`: at most `L + 2k·share(L)`
//! whatever the skew. A sliding counter counts per window aligned to its clock too: a cut
//! node's counter fills the tail of one of its windows and, in the next, what the weighted
//! previous count leaves, both inside one of Redis's (`tests/bounds.rs`: 120 against the
//! old `L + share(L)` of 116), so it takes the fixed window's `m_i`. Any window then holds at
//! most `2L − 1` from Redis and `2 share(L) − 1` from each fallback, within the widened
//! counter's own `2 (L + share(L)·Σ m_i) − 1`.
//!
//! A policy of several limits: each limit on its own (a policy admits only what all its
//! limits admit, in Redis and in each fallback).

use std::num::NonZeroU32;

use rein_core::{Algorithm, ConfigError, Limit, Micros, Policy};

/// One limit widened by `cut_offsets.len()` nodes on local fallback at `1/N` of it, each with
/// its clock `cut_offsets[i]` µs ahead of Redis's (negative: behind): the limit the oracle
/// holds the cluster to (see the module doc for the derivation).
///
/// ```
/// use std::num::NonZeroU32;
/// use rein_core::{Limit, Micros};
/// use sim::world::fallback_limit;
///
/// let n = NonZeroU32::new(6).unwrap();
/// let limit = Limit::fixed_window(100, Micros::from_secs(1))?;
/// // Three of six nodes cut off, clocks in step with Redis: one share (16) each.
/// let synced = fallback_limit(&limit, n, &[0, 0, 0])?;
/// assert_eq!(synced, Limit::fixed_window(148, Micros::from_secs(1))?);
/// // Skewed clocks: each fallback window straddles two of Redis's.
/// let skewed = fallback_limit(&limit, n, &[80_000, -80_000, 3_000])?;
/// assert_eq!(skewed, Limit::fixed_window(196, Micros::from_secs(1))?);
/// # Ok::<(), rein_core::ConfigError>(())
/// ```
pub fn fallback_limit(
    limit: &Limit,
    expected_nodes: NonZeroU32,
    cut_offsets: &[i64],
) -> Result<Limit, ConfigError> {
    let n = u64::from(expected_nodes.get());
    let k = cut_offsets.len() as u64;
    let share = |whole: u64| (whole / n).max(1);
    match limit {
        Limit::TokenBucket(b) => {
            // `per_token` µs for `per_micro` tokens; one node refills `per_micro` tokens per
            // `per_token × N` µs, so `N + k` of those together per the same period.
            let (per_token, per_micro) = b.emission_interval();
            Limit::token_bucket(
                b.capacity() + k * share(b.capacity()),
                per_micro * (n + k),
                Micros::from_micros(per_token * n),
            )
        }
        Limit::SlidingLog(w) => Limit::sliding_log(w.limit() + k * share(w.limit()), w.window()),
        Limit::SlidingCounter(w) => Limit::sliding_counter(
            w.limit() + windows_met(w.window(), cut_offsets) * share(w.limit()),
            w.window(),
        ),
        Limit::FixedWindow(w) => Limit::fixed_window(
            w.limit() + windows_met(w.window(), cut_offsets) * share(w.limit()),
            w.window(),
        ),
    }
}

/// `Σ m_i`: how many of a node's own windows of `window` one window aligned to Redis's
/// clock meets, summed over the cut nodes (1 for a clock a whole number of windows off,
/// else 2).
fn windows_met(window: Micros, cut_offsets: &[i64]) -> u64 {
    let window = i64::try_from(window.as_micros()).unwrap_or(i64::MAX);
    cut_offsets
        .iter()
        .map(|s| if s.rem_euclid(window) == 0 { 1 } else { 2 })
        .sum()
}

/// [`fallback_limit`] for every limit of `policy`.
pub fn fallback_policy(
    policy: &Policy,
    expected_nodes: NonZeroU32,
    cut_offsets: &[i64],
) -> Result<Policy, ConfigError> {
    policy.try_map(|l| fallback_limit(l, expected_nodes, cut_offsets))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(nodes: u32) -> NonZeroU32 {
        NonZeroU32::new(nodes).unwrap()
    }

    #[test]
    fn a_fixed_window_counts_two_shares_per_node_whose_clock_is_not_window_aligned() {
        let second = Micros::from_secs(1);
        let limit = Limit::fixed_window(100, second).unwrap();
        let bound = |offsets: &[i64]| fallback_limit(&limit, n(4), offsets).unwrap();
        assert_eq!(bound(&[]), limit);
        assert_eq!(bound(&[0, 0]), Limit::fixed_window(150, second).unwrap());
        // A whole number of windows off, either way, is in step.
        assert_eq!(
            bound(&[2_000_000, -1_000_000]),
            Limit::fixed_window(150, second).unwrap()
        );
        assert_eq!(bound(&[1, 0]), Limit::fixed_window(175, second).unwrap());
        assert_eq!(
            bound(&[-1, 999_999]),
            Limit::fixed_window(200, second).unwrap()
        );
    }

    /// The bound's `share(x) = max(1, ⌊x / N⌋)` is the share the fallback really gets
    /// (`Limit::share`, which `local_share` applies): if one changes, this fails.
    #[test]
    fn the_share_in_the_bound_is_the_fallback_share() {
        let second = Micros::from_secs(1);
        for whole in [1, 2, 3, 7, 20, 99, 100, 101, 1_000] {
            for nodes in [1, 2, 3, 4, 6, 8, 64, 256] {
                for limit in [
                    Limit::token_bucket(whole, 100, second).unwrap(),
                    Limit::fixed_window(whole, second).unwrap(),
                    Limit::sliding_log(whole, second).unwrap(),
                    Limit::sliding_counter(whole, second).unwrap(),
                ] {
                    let share = limit.share(n(nodes)).unwrap().capacity();
                    let widened = fallback_limit(&limit, n(nodes), &[0]).unwrap();
                    assert_eq!(widened.capacity(), whole + share, "{limit:?} ÷ {nodes}");
                }
            }
        }
    }

    #[test]
    fn skew_does_not_widen_a_bucket_or_a_sliding_log() {
        let second = Micros::from_secs(1);
        for limit in [
            Limit::token_bucket(20, 100, second).unwrap(),
            Limit::sliding_log(100, second).unwrap(),
        ] {
            assert_eq!(
                fallback_limit(&limit, n(4), &[0, 0]),
                fallback_limit(&limit, n(4), &[12_345, -7])
            );
        }
        // A sliding counter's windows follow its clock, as a fixed window's do.
        let counter = Limit::sliding_counter(100, second).unwrap();
        assert_eq!(
            fallback_limit(&counter, n(4), &[12_345, 0]).unwrap(),
            Limit::sliding_counter(175, second).unwrap()
        );
        // 20 + 2 × 5 tokens, refilled at 100 × 6/4 = 150 per second.
        let bucket = Limit::token_bucket(20, 100, second).unwrap();
        assert_eq!(
            fallback_limit(&bucket, n(4), &[0, 0]).unwrap(),
            Limit::token_bucket(30, 150, second).unwrap()
        );
        // A share is never below one.
        let small = Limit::sliding_log(3, second).unwrap();
        assert_eq!(
            fallback_limit(&small, n(8), &[0; 8]).unwrap(),
            Limit::sliding_log(11, second).unwrap()
        );
    }
}
