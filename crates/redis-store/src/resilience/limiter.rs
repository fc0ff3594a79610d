//! [`ResilientLimiter`]: the driver that puts the store, the caches, the breaker, the
//! fallback and the counters together on the request path.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::ConnectionLike;
use rein_core::{Decision, Micros, Outcome, Timestamp};
use rein_memory::{Clock, MemoryLimiter};
use tracing::Instrument;

use super::allow_cache::{AllowCache, AllowCacheConfig};
use super::breaker::{Breaker, BreakerConfig, BreakerEvent, BreakerState, Ticket};
use super::clock::TokioClock;
use super::decided::{Decided, Source, Unavailable};
use super::deny_cache::DenyCache;
use super::fallback::{FailurePolicy, local_share};
use super::stats::{Stats, StatsSnapshot};
use super::table::PolicyTable;
use super::{RequestError, ResilienceConfigError};
use crate::{AcquireError, KeyError, NamedPolicy, RedisStore, RefundError};

/// Rate limits through Redis that still answer, within the deadline, when Redis does not.
///
/// Each [`acquire`](Self::acquire) picks the key's policy from the [`PolicyTable`], then
/// answers from the first of these that can, and says which in [`Decided::source`]:
///
/// 1. the **deny cache**: Redis denied this much for this key moments ago, and its
///    `retry_after` has not run out ([`Source::DenyCache`]; exact, on by default);
/// 2. the **allow cache**, only if enabled with
///    [`danger_allow_cache`](ResilientLimiterBuilder::danger_allow_cache)
///    ([`Source::AllowCache`]; over-admits within a stated bound);
/// 3. **Redis**, one script call within the store's deadline, unless the circuit breaker is
///    open ([`Source::Redis`]);
/// 4. the **failure policy** when Redis gives no decision: admit, refuse, or decide locally
///    at this node's share ([`Source::FailOpen`], [`Source::FailClosed`],
///    [`Source::Fallback`]).
///
/// # Deadline
/// No call waits for anything but Redis, and that wait is the store's deadline
/// ([`RedisStoreBuilder::deadline`](crate::RedisStoreBuilder::deadline), default 50 ms),
/// which covers waiting for a connection or a reconnect and the round trip. Everything else
/// (caches, breaker, fallback, counters) is local work under short locks, with no await. So
/// every call returns within the deadline plus that work (microseconds). A second timer, a
/// few milliseconds later, guards that bound should the store ever overrun its own.
///
/// A call that timed out is never replayed: it may have run in Redis, and a replay could
/// count the request twice. The failure policy answers instead.
///
/// # Time
/// Local time (cache expiry, breaker timers, the fallback limiter, latencies) is read only
/// from the limiter's [`Clock`], by default a [`TokioClock`]; waiting is only through
/// `tokio::time`. Redis decides on its own `TIME` unless [`TimeSource::LocalClock`] is
/// chosen. Under turmoil, or `tokio::time::pause`, the whole limiter runs in virtual time.
///
/// # Failures
/// Redis failures never surface as `Err`: the failure policy turns them into decisions, and
/// [`stats`](Self::stats) counts them by kind. `Err` ([`RequestError`]) means the request
/// itself is wrong and Redis would refuse it too. Nothing is sticky: the breaker closes on
/// its own when Redis answers a probe.
///
/// The limiter is cheap to clone (an `Arc`); clones share everything.
///
/// ```no_run
/// use std::num::NonZeroU32;
/// use rein_core::{Limit, Micros, Policy};
/// use rein_redis::{FailurePolicy, NamedPolicy, PolicyTable, RedisStore, ResilientLimiter, Source};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let api = NamedPolicy::new("api", Policy::single(Limit::token_bucket(100, 10, Micros::from_secs(1))?))?;
/// let limiter = ResilientLimiter::builder(
///     store,
///     PolicyTable::new(api),
///     // 8 application servers: each admits 12 (and 1.25/s) on its own while Redis is away.
///     FailurePolicy::LocalFallback { expected_nodes: NonZeroU32::new(8).unwrap() },
/// )
/// .build()?;
/// let decided = limiter.acquire("user-42", 1).await?;
/// if !decided.is_allowed() {
///     // 429, Retry-After: decided.decision.retry_after
/// }
/// if let Source::Fallback(why) = decided.source {
///     tracing::debug!(why = why.as_str(), "decided locally");
/// }
/// # Ok(())
/// # }
/// ```
pub struct ResilientLimiter<C> {
    inner: Arc<Shared<C>>,
}

