//! The sharded tables behind [`MemoryLimiter`](crate::MemoryLimiter): locking, lookup,
//! and the eviction that keeps each shard within its share of `max_keys`.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::{DefaultHashBuilder, HashTable};
use rein_core::{AcquireError, Decision, Micros, Outcome, PolicyState, Timestamp};

use crate::rule::Rule;

/// A key's block, asked under the shard's lock when the shard does not hold the key:
/// `Some` with the block's answer, or `None` to judge the key full.
///
/// Asked again because a decision checks for a block before it takes the shard's lock:
/// one that found none, then waited for the lock while the key was blocked, would find
/// the key's state gone (a block forgets it) and judge it full, admitting up to the
/// capacity at once. A block is recorded before the state is removed
/// ([`MemoryLimiter::block_at`](crate::MemoryLimiter::block_at)), so such a decision,
/// reaching the shard after the removal, sees the block here; one reaching it before
/// decides on the old state, which the block then forgets, as if it came first.
pub(crate) trait Blocked: FnOnce() -> Option<Result<Decision, AcquireError>> {}

impl<F: FnOnce() -> Option<Result<Decision, AcquireError>>> Blocked for F {}

/// Keys spread over a power-of-two number of independently locked tables, each key's
/// state decided by `rule`.
pub(crate) struct Shards<K, R: Rule> {
    rule: R,
    /// A full state: what every absent key has.
    fresh: R::State,
    shards: Box<[Shard<K, R::State>]>,
    /// `shards.len() - 1`, to pick a shard from hash bits.
    mask: usize,
    /// How many keys each shard may hold: `max_keys / shards.len()`, at least 1.
    capacity: usize,
    /// foldhash, hashbrown's default: see [`SHARD_SHIFT`] for how its bits are shared.
    hasher: DefaultHashBuilder,
    /// Lock acquisitions that found their shard already locked (tests prove contention).
    #[cfg(test)]
    pub(crate) contended: std::sync::atomic::AtomicU64,
}

impl<K, R: Rule> Shards<K, R> {
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.capacity * self.shards.len()
    }
}

impl<K: Hash + Eq, R: Rule> Shards<K, R> {
    /// `shards` tables (a power of two) of `capacity` keys each.
    pub(crate) fn new(rule: R, shards: usize, capacity: usize) -> Self {
        debug_assert!(shards.is_power_of_two() && capacity > 0);
        Self {
            fresh: rule.fresh(),
            rule,
            shards: (0..shards).map(|_| Shard::default()).collect(),
            mask: shards - 1,
            capacity,
            hasher: DefaultHashBuilder::default(),
            #[cfg(test)]
            contended: Default::default(),
        }
    }

    /// Decides `key` at `now`. `blocked` is the key's block, asked again under the shard's
    /// lock before a key the shard does not hold is judged full (see [`Blocked`]).
    #[inline]
    pub(crate) fn acquire<Q>(
        &self,
        now: Timestamp,
        key: &Q,
        cost: u64,
        blocked: impl Blocked,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.lock(hash);
        if let Some((_, state)) = shard.table.find_mut(hash, |(k, _)| k.borrow() == key) {
            return self.rule.acquire(now, state, cost);
        }
        self.acquire_absent(&mut shard, hash, now, key, cost, blocked)
    }

