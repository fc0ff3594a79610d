//! [`DenyCache`]: answers a request Redis has just denied, locally, until Redis would admit
//! it, and never longer.
//!
//! When Redis denies a request (policy `p`, key `k`, cost `c`) with `retry_after = d`, the
//! same request stays denied for `d` if nothing else happens, and a request of a larger cost
//! at least as long (every rein algorithm is monotone in cost and time). Other traffic can
//! only lengthen that. So until `d` has passed, asking Redis again for `(p, k, c' ≥ c)` only
//! spends a round trip to learn "denied".
//!
//! The local expiry is `sent_at + d`, where `sent_at` is the local clock read *before* the
//! call was sent. Redis decided at some instant after that, so its denial lasted until at
//! least `sent_at + d` on any clock that runs at Redis's rate: the cached denial ends no
//! later than Redis's would. With Redis's own `TIME` (the default), a local clock slower than
//! Redis's by a rate `ρ` could stretch it by at most `ρ × d`; with the store's explicit-time
//! mode the two instants are the same number and the end is exact.
//!
//! Capacity this limiter gives back (a refund, a return of held units, an operator's change
//! through it) forgets the key's denial as it starts and again as it ends, and so does a
//! denial still in flight then: one from a call sent before the give-back ended may predate
//! it, so it is not cached (the key keeps a marker until every such call has ended, twice
//! `in_flight` after the give-back).
//!
//! What it cannot see: capacity given back by a refund made elsewhere (through the store
//! directly, or by another node) ends Redis's denial early while the cached one runs on.

use std::num::NonZeroUsize;

use rein_core::{Decision, Micros, Outcome, Timestamp};

use crate::bounded::{BoundedMap, CacheKey, Expiring, WhenFull};

/// Recent denials by (policy, key), at most `max_entries` of them.
///
/// A full cache evicts the denials that end soonest: it then asks Redis a little more
/// often, and never denies wrongly.
pub(crate) struct DenyCache {
    map: BoundedMap<Entry>,
    /// The longest a call to the store runs (the resilient limiter's deadline): a denial
    /// from a call sent before a give-back arrives within this of it.
    in_flight: Micros,
}

/// What the cache holds for a key.
enum Entry {
    /// A denial from Redis, answered locally until it ends.
    Denied(Denial),
    /// Capacity came back ([`Mark`]), and `after` is the latest denial from a call sent
    /// since, if any, answered while it holds. The mark stays under it: replaced, forgotten
    /// or ended, that denial must not let an older one in (before, it did).
    GivenBack { mark: Mark, after: Option<Denial> },
}

/// Capacity came back at `at`: a denial from a call sent at or before `at` may predate it,
/// and is not cached. Kept until every such call has ended (`until`).
#[derive(Clone, Copy)]
struct Mark {
    at: Timestamp,
    until: Timestamp,
}

/// One denial from Redis, as it was answered.
#[derive(Clone, Copy)]
struct Denial {
    /// The local instant the denial ends: `sent_at + retry_after`.
    until: Timestamp,
    /// The denied cost: requests costing at least this much are denied.
    cost: u64,
    /// The local instant read before the call was sent.
    sent_at: Timestamp,
    /// Redis's decision.
    decision: Decision,
}

impl DenyCache {
    pub(crate) fn new(max_entries: NonZeroUsize, in_flight: Micros) -> Self {
        Self {
            map: BoundedMap::new(max_entries, WhenFull::EvictSoonest),
            in_flight,
        }
    }

    /// A denial of `cost` at `now` if Redis recently denied this much or less, with
    /// `retry_after` counted down to the cached end.
    pub(crate) fn check(&self, now: Timestamp, at: CacheKey<'_>, cost: u64) -> Option<Decision> {
        self.map
            .get(now, at, |entry| {
                let denial = match entry {
                    Entry::Denied(denial) => denial,
                    Entry::GivenBack { after, .. } => after.as_ref()?,
                };
                // (Under a mark the entry may outlive its denial.)
                (cost >= denial.cost && now < denial.until).then(|| denial.answer(now))
            })
            .flatten()
    }

