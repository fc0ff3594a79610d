//! [`Decided`]: a decision and where it came from.
//!
//! rein-core's [`Decision`] says what was decided; the resilient limiter also says who
//! decided, because during an outage an answer from Redis, from a local fallback and from a
//! blanket "fail open" mean very different things to the caller, to dashboards and to the
//! simulator that checks rein's bounds.

use rein_core::Decision;

/// A decision and its [`Source`], from [`ResilientLimiter`](crate::ResilientLimiter), with
/// leases on or off, and from [`LeasedLimiter`](crate::lease::LeasedLimiter).
///
/// ```
/// use rein::core::{Decision, Micros, Outcome};
/// use rein::{Decided, Source, Unavailable};
///
/// let decided = Decided {
///     decision: Decision {
///         outcome: Outcome::Allowed,
///         limit: 100,
///         remaining: 0,
///         retry_after: Micros::ZERO,
///         reset_after: Micros::ZERO,
///         limit_index: 0,
///     },
///     source: Source::FailOpen(Unavailable::Timeout),
/// };
/// assert!(decided.is_allowed());
/// assert!(!decided.source.is_exact());
/// assert_eq!(decided.source.as_str(), "fail_open");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a decision that is not acted on limits nothing"]
pub struct Decided {
    /// The decision. Its figures are the source's: see [`Source`] for what each reports.
    pub decision: Decision,
    /// Who decided.
    pub source: Source,
}

/// Who made a decision.
///
/// The store's own answer, the caches' (`DenyCache`, `AllowCache`), the leases' (`Lease`,
/// `LocalDenial`, with leases on), and the failure policy's (the last three, given because
/// Redis could not answer, and carrying why).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The store decided (for Redis: ran the policy's script): the exact, shared decision.
    Store,
    /// A denial Redis gave recently for this policy, key and a cost no larger, repeated
    /// locally before its `retry_after` ran out. Exact: Redis would have denied too. Its
    /// `retry_after` is counted down to the cached end; `limit` and `remaining` are those of
    /// the denial.
    DenyCache,
    /// A reuse of an admission Redis made recently (opt-in, over-admitting; see
    /// [`danger_allow_cache`](crate::ResilientLimiterBuilder::danger_allow_cache)). Redis
    /// did not count it. `remaining` is what Redis last reported minus local reuses since.
    AllowCache,
    /// Admitted from a block of the limit this node holds (leases, docs/leases.md): no
    /// store call. Exact: the store counted the block when it granted it. `limit`,
    /// `remaining` and `limit_index` name the policy's tightest limit as the store's last
    /// grant reported it, plus the units this node still holds unspent (other nodes'
    /// spending since is not seen); for a token bucket leased as rate, `remaining` and
    /// `reset_after` are the bucket's, read off this node's share.
    Lease,
    /// Denied by this node's leases: the store said less than a renewal interval ago that
    /// the limit has nothing left, or, for a token bucket leased as rate, this node's share
    /// lacks the cost and will have it within a renewal interval (the store's direct share
    /// might have admitted it). Exact in the safe direction: it may under-admit, never over.
    LocalDenial,
    /// Redis was unavailable; the local fallback limiter decided at this node's share of
    /// the policy ([`FailurePolicy::LocalFallback`](crate::FailurePolicy::LocalFallback)).
    /// Its figures are the share's: `limit` is the share's capacity.
    Fallback(Unavailable),
    /// Redis was unavailable; admitted by [`FailurePolicy::FailOpen`](crate::FailurePolicy).
    /// Nothing is known about the limit: the decision is [`Decision::blind`] (`limit` the
    /// policy's capacity, `remaining`, `retry_after` and `reset_after` zero), which the
    /// HTTP layer and the server show no figures for.
    FailOpen(Unavailable),
    /// Redis was unavailable; denied by [`FailurePolicy::FailClosed`](crate::FailurePolicy).
    /// Nothing is known about the limit: the decision is [`Decision::blind_denial`] (`limit`
    /// the policy's capacity, `remaining` and `reset_after` zero), its `retry_after` the time
    /// until the circuit breaker lets a call to Redis through again (zero when it is closed:
    /// the next request tries Redis). The HTTP layer and the server show no figures for it.
    FailClosed(Unavailable),
}

