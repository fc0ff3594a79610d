//! One application node: a turmoil client running rein-redis, unmodified, against the
//! simulated Redis, and sending its share of the demand.
//!
//! The node builds its store with [`RedisStoreBuilder::connect_with`] and a connector that
//! opens a turmoil TCP stream and wraps it in a `MultiplexedConnection`. turmoil never
//! retransmits, so a stream cut by a partition is dead for good; the store drops a
//! connection after a timeout or connection error and calls the connector again, exactly
//! as it would over a real network. The node sends one request at a time (a request due
//! while another is in flight waits), records every decision with its true simulated
//! instants, and never reads a real clock.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo};
use rein::{
    PolicyTable, ResilientLimiter, Source,
    lease::{LeaseStats, LeasedLimiter},
};
use rein_core::{DecideError, Decision, Limiter, NamedPolicy, StoreError, Timestamp};
use rein_redis::{OptimisticStoreBuilder, RedisPolicy, RedisStore, RedisStoreBuilder};

use super::clock::{self, Skew, true_now};
use super::naive::NaiveBucket;
use super::tap::ScriptTap;
use super::workload::Request;
use super::{
    Event, Failure, Guard, LimiterKind, Outcome, REDIS_HOST, REDIS_PORT, TimeSource, node_name,
};

/// Everything one node needs; built by the scenario runner.
pub(crate) struct NodeConfig {
    pub index: usize,
    pub requests: Vec<Request>,
    pub policy: NamedPolicy,
    pub limiter: LimiterKind,
    pub time: TimeSource,
    pub skew: Skew,
    pub deadline: Duration,
    pub connect_timeout: Duration,
    pub tap: ScriptTap,
    pub guard: Option<Guard>,
    pub events: Rc<RefCell<Vec<Event>>>,
    /// A leased node's `LeasedLimiter` counters, by node index, recorded when it stops.
    pub leases: Rc<RefCell<BTreeMap<usize, LeaseStats>>>,
    /// A killed leased node's rate shares at its death, by node index: what it strands.
    pub shares_at_death: Rc<RefCell<BTreeMap<usize, Vec<rein::lease::ShareView>>>>,
    /// How many leased nodes still serve demand: each stops its limiter only once none does.
    pub serving: Rc<Cell<usize>>,
    /// True instants `[from, until)` this node's process is paused
    /// ([`Fault::Pause`](super::Fault::Pause)): it serves nothing and runs no timer.
    pub pauses: Vec<(Timestamp, Timestamp)>,
    /// Whether the node is killed ([`Fault::Kill`](super::Fault::Kill)) once its requests
    /// (those due before its death) are served: it then gives nothing back.
    pub killed: Option<Timestamp>,
    /// A leased node's settings.
    pub lease_config: rein::LeaseConfig,
    /// The staleness of the per-key overrides the node's store applies, if it applies any
    /// (`RedisStoreBuilder::overrides`).
    pub overrides: Option<Duration>,
}

impl NodeConfig {
    /// Records the node's decision on `request`, asked and answered at the true instants
    /// `(issued, answered)`.
    fn record(
        &self,
        request: &Request,
        times: (Timestamp, Timestamp),
        outcome: Outcome,
        source: Option<Source>,
    ) {
        record(&self.events, self.index, request, times, outcome, source);
    }
}

/// The software of one turmoil host: its nodes, each its own task with its own store,
/// connections and limiter, started in index order (the host's `LocalSet` runs them in a
/// deterministic order). One node runs inline.
pub(crate) async fn run_host(configs: Vec<NodeConfig>) -> turmoil::Result {
    if configs.len() == 1 {
        if let Some(config) = configs.into_iter().next() {
            return run(config).await;
        }
        return Ok(());
    }
    run_tasks(configs.into_iter().map(run)).await
}

/// Runs each of a host's nodes as its own task, started in order, and waits for them all.
pub(crate) async fn run_tasks<F>(nodes: impl IntoIterator<Item = F>) -> turmoil::Result
where
    F: Future<Output = turmoil::Result> + 'static,
{
    let tasks: Vec<_> = nodes.into_iter().map(tokio::task::spawn_local).collect();
    for task in tasks {
        task.await
            .map_err(|e| format!("a node's task ended abnormally: {e}"))??;
    }
    Ok(())
}