    /// [`acquire`](Self::acquire)'s outcome and state change, without the figures.
    #[inline]
    pub(crate) fn try_acquire<Q>(
        &self,
        now: Timestamp,
        key: &Q,
        cost: u64,
        blocked: impl Blocked,
    ) -> Result<Outcome, AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.lock(hash);
        if let Some((_, state)) = shard.table.find_mut(hash, |(k, _)| k.borrow() == key) {
            return self.rule.try_acquire(now, state, cost);
        }
        self.acquire_absent(&mut shard, hash, now, key, cost, blocked)
            .map(|d| d.outcome)
    }

    #[inline]
    pub(crate) fn peek<Q>(
        &self,
        now: Timestamp,
        key: &Q,
        cost: u64,
        blocked: impl Blocked,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.lock(hash);
        if let Some((_, state)) = shard.table.find(hash, |(k, _)| k.borrow() == key) {
            return self.rule.peek(now, state, cost);
        }
        if let Some(answer) = blocked() {
            return answer;
        }
        let judged = now.max(shard.dropped_at);
        let decision = self.rule.peek(judged, &self.fresh, cost)?;
        Ok(counted_from(decision, judged.saturating_since(now)))
    }

    pub(crate) fn refund<Q>(&self, now: Timestamp, key: &Q, amount: u64) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.lock(hash);
        match shard.table.find_mut(hash, |(k, _)| k.borrow() == key) {
            Some((_, state)) => self.rule.refund(now, state, amount),
            // Absent means full: nothing to give back.
            None => Ok(()),
        }
    }

    /// [`acquire`](Self::acquire) for a lease ([`Rule::acquire_held`]); also returns the
    /// stamp: the instant decided at plus `hold`.
    pub(crate) fn acquire_held<Q>(
        &self,
        now: Timestamp,
        key: &Q,
        cost: u64,
        hold: Micros,
        blocked: impl Blocked,
    ) -> Result<(Decision, Timestamp), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.lock(hash);
        if let Some((_, state)) = shard.table.find_mut(hash, |(k, _)| k.borrow() == key) {
            let decision = self.rule.acquire_held(now, state, cost, hold)?;
            return Ok((decision, now.saturating_add(hold)));
        }
        if let Some(answer) = blocked() {
            return answer.map(|d| (d, now.saturating_add(hold)));
        }
        // As `acquire_absent`, out of the hot path: judged no earlier than the last drop.
        let judged = now.max(shard.dropped_at);
        let mut state = self.fresh.clone();
        let decision = self.rule.acquire_held(judged, &mut state, cost, hold)?;
        self.store_new(&mut shard, hash, judged, key, state);
        let decision = counted_from(decision, judged.saturating_since(now));
        Ok((decision, judged.saturating_add(hold)))
    }

    /// [`refund`](Self::refund) of held units ([`Rule::refund_held`]).
    pub(crate) fn refund_held<Q>(
        &self,
        now: Timestamp,
        key: &Q,
        amount: u64,
        stamp: Timestamp,
    ) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.lock(hash);
        match shard.table.find_mut(hash, |(k, _)| k.borrow() == key) {
            Some((_, state)) => self.rule.refund_held(now, state, amount, stamp),
            None => Ok(()),
        }
    }

    pub(crate) fn purge_full(&self, now: Timestamp) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().drop_full(&self.rule, now))
            .sum()
    }

    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().table.len())
            .sum()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.shards
            .iter()
            .all(|shard| shard.lock().table.is_empty())
    }

    /// Runs an operator's change `change` on `key`'s state as its policy's (see
    /// [`Rule::to_policy`]), under the shard's lock, at `now` (for a key the shard does not
    /// hold, no earlier than its last drop, and only if `blocked` answers `None`); the state
    /// it leaves is stored unless full.
    pub(crate) fn change<Q, T>(
        &self,
        now: Timestamp,
        key: &Q,
        blocked: impl FnOnce() -> Option<Result<T, AcquireError>>,
        change: impl FnOnce(Timestamp, &mut PolicyState) -> Result<T, AcquireError>,
    ) -> Result<T, AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.lock(hash);
        let (judged, mut state) = match shard.table.find(hash, |(k, _)| k.borrow() == key) {
            Some((_, state)) => (now, self.rule.to_policy(state)),
            None => match blocked() {
                Some(answer) => return answer,
                None => (now.max(shard.dropped_at), self.rule.to_policy(&self.fresh)),
            },
        };
        let out = change(judged, &mut state)?;
        let state = self
            .rule
            .back_from_policy(state)
            .ok_or(AcquireError::StateMismatch)?;
        match shard.table.find_mut(hash, |(k, _)| k.borrow() == key) {
            Some(stored) => stored.1 = state,
            None => self.store_new(&mut shard, hash, judged, key, state),
        }
        Ok(out)
    }

    /// `key`'s state as its policy's (a key the shard does not hold: full).
    pub(crate) fn policy_state<Q>(&self, key: &Q) -> PolicyState
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.lock(hash);
        match shard.table.find(hash, |(k, _)| k.borrow() == key) {
            Some((_, state)) => self.rule.to_policy(state),
            None => self.rule.to_policy(&self.fresh),
        }
    }

    /// Forgets `key`'s state; `true` if it had one.
    pub(crate) fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.lock(hash);
        match shard.table.find_entry(hash, |(k, _)| k.borrow() == key) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// The keys stored in each shard, in shard order.
    #[cfg(test)]
    pub(crate) fn shard_lens(&self) -> Vec<usize> {
        self.shards.iter().map(|s| s.lock().table.len()).collect()
    }

    /// Decides for a key the shard does not hold, and stores it if that leaves it not full.
    ///
    /// Out of line: the hit path is the one that must stay small.
    #[inline(never)]
    fn acquire_absent<Q>(
        &self,
        shard: &mut ShardState<K, R::State>,
        hash: u64,
        now: Timestamp,
        key: &Q,
        cost: u64,
        blocked: impl Blocked,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(answer) = blocked() {
            return answer;
        }
        // Judged no earlier than the shard's last drop: see "Clock regressions" on
        // `MemoryLimiter`.
        let judged = now.max(shard.dropped_at);
        let mut state = self.fresh.clone();
        let decision = self.rule.acquire(judged, &mut state, cost)?;
        // A zero cost leaves the state full: nothing to store.
        self.store_new(shard, hash, judged, key, state);
        Ok(counted_from(decision, judged.saturating_since(now)))
    }

    /// Stores `state` for `key`, which the shard does not hold, unless it is full at
    /// `judged` (the same as absent), making room first if the shard is at its capacity.
    fn store_new<Q>(
        &self,
        shard: &mut ShardState<K, R::State>,
        hash: u64,
        judged: Timestamp,
        key: &Q,
        state: R::State,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.rule.is_full(judged, &state) {
            return;
        }
        if shard.table.len() >= self.capacity {
            shard.make_room(&self.rule, judged, self.capacity);
        }
        let hasher = &self.hasher;
        shard
            .table
            .insert_unique(hash, (key.to_owned(), state), |(k, _)| hasher.hash_one(k));
    }

    /// Locks the shard that owns `hash`.
    #[inline]
    fn lock(&self, hash: u64) -> MutexGuard<'_, ShardState<K, R::State>> {
        // The mask keeps the index below `shards.len()`, a power of two.
        let shard = &self.shards[(hash >> SHARD_SHIFT) as usize & self.mask];
        #[cfg(test)]
        if let Err(std::sync::TryLockError::WouldBlock) = shard.0.try_lock() {
            self.contended
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        shard.lock()
    }
}

