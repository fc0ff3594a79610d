//! Rate shares in process: the state of
//! [`Leasable::share_rate`](rein_core::Leasable::share_rate) for a policy of one token
//! bucket, one [`RateState`] per key under one lock.
//!
//! Every key of a leased token bucket is decided here, the cold ones by direct decisions,
//! the hot ones by shares; one mutex over one map, separate from the shard tables because
//! the state is another shape (docs/leases.md). Memory is bounded: when the map is full, a
//! state that may be forgotten ([`RateShares::is_forgettable`]) is dropped, then states
//! holding no live share, those nearest full, an eighth of the table at a time (the shard
//! tables' eviction, which forgets those keys' draws, so each may be admitted that much
//! again). Only when every
//! key held holds shares is a new key answered as one that may reserve nothing (a take is
//! told to decide directly, a direct decision is denied until room comes): evicting a key
//! whose shares may still be spent would forget reserved rate, over-admission without
//! bound. (Before, cold keys' draws filled the map too, and every new key was denied.)

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use rein_core::{
    DecideError, Decision, Micros, Outcome, Policy, Timestamp,
    rate_share::{RateAnswer, RateOp, RateShares, RateState, ShareError, Taken},
    token_bucket::TokenBucketState,
};

/// Where a key's plain bucket state lives (the shard tables), for a key the rate-share table
/// meets first: see [`RateTable::apply`]. Both run under the table's lock.
pub(crate) trait PlainBucket {
    /// The key's plain state (a full bucket's for a key it does not hold).
    fn read(&self) -> TokenBucketState;
    /// Drops the key's plain state.
    fn forget(self);
}

/// The rate-share states of one policy's keys.
pub(crate) struct RateTable<K> {
    shares: RateShares,
    max_keys: usize,
    states: Mutex<HashMap<K, RateState>>,
    /// Whether any state was ever stored: until then [`holds`](Self::holds) answers without
    /// the lock, so a plain bucket's refunds and operators' changes (leases off) never take
    /// it.
    used: AtomicBool,
}

impl<K> RateTable<K> {
    /// The table for `policy`, or `None` if it is not one shareable token bucket.
    pub(crate) fn new(policy: &Policy, max_keys: usize) -> Option<Self> {
        let [rein_core::Limit::TokenBucket(bucket)] = policy.limits() else {
            return None;
        };
        Some(Self {
            shares: RateShares::new(bucket).ok()?,
            max_keys,
            states: Mutex::new(HashMap::new()),
            used: AtomicBool::new(false),
        })
    }
}

impl<K: Hash + Eq> RateTable<K> {
    /// Whether `key` holds a rate-share state at `now` (shares not ended, or a direct share
    /// not yet full): one that may be forgotten is as none, as its Redis key would have
    /// expired.
    pub(crate) fn holds<Q>(&self, now: Timestamp, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.used.load(Ordering::Relaxed) {
            return false;
        }
        let states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        states
            .get(key)
            .is_some_and(|state| !self.shares.is_forgettable(now, state))
    }

    /// Forgets `key`'s rate-share state (an operator's reset, as Redis's `DEL`): its
    /// direct share is full again, while nodes spend the shares they hold until those end.
    /// Whether it held one at `now`.
    pub(crate) fn remove<Q>(&self, now: Timestamp, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        states
            .remove(key)
            .is_some_and(|state| !self.shares.is_forgettable(now, &state))
    }
}