/// The node's software: connect, then serve the demand in order.
pub(crate) async fn run(config: NodeConfig) -> turmoil::Result {
    match config.limiter {
        LimiterKind::Rein if config.guard.is_some() => run_guarded(config).await,
        LimiterKind::Rein => run_rein(config).await,
        LimiterKind::Naive => run_naive(config).await,
        LimiterKind::Leased => run_leased(config).await,
        LimiterKind::Optimistic => run_optimistic(config).await,
    }
}

async fn run_rein(config: NodeConfig) -> turmoil::Result {
    // The local address of the connection the store uses now: the tap's index.
    let current: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let store = build_store(&config, current.clone()).await?;
    let policy = RedisPolicy::prepare(&config.policy);
    for request in &config.requests {
        let issued = issue(request, &config.pauses).await;
        let user = user_key(request.key);
        let result = match config.time {
            TimeSource::Server => {
                store
                    .acquire(None, &policy, user.as_ref(), request.cost)
                    .await
            }
            TimeSource::Client => {
                let now = config.skew.read(issued);
                store
                    .acquire(Some(now), &policy, user.as_ref(), request.cost)
                    .await
            }
        };
        let answered = true_now();
        let source = result.is_ok().then_some(Source::Store);
        let outcome = store_outcome(result, &current, &config.tap, (issued, answered));
        config.record(request, (issued, answered), outcome, source);
    }
    Ok(())
}

/// The node behind rein's `ResilientLimiter`: the same store, with the guard's
/// failure policy, caches and breaker, on a local clock that reads the node's (skewed)
/// simulated time. Redis decides on its own `TIME`.
async fn run_guarded(config: NodeConfig) -> turmoil::Result {
    let Some(guard) = config.guard.clone() else {
        return Err("run_guarded needs a guard".into());
    };
    let current: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let store = build_store(&config, current.clone()).await?;
    let mut builder = ResilientLimiter::builder(
        store,
        PolicyTable::new(config.policy.clone()),
        guard.on_failure,
    )
    .name(node_name(config.index))
    .clock(NodeClock { skew: config.skew })
    .breaker(guard.breaker);
    if !guard.deny_cache {
        builder = builder.deny_cache(None);
    }
    if let Some(allow) = guard.allow_cache {
        builder = builder.danger_allow_cache(allow);
    }
    let limiter = builder.build()?;
    for request in &config.requests {
        let issued = issue(request, &config.pauses).await;
        let result = limiter.acquire(user_key(request.key), request.cost).await;
        let answered = true_now();
        let (outcome, source) = match result {
            Ok(decided) => {
                let outcome = match (decided.is_allowed(), decided.source) {
                    (false, _) => Outcome::Denied,
                    (true, Source::Store) => {
                        admitted_in_redis(&current, &config.tap, issued, answered)
                    }
                    // Decided locally, at once: it takes effect when it is answered.
                    (true, _) => Outcome::Admitted {
                        at: answered,
                        traced: true,
                    },
                };
                (outcome, Some(decided.source))
            }
            Err(_) => (Outcome::Failed(Failure::Other), None),
        };
        config.record(request, (issued, answered), outcome, source);
    }
    Ok(())
}

