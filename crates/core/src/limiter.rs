//! The one interface every way of deciding implements, [`Limiter`], and the one a store
//! implements besides to be leased over, [`Leasable`].
//!
//! rein decides in several places: in process (`rein-memory`), in Redis (`rein-redis`),
//! through the resilient layer above any store (`rein`), and in the HTTP layer and the
//! simulator, which only consume decisions. They all speak this trait, so code above a
//! store (the resilient limiter, an HTTP layer, a test) is written once and runs over any
//! of them. The trait is an interface, not I/O: rein-core still runs nothing, and an
//! implementation's futures are driven by whatever runtime it uses.
//!
//! # Shape
//! A store does not take a [`Policy`] per call: a policy is *prepared* once
//! ([`Limiter::prepare`]) into the store's own form (the Redis store precomputes its key
//! suffixes and script arguments; the memory store builds a keyed table), and each call
//! passes the prepared form. Errors are one enum, [`DecideError`], for every store: a
//! request that can never be admitted, a key that cannot be used, or a store that could not
//! answer ([`StoreError`], which nests the transport failures once).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

#[cfg(doc)]
use crate::rate_share::RateShares;
use crate::{
    ConfigError, Decision, Micros, OverCapacity, Policy, Timestamp,
    rate_share::{RateAnswer, RateOp, ShareError},
};

/// A way of deciding: apply a prepared policy to a key, atomically.
///
/// # Contract
/// - `now` is the instant to decide at, or `None` for the implementation's own clock (Redis's
///   `TIME` for the Redis store, the configured clock for the memory store). Don't mix the
///   two on one key: its state would be judged against two clocks.
/// - [`acquire`](Self::acquire) takes `cost` from every limit of the policy, or nothing (a
///   denial is a [`Decision`], never an `Err`); a cost of zero is a [`peek`](Self::peek).
/// - `Err` means the request can never be admitted, the key is unusable, or the store gave
///   no answer. After [`StoreError::Timeout`] or [`StoreError::Connection`] the call's effect
///   is unknown: an implementation never replays it, and neither should the caller.
/// - An empty key is refused ([`KeyError::Empty`]): it is almost always a missing
///   identifier, and would make every such request share one limit. So is a key longer
///   than [`MAX_KEY_BYTES`] ([`KeyError::TooLong`]): keys are held in memory (caches,
///   fallbacks, leases), and a client must not choose how much.
pub trait Limiter: Send + Sync {
    /// A policy in the form this limiter decides with, built once by
    /// [`prepare`](Self::prepare).
    type Prepared: Send + Sync + 'static;

    /// Prepares `policy` for calls to this limiter.
    fn prepare(&self, policy: &NamedPolicy) -> Result<Self::Prepared, PrepareError>;

    /// Takes `cost` from every limit of `policy` for `key` if all of them have it.
    fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send;

    /// What [`acquire`](Self::acquire) would answer, taking nothing.
    fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send;

    /// Gives up to `amount` back to every limit of `policy` for `key`, never beyond full.
    fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
    ) -> impl Future<Output = Result<(), DecideError>> + Send;

    /// The longest one call waits before it gives up with [`StoreError::Timeout`], if the
    /// limiter bounds its own calls (a remote store does), or `None` for one that never
    /// waits (a local store). No default: every limiter states its own, since the layers
    /// above size their deadlines from it.
    fn deadline(&self) -> Option<Duration>;
}

