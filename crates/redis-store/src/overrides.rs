//! Per-key overrides kept in Redis and cached in each process (`RedisStoreBuilder::
//! overrides`): their layout, their cache, and what a decision finds in it. The meaning of
//! an override is rein-core's (`rein_core::overrides`).
//!
//! **Layout.** One hash per deployment, `<prefix>:overrides`: a field per override,
//! `<policy>:=<key>` for one key or `<policy>:*<prefix>` for a key prefix (a policy's name
//! holds no `:`, so the first one ends it), whose value is `Override::encode`'s text; and
//! the field `#v`, a version every write sets in the same script (lua/admin.lua, `ovset`)
//! to the larger of the last one plus one and Redis's clock in µs, so a hash lost or rolled
//! back and written again is never a version a store read before. One key, so a Cluster
//! keeps it in one slot and a write is atomic.
//!
//! **Cache.** Each store reads the hash whole at its first decision and then at most once
//! per `staleness`: the decision that finds the cache that old re-reads it (one `HGET` of
//! the version when nothing changed, one `HGETALL` when it did), the others go on with what
//! is cached. So a change applies in every process within `staleness` plus one round trip
//! of a decision made after it; a process that cannot reach Redis keeps what it cached.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::Value;
use rein_core::NamedPolicy;
use rein_core::overrides::{KeyMatch, Override, OverrideEntry, OverrideSource, Overrides};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::RedisPolicy;

/// How stale a process's copy of the overrides may be when a config does not say
/// (rein-tower's `overrides_staleness`): one second, one small command a second per process.
pub const DEFAULT_OVERRIDES_STALENESS: Duration = Duration::from_secs(1);

pub(crate) use rein_core::overrides::MAX_OVERRIDES;

/// The field holding the hash's version.
pub(crate) const VERSION_FIELD: &str = "#v";

/// What a decision gets for a key: its override's limits, prepared as a policy under the
/// overridden policy's name, or no limit.
#[derive(Debug)]
pub(crate) enum Applied {
    Limits(RedisPolicy),
    Unlimited,
}

/// The hash key of a deployment's overrides.
pub(crate) fn hash_key(prefix: &str) -> String {
    format!("{prefix}:overrides")
}

/// The channel a write of a deployment's overrides is published on (the same name as the
/// hash: channels and keys are apart).
pub(crate) fn channel(prefix: &str) -> String {
    hash_key(prefix)
}

