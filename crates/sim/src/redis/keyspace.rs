//! The data of one simulated Redis: keys, typed values and expiry times.
//!
//! Ordered maps only (never a std `HashMap`, whose iteration order changes between runs), so
//! that anything iterating keys is deterministic. Expiry is lazy, as a Redis key seen by a
//! client is: a key whose time has passed is deleted when a command touches it. Redis also
//! expires keys in a background cycle; the only visible difference is `DBSIZE`, which here
//! counts live keys exactly where Redis's count may still include some expired ones.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::hash::Hash;

/// The keys of one database.
#[derive(Clone, Debug, Default)]
pub struct Keyspace {
    entries: BTreeMap<Bytes, Entry>,
}

/// A value of one of the types the simulator supports.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A string (integers are strings too, as in Redis).
    String(Bytes),
    /// A hash.
    Hash(Hash),
}

/// A value and when it expires.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// Unix time in milliseconds after which the key no longer exists, as Redis stores it.
    pub expires_at_ms: Option<i64>,
}

/// The key holds a value of another type: Redis's WRONGTYPE error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrongType;

impl Keyspace {
    /// The live entry at `key`, deleting it first if it has expired at `now_ms`.
    fn entry(&mut self, key: &[u8], now_ms: i64) -> Option<&mut Entry> {
        let expired = self.entries.get(key)?.is_expired(now_ms);
        if expired {
            self.entries.remove(key);
            return None;
        }
        self.entries.get_mut(key)
    }

    /// A copy of the live entry at `key`, for `WATCH` to compare with later.
    pub fn snapshot(&mut self, key: &[u8], now_ms: i64) -> Option<Entry> {
        self.entry(key, now_ms).cloned()
    }

    /// The live value at `key`.
    pub fn value(&mut self, key: &[u8], now_ms: i64) -> Option<&mut Value> {
        self.entry(key, now_ms).map(|entry| &mut entry.value)
    }

    /// The hash at `key`, created empty if absent; the caller must leave it non-empty.
    pub fn hash_or_create(&mut self, key: &Bytes, now_ms: i64) -> Result<&mut Hash, WrongType> {
        if self.entry(key, now_ms).is_none() {
            self.insert(key.clone(), Value::Hash(Hash::default()), None);
        }
        match self.value(key, now_ms) {
            Some(Value::Hash(h)) => Ok(h),
            _ => Err(WrongType),
        }
    }

    /// Stores `value` at `key` expiring at `expires_at_ms`, replacing whatever was there.
    pub fn insert(&mut self, key: Bytes, value: Value, expires_at_ms: Option<i64>) {
        let entry = Entry {
            value,
            expires_at_ms,
        };
        self.entries.insert(key, entry);
    }

    /// Sets a live `key` to expire at `at_ms`, or deletes it if that is not after `now_ms`
    /// (Redis's `PEXPIRE` of a time already past); whether the key existed.
    pub fn expire_at(&mut self, key: &[u8], at_ms: i64, now_ms: i64) -> bool {
        if at_ms <= now_ms {
            return self.remove(key, now_ms);
        }
        match self.entry(key, now_ms) {
            Some(entry) => {
                entry.expires_at_ms = Some(at_ms);
                true
            }
            None => false,
        }
    }

    /// Deletes a live `key`; whether it existed.
    pub fn remove(&mut self, key: &[u8], now_ms: i64) -> bool {
        self.entry(key, now_ms).is_some() && self.entries.remove(key).is_some()
    }

    /// Number of live keys.
    pub fn len(&mut self, now_ms: i64) -> usize {
        self.entries.retain(|_, entry| !entry.is_expired(now_ms));
        self.entries.len()
    }

    /// Deletes every key (`FLUSHALL`, a crash without persistence).
    pub fn flush(&mut self) {
        self.entries.clear();
    }
}

impl Entry {
    fn is_expired(&self, now_ms: i64) -> bool {
        // Redis's keyIsExpired: a key is still there during its expiry millisecond.
        self.expires_at_ms.is_some_and(|at| now_ms > at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Bytes {
        Bytes::copy_from_slice(k.as_bytes())
    }

    #[test]
    fn a_key_lives_through_its_expiry_millisecond_and_is_gone_after() {
        let mut ks = Keyspace::default();
        ks.insert(key("k"), Value::String(key("v")), Some(100));
        assert!(ks.value(b"k", 100).is_some());
        assert!(ks.value(b"k", 101).is_none());
        // Lazily deleted: it does not come back when the clock goes backwards.
        assert!(ks.value(b"k", 50).is_none());
    }

    #[test]
    fn typed_access_to_another_type_is_wrongtype_unless_expired() {
        let mut ks = Keyspace::default();
        ks.insert(key("s"), Value::String(key("v")), Some(10));
        assert!(ks.hash_or_create(&key("s"), 10).is_err());
        assert!(ks.hash_or_create(&key("s"), 11).is_ok());
    }

    #[test]
    fn len_counts_live_keys_and_flush_drops_all() {
        let mut ks = Keyspace::default();
        for (k, at) in [("a", None), ("b", Some(5)), ("c", None)] {
            ks.insert(key(k), Value::String(key("v")), at);
        }
        assert_eq!(ks.len(5), 3);
        assert_eq!(ks.len(6), 2);
        assert!(ks.remove(b"a", 6) && !ks.remove(b"a", 6));
        ks.flush();
        assert_eq!(ks.len(6), 0);
    }
}