/// Why Redis gave no decision. A later version may add a reason (as `Contended` was).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unavailable {
    /// The circuit breaker is open (or its single probe is out): Redis was not called.
    BreakerOpen,
    /// No reply within the deadline. The call may have run in Redis; it is not replayed.
    Timeout,
    /// No connection, or it broke during the call (refused, reset, reconnecting, `LOADING`,
    /// a Cluster slot moving). The call may have run if it broke after being sent.
    Connection,
    /// Redis answered with an error (`NOPERM`, `OOM`, `WRONGTYPE`, ...): a deployment
    /// problem, see [`StoreError::Server`](rein_core::StoreError::Server).
    Server,
    /// Redis answered with a reply of the wrong shape.
    UnexpectedReply,
    /// Redis answered, but the key was contended: the optimistic store lost its race to
    /// other writers on every attempt
    /// ([`StoreError::Contended`](rein_core::StoreError::Contended)). The failure policy
    /// answers this request; the breaker counts the call as answered, since Redis is well.
    Contended,
}

impl Decided {
    /// `true` when the request was admitted.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }
}

impl Source {
    /// `store`, `deny_cache`, `allow_cache`, `fallback`, `fail_open`, `fail_closed`,
    /// `lease` or `local_denial`: the value of the `source` label in metrics and logs.
    pub fn as_str(&self) -> &'static str {
        SOURCE_NAMES[self.index()]
    }

    /// Why Redis gave no decision, for the failure policy's sources.
    pub fn unavailable(&self) -> Option<Unavailable> {
        match self {
            Source::Store
            | Source::DenyCache
            | Source::AllowCache
            | Source::Lease
            | Source::LocalDenial => None,
            Source::Fallback(why) | Source::FailOpen(why) | Source::FailClosed(why) => Some(*why),
        }
    }

    /// Whether the decision is the shared limit's own: from Redis, a denial Redis would
    /// repeat, or the leases' (exact by construction). Reuses of the allow cache and the
    /// failure policy's answers are not.
    pub fn is_exact(&self) -> bool {
        matches!(
            self,
            Source::Store | Source::DenyCache | Source::Lease | Source::LocalDenial
        )
    }

    /// A dense index, in the order of [`SOURCE_NAMES`], for counters.
    pub(crate) fn index(&self) -> usize {
        match self {
            Source::Store => 0,
            Source::DenyCache => 1,
            Source::AllowCache => 2,
            Source::Fallback(_) => 3,
            Source::FailOpen(_) => 4,
            Source::FailClosed(_) => 5,
            Source::Lease => 6,
            Source::LocalDenial => 7,
        }
    }
}

impl Unavailable {
    /// `breaker_open`, `timeout`, `connection`, `server`, `unexpected_reply` or `contended`.
    pub fn as_str(&self) -> &'static str {
        self.error_index()
            .map_or("breaker_open", |index| ERROR_NAMES[index])
    }

    /// Whether the store failed, which the breaker counts toward opening: every reason but
    /// a lost race (`Contended`), where Redis answered and only one hot key is in trouble
    /// (opening would answer every other key by the failure policy).
    pub(crate) fn store_failed(self) -> bool {
        !matches!(self, Unavailable::Contended)
    }

    /// A dense index of the Redis errors (everything but `BreakerOpen`), in the order of
    /// [`ERROR_NAMES`], for counters.
    pub(crate) fn error_index(&self) -> Option<usize> {
        match self {
            Unavailable::BreakerOpen => None,
            Unavailable::Timeout => Some(0),
            Unavailable::Connection => Some(1),
            Unavailable::Server => Some(2),
            Unavailable::UnexpectedReply => Some(3),
            Unavailable::Contended => Some(4),
        }
    }
}

/// How many sources and store errors there are: the sizes of the counter arrays.
pub(crate) const SOURCES: usize = SOURCE_NAMES.len();
pub(crate) const ERRORS: usize = ERROR_NAMES.len();

/// The sources' names, by [`Source::index`].
pub(crate) const SOURCE_NAMES: [&str; 8] = [
    "store",
    "deny_cache",
    "allow_cache",
    "fallback",
    "fail_open",
    "fail_closed",
    "lease",
    "local_denial",
];

/// The Redis errors' names, by [`Unavailable::error_index`].
pub(crate) const ERROR_NAMES: [&str; 5] = [
    "timeout",
    "connection",
    "server",
    "unexpected_reply",
    "contended",
];
