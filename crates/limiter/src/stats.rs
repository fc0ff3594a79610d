//! The resilient limiter's counters and store latency histogram: relaxed atomics written on
//! the request path, read as a [`StatsSnapshot`], and mirrored to the `metrics` facade
//! (feature `metrics`).
//!
//! Decisions are counted once, by source and outcome, in one matrix; every total in a
//! snapshot is a sum over that matrix, so a snapshot's totals agree with each other even
//! while requests run (each cell is read once). The histogram's buckets are fixed powers of
//! two of microseconds, so recording is one `leading_zeros` and one atomic add.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use rein_core::Micros;

use crate::breaker::{BreakerEvent, BreakerState};
use crate::decided::{ERRORS, SOURCES, Source, Unavailable};

/// A point-in-time copy of a [`ResilientLimiter`](crate::ResilientLimiter)'s counters, from
/// [`stats`](crate::ResilientLimiter::stats). All counts are since the limiter was built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Decisions returned (`Ok`), from every source: `allowed + denied`, one per request.
    /// Peeks count too, as allowed when their cost would have been admitted; with leases
    /// on, a lease's reservation is a store call (`store_calls`), not a decision.
    pub decisions: u64,
    /// Decisions that admitted the request (or, for a peek, would have).
    pub allowed: u64,
    /// Decisions that refused it.
    pub denied: u64,
    /// Decisions by the store.
    pub store: SourceCounts,
    /// Denials repeated by the deny cache (its hits).
    pub deny_cache: SourceCounts,
    /// Admissions reused by the allow cache (its hits).
    pub allow_cache: SourceCounts,
    /// Decisions by the local fallback limiter.
    pub fallback: SourceCounts,
    /// Admissions by the fail-open policy.
    pub fail_open: SourceCounts,
    /// Denials by the fail-closed policy.
    pub fail_closed: SourceCounts,
    /// Admissions from leases (with leases on).
    pub lease: SourceCounts,
    /// Denials by the leases' local denial (with leases on).
    pub local_denial: SourceCounts,
    /// Calls the circuit breaker let through to the store (for Redis, one script call each):
    /// decisions, the leases' reservations and rate-share calls. Refunds, the leases'
    /// returns of blocks and operators' changes go to the store without the breaker and
    /// are not counted here (nor their failures in `store_errors`).
    pub store_calls: u64,
    /// Calls that gave no decision: `timeouts + connection_errors + server_errors +
    /// unexpected_replies + contended`.
    pub store_errors: u64,
    /// Calls with no reply within the deadline.
    pub timeouts: u64,
    /// Calls that found no connection or lost it.
    pub connection_errors: u64,
    /// Calls the store answered with an error.
    pub server_errors: u64,
    /// Calls answered with a reply of the wrong shape.
    pub unexpected_replies: u64,
    /// Calls of the optimistic store that lost the race for their key on every attempt:
    /// answered by the failure policy, but not counted toward opening the breaker (Redis
    /// answered).
    pub contended: u64,
    /// Requests (and the leases' calls: reservations, rate-share takes and returns) that did
    /// not call the store because the circuit breaker was open (or its probe was out).
    pub breaker_rejections: u64,
    /// The breaker's state after its latest transition.
    pub breaker_state: BreakerState,
    /// Transitions to open.
    pub breaker_opened: u64,
    /// Transitions to half-open.
    pub breaker_half_opened: u64,
    /// Transitions to closed (successful probes).
    pub breaker_closed: u64,
    /// Requests refused with an `Err` before anything else: an empty key or one over
    /// 1 KiB, a cost above the capacity, an unknown policy name, a rate share the store
    /// does not allow.
    pub invalid_requests: u64,
    /// Latency of the calls sent to the store, errors and timeouts included.
    pub store_latency: LatencySnapshot,
}

/// Decisions of one source, by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceCounts {
    /// Admitted.
    pub allowed: u64,
    /// Refused.
    pub denied: u64,
}

/// A histogram of store call latencies in fixed log-scale buckets.
///
/// Bucket `i < 17` counts calls that took at most [`LATENCY_BOUNDS_US`]`[i]` µs and more
/// than the bound before it (16 µs, 32 µs, ..., 2^20 µs ≈ 1.05 s); the last counts slower
/// ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Calls per bucket.
    pub counts: [u64; LATENCY_BUCKETS],
    /// Sum of all latencies, in µs.
    pub sum_us: u64,
}