/// A [`Limiter`] whose units can be leased: the operations a `rein::lease::LeasedLimiter` runs on
/// the store besides [`Limiter`]'s, to reserve blocks of units, give back what a block did
/// not spend, and share a token bucket's rate between nodes (docs/leases.md).
///
/// A second trait rather than more methods of [`Limiter`], and with no default bodies: a
/// store or wrapper that does not implement leasing cannot be leased over, and one that
/// forgets an operation does not compile. rein-memory's `MemoryStore`, rein-redis's
/// `RedisStore` (standalone and Cluster), rein's `ResilientLimiter` over a leasable store
/// and the stores of rein-tower and rein-server implement it; rein-redis's
/// `OptimisticStore` does not (it has no rate shares), and neither does
/// `rein::lease::LeasedLimiter` itself (a lease of a lease is not offered).
///
/// # Contract
/// Every operation is atomic in the store, as [`Limiter::acquire`] is, with the same `now`,
/// key and error rules (see [`Limiter`]).
/// - [`acquire_held`](Self::acquire_held) and [`refund_held`](Self::refund_held) are
///   [`Policy::acquire_held`] and [`Policy::refund_held`] in the store, the stamp in the
///   store's clock.
/// - [`share_rate`](Self::share_rate) is [`RateShares::apply`] on the key's rate-share
///   state. A store that cannot run it atomically says so in code, answering
///   [`DecideError::Unsupported`]; a `LeasedLimiter` then decides such a token bucket with
///   plain [`acquire`](Limiter::acquire), without leases.
///
/// # A store that only decides cannot be leased over
/// `rein::lease::LeasedLimiter<S>` requires `S: Leasable`, as `lease_over` does here (rein-core
/// cannot name rein; the same example with `LeasedLimiter` itself is in its docs):
/// ```compile_fail,E0277
/// use std::future::{Future, ready};
/// use std::time::Duration;
/// use rein_core::{DecideError, Decision, Leasable, Limiter, NamedPolicy, PrepareError, Timestamp};
///
/// /// A [`Limiter`], and not [`Leasable`].
/// struct DecidesOnly;
///
/// impl Limiter for DecidesOnly {
///     type Prepared = ();
///     fn prepare(&self, _: &NamedPolicy) -> Result<(), PrepareError> {
///         Ok(())
///     }
///     fn acquire(&self, _: Option<Timestamp>, _: &(), _: &[u8], _: u64)
///         -> impl Future<Output = Result<Decision, DecideError>> + Send {
///         ready(Err(DecideError::Unsupported { operation: "acquire" }))
///     }
///     fn peek(&self, _: Option<Timestamp>, _: &(), _: &[u8], _: u64)
///         -> impl Future<Output = Result<Decision, DecideError>> + Send {
///         ready(Err(DecideError::Unsupported { operation: "peek" }))
///     }
///     fn refund(&self, _: Option<Timestamp>, _: &(), _: &[u8], _: u64)
///         -> impl Future<Output = Result<(), DecideError>> + Send {
///         ready(Ok(()))
///     }
///     fn deadline(&self) -> Option<Duration> {
///         None
///     }
/// }
///
/// /// `LeasedLimiter::builder`'s bound.
/// fn lease_over<S: Leasable + 'static>(store: S) -> S {
///     store
/// }
///
/// // error[E0277]: the trait bound `DecidesOnly: Leasable` is not satisfied
/// lease_over(DecidesOnly);
/// ```
pub trait Leasable: Limiter {
    /// [`acquire`](Limiter::acquire) for a lease: units the caller may spend at any instant up
    /// to `hold` after the store's decision. A sliding log records them `hold` after its
    /// decision, so they count for as long as they may be used; the other algorithms count
    /// them at the decision ([`Policy::acquire_held`]). The reply carries that stamp, in
    /// the store's clock, for [`refund_held`](Self::refund_held).
    fn acquire_held(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
        hold: Micros,
    ) -> impl Future<Output = Result<Held, DecideError>> + Send;

    /// Gives back up to `amount` unused units of an [`acquire_held`](Self::acquire_held)
    /// whose reply named `stamp`: a sliding log removes them from that stamp only, which is
    /// exact whenever it runs; the other algorithms as [`refund`](Limiter::refund)
    /// ([`Policy::refund_held`]).
    fn refund_held(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
        stamp: Timestamp,
    ) -> impl Future<Output = Result<(), DecideError>> + Send;

    /// Runs one operation on the rate shares of `key` under `policy`, which must be a policy
    /// of one token bucket ([`RateShares`]): a node taking, renewing or returning its
    /// share of the rate, or a request decided against what the shares leave (leases of a
    /// token bucket, docs/leases.md). A key decided this way must be decided only this way:
    /// its state is not the plain bucket's. A plain bucket's state the shares meet first
    /// (an operator's change of a key not yet shared) is adopted,
    /// [`RateShares::adopt`], and dropped.
    fn share_rate(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        op: RateOp,
    ) -> impl Future<Output = Result<RateAnswer, DecideError>> + Send;
}

/// The answer to [`Leasable::acquire_held`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// The decision, as [`Limiter::acquire`] would give it.
    pub decision: Decision,
    /// Where a sliding log recorded the units: the store's decision instant plus the hold,
    /// in the store's clock. Name it in [`Leasable::refund_held`].
    pub stamp: Timestamp,
}

