//! The layer's counters through the `metrics` facade: `rein_http_requests_total`, labelled
//! by `route` (the route's name) and `outcome` (`allowed`, `denied`, `missing_key`,
//! `unavailable`, `too_costly`, `shadow_denied`), and `rein_http_shadow_denials_total` by
//! `policy` for the policies in shadow mode.
//!
//! Handles are registered when the layer is built, so the per-request cost is one atomic
//! increment and no label is formatted on the request path. Install the recorder before
//! building the layer: handles taken earlier stay no-ops. The limiter's own metrics
//! (`rein::ResilientLimiter`: source, store errors, latency) are exported alongside.

use metrics::Counter;

use crate::layer::HttpOutcome;

/// One counter per outcome for one route.
pub(crate) struct RouteCounters([Counter; OUTCOMES.len()]);

impl RouteCounters {
    pub(crate) fn new(route: &str) -> Self {
        Self(OUTCOMES.map(|outcome| {
            metrics::counter!(
                "rein_http_requests_total",
                "route" => route.to_owned(),
                "outcome" => outcome.as_str(),
            )
        }))
    }

    pub(crate) fn count(&self, outcome: HttpOutcome) {
        self.0[outcome as usize].increment(1);
    }
}

/// Every outcome, in declaration order (the index of `outcome as usize`).
const OUTCOMES: [HttpOutcome; 6] = [
    HttpOutcome::Allowed,
    HttpOutcome::Denied,
    HttpOutcome::MissingKey,
    HttpOutcome::Unavailable,
    HttpOutcome::TooCostly,
    HttpOutcome::ShadowDenied,
];
