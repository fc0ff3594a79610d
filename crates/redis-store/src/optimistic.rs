//! [`OptimisticStore`]: the same exact decisions as [`RedisStore`](crate::RedisStore), made
//! client-side inside an optimistic Redis transaction (`WATCH`, read, `MULTI … EXEC`)
//! instead of in a Lua script.
//!
//! # How a decision is made
//!
//! 1. Borrow a connection that nobody else uses until the call ends (`optimistic/pool.rs`
//!    says why a shared multiplexed connection would break `WATCH`).
//! 2. One round trip: `WATCH` the policy's key, `GET` it, and `TIME`. Redis runs a
//!    connection's pipelined commands in order, so the key is watched before it is read,
//!    and `now` is the server's clock, as in the Lua store.
//! 3. Decide client-side with rein-core ([`Policy::acquire`](rein_core::Policy::acquire)):
//!    all limits or none.
//! 4. A denial (or a peek) writes nothing and ends there. An admission sends a second round
//!    trip: `MULTI`, `SET key value PX ttl` of the policy's key, `EXEC`. If the watched key
//!    changed
//!    after the `WATCH`, Redis discards the whole transaction and `EXEC` answers nil:
//!    nothing was written, so the call waits a jittered backoff and starts again at 2.
//! 5. After `max_attempts` aborted transactions the call fails with
//!    [`StoreError::Contended`]; nothing of it was written.
//!
//! Exactness follows from `EXEC` committing only transactions whose reads are still
//! current: the committed decisions form one serial history, each applied to the state the
//! previous one left, as the script's are.
//!
//! # Stored state
//!
//! The Lua store's own keys and values (key formats `v3` and `v4`: one string per policy,
//! `GET` and `SET … PX`), read with the same decoder and written in the same format
//! (`optimistic/codec.rs`). Both stores can therefore decide on the same keys at once: a
//! script's write touches a watched key like any other, so a transaction that raced a
//! script aborts and retries, and the exact counts hold across the mix (tested).

mod backoff;
pub(crate) mod codec;
mod pool;

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, RedisResult, Value};
use rein_core::{
    DecideError, Decision, KeyError, Limiter, NamedPolicy, OverCapacity, PolicyState, PrepareError,
    StoreError, Timestamp,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::store_error;
use crate::{ConnectError, RedisPolicy, StateError};
use backoff::Backoff;
use pool::{Connector, Lease, Pool};
use rein_core::admin::KeyState;

/// Exact rate limits through Redis optimistic transactions: `WATCH`, a read, rein-core's
/// decision in this process, then `MULTI … EXEC`, retried when another client wrote first.
///
/// It gives the same decisions as [`RedisStore`](crate::RedisStore) and needs no scripting
/// (for servers or proxies where `EVAL` is disabled), at a price: two round trips per
/// admission instead of one, a connection held per in-flight call, and, when many callers
/// hit one key at once, aborted transactions that are retried, then
/// [`StoreError::Contended`] errors. docs/optimistic.md measures it against
/// the Lua store and says when (rarely) to prefer it.
///
/// # Clock
///
/// [`Limiter::acquire`], [`peek`](Limiter::peek) and [`refund`](Limiter::refund) with a
/// `now` of `None` read it from the server's `TIME`, in the same round trip as the state:
/// one clock for every client. `Some(now)` is the caller's clock (tests, replays); don't mix
/// both on the same keys, and set [`min_ttl`](OptimisticStoreBuilder::min_ttl) when the caller's
/// clock does not follow Redis's.
///
/// # Deadlines, retries and replays
///
/// Every call has one deadline (default 50 ms) covering the wait for a connection, every
/// attempt and every backoff. The only retry is after an aborted `EXEC`, which Redis
/// guarantees wrote nothing, and only while the deadline leaves time for the backoff and an
/// attempt as long as the last (else [`StoreError::Contended`]: a lost race, not a store
/// failing, which a breaker must not count). A call that times out or loses its connection is never
/// retried, and its connection is closed, not reused: if `EXEC` was already sent its
/// effect is unknown ([`StoreError::Timeout`]). Errors are not sticky.
///
/// # Deployment
///
/// Standalone Redis (or a Cluster node that owns the key's slot: a call has one key). Each
/// connection is a `MultiplexedConnection` used by one call at a time; at most
/// [`max_connections`](OptimisticStoreBuilder::max_connections) are lent at once, as many
/// wait idle, and as many connects are in flight (each in a task of its own; a call that
/// finds as many in flight waits for one to end, all within its deadline); after a failed
/// connect, none is tried for 100 ms, and calls that find no connection then fail at once
/// (`StoreError::Connection`).
///
/// It reads and writes the [`RedisStore`](crate::RedisStore)'s keys and values, under the
/// same default prefix, so the two serve one limit together and stay exact (on a hot key
/// the script clients win nearly every race). It implements rein-core's [`Limiter`] with
/// [`RedisPolicy`] as the prepared policy, like the Lua store.
///
/// # Not leasable
///
/// It does not implement [`Leasable`](rein_core::Leasable), so a `rein::lease::LeasedLimiter`
/// over it does not compile. Leasing needs rate shares for token buckets, whose state is
/// stored apart from the plain bucket's (the Lua store's `share` script), and this store
/// has no client-side rendering of that state; a store that leased windows but not
/// buckets would silently decide every bucket without leases. Lease over
/// [`RedisStore`](crate::RedisStore) (docs/optimistic.md).
///
/// ```no_run
/// use rein_core::{Limit, Limiter, Micros, Policy};
/// use rein_redis::{OptimisticStore, RedisPolicy};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = OptimisticStore::connect("redis://127.0.0.1:6379/").await?;
/// let api = RedisPolicy::new(
///     "api",
///     Policy::single(Limit::token_bucket(100, 10, Micros::from_secs(1))?),
/// )?;
/// let decision = store.acquire(None, &api, b"user-42", 1).await?;
/// println!("allowed: {}", decision.is_allowed());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct OptimisticStore {
    inner: Arc<Inner>,
}