impl<K: Hash + Eq + Clone> RateTable<K> {
    /// Runs `op` on `key`'s state at `now`.
    ///
    /// A new key whose state must be kept while every held key may still hold shares is
    /// not stored, and its request is answered as one that reserves nothing: a take with
    /// [`Taken::Full`] (decide directly), a direct decision with a denial until the
    /// soonest held key may be forgotten. A full table is a local bound reached, not a
    /// store failure: it must not trip a breaker or fall to a failure policy that admits.
    ///
    /// A key this table does not hold starts from its plain bucket's state, `plain.read()`
    /// ([`RateShares::adopt`]: an operator's penalty of a key not yet shared holds for the
    /// leases); once the adopted state is kept (or may be forgotten), `plain.forget()`
    /// drops the plain one, so that the key has one state (an `op` the core refuses leaves
    /// both as they were).
    pub(crate) fn apply(
        &self,
        now: Timestamp,
        key: &K,
        op: RateOp,
        plain: impl PlainBucket,
    ) -> Result<RateAnswer, DecideError> {
        // No user code runs under the lock but `K`'s Hash and Eq; a poisoned map is still
        // consistent (the core's transitions do not panic), so it is recovered.
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        // A state that may be forgotten is as none (its Redis key would have expired): the
        // key's plain state, if an operator changed it since, is adopted.
        let is_new = !states.contains_key(key);
        let held = states
            .get(key)
            .filter(|state| !self.shares.is_forgettable(now, state))
            .cloned();
        let adopting = held.is_none();
        let mut state = held.unwrap_or_else(|| self.shares.adopt(now, &plain.read()));
        let answer = self.shares.apply(now, &mut state, op)?;
        if self.shares.is_forgettable(now, &state) {
            states.remove(key);
            if adopting {
                plain.forget();
            }
            return Ok(answer);
        }
        if is_new && states.len() >= self.max_keys {
            let shares = self.shares;
            states.retain(|_, state| !shares.is_forgettable(now, state));
            if states.len() >= self.max_keys && !self.evict_nearest_full(now, &mut states) {
                // The plain state stays where it is, read again when room comes.
                return Ok(self.no_room(now, &states, op));
            }
        }
        self.used.store(true, Ordering::Relaxed);
        states.insert(key.clone(), state);
        if adopting {
            plain.forget();
        }
        Ok(answer)
    }

    /// Drops the states holding no live share at `now` that are nearest full (the most left
    /// in their bucket, as of `now`), an eighth of the table at a time as the shard tables
    /// evict: `false` if every state holds a live share.
    fn evict_nearest_full(&self, now: Timestamp, states: &mut HashMap<K, RateState>) -> bool
    where
        K: Hash + Eq + Clone,
    {
        let ended = |share: &rein_core::rate_share::Share| share.end() <= now;
        let mut cold: Vec<(u64, K)> = states
            .iter()
            .filter(|(_, state)| state.shares.iter().all(ended))
            .map(|(key, state)| {
                // A zero-cost direct decision: the bucket's level as of now, nothing taken.
                let left = match self
                    .shares
                    .apply(now, &mut state.clone(), RateOp::Direct(0))
                {
                    Ok(RateAnswer::Decided(d)) => d.remaining,
                    _ => 0,
                };
                (left, key.clone())
            })
            .collect();
        if cold.is_empty() {
            return false;
        }
        let batch = (self.max_keys / crate::shard::EVICTION_FRACTION).clamp(1, cold.len());
        cold.select_nth_unstable_by(batch - 1, |a, b| b.0.cmp(&a.0));
        for (_, key) in cold.drain(..batch) {
            states.remove(&key);
        }
        true
    }

    /// `Err` if the core refuses `op` whatever the state (a node id, a demand or a cost out
    /// of range).
    pub(crate) fn check(&self, now: Timestamp, op: RateOp) -> Result<(), DecideError> {
        self.shares
            .apply(now, &mut RateState::default(), op)
            .map(|_| ())
            .map_err(DecideError::from)
    }

