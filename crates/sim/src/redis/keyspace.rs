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
#[derive(Clone, Debug)]
pub enum Value {
    /// A string (integers are strings too, as in Redis).
    String(Bytes),
    /// A hash.
    Hash(Hash),
}

impl Value {
    /// The name `TYPE` replies with.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "string",
            Value::Hash(_) => "hash",
        }
    }
}

/// A value and when it expires.
#[derive(Clone, Debug)]
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
    pub fn entry(&mut self, key: &[u8], now_ms: i64) -> Option<&mut Entry> {
        let expired = self.entries.get(key)?.is_expired(now_ms);
        if expired {
            self.entries.remove(key);
            return None;
        }
        self.entries.get_mut(key)
    }

    /// The live value at `key`.
    pub fn value(&mut self, key: &[u8], now_ms: i64) -> Option<&mut Value> {
        self.entry(key, now_ms).map(|entry| &mut entry.value)
    }

    /// The string at `key`, if any.
    pub fn string(&mut self, key: &[u8], now_ms: i64) -> Result<Option<&Bytes>, WrongType> {
        match self.value(key, now_ms) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(WrongType),
        }
    }

    /// The hash at `key`, if any.
    pub fn hash(&mut self, key: &[u8], now_ms: i64) -> Result<Option<&mut Hash>, WrongType> {
        match self.value(key, now_ms) {
            None => Ok(None),
            Some(Value::Hash(h)) => Ok(Some(h)),
            Some(_) => Err(WrongType),
        }
    }

    /// The hash at `key`, created empty if absent. The caller must leave it non-empty or
    /// call [`Keyspace::remove_if_empty`].
    pub fn hash_or_create(&mut self, key: &Bytes, now_ms: i64) -> Result<&mut Hash, WrongType> {
        if self.entry(key, now_ms).is_none() {
            self.insert(key.clone(), Value::Hash(Hash::default()));
        }
        match self.value(key, now_ms) {
            Some(Value::Hash(h)) => Ok(h),
            _ => Err(WrongType),
        }
    }

    /// Stores `value` at `key` with no expiry, replacing whatever was there.
    pub fn insert(&mut self, key: Bytes, value: Value) {
        self.entries.insert(
            key,
            Entry {
                value,
                expires_at_ms: None,
            },
        );
    }

    /// Replaces the value at a live `key`, keeping its expiry (`INCR`, `SET KEEPTTL`), or
    /// inserts it without one.
    pub fn replace_value(&mut self, key: &Bytes, value: Value, now_ms: i64) {
        match self.entry(key, now_ms) {
            Some(entry) => entry.value = value,
            None => self.insert(key.clone(), value),
        }
    }

    /// Deletes a live `key`; whether it existed.
    pub fn remove(&mut self, key: &[u8], now_ms: i64) -> bool {
        self.entry(key, now_ms).is_some() && self.entries.remove(key).is_some()
    }

    /// Deletes `key` if it holds an empty hash: Redis never keeps those.
    pub fn remove_if_empty(&mut self, key: &[u8]) {
        let empty = match self.entries.get(key).map(|e| &e.value) {
            Some(Value::Hash(h)) => h.is_empty(),
            _ => false,
        };
        if empty {
            self.entries.remove(key);
        }
    }

    /// Sets the expiry of a live `key` (Unix ms); whether the key exists.
    pub fn set_expiry(&mut self, key: &[u8], at_ms: Option<i64>, now_ms: i64) -> bool {
        match self.entry(key, now_ms) {
            Some(entry) => {
                entry.expires_at_ms = at_ms;
                true
            }
            None => false,
        }
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
        ks.insert(key("k"), Value::String(key("v")));
        assert!(ks.set_expiry(b"k", Some(100), 0));
        assert_eq!(ks.string(b"k", 100), Ok(Some(&key("v"))));
        assert_eq!(ks.string(b"k", 101), Ok(None));
        // Lazily deleted: it does not come back when the clock goes backwards.
        assert_eq!(ks.string(b"k", 50), Ok(None));
    }

    #[test]
    fn typed_access_to_another_type_is_wrongtype() {
        let mut ks = Keyspace::default();
        ks.insert(key("s"), Value::String(key("v")));
        assert!(ks.hash(b"s", 0).is_err());
        assert_eq!(ks.hash(b"missing", 0).map(|h| h.is_none()), Ok(true));
    }

    #[test]
    fn an_expired_key_of_another_type_is_simply_absent() {
        let mut ks = Keyspace::default();
        ks.insert(key("k"), Value::String(key("v")));
        ks.set_expiry(b"k", Some(10), 0);
        assert!(ks.hash_or_create(&key("k"), 11).is_ok());
    }

    #[test]
    fn len_counts_live_keys_and_flush_drops_all() {
        let mut ks = Keyspace::default();
        for k in ["a", "b", "c"] {
            ks.insert(key(k), Value::String(key("v")));
        }
        ks.set_expiry(b"b", Some(5), 0);
        assert_eq!(ks.len(5), 3);
        assert_eq!(ks.len(6), 2);
        ks.flush();
        assert_eq!(ks.len(6), 0);
    }

    #[test]
    fn emptied_collections_are_removed() {
        let mut ks = Keyspace::default();
        ks.hash_or_create(&key("h"), 0)
            .map(|_| ())
            .unwrap_or_default();
        ks.remove_if_empty(b"h");
        assert_eq!(ks.len(0), 0);
    }
}
