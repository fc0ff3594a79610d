//! [`RedisStore`]: encode the arguments, run the script, decode the reply.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, Value};
use rein_core::limiter::SourceError;
use rein_core::overrides::{KeyMatch, Override, OverrideEntry, OverrideSource};
use rein_core::time::MAX_MICROS;
use rein_core::{
    DecideError, Decision, Held, KeyError, Leasable, Limit, Limiter, Micros, NamedPolicy,
    OverCapacity, PolicyState, PrepareError, StoreError, Timestamp,
    rate_share::{RateAnswer, RateOp, RateShares, RateState, ShareError},
};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use crate::admin::{Change, Changed};
use crate::coalesce::{Coalesce, Lane};
use crate::error::{store_error, suspects_connection};
use crate::link::{Connector, Link, Suspicion};
use crate::overrides::{self, Applied};
use crate::redirect::{Redirects, Step, Target};
use crate::route::{self, Router};
use crate::script::{self, Ask, Invocation, Op, ScriptKind};
use crate::{RedisPolicy, SettingsError, StateError};
use rein_core::admin::{AdminError, KeyAdmin, KeyState, Until};

/// Exact rate limits shared by every process that uses the same Redis.
///
/// Each decision is one `EVALSHA` of rein's script, which reads the policy's state, decides
/// with rein-core's math and writes the new state, atomically. A denial counts nothing (and
/// writes nothing, except for a fixed window kept as one integer: docs/redis.md, "Stored
/// state").
/// The store is cheap to clone (an `Arc`), and every clone shares one connection.
///
/// # Clock
///
/// [`Limiter::acquire`], [`peek`](Limiter::peek) and [`refund`](Limiter::refund) with a `now`
/// of `None` take it from the Redis server's `TIME`, inside the script. This is the one to
/// use in production: every application server then decides on one clock, so a skewed or
/// jumping application clock cannot admit extra requests or lock clients out.
///
/// `Some(now)` is the caller's clock instead, for tests, replays and simulators, where time
/// is virtual. Don't mix the two on
/// the same keys: the state would be judged against two clocks. When the caller's clock does
/// not advance with Redis's, set [`min_ttl`](RedisStoreBuilder::min_ttl), because key TTLs
/// always run on Redis's clock.
///
/// # Deadlines, failures and replays
///
/// Every call has a deadline (default 50 ms), covering waiting for a connection and the
/// round trip. On expiry it returns a `Timeout` error, never a denial. A call that timed
/// out or lost its connection is **not retried**: it may have run, and running it again
/// could count the request twice. A call is sent again only after a reply that proves the
/// script did not run, within the same deadline: `NOSCRIPT` (the server lost its script
/// cache: restarted, failed over, `SCRIPT FLUSH`) resends it as `EVAL` with the script's
/// source; on a Redis Cluster, `MOVED` and `ASK` (resharding) are followed to the node they
/// name, and `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING` and `READONLY` are waited out
/// briefly, at most 5 resends per call (docs/redis.md, "Redis Cluster"). Errors are not
/// sticky: after a failed call the next one starts afresh.
///
/// # Keys
///
/// One key per policy and user key: `<prefix>:v3:{<hex SHA-1 of the user key>}:<policy
/// name>:0:<algorithm>` for a policy of one limit, `<prefix>:v4:{...}:<policy
/// name>:<algorithm>+<algorithm>...` for a policy of several, whose limits' states share
/// the one value. A Cluster slot migration moves it whole, so it never splits a decision's
/// state between two nodes. A written key expires when all its limits are full again (the
/// decision's `reset_after`, rounded up to a millisecond), so memory returns to baseline
/// once traffic stops. See docs/redis.md.
///
/// ```no_run
/// use rein_core::{Limit, Limiter, Micros, Policy};
/// use rein_redis::{RedisPolicy, RedisStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let bucket = Limit::token_bucket(100, 10, Micros::from_secs(1))?;
/// let api = RedisPolicy::new("api", Policy::single(bucket))?;
/// let decision = store.acquire(None, &api, b"user-42", 1).await?;
/// if !decision.is_allowed() {
///     println!("retry in {:?}", std::time::Duration::from(decision.retry_after));
/// }
/// # Ok(())
/// # }
/// ```
pub struct RedisStore<C> {
    inner: Arc<Inner<C>>,
}

/// Settings for a [`RedisStore`], then one of the ways to get a connection.
///
/// ```
/// use std::time::Duration;
/// use rein_redis::RedisStoreBuilder;
///
/// let builder = RedisStoreBuilder::new()
///     .prefix("myapp:rl")
///     .deadline(Duration::from_millis(20));
/// # let _ = builder;
/// ```
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    pub(crate) shared: crate::settings::Shared,
    coalesce: Coalesce,
    /// Per-key overrides, where from and at most how stale (overrides.rs); `None`: none.
    overrides: Option<(overrides::From, Duration)>,
    /// Whether decisions are counted and reported for `rein watch` (watch.rs).
    report_counts: bool,
}

struct Inner<C> {
    link: Arc<Link<C>>,
    /// Sends to a Cluster node by address, to follow `ASK` and `MOVED`: set only by the
    /// constructors that hold a `ClusterConnection` (see route.rs for why).
    router: Option<Router<C>>,
    prefix: String,
    deadline: Duration,
    min_ttl_ms: u64,
    coalesce: Coalesce,
    /// Per policy (`RedisPolicy::lane`), the decisions waiting to share a call: only while
    /// the policy has calls in flight (coalesce.rs).
    lanes: Mutex<HashMap<usize, Lane<Waiter>>>,
    /// The per-key overrides this process applies, if the builder asked for them.
    overrides: Option<Arc<overrides::Cache>>,
    /// The policies whose decisions this process reports (watch.rs), if it does.
    reporter: Option<crate::watch::Reporter>,
}

/// The deployment's overrides, as [`RedisStore::overrides`] reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OverrideList {
    /// The entries that read.
    pub entries: Vec<OverrideEntry>,
    /// The fields that do not (written by hand, or by a later version), each named with
    /// what is wrong (`field "api:=k": ...`): the servers leave them out. Remove or rewrite
    /// them (`rein override rm`, `set`).
    pub unreadable: Vec<String>,
}

/// A decision waiting in its policy's lane for a call to carry it.
struct Waiter {
    key: String,
    ask: Ask,
    /// The caller's deadline: a call carrying it ends no later.
    deadline: Instant,
    reply: oneshot::Sender<Result<(Decision, Timestamp), StoreError>>,
}

impl<C> Clone for RedisStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> std::fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("deadline", &self.inner.deadline)
            .field("min_ttl_ms", &self.inner.min_ttl_ms)
            .finish_non_exhaustive()
    }
}

/// The policy a key is decided by, given what the override cache said for it: its
/// override's limits, else the policy's own; `None` for an unlimited key.
fn overridden<'a>(
    applied: Option<&'a Applied>,
    policy: &'a RedisPolicy,
) -> Option<&'a RedisPolicy> {
    match applied {
        None => Some(policy),
        Some(Applied::Limits(limits)) => Some(limits),
        Some(Applied::Unlimited) => None,
    }
}