/// The inclusive upper bounds of the latency buckets, in µs: 2^4 to 2^20. Powers of two
/// keep the bucket index one `leading_zeros`; 16 µs is below a loopback round trip, 1 s
/// above any sane deadline.
pub const LATENCY_BOUNDS_US: [u64; LATENCY_BUCKETS - 1] = {
    let mut bounds = [0; LATENCY_BUCKETS - 1];
    let mut i = 0;
    while i < bounds.len() {
        bounds[i] = 1 << (i + 4);
        i += 1;
    }
    bounds
};

/// The number of latency buckets: one per bound in [`LATENCY_BOUNDS_US`], and one above.
pub const LATENCY_BUCKETS: usize = 18;

impl SourceCounts {
    /// `allowed + denied`.
    pub fn total(&self) -> u64 {
        self.allowed + self.denied
    }
}

impl LatencySnapshot {
    /// Calls recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// The live counters behind [`StatsSnapshot`].
pub(crate) struct Stats {
    /// `[source index][0 allowed, 1 denied]`.
    decisions: [[AtomicU64; 2]; SOURCES],
    store_calls: AtomicU64,
    /// By [`Unavailable::error_index`].
    store_errors: [AtomicU64; ERRORS],
    breaker_rejections: AtomicU64,
    /// `[0 opened, 1 half-opened, 2 closed]`.
    transitions: [AtomicU64; 3],
    breaker_state: AtomicU8,
    invalid_requests: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
    latency_sum_us: AtomicU64,
    #[cfg(feature = "metrics")]
    export: crate::export::Export,
}

impl Stats {
    /// Counters at zero; with the `metrics` feature, also registers the facade's handles
    /// labelled `limiter = name` with the recorder installed now.
    pub(crate) fn new(#[cfg_attr(not(feature = "metrics"), allow(unused))] name: &str) -> Self {
        Self {
            decisions: Default::default(),
            store_calls: AtomicU64::new(0),
            store_errors: Default::default(),
            breaker_rejections: AtomicU64::new(0),
            transitions: Default::default(),
            breaker_state: AtomicU8::new(state_code(BreakerState::Closed)),
            invalid_requests: AtomicU64::new(0),
            latency: Default::default(),
            latency_sum_us: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            export: crate::export::Export::new(name),
        }
    }

    pub(crate) fn decided(&self, source: Source, allowed: bool) {
        let outcome = usize::from(!allowed);
        self.decisions[source.index()][outcome].fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.export.decisions[source.index()][outcome].increment(1);
    }

    pub(crate) fn store_call(&self) {
        self.store_calls.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.export.store_calls.increment(1);
    }

