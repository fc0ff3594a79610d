//! Leases: decisions at memory speed with zero global over-admission (docs/leases.md).
//!
//! A node reserves a block of a limit's capacity from the store in one atomic call, admits
//! requests from it locally until it is spent or its window ends, and gives back what it
//! will not use. The union of leased and direct admissions satisfies the limit's own
//! definition exactly: every unit is counted by the store in the window it is spent in.
//!
//! # Layout
//! - `terms.rs`: [`LeaseTerms`]: which policies can be leased in blocks (fixed windows,
//!   sliding counters, sliding logs held at a stamp) and how long a grant lives.
//! - `book.rs`: `LeaseBook`: the per-key lease state machine, sans-IO (tested inside the
//!   crate, `proptests/book.rs`).
//! - `rate.rs`: `RateBook`: the per-key rate leases of token buckets (sub-buckets),
//!   sans-IO, over the store's [`share_rate`](rein_core::Leasable::share_rate).
//! - `driver.rs`: [`LeasedLimiter`]: the thin async driver over any
//!   [`Leasable`](rein_core::Leasable) store.
//!
//! Policies of sliding logs only are leased with held grants, and a policy of one token
//! bucket as rate (`terms.rs`); other shapes are decided directly (docs/leases.md).

mod book;
mod driver;
mod rate;
mod terms;

/// What the driver needs of either sans-IO book (`LeaseBook` for window leases, `RateBook`
/// for rate shares) to run it: its next deadline and the actions it queued.
pub(crate) trait Book {
    /// What the book asks the driver to carry out.
    type Action;
    /// The next instant the book's `handle_timeout` has work, if any.
    fn poll_timeout(&self) -> Option<rein_core::Timestamp>;
    /// The next action for the driver.
    fn poll_action(&mut self) -> Option<Self::Action>;
}

pub use crate::mode::{
    Direct, LEASED_CALLS, Leased, LeasedBuilder, MaybeLeased, Mode, resilient_deadline,
};
pub use book::{
    DEFAULT_LOG_HOLD_DIVISOR, DEFAULT_SHARE_VALIDITY_INTERVALS, LeaseConfig, LeaseConfigError,
};
pub(crate) use driver::decide_direct;
pub use driver::{LeasedLimiter, LeasedLimiterBuilder, LeasedPolicy};
pub use rate::ShareView;
pub use terms::{LeaseTerms, Unleasable};

// The sans-IO state machines the driver runs, tested inside the crate (`proptests/`).
pub(crate) use book::Admit;
#[cfg(test)]
pub(crate) use book::{Action, LeaseBook, LeaseKey, LeaseKeyRef, Reserved};
#[cfg(test)]
pub(crate) use rate::{RateAction, RateBook, TakeReply};

#[cfg(test)]
mod proptests;

/// A failure policy's answer (fail open, fail closed): `outcome`, with no wait and no reset
/// to count a lease from. rein's resilient limiter never answers a reservation so; the
/// tests give it to the book as a `Leasable` that did would.
#[cfg(test)]
fn failure_policys(outcome: rein_core::Outcome) -> rein_core::Decision {
    rein_core::Decision {
        outcome,
        limit: 100,
        remaining: 0,
        retry_after: rein_core::Micros::ZERO,
        reset_after: rein_core::Micros::ZERO,
        limit_index: 0,
    }
}

/// Why the books send a request to the store rather than answer it from a lease (their
/// tests read it; the request's answer says only [`Source::Store`](crate::Source::Store),
/// or the failure policy's source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum DirectReason {
    /// The key's demand is below [`LeaseConfig::min_demand`]: a lease would cost a store
    /// call per request anyway (a token bucket's key: only before its first take).
    Cold,
    /// [`LeaseConfig::max_keys`] keys are tracked already.
    Untracked,
    /// The cost exceeds this node's fair share of the policy.
    AboveShare,
    /// A recent reservation failed, was lost, or was answered with figures no store window
    /// carries: requests go to the store (and its failure policy) for a renewal interval.
    StoreTrouble,
    /// The limiter was shut down.
    Closed,
    /// A token bucket's key with no valid rate share here (before the first grant, after a
    /// failed renewal, or after the share lapsed): the store's direct share decides.
    NoShare,
    /// The request waited for its key's reservations as long as it may (one store call's
    /// deadline, or [`LeaseConfig::flight_timeout`] for a store that states none), and would
    /// wait again (another reservation in flight, or too little granted): it goes to the
    /// store, so that it takes at most [`LEASED_CALLS`] store calls' time.
    Waited,
}

