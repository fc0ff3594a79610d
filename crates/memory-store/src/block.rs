//! The keys an operator blocked ([`rein_core::Block`]), beside the shard tables: few, so a
//! map behind one lock, and a count that lets every decision skip it while there are none.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rein_core::{Block, Timestamp};

/// Blocked keys, each with its block and reason, at most `max` of them.
pub(crate) struct Blocks<K> {
    /// How many blocks the map holds (some may have ended): zero skips the lock.
    held: AtomicUsize,
    map: Mutex<HashMap<K, (Block, String)>>,
    max: usize,
}

impl<K: Hash + Eq> Blocks<K> {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            map: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    /// The block that holds `key` at `now`, if any: one relaxed load while no key is
    /// blocked.
    #[inline]
    pub(crate) fn holding<Q>(&self, now: Timestamp, key: &Q) -> Option<Block>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.holding_slow(now, key)
    }

    #[inline(never)]
    fn holding_slow<Q>(&self, now: Timestamp, key: &Q) -> Option<Block>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut map = self.lock();
        let (block, _) = map.get(key)?;
        if block.holds_at(now) {
            return Some(*block);
        }
        map.remove(key);
        self.held.store(map.len(), Ordering::Relaxed);
        None
    }

    /// The block on `key` and its reason, ended or not.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<(Block, String)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lock().get(key).cloned()
    }

    /// Blocks `key`, replacing an earlier block. With `max` blocks held, ended ones are
    /// dropped first, then the one ending soonest is lifted early.
    pub(crate) fn insert(&self, now: Timestamp, key: K, block: Block, reason: String) {
        let mut map = self.lock();
        if map.len() >= self.max && !map.contains_key(&key) {
            map.retain(|_, (b, _)| b.holds_at(now));
            if map.len() >= self.max
                && let Some(soonest) = map.values().map(|(b, _)| b.ends_at()).min()
            {
                let mut lifted = false;
                map.retain(|_, (b, _)| {
                    let lift = !lifted && b.ends_at() == soonest;
                    lifted |= lift;
                    !lift
                });
            }
        }
        map.insert(key, (block, reason));
        self.held.store(map.len(), Ordering::Relaxed);
    }

    /// Lifts the block on `key`, ended or not, and returns it.
    pub(crate) fn remove<Q>(&self, key: &Q) -> Option<Block>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut map = self.lock();
        let removed = map.remove(key);
        self.held.store(map.len(), Ordering::Relaxed);
        removed.map(|(block, _)| block)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, (Block, String)>> {
        // A map's methods run no user code but `Hash` and `Eq`, and leave it whole.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Timestamp {
        Timestamp::from_micros(us)
    }

    #[test]
    fn a_block_holds_until_its_end_and_the_fullest_map_lifts_the_soonest() {
        let blocks = Blocks::new(2);
        assert_eq!(blocks.holding(at(0), "a"), None);
        blocks.insert(at(0), "a", Block::until(at(10)), "r".into());
        blocks.insert(at(0), "b", Block::until(at(30)), "r".into());
        assert_eq!(blocks.holding(at(9), "a"), Some(Block::until(at(10))));
        // Full: a third lifts the one ending soonest, "a".
        blocks.insert(at(0), "c", Block::until(at(20)), "r".into());
        assert_eq!(blocks.holding(at(1), "a"), None);
        assert!(blocks.holding(at(1), "b").is_some());
        assert_eq!(blocks.holding(at(20), "c"), None, "ended at 20");
        assert_eq!(blocks.remove("b"), Some(Block::until(at(30))));
        assert_eq!(blocks.remove("b"), None);
        assert_eq!(blocks.held.load(Ordering::Relaxed), 0);
    }
}
