//! [`BoundedMap`]: the storage of the deny and allow caches, keyed by (policy, user key),
//! with a hard bound on entries and explicit time.
//!
//! Every entry carries the instant it stops being useful ([`Expiring`]); an entry past it is
//! the same as an absent one, and is dropped when met. What happens when a shard is full of
//! live entries is the cache's choice ([`WhenFull`]): the deny cache evicts the entries that
//! expire soonest, those that guard against a wrong answer last ([`Expiring::guards`]: a
//! give-back's mark), so it loses only cache hits; the allow cache refuses to store (so its
//! over-admission bound never depends on memory pressure).
//!
//! Determinism: the shard of a key comes from FNV-1a, a fixed function of its bytes, and
//! eviction picks victims by a total order on their content (expiry, policy, key), never by
//! table order. So which entries a full cache holds depends only on the calls made, which a
//! seeded simulation repeats exactly; the per-shard tables still hash with a per-process
//! random seed, so crafted keys cannot flood one bucket of a table. They can crowd one
//! shard, whose index is public: up to its bound (1/16 of the whole), where the deny cache
//! evicts its soonest entries and the allow cache stores no new key. That costs calls to the
//! store, never a wrong answer.

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};

use hashbrown::{DefaultHashBuilder, HashTable};
use rein_core::Timestamp;

/// A cache entry that is useless from some instant on.
pub(crate) trait Expiring {
    /// The first instant at which the entry no longer answers anything.
    fn expires_at(&self) -> Timestamp;

    /// Whether losing the entry early could make the cache answer wrongly (not only ask the
    /// store more often): a full shard evicts such entries after every other.
    fn guards(&self) -> bool;
}

/// What to do when a new key meets a shard full of live entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WhenFull {
    /// Evict an eighth of the shard (at least one entry), soonest to expire first, entries
    /// that [guard](Expiring::guards) after every other.
    EvictSoonest,
    /// Store nothing: the new key stays uncached until entries expire.
    Refuse,
}

/// What a cache entry is kept under: the policy's index in the table and the user key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheKey<'a> {
    pub(crate) policy: u32,
    pub(crate) key: &'a [u8],
}

/// The key of `policy` and `key`, for tests.
#[cfg(test)]
pub(crate) fn k(policy: u32, key: &[u8]) -> CacheKey<'_> {
    CacheKey { policy, key }
}

/// At most `max_entries` values keyed by (policy index, user key bytes).
pub(crate) struct BoundedMap<V> {
    shards: Box<[Mutex<HashTable<Slot<V>>>]>,
    /// Entries per shard: `max_entries / shards`, at least one.
    per_shard: usize,
    when_full: WhenFull,
    hasher: DefaultHashBuilder,
}

struct Slot<V> {
    policy: u32,
    key: Box<[u8]>,
    value: V,
}

