//! Errors: a denial is a [`Decision`](crate::Decision), never an `Err`. `Err` means the
//! configuration is invalid, the request can never fit, or persisted state is corrupt.

use thiserror::Error;

/// A limit or policy that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A quantity that must be positive was zero: a capacity, a refill amount, a period or
    /// a window. A zero limit would deny everything forever; use a deny rule instead.
    #[error("{what} must be at least 1")]
    Zero {
        /// Which setting.
        what: &'static str,
    },
    /// A quantity, or a product the algorithm computes from it, exceeds what stays exact
    /// in a double (2^52). Use a coarser unit, a shorter period or a smaller capacity.
    #[error("{what} is {value}, more than the exact maximum {max}")]
    TooLarge {
        /// Which setting or product.
        what: &'static str,
        /// Its value (saturated at `u64::MAX` when the product itself overflowed).
        value: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// The limit's span, the time from empty to full (a token bucket's `capacity × period
    /// / refill`, rounded up, or a window), exceeds [`MAX_SPAN`](crate::MAX_SPAN), about
    /// 8.9 years. A limit remembers instants up to one span ahead of `now`, and those must
    /// stay below [`MAX_MICROS`](crate::MAX_MICROS) (the year 2112). Use a shorter period,
    /// a smaller burst or a shorter window.
    #[error("{what} is {span} µs, longer than the maximum span {max} µs (about 8.9 years)")]
    SpanTooLong {
        /// Which setting or product.
        what: &'static str,
        /// The span in µs.
        span: u64,
        /// The longest accepted span in µs.
        max: u64,
    },
    /// A policy needs at least one limit.
    #[error("a policy needs at least one limit")]
    NoLimits,
    /// A policy name is empty, longer than 64 bytes, or holds a byte other than ASCII
    /// letters, digits, `_`, `-` and `.`. Names become part of every Redis key and header.
    /// Use e.g. `api-login`.
    #[error("invalid policy name {0:?}: 1 to 64 of A-Z a-z 0-9 _ - .")]
    InvalidName(String),
    /// More limits in one policy than [`MAX_LIMITS`](crate::policy::MAX_LIMITS).
    #[error("a policy holds at most {max} limits, got {got}")]
    TooManyLimits {
        /// How many were given.
        got: usize,
        /// The maximum.
        max: usize,
    },
}

/// A request whose cost exceeds the capacity it is decided against (a limit's, or a
/// policy's smallest limit's), so no amount of waiting admits it. Fix: split the request,
/// or raise the capacity. Every error that can say this nests this one type: the check and
/// its message are written here once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
#[error("cost {cost} exceeds capacity {capacity}: it can never be admitted")]
pub struct OverCapacity {
    /// The requested cost.
    pub cost: u64,
    /// The capacity it was checked against.
    pub capacity: u64,
}

impl OverCapacity {
    /// `Err` if `cost` exceeds `capacity`.
    #[inline]
    pub fn check(cost: u64, capacity: u64) -> Result<(), Self> {
        if cost > capacity {
            Err(Self { cost, capacity })
        } else {
            Ok(())
        }
    }
}

/// A request that can never be admitted, or state that does not belong to the limit.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum AcquireError {
    /// The cost exceeds the limit's capacity; see [`OverCapacity`].
    #[error(transparent)]
    InsufficientCapacity(#[from] OverCapacity),
    /// The state passed in was made for a different algorithm or policy shape (for
    /// example, a policy changed while its old state was still stored). The state is left
    /// untouched; start from a fresh state for the new policy.
    #[error("state does not match the limit's algorithm or the policy's shape")]
    StateMismatch,
}
