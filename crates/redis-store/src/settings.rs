//! What both Redis stores are built with, written once: the key prefix, the deadline, the
//! connect timeout and the minimum TTL, with their defaults, their checks and their setters
//! (`shared_setters!`, expanded in `RedisStoreBuilder` and `OptimisticStoreBuilder`).

use std::time::Duration;

use rein_core::time::MAX_MICROS;

use crate::SettingsError;
use crate::store::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, MAX_DURATION};

/// The settings both builders hold.
#[derive(Clone, Debug)]
pub(crate) struct Shared {
    pub(crate) prefix: String,
    pub(crate) deadline: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) min_ttl: Duration,
}

impl Shared {
    /// The defaults: prefix `rein`, deadline 50 ms, connect timeout 1 s, no minimum TTL.
    pub(crate) fn new() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            deadline: rein_core::limiter::DEFAULT_DEADLINE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            min_ttl: Duration::ZERO,
        }
    }

    /// The prefix by the store's key rule, and each duration [`bounded`].
    pub(crate) fn validate(&self) -> Result<(), SettingsError> {
        crate::key::validate_prefix(&self.prefix)?;
        bounded("deadline", self.deadline)?;
        bounded("connect timeout", self.connect_timeout)?;
        Ok(())
    }

    /// The minimum TTL in whole milliseconds, rounded up, as the scripts take it.
    pub(crate) fn min_ttl_ms(&self) -> u64 {
        let ms = self.min_ttl.as_nanos().div_ceil(1_000_000);
        u64::try_from(ms).unwrap_or(u64::MAX).min(MAX_MICROS)
    }
}

/// A setting's duration, `name`d in the error: longer than zero, at most [`MAX_DURATION`].
pub(crate) fn bounded(name: &'static str, duration: Duration) -> Result<(), SettingsError> {
    if duration.is_zero() {
        Err(SettingsError::ZeroDuration(name))
    } else if duration > MAX_DURATION {
        Err(SettingsError::TooLong(name))
    } else {
        Ok(())
    }
}

/// The setters of [`Shared`]'s settings, for a builder with a `shared: Shared` field.
macro_rules! shared_setters {
    () => {
        /// The first part of every key (default `rein`): 1 to 64 printable ASCII bytes, no
        /// spaces or braces. Give each application, or each environment sharing a Redis, its
        /// own; a least-privilege ACL can then be limited to `~<prefix>:*`. Both Redis
        /// stores read and write the same keys under the same prefix, so they can serve one
        /// limit together.
        pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
            self.shared.prefix = prefix.into();
            self
        }

        /// The longest a call may take (default 50 ms), from asking for a connection to
        /// decoding the reply (a re-read of the overrides the call makes first included),
        /// through every attempt and backoff of the optimistic store.
        /// On expiry the call fails with a `Timeout` error and is not retried.
        pub fn deadline(mut self, deadline: std::time::Duration) -> Self {
            self.shared.deadline = deadline;
            self
        }

        /// The longest a connect may take (default 1 s), from the first byte to the scripts
        /// loaded: the first one, each background reconnect of a `RedisStore` built with
        /// `connect_with`, and each connect the optimistic store makes in the background when
        /// a call finds no idle connection (the call itself waits no longer than its
        /// deadline).
        pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.shared.connect_timeout = timeout;
            self
        }

        /// The shortest TTL a written key gets (default zero: a key expires as soon as its
        /// limit is full again). Key TTLs run on Redis's clock; raise this when a caller's
        /// `now` (`Some(now)` to `Limiter::acquire` and the rest) does not advance with it
        /// (tests, replays, simulators), or a key could expire while the caller's timeline
        /// still needs it. Rounded up to milliseconds.
        pub fn min_ttl(mut self, min_ttl: std::time::Duration) -> Self {
            self.shared.min_ttl = min_ttl;
            self
        }
    };
}
pub(crate) use shared_setters;