/// The node behind rein's `LeasedLimiter` over the store: an admission from a held block
/// takes effect when it is answered (no call is made); a direct one when its script ran. A
/// lease's reservations run scripts too, but they admit nothing by themselves, so the oracle
/// sees only what the node admitted. After its last request the node stops its timers and
/// waits for every node to serve its demand; then it shuts its limiter down, as a process
/// that stops would (what it holds goes back if a return can still land, else it is
/// stranded), and records the limiter's counters, which then account for every unit it
/// reserved. Waiting first keeps the world's admissions what they were without the
/// shutdown: no node's returns reach a node still serving.
async fn run_leased(config: NodeConfig) -> turmoil::Result {
    if config.guard.is_some() {
        return Err("a leased node has no guard in the simulator".into());
    }
    let current: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let store = build_store(&config, current.clone()).await?;
    let leased = LeasedLimiter::builder(store)
        // Its timers stop while its process is paused: run by hand below.
        .manual_timers()
        .config(config.lease_config)
        .clock(NodeClock { skew: config.skew })
        // Unique among the world's nodes, and the same in every run (the default is random).
        .node_id(config.index as u64 + 1)
        .build()?;
    // The book's timers, stopped while the process is paused, and started again a
    // millisecond after it resumes: the requests that waited are served first (the harsher
    // order: the request path itself must refuse a block whose end passed meanwhile).
    let timers = tokio::spawn({
        let leased = leased.clone();
        let pauses = config.pauses.clone();
        async move {
            loop {
                let now = true_now();
                let Some(&(from, until)) = pauses.iter().filter(|p| p.1 > now).min_by_key(|p| p.0)
                else {
                    return leased.run_timers().await;
                };
                if from > now {
                    let _ = tokio::time::timeout(
                        Duration::from(from.saturating_since(now)),
                        leased.run_timers(),
                    )
                    .await;
                }
                sleep_until(until.saturating_add(rein_core::Micros::from_millis(1))).await;
            }
        }
    });
    let policy = leased.prepare(&config.policy)?;
    let serve = async {
        for request in &config.requests {
            let issued = issue(request, &config.pauses).await;
            let user = user_key(request.key);
            let result = leased
                .acquire_leased(None, &policy, user.as_bytes(), request.cost)
                .await;
            let answered = true_now();
            let (outcome, source) = match result {
                Ok(decided) if !decided.decision.is_allowed() => (Outcome::Denied, None),
                Ok(decided) => match decided.source {
                    Source::Store => (
                        admitted_in_redis(&current, &config.tap, issued, answered),
                        Some(Source::Store),
                    ),
                    // From a held block (a local denial never admits).
                    _ => (
                        Outcome::Admitted {
                            at: answered,
                            traced: true,
                        },
                        None,
                    ),
                },
                Err(e) => (Outcome::Failed(failure(&e)), None),
            };
            config.record(request, (issued, answered), outcome, source);
        }
    };
    match config.killed {
        // A request in flight when the process dies is never answered (its link is held
        // for good): the process stops there, whatever it was doing.
        Some(at) => {
            let _ =
                tokio::time::timeout(Duration::from(at.saturating_since(true_now())), serve).await;
        }
        None => serve.await,
    }
    config.serving.set(config.serving.get().saturating_sub(1));
    if let Some(at) = config.killed {
        // Alive (its timers running) until it dies; dead, it shuts nothing down and
        // returns nothing.
        sleep_until(at).await;
        timers.abort();
        config
            .shares_at_death
            .borrow_mut()
            .insert(config.index, leased.rate_shares());
        config
            .leases
            .borrow_mut()
            .insert(config.index, leased.stats());
        return Ok(());
    }
    timers.abort();
    while config.serving.get() > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    leased.shutdown().await;
    config
        .leases
        .borrow_mut()
        .insert(config.index, leased.stats());
    Ok(())
}

/// The node behind rein-redis's `OptimisticStore`: one exclusive connection, the server's
/// `TIME`, up to 8 transactions per decision with a jittered backoff seeded by the node's
/// index. An admission takes effect when its `EXEC` ran (the tap notes it); a decision that
/// lost every race is a failure (`Contended`).
async fn run_optimistic(config: NodeConfig) -> turmoil::Result {
    let current: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let store = retry_first_connect(|| {
        let current = current.clone();
        OptimisticStoreBuilder::new()
            .deadline(config.deadline)
            .connect_timeout(config.connect_timeout)
            .min_ttl(MIN_TTL)
            .max_connections(NonZeroUsize::MIN)
            .rng_seed(config.index as u64)
            .connect_with(move || connect(Some(current.clone())))
    })
    .await?;
    let policy = RedisPolicy::prepare(&config.policy);
    for request in &config.requests {
        let issued = issue(request, &config.pauses).await;
        let result = store
            .acquire(None, &policy, user_key(request.key).as_ref(), request.cost)
            .await;
        let answered = true_now();
        let outcome = store_outcome(result, &current, &config.tap, (issued, answered));
        config.record(request, (issued, answered), outcome, None);
    }
    Ok(())
}