/// Settings for a [`ResilientLimiter`], from [`ResilientLimiter::builder`].
pub struct ResilientLimiterBuilder<C> {
    store: RedisStore<C>,
    table: PolicyTable,
    on_failure: FailurePolicy,
    name: String,
    clock: Option<SharedClock>,
    time_source: TimeSource,
    breaker: BreakerConfig,
    deny_cache: Option<NonZeroUsize>,
    allow_cache: Option<AllowCacheConfig>,
    fallback_max_keys: NonZeroUsize,
}

/// Whose clock Redis decides on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimeSource {
    /// Redis's `TIME`, read inside the script (the store's default): one clock for every
    /// node, whatever their own clocks say. The limiter's clock still times the local work.
    #[default]
    RedisServer,
    /// The limiter's [`Clock`], passed to the store's explicit-time calls
    /// ([`acquire_at`](RedisStore::acquire_at)): for simulators and tests. Every node must
    /// then read clocks that agree (the default [`TokioClock`] counts from when it was
    /// made and does not), and the store wants a
    /// [`min_ttl`](crate::RedisStoreBuilder::min_ttl) if that clock does not advance with
    /// Redis's. The deny cache is then exact to the microsecond.
    LocalClock,
}

/// The limiter's clock, shared with its fallback limiters.
type SharedClock = Arc<dyn Clock + Send + Sync>;

struct Shared<C> {
    name: String,
    store: RedisStore<C>,
    table: PolicyTable,
    on_failure: FailurePolicy,
    /// One per table policy, in the table's order, at the node's share; empty unless the
    /// failure policy is [`FailurePolicy::LocalFallback`].
    fallback: Vec<MemoryLimiter<Vec<u8>, SharedClock>>,
    clock: SharedClock,
    time_source: TimeSource,
    /// The store's deadline plus [`SAFETY_NET`].
    guard_deadline: Duration,
    /// A std mutex: every use is a few comparisons with no await, and the breaker must see
    /// one order of outcomes.
    breaker: Mutex<Breaker>,
    deny_cache: Option<DenyCache>,
    allow_cache: Option<AllowCache>,
    stats: Stats,
}