/// A reply the operator's script does not give.
fn unexpected(what: &str) -> AdminError {
    AdminError::Unavailable(StoreError::UnexpectedReply(what.to_owned()))
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store over `conn` with default settings (prefix `rein`, deadline 50 ms). The
    /// connection is never replaced, so it should heal itself, as `ConnectionManager` and
    /// `ClusterConnection` do; see [`RedisStoreBuilder::connect_with`] otherwise.
    pub fn new(conn: C) -> Self {
        Self::with_link(RedisStoreBuilder::new(), Link::fixed(conn))
    }

    /// What Redis holds for `policy` and `key`: [`KeyAdmin::inspect`], with a
    /// [`StateError`] for tools that read state. Read by the operators' script (its `read`,
    /// the key's value and Redis's clock) through [`send`](Self::send), so that it follows
    /// a Cluster's redirects as decisions and changes do (a plain `GET` failed with `ASK`
    /// or `MOVED` while the key's slot migrated).
    async fn read_key(&self, policy: &RedisPolicy, key: &[u8]) -> Result<KeyState, StateError> {
        let keys = crate::key::state_keys(&self.inner.prefix, policy, key)?;
        let read = Invocation::script(&keys, ScriptKind::Admin, vec!["read".to_owned()]);
        let reply = self.send(&read, self.deadline_from_now()).await?;
        let unexpected = |what| StateError::Unavailable(StoreError::UnexpectedReply(what));
        let (_, value) = crate::admin::decode_read(reply).map_err(unexpected)?;
        crate::state::decode_value(policy, value.as_deref()).map_err(unexpected)
    }

    /// Reads the stored state of `policy` for `key`, decoded into rein-core's types: for
    /// debugging, tests and tools. A missing key reads as full limits; a blocked key is
    /// [`StateError::Blocked`] ([`KeyAdmin::inspect`] reads both). One script call (its
    /// `GET`), following a Cluster's redirects.
    pub async fn state(
        &self,
        policy: &RedisPolicy,
        key: impl AsRef<[u8]>,
    ) -> Result<PolicyState, StateError> {
        match self.read_key(policy, key.as_ref()).await? {
            KeyState::Counting(state) => Ok(state),
            KeyState::Blocked { block, .. } => Err(StateError::Blocked(block.ends_at())),
        }
    }

    /// Whether `limits` (an override's) count `key` in another key than `policy`'s own: an
    /// override of another shape, whose blocks are made in both keys.
    fn counts_apart(
        &self,
        policy: &RedisPolicy,
        limits: &RedisPolicy,
        key: &[u8],
    ) -> Result<bool, AdminError> {
        let prefix = &self.inner.prefix;
        let theirs = crate::key::state_keys(prefix, limits, key)?;
        Ok(theirs != crate::key::state_keys(prefix, policy, key)?)
    }

    /// An operator's change as a compare-and-set (admin.rs, lua/admin.lua): read the key
    /// and Redis's clock, compute, write if the key is unchanged; again if it changed.
    async fn change(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        change: Change<'_>,
    ) -> Result<Changed, AdminError> {
        let deadline = self.deadline_from_now();
        let applied = self.applied(policy, key, deadline).await;
        // An unlimited key's counts are the policy's own, which an operator may still set.
        let limits = overridden(applied.as_deref(), policy).unwrap_or(policy);
        let changed = self.change_in(limits, key, change, deadline).await?;
        // A set replaces a block, which under an override of another shape is made in the
        // policy's own key too ([`block`](KeyAdmin::block)): lifted there as well.
        if matches!(change, Change::SetRemaining(_)) && self.counts_apart(policy, limits, key)? {
            done(
                self.change_in(policy, key, Change::Unblock, deadline)
                    .await?,
            )?;
        }
        Ok(changed)
    }

    /// [`change`](Self::change) of the state `policy` (the one that applies) keeps for
    /// `key`, within `deadline`.
    async fn change_in(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        change: Change<'_>,
        deadline: Instant,
    ) -> Result<Changed, AdminError> {
        /// Attempts before [`AdminError::Contended`]: each loses only to a decision that
        /// wrote the key between this change's two calls, well under a millisecond apart.
        const ATTEMPTS: u32 = 16;
        let keys = crate::key::state_keys(&self.inner.prefix, policy, key)?;
        let span =
            tracing::info_span!("rein_redis_admin", policy = policy.name(), change = ?change);
        async {
            for _ in 0..ATTEMPTS {
                let read = Invocation::script(&keys, ScriptKind::Admin, vec!["read".to_owned()]);
                let reply = match self.send(&read, deadline).await {
                    // A token bucket leased as rate holds its shares as a hash, and no
                    // block (one is refused): an unblock has nothing to lift.
                    Err(e) if is_wrong_type(&e) => {
                        return match change {
                            Change::Unblock => Ok(Changed::Done(false)),
                            _ => Err(AdminError::rate_shared()),
                        };
                    }
                    reply => reply?,
                };
                let (now, value) =
                    crate::admin::decode_read(reply).map_err(StoreError::UnexpectedReply)?;
                let current = crate::state::decode_value(policy, value.as_deref())
                    .map_err(StoreError::UnexpectedReply)?;
                let (changed, write) =
                    crate::admin::apply(policy, current, now, change, self.inner.min_ttl_ms)
                        .map_err(|e| StoreError::UnexpectedReply(e.to_string()))?;
                let Some((new, ttl)) = write else {
                    return Ok(changed);
                };
                let args = vec![
                    "swap".to_owned(),
                    if value.is_some() { "1" } else { "0" }.to_owned(),
                    value.unwrap_or_default(),
                    new.unwrap_or_default(),
                    ttl.to_string(),
                ];
                let swap = Invocation::script(&keys, ScriptKind::Admin, args);
                match self.send(&swap, deadline).await? {
                    Value::Int(1) => {
                        tracing::info!(?changed, "changed");
                        return Ok(changed);
                    }
                    Value::Int(0) => tracing::debug!("the key changed meanwhile: again"),
                    other => return Err(unexpected(&format!("a swap answered {other:?}"))),
                }
            }
            Err(AdminError::Contended { attempts: ATTEMPTS })
        }
        .instrument(span)
        .await
    }

    /// Sets what `keys` of the policy named `policy` get instead of its limits (another
    /// limit, or none), for every store of the deployment that applies overrides
    /// ([`RedisStoreBuilder::overrides`]); `true` if it replaced one. One atomic write, at
    /// most [`MAX_OVERRIDES`](rein_core::overrides::MAX_OVERRIDES) per deployment. The
    /// policy's name is not checked against any table: an override of a name no server uses
    /// does nothing.
    pub async fn set_override(
        &self,
        policy: &str,
        keys: &KeyMatch,
        value: &Override,
    ) -> Result<bool, AdminError> {
        self.write_override(policy, keys, Some(value)).await
    }

    /// Removes the override of `keys` of `policy`; `true` if there was one.
    pub async fn remove_override(&self, policy: &str, keys: &KeyMatch) -> Result<bool, AdminError> {
        self.write_override(policy, keys, None).await
    }

    /// Every override of the deployment, read now, in no particular order, and the fields
    /// that do not read (written by hand, or by a later version), which the servers leave
    /// out.
    pub async fn overrides(&self) -> Result<OverrideList, AdminError> {
        let (_, entries) = self.read_overrides(None).await?;
        let mut list = OverrideList::default();
        for entry in entries.unwrap_or_default() {
            match entry {
                Ok(entry) => list.entries.push(entry),
                Err(problem) => list.unreadable.push(problem),
            }
        }
        Ok(list)
    }

    async fn write_override(
        &self,
        policy: &str,
        keys: &KeyMatch,
        value: Option<&Override>,
    ) -> Result<bool, AdminError> {
        rein_core::overrides::check_target(policy, keys)?;
        let hash = [overrides::hash_key(&self.inner.prefix)];
        let field = overrides::field(policy, keys);
        let mut args = vec![b"ovset".to_vec(), field];
        args.push(value.map(Override::encode).unwrap_or_default().into_bytes());
        args.push(overrides::MAX_OVERRIDES.to_string().into_bytes());
        args.push(overrides::channel(&self.inner.prefix).into_bytes());
        let call = Invocation::script_bytes(&hash, ScriptKind::Admin, args);
        let reply = self
            .send(&call, self.deadline_from_now())
            .await
            .map_err(|e| match e {
                StoreError::Server(ref s) if s.to_string().contains("too many overrides") => {
                    AdminError::InvalidOverride(format!(
                        "the deployment holds {} overrides, the most it may",
                        overrides::MAX_OVERRIDES
                    ))
                }
                e => AdminError::Unavailable(e),
            })?;
        if let Some(cache) = &self.inner.overrides {
            cache.expire();
        }
        tracing::info!(policy, ?keys, value = ?value.map(Override::encode), "override written");
        match reply {
            Value::Array(parts) => Ok(matches!(parts.get(1), Some(Value::Int(1)))),
            other => Err(unexpected(&format!("ovset answered {other:?}"))),
        }
    }

    /// `ovread`: the version and, if it is not `known`, every entry.
    #[allow(clippy::type_complexity)]
    async fn read_overrides(
        &self,
        known: Option<String>,
    ) -> Result<(Option<String>, Option<Vec<Result<OverrideEntry, String>>>), StoreError> {
        let hash = [overrides::hash_key(&self.inner.prefix)];
        let args = vec!["ovread".to_owned(), known.unwrap_or_default()];
        let call = Invocation::script(&hash, ScriptKind::Admin, args);
        let reply = self.send(&call, self.deadline_from_now()).await?;
        overrides::decode_read(reply).map_err(StoreError::UnexpectedReply)
    }

    /// Has the overrides' cache re-read at the next decision whenever a write is published
    /// (overrides.rs, `listen`), if this store reads overrides from Redis.
    pub(crate) fn listen_for_overrides(&self, client: redis::Client) {
        if let Some(cache) = &self.inner.overrides
            && matches!(cache.from(), overrides::From::Redis)
        {
            overrides::listen(cache, client, overrides::channel(&self.inner.prefix));
        }
    }

    /// Re-reads the overrides into the cache if they changed.
    async fn load_overrides(&self, cache: &overrides::Cache) -> Result<(), StoreError> {
        let (version, entries) = match cache.from() {
            overrides::From::Redis => self.read_overrides(cache.version()).await?,
            overrides::From::Source(source) => {
                let loaded = tokio::time::timeout(self.inner.deadline, source.load()).await;
                let entries = match loaded {
                    Ok(Ok(entries)) => entries,
                    Ok(Err(e)) => return Err(StoreError::Connection(e)),
                    Err(_) => return Err(StoreError::Timeout(self.inner.deadline)),
                };
                let mut entries: Vec<_> = entries.into_iter().map(Ok).collect();
                if entries.len() > overrides::MAX_OVERRIDES {
                    tracing::warn!(
                        read = entries.len(),
                        kept = overrides::MAX_OVERRIDES,
                        "more overrides than a store keeps"
                    );
                    entries.truncate(overrides::MAX_OVERRIDES);
                }
                (None, Some(entries))
            }
        };
        if let Some(entries) = entries {
            let mut good = Vec::with_capacity(entries.len());
            for entry in entries {
                match entry {
                    Ok(entry) => good.push(entry),
                    Err(what) => tracing::warn!(%what, "an override that does not read: left out"),
                }
            }
            tracing::debug!(version = ?version, overrides = good.len(), "overrides read");
            cache.replace(version, good);
        }
        Ok(())
    }

    /// What the override cache says for `key` under `policy`, reading it first if it is
    /// unread or `staleness` old (see [`RedisStoreBuilder::overrides`]).
    ///
    /// Within the call's `deadline`, which the call itself then goes on under: reading the
    /// overrides is part of the call's time, not added to it. A read cut short keeps the
    /// overrides read before (none before the first read ends).
    async fn applied(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        deadline: Instant,
    ) -> Option<std::sync::Arc<Applied>> {
        let cache = self.inner.overrides.as_ref()?;
        if cache.first().initialized() {
            if cache.claim_read(Instant::now()) {
                let read = tokio::time::timeout_at(deadline, self.load_overrides(cache));
                match read.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(
                        error = %e,
                        "overrides not re-read: keeping the ones read before"
                    ),
                    Err(_) => tracing::warn!(
                        "overrides not re-read within the call's deadline: keeping the ones \
                         read before"
                    ),
                }
            }
        } else if tokio::time::timeout_at(deadline, self.read_overrides_first())
            .await
            .is_err()
        {
            tracing::debug!(
                "the overrides' first read did not end within the call's deadline: the next \
                 call reads them"
            );
        }
        cache.get(policy.name(), key)
    }

    /// A store that connected, started: listening for override changes with `listener`,
    /// and the overrides' first read made.
    pub(crate) async fn started(self, listener: Option<redis::Client>) -> Self {
        if let Some(listener) = listener {
            self.listen_for_overrides(listener);
        }
        self.read_overrides_first().await;
        self
    }

    /// The overrides' first read, once, within the store's deadline: made as the store
    /// connects, or for a store built over the caller's connection by its first decision,
    /// which the decisions meanwhile wait for. If it fails, decisions go by the policies'
    /// own limits until the next read, a re-read `staleness` later (or when a change is
    /// published), not one read per waiting decision, one after another. A decision dropped
    /// while it reads hands the read to the next one waiting.
    pub(crate) async fn read_overrides_first(&self) {
        let Some(cache) = self.inner.overrides.as_ref() else {
            return;
        };
        cache
            .first()
            .get_or_init(|| async {
                cache.claim_read(Instant::now());
                if let Err(e) = self.load_overrides(cache).await {
                    tracing::warn!(
                        error = %e,
                        "overrides not read: deciding without them until the next read"
                    );
                }
            })
            .await;
    }

    /// Reads the overrides into this store's copy now, or says why it could not: for a
    /// one-shot tool (`rein key ...`), whose change must land in the key the override in
    /// force decides by, not in the policy's own because the read as it connected failed
    /// (decisions instead go on by the copy they have). A store without overrides has
    /// nothing to read.
    pub async fn refresh_overrides(&self) -> Result<(), StoreError> {
        let Some(cache) = self.inner.overrides.as_ref() else {
            return Ok(());
        };
        self.read_overrides_first().await;
        cache.claim_read(Instant::now());
        self.load_overrides(cache).await
    }

    /// Redis's clock (`TIME`), the one the scripts decide at when no `now` is given: for
    /// tools that show a stored state's figures as Redis would see them now
    /// (`rein key inspect`). On a Cluster, any node's.
    pub async fn server_time(&self) -> Result<Timestamp, StoreError> {
        let (secs, micros): (u64, u64) = self
            .run(self.deadline_from_now(), |mut conn| async move {
                redis::cmd("TIME").query_async(&mut conn).await
            })
            .await?;
        Ok(Timestamp::from_micros(
            secs.saturating_mul(1_000_000).saturating_add(micros),
        ))
    }

    /// The rate shares kept for `key` of a token bucket leased as rate (docs/leases.md): the
    /// direct share's draw and every node's share with its validity, as `lua/lease_rate.lua`
    /// keeps them in the bucket's own key, decoded as rein-core's `RateState`. `None` when
    /// that key holds no shares (nothing stored, or a bucket decided without leases). The
    /// store-side view of who holds the rate: a share whose validity has passed belongs to a
    /// node that stopped renewing (killed, or cut off) and holds rate until another node's
    /// take reclaims it. Two calls (`TYPE`, `HGETALL`): for tools, not the decision path.
    pub async fn rate_state(
        &self,
        policy: &RedisPolicy,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<RateState>, StateError> {
        let keys = crate::key::state_keys(&self.inner.prefix, policy, key.as_ref())?;
        let Some(redis_key) = keys.into_iter().next() else {
            return Ok(None);
        };
        let kind: String = {
            let redis_key = redis_key.clone();
            self.run(self.deadline_from_now(), |mut conn| async move {
                redis::cmd("TYPE")
                    .arg(&redis_key)
                    .query_async(&mut conn)
                    .await
            })
            .await?
        };
        if kind != "hash" {
            return Ok(None);
        }
        let fields: Vec<(String, String)> = self
            .run(self.deadline_from_now(), |mut conn| async move {
                redis::cmd("HGETALL")
                    .arg(&redis_key)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        crate::state::decode_rate_state(fields)
            .map(Some)
            .map_err(|what| StateError::Unavailable(StoreError::UnexpectedReply(what)))
    }

    /// The Redis keys holding `policy`'s state for `key`: one since key format `v4`, which
    /// keeps every limit of a policy in one key (docs/redis.md, "Key layout"). A list, so
    /// that callers (cleanup, inspection) need not change if that ever changes again.
    pub fn keys(
        &self,
        policy: &RedisPolicy,
        key: impl AsRef<[u8]>,
    ) -> Result<Vec<String>, KeyError> {
        crate::key::state_keys(&self.inner.prefix, policy, key.as_ref())
    }

    async fn decide(
        &self,
        op: Op,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        // A key's override decides it (only decisions, refunds and an operator's changes
        // apply them; a lease's held units keep the policy's own limits).
        let deadline = self.deadline_from_now();
        let applied = self.applied(policy, key, deadline).await;
        let decided = match overridden(applied.as_deref(), policy) {
            None => Ok(rein_core::overrides::unlimited(policy.policy())),
            Some(limits) => self
                .decide_at(op, now, limits, key, cost, deadline)
                .await
                .map(|(decision, _)| decision),
        };
        if let (Op::Acquire, Some(reporter), Ok(decision)) = (op, &self.inner.reporter, &decided)
            && reporter.record(policy.name(), policy.tally(), decision.is_allowed())
        {
            self.start_reporting();
        }
        decided
    }

    /// Spawns the task that reports what the store counted once a second (watch.rs), on
    /// the runtime of the decision that calls it. It ends with the store: what was counted
    /// in the store's last second is not reported.
    fn start_reporting(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no tokio runtime: decisions are counted but not reported");
            return;
        };
        let inner = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            let mut every = tokio::time::interval(crate::watch::REPORT_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every.tick().await;
            loop {
                every.tick().await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                RedisStore { inner }.report().await;
            }
        });
    }

    /// Adds what each policy counted since the last report to its hash for this second:
    /// one pipelined call per policy, within the deadline, never resent.
    async fn report(&self) {
        let Some(reporter) = &self.inner.reporter else {
            return;
        };
        let second = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for (policy, admitted, denied) in reporter.take() {
            let key = crate::watch::key(&self.inner.prefix, &policy, second);
            let mut pipeline = redis::pipe();
            pipeline
                .hincr(&key, "a", admitted)
                .ignore()
                .hincr(&key, "d", denied)
                .ignore()
                .expire(&key, crate::watch::KEEP.as_secs() as i64)
                .ignore();
            let sent: Result<(), StoreError> = self
                .run(self.deadline_from_now(), |mut conn| async move {
                    pipeline.query_async(&mut conn).await
                })
                .await;
            if let Err(e) = sent {
                tracing::debug!(%policy, admitted, denied, error = %e, "counts not reported");
            }
        }
    }

    /// What every process reporting to this deployment
    /// ([`RedisStoreBuilder::report_counts`]) counted for the policy named `policy`, per
    /// Unix second from `first` to `last` inclusive (at most
    /// [`MAX_SECONDS_READ`](crate::watch::MAX_SECONDS_READ) seconds; a second nobody
    /// reported reads zero). One call. A second is complete
    /// [`COMPLETE_AFTER`](crate::watch::COMPLETE_AFTER) after it began.
    pub async fn counts(
        &self,
        policy: &str,
        first: u64,
        last: u64,
    ) -> Result<Vec<crate::watch::Counted>, AdminError> {
        NamedPolicy::check_name(policy).map_err(|e| AdminError::InvalidRequest(e.to_string()))?;
        let span = last.checked_sub(first).and_then(|n| n.checked_add(1));
        let Some(span @ 1..=crate::watch::MAX_SECONDS_READ) = span else {
            return Err(AdminError::InvalidRequest(format!(
                "seconds {first} to {last}: from 1 to {} seconds, the first not after the last",
                crate::watch::MAX_SECONDS_READ
            )));
        };
        let mut pipeline = redis::pipe();
        for second in first..=last {
            let key = crate::watch::key(&self.inner.prefix, policy, second);
            pipeline.cmd("HMGET").arg(key).arg("a").arg("d");
        }
        let replies: Vec<(Option<u64>, Option<u64>)> = self
            .run(self.deadline_from_now(), |mut conn| async move {
                pipeline.query_async(&mut conn).await
            })
            .await?;
        if replies.len() as u64 != span {
            return Err(unexpected("a reply per second"));
        }
        Ok((first..=last)
            .zip(replies)
            .map(|(second, (admitted, denied))| crate::watch::Counted {
                second,
                admitted: admitted.unwrap_or(0),
                denied: denied.unwrap_or(0),
            })
            .collect())
    }

    /// [`decide`](Self::decide), with the instant the script decided at.
    async fn decide_at(
        &self,
        op: Op,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
        deadline: Instant,
    ) -> Result<(Decision, Timestamp), DecideError> {
        OverCapacity::check(cost, policy.policy().capacity())?;
        let keys = crate::key::state_keys(&self.inner.prefix, policy, key)?;
        let span = tracing::debug_span!(
            "rein_redis",
            op = op.as_str(),
            policy = policy.name(),
            cost,
            slot_key = keys.first().map(String::as_str),
        );
        async {
            let (decision, now) = match keys.as_slice() {
                [_] if now.is_none()
                    && matches!(op, Op::Acquire | Op::Peek)
                    && policy.script() != ScriptKind::Policy
                    && self.inner.coalesce.batch.get() > 1 =>
                {
                    let key = keys.into_iter().next().unwrap_or_default();
                    self.coalesced(key, Ask { op, cost }, policy, deadline)
                        .await?
                }
                _ => self.invoke(&keys, op, now, cost, policy, deadline).await?,
            };
            tracing::debug!(
                allowed = decision.is_allowed(),
                remaining = decision.remaining,
                retry_after_us = decision.retry_after.as_micros(),
                now_us = now.as_micros(),
                "decided"
            );
            Ok((decision, now))
        }
        .instrument(span)
        .await
        .inspect_err(|e: &DecideError| tracing::debug!(error = %e, "no decision"))
    }

    async fn refund_inner(
        &self,
        op: Op,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
    ) -> Result<(), DecideError> {
        let deadline = self.deadline_from_now();
        let applied = match op {
            Op::Refund => self.applied(policy, key, deadline).await,
            _ => None,
        };
        let Some(policy) = overridden(applied.as_deref(), policy) else {
            return Ok(());
        };
        let keys = crate::key::state_keys(&self.inner.prefix, policy, key)?;
        let span = tracing::debug_span!(
            "rein_redis",
            op = op.as_str(),
            policy = policy.name(),
            amount,
            slot_key = keys.first().map(String::as_str),
        );
        match self
            .invoke(&keys, op, now, amount, policy, deadline)
            .instrument(span)
            .await
        {
            Ok(_) => Ok(()),
            // A token bucket leased as rate holds its shares as a hash: nothing to refund
            // to, as a leased limiter answers for it.
            Err(e) if op == Op::Refund && is_wrong_type(&e) => Err(DecideError::Unsupported {
                operation: rein_core::rate_share::REFUND_UNSUPPORTED,
            }),
            Err(e) => Err(e.into()),
        }
    }

    async fn invoke(
        &self,
        keys: &[String],
        op: Op,
        now: Option<Timestamp>,
        cost: u64,
        policy: &RedisPolicy,
        deadline: Instant,
    ) -> Result<(Decision, Timestamp), StoreError> {
        let asks = [Ask { op, cost }];
        let invocation = Invocation::new(keys, now, self.inner.min_ttl_ms, policy, &asks);
        let reply = self.send(&invocation, deadline).await?;
        let capacity = policy.policy().capacity();
        let (now, decisions) = script::decode_decisions(reply, policy.script(), 1, capacity)?;
        let decision = decisions.into_iter().next().ok_or_else(|| {
            StoreError::UnexpectedReply("a reply without its decision".to_owned())
        })??;
        Ok((decision, now))
    }

    /// Decides `ask` on `key` through its policy's lane (coalesce.rs): sent at once when the
    /// lane has room, else with the next call of the lane, together with the other
    /// decisions that waited.
    async fn coalesced(
        &self,
        mut key: String,
        ask: Ask,
        policy: &RedisPolicy,
        deadline: Instant,
    ) -> Result<(Decision, Timestamp), StoreError> {
        let answer = {
            let mut lanes = self.lanes();
            let lane = lanes.entry(policy.lane()).or_default();
            if lane.try_send(self.inner.coalesce) {
                None
            } else {
                let (reply, answer) = oneshot::channel();
                lane.wait(Waiter {
                    key: std::mem::take(&mut key),
                    ask,
                    deadline,
                    reply,
                });
                Some(answer)
            }
        };
        match answer {
            None => {
                // Sent now, alone. When it ends (or is dropped), the decisions that waited
                // meanwhile go out as the lane's next call.
                let _turn = Turn {
                    store: self,
                    policy,
                };
                let keys = [key];
                self.invoke(&keys, ask.op, None, ask.cost, policy, deadline)
                    .await
            }
            Some(answer) => match tokio::time::timeout_at(deadline, answer).await {
                Ok(Ok(result)) => result,
                // Dropped from its lane past its deadline, never sent.
                Ok(Err(_)) if Instant::now() >= deadline => {
                    Err(StoreError::Timeout(self.inner.deadline))
                }
                // The call carrying it was dropped (the runtime shutting down): it may or
                // may not have run.
                Ok(Err(_)) => Err(StoreError::Connection(SourceError::new(RedisError::from(
                    (ErrorKind::Io, "the call carrying this decision was dropped"),
                )))),
                // Waited or in flight past its deadline; if in flight, it may have run, and
                // is not sent again.
                Err(_) => Err(StoreError::Timeout(self.inner.deadline)),
            },
        }
    }

    /// One call carrying `waiters` (all of `policy`), their answers sent back to each.
    async fn call_for(&self, policy: &RedisPolicy, waiters: Vec<Waiter>) {
        let count = waiters.len();
        // The latest waiter's: each waiter bounds its own wait (`timeout_at` on its answer),
        // so the call may run as long as the one with the most time left would wait. The
        // earliest's would time the whole call out, every decision in it unknown, for one
        // waiter near its end.
        let deadline = waiters
            .iter()
            .map(|w| w.deadline)
            .max()
            .unwrap_or_else(Instant::now);
        let (keys, rest): (Vec<String>, Vec<_>) = waiters
            .into_iter()
            .map(|w| (w.key, (w.ask, w.reply, w.deadline)))
            .unzip();
        let asks: Vec<Ask> = rest.iter().map(|(ask, ..)| *ask).collect();
        let invocation = Invocation::new(&keys, None, self.inner.min_ttl_ms, policy, &asks);
        let capacity = policy.policy().capacity();
        let span = tracing::debug_span!("rein_redis_call", policy = policy.name(), count);
        let result = async {
            let reply = self.send(&invocation, deadline).await?;
            script::decode_decisions(reply, policy.script(), count, capacity)
        }
        .instrument(span)
        .await;
        match result {
            // A Cluster connection given to `build`: the keys were in several slots, so the
            // script did not run. Each decision goes alone, within its own deadline, unless
            // its caller gave up meanwhile (a decision nobody is told of must not be taken).
            Err(e) if count > 1 && crosses_slots(&e) => {
                for (key, (ask, reply, deadline)) in keys.into_iter().zip(rest) {
                    if reply.is_closed() {
                        continue;
                    }
                    let keys = [key];
                    let alone = self.invoke(&keys, ask.op, None, ask.cost, policy, deadline);
                    let _ = reply.send(alone.await);
                }
            }
            Ok((now, decisions)) => {
                for ((_, reply, _), decision) in rest.into_iter().zip(decisions) {
                    // A caller that gave up meanwhile is not told.
                    let _ = reply.send(decision.map(|d| (d, now)));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, count, "a coalesced call failed");
                for (_, reply, _) in rest {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// The deadline of a call starting now: the decision's one clock read, which the
    /// timer, the redirects and a coalesced call all use.
    fn deadline_from_now(&self) -> Instant {
        Instant::now() + self.inner.deadline
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<usize, Lane<Waiter>>> {
        // Nothing panics while holding the lock, and every update leaves the lanes valid.
        self.inner
            .lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lane's call ended: its next call, or `None` (and an idle lane forgotten).
    fn next_call(&self, lane: usize) -> Option<Vec<Waiter>> {
        let mut lanes = self.lanes();
        let entry = lanes.get_mut(&lane)?;
        // Gone: its caller gave up, or its deadline passed (its timer may not have fired yet:
        // sent now, it could be counted while its caller is told `Timeout`).
        let now = Instant::now();
        let next = entry.next_call(self.inner.coalesce, |w| {
            w.reply.is_closed() || w.deadline <= now
        });
        if entry.is_idle() {
            lanes.remove(&lane);
        }
        next
    }

    async fn share_rate_inner(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        op: RateOp,
    ) -> Result<RateAnswer, DecideError> {
        let [Limit::TokenBucket(bucket)] = policy.policy().limits() else {
            return Err(ShareError::NotShareable.into());
        };
        let shares = RateShares::new(bucket).map_err(|_| ShareError::NotShareable)?;
        // Checked here as the core checks them, so that a bad request is the same typed
        // error from every store, and the script only refuses what no client sends.
        shares.apply(
            now.unwrap_or(Timestamp::EPOCH),
            &mut RateState::default(),
            op,
        )?;
        // The plain bucket's own key: a key decided both ways fails loudly (WRONGTYPE)
        // instead of counting in two states.
        let keys = crate::key::state_keys(&self.inner.prefix, policy, key)?;
        let args = script::rate_args(&op, now, self.inner.min_ttl_ms, &shares);
        let invocation = Invocation::script(&keys, ScriptKind::LeaseRate, args);
        let span = tracing::debug_span!(
            "rein_redis",
            op = "share_rate",
            policy = policy.name(),
            slot_key = keys.first().map(String::as_str),
        );
        async {
            let reply = self.send(&invocation, self.deadline_from_now()).await?;
            Ok(script::decode_rate_reply(&op, reply)?)
        }
        .instrument(span)
        .await
    }

    /// Sends one script call, following only the redirects that prove it did not run.
    async fn send(
        &self,
        invocation: &Invocation<'_>,
        deadline: Instant,
    ) -> Result<Value, StoreError> {
        let router = self.inner.router;
        let reply: Value = self
            .run(deadline, |mut conn| async move {
                // Resends only replies that prove the script did not run (redirect.rs).
                let mut redirects = Redirects::new(router.is_some());
                let mut target = Target::Slot;
                loop {
                    let sent = Instant::now();
                    let error =
                        match route::send(&mut conn, router, &target, invocation, deadline).await {
                            Err(e) => e,
                            // A lean script's decisions each answer their own failure: one
                            // refused as a replica's (`READONLY`) means the server is one,
                            // and every write of the call was refused. The call's error,
                            // then: the redirects wait for a Cluster's new primary, and a
                            // store connected by URL replaces its connection.
                            Ok(reply) => match replica_refusal_in(&reply) {
                                Some(refused) => refused,
                                None => return Ok(reply),
                            },
                        };
                    redirects.observe(sent.elapsed());
                    let left = deadline.saturating_duration_since(Instant::now());
                    match redirects.next(&error, &target, left) {
                        Step::GiveUp => return Err(error),
                        Step::AskingIgnored => return Err(crate::redirect::asking_ignored()),
                        Step::Resend { to, after } => {
                            tracing::debug!(
                                hop = redirects.resends(),
                                reply = %error,
                                to = ?to,
                                after_ms = after.as_millis(),
                                "following a cluster redirect"
                            );
                            if !after.is_zero() {
                                tokio::time::sleep(after).await;
                            }
                            target = to;
                        }
                    }
                }
            })
            .await?;
        Ok(reply)
    }

    /// Runs one request on the connection until `deadline` (the store's deadline from the
    /// caller's one clock read: a decision reads the clock once, not once per layer), and
    /// drops the connection if the failure suggests it is dead. Never retries: the request
    /// itself resends only what redirect.rs allows.
    async fn run<T, F, Fut>(&self, deadline: Instant, request: F) -> Result<T, StoreError>
    where
        F: FnOnce(C) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let waited = || {
            self.inner
                .deadline
                .saturating_sub(deadline.saturating_duration_since(Instant::now()))
        };
        // A call whose deadline passed before it was sent (the overrides' read took it) is
        // not sent: a script sent now would run after its caller gave up on it.
        if Instant::now() >= deadline {
            return Err(StoreError::Timeout(self.inner.deadline));
        }
        let mut generation = None;
        let mut why = Suspicion::Failed;
        let attempt = async {
            let (conn, gen_) = self.inner.link.get().await?;
            generation = Some(gen_);
            request(conn).await.map_err(|e| {
                if refused_by_a_replica(&e) {
                    why = Suspicion::Demoted;
                }
                store_error(e, waited())
            })
        };
        let result = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.inner.deadline)),
        };
        // (A replica's refusal inside a Redis 5 or 6 script error reads as the server's,
        // which suspects no connection by itself.)
        if let (Err(e), Some(generation)) = (&result, generation)
            && (suspects_connection(e) || why == Suspicion::Demoted)
        {
            self.inner.link.suspect(generation, why);
        }
        result
    }

    pub(crate) fn with_link(builder: RedisStoreBuilder, link: Link<C>) -> Self {
        Self::routed(builder, link, None)
    }

    pub(crate) fn routed(
        builder: RedisStoreBuilder,
        link: Link<C>,
        router: Option<Router<C>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                link: Arc::new(link),
                router,
                min_ttl_ms: builder.shared.min_ttl_ms(),
                prefix: builder.shared.prefix,
                deadline: builder.shared.deadline,
                coalesce: builder.coalesce,
                lanes: Mutex::default(),
                overrides: builder
                    .overrides
                    .map(|(from, staleness)| Arc::new(overrides::Cache::new(from, staleness))),
                reporter: builder.report_counts.then(crate::watch::Reporter::default),
            }),
        }
    }
}