    /// Remembers `decision` if it is a denial, from the call sent at local `sent_at`.
    /// Denials with no wait (`retry_after` zero) and zero-cost requests are not cached.
    pub(crate) fn record(
        &self,
        sent_at: Timestamp,
        now: Timestamp,
        at: CacheKey<'_>,
        cost: u64,
        decision: &Decision,
    ) {
        if decision.is_allowed() || cost == 0 || decision.retry_after == Micros::ZERO {
            return;
        }
        let denial = Denial {
            until: sent_at.saturating_add(decision.retry_after),
            cost,
            sent_at,
            decision: *decision,
        };
        // The latest denial replaces an older one: it was judged on newer state, and its
        // end is still no later than Redis's for its own cost. One sent before capacity
        // came back may have been judged before it: the marker stays.
        self.map.upsert(now, at, |held| match held {
            Some(&Entry::GivenBack { mark, after }) => Entry::GivenBack {
                mark,
                after: if sent_at <= mark.at {
                    after
                } else {
                    Some(newest(after, denial))
                },
            },
            Some(&Entry::Denied(held)) => Entry::Denied(newest(Some(held), denial)),
            None => Entry::Denied(denial),
        });
    }

    /// Forgets the denial of `at`: Redis admitted something for it, so the state is not
    /// what the denial saw. A give-back's mark stays.
    pub(crate) fn forget(&self, now: Timestamp, at: CacheKey<'_>) {
        self.map.update(now, at, |entry| match entry {
            Entry::Denied(_) => None,
            Entry::GivenBack { mark, .. } => Some(Entry::GivenBack {
                mark: *mark,
                after: None,
            }),
        });
    }