/// A [`Policy`] under a name: what a [`Limiter`] prepares.
///
/// The name identifies the policy everywhere: in Redis keys (so two policies never share
/// state), in a policy table, in metrics and in HTTP headers. It is 1 to 64 of ASCII
/// letters, digits, `_`, `-` and `.`.
///
/// ```
/// use rein_core::{Limit, Micros, NamedPolicy, Policy};
///
/// let login = NamedPolicy::new(
///     "login",
///     Policy::new([
///         Limit::token_bucket(5, 1, Micros::from_secs(10))?,   // bursts of 5, 1 per 10 s
///         Limit::fixed_window(50, Micros::from_secs(86_400))?, // 50 a day
///     ])?,
/// )?;
/// assert_eq!(login.name(), "login");
/// assert_eq!(login.policy().capacity(), 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NamedPolicy {
    name: Arc<str>,
    policy: Policy,
}

impl NamedPolicy {
    /// Names `policy`. Errors with [`ConfigError::InvalidName`] if the name is empty, longer
    /// than 64 bytes, or holds anything but ASCII letters, digits, `_`, `-` and `.`.
    pub fn new(name: impl Into<String>, policy: Policy) -> Result<Self, ConfigError> {
        let name = name.into();
        Self::check_name(&name)?;
        Ok(Self {
            name: name.into(),
            policy,
        })
    }

