//! [`ResilientLimiter`]: the thin async driver that puts a store and the [`Gate`] together
//! on the request path.

use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use rein_core::admin::{AdminError, KeyAdmin, KeyState, Until};
use rein_core::limiter::SourceError;
use rein_core::{
    DecideError, Decision, Held, Leasable, Limiter, Micros, NamedPolicy, OverCapacity,
    PrepareError, StoreError, Timestamp,
    rate_share::{RateAnswer, RateOp, ShareError},
};
use rein_memory::{Clock, MemoryLimiter};
use tracing::Instrument;

use crate::allow_cache::AllowCacheConfig;
use crate::breaker::{BreakerConfig, BreakerState, Ticket};
use crate::clock::TokioClock;
use crate::decided::{Decided, Unavailable};
use crate::fallback::{FailurePolicy, local_share};
use crate::gate::{Ask, Gate, Reply, Request, Step};
use crate::mode::{Direct, Mode};
use crate::owner::Owner;
use crate::stats::StatsSnapshot;
use crate::table::PolicyTable;
use crate::{RequestError, ResilienceConfigError};

/// Rate limits through a shared store that still answer, within the deadline, when the
/// store does not.
///
/// Each [`acquire`](Self::acquire) picks the key's policy from the [`PolicyTable`], then
/// answers from the first of these that can, and says which in [`Decided::source`]:
///
/// 1. the **deny cache**: the store denied this much for this key moments ago, and its
///    `retry_after` has not run out ([`Source::DenyCache`](crate::Source::DenyCache);
///    exact, on by default);
/// 2. the **allow cache**, only if enabled with
///    [`danger_allow_cache`](ResilientLimiterBuilder::danger_allow_cache)
///    ([`Source::AllowCache`](crate::Source::AllowCache); over-admits within a stated
///    bound);
/// 3. the **store** (for Redis, one script call) within its deadline, unless the circuit
///    breaker is open ([`Source::Store`](crate::Source::Store));
/// 4. the **failure policy** when the store gives no decision: admit, refuse, or decide
///    locally at this node's share ([`Source::FailOpen`](crate::Source::FailOpen),
///    [`Source::FailClosed`](crate::Source::FailClosed),
///    [`Source::Fallback`](crate::Source::Fallback)).
///
/// Any [`Limiter`] can be the store: `rein_redis::RedisStore` for a limit shared between
/// processes, `rein_memory::MemoryStore` in tests. The limiter is itself a [`Limiter`], so
/// code written against the trait (an HTTP layer, a simulator) takes it unchanged, and a
/// [`Leasable`] one over a leasable store, so a `LeasedLimiter` can wrap it.
///
/// # Deadline
/// No call waits for anything but the store, and that wait is the store's deadline
/// ([`Limiter::deadline`]; the Redis store's default is 50 ms, covering waiting for a
/// connection or a reconnect and the round trip), or 50 ms for a store that states none.
/// Everything else (caches, breaker, fallback, counters) is local work under short locks,
/// with no await. A second timer, a few milliseconds later, guards that bound should the
/// store ever overrun its own. With leases on
/// ([`leases`](ResilientLimiterBuilder::leases)), a request may first wait, at most that
/// long, for its key's reservation in flight, then decide directly: twice the bound, which
/// the leased limiter's [`deadline`](Limiter::deadline) states.
///
/// A call that timed out is never replayed: it may have run in the store, and a replay
/// could count the request twice. The failure policy answers instead.
///
/// # Time
/// Local time (cache expiry, breaker timers, the fallback limiter, latencies) is read only
/// from the limiter's [`Clock`], by default a [`TokioClock`]; waiting is only through
/// `tokio::time`. The store decides on its own clock (Redis's `TIME`) unless
/// [`TimeSource::LocalClock`] is chosen. Under turmoil, or `tokio::time::pause`, the whole
/// limiter runs in virtual time.
///
/// # Failures
/// Store failures never surface as `Err` from [`acquire`](Self::acquire): the failure
/// policy turns them into decisions, and [`stats`](Self::stats) counts them by kind. `Err`
/// ([`RequestError`]) means the request itself is wrong and the store would refuse it too.
/// Nothing is sticky: the breaker closes on its own when the store answers a probe.
///
/// # Layout
/// This type only moves data: it classifies the key, reads the clock, awaits the store
/// under the deadline, and hands everything else to the sans-IO `Gate` (`gate.rs`), where
/// every decision about caches, the breaker and the failure policy is made and tested.
///
/// The limiter is cheap to clone (an `Arc`); clones share everything.
///
/// ```no_run
/// use std::num::NonZeroU32;
/// use rein::{FailurePolicy, PolicyTable, ResilientLimiter, Source};
/// use rein::core::{Limit, Micros, NamedPolicy, Policy};
/// use rein::redis::RedisStore;
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
pub struct ResilientLimiter<S: Limiter, M = Direct> {
    pub(crate) inner: Arc<Shared<S>>,
    /// Whether hot keys are decided from leases first ([`Leased`]) or not ([`Direct`]).
    pub(crate) mode: M,
}

/// Settings for a [`ResilientLimiter`], from [`ResilientLimiter::builder`].
pub struct ResilientLimiterBuilder<S> {
    store: S,
    table: PolicyTable,
    on_failure: FailurePolicy,
    name: String,
    clock: Option<SharedClock>,
    time_source: TimeSource,
    breaker: BreakerConfig,
    deny_cache: Option<NonZeroUsize>,
    allow_cache: Option<AllowCacheConfig>,
    fallback_max_keys: NonZeroUsize,
    shadow: Vec<String>,
}

