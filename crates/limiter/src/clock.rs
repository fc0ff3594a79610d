//! [`TokioClock`]: the resilient limiter's default local clock, read from `tokio::time`.

use rein_core::{Micros, Timestamp};
use rein_memory::Clock;
use tokio::time::Instant;

/// A monotonic clock on `tokio::time::Instant`, counting microseconds from when it was made.
///
/// The resilient limiter reads its local time (deny-cache expiry, allow-cache windows, the
/// breaker's timers, the fallback limiter, latencies) only through a
/// [`Clock`](rein_memory::Clock), and this is the default one. Reading tokio's clock rather
/// than the OS's is what lets the same code run under virtual time: `tokio::time::pause()`
/// in tests, and a turmoil simulation, where each host's tokio clock is simulated (add a
/// per-node offset with a clock of your own to model skew).
///
/// Its readings are not wall-clock time: [`Timestamp::EPOCH`] is the instant it was made,
/// so they must not be sent to Redis. Keep the default
/// [`TimeSource::Store`](crate::TimeSource::Store), or give the limiter a clock
/// that all nodes share (such as [`rein_memory::SystemClock`]) before choosing
/// [`TimeSource::LocalClock`](crate::TimeSource::LocalClock).
///
/// ```
/// use rein::memory::Clock;
/// use rein::TokioClock;
///
/// let clock = TokioClock::new();
/// let (a, b) = (clock.now(), clock.now());
/// assert!(b >= a);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock reading [`Timestamp::EPOCH`] now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        Timestamp::EPOCH.saturating_add(Micros::from(self.origin.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn it_follows_tokio_time_including_paused_time() {
        let clock = TokioClock::new();
        assert_eq!(clock.now(), Timestamp::EPOCH);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(clock.now(), Timestamp::from_micros(1_500_000));
    }
}