/// A [`LeasedLimiter`]'s counters (cumulative since it was built).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Requests admitted from a held block (lease hits).
    pub leased: u64,
    /// Requests denied locally after the store said nothing is left.
    pub denied_locally: u64,
    /// Requests sent to the store directly, every reason together.
    pub direct: u64,
    /// Of `direct`: because the policy cannot be leased.
    pub direct_unleasable: u64,
    /// Requests that waited for their key's reservation (each counted once, however many
    /// reservations it waited for).
    pub waits: u64,
    /// Reservations sent.
    pub reservations: u64,
    /// Reservations granted and usable.
    pub reservations_granted: u64,
    /// Reservations denied (the limit had less left than asked).
    pub reservations_denied: u64,
    /// Reservations that ended without an answer (timeout, connection, error).
    pub reservations_failed: u64,
    /// Reservations presumed lost (no reply within the flight timeout).
    pub reservations_lost: u64,
    /// Reservations answered "allowed" with figures no store window carries (from a
    /// `Leasable` that lets a failure policy answer one), never spent as leases.
    pub reservations_unusable: u64,
    /// Grants that arrived after the book stopped waiting for them: their units stay
    /// unused (counted in the store, so under-admission only).
    pub late_grants: u64,
    /// Units granted in usable reservations.
    pub units_reserved: u64,
    /// Returns sent.
    pub returns: u64,
    /// Units returned.
    pub units_returned: u64,
    /// Returns whose store call failed (the units stay counted: under-admission).
    pub returns_failed: u64,
    /// Units granted and neither spent nor returned: the cost of leasing.
    pub units_stranded: u64,
    /// Units of failed or lost reservations: possibly taken, never spent.
    pub units_in_doubt: u64,
    /// Token buckets leased as rate: tokens' worth of rate this node's shares held with
    /// no request, from a key's last request until its share went back or ended (what a
    /// quiet node cost the others: capacity reserved and unused). A dead node counts
    /// nothing; what it strands shows in its shares' views
    /// ([`ShareView::stranded_if_dead`]).
    pub rate_idle: u64,
}

impl LeaseStats {
    /// Reservations sent that have not ended: in flight now. A shutdown waits for them
    /// (at most the flight timeout) and gives back what they grant.
    pub fn reservations_pending(&self) -> u64 {
        let ended = self.reservations_granted
            + self.reservations_denied
            + self.reservations_failed
            + self.reservations_lost
            + self.reservations_unusable;
        self.reservations.saturating_sub(ended)
    }