/// An operator's changes to one key (docs/operations.md). Each is atomic and exact: it
/// reads the key and Redis's clock, computes the new value with rein-core, and writes it
/// only if no decision changed the key meanwhile (lua/admin.lua), else starts again (at
/// most 16 times, [`AdminError::Contended`]), all within the store's deadline and never
/// replayed. The key's override, if the store applies overrides, is the policy changed. A
/// key leased by a `rein::lease::LeasedLimiter` sees a block when its lease next reaches Redis; a
/// token bucket leased as rate shares does not see it.
impl<C> KeyAdmin for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One script call (its `GET`, following a Cluster's redirects), so the read is
    /// atomic, of the state the key's decisions read: its
    /// override's, if the store applies overrides (an unlimited key's: what the policy's own
    /// limits counted), as the other changes. (Before, the policy's own key, always: a tool
    /// that checked for a block there missed one made under an override of another shape.)
    async fn inspect(&self, policy: &RedisPolicy, key: &[u8]) -> Result<KeyState, AdminError> {
        let applied = self.applied(policy, key, self.deadline_from_now()).await;
        let policy = overridden(applied.as_deref(), policy).unwrap_or(policy);
        self.read_key(policy, key).await.map_err(|e| match e {
            StateError::InvalidKey(e) => AdminError::InvalidKey(e),
            StateError::Unavailable(e) => AdminError::Unavailable(e),
            e => unexpected(&e.to_string()),
        })
    }

    /// One `DEL` of the policy's one key, so no decision sees half of it. What other
    /// servers counted for the key until then is forgotten too: for an operator, not for
    /// refunds. A key overridden by limits of other algorithms is counted in another key
    /// (of the same slot): the same `DEL` forgets both. A token bucket leased as rate keeps
    /// its rate shares in the bucket's own key, so they go with it; servers spend the
    /// shares they hold until those end (docs/operations.md).
    async fn reset(&self, policy: &RedisPolicy, key: &[u8]) -> Result<bool, AdminError> {
        let mut keys = crate::key::state_keys(&self.inner.prefix, policy, key)?;
        let deadline = self.deadline_from_now();
        let applied = self.applied(policy, key, deadline).await;
        if let Some(limits) = overridden(applied.as_deref(), policy) {
            for other in crate::key::state_keys(&self.inner.prefix, limits, key)? {
                if !keys.contains(&other) {
                    keys.push(other);
                }
            }
        }
        // Through the operators' script, which follows a Cluster's redirects (before, a
        // plain `DEL`, which failed with `ASK` while the key's slot migrated).
        let del = Invocation::script(&keys, ScriptKind::Admin, vec!["del".to_owned()]);
        let deleted = match self.send(&del, deadline).await? {
            Value::Int(n) => n,
            other => {
                return Err(unexpected(&format!(
                    "a count of keys deleted, not {other:?}"
                )));
            }
        };
        tracing::info!(policy = policy.name(), "key reset");
        Ok(deleted > 0)
    }

    async fn penalize(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
    ) -> Result<Decision, AdminError> {
        figures(self.change(policy, key, Change::Penalize(amount)).await?)
    }

    async fn set_remaining(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        remaining: u64,
    ) -> Result<Decision, AdminError> {
        figures(
            self.change(policy, key, Change::SetRemaining(remaining))
                .await?,
        )
    }

    async fn block(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        until: Until,
        reason: &str,
    ) -> Result<bool, AdminError> {
        rein_core::admin::check_reason(reason)?;
        let until = match until {
            Until::For(span) => Until::For(Micros::from_micros(span.as_micros().min(MAX_MICROS))),
            at => at,
        };
        let block = Change::Block { until, reason };
        let deadline = self.deadline_from_now();
        let applied = self.applied(policy, key, deadline).await;
        let Some(limits) = overridden(applied.as_deref(), policy) else {
            return Err(AdminError::unlimited_block());
        };
        if !self.counts_apart(policy, limits, key)? {
            return done(self.change_in(policy, key, block, deadline).await?);
        }
        // An override of another shape counts in a key of its own. The block goes into the
        // policy's own key too (first: one holding rate shares refuses it before anything is
        // written): leases decide from it, and the key's decisions go back to it once the
        // override goes (before, leases spent on for the whole block, and removing the
        // override unblocked the key).
        let own = done(self.change_in(policy, key, block, deadline).await?)?;
        let theirs = done(self.change_in(limits, key, block, deadline).await?)?;
        Ok(own | theirs)
    }

    /// Lifts the block in the state the key's decisions read, and one left in the policy's
    /// own key by an override of another shape made after it (decisions go back there once
    /// the override goes), as [`reset`](KeyAdmin::reset) forgets both.
    async fn unblock(&self, policy: &RedisPolicy, key: &[u8]) -> Result<bool, AdminError> {
        let deadline = self.deadline_from_now();
        let applied = self.applied(policy, key, deadline).await;
        let mut lifted = false;
        if let Some(limits) = overridden(applied.as_deref(), policy)
            && self.counts_apart(policy, limits, key)?
        {
            lifted = done(
                self.change_in(limits, key, Change::Unblock, deadline)
                    .await?,
            )?;
        }
        let own = done(
            self.change_in(policy, key, Change::Unblock, deadline)
                .await?,
        )?;
        Ok(lifted | own)
    }
}