    /// Checks a policy's name as [`new`](Self::new) does, for tools that name a policy
    /// without building it (an override of a policy by name).
    pub fn check_name(name: &str) -> Result<(), ConfigError> {
        let valid = (1..=MAX_NAME_LEN).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if valid {
            Ok(())
        } else {
            Err(ConfigError::InvalidName(name.to_owned()))
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// Why a [`Limiter`] gave no decision.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum DecideError {
    /// The cost exceeds the policy's capacity (its smallest limit's); see
    /// [`OverCapacity`]. Checked before any store is called.
    #[error(transparent)]
    InsufficientCapacity(#[from] OverCapacity),
    /// The key cannot be used; see [`KeyError`].
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// A rate-share operation the policy or the request does not allow; see [`ShareError`].
    #[error(transparent)]
    InvalidShare(#[from] ShareError),
    /// The limiter does not run this operation (for example
    /// [`Leasable::share_rate`] on a store that cannot run it atomically, or a refund of a
    /// token bucket leased as rate). Fix: decide the policy with `acquire`, or use a store
    /// that runs it.
    #[error("this limiter does not implement {operation}")]
    Unsupported {
        /// The operation.
        operation: &'static str,
    },
    /// The prepared policy is not this limiter's: one prepared by another limiter of the
    /// same type, whose prepared form names a slot of its own (rein's `TablePolicy` and
    /// `LeasedPolicy`). Nothing was decided. Fix: prepare each policy with the limiter
    /// that decides it.
    #[error("the policy was prepared by another limiter")]
    ForeignPolicy,
    /// The store could not answer; see [`StoreError`]. Whether to admit anyway is the
    /// caller's choice (the resilient limiter makes it by its failure policy).
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// A user key a limiter cannot use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty. That is almost always a missing identifier (no user id, an absent
    /// header), and would make every such request share one limit. Pass a non-empty key,
    /// e.g. a fixed `anonymous` if sharing is what you want.
    #[error("the user key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_BYTES`]. Key by a short identifier (a user or
    /// tenant id, an address), not by a whole token or document.
    #[error("the user key is {len} bytes, over the limit of {MAX_KEY_BYTES}")]
    TooLong {
        /// The key's length in bytes.
        len: usize,
    },
}

/// The longest user key a limiter takes: 1 KiB. Any byte string from 1 byte to this long
/// is a key. Keys are held in process memory (the deny and allow caches, the local
/// fallback, the lease books, the memory store), each bounded by a count of keys: this
/// bounds their bytes too, whoever chooses the key (a header's value, a descriptor's).
/// Redis keys are a digest of the user key, whatever its length.
pub const MAX_KEY_BYTES: usize = 1024;

impl KeyError {
    /// `key` as a limiter takes it: not empty, at most [`MAX_KEY_BYTES`].
    ///
    /// ```
    /// use rein_core::KeyError;
    /// assert_eq!(KeyError::check(b"user-42"), Ok(()));
    /// assert_eq!(KeyError::check(b""), Err(KeyError::Empty));
    /// assert_eq!(KeyError::check(&[b'x'; 1025]), Err(KeyError::TooLong { len: 1025 }));
    /// ```
    pub fn check(key: &[u8]) -> Result<(), KeyError> {
        match key.len() {
            0 => Err(KeyError::Empty),
            len if len > MAX_KEY_BYTES => Err(KeyError::TooLong { len }),
            _ => Ok(()),
        }
    }
}

/// A policy a limiter cannot prepare.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PrepareError {
    /// The limiter decides only by a fixed table of policies, and this one is not in it
    /// (or differs from the table's policy of that name). Fix: add it to the table.
    #[error("no policy named {0:?} in the limiter's table")]
    UnknownPolicy(String),
}

/// The store could not give an answer. One type for every store and operation, nested in
/// each operation's error, so a caller handles transport failures in one place.
///
/// After [`Timeout`](Self::Timeout) and [`Connection`](Self::Connection) the call's effect
/// is **unknown**: it may have run. rein never replays such a call, because a replay could
/// count one request twice.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No reply within the deadline. Likely causes: the store overloaded or paused, a
    /// network partition, a deadline shorter than the round trip. Fix: apply a failure
    /// policy; raise the deadline if round trips come close to it.
    #[error("no reply from the store within {0:?}")]
    Timeout(Duration),
    /// The store could not be reached or the connection broke: refused, reset, closed, a
    /// Cluster slot moving or the cluster down, a server still loading. Transient.
    #[error("the store is unavailable: {0}")]
    Connection(#[source] SourceError),
    /// The store ran the call and answered with an error. Not transient: fix the
    /// deployment (permissions, a foreign value under rein's keys, memory full). The
    /// source says which.
    #[error("the store rejected the call: {0}")]
    Server(#[source] SourceError),
    /// The reply, or state read back, has the wrong shape: the server is not what the store
    /// expects, or another program wrote under rein's keys. Fix: point the store at the
    /// right server and give rein a key prefix of its own.
    #[error("unexpected reply from the store: {0}")]
    UnexpectedReply(String),
    /// An optimistic store ran out of attempts: every one lost a race with another writer
    /// of the same key. Nothing was taken. Fix: the atomic script store does not retry;
    /// use it for hot keys.
    #[error("gave up after {attempts} attempts, each lost to a concurrent writer")]
    Contended {
        /// How many attempts were made.
        attempts: u32,
    },
}

/// The underlying error of a [`StoreError`], from the store's client library, shared so
/// that errors stay cheap to clone.
#[derive(Clone)]
pub struct SourceError(Arc<dyn StdError + Send + Sync>);

impl SourceError {
    /// Wraps a client library's error.
    pub fn new(error: impl StdError + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// The client library's error, to downcast to its type.
    pub fn inner(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for SourceError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// The longest policy name: it is repeated in every Redis key of the policy.
const MAX_NAME_LEN: usize = 64;

/// The longest one decision waits for a store unless told otherwise: rein's Redis stores'
/// default deadline, and the resilient limiter's for a store that states none. A
/// rate-limit check sits on the request path: 50 ms is long against a healthy Redis round
/// trip (well under 1 ms on a LAN) and short enough that a stalled Redis costs each request
/// little before the caller's failure policy takes over. Defined here once; everything that
/// defaults to it refers to it.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);

/// How much longer a caller's own timer waits than the deadline of what it calls: the
/// resilient limiter's over its store's, the HTTP layer's over its limiter's. The inner
/// timer normally fires first and says why (and lets a store built with a connector replace
/// a connection that went silent); 5 ms is above tokio's 1 ms timer resolution and a
/// scheduling hiccup, and short against [`DEFAULT_DEADLINE`].
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limit, Micros};

    fn policy() -> Policy {
        Policy::single(Limit::fixed_window(1, Micros::from_secs(1)).unwrap())
    }

    #[test]
    fn names_are_one_to_64_safe_ascii_bytes() {
        for good in ["a", "api-login", "v1.search_2", &"x".repeat(64)] {
            assert!(NamedPolicy::new(good, policy()).is_ok(), "{good:?}");
        }
        for bad in ["", "a b", "a:b", "{a}", "é", &"x".repeat(65)] {
            assert_eq!(
                NamedPolicy::new(bad, policy()),
                Err(ConfigError::InvalidName(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn store_errors_keep_their_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let error = DecideError::from(StoreError::Connection(SourceError::new(io)));
        let DecideError::Unavailable(StoreError::Connection(source)) = &error else {
            panic!("{error:?}");
        };
        assert!(source.inner().downcast_ref::<std::io::Error>().is_some());
        assert_eq!(error.to_string(), "the store is unavailable: reset");
    }
}