/// One independently locked table, aligned so that two shards' locks never share a cache
/// line (128 bytes: x86's adjacent-line prefetch pairs 64-byte lines, as crossbeam's
/// `CachePadded` assumes).
#[repr(align(128))]
struct Shard<K, S>(Mutex<ShardState<K, S>>);

struct ShardState<K, S> {
    table: HashTable<(K, S)>,
    /// The latest `now` at which this shard dropped or evicted a key: absent keys are
    /// judged no earlier, so a regressed clock cannot undo what a dropped state recorded.
    dropped_at: Timestamp,
}

impl<K, S> Default for Shard<K, S> {
    fn default() -> Self {
        Self(Mutex::new(ShardState {
            table: HashTable::new(),
            dropped_at: Timestamp::EPOCH,
        }))
    }
}

impl<K, S> Shard<K, S> {
    #[inline]
    fn lock(&self) -> MutexGuard<'_, ShardState<K, S>> {
        // A poisoned shard is still consistent: see "Why a `std::sync::Mutex` per shard"
        // on `MemoryLimiter`.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K, S> ShardState<K, S> {
    /// Makes room for one more key in a shard holding `capacity` or more: drops the full
    /// keys, then if none was full evicts the batch closest to full.
    #[cold]
    fn make_room<R: Rule<State = S>>(&mut self, rule: &R, now: Timestamp, capacity: usize) {
        self.drop_full(rule, now);
        let len = self.table.len();
        if len < capacity {
            return;
        }
        let batch = (capacity / EVICTION_FRACTION).clamp(1, len);
        // Nearest to full first: the soonest full again, then (every key of one fixed
        // window is full again at the window's end) the one that used least.
        let reset_after = |state: &S| {
            // A peek of cost zero never fails on a state the rule made.
            rule.peek(now, state, 0)
                .map_or((Micros::MAX, u64::MAX), |d| {
                    (d.reset_after, d.limit.saturating_sub(d.remaining))
                })
        };
        let mut resets: Vec<(Micros, u64)> =
            self.table.iter().map(|(_, s)| reset_after(s)).collect();
        let (below, &mut threshold, _) = resets.select_nth_unstable(batch - 1);
        // Everything below the threshold goes, then ties at the threshold until `batch`.
        let mut ties = batch - below.iter().filter(|r| **r < threshold).count();
        self.table.retain(|(_, state)| {
            let reset = reset_after(state);
            if reset < threshold {
                false
            } else if reset == threshold && ties > 0 {
                ties -= 1;
                false
            } else {
                true
            }
        });
        self.dropped_at = self.dropped_at.max(now);
    }

    /// Drops every key whose state is full at `now`; returns how many.
    fn drop_full<R: Rule<State = S>>(&mut self, rule: &R, now: Timestamp) -> usize {
        let before = self.table.len();
        self.table.retain(|(_, state)| !rule.is_full(now, state));
        let dropped = before - self.table.len();
        if dropped > 0 {
            self.dropped_at = self.dropped_at.max(now);
        }
        dropped
    }
}

/// Restates a decision made `lag` after the caller's `now` as seen from `now`.
#[inline]
fn counted_from(mut decision: Decision, lag: Micros) -> Decision {
    if lag > Micros::ZERO {
        let later = |d: Micros| Micros::from_micros(d.as_micros() + lag.as_micros());
        decision.reset_after = later(decision.reset_after);
        if decision.retry_after > Micros::ZERO {
            decision.retry_after = later(decision.retry_after);
        }
    }
    decision
}

/// Which hash bits choose the shard. hashbrown takes the bucket from the low bits and its
/// 7-bit tag from the top ones; taking the shard from either would make every key of a
/// shard agree on those bits, crowding buckets or defeating the tag filter. Bits 40..56
/// are used by neither while a shard has under 2^40 buckets (see `MAX_SHARDS`).
const SHARD_SHIFT: u32 = 40;

/// An eviction frees this fraction of the shard (1/8), so one scan of the shard pays for
/// the next `capacity / 8` new keys.
pub(crate) const EVICTION_FRACTION: usize = 8;