    /// The answer to `op` for a new key the full table cannot hold: a take is told to
    /// decide directly, and a direct decision is denied until room comes (a held key's last
    /// share ends, or its state may be forgotten: its TTL after its last write). A return never lands here: a key
    /// holding nothing has nothing to give back, and it is answered as not applied.
    fn no_room(&self, now: Timestamp, states: &HashMap<K, RateState>, op: RateOp) -> RateAnswer {
        match op {
            RateOp::Take(_) => RateAnswer::Taken(Taken::Full),
            RateOp::Return(_) => RateAnswer::Returned(false),
            RateOp::Direct(_) => {
                // Room comes when a state may be forgotten, or its last share ends (then
                // it may be evicted), whichever is first.
                let room_at = states
                    .values()
                    .map(|s| {
                        let forgotten =
                            s.at.as_micros()
                                .saturating_add(self.shares.ttl(s).as_micros());
                        let shares_end = s
                            .shares
                            .iter()
                            .map(|share| share.end().as_micros())
                            .max()
                            .unwrap_or(0);
                        forgotten.min(shares_end)
                    })
                    .min()
                    .unwrap_or(0);
                let wait = Micros::from_micros(room_at.saturating_sub(now.as_micros()).max(1));
                RateAnswer::Decided(Decision {
                    outcome: Outcome::Denied,
                    limit: self.shares.capacity(),
                    remaining: 0,
                    retry_after: wait,
                    reset_after: wait,
                    limit_index: 0,
                })
            }
        }
    }
}

/// For a policy that cannot be shared.
pub(crate) fn not_shareable() -> DecideError {
    ShareError::NotShareable.into()
}

#[cfg(test)]
mod tests {
    use rein_core::rate_share::{
        RateAnswer, RateOp, RateShares, RateState, ReturnRequest, ShareError, TakeRequest, Taken,
    };
    use rein_core::{DecideError, Limit, Micros, OverCapacity, Policy, Timestamp};

    use rein_core::token_bucket::TokenBucketState;

    use super::{PlainBucket, RateTable};

    /// A key with no plain state.
    struct NoPlain;

    impl PlainBucket for NoPlain {
        fn read(&self) -> TokenBucketState {
            TokenBucketState::default()
        }

        fn forget(self) {}
    }

    fn take(node: u64, seq: u64) -> RateOp {
        RateOp::Take(TakeRequest {
            node,
            held: 0,
            seq,
            applied: 0,
            demand: 10,
            validity: Micros::from_millis(100),
        })
    }

    fn at(micros: u64) -> Timestamp {
        Timestamp::from_micros(micros)
    }

    fn denied_for(answer: Result<RateAnswer, DecideError>) -> Option<u64> {
        match answer {
            Ok(RateAnswer::Decided(d)) if !d.is_allowed() => Some(d.retry_after.as_micros()),
            _ => None,
        }
    }