impl<C> ResilientLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Settings for a limiter over `store`, deciding each key by its policy in `table` and
    /// answering with `on_failure` when Redis cannot. Defaults: name `rein`, a
    /// [`TokioClock`], Redis's `TIME`, [`BreakerConfig::new`] with the store's deadline as
    /// probe timeout, a deny cache of 65 536 entries, no allow cache, and room for 65 536
    /// keys per policy in the fallback limiters.
    pub fn builder(
        store: RedisStore<C>,
        table: PolicyTable,
        on_failure: FailurePolicy,
    ) -> ResilientLimiterBuilder<C> {
        ResilientLimiterBuilder {
            store,
            table,
            on_failure,
            name: DEFAULT_NAME.to_owned(),
            clock: None,
            time_source: TimeSource::RedisServer,
            breaker: BreakerConfig::new(),
            deny_cache: Some(DEFAULT_CACHE_ENTRIES),
            allow_cache: None,
            fallback_max_keys: DEFAULT_CACHE_ENTRIES,
        }
    }

    /// Decides `cost` for `key` under the policy the table classifies it into (longest
    /// matching prefix rule, or the default). A cost of zero asks Redis without taking
    /// anything and is never cached.
    ///
    /// Errors only for a request that can never be admitted: an empty key, or a cost above
    /// the policy's capacity.
    pub async fn acquire(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decided, RequestError> {
        let key = key.as_ref();
        let index = self.inner.table.classify_index(key);
        self.decide(index, key, cost).await
    }

    /// [`acquire`](Self::acquire) under the policy named `policy`, whatever the key's
    /// prefix. Errors also if the table has no such policy.
    pub async fn acquire_as(
        &self,
        policy: &str,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Decided, RequestError> {
        let Some(index) = self.inner.table.index_of(policy) else {
            self.inner.stats.invalid_request();
            return Err(RequestError::UnknownPolicy(policy.to_owned()));
        };
        self.decide(index, key.as_ref(), cost).await
    }

    /// Gives back up to `amount` to every limit of the policy `key` is classified into, in
    /// Redis, and forgets any cached denial or reuse for the key (the capacity came back,
    /// so a cached answer would be stale).
    ///
    /// A refund is best effort by design: it is bounded by the store's deadline, it is
    /// never replayed (a timed-out refund may have run), it does not go through the circuit
    /// breaker, and it is not applied to the local fallback, whose admissions Redis never
    /// saw. A failure is returned as the store's [`RefundError`].
    pub async fn refund(&self, key: impl AsRef<[u8]>, amount: u64) -> Result<(), RefundError> {
        let key = key.as_ref();
        let inner = &*self.inner;
        let index = inner.table.classify_index(key);
        let policy = &inner.table.policies()[index];
        // The table holds far fewer than 2^32 policies (each is a Vec entry built by hand).
        let slot = index as u32;
        if let Some(cache) = &inner.deny_cache {
            cache.forget(slot, key);
        }
        if let Some(cache) = &inner.allow_cache {
            cache.block(inner.clock.now(), slot, key);
        }
        let request = async {
            match inner.time_source {
                TimeSource::RedisServer => inner.store.refund(policy, key, amount).await,
                TimeSource::LocalClock => {
                    inner
                        .store
                        .refund_at(inner.clock.now(), policy, key, amount)
                        .await
                }
            }
        };
        match tokio::time::timeout(inner.guard_deadline, request).await {
            Ok(result) => result,
            Err(_) => Err(RefundError::Timeout(inner.guard_deadline)),
        }
    }

    /// The counters since the limiter was built.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// The circuit breaker's state as of its last input. An open breaker whose period has
    /// ended turns half-open at the next request, not by itself.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.lock_breaker().state()
    }

    /// The name given to [`ResilientLimiterBuilder::name`], the `limiter` label of its
    /// metrics.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The policy table.
    pub fn table(&self) -> &PolicyTable {
        &self.inner.table
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.on_failure
    }

    /// The store it calls.
    pub fn store(&self) -> &RedisStore<C> {
        &self.inner.store
    }

    async fn decide(&self, index: usize, key: &[u8], cost: u64) -> Result<Decided, RequestError> {
        let inner = &*self.inner;
        let policy = &inner.table.policies()[index];
        let capacity = policy.policy().capacity();
        if key.is_empty() || cost > capacity {
            inner.stats.invalid_request();
            return Err(if key.is_empty() {
                RequestError::InvalidKey(KeyError::Empty)
            } else {
                RequestError::InsufficientCapacity { cost, capacity }
            });
        }
        let span = tracing::debug_span!(
            "rein_decide",
            limiter = %inner.name,
            policy = policy.name(),
            cost,
        );
        async {
            let decided = inner.decide(index, policy, key, cost).await?;
            inner.stats.decided(decided.source, decided.is_allowed());
            tracing::debug!(
                source = decided.source.as_str(),
                unavailable = decided.source.unavailable().map(|why| why.as_str()),
                allowed = decided.is_allowed(),
                remaining = decided.decision.remaining,
                retry_after_us = decided.decision.retry_after.as_micros(),
                "decided"
            );
            Ok(decided)
        }
        .instrument(span)
        .await
    }
}