/// Whose clock the store decides on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimeSource {
    /// The store's own (Redis's `TIME`, read inside the script): one clock for every node,
    /// whatever their own clocks say. The limiter's clock still times the local work.
    #[default]
    Store,
    /// The limiter's [`Clock`], passed to the store as `now`: for simulators and tests.
    /// Every node must then read clocks that agree (the default [`TokioClock`] counts from
    /// when it was made and does not), and the Redis store wants a `min_ttl` if that clock
    /// does not advance with Redis's. The deny cache is then exact to the microsecond.
    LocalClock,
}

/// The limiter's clock, shared with its fallback limiters.
type SharedClock = Arc<dyn Clock + Send + Sync>;

pub(crate) struct Shared<S: Limiter> {
    /// This limiter's identity, in each [`TablePolicy`] it prepares.
    owner: Owner,
    store: S,
    pub(crate) table: PolicyTable,
    /// The table's policies prepared for the store, in the table's order.
    prepared: Vec<S::Prepared>,
    pub(crate) clock: SharedClock,
    pub(crate) time_source: TimeSource,
    /// The store's deadline plus [`DEADLINE_MARGIN`](rein_core::limiter::DEADLINE_MARGIN).
    guard_deadline: Duration,
    pub(crate) gate: Gate<SharedClock>,
    /// Per policy, in the table's order: whether it is in shadow mode, and what it denied.
    shadow: Box<[Shadow]>,
}

/// A policy's shadow mode: on or off at any time, and its count of what it would have
/// denied while on.
#[derive(Default)]
struct Shadow {
    on: std::sync::atomic::AtomicBool,
    denied: std::sync::atomic::AtomicU64,
}

impl<S: Limiter> ResilientLimiter<S> {
    /// Settings for a limiter over `store`, deciding each key by its policy in `table` and
    /// answering with `on_failure` when the store cannot. Defaults: name `rein`, a
    /// [`TokioClock`], the store's clock, [`BreakerConfig::new`] with the store's deadline
    /// plus [`DEADLINE_MARGIN`](rein_core::limiter::DEADLINE_MARGIN) as probe timeout, a deny cache of 65 536 entries, no allow
    /// cache, and room for 65 536 keys per policy in the fallback limiters.
    pub fn builder(
        store: S,
        table: PolicyTable,
        on_failure: FailurePolicy,
    ) -> ResilientLimiterBuilder<S> {
        ResilientLimiterBuilder {
            store,
            table,
            on_failure,
            name: DEFAULT_NAME.to_owned(),
            clock: None,
            time_source: TimeSource::Store,
            breaker: BreakerConfig::new(),
            deny_cache: Some(DEFAULT_CACHE_ENTRIES),
            allow_cache: None,
            fallback_max_keys: DEFAULT_FALLBACK_KEYS,
            shadow: Vec::new(),
        }
    }
}

