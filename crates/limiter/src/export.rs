//! The `metrics` facade export (feature `metrics`): every counter of
//! [`StatsSnapshot`](crate::StatsSnapshot) as a facade metric labelled `limiter = <name>`.
//!
//! Handles are registered once, when the limiter is built, with the recorder installed at
//! that moment (the global one, or a local one around the build); each event is then one
//! increment on a handle, with no registry lookup. Install the recorder before building
//! limiters: a limiter built before any recorder exports nothing (its handles are no-ops),
//! while its own [`stats`](crate::ResilientLimiter::stats) still count.
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `rein_decisions_total` | counter | `source`, `outcome` | decisions by source (`store`, `deny_cache`, `allow_cache`, `fallback`, `fail_open`, `fail_closed`, with leases on `lease` and `local_denial`) and outcome (`allowed`, `denied`) |
//! | `rein_store_calls_total` | counter | | calls the circuit breaker let through to the store (for Redis, script calls): decisions, the leases' reservations and rate-share calls; refunds, the leases' returns of blocks and operators' changes are not counted |
//! | `rein_store_errors_total` | counter | `kind` | calls with no decision: `timeout`, `connection`, `server`, `unexpected_reply`, `contended` |
//! | `rein_breaker_rejections_total` | counter | | requests, and the leases' reservations and rate-share calls, not sent because the breaker was open |
//! | `rein_breaker_transitions_total` | counter | `to` | breaker transitions to `open`, `half_open`, `closed` |
//! | `rein_breaker_state` | gauge | | 0 closed, 1 half-open, 2 open |
//! | `rein_invalid_requests_total` | counter | | requests refused with an `Err` |
//! | `rein_store_latency_seconds` | histogram | | latency of each call counted in `rein_store_calls_total` |

use metrics::{Counter, Gauge, Histogram, Unit};

use crate::decided::{ERROR_NAMES, ERRORS, SOURCE_NAMES, SOURCES};

/// The facade handles of one limiter.
pub(crate) struct Export {
    /// `[source index][0 allowed, 1 denied]`.
    pub(crate) decisions: [[Counter; 2]; SOURCES],
    pub(crate) store_calls: Counter,
    pub(crate) store_errors: [Counter; ERRORS],
    pub(crate) breaker_rejections: Counter,
    /// `[0 open, 1 half_open, 2 closed]`.
    pub(crate) transitions: [Counter; 3],
    pub(crate) breaker_state: Gauge,
    pub(crate) invalid_requests: Counter,
    pub(crate) latency: Histogram,
}

impl Export {
    pub(crate) fn new(limiter: &str) -> Self {
        describe();
        let limiter = limiter.to_owned();
        let decisions = std::array::from_fn(|source| {
            ["allowed", "denied"].map(|outcome| {
                metrics::counter!(
                    DECISIONS,
                    "limiter" => limiter.clone(),
                    "source" => SOURCE_NAMES[source],
                    "outcome" => outcome,
                )
            })
        });
        let store_errors = std::array::from_fn(|kind| {
            metrics::counter!(
                STORE_ERRORS,
                "limiter" => limiter.clone(),
                "kind" => ERROR_NAMES[kind],
            )
        });
        let transitions = ["open", "half_open", "closed"]
            .map(|to| metrics::counter!(TRANSITIONS, "limiter" => limiter.clone(), "to" => to));
        let breaker_state = metrics::gauge!(BREAKER_STATE, "limiter" => limiter.clone());
        // Closed until told otherwise, so the gauge exists from the start.
        breaker_state.set(0.0);
        Self {
            decisions,
            store_calls: metrics::counter!(STORE_CALLS, "limiter" => limiter.clone()),
            store_errors,
            breaker_rejections: metrics::counter!(REJECTIONS, "limiter" => limiter.clone()),
            transitions,
            breaker_state,
            invalid_requests: metrics::counter!(INVALID, "limiter" => limiter.clone()),
            latency: metrics::histogram!(LATENCY, "limiter" => limiter),
        }
    }
}

/// Describes every metric to the recorder (names, units, help texts).
fn describe() {
    metrics::describe_counter!(
        DECISIONS,
        Unit::Count,
        "Rate-limit decisions, by source and outcome."
    );
    metrics::describe_counter!(STORE_CALLS, Unit::Count, "Calls sent to the store.");
    metrics::describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "Calls to the store that gave no decision, by kind."
    );
    metrics::describe_counter!(
        REJECTIONS,
        Unit::Count,
        "Requests not sent to the store because the circuit breaker was open."
    );
    metrics::describe_counter!(
        TRANSITIONS,
        Unit::Count,
        "Circuit breaker transitions, by target state."
    );
    metrics::describe_gauge!(
        BREAKER_STATE,
        "Circuit breaker state: 0 closed, 1 half-open, 2 open."
    );
    metrics::describe_counter!(
        INVALID,
        Unit::Count,
        "Requests refused as invalid (empty or over-long key, cost above capacity, unknown policy)."
    );
    metrics::describe_histogram!(LATENCY, Unit::Seconds, "Latency of each call to the store.");
}

/// Metric names.
pub(crate) const DECISIONS: &str = "rein_decisions_total";
pub(crate) const STORE_CALLS: &str = "rein_store_calls_total";
pub(crate) const STORE_ERRORS: &str = "rein_store_errors_total";
pub(crate) const REJECTIONS: &str = "rein_breaker_rejections_total";
pub(crate) const TRANSITIONS: &str = "rein_breaker_transitions_total";
pub(crate) const BREAKER_STATE: &str = "rein_breaker_state";
pub(crate) const INVALID: &str = "rein_invalid_requests_total";
pub(crate) const LATENCY: &str = "rein_store_latency_seconds";