/// Settings for an [`OptimisticStore`], then [`connect`](Self::connect) or
/// [`connect_with`](Self::connect_with).
///
/// ```
/// use std::num::{NonZeroU32, NonZeroUsize};
/// use std::time::Duration;
/// use rein_redis::OptimisticStoreBuilder;
///
/// let builder = OptimisticStoreBuilder::new()
///     .max_connections(NonZeroUsize::new(16).unwrap())
///     .max_attempts(NonZeroU32::new(8).unwrap())
///     .backoff(Duration::from_millis(1), Duration::from_millis(8))
///     .rng_seed(7);
/// # let _ = builder;
/// ```
#[derive(Clone, Debug)]
pub struct OptimisticStoreBuilder {
    shared: crate::settings::Shared,
    max_connections: NonZeroUsize,
    max_attempts: NonZeroU32,
    backoff_base: Duration,
    backoff_max: Duration,
    rng_seed: u64,
}

/// Counters of an [`OptimisticStore`] since it was built: how much contention cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptimisticStats {
    /// Calls that succeeded: decisions (peeks included), finished refunds and state reads.
    pub decisions: u64,
    /// Transactions sent (`EXEC`), committed or aborted.
    pub transactions: u64,
    /// Transactions aborted because a watched key changed: each one is a retry or, on a
    /// call's last attempt, a [`StoreError::Contended`] error.
    pub conflicts: u64,
    /// Calls that failed with [`StoreError::Contended`].
    pub contended: u64,
}

