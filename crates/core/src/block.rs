//! [`Block`]: an operator's block of one key.

use crate::{Decision, Policy, Timestamp};

/// A key blocked until an instant (exclusive), whatever its limits have left.
///
/// A block replaces the key's counts: while it lasts every decision is denied with nothing
/// left and `retry_after` the time to its end; once it has ended the key is as one never
/// seen, full. That is the penalty box of the rate limiters that have one (a block after
/// abuse outlasts the window it was caught in, so what was counted before it is moot), and
/// it keeps a block one value a store can write, expire and read back in one step: the
/// Redis store keeps it in the policy's key, with the key's TTL ending when the block does.
///
/// ```
/// use rein_core::{Block, Limit, Micros, Policy, Timestamp};
///
/// let policy = Policy::single(Limit::fixed_window(10, Micros::from_secs(60))?);
/// let block = Block::until(Timestamp::from_micros(5_000_000));
/// let denied = block.decide(&policy, Timestamp::from_micros(2_000_000)).unwrap();
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after, Micros::from_secs(3));
/// // At its end the key is full again: the block no longer answers.
/// assert!(block.decide(&policy, Timestamp::from_micros(5_000_000)).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    until: Timestamp,
}

impl Block {
    /// A block that ends at `until`: decisions before it are denied.
    pub const fn until(until: Timestamp) -> Self {
        Self { until }
    }

    /// The instant the block ends.
    pub const fn ends_at(&self) -> Timestamp {
        self.until
    }

    /// Whether the block still holds at `now`.
    pub fn holds_at(&self, now: Timestamp) -> bool {
        now < self.until
    }

    /// How every decision on the blocked key answers at `now`, whatever its cost (an
    /// acquire, a peek, a lease's take): denied, nothing left, `retry_after` and
    /// `reset_after` the time until the block ends, and the policy's first limit named.
    /// `None` from its end on, when the key is as one never seen. A refund while it holds
    /// changes nothing: the block counts nothing to give back to.
    pub fn decide(&self, policy: &Policy, now: Timestamp) -> Option<Decision> {
        if !self.holds_at(now) {
            return None;
        }
        let left = self.until.saturating_since(now);
        let limit = policy.limits().first().map_or(0, |l| l.capacity());
        Some(Decision::denied(limit, 0, left, left))
    }
}