impl<V: Expiring> BoundedMap<V> {
    /// A map of at most `max_entries` (rounded down to a multiple of the shard count, and at
    /// least one per shard).
    pub(crate) fn new(max_entries: NonZeroUsize, when_full: WhenFull) -> Self {
        // The largest power of two not above `min(max_entries, MAX_SHARDS)`.
        let wanted = max_entries.get().min(MAX_SHARDS);
        let shards = 1usize << (usize::BITS - 1 - wanted.leading_zeros());
        Self {
            shards: (0..shards).map(|_| Mutex::new(HashTable::new())).collect(),
            per_shard: (max_entries.get() / shards).max(1),
            when_full,
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// Runs `f` on the live entry of `at` at `now` under its shard's lock; an expired entry
    /// is dropped and `None` returned.
    pub(crate) fn get<R>(
        &self,
        now: Timestamp,
        at: CacheKey<'_>,
        f: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        let CacheKey { policy, key } = at;
        let hash = self.hash(policy, key);
        let mut shard = self.shard(key);
        let entry = shard
            .find_entry(hash, |s| s.policy == policy && *s.key == *key)
            .ok()?;
        if entry.get().value.expires_at() <= now {
            entry.remove();
            return None;
        }
        Some(f(&mut entry.into_mut().value))
    }

    /// Stores `make(live)` for `at`, where `live` is the entry there at `now` (if any, and
    /// not expired), all under one lock. A value that is already expired at `now` is not
    /// stored (and removes the old one).
    pub(crate) fn upsert(
        &self,
        now: Timestamp,
        at: CacheKey<'_>,
        make: impl FnOnce(Option<&V>) -> V,
    ) {
        let CacheKey { policy, key } = at;
        let hash = self.hash(policy, key);
        let mut shard = self.shard(key);
        match shard.find_entry(hash, |s| s.policy == policy && *s.key == *key) {
            Ok(mut entry) => {
                let live = entry.get().value.expires_at() > now;
                let value = make(live.then_some(&entry.get().value));
                if value.expires_at() > now {
                    entry.get_mut().value = value;
                } else {
                    entry.remove();
                }
            }
            Err(_) => {
                let value = make(None);
                if value.expires_at() <= now || !self.make_room(&mut shard, now) {
                    return;
                }
                shard.insert_unique(
                    hash,
                    Slot {
                        policy,
                        key: key.into(),
                        value,
                    },
                    |s| self.hash(s.policy, &s.key),
                );
            }
        }
    }

    /// Replaces the live entry of `at` by `change(entry)`, or removes it for `None`; an
    /// absent or expired key stays absent.
    pub(crate) fn update(
        &self,
        now: Timestamp,
        at: CacheKey<'_>,
        change: impl FnOnce(&V) -> Option<V>,
    ) {
        let CacheKey { policy, key } = at;
        let hash = self.hash(policy, key);
        let mut shard = self.shard(key);
        let Ok(mut entry) = shard.find_entry(hash, |s| s.policy == policy && *s.key == *key) else {
            return;
        };
        match (entry.get().value.expires_at() > now)
            .then(|| change(&entry.get().value))
            .flatten()
        {
            Some(value) if value.expires_at() > now => entry.get_mut().value = value,
            _ => {
                entry.remove();
            }
        }
    }

    /// Entries stored, expired ones included, summed one shard lock at a time.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// The most entries stored.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.per_shard * self.shards.len()
    }

    /// Whether a new entry fits in `shard` at `now`, after dropping expired entries and, if
    /// the policy says so, evicting the soonest to expire.
    fn make_room(&self, shard: &mut HashTable<Slot<V>>, now: Timestamp) -> bool {
        if shard.len() < self.per_shard {
            return true;
        }
        shard.retain(|s| s.value.expires_at() > now);
        if shard.len() < self.per_shard {
            return true;
        }
        if self.when_full == WhenFull::Refuse {
            return false;
        }
        // Victims by content, not by table order: the same calls evict the same entries.
        let count = (self.per_shard / EVICT_FRACTION).max(1);
        let mut order: Vec<(bool, Timestamp, u32, &[u8])> = shard
            .iter()
            .map(|s| (s.value.guards(), s.value.expires_at(), s.policy, &*s.key))
            .collect();
        order.sort_unstable();
        let victims: Vec<(u32, Box<[u8]>)> = order
            .into_iter()
            .take(count)
            .map(|(_, _, policy, key)| (policy, key.into()))
            .collect();
        for (policy, key) in victims {
            let hash = self.hash(policy, &key);
            if let Ok(entry) = shard.find_entry(hash, |s| s.policy == policy && s.key == key) {
                entry.remove();
            }
        }
        true
    }

    fn hash(&self, policy: u32, key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((policy, key))
    }

    fn shard(&self, key: &[u8]) -> MutexGuard<'_, HashTable<Slot<V>>> {
        // The shard count is a power of two.
        let index = (fnv1a(key) as usize) & (self.shards.len() - 1);
        lock(&self.shards[index])
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a single insert, replace or remove after the value is computed, and
    // the closures run under the lock are this module's own, so a poisoned lock (a panic in
    // an allocation) still guards a consistent table.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// FNV-1a, 64-bit: a fixed function of the key's bytes, so shard choice is reproducible.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Shards per map at most: enough that two cores, or sixteen, rarely wait on one lock, few
/// enough that a small cache is not split into slivers.
pub(crate) const MAX_SHARDS: usize = 16;

/// A full shard evicts this fraction of itself at once, so the sort that picks victims is
/// paid once per eighth of a shard's worth of new keys.
const EVICT_FRACTION: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Until(u64);

    impl Expiring for Until {
        fn expires_at(&self) -> Timestamp {
            Timestamp::from_micros(self.0)
        }

        fn guards(&self) -> bool {
            false
        }
    }

    fn at(us: u64) -> Timestamp {
        Timestamp::from_micros(us)
    }

    fn map(max: usize, when_full: WhenFull) -> BoundedMap<Until> {
        BoundedMap::new(NonZeroUsize::new(max).unwrap(), when_full)
    }

    fn value(m: &BoundedMap<Until>, now: u64, policy: u32, key: &[u8]) -> Option<u64> {
        m.get(at(now), k(policy, key), |v| v.0)
    }

    #[test]
    fn entries_live_until_their_expiry_and_policies_do_not_share_keys() {
        let m = map(64, WhenFull::EvictSoonest);
        m.upsert(at(0), k(0, b"k"), |_| Until(10));
        m.upsert(at(0), k(1, b"k"), |_| Until(20));
        assert_eq!(value(&m, 9, 0, b"k"), Some(10));
        assert_eq!(value(&m, 10, 0, b"k"), None, "expired at its instant");
        assert_eq!(m.len(), 1, "met expired, dropped");
        assert_eq!(value(&m, 10, 1, b"k"), Some(20));
        // An already expired value is not stored, and replaces (removes) the old one.
        m.upsert(at(15), k(1, b"k"), |old| {
            assert_eq!(old, Some(&Until(20)));
            Until(15)
        });
        assert_eq!(m.len(), 0);
        m.upsert(at(15), k(1, b"k"), |_| Until(16));
        m.update(at(15), k(1, b"k"), |v| (*v != Until(17)).then_some(*v));
        assert_eq!(
            value(&m, 15, 1, b"k"),
            Some(16),
            "kept: not the entry to remove"
        );
        m.update(at(15), k(1, b"k"), |v| (*v != Until(16)).then_some(*v));
        assert_eq!(value(&m, 15, 1, b"k"), None);
    }

    #[test]
    fn a_full_map_evicts_the_soonest_to_expire_or_refuses() {
        // A map of one entry: one shard of one slot.
        for when_full in [WhenFull::EvictSoonest, WhenFull::Refuse] {
            let m = map(1, when_full);
            assert_eq!(m.capacity(), 1);
            m.upsert(at(0), k(0, b"a"), |_| Until(100));
            m.upsert(at(0), k(0, b"b"), |_| Until(200));
            match when_full {
                WhenFull::EvictSoonest => {
                    assert_eq!(value(&m, 1, 0, b"a"), None);
                    assert_eq!(value(&m, 1, 0, b"b"), Some(200));
                }
                WhenFull::Refuse => {
                    assert_eq!(value(&m, 1, 0, b"a"), Some(100));
                    assert_eq!(value(&m, 1, 0, b"b"), None);
                }
            }
            // Once the entry has expired, there is room for either policy.
            m.upsert(at(300), k(0, b"c"), |_| Until(400));
            assert_eq!(value(&m, 300, 0, b"c"), Some(400));
            assert_eq!(m.len(), 1);
        }
    }

    #[test]
    fn eviction_picks_victims_by_content_and_never_exceeds_the_bound() {
        let m = map(256, WhenFull::EvictSoonest);
        let cap = m.capacity();
        assert!(cap <= 256);
        for i in 0..10_000u64 {
            m.upsert(at(0), k((i % 3) as u32, &i.to_le_bytes()), |_| {
                Until(1_000 + i)
            });
            assert!(m.len() <= cap);
        }
        // The latest keys expire last, so they survived.
        assert_eq!(
            value(&m, 0, (9_999 % 3) as u32, &9_999u64.to_le_bytes()),
            Some(10_999)
        );
        // Two maps fed the same calls hold the same keys.
        let other = map(256, WhenFull::EvictSoonest);
        for i in 0..10_000u64 {
            other.upsert(at(0), k((i % 3) as u32, &i.to_le_bytes()), |_| {
                Until(1_000 + i)
            });
        }
        for i in 0..10_000u64 {
            let key = i.to_le_bytes();
            let policy = (i % 3) as u32;
            assert_eq!(value(&m, 0, policy, &key), value(&other, 0, policy, &key));
        }
    }
}
