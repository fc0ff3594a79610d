//! The allow cache (opt-in, over-admitting): reuse a recent "allowed" from Redis a bounded
//! number of times without asking Redis again.
//!
//! This is the naive local cache of "allowed" decisions, made explicit and bounded. Every
//! reuse is an admission Redis never counts, so it admits more than the policy says. What
//! this module enforces is how much more:
//!
//! - A reuse needs a live entry for the same policy and key, created or refreshed by an
//!   admission from Redis, and a cost no larger than that admission's.
//! - Each entry opens a **window** of `ttl` at the local instant the admission arrived
//!   (not when its call was sent: calls in flight together may be answered in any order,
//!   and windows must not overlap). Within one window at most `max_reuses` requests are reused, however many more
//!   admissions Redis makes meanwhile (they refresh the figures, not the budget). A new
//!   window starts only with an admission from Redis after the old one ended, so one node's
//!   windows for a key never overlap.
//! - A reuse also needs the remaining capacity Redis last reported, minus the reuses since,
//!   to cover its cost: one node never reuses past what Redis said was left.
//! - A full cache stores no new entry (it never evicts a live one), so memory pressure can
//!   only reduce reuse.
//!
//! - A denial from Redis blocks reuse until the next admission but keeps the window and its
//!   spent budget, so no window is ever cut short and restarted.
//!
//! A new window starts only when no live entry exists, and an entry lives exactly until its
//! window ends (nothing removes or evicts a live one), so one node's windows for a key are
//! disjoint intervals of length `ttl`. Hence, per key and policy, for `N` nodes each with this cache, over
//! any interval of length `T`: reused requests ≤ `N × max_reuses × (⌈T / ttl⌉ + 1)`, each of
//! cost at most `c_max` (the largest cost Redis admitted for the key). docs/failure.md
//! states the bound with its derivation.

use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use rein_core::{Decision, Micros, Outcome, Timestamp};

use crate::bounded::{BoundedMap, CacheKey, Expiring, WhenFull};

/// Settings of the allow cache, enabled with
/// [`danger_allow_cache`](crate::ResilientLimiterBuilder::danger_allow_cache).
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use rein::AllowCacheConfig;
///
/// // At most 4 local reuses per key per 100 ms window on each node.
/// let config = AllowCacheConfig::new(Duration::from_millis(100), NonZeroU32::new(4).unwrap());
/// assert_eq!(config.max_reuses().get(), 4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllowCacheConfig {
    /// Length of one reuse window (`ttl`).
    ttl: Micros,
    /// Reuses per key per window (`max_reuses`).
    max_reuses: NonZeroU32,
    /// The most entries kept.
    max_entries: NonZeroUsize,
}

impl AllowCacheConfig {
    /// Windows of `ttl` (whole microseconds) with at most `max_reuses` reuses each, and
    /// room for 65 536 keys.
    pub fn new(ttl: Duration, max_reuses: NonZeroU32) -> Self {
        Self {
            ttl: Micros::from(ttl),
            max_reuses,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }

    /// The most keys cached at once (default 65 536). A full cache caches no new key until
    /// an entry's window ends.
    pub fn with_max_entries(mut self, max_entries: NonZeroUsize) -> Self {
        self.max_entries = max_entries;
        self
    }

    /// The window length `ttl`.
    pub fn ttl(&self) -> Duration {
        self.ttl.into()
    }

    /// Reuses per key per window.
    pub fn max_reuses(&self) -> NonZeroU32 {
        self.max_reuses
    }
}

/// Recent admissions by (policy, key), each with its window's reuse budget.
pub(crate) struct AllowCache {
    map: BoundedMap<Grant>,
    ttl: Micros,
    max_reuses: u32,
}

/// The admissions Redis made for one (policy, key) within one window.
struct Grant {
    /// The end of the window: its start (when the admission that opened it arrived) + `ttl`.
    window_end: Timestamp,
    /// Reuses already made in this window.
    reuses: u32,
    /// The cost of the latest admission: reuses may cost this much at most.
    cost: u64,
    /// What Redis last reported remaining, minus the cost of reuses since.
    remaining: u64,
    /// Redis's latest admission, for the figures of a reuse.
    decision: Decision,
}

impl AllowCache {
    pub(crate) fn new(config: AllowCacheConfig) -> Self {
        Self {
            map: BoundedMap::new(config.max_entries, WhenFull::Refuse),
            ttl: config.ttl,
            max_reuses: config.max_reuses.get(),
        }
    }

