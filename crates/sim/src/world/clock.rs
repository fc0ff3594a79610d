//! Simulated time, true and skewed.
//!
//! Every host reads turmoil's simulated wall clock (`Builder::epoch` plus simulated elapsed
//! time, with sub-tick resolution from the host's paused tokio clock): that is the **true**
//! time the oracle judges by. A node's own clock, which it passes to `acquire_at` in
//! client-time mode, is the true time plus the node's fixed offset. turmoil has no skew of
//! its own. Nothing here reads `SystemTime` or `std::time::Instant`, which are the real
//! machine's clocks under turmoil.

use std::time::{Duration, UNIX_EPOCH};

use rein_core::Timestamp;

/// The world's epoch: 2023-11-14 22:13:20 UTC, far from both ends of `Timestamp`'s range.
pub const EPOCH_SECS: u64 = 1_700_000_000;

/// The epoch as turmoil's builder wants it.
pub fn epoch() -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_secs(EPOCH_SECS)
}

/// The true simulated time. Outside a running host (between steps), the epoch.
pub fn true_now() -> Timestamp {
    let since = turmoil::since_epoch().unwrap_or(Duration::from_secs(EPOCH_SECS));
    Timestamp::from_micros(u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
}

/// One node's clock: true time shifted by a fixed offset in µs (negative: behind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skew {
    /// The offset from true time, in µs.
    pub offset_us: i64,
}

impl Skew {
    /// What this node's clock reads at true instant `at` (saturating at the epoch).
    pub fn read(&self, at: Timestamp) -> Timestamp {
        Timestamp::from_micros(at.as_micros().saturating_add_signed(self.offset_us))
    }
}

/// The start of the run: demand is due from here on, the charts' zero.
pub fn start() -> Timestamp {
    Timestamp::from_micros(EPOCH_SECS * 1_000_000 + WARMUP.as_micros() as u64)
}

/// Time before demand starts, for nodes to connect: the true clock's zero is this much
/// after the epoch.
pub(crate) const WARMUP: Duration = Duration::from_millis(200);