/// A change of counts' answer: its figures.
fn figures(changed: Changed) -> Result<Decision, AdminError> {
    match changed {
        Changed::Figures(figures) => Ok(figures),
        Changed::Done(_) => Err(unexpected("no figures for a change of counts")),
    }
}

/// A block's or an unblock's answer: whether it changed anything.
fn done(changed: Changed) -> Result<bool, AdminError> {
    match changed {
        Changed::Done(done) => Ok(done),
        Changed::Figures(_) => Err(unexpected("figures for a block")),
    }
}

impl<C> Limiter for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Prepared = RedisPolicy;

    fn prepare(&self, policy: &NamedPolicy) -> Result<RedisPolicy, PrepareError> {
        Ok(RedisPolicy::prepare(policy))
    }

    fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send {
        self.decide(Op::Acquire, now, policy, key, cost)
    }

    fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send {
        self.decide(Op::Peek, now, policy, key, cost)
    }

    fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        self.refund_inner(Op::Refund, now, policy, key, amount)
    }

    /// The longest a call may take ([`RedisStoreBuilder::deadline`]): what a caller waits
    /// at most, and what the resilient limiter's breaker gives a probe.
    fn deadline(&self) -> Option<Duration> {
        Some(self.inner.deadline)
    }
}

impl<C> Leasable for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn acquire_held(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
        hold: Micros,
    ) -> Result<Held, DecideError> {
        let hold = Micros::from_micros(hold.as_micros().min(MAX_MICROS));
        let op = Op::Hold(hold.as_micros());
        let (decision, now) = self
            .decide_at(op, now, policy, key, cost, self.deadline_from_now())
            .await?;
        Ok(Held {
            decision,
            stamp: now.saturating_add(hold),
        })
    }

    fn refund_held(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
        stamp: Timestamp,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        self.refund_inner(Op::Settle(stamp.as_micros()), now, policy, key, amount)
    }

    fn share_rate(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        op: RateOp,
    ) -> impl Future<Output = Result<RateAnswer, DecideError>> + Send {
        self.share_rate_inner(now, policy, key, op)
    }
}

