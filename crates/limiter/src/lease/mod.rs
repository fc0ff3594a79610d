//! Leases: decisions at memory speed with zero global over-admission (docs/leases.md).
//!
//! A node reserves a block of a limit's capacity from the store in one atomic call, admits
//! requests from it locally until it is spent or its window ends, and gives back what it
//! will not use. The union of leased and direct admissions satisfies the limit's own
//! definition exactly: every unit is counted by the store in the window it is spent in.
//!
//! # Layout
//! - `terms.rs`: [`LeaseTerms`]: which policies can be leased with the store's existing
//!   `acquire`/`refund` (fixed windows and sliding counters) and how long a grant lives.
//! - `book.rs`: [`LeaseBook`]: the per-key lease state machine, sans-IO.
//! - `driver.rs`: [`LeasedLimiter`]: the thin async driver over any
//!   [`Limiter`](rein_core::Limiter).
//!
//! Token buckets and sliding logs are decided directly for now; docs/leases.md ("Phase 2")
//! gives the design that leases them exactly with new store operations.

mod book;
mod driver;
mod terms;

pub use book::{Action, Admit, LeaseBook, LeaseConfig, LeaseKey, LeaseKeyRef, Reserved};
pub use driver::{LeaseDecided, LeasedLimiter, LeasedLimiterBuilder, LeasedPolicy};
pub use terms::{LeaseTerms, Unleasable};

/// Where a [`LeasedLimiter`] decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseSource {
    /// Admitted from a block this node holds: no store call. Exact (docs/leases.md).
    Lease,
    /// Denied locally: the store said less than a renewal interval ago that the limit has
    /// nothing left. Exact in the safe direction.
    LocalDenial,
    /// Decided by the store, for this reason: the store's own decision, or its error.
    Direct(DirectReason),
}

/// Why a request was decided through the store rather than from a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DirectReason {
    /// The policy cannot be leased with the store's existing operations.
    Unleasable(Unleasable),
    /// A zero cost: a question about the store's state.
    Peek,
    /// The key's demand is below [`LeaseConfig::min_demand`]: a lease would cost a store
    /// call per request anyway.
    Cold,
    /// [`LeaseConfig::max_keys`] keys are tracked already.
    Untracked,
    /// The cost exceeds this node's fair share of the policy.
    AboveShare,
    /// A recent reservation failed, was lost, or was answered by a failure policy rather
    /// than by the store's windows: requests go to the store (and its failure policy) for a
    /// renewal interval.
    StoreTrouble,
    /// The limiter was shut down.
    Closed,
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
    /// Times a request waited for its key's reservation.
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
    /// Reservations answered "allowed" but not by the store's windows (a failure
    /// policy's answer), never spent as leases.
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
}

impl LeaseStats {
    fn count(&mut self, admit: &Admit) {
        match admit {
            Admit::Leased(_) => self.leased += 1,
            Admit::Denied(_) => self.denied_locally += 1,
            Admit::Direct(_) => self.direct += 1,
            Admit::Wait => self.waits += 1,
        }
    }
}