/// Subscribes to `channel` with `client` and makes `cache` re-read at the next decision
/// whenever a write is published, until the store is gone: a change then applies in about
/// one round trip, not `staleness`. A lost subscription is made again (waiting 0.1 s, then
/// twice as long up to 5 s), and a new one re-reads too, since a write may have been
/// missed meanwhile; until then the staleness bound holds as without it.
pub(crate) fn listen(cache: &Arc<Cache>, client: redis::Client, channel: String) {
    use futures_util::StreamExt;

    let cache = Arc::downgrade(cache);
    tokio::spawn(async move {
        const FIRST_WAIT: Duration = Duration::from_millis(100);
        let mut wait = FIRST_WAIT;
        loop {
            let Some(staleness) = cache.upgrade().map(|c| c.staleness) else {
                return;
            };
            let bound = staleness.max(Duration::from_secs(1));
            let subscribed = tokio::time::timeout(bound, async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&channel).await?;
                Ok::<_, redis::RedisError>(pubsub.into_on_message())
            })
            .await;
            match subscribed {
                Ok(Ok(mut messages)) => {
                    wait = FIRST_WAIT;
                    tracing::debug!(%channel, "listening for changes of overrides");
                    loop {
                        let next = tokio::time::timeout(staleness, messages.next()).await;
                        let Some(cache) = cache.upgrade() else {
                            return;
                        };
                        match next {
                            // A write published, or a new subscription (one may be missed).
                            Ok(Some(_)) => cache.expire(),
                            Ok(None) => break,
                            // Nothing for a while: only to see whether the store is gone.
                            Err(_) => {}
                        }
                    }
                    tracing::debug!(%channel, "the subscription to overrides was lost");
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot subscribe to overrides"),
                Err(_) => tracing::debug!("cannot subscribe to overrides in time"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
            if let Some(cache) = cache.upgrade() {
                cache.expire();
            }
        }
    });
}

/// An override's field: `<policy>:=<key>` or `<policy>:*<prefix>`.
pub(crate) fn field(policy: &str, keys: &KeyMatch) -> Vec<u8> {
    let (mark, bytes) = match keys {
        KeyMatch::Key(key) => (b'=', key),
        KeyMatch::Prefix(prefix) => (b'*', prefix),
    };
    let mut field = Vec::with_capacity(policy.len() + 2 + bytes.len());
    field.extend_from_slice(policy.as_bytes());
    field.push(b':');
    field.push(mark);
    field.extend_from_slice(bytes);
    field
}

/// Reads a field and its value back; `Err` names the field and what is wrong with it.
pub(crate) fn entry(field: &[u8], value: &[u8]) -> Result<OverrideEntry, String> {
    parse_entry(field, value)
        .map_err(|problem| format!("field {:?}: {problem}", String::from_utf8_lossy(field)))
}

fn parse_entry(field: &[u8], value: &[u8]) -> Result<OverrideEntry, String> {
    let colon = field
        .iter()
        .position(|&b| b == b':')
        .ok_or_else(|| "no policy".to_owned())?;
    let (policy, rest) = field.split_at(colon);
    let policy = std::str::from_utf8(policy)
        .map_err(|_| "a policy name that is not UTF-8".to_owned())?
        .to_owned();
    let keys = match rest.get(1..).and_then(|r| r.split_first()) {
        Some((b'=', key)) if !key.is_empty() => KeyMatch::Key(key.into()),
        Some((b'*', prefix)) if !prefix.is_empty() => KeyMatch::Prefix(prefix.into()),
        _ => return Err("not <policy>:=<key> or <policy>:*<prefix>".to_owned()),
    };
    let value = std::str::from_utf8(value).map_err(|_| "a value that is not UTF-8".to_owned())?;
    let value = Override::decode(value).map_err(|e| e.to_string())?;
    Ok(OverrideEntry {
        policy,
        keys,
        value,
    })
}

/// Decodes the reply of `ovread`: the version, and the hash's fields and values when it
/// changed (`None`: unchanged). Malformed entries are returned as errors beside the rest.
#[allow(clippy::type_complexity)]
pub(crate) fn decode_read(
    reply: Value,
) -> Result<(Option<String>, Option<Vec<Result<OverrideEntry, String>>>), String> {
    let Value::Array(parts) = reply else {
        return Err(format!("expected an array, got {reply:?}"));
    };
    let mut parts = parts.into_iter();
    let version = match parts.next() {
        Some(Value::BulkString(v)) => Some(String::from_utf8_lossy(&v).into_owned()),
        Some(Value::Nil) | None => None,
        Some(other) => return Err(format!("a version of {other:?}")),
    };
    let Some(all) = parts.next() else {
        return Ok((version, None));
    };
    let Value::Array(all) = all else {
        return Err(format!("expected the hash, got {all:?}"));
    };
    let mut entries = Vec::with_capacity(all.len() / 2);
    let mut all = all.into_iter();
    while let (Some(field), Some(value)) = (all.next(), all.next()) {
        let (Value::BulkString(field), Value::BulkString(value)) = (field, value) else {
            return Err("a field or value that is not a string".to_owned());
        };
        if field != VERSION_FIELD.as_bytes() {
            entries.push(entry(&field, &value));
        }
    }
    Ok((version, Some(entries)))
}

/// Where a process reads its overrides.
#[derive(Clone)]
pub(crate) enum From {
    /// The deployment's hash in Redis.
    Redis,
    /// The application's own source.
    Source(Arc<dyn OverrideSource>),
}

impl std::fmt::Debug for From {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            From::Redis => "Redis",
            From::Source(_) => "Source",
        })
    }
}

/// A process's copy of the overrides (see the module docs).
pub(crate) struct Cache {
    from: From,
    staleness: Duration,
    /// Set once the first read ended, read or not: until then every decision waits for it.
    first: OnceCell<()>,
    loaded: RwLock<Loaded>,
    /// `true` while no override is cached: a decision then skips the lock.
    none: AtomicBool,
    /// When the cache may next be re-read, in ns since `epoch`; claimed by the one decision
    /// that re-reads it. Atomic, so that deciding takes no lock shared by every thread.
    next_read: AtomicU64,
    epoch: Instant,
}

