//! What every algorithm answers: one `Decision` per request.

use crate::Micros;

/// The answer to one request against one limit or a whole policy.
///
/// All figures describe the state *after* the decision: a request that was allowed has
/// already been subtracted from `remaining`.
///
/// `retry_after` is exact: if nothing else happens, the same request made `retry_after`
/// later is allowed, and made one microsecond earlier than that it is denied. It is zero
/// when the request was allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request was admitted (and its cost consumed, unless it was a peek).
    pub outcome: Outcome,
    /// The limit's capacity in cost units: burst size, or requests per window.
    pub limit: u64,
    /// How many more cost units would be admitted right now.
    pub remaining: u64,
    /// How long until the same request would be admitted; zero when it was.
    pub retry_after: Micros,
    /// How long until the limit is back to full capacity if nothing else is admitted.
    pub reset_after: Micros,
    /// Which limit of the policy `limit` and `remaining` describe: its index in the
    /// policy's order (0 for a single limit). On a denial, the denying limit with the fewest
    /// remaining; otherwise the limit with the fewest remaining; the first on a tie. It is
    /// the one whose name and quota an HTTP `RateLimit` header or a log line should show.
    pub limit_index: u8,
}

/// What happened to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Admitted: its cost was consumed (or, for a peek, would have been).
    Allowed,
    /// Refused: nothing was consumed. `Decision::retry_after` says when to try again.
    Denied,
}

impl Decision {
    /// `true` when the request was admitted.
    pub fn is_allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// An admission that knows nothing of the limit: a failure policy's "fail open", made
    /// because the store gave no answer. Its figures are `limit` (the policy's capacity),
    /// nothing left and full again now, which no limit's admission gives (one that leaves
    /// nothing is full again only later): [`is_blind`](Self::is_blind) tells it apart, and
    /// a layer shows no figures for it (rein-tower sends no `RateLimit` header, rein-server
    /// no `current_limit`).
    pub const fn blind(limit: u64) -> Self {
        Self {
            outcome: Outcome::Allowed,
            ..Self::blind_denial(limit, Micros::ZERO)
        }
    }

    /// A denial that knows nothing of the limit: a failure policy's "fail closed", made
    /// because the store gave no answer. `retry_after` is when to ask again (the circuit
    /// breaker's wait); `limit` the policy's capacity, nothing left, and full again now,
    /// which no limit's denial gives (a limit that denies is not full):
    /// [`is_blind`](Self::is_blind) tells it apart, and a layer shows no figures for it.
    pub const fn blind_denial(limit: u64, retry_after: Micros) -> Self {
        Self {
            outcome: Outcome::Denied,
            limit,
            remaining: 0,
            retry_after,
            reset_after: Micros::ZERO,
            limit_index: 0,
        }
    }

    /// `true` for a decision whose figures say nothing of the limit: nothing left and full
    /// again now, which no limit's decision gives ([`blind`](Self::blind),
    /// [`blind_denial`](Self::blind_denial)).
    pub fn is_blind(&self) -> bool {
        self.remaining == 0 && self.reset_after == Micros::ZERO
    }

    pub(crate) fn allowed(limit: u64, remaining: u64, reset_after: Micros) -> Self {
        Self {
            outcome: Outcome::Allowed,
            limit,
            remaining,
            retry_after: Micros::ZERO,
            reset_after,
            limit_index: 0,
        }
    }

    pub(crate) fn denied(
        limit: u64,
        remaining: u64,
        retry_after: Micros,
        reset_after: Micros,
    ) -> Self {
        Self {
            outcome: Outcome::Denied,
            limit,
            remaining,
            retry_after,
            reset_after,
            limit_index: 0,
        }
    }
}
