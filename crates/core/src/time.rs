//! Time as plain integers: the only clock rein-core knows is the `now` its caller passes in.
//!
//! Both types count **microseconds** in a `u64` limited to [`MAX_MICROS`] (2^52 − 1, about
//! 142 years). The bound is what keeps the core exact when the same math runs as Lua inside
//! Redis, where numbers are IEEE doubles: every quantity stays below 2^52, so a sum of two
//! stays below 2^53 and is still an exact integer. A `Timestamp` counts from the Unix epoch,
//! so the range ends in the year 2112.

use std::time::Duration;

/// The largest value of a [`Timestamp`] or [`Micros`]: 2^52 − 1 µs.
pub const MAX_MICROS: u64 = (1 << 52) - 1;

/// The longest span a limit may cover: 2^48 µs, about 8.9 years.
///
/// A limit's span is how long it takes to go from empty to full again: a token bucket's
/// `capacity × period / refill`, or a window's length. A limit stores instants up to one
/// span ahead of `now` (a token bucket's `tat`), and they must stay representable, at most
/// [`MAX_MICROS`]. With spans capped at 2^48 µs that holds for every `now` up to
/// `MAX_MICROS − 2^48` (the year 2103); an uncapped span (say one token a week with a burst
/// of 5000, 96 years) would already pass the end of time today. Past that year, a request
/// whose state could not be stored exactly is denied, never admitted on a clamped state:
/// see docs/algorithms.md, "The end of time".
pub const MAX_SPAN: Micros = Micros::from_micros(1 << 48);

/// An instant, in microseconds since the Unix epoch, at most [`MAX_MICROS`].
///
/// Construction clamps rather than fails: a clock reading past the year 2112 is not a
/// state the limiter can do better with than "the end of time".
///
/// ```
/// use rein_core::{Micros, Timestamp};
/// let t = Timestamp::from_micros(1_000_000);
/// assert_eq!(t.saturating_add(Micros::from_millis(5)).as_micros(), 1_005_000);
/// assert_eq!(Timestamp::from_micros(u64::MAX).as_micros(), rein_core::time::MAX_MICROS);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Self = Self(0);
    /// The last representable instant.
    pub const MAX: Self = Self(MAX_MICROS);

    /// An instant `us` microseconds after the epoch, clamped to [`Timestamp::MAX`].
    pub const fn from_micros(us: u64) -> Self {
        Self(if us > MAX_MICROS { MAX_MICROS } else { us })
    }

    /// Microseconds since the epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// `self + d`, clamped to [`Timestamp::MAX`].
    pub const fn saturating_add(self, d: Micros) -> Self {
        Self::from_micros(self.0 + d.0)
    }

    /// `self - earlier`, or zero if `earlier` is later: a clock that went backwards yields
    /// no elapsed time, never a panic.
    pub const fn saturating_since(self, earlier: Timestamp) -> Micros {
        Micros(self.0.saturating_sub(earlier.0))
    }
}

/// A span of time in microseconds, at most [`MAX_MICROS`].
///
/// ```
/// use rein_core::Micros;
/// assert_eq!(Micros::from_secs(2).as_micros(), 2_000_000);
/// assert_eq!(std::time::Duration::from(Micros::from_millis(3)).as_micros(), 3_000);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Micros(u64);

impl Micros {
    /// No time at all.
    pub const ZERO: Self = Self(0);
    /// The longest representable span.
    pub const MAX: Self = Self(MAX_MICROS);

    /// `us` microseconds, clamped to [`Micros::MAX`].
    pub const fn from_micros(us: u64) -> Self {
        Self(if us > MAX_MICROS { MAX_MICROS } else { us })
    }

    /// `ms` milliseconds, clamped to [`Micros::MAX`].
    pub const fn from_millis(ms: u64) -> Self {
        Self::from_micros(ms.saturating_mul(1_000))
    }

    /// `s` seconds, clamped to [`Micros::MAX`].
    pub const fn from_secs(s: u64) -> Self {
        Self::from_micros(s.saturating_mul(1_000_000))
    }

    /// The span in microseconds.
    pub const fn as_micros(self) -> u64 {
        self.0
    }
}

impl From<Duration> for Micros {
    /// Truncates below one microsecond and clamps to [`Micros::MAX`].
    fn from(d: Duration) -> Self {
        Self::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

impl From<Micros> for Duration {
    fn from(m: Micros) -> Self {
        Duration::from_micros(m.0)
    }
}