impl std::fmt::Debug for OptimisticStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OptimisticStore")
            .field("prefix", &self.inner.prefix)
            .field("deadline", &self.inner.deadline)
            .field("max_attempts", &self.inner.max_attempts)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl OptimisticStore {
    /// Connects to a standalone Redis with default settings; see
    /// [`OptimisticStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        OptimisticStoreBuilder::new().connect(url).await
    }

    /// Reads the stored state of `policy` for `key` (a missing key is a full limit): for
    /// tests and tools. One round trip; the limits are read together, in order.
    pub async fn state(
        &self,
        policy: &RedisPolicy,
        key: impl AsRef<[u8]>,
    ) -> Result<PolicyState, StateError> {
        let keys = crate::key::state_keys(&self.inner.prefix, policy, key.as_ref())?;
        let read = async {
            let started = Instant::now();
            let classify = |e| store_error(e, started.elapsed());
            let mut lease = self.inner.pool.lease().await.map_err(classify)?;
            let conn = lease.conn();
            let replies: Vec<Value> = codec::read_pipeline(&keys, conn.watching, false, false)
                .query_async(&mut conn.conn)
                .await
                .map_err(classify)?;
            conn.watching = false;
            lease.release();
            let (stored, _) = codec::decode_read(policy, replies, false)
                .map_err(|what| StateError::Unavailable(StoreError::UnexpectedReply(what)))?;
            match stored {
                KeyState::Counting(state) => Ok(state),
                KeyState::Blocked { block, .. } => Err(StateError::Blocked(block.ends_at())),
            }
        };
        match tokio::time::timeout(self.inner.deadline, read).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.inner.deadline).into()),
        }
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

    /// Counters since the store was built (shared by its clones).
    pub fn stats(&self) -> OptimisticStats {
        let c = &self.inner.counters;
        OptimisticStats {
            decisions: c.decisions.load(Ordering::Relaxed),
            transactions: c.transactions.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            contended: c.contended.load(Ordering::Relaxed),
        }
    }

    /// How many connections are open and idle right now (for tests and metrics).
    pub fn idle_connections(&self) -> usize {
        self.inner.pool.idle()
    }

    /// One call: validation, then the attempts under the deadline, inside a span.
    async fn call(
        &self,
        op: Op,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        if op != Op::Refund {
            OverCapacity::check(cost, policy.policy().capacity())?;
        }
        let keys = crate::key::state_keys(&self.inner.prefix, policy, key)?;
        // An acquire of nothing changes nothing: answer it as a peek, without a WATCH.
        let op = if op == Op::Acquire && cost == 0 {
            Op::Peek
        } else {
            op
        };
        let span = tracing::debug_span!(
            "rein_redis_optimistic",
            op = op.as_str(),
            policy = policy.name(),
            cost,
            slot_key = keys.first().map(String::as_str),
        );
        let deadline = self.inner.deadline;
        let attempts = self.attempts(op, now, policy, &keys, cost);
        let result = match tokio::time::timeout(deadline, attempts)
            .instrument(span)
            .await
        {
            Ok(result) => result,
            // The lease inside the cancelled future was dropped, closing its connection.
            Err(_) => Err(StoreError::Timeout(deadline)),
        };
        match &result {
            Ok(_) => self
                .inner
                .counters
                .decisions
                .fetch_add(1, Ordering::Relaxed),
            Err(StoreError::Contended { .. }) => self
                .inner
                .counters
                .contended
                .fetch_add(1, Ordering::Relaxed),
            Err(_) => 0,
        };
        Ok(result?)
    }

    /// Read, decide, write; again after each aborted `EXEC`, up to `max_attempts`.
    async fn attempts(
        &self,
        op: Op,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        keys: &[String],
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let inner = &*self.inner;
        let started = Instant::now();
        let classify = |e| store_error(e, started.elapsed());
        let mut lease = inner.pool.lease().await.map_err(classify)?;
        let max_attempts = inner.max_attempts.get();
        let mut conflicts = 0;
        loop {
            let attempt_started = Instant::now();
            let (decision, writes) =
                read_and_decide(&mut lease, op, now, policy, keys, cost, inner)
                    .await
                    .map_err(|e| match e {
                        Read::Redis(e) => classify(e),
                        Read::Store(e) => e,
                    })?;
            let Some(writes) = writes else {
                lease.release();
                return Ok(decision);
            };
            inner.counters.transactions.fetch_add(1, Ordering::Relaxed);
            let committed: Option<()> = codec::write_transaction(&writes)
                .query_async(&mut lease.conn().conn)
                .await
                .map_err(classify)?;
            // `EXEC` ends the `WATCH` whether it committed or aborted.
            lease.conn().watching = false;
            if committed.is_some() {
                lease.release();
                return Ok(decision);
            }
            conflicts += 1;
            inner.counters.conflicts.fetch_add(1, Ordering::Relaxed);
            if conflicts >= max_attempts {
                tracing::debug!(attempts = conflicts, "contended: giving up");
                lease.release();
                return Err(StoreError::Contended {
                    attempts: conflicts,
                });
            }
            let wait = inner.backoff.delay(conflicts);
            // A wait and another attempt as long as this one that would outlast the deadline
            // would end in a timeout with nothing in flight and nothing written, which the
            // breaker counts as the store failing: one hot key would open it for every key.
            // Give up now, as the lost race it is.
            let next = started.elapsed() + wait + attempt_started.elapsed();
            if next >= inner.deadline {
                tracing::debug!(
                    attempts = conflicts,
                    "contended: no time for another attempt"
                );
                lease.release();
                return Err(StoreError::Contended {
                    attempts: conflicts,
                });
            }
            tracing::debug!(
                attempt = conflicts,
                backoff_us = wait.as_micros() as u64,
                "conflict: a watched key changed before EXEC, retrying"
            );
            // The connection stays leased during the backoff: it is in a clean state, and
            // giving it back would only let another contender collide sooner.
            if wait.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

impl Limiter for OptimisticStore {
    type Prepared = RedisPolicy;

    fn prepare(&self, policy: &NamedPolicy) -> Result<RedisPolicy, PrepareError> {
        Ok(RedisPolicy::prepare(policy))
    }

    async fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        self.call(Op::Acquire, now, policy, key, cost).await
    }

    async fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        self.call(Op::Peek, now, policy, key, cost).await
    }

    async fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
    ) -> Result<(), DecideError> {
        self.call(Op::Refund, now, policy, key, amount).await?;
        Ok(())
    }

    fn deadline(&self) -> Option<Duration> {
        Some(self.inner.deadline)
    }
}