    /// Reuses a cached admission for `cost` at `now` if the window, its budget and the
    /// remaining capacity allow, and says so.
    pub(crate) fn check(&self, now: Timestamp, at: CacheKey<'_>, cost: u64) -> Option<Decision> {
        self.map
            .get(now, at, |grant| {
                let fits =
                    cost <= grant.cost && grant.reuses < self.max_reuses && grant.remaining >= cost;
                fits.then(|| {
                    grant.reuses += 1;
                    grant.remaining -= cost;
                    Decision {
                        outcome: Outcome::Allowed,
                        limit: grant.decision.limit,
                        remaining: grant.remaining,
                        retry_after: Micros::ZERO,
                        reset_after: grant.decision.reset_after,
                        limit_index: grant.decision.limit_index,
                    }
                })
            })
            .flatten()
    }

    /// Records an admission from Redis that arrived at `now`: opens a window at `now` if
    /// none is live, otherwise refreshes the figures and keeps the budget.
    pub(crate) fn record(&self, now: Timestamp, at: CacheKey<'_>, cost: u64, decision: &Decision) {
        if !decision.is_allowed() || cost == 0 {
            return;
        }
        self.map.upsert(now, at, |live| match live {
            Some(grant) => Grant {
                window_end: grant.window_end,
                reuses: grant.reuses,
                cost,
                remaining: decision.remaining,
                decision: *decision,
            },
            None => Grant {
                window_end: now.saturating_add(self.ttl),
                reuses: 0,
                cost,
                remaining: decision.remaining,
                decision: *decision,
            },
        });
    }

    /// Stops reuse for `at` after Redis denied it: reusing an older admission
    /// would only add to an exhausted limit. The entry, its window and its spent budget
    /// stay, so a denial never opens a window early; an admission within the window
    /// refreshes the remaining capacity and reuse resumes within the same budget.
    pub(crate) fn block(&self, now: Timestamp, at: CacheKey<'_>) {
        self.map.get(now, at, |grant| grant.remaining = 0);
    }
}

impl Expiring for Grant {
    fn expires_at(&self) -> Timestamp {
        self.window_end
    }

    /// A full allow cache stores nothing new and evicts nothing.
    fn guards(&self) -> bool {
        false
    }
}

/// 65 536 keys: about 10 MiB with short keys, and more keys than one node usually admits
/// within a window of tens of milliseconds.
const DEFAULT_MAX_ENTRIES: NonZeroUsize = NonZeroUsize::new(1 << 16).expect("nonzero");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::k;

