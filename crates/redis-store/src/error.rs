//! Errors of the Redis store beyond the ones every store shares.
//!
//! Decisions and refunds return rein-core's [`DecideError`](rein_core::DecideError), whose
//! [`StoreError`] is the one type for "Redis gave no answer"; this file adds what only a
//! Redis store has: connecting, reading state back, and its settings.
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
use rein_core::limiter::SourceError;
use rein_core::{KeyError, StoreError};
use thiserror::Error;

/// Why [`state`](crate::RedisStore::state) could not read a key's state.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum StateError {
    /// See [`KeyError`].
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// Redis gave no usable answer; see [`StoreError`]. Reading has no effect, so retrying
    /// is safe. [`StoreError::UnexpectedReply`] here also means stored state that does not
    /// decode into rein-core's types (a field that is not an integer, an unordered log):
    /// another program wrote under rein's prefix. Fix: give rein a prefix of its own.
    #[error(transparent)]
    Unavailable(#[from] StoreError),
    /// The key is blocked by an operator until this instant (µs since the Unix epoch): it
    /// holds no limits' states. [`KeyAdmin::inspect`](rein_core::admin::KeyAdmin::inspect)
    /// reads both.
    #[error("the key is blocked until {} µs since the Unix epoch", .0.as_micros())]
    Blocked(rein_core::Timestamp),
}

/// Why a store could not be built or connected.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// A setting is invalid; see [`SettingsError`].
    #[error(transparent)]
    Config(#[from] SettingsError),
    /// The URL does not parse, names an unknown scheme, or asks for TLS (`rediss://`) in a
    /// build without the `tls` feature. Fix the URL or enable the feature.
    #[error("invalid Redis URL: {0}")]
    InvalidUrl(#[source] RedisError),
    /// The server refused the credentials (`AUTH`). Fix the user name or password in the URL.
    #[error("Redis refused the credentials: {0}")]
    Auth(#[source] RedisError),
    /// No usable connection: [`StoreError::Timeout`] (a wrong host or port that drops
    /// packets, a firewall; or raise
    /// [`connect_timeout`](crate::RedisStoreBuilder::connect_timeout)),
    /// [`StoreError::Connection`] (refused, reset, TLS handshake failure, no reachable
    /// Cluster node), [`StoreError::Server`] (connected, but loading rein's script failed:
    /// the ACL user may not run `SCRIPT LOAD`; see docs/redis.md for the least-privilege
    /// ACL) or [`StoreError::UnexpectedReply`] (the server is not Redis).
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// A setting the store or a policy cannot use. Raised when it is built, never per call.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The key prefix is empty, longer than 64 bytes, or holds a byte that is not printable
    /// ASCII or is `{` or `}` (which would change the Cluster hash tag). Use e.g. `rein` or
    /// `myapp:rl`.
    #[error("invalid key prefix {0:?}: 1 to 64 printable ASCII bytes, no braces or spaces")]
    InvalidPrefix(String),
    /// A duration that must be positive is zero (the deadline or the connect timeout).
    #[error("{0} must be longer than zero")]
    ZeroDuration(&'static str),
    /// A duration is longer than [`MAX_DURATION`](crate::MAX_DURATION), an hour (the
    /// deadline, the connect timeout or the overrides' staleness).
    #[error("{0} must be at most an hour")]
    TooLong(&'static str),
}

/// Sorts a redis-rs error by what the caller can do about it. `waited` is how long the
/// call had run, for a timeout.
pub(crate) fn store_error(e: RedisError, waited: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(waited);
    }
    // A script past `lua-time-limit` holds the server: this call did not run, and a later
    // one may (redis-rs has no kind of its own for it).
    if e.code() == Some("BUSY") {
        return StoreError::Connection(SourceError::new(e));
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            // Without room to resend it as `EVAL` (route.rs): the script did not run.
            | ServerErrorKind::NoScript,
        ) => StoreError::Connection(SourceError::new(e)),
        ErrorKind::Server(_)
        | ErrorKind::Extension
        | ErrorKind::AuthenticationFailed
        | ErrorKind::Client
        | ErrorKind::InvalidClientConfig => StoreError::Server(SourceError::new(e)),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType | ErrorKind::RESP3NotSupported => {
            StoreError::UnexpectedReply(e.to_string())
        }
        _ => StoreError::Connection(SourceError::new(e)),
    }
}

/// Whether the connection may be dead or out of step after `e`, so a store with a
/// connector should replace it.
pub(crate) fn suspects_connection(e: &StoreError) -> bool {
    !matches!(e, StoreError::Server(_))
}
