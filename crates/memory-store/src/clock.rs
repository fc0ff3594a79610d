//! Where the clock-reading conveniences get `now`: the only place rein-memory reads time.
//!
//! rein-core takes `now` as a parameter and never reads a clock; this adapter is what lets
//! [`MemoryLimiter::acquire`](crate::MemoryLimiter::acquire) offer a one-argument call
//! anyway. Everything that decides goes through the `*_at` methods with an explicit
//! [`Timestamp`], so a test or a caller with its own notion of time never needs a clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rein_core::{Micros, Timestamp};

/// A source of the current time, as microseconds since the Unix epoch.
///
/// Implementations should be cheap: the clock is read once per call of the clock-reading
/// conveniences, inside no lock. They need not be monotonic (rein-core tolerates a clock
/// that goes backwards), but see [`MemoryLimiter`](crate::MemoryLimiter) for what a
/// regression can and cannot do.
pub trait Clock {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The wall clock: [`SystemTime::now`], in microseconds since the Unix epoch.
///
/// A reading before the epoch (a badly set clock) is [`Timestamp::EPOCH`], one after the
/// year 2112 is [`Timestamp::MAX`]; neither panics. The same clock in every process gives
/// timestamps that mean the same instant, which is what a store shared with Redis needs.
///
/// ```
/// use rein_memory::{Clock, SystemClock};
///
/// let now = SystemClock.now();
/// assert!(now.as_micros() > 1_600_000_000_000_000); // after September 2020
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Timestamp {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            // Whole seconds and the sub-second part avoid `Duration::as_micros`'s u128.
            Ok(d) => Timestamp::from_micros(
                d.as_secs()
                    .saturating_mul(1_000_000)
                    .saturating_add(u64::from(d.subsec_micros())),
            ),
            Err(_) => Timestamp::EPOCH,
        }
    }
}

/// The wall clock read once, then advanced by the CPU's timestamp counter: cheaper than
/// [`SystemClock`], and it does not go backwards (beyond the counters' skew between cores,
/// nanoseconds where the TSC is used).
///
/// At construction it reads [`SystemTime::now`] once; every later reading adds the time
/// elapsed since then on a [`quanta::Clock`], which reads the TSC (calibrated against the
/// OS's monotonic clock once per process, up to 200 ms on the first construction) where
/// it is reliable and falls back to the OS monotonic clock elsewhere. On this project's
/// x86-64 machines a reading costs 2-3× less than `SystemTime::now()` (docs/performance.md),
/// which matters when the clock read is a third of a decision.
///
/// The price: it follows neither NTP steps nor manual changes of the wall clock after
/// construction, and drifts from it by the calibration error (parts per million). Its
/// timestamps are fine for limits kept in this process; when timestamps must agree with
/// other machines to the millisecond (a store shared through Redis), prefer
/// [`SystemClock`], or rebuild this clock now and then. Clones share the anchor.
///
/// ```
/// use rein_memory::{Clock, QuantaClock, SystemClock};
///
/// let clock = QuantaClock::new();
/// let (a, b) = (clock.now(), clock.now());
/// assert!(b >= a);
/// let wall = SystemClock.now().as_micros();
/// assert!(wall.abs_diff(b.as_micros()) < 1_000_000);
/// ```
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    /// The counter's raw value at construction.
    anchor_raw: u64,
    /// The wall clock at construction, in µs since the epoch.
    anchor_micros: u64,
}

impl QuantaClock {
    /// A clock anchored to the wall clock now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let anchor_raw = clock.raw();
        Self {
            clock,
            anchor_raw,
            anchor_micros: SystemClock.now().as_micros(),
        }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> Timestamp {
        // Zero, not a wrap, if another core's counter reads slightly behind the anchor.
        let nanos = self.clock.delta_as_nanos(self.anchor_raw, self.clock.raw());
        // No overflow for 500 000 years of uptime; `from_micros` clamps past 2112.
        Timestamp::from_micros(self.anchor_micros + nanos / 1_000)
    }
}

/// A clock that moves only when told to; its clones share one time.
///
/// Hand one clone to a [`MemoryLimiter`](crate::MemoryLimiter) and keep another to drive
/// it, as with governor's `FakeRelativeClock`. It can also be [`set`](Self::set) backwards,
/// to test what a regressed clock does.
///
/// ```
/// use rein_core::{Micros, Timestamp};
/// use rein_memory::{Clock, FakeClock};
///
/// let clock = FakeClock::new(Timestamp::from_micros(1_000));
/// let shared = clock.clone();
/// clock.advance(Micros::from_micros(500));
/// assert_eq!(shared.now(), Timestamp::from_micros(1_500));
/// shared.set(Timestamp::EPOCH);
/// assert_eq!(clock.now(), Timestamp::EPOCH);
/// ```
#[derive(Clone, Debug, Default)]
pub struct FakeClock {
    /// Microseconds since the epoch, shared by every clone.
    micros: Arc<AtomicU64>,
}

impl FakeClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            micros: Arc::new(AtomicU64::new(start.as_micros())),
        }
    }

    /// Moves every clone forward by `by`, stopping at [`Timestamp::MAX`].
    pub fn advance(&self, by: Micros) {
        // `fetch_update` never fails with a closure that always returns `Some`.
        let _ = self
            .micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |us| {
                Some(Timestamp::from_micros(us).saturating_add(by).as_micros())
            });
    }

    /// Sets every clone to `now`, forwards or backwards.
    pub fn set(&self, now: Timestamp) {
        self.micros.store(now.as_micros(), Ordering::Relaxed);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(self.micros.load(Ordering::Relaxed))
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}