    const MS: u64 = 1_000;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_micros(ms * MS)
    }

    fn allowed(remaining: u64) -> Decision {
        Decision {
            outcome: Outcome::Allowed,
            limit: 100,
            remaining,
            retry_after: Micros::ZERO,
            reset_after: Micros::from_millis(500),
            limit_index: 0,
        }
    }

    fn cache(max_reuses: u32) -> AllowCache {
        AllowCache::new(AllowCacheConfig::new(
            Duration::from_millis(100),
            NonZeroU32::new(max_reuses).unwrap(),
        ))
    }

    #[test]
    fn reuses_at_most_max_reuses_per_window_however_often_redis_admits() {
        let cache = cache(3);
        assert_eq!(
            cache.check(at(0), k(0, b"k"), 1),
            None,
            "nothing cached yet"
        );
        cache.record(at(1), k(0, b"k"), 1, &allowed(50));
        for remaining in [49, 48, 47] {
            let d = cache.check(at(2), k(0, b"k"), 1).expect("a reuse");
            assert_eq!(d.remaining, remaining);
        }
        assert_eq!(cache.check(at(2), k(0, b"k"), 1), None, "budget spent");
        // Redis admits again within the window: figures refresh, the budget does not.
        cache.record(at(11), k(0, b"k"), 1, &allowed(40));
        assert_eq!(cache.check(at(12), k(0, b"k"), 1), None);
        // The window ends 100 ms after the first admission arrived, not after the last one:
        // an admission at 100 ms still refreshes the old window.
        cache.record(at(100), k(0, b"k"), 1, &allowed(35));
        assert_eq!(cache.check(at(100), k(0, b"k"), 1), None);
        // A new admission after the end (101 ms) opens a new window with a new budget.
        cache.record(at(101), k(0, b"k"), 1, &allowed(30));
        assert!(cache.check(at(101), k(0, b"k"), 1).is_some());
        assert!(cache.check(at(200), k(0, b"k"), 1).is_some());
        assert_eq!(cache.check(at(201), k(0, b"k"), 1), None, "window over");
    }

    #[test]
    fn reuses_need_a_cost_no_larger_and_capacity_redis_reported() {
        let cache = cache(10);
        cache.record(at(0), k(0, b"k"), 2, &allowed(5));
        assert_eq!(
            cache.check(at(1), k(0, b"k"), 3),
            None,
            "costlier than admitted"
        );
        assert_eq!(
            cache.check(at(1), k(0, b"k"), 2).map(|d| d.remaining),
            Some(3)
        );
        assert_eq!(
            cache.check(at(1), k(0, b"k"), 2).map(|d| d.remaining),
            Some(1)
        );
        assert_eq!(cache.check(at(1), k(0, b"k"), 2), None, "1 left, 2 asked");
        assert_eq!(
            cache.check(at(1), k(0, b"k"), 1).map(|d| d.remaining),
            Some(0)
        );
        assert_eq!(cache.check(at(1), k(1, b"k"), 1), None, "another policy");
    }

    #[test]
    fn a_denial_blocks_reuse_without_resetting_the_window_budget() {
        let cache = cache(3);
        cache.record(at(0), k(0, b"k"), 1, &allowed(9));
        assert!(cache.check(at(1), k(0, b"k"), 1).is_some());
        cache.block(at(1), k(0, b"k"));
        assert_eq!(cache.check(at(1), k(0, b"k"), 1), None, "blocked");
        // Admitted again in the same window: two reuses left of three, not three.
        cache.record(at(2), k(0, b"k"), 1, &allowed(9));
        assert!(cache.check(at(3), k(0, b"k"), 1).is_some());
        assert!(cache.check(at(3), k(0, b"k"), 1).is_some());
        assert_eq!(cache.check(at(3), k(0, b"k"), 1), None);
    }

    #[test]
    fn denials_and_zero_costs_open_no_window() {
        let cache = cache(3);
        let mut denied = allowed(0);
        denied.outcome = Outcome::Denied;
        cache.record(at(2), k(0, b"k"), 1, &denied);
        cache.record(at(2), k(0, b"z"), 0, &allowed(9));
        assert_eq!(cache.check(at(3), k(0, b"k"), 1), None);
        assert_eq!(cache.check(at(3), k(0, b"z"), 0), None);
    }

    #[test]
    fn a_full_cache_refuses_new_keys_instead_of_evicting() {
        let config = AllowCacheConfig::new(Duration::from_millis(100), NonZeroU32::MIN)
            .with_max_entries(NonZeroUsize::MIN);
        let cache = AllowCache::new(config);
        cache.record(at(0), k(0, b"a"), 1, &allowed(9));
        cache.record(at(0), k(0, b"b"), 1, &allowed(9));
        assert!(cache.check(at(1), k(0, b"b"), 1).is_none(), "not stored");
        assert!(cache.check(at(1), k(0, b"a"), 1).is_some(), "not evicted");
        cache.record(at(100), k(0, b"b"), 1, &allowed(9));
        assert!(
            cache.check(at(100), k(0, b"b"), 1).is_some(),
            "room once a expired"
        );
    }
}