impl<S: Limiter, M: Mode<S>> ResilientLimiter<S, M> {
    /// Decides `cost` for `key` under the policy the table classifies it into (longest
    /// matching prefix rule, or the default). A cost of zero asks the store without taking
    /// anything and is never cached. With leases on, a hot key is answered from this
    /// node's leases first ([`Source::Lease`](crate::Source::Lease),
    /// [`Source::LocalDenial`](crate::Source::LocalDenial)); everything else as without.
    ///
    /// Errors only for a request that can never be admitted: an empty key or one over
    /// 1 KiB, or a cost above the policy's capacity.
    pub async fn acquire(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decided, RequestError> {
        let key = key.as_ref();
        let index = self.inner.table.classify_index(key);
        M::decide(self, Call::new(None, index, key, cost), Ask::Acquire).await
    }

    /// Whether `cost` would be admitted for `key` now, taking nothing: the store's answer,
    /// never a cache's. Like [`acquire`](Self::acquire) it is bounded by the deadline, goes
    /// through the circuit breaker and gets the failure policy's answer when the store
    /// gives none (the local fallback is peeked, not charged).
    pub async fn peek(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decided, RequestError> {
        let key = key.as_ref();
        let index = self.inner.table.classify_index(key);
        M::decide(self, Call::new(None, index, key, cost), Ask::Peek).await
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
            self.inner.gate.invalid_request();
            return Err(RequestError::UnknownPolicy(policy.to_owned()));
        };
        M::decide(
            self,
            Call::new(None, index, key.as_ref(), cost),
            Ask::Acquire,
        )
        .await
    }

    /// Gives back up to `amount` to every limit of the policy `key` is classified into, in
    /// the store, and forgets any cached denial or reuse for the key (the capacity came
    /// back, so a cached answer would be stale).
    ///
    /// A refund is best effort by design: it is bounded by the store's deadline, it is
    /// never replayed (a timed-out refund may have run), it does not go through the circuit
    /// breaker, and it is not applied to the local fallback, whose admissions the store
    /// never saw. A failure is returned as the store's [`DecideError`].
    ///
    /// With leases on, a token bucket leased as rate has no refund
    /// ([`DecideError::Unsupported`]): not giving back only under-admits.
    pub async fn refund(&self, key: impl AsRef<[u8]>, amount: u64) -> Result<(), DecideError> {
        let key = key.as_ref();
        let index = self.inner.table.classify_index(key);
        M::refund(self, Call::new(None, index, key, amount)).await
    }

    /// Turns shadow mode on or off for the policy named `policy`, at once and for every
    /// clone of this limiter: while on, a request the policy denies is admitted instead
    /// (its `Decided` says allowed, with the denial's `limit`, `remaining` and
    /// `reset_after`), logged at debug level and counted
    /// ([`shadow_denials`](Self::shadow_denials)); it still takes nothing, as any denial,
    /// so turning shadow mode off leaves the policy where the live traffic put it. For trying a new limit
    /// on live traffic. Returns whether it was on; errors if the table has no such policy.
    pub fn set_shadow(&self, policy: &str, on: bool) -> Result<bool, RequestError> {
        let shadow = self.shadow_of(policy)?;
        Ok(shadow.on.swap(on, std::sync::atomic::Ordering::Relaxed))
    }

    /// What the policy named `policy` would have denied while in shadow mode, since the
    /// limiter was built; errors if the table has no such policy.
    pub fn shadow_denials(&self, policy: &str) -> Result<u64, RequestError> {
        let shadow = self.shadow_of(policy)?;
        Ok(shadow.denied.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn shadow_of(&self, policy: &str) -> Result<&Shadow, RequestError> {
        let index = self.inner.table.index_of(policy);
        index
            .and_then(|i| self.inner.shadow.get(i))
            .ok_or_else(|| RequestError::UnknownPolicy(policy.to_owned()))
    }

    /// The counters since the limiter was built.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.gate.stats()
    }

    /// The circuit breaker's state as of its last input. An open breaker whose period has
    /// ended turns half-open at the next request, not by itself.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.gate.breaker_state()
    }

    /// The name given to [`ResilientLimiterBuilder::name`], the `limiter` label of its
    /// metrics.
    pub fn name(&self) -> &str {
        self.inner.gate.name()
    }

    /// The policy table.
    pub fn table(&self) -> &PolicyTable {
        &self.inner.table
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.gate.on_failure()
    }

    /// The store it calls.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// A decision by the store's `acquire` or `peek` (by `ask`), shadow mode applied.
    pub(crate) async fn decide_plain(
        &self,
        call: Call<'_>,
        ask: Ask,
    ) -> Result<Decided, RequestError> {
        let Call {
            key, units: cost, ..
        } = call;
        self.decide(call, ask, move |store, policy, store_now| async move {
            let decision = if ask == Ask::Peek {
                store.peek(store_now, policy, key, cost).await
            } else {
                store.acquire(store_now, policy, key, cost).await
            };
            decision.map(|decision| (decision, None))
        })
        .await
        .map(|(decided, _)| self.inner.shadowed(call.index, decided))
    }

    /// A decision by the store's operation `store_call` (given the store, the prepared policy
    /// and the `now` to pass), with the store's stamp when the store answered a held
    /// acquire. `ask`: a peek's call takes nothing, and its answer is never cached; a
    /// reservation's is not counted as a decision.
    pub(crate) async fn decide<'a, F, Fut>(
        &'a self,
        call: Call<'_>,
        ask: Ask,
        store_call: F,
    ) -> Result<(Decided, Option<Timestamp>), RequestError>
    where
        F: FnOnce(&'a S, &'a S::Prepared, Option<Timestamp>) -> Fut,
        Fut: Future<Output = Result<(Decision, Option<Timestamp>), DecideError>>,
    {
        let capacity = self.inner.check(call)?;
        self.decide_checked(call, capacity, ask, store_call).await
    }

    /// [`decide`](Self::decide) for a call already [`check`](Shared::check)ed: `capacity`
    /// is the policy's.
    pub(crate) async fn decide_checked<'a, F, Fut>(
        &'a self,
        call: Call<'_>,
        capacity: u64,
        ask: Ask,
        store_call: F,
    ) -> Result<(Decided, Option<Timestamp>), RequestError>
    where
        F: FnOnce(&'a S, &'a S::Prepared, Option<Timestamp>) -> Fut,
        Fut: Future<Output = Result<(Decision, Option<Timestamp>), DecideError>>,
    {
        let inner = &*self.inner;
        let span = tracing::debug_span!(
            "rein_decide",
            limiter = %inner.gate.name(),
            policy = inner.table.policies()[call.index].name(),
            cost = call.units,
        );
        async {
            let request = Request {
                // The table holds far fewer than 2^32 policies (each built by hand).
                slot: call.index as u32,
                capacity,
                key: call.key,
                cost: call.units,
                ask,
            };
            let (decided, stamp) = inner
                .decide(call.now, call.index, request, store_call)
                .await?;
            tracing::debug!(
                source = decided.source.as_str(),
                unavailable = decided.source.unavailable().map(|why| why.as_str()),
                allowed = decided.is_allowed(),
                remaining = decided.decision.remaining,
                retry_after_us = decided.decision.retry_after.as_micros(),
                "decided"
            );
            Ok((decided, stamp))
        }
        .instrument(span)
        .await
    }
}

impl<S: Limiter> Shared<S> {
    /// The table index `policy` names, if this limiter prepared it.
    fn index(&self, policy: &TablePolicy) -> Option<usize> {
        (policy.owner == self.owner).then_some(policy.index)
    }