impl RedisStoreBuilder {
    /// Default settings: prefix `rein`, deadline 50 ms, connect timeout 1 s, no minimum TTL.
    pub fn new() -> Self {
        Self {
            shared: crate::settings::Shared::new(),
            coalesce: Coalesce::DEFAULT,
            overrides: None,
            report_counts: false,
        }
    }

    /// Counts what each policy admits and denies and reports it to Redis once a second,
    /// for `rein watch` and [`RedisStore::counts`]: a relaxed atomic addition per decision,
    /// and one pipelined write a second per policy that decided anything (the
    /// [`watch`](crate::watch) module says what the counts are and are not). Off by
    /// default; rein-tower's config turns it on (`[redis] report_counts`). Reporting needs a
    /// tokio runtime, which the first counted decision finds.
    pub fn report_counts(mut self, on: bool) -> Self {
        self.report_counts = on;
        self
    }

    /// Applies the per-key overrides kept in Redis (`RedisStore::set_override`,
    /// `rein override set`), re-read at most every `staleness`: a change applies in this
    /// process within `staleness` plus one round trip, for decisions made after that, and
    /// a process that cannot reach Redis keeps what it read last. They are first read as
    /// the store connects, within its deadline (a store from [`build`](Self::build) or
    /// [`build_cluster`](Self::build_cluster): by its first decision, which decisions made
    /// meanwhile wait for); if that read fails, decisions go by the policies' own limits
    /// until the next read, `staleness` later or when a change is published. A re-read is
    /// one small command while nothing changed. Decisions (`acquire`,
    /// `peek`), refunds and the operator's changes of an overridden key use its override;
    /// leases (`acquire_held`, `refund_held`, rate shares) keep the policy's own limits.
    /// docs/operations.md, "Overrides", says what a change guarantees meanwhile.
    pub fn overrides(mut self, staleness: Duration) -> Self {
        self.overrides = Some((overrides::From::Redis, staleness));
        self
    }