/// What a store's answer came to: an admission at the instant its script ran
/// ([`admitted_in_redis`]), a denial, or a failure.
pub(crate) fn store_outcome(
    result: Result<Decision, DecideError>,
    current: &Mutex<Option<SocketAddr>>,
    tap: &ScriptTap,
    (issued, answered): (Timestamp, Timestamp),
) -> Outcome {
    match result {
        Ok(decision) if decision.is_allowed() => admitted_in_redis(current, tap, issued, answered),
        Ok(_) => Outcome::Denied,
        Err(e) => Outcome::Failed(failure(&e)),
    }
}

/// Records the decision node `node` made on `request`, asked and answered at the true
/// instants `(issued, answered)`.
pub(crate) fn record(
    events: &RefCell<Vec<Event>>,
    node: usize,
    request: &Request,
    (issued, answered): (Timestamp, Timestamp),
    outcome: Outcome,
    source: Option<Source>,
) {
    events.borrow_mut().push(Event {
        node,
        key: request.key,
        cost: request.cost,
        issued,
        answered,
        outcome,
        source,
    });
}

/// How a store error is recorded: the deadline, the connection, or anything else.
fn failure(error: &DecideError) -> Failure {
    match error {
        DecideError::Unavailable(StoreError::Timeout(_)) => Failure::Timeout,
        DecideError::Unavailable(StoreError::Connection(_)) => Failure::Connection,
        _ => Failure::Other,
    }
}

/// An admission Redis made: at the instant the tap saw the script run on the node's
/// current connection, which must lie between the call and its answer.
fn admitted_in_redis(
    current: &Mutex<Option<SocketAddr>>,
    tap: &ScriptTap,
    issued: Timestamp,
    answered: Timestamp,
) -> Outcome {
    let addr = *current.lock().unwrap_or_else(|p| p.into_inner());
    match addr
        .and_then(|a| tap.last_run(a))
        .filter(|&at| at >= issued && at <= answered)
    {
        Some(at) => Outcome::Admitted { at, traced: true },
        None => Outcome::Admitted {
            at: answered,
            traced: false,
        },
    }
}

/// The resilient limiter's local clock on a node: true simulated time plus the node's
/// offset. Never a real clock.
#[derive(Clone, Copy, Debug)]
struct NodeClock {
    skew: Skew,
}

impl rein_memory::Clock for NodeClock {
    fn now(&self) -> Timestamp {
        self.skew.read(true_now())
    }
}

async fn run_naive(config: NodeConfig) -> turmoil::Result {
    let Some(bucket) = NaiveBucket::for_policy(config.policy.policy()) else {
        return Err("the naive baseline needs a token-bucket policy".into());
    };
    let mut conn = None;
    for request in &config.requests {
        let issued = issue(request, &config.pauses).await;
        if conn.is_none() {
            conn = connect(None).await.ok();
        }
        let outcome = match conn.as_mut() {
            None => Outcome::Failed(Failure::Connection),
            Some(c) => {
                let user = format!("user-{}", request.key);
                match bucket.is_allowed(c, issued, &user).await {
                    // The seed decides on the client, between its read and its write.
                    Ok(true) => Outcome::Admitted {
                        at: true_now(),
                        traced: true,
                    },
                    Ok(false) => Outcome::Denied,
                    Err(_) => {
                        conn = None;
                        Outcome::Failed(Failure::Connection)
                    }
                }
            }
        };
        config.record(request, (issued, true_now()), outcome, None);
    }
    Ok(())
}

/// The store, once its first connection is up. Redis binds its port during the first
/// tick, so the node retries a refused first connect a few times.
async fn build_store(
    config: &NodeConfig,
    current: Arc<Mutex<Option<SocketAddr>>>,
) -> Result<RedisStore<MultiplexedConnection>, Box<dyn std::error::Error>> {
    build_store_on(
        REDIS_HOST,
        config.deadline,
        config.connect_timeout,
        config.overrides,
        current,
    )
    .await
}