    /// The capacity of the call's policy, if its key and cost make a request that can be
    /// admitted; otherwise the error, counted.
    pub(crate) fn check(&self, call: Call<'_>) -> Result<u64, RequestError> {
        let capacity = self.table.policies()[call.index].policy().capacity();
        let admissible = rein_core::KeyError::check(call.key)
            .map_err(RequestError::InvalidKey)
            .and_then(|()| OverCapacity::check(call.units, capacity).map_err(RequestError::from));
        admissible.inspect_err(|_| self.gate.invalid_request())?;
        Ok(capacity)
    }

    /// A denial of a policy in shadow mode, admitted and counted; any other answer as it is.
    pub(crate) fn shadowed(&self, index: usize, decided: Decided) -> Decided {
        use std::sync::atomic::Ordering;
        let Some(shadow) = self.shadow.get(index) else {
            return decided;
        };
        if decided.is_allowed() || !shadow.on.load(Ordering::Relaxed) {
            return decided;
        }
        shadow.denied.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            policy = self.table.policies()[index].name(),
            source = decided.source.as_str(),
            retry_after_us = decided.decision.retry_after.as_micros(),
            "shadow mode: would have denied; admitting"
        );
        Decided {
            decision: Decision {
                outcome: rein_core::Outcome::Allowed,
                retry_after: rein_core::Micros::ZERO,
                ..decided.decision
            },
            source: decided.source,
        }
    }

    /// The request path for a valid request: ask the gate, call the store (`call`) if it
    /// says so, and give the gate the outcome.
    async fn decide<'a, F, Fut>(
        &'a self,
        now: Option<Timestamp>,
        index: usize,
        request: Request<'_>,
        call: F,
    ) -> Result<(Decided, Option<Timestamp>), RequestError>
    where
        F: FnOnce(&'a S, &'a S::Prepared, Option<Timestamp>) -> Fut,
        Fut: Future<Output = Result<(Decision, Option<Timestamp>), DecideError>>,
    {
        // A decision may complete without ever waiting (a cache hit, an open breaker, a store
        // whose futures are ready): count it against the task's cooperative budget, so a task
        // that loops on denied requests still lets the runtime's other tasks (the limiter's
        // own store calls among them) run on a single-threaded runtime. No-op outside tokio.
        tokio::task::coop::consume_budget().await;
        // Read before anything is sent: the deny cache's expiry counts from here, so it
        // ends no later than the store's denial, which was decided after this instant.
        let sent_at = now.unwrap_or_else(|| self.clock.now());
        let ticket = match self.gate.begin(sent_at, request) {
            Step::Answer(decided) => return Ok((decided, None)),
            Step::Call(ticket) => ticket,
        };
        let mut in_flight = InFlight {
            shared: self,
            ticket: Some(ticket),
        };
        let store_now = self.store_now(now, sent_at);
        let store_call = call(&self.store, &self.prepared[index], store_now);
        let reply = tokio::time::timeout(self.guard_deadline, store_call).await;
        let mut stamp = None;
        let ended = now.unwrap_or_else(|| self.clock.now());
        let ticket = in_flight.finish();
        let reply = match reply {
            Ok(Ok((decision, held_at))) => {
                stamp = held_at;
                Reply::Decided(decision)
            }
            Ok(Err(error)) => match Verdict::of(&error) {
                Verdict::Failed(why) => {
                    tracing::debug!(error = %error, "the store gave no decision");
                    Reply::Failed(why)
                }
                Verdict::Refused(refusal) => {
                    self.gate.refused(ended, ticket);
                    return Err(refusal);
                }
                Verdict::NotRun { operation } => {
                    self.gate.abandon(ended, ticket);
                    return Err(RequestError::Unsupported { operation });
                }
            },
            Err(_) => Reply::Failed(Unavailable::Timeout),
        };
        let decided = self.gate.finish(sent_at, ended, ticket, request, reply);
        // Only the store's own answer carries its stamp.
        let stamp = stamp.filter(|_| decided.source == crate::Source::Store);
        Ok((decided, stamp))
    }

    /// Gives back `call.units` to the policy at `call.index` in the store.
    pub(crate) async fn refund(&self, call: Call<'_>) -> Result<(), DecideError> {
        self.give_back(call, |store, policy, now| {
            store.refund(now, policy, call.key, call.units)
        })
        .await
    }

    /// Units given back by the store's operation `give_back` (a refund, or a return of held
    /// units), bounded by the guard deadline, after forgetting what the caches hold for the
    /// key: the capacity came back, so a cached denial or reuse would be stale.
    async fn give_back<'a, F, Fut>(
        &'a self,
        call: Call<'_>,
        give_back: F,
    ) -> Result<(), DecideError>
    where
        F: FnOnce(&'a S, &'a S::Prepared, Option<Timestamp>) -> Fut,
        Fut: Future<Output = Result<(), DecideError>>,
    {
        let local = call.now.unwrap_or_else(|| self.clock.now());
        // The table holds far fewer than 2^32 policies (each built by hand).
        let slot = call.index as u32;
        self.gate.forget(local, slot, call.key);
        let store_now = self.store_now(call.now, local);
        let given = self
            .within_deadline(give_back(
                &self.store,
                &self.prepared[call.index],
                store_now,
            ))
            .await;
        // Again once it ran: a denial sent while it ran may have been decided before it.
        self.gate
            .forget(call.now.unwrap_or_else(|| self.clock.now()), slot, call.key);
        given
    }

    /// A store call that no failure policy answers (returns, rate shares), bounded by the
    /// guard deadline: past it, a `Timeout` error.
    async fn within_deadline<T>(
        &self,
        call: impl Future<Output = Result<T, DecideError>>,
    ) -> Result<T, DecideError> {
        match tokio::time::timeout(self.guard_deadline, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.guard_deadline).into()),
        }
    }

    /// The `now` to pass the store: the caller's, else the local clock's reading if the
    /// store decides on it, else none (the store's own clock).
    fn store_now(&self, now: Option<Timestamp>, local: Timestamp) -> Option<Timestamp> {
        match (now, self.time_source) {
            (Some(now), _) => Some(now),
            (None, TimeSource::LocalClock) => Some(local),
            (None, TimeSource::Store) => None,
        }
    }
}