    pub(crate) fn store_latency(&self, latency: Micros) {
        let us = latency.as_micros();
        self.latency[bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.export.latency.record(us as f64 / 1e6);
    }

    pub(crate) fn store_error(&self, why: Unavailable) {
        if let Some(i) = why.error_index() {
            self.store_errors[i].fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            self.export.store_errors[i].increment(1);
        }
    }

    pub(crate) fn breaker_rejection(&self) {
        self.breaker_rejections.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.export.breaker_rejections.increment(1);
    }

    pub(crate) fn breaker_event(&self, event: &BreakerEvent) {
        let (index, state) = match event {
            BreakerEvent::Opened { .. } => (0, BreakerState::Open),
            BreakerEvent::HalfOpened { .. } => (1, BreakerState::HalfOpen),
            BreakerEvent::Closed { .. } => (2, BreakerState::Closed),
        };
        self.transitions[index].fetch_add(1, Ordering::Relaxed);
        self.breaker_state
            .store(state_code(state), Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            self.export.transitions[index].increment(1);
            self.export.breaker_state.set(f64::from(state_code(state)));
        }
    }

    pub(crate) fn invalid_request(&self) {
        self.invalid_requests.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.export.invalid_requests.increment(1);
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let by_source: [SourceCounts; SOURCES] = std::array::from_fn(|i| SourceCounts {
            allowed: read(&self.decisions[i][0]),
            denied: read(&self.decisions[i][1]),
        });
        let errors: [u64; ERRORS] = std::array::from_fn(|i| read(&self.store_errors[i]));
        let allowed = by_source.iter().map(|c| c.allowed).sum();
        let denied = by_source.iter().map(|c| c.denied).sum();
        StatsSnapshot {
            decisions: allowed + denied,
            allowed,
            denied,
            store: by_source[0],
            deny_cache: by_source[1],
            allow_cache: by_source[2],
            fallback: by_source[3],
            fail_open: by_source[4],
            fail_closed: by_source[5],
            lease: by_source[6],
            local_denial: by_source[7],
            store_calls: read(&self.store_calls),
            store_errors: errors.iter().sum(),
            timeouts: errors[0],
            connection_errors: errors[1],
            server_errors: errors[2],
            unexpected_replies: errors[3],
            contended: errors[4],
            breaker_rejections: read(&self.breaker_rejections),
            breaker_state: state_from_code(self.breaker_state.load(Ordering::Relaxed)),
            breaker_opened: read(&self.transitions[0]),
            breaker_half_opened: read(&self.transitions[1]),
            breaker_closed: read(&self.transitions[2]),
            invalid_requests: read(&self.invalid_requests),
            store_latency: LatencySnapshot {
                counts: std::array::from_fn(|i| read(&self.latency[i])),
                sum_us: read(&self.latency_sum_us),
            },
        }
    }
}

/// The bucket of a latency of `us` µs: the smallest `i` with `us ≤ 2^(i+4)`, or the last.
fn bucket(us: u64) -> usize {
    if us <= LATENCY_BOUNDS_US[0] {
        return 0;
    }
    // `us - 1` has `b` significant bits exactly when `2^(b-1) < us ≤ 2^b`.
    let bits = (u64::BITS - (us - 1).leading_zeros()) as usize;
    (bits - 4).min(LATENCY_BUCKETS - 1)
}

/// The `rein_breaker_state` gauge's values: 0 closed, 1 half-open, 2 open.
pub(crate) fn state_code(state: BreakerState) -> u8 {
    match state {
        BreakerState::Closed => 0,
        BreakerState::HalfOpen => 1,
        BreakerState::Open => 2,
    }
}

fn state_from_code(code: u8) -> BreakerState {
    match code {
        0 => BreakerState::Closed,
        1 => BreakerState::HalfOpen,
        _ => BreakerState::Open,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_inclusive_powers_of_two() {
        #[rustfmt::skip]
        let rows: [(u64, usize); 12] = [
            (0, 0), (1, 0), (16, 0),
            (17, 1), (32, 1),
            (33, 2), (64, 2),
            (1_000, 6), (1_024, 6), (1_025, 7),
            (1 << 20, 16),
            ((1 << 20) + 1, 17),
        ];
        for (us, expected) in rows {
            assert_eq!(bucket(us), expected, "{us} µs");
        }
        assert_eq!(bucket(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(LATENCY_BOUNDS_US[6], 1_024);
        assert_eq!(LATENCY_BOUNDS_US[16], 1 << 20);
    }

    #[test]
    fn a_snapshot_sums_the_matrix_it_reads() {
        let stats = Stats::new("test");
        stats.decided(Source::Store, true);
        stats.decided(Source::Store, false);
        stats.decided(Source::DenyCache, false);
        stats.decided(Source::FailClosed(Unavailable::BreakerOpen), false);
        stats.store_call();
        stats.store_error(Unavailable::Timeout);
        stats.store_error(Unavailable::BreakerOpen);
        stats.store_latency(Micros::from_micros(40));
        stats.store_latency(Micros::from_millis(50));
        let s = stats.snapshot();
        assert_eq!((s.decisions, s.allowed, s.denied), (4, 1, 3));
        assert_eq!(
            s.store,
            SourceCounts {
                allowed: 1,
                denied: 1
            }
        );
        assert_eq!(s.deny_cache.total(), 1);
        assert_eq!(s.fail_closed.denied, 1);
        assert_eq!((s.store_calls, s.store_errors, s.timeouts), (1, 1, 1));
        assert_eq!(s.store_latency.count(), 2);
        assert_eq!(s.store_latency.counts[2], 1);
        assert_eq!(s.store_latency.counts[bucket(50_000)], 1);
        assert_eq!(s.store_latency.sum_us, 50_040);
        assert_eq!(s.breaker_state, BreakerState::Closed);
    }
}