/// [`build_store`] against the Redis host `host` (the multi-region world has several),
/// applying the overrides kept there at most `overrides` stale, if given. Built with
/// `connect_with`, the store does not subscribe to the overrides' channel: it sees a
/// change by re-reading alone.
pub(crate) async fn build_store_on(
    host: &'static str,
    deadline: Duration,
    connect_timeout: Duration,
    overrides: Option<Duration>,
    current: Arc<Mutex<Option<SocketAddr>>>,
) -> Result<RedisStore<MultiplexedConnection>, Box<dyn std::error::Error>> {
    retry_first_connect(|| {
        let current = current.clone();
        let mut builder = RedisStoreBuilder::new();
        if let Some(staleness) = overrides {
            builder = builder.overrides(staleness);
        }
        builder
            .deadline(deadline)
            .connect_timeout(connect_timeout)
            // Client-time mode: TTLs run on Redis's clock, which a node behind it lags.
            .min_ttl(MIN_TTL)
            .connect_with(move || connect_to(host, Some(current.clone())))
    })
    .await
}

/// What `build` builds, once its first connection is up: Redis binds its port during the
/// first tick, so a failed build is tried again, 10 ms later, up to 20 more times.
async fn retry_first_connect<T, E, F>(
    mut build: impl FnMut() -> F,
) -> Result<T, Box<dyn std::error::Error>>
where
    F: Future<Output = Result<T, E>>,
    E: std::error::Error + 'static,
{
    let mut attempts = 0;
    loop {
        match build().await {
            Ok(built) => return Ok(built),
            Err(e) if attempts >= 20 => return Err(Box::new(e)),
            Err(_) => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// A `MultiplexedConnection` over a new turmoil TCP stream to the simulated Redis, noting
/// the stream's local address for the tap. redis-rs's own response timeout is off: the
/// store's deadline bounds every call.
async fn connect(
    current: Option<Arc<Mutex<Option<SocketAddr>>>>,
) -> redis::RedisResult<MultiplexedConnection> {
    connect_to(REDIS_HOST, current).await
}

/// [`connect`] to the Redis host `host`.
async fn connect_to(
    host: &'static str,
    current: Option<Arc<Mutex<Option<SocketAddr>>>>,
) -> redis::RedisResult<MultiplexedConnection> {
    let stream = turmoil::net::TcpStream::connect((host, REDIS_PORT)).await?;
    let local = stream.local_addr()?;
    let info = RedisConnectionInfo::default().set_skip_set_lib_name();
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let (conn, driver) = MultiplexedConnection::new_with_config(&info, stream, config).await?;
    tokio::spawn(driver);
    if let Some(current) = current {
        *current.lock().unwrap_or_else(|p| p.into_inner()) = Some(local);
    }
    Ok(conn)
}

/// Waits until `request` is due and the process runs: the instant it is issued.
pub(crate) async fn issue(request: &Request, pauses: &[(Timestamp, Timestamp)]) -> Timestamp {
    wait_until_due(request).await;
    wait_while_paused(pauses).await;
    true_now()
}

async fn wait_until_due(request: &Request) {
    let due = clock::start().as_micros() + request.due.as_micros() as u64;
    let now = true_now().as_micros();
    if due > now {
        tokio::time::sleep(Duration::from_micros(due - now)).await;
    }
}

/// Waits while the process is paused: a request due during a pause is served when it ends.
async fn wait_while_paused(pauses: &[(Timestamp, Timestamp)]) {
    loop {
        let now = true_now();
        match pauses.iter().find(|p| p.0 <= now && now < p.1) {
            Some(&(_, until)) => sleep_until(until).await,
            None => return,
        }
    }
}

/// Sleeps until true instant `at`.
async fn sleep_until(at: Timestamp) {
    let wait = at.saturating_since(true_now());
    if wait > rein_core::Micros::ZERO {
        tokio::time::sleep(Duration::from(wait)).await;
    }
}

/// The user key a key id stands for.
pub(crate) fn user_key(key: u64) -> String {
    format!("user-{key}")
}

/// Keys outlive any client-time skew the world draws (at most a few seconds).
const MIN_TTL: Duration = Duration::from_secs(30);