impl<S: Leasable> Shared<S> {
    /// A return of held units recorded at `stamp`, as [`refund`](Self::refund).
    async fn refund_held(&self, call: Call<'_>, stamp: Timestamp) -> Result<(), DecideError> {
        self.give_back(call, |store, policy, now| {
            store.refund_held(now, policy, call.key, call.units, stamp)
        })
        .await
    }

    /// A rate-share operation other than a direct decision (a node taking, renewing or
    /// returning its share), sent to the store within the deadline, and only when the
    /// circuit breaker lets a call through: every hot key renews once per renewal interval,
    /// which must not keep asking a store the breaker keeps away. No failure policy answers
    /// for it: without the store's reply a node has no new share, and spends only what it
    /// was granted before (docs/leases.md).
    async fn share_rate(
        &self,
        now: Option<Timestamp>,
        index: usize,
        key: &[u8],
        op: RateOp,
    ) -> Result<RateAnswer, DecideError> {
        let local = now.unwrap_or_else(|| self.clock.now());
        let Some(ticket) = self.gate.open_call(local) else {
            return Err(no_grant(Unavailable::BreakerOpen, self.guard_deadline));
        };
        let mut in_flight = InFlight {
            shared: self,
            ticket: Some(ticket),
        };
        // A return gives the direct share tokens and rate: a cached denial of a direct
        // decision would hide them, as one would hide a refund (`give_back`), so it is
        // forgotten before and after the call (before, kept until its `retry_after`).
        let returns = matches!(op, RateOp::Return(_));
        let slot = index as u32;
        if returns {
            self.gate.forget(local, slot, key);
        }
        let store_now = self.store_now(now, local);
        let policy = &self.prepared[index];
        let result = self
            .within_deadline(self.store.share_rate(store_now, policy, key, op))
            .await;
        let ended = now.unwrap_or_else(|| self.clock.now());
        if returns {
            self.gate.forget(ended, slot, key);
        }
        let ticket = in_flight.finish();
        match result.as_ref().map_err(Verdict::of) {
            Ok(_) => self.gate.close_call(local, ended, ticket, Ok(())),
            Err(Verdict::Failed(why)) => self.gate.close_call(local, ended, ticket, Err(why)),
            Err(Verdict::Refused(_)) => self.gate.refused(ended, ticket),
            Err(Verdict::NotRun { .. }) => self.gate.abandon(ended, ticket),
        }
        result
    }
}

/// What a store's error tells the breaker: the one rule for every call through it (a
/// request's decision, a rate share's take, renewal or return).
enum Verdict {
    /// The store gave no answer: a failure, which the breaker counts toward opening and,
    /// for a request, the failure policy answers.
    Failed(Unavailable),
    /// The store refused the request before calling anything: it can never be decided
    /// (checked before the call, so a store that refuses what the table accepted made no
    /// call either). The breaker learns nothing; the caller gets the refusal.
    Refused(RequestError),
    /// The store does not run the operation (a rate share on a store that keeps none): not
    /// a failure, so the breaker learns nothing, and the caller (the leases) decides
    /// another way.
    NotRun { operation: &'static str },
}

impl Verdict {
    fn of(error: &DecideError) -> Self {
        match error {
            DecideError::Unavailable(error) => Self::Failed(match error {
                StoreError::Timeout(_) => Unavailable::Timeout,
                StoreError::Server(_) => Unavailable::Server,
                StoreError::UnexpectedReply(_) => Unavailable::UnexpectedReply,
                StoreError::Contended { .. } => Unavailable::Contended,
                _ => Unavailable::Connection,
            }),
            DecideError::InsufficientCapacity(over)
            | DecideError::InvalidShare(ShareError::InsufficientCapacity(over)) => {
                Self::Refused(RequestError::InsufficientCapacity(*over))
            }
            DecideError::InvalidKey(e) => Self::Refused(RequestError::InvalidKey(*e)),
            DecideError::InvalidShare(e) => Self::Refused(RequestError::InvalidShare(*e)),
            DecideError::Unsupported { operation } => Self::NotRun { operation },
            // Another limiter's policy (the store's own prepared policy never is), or an
            // error rein-core adds later: no decision, like a failed call.
            _ => Self::Failed(Unavailable::UnexpectedReply),
        }
    }
}

/// A call to the store in flight. If the caller drops the future before the call ends,
/// the ticket is handed back as abandoned, so a dropped probe does not hold the breaker
/// half-open until its timeout.
struct InFlight<'a, S: Limiter> {
    shared: &'a Shared<S>,
    ticket: Option<Ticket>,
}

impl<S: Limiter> InFlight<'_, S> {
    /// The call ended; its outcome is reported with the returned ticket.
    fn finish(&mut self) -> Ticket {
        // Set at construction and taken only here, once.
        self.ticket.take().expect("finish is called once")
    }
}

impl<S: Limiter> Drop for InFlight<'_, S> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let now = self.shared.clock.now();
            self.shared.gate.abandon(now, ticket);
        }
    }
}