    /// A table of two keys, both holding shares. A third key is answered as one that may
    /// reserve nothing, never as a store failure (which would trip a breaker, or fall to a
    /// failure policy that admits): its take is told to decide directly, its direct
    /// decision is denied until the first held key's last share ends, and at that instant it
    /// gets in. The held keys are served throughout.
    #[test]
    fn a_full_table_answers_a_new_key_as_reserving_nothing() {
        let bucket = Limit::token_bucket(10, 10, Micros::from_secs(1)).unwrap();
        let table = RateTable::new(&Policy::single(bucket), 2).unwrap();
        let Limit::TokenBucket(tb) = bucket else {
            unreachable!()
        };
        let shares = RateShares::new(&tb).unwrap();
        let granted = |answer| matches!(answer, Ok(RateAnswer::Taken(Taken::Granted(_))));
        assert!(granted(table.apply(at(0), &"a", take(1, 1), NoPlain)));
        assert!(granted(table.apply(at(1_000), &"b", take(1, 1), NoPlain)));
        // When "a" may go: its share's end (its state may be forgotten only later).
        let mut a = RateState::default();
        shares.apply(at(0), &mut a, take(1, 1)).unwrap();
        let room = a.shares[0].end().as_micros();
        assert!(
            room >= 100_000 && room < a.at.as_micros() + shares.ttl(&a).as_micros(),
            "a share of 100 ms holds the key that long, and its state longer"
        );

        let now = at(50_000);
        assert!(matches!(
            table.apply(now, &"c", take(2, 1), NoPlain),
            Ok(RateAnswer::Taken(Taken::Full))
        ));
        assert_eq!(
            denied_for(table.apply(now, &"c", RateOp::Direct(1), NoPlain)),
            Some(room - 50_000)
        );
        // What keeps no state is answered as for any key.
        assert!(matches!(
            table.apply(now, &"c", RateOp::Direct(0), NoPlain),
            Ok(RateAnswer::Decided(d)) if d.is_allowed()
        ));
        let give_back = RateOp::Return(ReturnRequest {
            node: 2,
            id: 1,
            seq: 2,
            units: 5,
        });
        assert!(matches!(
            table.apply(now, &"c", give_back, NoPlain),
            Ok(RateAnswer::Returned(false))
        ));
        assert!(matches!(
            table.apply(now, &"c", RateOp::Direct(11), NoPlain),
            Err(DecideError::InvalidShare(ShareError::InsufficientCapacity(
                OverCapacity {
                    cost: 11,
                    capacity: 10
                }
            )))
        ));
        // The held keys renew while the table is full.
        assert!(granted(table.apply(now, &"a", take(1, 2), NoPlain)));
        // A µs before "b"'s share ends ("a"'s, renewed at 50 ms, ends later): denied; then
        // "b", holding no live share, is dropped for the new key.
        let mut b = RateState::default();
        shares.apply(at(1_000), &mut b, take(1, 1)).unwrap();
        let room = b.shares[0].end().as_micros();
        assert_eq!(
            denied_for(table.apply(at(room - 1), &"c", RateOp::Direct(1), NoPlain)),
            Some(1)
        );
        assert!(matches!(
            table.apply(at(room), &"c", RateOp::Direct(1), NoPlain),
            Ok(RateAnswer::Decided(d)) if d.is_allowed()
        ));
    }

    /// Cold keys, decided directly, hold no shares: a full table drops the one nearest full
    /// (the most left) for a new key, as the shard tables evict, so fabricated keys
    /// cannot lock every new client out (before, each new key was denied once cold keys'
    /// draws had filled the table). A key holding shares is never dropped.
    #[test]
    fn a_full_table_drops_a_cold_key_nearest_full_for_a_new_one() {
        let bucket = Limit::token_bucket(10, 10, Micros::from_secs(1)).unwrap();
        let table = RateTable::new(&Policy::single(bucket), 2).unwrap();
        let admitted = |answer| matches!(answer, Ok(RateAnswer::Decided(d)) if d.is_allowed());
        assert!(admitted(table.apply(
            at(0),
            &"deep",
            RateOp::Direct(5),
            NoPlain
        )));
        assert!(admitted(table.apply(
            at(0),
            &"shallow",
            RateOp::Direct(1),
            NoPlain
        )));
        assert!(admitted(table.apply(
            at(1),
            &"new",
            RateOp::Direct(1),
            NoPlain
        )));
        // "shallow" went: its next decision finds a full bucket; "deep" kept its draw.
        assert!(matches!(
            table.apply(at(2), &"deep", RateOp::Direct(6), NoPlain),
            Ok(RateAnswer::Decided(d)) if !d.is_allowed()
        ));
        // A key holding a share stays; with both held keys sharing, a new key waits.
        assert!(matches!(
            table.apply(at(3), &"deep", take(1, 1), NoPlain),
            Ok(RateAnswer::Taken(Taken::Granted(_)))
        ));
        assert!(matches!(
            table.apply(at(3), &"new", take(1, 1), NoPlain),
            Ok(RateAnswer::Taken(Taken::Granted(_)))
        ));
        assert!(denied_for(table.apply(at(4), &"other", RateOp::Direct(1), NoPlain)).is_some());
    }
}