    /// Applies per-key overrides read from `source` (the application's own database)
    /// instead of Redis, with the same cache as [`overrides`](Self::overrides): read as the
    /// store connects (or at its first decision), then at most every `staleness` by the
    /// decision that finds the copy that old, within the store's deadline; a failed read
    /// keeps the copy. The whole list
    /// is read each time, so keep it to what fits in memory
    /// ([`MAX_OVERRIDES`](rein_core::overrides::MAX_OVERRIDES) are kept, the rest left out
    /// with a warning).
    pub fn override_source(mut self, source: impl OverrideSource, staleness: Duration) -> Self {
        self.overrides = Some((overrides::From::Source(Arc::new(source)), staleness));
        self
    }

    crate::settings::shared_setters!();

    /// How concurrent decisions share script calls (default [`Coalesce::DEFAULT`]: up to
    /// 2 calls of a policy in flight, then up to 64 waiting decisions per call).
    ///
    /// Only `acquire` and `peek` on Redis's clock, of a policy of one token bucket, fixed
    /// window or sliding log, are coalesced (a lone sliding counter runs the policy script,
    /// which does not batch);
    /// a decision that finds room is sent at once, so an idle store behaves as with
    /// [`Coalesce::OFF`]. Each decision stays atomic and exact; a call that times out
    /// fails every decision it carried, none of them replayed. Under load this is what
    /// makes a decision cheaper for the server than the naive scripts
    /// (docs/performance.md, "Redis with coalescing"). A Cluster store does not coalesce:
    /// a script's keys must share a slot.
    pub fn coalesce(mut self, coalesce: Coalesce) -> Self {
        self.coalesce = coalesce;
        self
    }