/// The resilient limiter is a [`Limiter`] too: its prepared policy is a policy of its table
/// (preparing one that is not in the table, by name and value, is an error), and a decision
/// never fails with [`DecideError::Unavailable`] (the failure policy answers), except a
/// refund's. A `now` given here is used as the local time and passed to the store. With
/// leases on, it decides as [`acquire`](ResilientLimiter::acquire) does, leases first.
///
/// An application calls the inherent [`acquire`](ResilientLimiter::acquire)`(key, cost)`,
/// which picks the key's policy itself; this impl is for code written over any `Limiter`
/// (rein-tower's layer, rein-server, a test), which calls it through the trait bound. The
/// two share a name on purpose, and method calls on the type find the inherent one: call
/// this one on the type itself as `Limiter::acquire(&limiter, now, &policy, key, cost)`.
impl<S: Limiter, M: Mode<S>> Limiter for ResilientLimiter<S, M> {
    type Prepared = TablePolicy;

    fn prepare(&self, policy: &NamedPolicy) -> Result<TablePolicy, PrepareError> {
        match self.inner.table.index_of(policy.name()) {
            Some(index) if self.inner.table.policies()[index] == *policy => Ok(TablePolicy {
                owner: self.inner.owner,
                index,
            }),
            _ => Err(PrepareError::UnknownPolicy(policy.name().to_owned())),
        }
    }

    async fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &TablePolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        let call = self.call(now, policy, key, cost)?;
        let decided = M::decide(self, call, Ask::Acquire).await;
        Ok(decided.map_err(DecideError::from)?.decision)
    }

    /// The store's peek through the gate: deadline, breaker and failure policy as for
    /// [`acquire`](Limiter::acquire), no cache (a peek takes nothing), and the local fallback
    /// is peeked, not charged.
    async fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &TablePolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        let call = self.call(now, policy, key, cost)?;
        M::decide(self, call, Ask::Peek)
            .await
            .map(|decided| decided.decision)
            .map_err(DecideError::from)
    }

    async fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &TablePolicy,
        key: &[u8],
        amount: u64,
    ) -> Result<(), DecideError> {
        M::refund(self, self.call(now, policy, key, amount)?).await
    }

    /// [`resilient_deadline`](crate::lease::resilient_deadline): the guard deadline, or with
    /// leases on [`LEASED_CALLS`](crate::lease::LEASED_CALLS) times it (a request may wait
    /// for a reservation, then call directly).
    fn deadline(&self) -> Option<Duration> {
        let store = self.inner.store.deadline();
        Some(crate::mode::resilient_deadline(store, self.mode.leases()))
    }
}

/// An operator's changes to one key through the resilient limiter: each goes to the store
/// within its deadline, never through the circuit breaker and never to a failure policy
/// (while the store is away it fails with [`AdminError::Unavailable`], and nothing is
/// applied to the local fallback, whose counts the store never sees). Each forgets what the
/// limiter's caches held for the key, before and after the change, so that this process's
/// next decision asks the store: a reset, a set or an unblock is not hidden by a denial
/// cached before it. Other processes' caches are not told (docs/operations.md).
impl<S: KeyAdmin> KeyAdmin for ResilientLimiter<S> {
    async fn inspect(&self, policy: &TablePolicy, key: &[u8]) -> Result<KeyState, AdminError> {
        self.inner
            .admin(policy, key, |store, prepared| store.inspect(prepared, key))
            .await
    }

    async fn reset(&self, policy: &TablePolicy, key: &[u8]) -> Result<bool, AdminError> {
        self.inner
            .admin(policy, key, |store, prepared| store.reset(prepared, key))
            .await
    }

    async fn penalize(
        &self,
        policy: &TablePolicy,
        key: &[u8],
        amount: u64,
    ) -> Result<Decision, AdminError> {
        self.inner
            .admin(policy, key, |store, prepared| {
                store.penalize(prepared, key, amount)
            })
            .await
    }

    async fn set_remaining(
        &self,
        policy: &TablePolicy,
        key: &[u8],
        remaining: u64,
    ) -> Result<Decision, AdminError> {
        self.inner
            .admin(policy, key, |store, prepared| {
                store.set_remaining(prepared, key, remaining)
            })
            .await
    }

    async fn block(
        &self,
        policy: &TablePolicy,
        key: &[u8],
        until: Until,
        reason: &str,
    ) -> Result<bool, AdminError> {
        self.inner
            .admin(policy, key, |store, prepared| {
                store.block(prepared, key, until, reason)
            })
            .await
    }

    async fn unblock(&self, policy: &TablePolicy, key: &[u8]) -> Result<bool, AdminError> {
        self.inner
            .admin(policy, key, |store, prepared| store.unblock(prepared, key))
            .await
    }
}

impl<S: Limiter> Shared<S> {
    /// An operator's change `call` on the policy at `index`, bounded by the guard deadline,
    /// with the key's cached answers forgotten before and after it.
    async fn admin<'a, T, F, Fut>(
        &'a self,
        policy: &TablePolicy,
        key: &[u8],
        call: F,
    ) -> Result<T, AdminError>
    where
        F: FnOnce(&'a S, &'a S::Prepared) -> Fut,
        Fut: Future<Output = Result<T, AdminError>>,
    {
        let index = self
            .index(policy)
            .ok_or_else(|| AdminError::InvalidRequest(DecideError::ForeignPolicy.to_string()))?;
        rein_core::KeyError::check(key).map_err(AdminError::InvalidKey)?;
        // The table holds far fewer than 2^32 policies (each built by hand).
        self.gate.forget(self.clock.now(), index as u32, key);
        let result = tokio::time::timeout(
            self.guard_deadline,
            call(&self.store, &self.prepared[index]),
        )
        .await
        .unwrap_or(Err(AdminError::Unavailable(StoreError::Timeout(
            self.guard_deadline,
        ))));
        self.gate.forget(self.clock.now(), index as u32, key);
        result
    }
}