    /// Sets the `metrics` facade's lease counters to these values, labelled
    /// `limiter = <limiter>` (feature `metrics`). Pull-style: call it when you scrape, or
    /// periodically; the counters are absolute, so calls may be as rare as you like.
    ///
    /// | metric | labels | meaning |
    /// |---|---|---|
    /// | `rein_lease_decisions_total` | `source` (`lease`, `local_denial`, `direct`) | decisions by where they came from |
    /// | `rein_lease_reservations_total` | `result` (`granted`, `denied`, `failed`, `lost`, `unusable`) | reservations by how they ended |
    /// | `rein_lease_units_total` | `kind` (`reserved`, `returned`, `stranded`, `in_doubt`) | units by fate |
    /// | `rein_lease_returns_total` | | returns sent |
    /// | `rein_lease_rate_idle_tokens_total` | | tokens' worth of rate held by shares with no request |
    #[cfg(feature = "metrics")]
    pub fn publish(&self, limiter: &str) {
        let limiter = limiter.to_owned();
        // One row per labelled counter: its name, its label, and each label value's count.
        #[rustfmt::skip]
        let by_label = [
            ("rein_lease_decisions_total", "source", &[("lease", self.leased), ("local_denial", self.denied_locally), ("direct", self.direct)][..]),
            ("rein_lease_reservations_total", "result", &[("granted", self.reservations_granted), ("denied", self.reservations_denied), ("failed", self.reservations_failed), ("lost", self.reservations_lost), ("unusable", self.reservations_unusable)]),
            ("rein_lease_units_total", "kind", &[("reserved", self.units_reserved), ("returned", self.units_returned), ("stranded", self.units_stranded), ("in_doubt", self.units_in_doubt)]),
        ];
        for (name, label, values) in by_label {
            for &(value_label, value) in values {
                metrics::counter!(name, "limiter" => limiter.clone(), label => value_label)
                    .absolute(value);
            }
        }
        metrics::counter!("rein_lease_returns_total", "limiter" => limiter.clone())
            .absolute(self.returns);
        metrics::counter!("rein_lease_rate_idle_tokens_total", "limiter" => limiter)
            .absolute(self.rate_idle);
    }

    /// Adds `other`'s counters to these.
    fn add(&mut self, other: &LeaseStats) {
        let LeaseStats {
            leased,
            denied_locally,
            direct,
            direct_unleasable,
            waits,
            reservations,
            reservations_granted,
            reservations_denied,
            reservations_failed,
            reservations_lost,
            reservations_unusable,
            late_grants,
            units_reserved,
            returns,
            units_returned,
            returns_failed,
            units_stranded,
            units_in_doubt,
            rate_idle,
        } = *other;
        self.leased += leased;
        self.denied_locally += denied_locally;
        self.direct += direct;
        self.direct_unleasable += direct_unleasable;
        self.waits += waits;
        self.reservations += reservations;
        self.reservations_granted += reservations_granted;
        self.reservations_denied += reservations_denied;
        self.reservations_failed += reservations_failed;
        self.reservations_lost += reservations_lost;
        self.reservations_unusable += reservations_unusable;
        self.late_grants += late_grants;
        self.units_reserved += units_reserved;
        self.returns += returns;
        self.units_returned += units_returned;
        self.returns_failed += returns_failed;
        self.units_stranded += units_stranded;
        self.units_in_doubt += units_in_doubt;
        self.rate_idle += rate_idle;
    }

    fn count(&mut self, admit: &Admit) {
        match admit {
            Admit::Leased(_) => self.leased += 1,
            Admit::Denied(_) => self.denied_locally += 1,
            Admit::Direct(_) => self.direct += 1,
            Admit::Wait => self.waits += 1,
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    #[test]
    fn published_counters_carry_the_snapshot_values() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let stats = LeaseStats {
            leased: 7,
            reservations_granted: 2,
            units_stranded: 3,
            returns: 1,
            rate_idle: 4,
            ..LeaseStats::default()
        };
        metrics::with_local_recorder(&recorder, || stats.publish("api"));
        let mut seen = Vec::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let label = key
                .labels()
                .find(|l| l.key() != "limiter")
                .map(|l| l.value().to_owned());
            if let DebugValue::Counter(n) = value {
                seen.push((key.name().to_owned(), label, n));
            }
        }
        for expected in [
            ("rein_lease_decisions_total", Some("lease"), 7),
            ("rein_lease_reservations_total", Some("granted"), 2),
            ("rein_lease_units_total", Some("stranded"), 3),
            ("rein_lease_returns_total", None, 1),
            ("rein_lease_rate_idle_tokens_total", None, 4),
        ] {
            let found = seen
                .iter()
                .any(|(n, l, v)| n == expected.0 && l.as_deref() == expected.1 && *v == expected.2);
            assert!(found, "{expected:?} in {seen:?}");
        }
    }
}