impl OptimisticStoreBuilder {
    /// Default settings: prefix `rein`, deadline 50 ms, connect timeout 1 s, 16
    /// connections, 8 attempts, backoff windows from 1 ms doubling to 8 ms, the RNG seeded
    /// from the process id, no minimum TTL.
    pub fn new() -> Self {
        Self {
            shared: crate::settings::Shared::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            rng_seed: u64::from(std::process::id()),
        }
    }

    crate::settings::shared_setters!();

    /// The most connections lent at once (default 16), and the most kept idle: also the
    /// most calls in flight, since each holds one for its whole duration. Further calls
    /// wait, within their deadline.
    pub fn max_connections(mut self, n: NonZeroUsize) -> Self {
        self.max_connections = n;
        self
    }

    /// How many transactions one call tries before failing with
    /// [`StoreError::Contended`] (default 8).
    pub fn max_attempts(mut self, n: NonZeroU32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The backoff after an aborted transaction: a wait drawn uniformly from zero to a
    /// window that starts at `base` and doubles per conflict up to `max` (defaults 1 ms
    /// and 8 ms). tokio's timer rounds a non-zero wait up to whole milliseconds; a zero
    /// wait only yields to other tasks.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// The seed of the backoff jitter's RNG (default: the process id). Give each process
    /// its own, or processes that collide once keep colliding in step; pin it in tests.
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.rng_seed = seed;
        self
    }

    /// Connects to a standalone Redis at `url` (`redis://[[user]:password@]host[:port][/db]`
    /// or `rediss://…` with the `tls` feature). Makes one connection now, to report a wrong
    /// address or password here, and the rest on demand.
    pub async fn connect(self, url: &str) -> Result<OptimisticStore, ConnectError> {
        crate::connect::install_crypto_provider();
        let client = crate::connect::client(url)?;
        // No response timeout of redis-rs's own: the call's deadline bounds every request.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.shared.connect_timeout))
            .set_response_timeout(None);
        self.connect_with(move || {
            let (client, config) = (client.clone(), config.clone());
            async move {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            }
        })
        .await
    }

    /// A store that makes its connections with `connector`: once now, then whenever a call
    /// finds no idle connection. Each connection it returns must be new and used by nobody
    /// else (for example `MultiplexedConnection::new_with_config` over a stream of your
    /// own, as a simulator does).
    pub async fn connect_with<F, Fut>(self, connector: F) -> Result<OptimisticStore, ConnectError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RedisResult<MultiplexedConnection>> + Send + 'static,
    {
        self.shared.validate()?;
        let connector: Connector = Arc::new(move || Box::pin(connector()));
        let timeout = self.shared.connect_timeout;
        let first = crate::connect::first_connection(timeout, connector()).await?;
        let min_ttl_ms = self.shared.min_ttl_ms();
        Ok(OptimisticStore {
            inner: Arc::new(Inner {
                pool: Pool::new(self.max_connections.get(), connector, first, timeout),
                prefix: self.shared.prefix,
                deadline: self.shared.deadline,
                min_ttl_ms,
                max_attempts: self.max_attempts,
                backoff: Backoff::new(self.backoff_base, self.backoff_max, self.rng_seed),
                counters: Counters::default(),
            }),
        })
    }
}

