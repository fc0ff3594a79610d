//! Errors: one enum per operation, one variant per case a caller handles differently.
//!
//! A denial is a [`Decision`](rein_core::Decision), never an `Err`. An `Err` here means the
//! request can never fit, the input or configuration is wrong, or Redis could not give an
//! answer. Transport failures never turn into denials: whether to fail open or closed is
//! the caller's choice, made one layer up.
//!
//! Every error that follows a call to Redis (timeouts, broken connections) leaves the
//! effect of that call **unknown**: the script may have run. rein never replays such a call,
//! because a replay could count one request twice.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use thiserror::Error;

/// Why [`acquire`](crate::RedisStore::acquire) or [`peek`](crate::RedisStore::peek) returned
/// no decision.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The cost exceeds the smallest capacity in the policy, so no amount of waiting admits
    /// it. Checked before Redis is called. Fix: split the request, or raise the capacity.
    #[error("cost {cost} exceeds capacity {capacity}: it can never be admitted")]
    InsufficientCapacity {
        /// The requested cost.
        cost: u64,
        /// The policy's capacity (its smallest limit's).
        capacity: u64,
    },
    /// The user key cannot be used. Checked before Redis is called; see [`KeyError`].
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// No reply within the deadline. The script may or may not have run, and it is not
    /// retried. Likely causes: Redis overloaded or paused, a network partition, a deadline
    /// shorter than the round trip. Fix: apply your failure policy (fail open or closed);
    /// raise [`deadline`](crate::RedisStoreBuilder::deadline) if round trips come close to
    /// it. A store with a connector replaces the connection in the background.
    #[error("no reply from Redis within {0:?}")]
    Timeout(Duration),
    /// Redis could not be reached or the connection broke: refused, reset, closed, or (on a
    /// Cluster) a slot moving or the cluster being down; also `LOADING` after a restart.
    /// Transient: the same call may succeed shortly. If the connection broke after the
    /// call was sent, its effect is unknown, as for [`Timeout`](Self::Timeout).
    #[error("Redis is unavailable: {0}")]
    Connection(#[source] RedisError),
    /// Redis ran the call and answered with an error. Not transient: fix the deployment.
    /// Likely causes: `NOPERM` (the ACL user lacks `evalsha`, `script|load` or the key
    /// prefix; see docs/redis.md), `WRONGTYPE` (another program wrote a different type under
    /// a rein key), `OOM` (`maxmemory` reached with `noeviction`), `REIN` (the script
    /// rejected its arguments or stored state: a bug, please report it).
    #[error("Redis rejected the call: {0}")]
    Server(#[source] RedisError),
    /// The reply has the wrong shape for rein's script. Likely causes: the server is not
    /// Redis (or is a proxy without scripting), or something other than rein's script was
    /// loaded under its SHA1. Fix: point the store at Redis (tested with 7.0).
    #[error("unexpected reply from Redis: {0}")]
    UnexpectedReply(String),
}

/// Why [`refund`](crate::RedisStore::refund) failed. Its effect is unknown after
/// [`Timeout`](Self::Timeout) or [`Connection`](Self::Connection); it is not retried.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum RefundError {
    /// See [`AcquireError::InvalidKey`].
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// See [`AcquireError::Timeout`].
    #[error("no reply from Redis within {0:?}")]
    Timeout(Duration),
    /// See [`AcquireError::Connection`].
    #[error("Redis is unavailable: {0}")]
    Connection(#[source] RedisError),
    /// See [`AcquireError::Server`].
    #[error("Redis rejected the call: {0}")]
    Server(#[source] RedisError),
    /// See [`AcquireError::UnexpectedReply`].
    #[error("unexpected reply from Redis: {0}")]
    UnexpectedReply(String),
}

/// Why [`state`](crate::RedisStore::state) could not read a key's state.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum StateError {
    /// See [`AcquireError::InvalidKey`].
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// See [`AcquireError::Timeout`]. Reading has no effect, so retrying is safe.
    #[error("no reply from Redis within {0:?}")]
    Timeout(Duration),
    /// See [`AcquireError::Connection`].
    #[error("Redis is unavailable: {0}")]
    Connection(#[source] RedisError),
    /// See [`AcquireError::Server`].
    #[error("Redis rejected the call: {0}")]
    Server(#[source] RedisError),
    /// A reply of the wrong shape, or stored state that does not decode into rein-core's
    /// types (a field that is not an integer, an unordered log). Likely cause: another
    /// program wrote under rein's prefix. Fix: give rein a prefix of its own.
    #[error("unexpected reply from Redis: {0}")]
    UnexpectedReply(String),
}

/// Why a store could not be built or connected.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// A setting is invalid; see [`ConfigError`].
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The URL does not parse, names an unknown scheme, or asks for TLS (`rediss://`) in a
    /// build without the `tls` feature. Fix the URL or enable the feature.
    #[error("invalid Redis URL: {0}")]
    InvalidUrl(#[source] RedisError),
    /// The server refused the credentials (`AUTH`). Fix the user name or password in the URL.
    #[error("Redis refused the credentials: {0}")]
    Auth(#[source] RedisError),
    /// No connection within the connect timeout. Likely causes: a wrong host or port that
    /// drops packets, a firewall. Fix the address, or raise
    /// [`connect_timeout`](crate::RedisStoreBuilder::connect_timeout).
    #[error("could not connect to Redis within {0:?}")]
    Timeout(Duration),
    /// The connection failed: refused, reset, TLS handshake failure, no reachable Cluster
    /// node. Check the address, the port and TLS settings; transient if Redis is restarting.
    #[error("could not connect to Redis: {0}")]
    Connection(#[source] RedisError),
    /// Connected, but loading rein's script failed. Likely cause: the ACL user may not run
    /// `SCRIPT LOAD` (`NOPERM`). See docs/redis.md for the least-privilege ACL.
    #[error("Redis refused rein's script: {0}")]
    Server(#[source] RedisError),
    /// The server answered, but not like Redis: see [`AcquireError::UnexpectedReply`].
    #[error("unexpected reply from Redis: {0}")]
    UnexpectedReply(String),
}

/// A setting the store or a policy cannot use. Raised when it is built, never per call.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key prefix is empty, longer than 64 bytes, or holds a byte that is not printable
    /// ASCII or is `{` or `}` (which would change the Cluster hash tag). Use e.g. `rein` or
    /// `myapp:rl`.
    #[error("invalid key prefix {0:?}: 1 to 64 printable ASCII bytes, no braces or spaces")]
    InvalidPrefix(String),
    /// The policy name is empty, longer than 64 bytes, or holds a byte other than ASCII
    /// letters, digits, `_`, `-` and `.`. It becomes part of every key. Use e.g. `api-login`.
    #[error("invalid policy name {0:?}: 1 to 64 of A-Z a-z 0-9 _ - .")]
    InvalidPolicyName(String),
    /// A duration that must be positive is zero (the deadline or the connect timeout).
    #[error("{0} must be longer than zero")]
    ZeroDuration(&'static str),
}

/// A user key the store cannot use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty. That is almost always a missing identifier (no user id, an absent
    /// header), and would make every such request share one limit. Pass a non-empty key,
    /// e.g. a fixed `anonymous` if sharing is what you want. Any other byte string, of any
    /// length, is accepted: keys are hashed.
    #[error("the user key is empty")]
    Empty,
}

/// The outcome of one call to Redis that did not produce a reply of the right shape.
#[derive(Debug)]
pub(crate) enum CallError {
    Timeout(Duration),
    Connection(RedisError),
    Server(RedisError),
    UnexpectedReply(String),
}

impl CallError {
    /// Sorts a redis-rs error by what the caller can do about it.
    pub(crate) fn classify(e: RedisError, waited: Duration) -> Self {
        if e.is_timeout() {
            return CallError::Timeout(waited);
        }
        match e.kind() {
            ErrorKind::Server(
                ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly,
            ) => CallError::Connection(e),
            ErrorKind::Server(_)
            | ErrorKind::Extension
            | ErrorKind::AuthenticationFailed
            | ErrorKind::Client
            | ErrorKind::InvalidClientConfig => CallError::Server(e),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType | ErrorKind::RESP3NotSupported => {
                CallError::UnexpectedReply(e.to_string())
            }
            _ => CallError::Connection(e),
        }
    }

    /// Whether the connection may be dead or out of step, so a store with a connector
    /// should replace it.
    pub(crate) fn suspects_connection(&self) -> bool {
        !matches!(self, CallError::Server(_))
    }
}

macro_rules! from_call_error {
    ($($error:ident),*) => {$(
        impl From<CallError> for $error {
            fn from(e: CallError) -> Self {
                match e {
                    CallError::Timeout(d) => $error::Timeout(d),
                    CallError::Connection(e) => $error::Connection(e),
                    CallError::Server(e) => $error::Server(e),
                    CallError::UnexpectedReply(what) => $error::UnexpectedReply(what),
                }
            }
        }
    )*};
}

from_call_error!(AcquireError, RefundError, StateError, ConnectError);