impl<C> Shared<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The request path for a valid request: caches, breaker, Redis, failure policy.
    async fn decide(
        &self,
        index: usize,
        policy: &NamedPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decided, RequestError> {
        // The table holds far fewer than 2^32 policies (each is a Vec entry built by hand).
        let slot = index as u32;
        // Read before anything is sent: the deny cache's expiry counts from here, so it
        // ends no later than Redis's denial, which was decided after this instant.
        let sent_at = self.clock.now();
        // A zero cost is a question about the state, which only Redis can answer.
        let cached = cost > 0;
        if let Some(decision) = self
            .deny_cache
            .as_ref()
            .filter(|_| cached)
            .and_then(|c| c.check(sent_at, slot, key, cost))
        {
            return Ok(Decided {
                decision,
                source: Source::DenyCache,
            });
        }
        if let Some(decision) = self
            .allow_cache
            .as_ref()
            .filter(|_| cached)
            .and_then(|c| c.check(sent_at, slot, key, cost))
        {
            return Ok(Decided {
                decision,
                source: Source::AllowCache,
            });
        }
        let Some(ticket) = self.with_breaker(|b| b.poll_admit(sent_at)) else {
            self.stats.breaker_rejection();
            return Ok(self.degrade(Unavailable::BreakerOpen, index, key, cost, sent_at));
        };
        let mut call = InFlight {
            shared: self,
            ticket: Some(ticket),
        };
        self.stats.redis_call();
        let request = async {
            match self.time_source {
                TimeSource::RedisServer => self.store.acquire(policy, key, cost).await,
                TimeSource::LocalClock => self.store.acquire_at(sent_at, policy, key, cost).await,
            }
        };
        let reply = tokio::time::timeout(self.guard_deadline, request).await;
        let now = self.clock.now();
        self.stats.redis_latency(now.saturating_since(sent_at));
        let ticket = call.finish();
        let error = match reply {
            Ok(Ok(decision)) => {
                self.with_breaker(|b| b.handle_success(now, ticket));
                if cached {
                    self.remember(sent_at, now, slot, key, cost, &decision);
                }
                return Ok(Decided {
                    decision,
                    source: Source::Redis,
                });
            }
            Ok(Err(error)) => error,
            Err(_) => AcquireError::Timeout(self.guard_deadline),
        };
        let why = match &error {
            AcquireError::Timeout(_) => Unavailable::Timeout,
            AcquireError::Connection(_) => Unavailable::Connection,
            AcquireError::Server(_) => Unavailable::Server,
            AcquireError::UnexpectedReply(_) => Unavailable::UnexpectedReply,
            // Checked before the call; if the store refuses what the table accepted, no
            // call was made, which tells the breaker nothing.
            &AcquireError::InsufficientCapacity { cost, capacity } => {
                self.with_breaker(|b| b.handle_abandoned(now, ticket));
                return Err(RequestError::InsufficientCapacity { cost, capacity });
            }
            &AcquireError::InvalidKey(e) => {
                self.with_breaker(|b| b.handle_abandoned(now, ticket));
                return Err(RequestError::InvalidKey(e));
            }
        };
        tracing::debug!(error = %error, why = why.as_str(), "Redis gave no decision");
        self.stats.redis_error(why);
        self.with_breaker(|b| b.handle_failure(now, ticket));
        Ok(self.degrade(why, index, key, cost, now))
    }

    /// Feeds a decision from Redis to the caches.
    fn remember(
        &self,
        sent_at: Timestamp,
        now: Timestamp,
        slot: u32,
        key: &[u8],
        cost: u64,
        decision: &Decision,
    ) {
        if decision.is_allowed() {
            if let Some(cache) = &self.deny_cache {
                cache.forget(slot, key);
            }
            if let Some(cache) = &self.allow_cache {
                cache.record(now, slot, key, cost, decision);
            }
        } else {
            if let Some(cache) = &self.deny_cache {
                cache.record(sent_at, now, slot, key, cost, decision);
            }
            if let Some(cache) = &self.allow_cache {
                cache.block(now, slot, key);
            }
        }
    }

    /// The failure policy's answer, because Redis gave none (`why`).
    fn degrade(
        &self,
        why: Unavailable,
        index: usize,
        key: &[u8],
        cost: u64,
        now: Timestamp,
    ) -> Decided {
        let capacity = self.table.policies()[index].policy().capacity();
        match self.on_failure {
            FailurePolicy::FailOpen => Decided {
                decision: Decision {
                    outcome: Outcome::Allowed,
                    limit: capacity,
                    remaining: 0,
                    retry_after: Micros::ZERO,
                    reset_after: Micros::ZERO,
                },
                source: Source::FailOpen(why),
            },
            FailurePolicy::FailClosed => {
                let wait = self.breaker_wait(now);
                Decided {
                    decision: Decision {
                        outcome: Outcome::Denied,
                        limit: capacity,
                        remaining: 0,
                        retry_after: wait,
                        reset_after: wait,
                    },
                    source: Source::FailClosed(why),
                }
            }
            FailurePolicy::LocalFallback { .. } => {
                let limiter = &self.fallback[index];
                let decision = match limiter.acquire_at(now, key, cost) {
                    Ok(decision) => decision,
                    // The cost fits the policy but not this node's share of it: it cannot
                    // be admitted locally, so deny until Redis may be asked again.
                    Err(_) => {
                        let wait = self.breaker_wait(now);
                        let peek = limiter.peek_at(now, key, 0).ok();
                        Decision {
                            outcome: Outcome::Denied,
                            limit: limiter.policy().capacity(),
                            remaining: peek.map_or(0, |d| d.remaining),
                            retry_after: wait,
                            reset_after: peek.map_or(wait, |d| d.reset_after.max(wait)),
                        }
                    }
                };
                Decided {
                    decision,
                    source: Source::Fallback(why),
                }
            }
        }
    }

    /// How long until the breaker lets a call through again: zero when closed.
    fn breaker_wait(&self, now: Timestamp) -> Micros {
        self.lock_breaker()
            .poll_timeout()
            .map_or(Micros::ZERO, |at| at.saturating_since(now))
    }

    /// Runs `f` on the breaker, then logs and counts the transitions it made, under the
    /// same lock so that the state gauge follows the breaker's own order.
    fn with_breaker<R>(&self, f: impl FnOnce(&mut Breaker) -> R) -> R {
        let mut breaker = self.lock_breaker();
        let result = f(&mut breaker);
        while let Some(event) = breaker.poll_event() {
            self.stats.breaker_event(&event);
            log_transition(&self.name, &event);
        }
        result
    }

    fn lock_breaker(&self) -> MutexGuard<'_, Breaker> {
        // The breaker's methods do not panic and update it in single assignments.
        self.breaker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A call to Redis in flight. If the caller drops the future before the call ends, the
/// ticket is handed back as abandoned, so a dropped probe does not hold the breaker
/// half-open until its timeout.
struct InFlight<'a, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    shared: &'a Shared<C>,
    ticket: Option<Ticket>,
}