impl Default for OptimisticStoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// A borrowed connection's first round trip and the client-side decision. Returns the
/// decision, the state after it, and the writes to commit (`None`: nothing to write).
async fn read_and_decide<'k>(
    lease: &mut Lease<'_>,
    op: Op,
    now: Option<Timestamp>,
    policy: &RedisPolicy,
    keys: &'k [String],
    cost: u64,
    inner: &Inner,
) -> Result<(Decision, Option<Writes<'k>>), Read> {
    let watch = op != Op::Peek;
    let conn = lease.conn();
    let read = codec::read_pipeline(keys, conn.watching, watch, now.is_none());
    let replies: Vec<Value> = read
        .query_async(&mut conn.conn)
        .await
        .map_err(Read::Redis)?;
    conn.watching = watch;
    let (stored, server_now) = codec::decode_read(policy, replies, now.is_none())
        .map_err(|what| Read::Store(StoreError::UnexpectedReply(what)))?;
    let now = match (now, server_now) {
        (Some(now), _) | (None, Some(now)) => now,
        (None, None) => {
            let what = "no TIME reply".to_owned();
            return Err(Read::Store(StoreError::UnexpectedReply(what)));
        }
    };
    let mut state = match stored {
        KeyState::Counting(state) => state,
        // An operator's block (admin.rs): its denial while it holds, then a key never seen.
        KeyState::Blocked { block, .. } => match block.decide(policy.policy(), now) {
            Some(denial) => return Ok((denial, None)),
            None => policy.policy().new_state(),
        },
    };
    let before = state.clone();
    let decision = match op {
        Op::Peek => {
            return Ok((decide(policy.policy().peek(now, &state, cost))?, None));
        }
        Op::Acquire => {
            let decision = decide(policy.policy().acquire(now, &mut state, cost))?;
            if !decision.is_allowed() {
                // No write for a denial; the `WATCH` is dropped by the next borrower.
                return Ok((decision, None));
            }
            decision
        }
        Op::Refund => {
            decide(policy.policy().refund(now, &mut state, cost))?;
            // What an acquire of nothing would answer now: refunds report no decision, but
            // the caller's type wants one.
            decide(policy.policy().peek(now, &state, 0))?
        }
    };
    // Nothing changed (a refund of nothing, say): nothing to write, as the scripts.
    if state.iter().zip(before.iter()).all(|(new, old)| new == old) {
        return Ok((decision, None));
    }
    // The policy's one key (key.rs), written whole (codec::encode_policy).
    let (value, ttl) = decide(codec::encode_policy(
        policy,
        now,
        &state,
        Some(&before),
        inner.min_ttl_ms,
    ))?;
    let Some(key) = keys.first() else {
        let what = "a policy without a key".to_owned();
        return Err(Read::Store(StoreError::UnexpectedReply(what)));
    };
    let writes = vec![(key.as_str(), value, ttl)];
    Ok((decision, Some(writes)))
}

/// The first round trip failed: in Redis (classified by the caller, who knows how long the
/// call has run), or in what came back.
enum Read {
    Redis(RedisError),
    Store(StoreError),
}

/// The policy's key, its new value (`None`: every limit empty) and TTL in ms.
type Writes<'k> = Vec<(&'k str, Option<String>, u64)>;

/// rein-core's errors cannot happen here: `call` checks the cost against the capacity
/// first, and the decoder builds each limit's state for its own algorithm. Reported as an
/// unexpected reply rather than a panic all the same.
fn decide<T>(result: Result<T, rein_core::AcquireError>) -> Result<T, Read> {
    result.map_err(|e| Read::Store(StoreError::UnexpectedReply(e.to_string())))
}

struct Inner {
    pool: Pool,
    prefix: String,
    deadline: Duration,
    min_ttl_ms: u64,
    max_attempts: NonZeroU32,
    backoff: Backoff,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    decisions: AtomicU64,
    transactions: AtomicU64,
    conflicts: AtomicU64,
    contended: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Acquire,
    Peek,
    Refund,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Peek => "peek",
            Op::Refund => "refund",
        }
    }
}

// The prefix, deadline, connect timeout and minimum TTL are the Lua store's, defined once
// (`crate::settings`): the two stores share keys and values, so they can serve one limit
// together (one migrating to the other, or clients where scripting is refused).

/// Enough for the concurrency of a typical server process's rate-limit calls; each open
/// connection costs Redis a client (about 20 KB) and this process a socket. (The `unwrap`s
/// here run at compile time: a zero would not compile.)
const DEFAULT_MAX_CONNECTIONS: NonZeroUsize = NonZeroUsize::new(16).unwrap();

/// Measured (docs/optimistic.md): on one key with 64 tasks, 64 attempts instead of 8 moved
/// throughput only within run-to-run noise (4.7k against 3.2k decisions/s, the Lua store
/// 73–75k) and calls without a decision from 31 % to 19 %, most of the rest now ending at
/// the deadline: more attempts mostly wait longer.
const DEFAULT_MAX_ATTEMPTS: NonZeroU32 = NonZeroU32::new(8).unwrap();

/// tokio's timer resolution: a shorter non-zero wait sleeps this long anyway.
const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(1);

/// Four doublings of the base: the windows 1, 2, 4, 8, 8, … ms sum to about the default
/// deadline over the default attempts.
const DEFAULT_BACKOFF_MAX: Duration = Duration::from_millis(8);