#[derive(Default)]
struct Loaded {
    version: Option<String>,
    by_policy: HashMap<String, Overrides<Arc<Applied>>>,
}

impl Cache {
    pub(crate) fn new(from: From, staleness: Duration) -> Self {
        Self {
            from,
            staleness,
            first: OnceCell::new(),
            loaded: RwLock::default(),
            none: AtomicBool::new(true),
            next_read: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn from(&self) -> &From {
        &self.from
    }

    pub(crate) fn first(&self) -> &OnceCell<()> {
        &self.first
    }

    /// `true` for the one caller that should re-read the hash now: the first to find the
    /// cache `staleness` old. It then counts as read until `staleness` from now, whether
    /// the read succeeds or not (a Redis that is away is not asked on every decision).
    pub(crate) fn claim_read(&self, now: Instant) -> bool {
        let now = self.since_epoch(now);
        let next = self.next_read.load(Ordering::Relaxed);
        if now < next {
            return false;
        }
        let staleness = u64::try_from(self.staleness.as_nanos()).unwrap_or(u64::MAX);
        let then = now.saturating_add(staleness);
        self.next_read
            .compare_exchange(next, then, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Makes the next decision re-read the hash (after this process changed it).
    pub(crate) fn expire(&self) {
        self.next_read.store(0, Ordering::Relaxed);
    }

    /// The version last read, to send with the next read.
    pub(crate) fn version(&self) -> Option<String> {
        self.read().version.clone()
    }

    /// Replaces what is cached. Overrides of a policy whose limits do not prepare (never,
    /// for what `Override::decode` accepts) are left out with a warning.
    pub(crate) fn replace(&self, version: Option<String>, entries: Vec<OverrideEntry>) {
        let mut by_policy: HashMap<String, Overrides<Arc<Applied>>> = HashMap::new();
        for entry in entries {
            let applied = match entry.value {
                Override::Unlimited => Applied::Unlimited,
                Override::Limits(limits) => match NamedPolicy::new(entry.policy.clone(), limits) {
                    Ok(named) => Applied::Limits(RedisPolicy::prepare(&named)),
                    Err(e) => {
                        tracing::warn!(policy = %entry.policy, error = %e, "override left out");
                        continue;
                    }
                },
            };
            by_policy
                .entry(entry.policy)
                .or_default()
                .insert(entry.keys, Arc::new(applied));
        }
        let none = by_policy.is_empty();
        let mut loaded = self.loaded.write().unwrap_or_else(|e| e.into_inner());
        *loaded = Loaded { version, by_policy };
        self.none.store(none, Ordering::Relaxed);
    }

    /// What applies to `key` under the policy named `policy`, if an override does.
    pub(crate) fn get(&self, policy: &str, key: &[u8]) -> Option<Arc<Applied>> {
        if self.none.load(Ordering::Relaxed) {
            return None;
        }
        let loaded = self.read();
        loaded.by_policy.get(policy)?.get(key).cloned()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        self.loaded.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_and_malformed_ones_are_named() {
        let keys = KeyMatch::Prefix(b"tenant:7".as_slice().into());
        let field = field("api", &keys);
        assert_eq!(field, b"api:*tenant:7");
        let back = entry(&field, b"unlimited").unwrap();
        assert_eq!(
            back,
            OverrideEntry {
                policy: "api".into(),
                keys,
                value: Override::Unlimited
            }
        );
        for bad in [&b"api"[..], b"api:", b"api:=", b"api:x1", b"api:*"] {
            assert!(entry(bad, b"unlimited").is_err(), "{bad:?}");
        }
        assert!(entry(b"api:=k", b"fw:0:1").is_err());
    }

    #[test]
    fn one_caller_claims_each_read() {
        let cache = Cache::new(From::Redis, Duration::from_secs(1));
        let now = Instant::now();
        assert!(cache.claim_read(now));
        assert!(!cache.claim_read(now));
        assert!(cache.claim_read(now + Duration::from_secs(1)));
        assert!(!cache.claim_read(now + Duration::from_millis(1_999)));
        cache.expire();
        assert!(cache.claim_read(now + Duration::from_millis(1_999)));
    }
}