    /// Capacity came back for `at` at `now`: forgets its denial, and refuses one from a
    /// call sent until now. Kept twice the longest call: a call's end is read a little
    /// after its deadline (the task must run again first).
    pub(crate) fn given_back(&self, now: Timestamp, at: CacheKey<'_>) {
        let until = now
            .saturating_add(self.in_flight)
            .saturating_add(self.in_flight);
        self.map.upsert(now, at, |_| Entry::GivenBack {
            mark: Mark { at: now, until },
            after: None,
        });
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// Of a held denial and a new one, the one from the later call: a reply that overtook an
/// older one keeps its place (the newer was judged on newer state).
fn newest(held: Option<Denial>, new: Denial) -> Denial {
    match held {
        Some(held) if held.sent_at > new.sent_at => held,
        _ => new,
    }
}

impl Denial {
    /// The denial as of `now`: Redis's figures, with the waits counted down.
    fn answer(&self, now: Timestamp) -> Decision {
        let elapsed = now.saturating_since(self.sent_at);
        let retry_after = self.until.saturating_since(now);
        let reset_left = self
            .decision
            .reset_after
            .as_micros()
            .saturating_sub(elapsed.as_micros());
        Decision {
            outcome: Outcome::Denied,
            limit: self.decision.limit,
            remaining: self.decision.remaining,
            retry_after,
            reset_after: Micros::from_micros(reset_left).max(retry_after),
            limit_index: self.decision.limit_index,
        }
    }
}

impl Expiring for Entry {
    fn expires_at(&self) -> Timestamp {
        match self {
            Entry::Denied(denial) => denial.until,
            Entry::GivenBack { mark, after } => {
                after.map_or(mark.until, |denial| denial.until.max(mark.until))
            }
        }
    }

    /// A mark keeps a denial that predates a give-back out: lost to a full shard, it would
    /// let one in (a wrong answer, where losing a denial only costs a call).
    fn guards(&self) -> bool {
        matches!(self, Entry::GivenBack { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::k;

    const MS: u64 = 1_000;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_micros(ms * MS)
    }

    fn denied(retry_ms: u64, reset_ms: u64) -> Decision {
        Decision {
            outcome: Outcome::Denied,
            limit: 10,
            remaining: 0,
            retry_after: Micros::from_millis(retry_ms),
            reset_after: Micros::from_millis(reset_ms),
            limit_index: 0,
        }
    }

    fn cache() -> DenyCache {
        DenyCache::new(NonZeroUsize::new(1_000).unwrap(), Micros::from_millis(50))
    }

    #[test]
    fn a_denial_is_answered_locally_until_sent_at_plus_retry_after_and_not_after() {
        let cache = cache();
        // Sent at 100 ms, answered at 130 ms: denied for 50 ms from when Redis decided.
        cache.record(at(100), at(130), k(0, b"k"), 2, &denied(50, 400));
        assert_eq!(cache.check(at(99), k(0, b"k"), 2).map(|d| d.retry_after), {
            // A clock read before the call (time going backwards) still answers, with the
            // full wait left.
            Some(Micros::from_millis(51))
        });
        let hit = cache.check(at(130), k(0, b"k"), 2).expect("cached");
        assert_eq!(hit.outcome, Outcome::Denied);
        assert_eq!(hit.retry_after, Micros::from_millis(20));
        assert_eq!(hit.reset_after, Micros::from_millis(370));
        assert_eq!((hit.limit, hit.remaining), (10, 0));
        // One microsecond before the end: still denied, 1 µs to wait.
        let last = Timestamp::from_micros(150 * MS - 1);
        assert_eq!(
            cache.check(last, k(0, b"k"), 2).map(|d| d.retry_after),
            Some(Micros::from_micros(1))
        );
        // At the end: not cached (Redis is asked), and the entry is gone.
        assert_eq!(cache.check(at(150), k(0, b"k"), 2), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn only_costs_at_least_the_denied_one_are_covered() {
        let cache = cache();
        cache.record(at(0), at(1), k(0, b"k"), 3, &denied(100, 100));
        assert!(cache.check(at(1), k(0, b"k"), 3).is_some());
        assert!(cache.check(at(1), k(0, b"k"), 7).is_some());
        assert_eq!(
            cache.check(at(1), k(0, b"k"), 2),
            None,
            "a smaller cost may fit"
        );
        assert_eq!(cache.check(at(1), k(1, b"k"), 3), None, "another policy");
        assert_eq!(cache.check(at(1), k(0, b"j"), 3), None, "another key");
        // A later denial of a smaller cost replaces it.
        cache.record(at(2), at(3), k(0, b"k"), 2, &denied(10, 10));
        assert!(cache.check(at(3), k(0, b"k"), 2).is_some());
        assert_eq!(cache.check(at(12), k(0, b"k"), 3), None);
        // An admission forgets it.
        cache.record(at(20), at(21), k(0, b"k"), 1, &denied(100, 100));
        cache.forget(at(21), k(0, b"k"));
        assert_eq!(cache.check(at(21), k(0, b"k"), 1), None);
    }

    /// A denial sent before capacity came back may have been judged before it: it is not
    /// cached, though its reply arrives after the give-back (before, a refund on this node
    /// could be hidden for a whole `retry_after` by a denial in flight when it ran).
    #[test]
    fn a_denial_in_flight_when_capacity_comes_back_is_not_cached() {
        let cache = cache();
        // t=0 a denial is cached; t=10 a refund gives capacity back: forgotten.
        cache.record(at(0), at(1), k(0, b"k"), 1, &denied(60_000, 60_000));
        cache.given_back(at(10), k(0, b"k"));
        assert_eq!(cache.check(at(11), k(0, b"k"), 1), None);
        // A call sent at t=10 or before, answered at t=30: not cached.
        cache.record(at(10), at(30), k(0, b"k"), 1, &denied(60_000, 60_000));
        assert_eq!(cache.check(at(31), k(0, b"k"), 1), None);
        // An admission does not lift the marker.
        cache.forget(at(35), k(0, b"k"));
        cache.record(at(5), at(40), k(0, b"k"), 1, &denied(60_000, 60_000));
        assert_eq!(cache.check(at(41), k(0, b"k"), 1), None);
        // A call sent after the give-back was judged on what came back: cached.
        cache.record(at(11), at(42), k(0, b"k"), 1, &denied(60_000, 60_000));
        assert!(cache.check(at(43), k(0, b"k"), 1).is_some());
        // The marker lasts twice as long as a call sent before it can run (50 ms), no
        // longer.
        cache.given_back(at(100), k(0, b"j"));
        assert_eq!(cache.len(), 2);
        cache.record(at(90), at(199), k(0, b"j"), 1, &denied(60_000, 60_000));
        assert_eq!(cache.check(at(199), k(0, b"j"), 1), None);
        assert_eq!(cache.check(at(200), k(0, b"j"), 1), None);
        assert_eq!(cache.len(), 1, "expired at 200 ms, dropped");
        // A reply that overtakes an older one keeps its place: sent at 300 and answered
        // first, then one sent at 250 (a longer wait, judged on older state).
        cache.record(at(300), at(301), k(0, b"m"), 1, &denied(10, 10));
        cache.record(at(250), at(305), k(0, b"m"), 1, &denied(60_000, 60_000));
        assert_eq!(
            cache.check(at(306), k(0, b"m"), 1).map(|d| d.retry_after),
            Some(Micros::from_millis(4)),
            "the newer, ending at 310"
        );
    }

    /// The mark outlives what stands over it: a later denial that replaced it, an
    /// admission that forgot that denial, that denial's end, and a full shard (which evicts
    /// marks last). In each case a reply from a call sent before the give-back, arriving
    /// after, is still not cached (before, each let it in, and it repeated a denial Redis no
    /// longer gave for its whole `retry_after`).
    #[test]
    fn a_mark_outlives_the_denials_and_evictions_over_it() {
        let cache = cache();
        let long = denied(60_000, 60_000);
        // Sent at 90, in flight over a give-back at 100; a call sent at 105 denied, then an
        // admission at 110 forgets that denial.
        cache.given_back(at(100), k(0, b"k"));
        cache.record(at(105), at(106), k(0, b"k"), 4, &denied(60_000, 60_000));
        assert!(
            cache.check(at(107), k(0, b"k"), 4).is_some(),
            "judged after it"
        );
        cache.forget(at(110), k(0, b"k"));
        cache.record(at(90), at(140), k(0, b"k"), 1, &long);
        assert_eq!(cache.check(at(141), k(0, b"k"), 1), None, "forgotten");
        // A later denial that ended (at 115) before the old reply arrived.
        cache.given_back(at(100), k(0, b"j"));
        cache.record(at(105), at(106), k(0, b"j"), 1, &denied(10, 10));
        assert_eq!(cache.check(at(120), k(0, b"j"), 1), None);
        cache.record(at(90), at(125), k(0, b"j"), 1, &long);
        assert_eq!(cache.check(at(126), k(0, b"j"), 1), None, "ended");
        // A full shard of two: a mark (until 200) and a denial (until 300 ms), then a third
        // key. The denial goes, though it ends later; the mark stays.
        let keys: Vec<Vec<u8>> = (0u32..)
            .map(|i| format!("key-{i}").into_bytes())
            .filter(|key| {
                (crate::bounded::fnv1a(key) as usize).is_multiple_of(crate::bounded::MAX_SHARDS)
            })
            .take(3)
            .collect();
        let small = DenyCache::new(
            NonZeroUsize::new(2 * crate::bounded::MAX_SHARDS).unwrap(),
            Micros::from_millis(50),
        );
        let (marked, held, third) = (k(0, &keys[0]), k(0, &keys[1]), k(0, &keys[2]));
        small.given_back(at(100), marked);
        small.record(at(100), at(101), held, 1, &denied(200, 200));
        small.record(at(102), at(103), third, 1, &long);
        assert_eq!(small.len(), 2);
        assert!(small.check(at(104), held, 1).is_none(), "evicted");
        small.record(at(90), at(150), marked, 1, &long);
        assert_eq!(small.check(at(151), marked, 1), None, "the mark held");
    }

    #[test]
    fn allowed_zero_wait_zero_cost_and_already_over_denials_are_not_cached() {
        let cache = cache();
        let mut allowed = denied(0, 10);
        allowed.outcome = Outcome::Allowed;
        cache.record(at(0), at(1), k(0, b"a"), 1, &allowed);
        cache.record(at(0), at(1), k(0, b"b"), 1, &denied(0, 10));
        cache.record(at(0), at(1), k(0, b"c"), 0, &denied(10, 10));
        // The reply came after the denial had ended already.
        cache.record(at(0), at(30), k(0, b"d"), 1, &denied(20, 20));
        assert_eq!(cache.len(), 0);
    }
}