/// Leasing through the resilient limiter, for a store that leases: a held acquire and a
/// direct rate decision go through the gate as [`acquire`](Limiter::acquire) does.
impl<S: Leasable> Leasable for ResilientLimiter<S> {
    /// The store's held acquire through the gate (deadline, breaker, deny cache). Only the
    /// store grants: when it gives no answer, the failure policy does not answer for it
    /// (a fallback's or fail-open admission is no grant the store counted, and a block
    /// spent from it would be returned to a store that never took it), and the call fails
    /// as [`DecideError::Unavailable`]; the leases then send requests direct, where the
    /// failure policy answers them. A cached denial carries no stamp of the store's and
    /// is given the local instant plus `hold` (a denial spends nothing).
    async fn acquire_held(
        &self,
        now: Option<Timestamp>,
        policy: &TablePolicy,
        key: &[u8],
        cost: u64,
        hold: Micros,
    ) -> Result<Held, DecideError> {
        let local = now.unwrap_or_else(|| self.inner.clock.now());
        let call = self.call(now, policy, key, cost)?;
        let (decided, stamp) = self
            .decide(call, Ask::Reserve, move |store, policy, now| async move {
                let held = store.acquire_held(now, policy, key, cost, hold).await?;
                Ok((held.decision, Some(held.stamp)))
            })
            .await
            .map_err(DecideError::from)?;
        if let Some(why) = decided.source.unavailable() {
            return Err(no_grant(why, self.inner.guard_deadline));
        }
        Ok(Held {
            decision: decided.decision,
            stamp: stamp.unwrap_or_else(|| local.saturating_add(hold)),
        })
    }

    async fn refund_held(
        &self,
        now: Option<Timestamp>,
        policy: &TablePolicy,
        key: &[u8],
        amount: u64,
        stamp: Timestamp,
    ) -> Result<(), DecideError> {
        let call = self.call(now, policy, key, amount)?;
        self.inner.refund_held(call, stamp).await
    }

    /// Rate shares of a token bucket (leases as rate): a direct decision goes through the
    /// gate like [`acquire`](Limiter::acquire) (deadline, breaker, failure policy, caches);
    /// a node's take or return goes to the store within the deadline when the breaker lets
    /// a call through, and fails as the store's error, or the breaker's.
    async fn share_rate(
        &self,
        now: Option<Timestamp>,
        policy: &TablePolicy,
        key: &[u8],
        op: RateOp,
    ) -> Result<RateAnswer, DecideError> {
        let call = self.call(now, policy, key, 0)?;
        match op {
            RateOp::Direct(cost) => self
                .decide(
                    Call {
                        units: cost,
                        ..call
                    },
                    Ask::Acquire,
                    move |store, policy, now| async move {
                        match store
                            .share_rate(now, policy, key, RateOp::Direct(cost))
                            .await?
                        {
                            RateAnswer::Decided(decision) => Ok((decision, None)),
                            other => Err(DecideError::Unavailable(StoreError::UnexpectedReply(
                                format!("a direct rate-share decision answered {other:?}"),
                            ))),
                        }
                    },
                )
                .await
                .map(|(decided, _)| RateAnswer::Decided(decided.decision))
                .map_err(DecideError::from),
            op => self.inner.share_rate(now, call.index, key, op).await,
        }
    }
}

/// One call on a policy of the table, as the resilient path passes it from the mode down to
/// the gate and the store: a decision's cost, or a refund's amount. `pub` in a private
/// module: the sealed [`Mode`] takes it, and nothing outside the crate can name it.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The instant to decide at (`None`: the limiter's clock).
    pub(crate) now: Option<Timestamp>,
    /// The policy's index in the table.
    pub(crate) index: usize,
    pub(crate) key: &'a [u8],
    /// The cost to decide, or the amount to give back.
    pub(crate) units: u64,
}

impl<S: Limiter, M> ResilientLimiter<S, M> {
    /// A call on `policy`, if this limiter prepared it.
    fn call<'a>(
        &self,
        now: Option<Timestamp>,
        policy: &TablePolicy,
        key: &'a [u8],
        units: u64,
    ) -> Result<Call<'a>, DecideError> {
        let Some(index) = self.inner.index(policy) else {
            self.inner.gate.invalid_request();
            return Err(DecideError::ForeignPolicy);
        };
        Ok(Call::new(now, index, key, units))
    }
}

impl<'a> Call<'a> {
    pub(crate) fn new(now: Option<Timestamp>, index: usize, key: &'a [u8], units: u64) -> Self {
        Self {
            now,
            index,
            key,
            units,
        }
    }
}

/// A policy of a [`ResilientLimiter`]'s table, prepared with [`Limiter::prepare`]: its
/// index in the table, and which limiter prepared it. Given to another limiter, every call
/// fails with [`DecideError::ForeignPolicy`] (an admin call with
/// [`AdminError::InvalidRequest`]), even between limiters of the same table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TablePolicy {
    owner: Owner,
    index: usize,
}