    /// A store over `conn`, which is never replaced: it should heal itself, as
    /// `ConnectionManager` and `ClusterConnection` do.
    pub fn build<C>(self, conn: C) -> Result<RedisStore<C>, SettingsError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        self.validate()?;
        Ok(RedisStore::with_link(self, Link::fixed(conn)))
    }

    /// A store that makes its connections with `connector`: once now, and again whenever a
    /// call times out or hits a connection error (the connection may be dead without
    /// knowing it, as a TCP stream cut by a partition is). Use it for connections that do
    /// not heal themselves, such as a `MultiplexedConnection` over the caller's own stream.
    ///
    /// ```no_run
    /// use redis::aio::MultiplexedConnection;
    /// use rein_redis::RedisStoreBuilder;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let store = RedisStoreBuilder::new()
    ///     .connect_with(move || {
    ///         let client = client.clone();
    ///         async move { client.get_multiplexed_async_connection().await }
    ///     })
    ///     .await?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_with<C, F, Fut>(
        self,
        connector: F,
    ) -> Result<RedisStore<C>, crate::ConnectError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RedisResult<C>> + Send + 'static,
    {
        self.validate()?;
        let connector: Connector<C> = Arc::new(move || Box::pin(connector()));
        let timeout = self.shared.connect_timeout;
        let conn = crate::connect::first_connection(timeout, connector()).await?;
        let link = Link::new(conn, crate::link::Replace::WhenSuspect(connector), timeout);
        Ok(RedisStore::with_link(self, link).started(None).await)
    }

    pub(crate) fn validate(&self) -> Result<(), SettingsError> {
        if let Some((_, staleness)) = &self.overrides {
            crate::settings::bounded("the overrides' staleness", *staleness)?;
        }
        self.shared.validate()
    }
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// A call of a lane in flight. When it ends, or is dropped with its caller, the decisions
/// that waited meanwhile go out as the lane's next call, in a task of their own.
struct Turn<'a, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    store: &'a RedisStore<C>,
    policy: &'a RedisPolicy,
}