impl<C> InFlight<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The call ended; its outcome is reported with the returned ticket.
    fn finish(&mut self) -> Ticket {
        // Set at construction and taken only here, once.
        self.ticket.take().expect("finish is called once")
    }
}

impl<C> Drop for InFlight<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let now = self.shared.clock.now();
            self.shared
                .with_breaker(|b| b.handle_abandoned(now, ticket));
        }
    }
}

fn log_transition(limiter: &str, event: &BreakerEvent) {
    match *event {
        BreakerEvent::Opened {
            at,
            from,
            until,
            trips,
        } => tracing::warn!(
            limiter,
            from = from.as_str(),
            trips,
            at_us = at.as_micros(),
            open_for_us = until.saturating_since(at).as_micros(),
            "rein: circuit breaker opened; Redis calls stop, the failure policy answers"
        ),
        BreakerEvent::HalfOpened { at } => tracing::info!(
            limiter,
            at_us = at.as_micros(),
            "rein: circuit breaker half-open; the next request probes Redis"
        ),
        BreakerEvent::Closed { at } => tracing::info!(
            limiter,
            at_us = at.as_micros(),
            "rein: circuit breaker closed; Redis decides again"
        ),
    }
}

impl<C> ResilientLimiterBuilder<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The `limiter` label of this limiter's metrics and logs (default `rein`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The local clock (default a [`TokioClock`]). It should be monotonic: the caches and
    /// the breaker measure durations on it.
    pub fn clock(mut self, clock: impl Clock + Send + Sync + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Whose clock Redis decides on (default [`TimeSource::RedisServer`]).
    pub fn time_source(mut self, source: TimeSource) -> Self {
        self.time_source = source;
        self
    }

    /// The circuit breaker's settings (default [`BreakerConfig::new`]). Its probe timeout is
    /// replaced by the store's deadline (plus the limiter's safety margin).
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// The deny cache's size (default 65 536 entries), or `None` to turn it off.
    pub fn deny_cache(mut self, max_entries: Option<NonZeroUsize>) -> Self {
        self.deny_cache = max_entries;
        self
    }

    /// **Over-admits.** Reuses admissions from Redis locally, at most `max_reuses` times
    /// per key per window of `ttl` on each node, without asking Redis: seed 000's
    /// "allowed" cache, bounded. Redis never counts the reuses, so, per key, `N` nodes
    /// admit up to `N × max_reuses × (⌈T / ttl⌉ + 1)` requests beyond the limit over any
    /// interval `T` (docs/failure.md). Use it only where a Redis round trip per request
    /// costs more than that excess.
    pub fn danger_allow_cache(mut self, config: AllowCacheConfig) -> Self {
        self.allow_cache = Some(config);
        self
    }

    /// Keys per policy the fallback limiters hold (default 65 536; only used with
    /// [`FailurePolicy::LocalFallback`]). Beyond it, keys nearest to full are evicted and
    /// start over from full, which admits more than the share: size it for the keys active
    /// during an outage.
    pub fn fallback_max_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.fallback_max_keys = max_keys;
        self
    }

    /// The limiter. Errors if a duration is zero or a policy has no exact share for the
    /// expected node count.
    pub fn build(self) -> Result<ResilientLimiter<C>, ResilienceConfigError> {
        if self.breaker.base_backoff_value().is_zero() {
            return Err(ResilienceConfigError::ZeroDuration("breaker backoff"));
        }
        if self
            .allow_cache
            .is_some_and(|config| config.ttl_value().is_zero())
        {
            return Err(ResilienceConfigError::ZeroDuration("allow-cache ttl"));
        }
        let clock = self
            .clock
            .unwrap_or_else(|| Arc::new(TokioClock::new()) as SharedClock);
        let fallback = match self.on_failure {
            FailurePolicy::LocalFallback { expected_nodes } => self
                .table
                .policies()
                .iter()
                .map(|named| {
                    let share = local_share(named.policy(), expected_nodes).map_err(|source| {
                        ResilienceConfigError::Share {
                            policy: named.name().to_owned(),
                            source,
                        }
                    })?;
                    Ok(MemoryLimiter::builder(share)
                        .max_keys(self.fallback_max_keys)
                        .clock(Arc::clone(&clock))
                        .build())
                })
                .collect::<Result<Vec<_>, ResilienceConfigError>>()?,
            FailurePolicy::FailOpen | FailurePolicy::FailClosed => Vec::new(),
        };
        let guard_deadline = self.store.deadline().saturating_add(SAFETY_NET);
        let breaker = Breaker::new(self.breaker.probe_timeout(guard_deadline));
        Ok(ResilientLimiter {
            inner: Arc::new(Shared {
                stats: Stats::new(&self.name),
                name: self.name,
                store: self.store,
                table: self.table,
                on_failure: self.on_failure,
                fallback,
                clock,
                time_source: self.time_source,
                guard_deadline,
                breaker: Mutex::new(breaker),
                deny_cache: self.deny_cache.map(DenyCache::new),
                allow_cache: self.allow_cache.map(AllowCache::new),
            }),
        })
    }
}

impl<C> Clone for ResilientLimiter<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> fmt::Debug for ResilientLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientLimiter")
            .field("name", &self.inner.name)
            .field("on_failure", &self.inner.on_failure)
            .field("time_source", &self.inner.time_source)
            .field("policies", &self.inner.table.policies().len())
            .finish_non_exhaustive()
    }
}

impl<C> fmt::Debug for ResilientLimiterBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientLimiterBuilder")
            .field("name", &self.name)
            .field("on_failure", &self.on_failure)
            .field("time_source", &self.time_source)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache)
            .field("allow_cache", &self.allow_cache)
            .finish_non_exhaustive()
    }
}

const DEFAULT_NAME: &str = "rein";

/// 65 536 entries: more keys than one node sees denied within a typical `retry_after`, and
/// a few MiB at most.
const DEFAULT_CACHE_ENTRIES: NonZeroUsize = NonZeroUsize::new(1 << 16).expect("nonzero");

/// How long after the store's deadline the limiter's own timer fires. The store's timer
/// normally fires first, which lets a store built with a connector replace a connection that
/// went silent; 5 ms is above tokio's 1 ms timer resolution and a scheduling hiccup, and
/// short against the deadline.
const SAFETY_NET: Duration = Duration::from_millis(5);