/// A reservation or rate-share call the store gave no answer to (`why`), as the store's
/// error; the call ran under `deadline`.
fn no_grant(why: Unavailable, deadline: Duration) -> DecideError {
    let error = match why {
        Unavailable::Timeout => StoreError::Timeout(deadline),
        Unavailable::Server => StoreError::Server(SourceError::new(NoGrant(why))),
        Unavailable::UnexpectedReply => StoreError::UnexpectedReply(NoGrant(why).to_string()),
        Unavailable::BreakerOpen | Unavailable::Connection | Unavailable::Contended => {
            StoreError::Connection(SourceError::new(NoGrant(why)))
        }
    };
    DecideError::Unavailable(error)
}

/// Why a reservation got no grant: the store gave none.
#[derive(Debug, thiserror::Error)]
#[error("no grant: the store gave no answer ({})", .0.as_str())]
struct NoGrant(Unavailable);

impl<S: Limiter> ResilientLimiterBuilder<S> {
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

    /// Whose clock the store decides on (default [`TimeSource::Store`]).
    pub fn time_source(mut self, source: TimeSource) -> Self {
        self.time_source = source;
        self
    }

    /// The circuit breaker's settings (default [`BreakerConfig::new`]). Its probe timeout is
    /// replaced by the store's deadline (plus [`DEADLINE_MARGIN`](rein_core::limiter::DEADLINE_MARGIN)).
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// The deny cache's size (default 65 536 entries), or `None` to turn it off.
    pub fn deny_cache(mut self, max_entries: Option<NonZeroUsize>) -> Self {
        self.deny_cache = max_entries;
        self
    }

    /// **Over-admits.** Reuses admissions from the store locally, at most `max_reuses` times
    /// per key per window of `ttl` on each node, without asking the store: the naive
    /// "allowed" cache, bounded. The store never counts the reuses, so, per key, `N` nodes
    /// admit up to `N × max_reuses × (⌈T / ttl⌉ + 1)` requests beyond the limit over any
    /// interval `T` (docs/failure.md). Use it only where a store round trip per request
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

    /// Starts the policy named `policy` in shadow mode (see
    /// [`ResilientLimiter::set_shadow`], which turns it on and off later). `build` errors
    /// if the table has no such policy.
    pub fn shadow(mut self, policy: impl Into<String>) -> Self {
        self.shadow.push(policy.into());
        self
    }

    /// The limiter. Errors if a duration is zero, a policy has no exact share for the
    /// expected node count, or the store cannot prepare a policy.
    pub fn build(self) -> Result<ResilientLimiter<S>, ResilienceConfigError> {
        if self.breaker.base_backoff().is_zero() {
            return Err(ResilienceConfigError::ZeroDuration("breaker backoff"));
        }
        if self
            .allow_cache
            .is_some_and(|config| config.ttl().is_zero())
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
        let prepared = self
            .table
            .policies()
            .iter()
            .map(|named| self.store.prepare(named))
            .collect::<Result<Vec<_>, _>>()?;
        let shadow: Box<[Shadow]> = self
            .table
            .policies()
            .iter()
            .map(|_| Shadow::default())
            .collect();
        for name in &self.shadow {
            let index = self
                .table
                .index_of(name)
                .ok_or_else(|| ResilienceConfigError::UnknownPolicy(name.clone()))?;
            shadow[index]
                .on
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let guard_deadline = crate::mode::resilient_deadline(self.store.deadline(), false);
        let gate = Gate::new(
            self.name,
            self.on_failure,
            fallback,
            self.breaker.with_probe_timeout(guard_deadline),
            self.deny_cache,
            self.allow_cache,
            guard_deadline,
        );
        Ok(ResilientLimiter {
            mode: Direct,
            inner: Arc::new(Shared {
                owner: Owner::new(),
                store: self.store,
                table: self.table,
                prepared,
                clock,
                time_source: self.time_source,
                guard_deadline,
                gate,
                shadow,
            }),
        })
    }
}

impl<S: Limiter, M: Clone> Clone for ResilientLimiter<S, M> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            mode: self.mode.clone(),
        }
    }
}

impl<S: Limiter, M: fmt::Debug> fmt::Debug for ResilientLimiter<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientLimiter")
            .field("mode", &self.mode)
            .field("name", &self.inner.gate.name())
            .field("on_failure", &self.inner.gate.on_failure())
            .field("time_source", &self.inner.time_source)
            .field("policies", &self.inner.table.policies().len())
            .finish_non_exhaustive()
    }
}

impl<S> fmt::Debug for ResilientLimiterBuilder<S> {
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

/// 65 536 entries: more keys than one node sees denied within a typical `retry_after`; a
/// few MiB with short keys, about 70 MiB at most with keys of the longest (1 KiB).
const DEFAULT_CACHE_ENTRIES: NonZeroUsize = NonZeroUsize::new(1 << 16).expect("nonzero");

/// 65 536 keys per policy, the deny cache's bound for a like reason: memory stays at a few
/// MiB per policy with short keys (about 70 MiB with keys of the longest, 1 KiB), and it
/// covers the keys one node sees active during a short outage. An
/// outage with more active keys evicts (see [`ResilientLimiterBuilder::fallback_max_keys`]).
const DEFAULT_FALLBACK_KEYS: NonZeroUsize = NonZeroUsize::new(1 << 16).expect("nonzero");