impl<C> Drop for Turn<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        next_turn(self.store, self.policy);
    }
}

/// The lane's next call, owned by the task that makes it: released when the task ends, or
/// when it is dropped before it ever ran (a runtime shutting down drops it unpolled; a turn
/// made inside it would never exist, and the lane would wait for it forever).
struct NextTurn<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    store: RedisStore<C>,
    policy: RedisPolicy,
}

impl<C> Drop for NextTurn<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        next_turn(&self.store, &self.policy);
    }
}

/// Sends the decisions that waited for `policy`'s lane as its next call, in a task of its
/// own, once a call of it ended.
fn next_turn<C>(store: &RedisStore<C>, policy: &RedisPolicy)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let lane = policy.lane();
    let Some(waiters) = store.next_call(lane) else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to send it on: the waiters' senders drop with it, and each is told its
        // call was dropped; the lane forgets the call.
        drop(waiters);
        while store.next_call(lane).is_some() {}
        return;
    };
    let turn = NextTurn {
        store: store.clone(),
        policy: policy.clone(),
    };
    runtime.spawn(async move {
        turn.store.call_for(&turn.policy, waiters).await;
        drop(turn);
    });
}

/// Whether `e` says a call's keys were in several Cluster slots (so it did not run).
fn crosses_slots(e: &StoreError) -> bool {
    let (StoreError::Server(source) | StoreError::Connection(source)) = e else {
        return false;
    };
    source
        .inner()
        .downcast_ref::<RedisError>()
        .is_some_and(|e| e.kind() == ErrorKind::Server(redis::ServerErrorKind::CrossSlot))
}

/// The first part of every key a Redis store writes unless given another
/// ([`RedisStoreBuilder::prefix`]); the optimistic store and rein-tower's config use it too.
pub const DEFAULT_PREFIX: &str = "rein";

/// How long a store's first connect may take unless told otherwise
/// ([`RedisStoreBuilder::connect_timeout`]): covers a TCP and TLS handshake to a Redis in
/// another zone, and fails fast enough that a background reconnect loop notices a recovered
/// server within about a second. The optimistic store and rein-tower's config use it too.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest a store's deadline, connect timeout or overrides' staleness may be: an hour,
/// far past any use for a limit's decision, and short enough that an instant that far off
/// is always representable (a longer one, such as `300000000000y` in a file, would overflow
/// the clock at the first call). rein-tower's config checks its durations against it too.
pub const MAX_DURATION: Duration = Duration::from_secs(3_600);

/// Whether `error` is a write refused because the server is a replica: `READONLY`, or on
/// Redis 5 and 6 a script's error that holds it (a `redis.call` refused inside a script
/// came back as `ERR Error running script … READONLY …` before Redis 7). Read from the
/// text only to replace a connection, never to resend a call.
fn refused_by_a_replica(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || (error.code() == Some("ERR")
            && error
                .detail()
                .is_some_and(|d| d.contains("READONLY You can't write against a read only")))
}

/// A replica's refusal ([`refused_by_a_replica`]) among a lean script's replies, one
/// element per figure: a write of one of its decisions refused because the server is one.
fn replica_refusal_in(reply: &Value) -> Option<redis::RedisError> {
    let Value::Array(items) = reply else {
        return None;
    };
    items.iter().find_map(|item| {
        match item {
            Value::ServerError(e) => Some(redis::RedisError::from(e.clone())),
            _ => None,
        }
        .filter(refused_by_a_replica)
    })
}

/// Whether Redis refused the call because the key holds another type (`WRONGTYPE`; Redis 5
/// and 6 report it inside an `ERR Error running script` reply).
fn is_wrong_type(error: &StoreError) -> bool {
    matches!(error, StoreError::Server(source) if source.inner().to_string().contains("WRONGTYPE"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(resp: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{resp}\r\n").as_bytes())
            .expect("a well-formed error reply");
        value.extract_error().expect_err("an error reply")
    }

    /// A replica's refusal, as Redis 7 sends it and as Redis 5 and 6 wrapped it in a
    /// script's error; nothing else.
    #[test]
    fn a_replicas_refusal_is_read_in_either_form() {
        for (resp, replica) in [
            (
                "READONLY You can't write against a read only replica.",
                true,
            ),
            (
                "ERR Error running script (call to f_0a1b): @user_script:12: -READONLY You can't \
                 write against a read only replica.",
                true,
            ),
            (
                "ERR Error running script (call to f_0a1b): @user_script:12: bad",
                false,
            ),
            ("NOPERM this user has no permissions", false),
        ] {
            assert_eq!(refused_by_a_replica(&reply(resp)), replica, "{resp}");
        }
    }
}
