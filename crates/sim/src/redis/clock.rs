//! The only way the simulated Redis learns the time.
//!
//! Expiry, `TIME` and `redis.call('TIME')` inside scripts all read a [`Clock`] injected when
//! the node is built, never `SystemTime` or `std::time::Instant`: under turmoil those are the
//! real machine's clock and would make runs differ. [`Clock::turmoil`] reads turmoil's
//! simulated wall clock; [`ManualClock`] is the fake clock for tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rein_core::{Micros, Timestamp};

/// A source of "now" for one simulated Redis node.
///
/// Readings need not be monotonic: a clock that jumps back (a skewed or stepped host) is a
/// valid input and only changes which keys count as expired.
#[derive(Clone)]
pub struct Clock {
    source: Arc<dyn Fn() -> Timestamp + Send + Sync>,
}

impl Clock {
    /// A clock reading `source` on every use.
    pub fn from_fn(source: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        Self {
            source: Arc::new(source),
        }
    }

    /// turmoil's simulated wall clock: the `Builder::epoch` plus simulated elapsed time, the
    /// same for every host and unaffected by `bounce`.
    ///
    /// Read outside a running host (from the test body between `step`s), turmoil has no
    /// current time; the clock then repeats the last time it read, so inspecting a node
    /// between steps sees the state as of the last step rather than the Unix epoch.
    pub fn turmoil() -> Self {
        let last = Arc::new(AtomicU64::new(0));
        Self::from_fn(move || match turmoil::since_epoch() {
            Some(since_epoch) => {
                let micros = u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX);
                last.store(micros, Ordering::Relaxed);
                Timestamp::from_micros(micros)
            }
            None => Timestamp::from_micros(last.load(Ordering::Relaxed)),
        })
    }

    /// This clock shifted by `offset_micros` (negative: behind), saturating at the epoch.
    /// turmoil has no clock skew of its own; this is how one node's clock is made to differ.
    pub fn skewed(self, offset_micros: i64) -> Self {
        Self::from_fn(move || {
            let now = self.now().as_micros();
            Timestamp::from_micros(now.saturating_add_signed(offset_micros))
        })
    }

    /// The current time.
    pub fn now(&self) -> Timestamp {
        (self.source)()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clock").field("now", &self.now()).finish()
    }
}

/// A clock that moves only when told to. Clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            micros: Arc::new(AtomicU64::new(start.as_micros())),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Micros) {
        self.micros.fetch_add(by.as_micros(), Ordering::Relaxed);
    }

    /// Sets the clock, possibly backwards.
    pub fn set(&self, now: Timestamp) {
        self.micros.store(now.as_micros(), Ordering::Relaxed);
    }

    /// The time it shows.
    pub fn now(&self) -> Timestamp {
        Timestamp::from_micros(self.micros.load(Ordering::Relaxed))
    }

    /// A [`Clock`] reading this one.
    pub fn clock(&self) -> Clock {
        let this = self.clone();
        Clock::from_fn(move || this.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_one_time() {
        let manual = ManualClock::new(Timestamp::from_micros(10));
        let clock = manual.clock();
        manual.clone().advance(Micros::from_micros(5));
        assert_eq!(clock.now(), Timestamp::from_micros(15));
        manual.set(Timestamp::from_micros(3));
        assert_eq!(clock.now(), Timestamp::from_micros(3));
    }

    #[test]
    fn skew_shifts_and_saturates_at_the_epoch() {
        let manual = ManualClock::new(Timestamp::from_micros(1_000));
        assert_eq!(
            manual.clock().skewed(500).now(),
            Timestamp::from_micros(1_500)
        );
        assert_eq!(manual.clock().skewed(-5_000).now(), Timestamp::EPOCH);
    }

    #[test]
    fn turmoil_clock_outside_a_simulation_repeats_its_last_reading() {
        assert_eq!(Clock::turmoil().now(), Timestamp::EPOCH);
    }
}
