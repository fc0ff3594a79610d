//! Helpers shared by the integration tests: stores over private servers, raw connections
//! for inspecting keys, and fake servers that are not Redis.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use redis::FromRedisValue;
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use rein_core::rate_share::{RateOp, TakeRequest};
use rein_core::time::MAX_SPAN;
use rein_core::{Limit, Limiter, Micros, Policy};
use rein_redis::{RedisPolicy, RedisStore, RedisStoreBuilder};
use rein_redis_harness::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// `assert!(matches!(value, pattern))` that shows the value when it fails, after the
/// context if one is given (`format!` arguments).
#[allow(unused_macros)]
macro_rules! assert_matches {
    ($value:expr, $pattern:pat $(if $guard:expr)? $(,)?) => {
        match &$value {
            value => assert!(matches!(value, $pattern $(if $guard)?), "{value:?}"),
        }
    };
    ($value:expr, $pattern:pat, $($context:tt)+) => {
        match &$value {
            value => assert!(
                matches!(value, $pattern),
                "{}: {value:?}",
                format_args!($($context)+)
            ),
        }
    };
}
#[allow(unused_imports)]
pub(crate) use assert_matches;

/// The least-privilege user docs/redis.md recommends, and what a Cluster's adds.
#[allow(unused_imports)]
pub use rein_redis_harness::{CLUSTER_PRIVILEGE, LEAST_PRIVILEGE};

/// A store over a new `ConnectionManager` to `server`, with a deadline generous enough for
/// a debug build on a busy machine: these tests are about exactness, not latency, and a
/// timed-out call has an unknown effect.
pub async fn store(server: &RedisServer) -> RedisStore<ConnectionManager> {
    RedisStoreBuilder::new()
        .deadline(Duration::from_secs(5))
        .connect(&server.url())
        .await
        .expect("connect the store")
}

/// A store over a private Cluster, with the same generous deadline as [`store`].
pub async fn cluster_store(
    cluster: &rein_redis_harness::RedisCluster,
) -> RedisStore<redis::cluster_async::ClusterConnection> {
    RedisStoreBuilder::new()
        .deadline(Duration::from_secs(5))
        .connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster")
}

/// A plain connection for inspecting and disturbing the server.
pub async fn raw(server: &RedisServer) -> MultiplexedConnection {
    raw_at(&server.url()).await
}

/// [`raw`] to the server at `url` (a worker process knows only that).
pub async fn raw_at(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// A limit of `limit` that does not refill while a test runs, in each algorithm, named by
/// its algorithm (`tb`, `fw`, `sl`, `sc`). Windows are aligned to the epoch: long enough that
/// no boundary falls inside a test (the next boundary of MAX_SPAN, 2^48 µs, is in 2032;
/// 4.5 × 10^13 µs is 521 days).
pub fn unrefilled(limit: u64) -> Vec<RedisPolicy> {
    let hour = Micros::from_secs(3600);
    [
        ("tb", Limit::token_bucket(limit, 1, hour)),
        ("fw", Limit::fixed_window(limit, MAX_SPAN)),
        ("sl", Limit::sliding_log(limit, hour)),
        ("sc", Limit::sliding_counter(limit, LONG)),
    ]
    .into_iter()
    .map(|(name, limit)| {
        RedisPolicy::new(name, Policy::single(limit.expect("valid limit"))).expect("valid name")
    })
    .collect()
}

/// A window of 4.5 × 10^13 µs (521 days), for a sliding counter that no boundary crosses
/// while a test runs.
const LONG: Micros = Micros::from_micros(45_000_000_000_000);

/// `name`: four limits, one of each algorithm, none refilling while a test runs; the fixed
/// window (3) is the tightest, the others allow 10.
pub fn mixed_policy(name: &str) -> RedisPolicy {
    let hour = Micros::from_secs(3600);
    let limits = [
        Limit::token_bucket(10, 1, hour),
        Limit::sliding_log(10, hour),
        Limit::fixed_window(3, MAX_SPAN),
        Limit::sliding_counter(10, LONG),
    ];
    let limits = limits.map(|l| l.expect("valid limit"));
    RedisPolicy::new(name, Policy::new(limits).expect("valid")).expect("valid name")
}

/// Node 1's first take of a key's rate share: no grant held or applied, `seq` 1.
pub fn first_take(demand: u64, validity: Micros) -> RateOp {
    RateOp::Take(TakeRequest {
        node: 1,
        held: 0,
        seq: 1,
        applied: 0,
        demand,
        validity,
    })
}

/// Whether `store` admits `cost` for `key` now (the server's clock); an error fails the
/// test.
pub async fn admits<L: Limiter>(store: &L, policy: &L::Prepared, key: &[u8], cost: u64) -> bool {
    store
        .acquire(None, policy, key, cost)
        .await
        .expect("a decision")
        .is_allowed()
}

/// Spawns `tasks` tasks on `store`, each taking 1 of `policy` for `key` until it sees a
/// denial (with no refill, every later call is denied too); each answers how many it took.
pub fn spawn_takers<L>(
    store: &L,
    tasks: usize,
    policy: &Arc<L::Prepared>,
    key: &'static [u8],
) -> Vec<JoinHandle<u64>>
where
    L: Limiter + Clone + 'static,
{
    (0..tasks)
        .map(|_| {
            let (store, policy) = (store.clone(), Arc::clone(policy));
            tokio::spawn(async move {
                let mut took = 0;
                while admits(&store, &policy, key, 1).await {
                    took += 1;
                }
                took
            })
        })
        .collect()
}

/// How many `takers` took together, once each has seen its denial.
pub async fn taken(takers: Vec<JoinHandle<u64>>) -> u64 {
    let mut sum = 0;
    for taker in takers {
        sum += taker.await.expect("a taker");
    }
    sum
}

/// Asks a [`mixed_policy`] whose window is full for 1 more of `key`: the fixed window denies,
/// and the denial speaks for it (its limit of 3, nothing remaining).
pub async fn the_window_denies<L: Limiter>(store: &L, policy: &L::Prepared, key: &[u8]) {
    let denied = store.acquire(None, policy, key, 1).await.expect("decision");
    assert!(!denied.is_allowed());
    assert_eq!(
        (denied.limit, denied.remaining),
        (3, 0),
        "the window speaks"
    );
}

/// The reply to the command `args` (its name, then its arguments) on a connection for
/// inspecting the server; an error fails the test, naming the command.
pub async fn query<T: FromRedisValue>(conn: &mut impl ConnectionLike, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    cmd.arg(&args[1..]);
    cmd.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]))
}

/// A current-thread runtime, for a test that drives the store from synchronous code (a
/// proptest's cases).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Checks `check` on `cases` random cases of `strategy` against one private redis-server
/// and one connection: each case over a fresh store, its keys under `{prefix}{n}` and kept at
/// least an hour (key TTLs run on the server's clock, not on a case's timeline). A failing
/// case is shrunk, saved to `regressions` (replayed first on later runs) and fails the test.
pub fn check_cases<S, F, Fut>(
    cases: u32,
    regressions: &'static str,
    prefix: &str,
    strategy: S,
    check: F,
) where
    S: Strategy,
    F: Fn(RedisStore<ConnectionManager>, ConnectionManager, S::Value) -> Fut,
    Fut: Future<Output = Result<(), TestCaseError>>,
{
    let server = RedisServer::start().expect("start redis-server");
    let rt = runtime();
    let conn: ConnectionManager = rt.block_on(async {
        let client = redis::Client::open(server.url()).expect("client");
        client.get_connection_manager().await.expect("connect")
    });
    let config = Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        ..Config::with_cases(cases)
    };
    let case_no = AtomicUsize::new(0);
    let result = TestRunner::new(config).run(&strategy, |case| {
        let n = case_no.fetch_add(1, Ordering::Relaxed);
        let store = RedisStoreBuilder::new()
            .prefix(format!("{prefix}{n}"))
            .min_ttl(Duration::from_secs(3_600))
            .deadline(Duration::from_secs(5))
            .build(conn.clone())
            .expect("store");
        rt.block_on(check(store, conn.clone(), case))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// This test binary, started again to run only the ignored test `test` (a worker process
/// of a test that needs several), its output not captured; the caller adds its environment
/// and spawns it.
pub fn worker(test: &str) -> std::process::Command {
    let exe = std::env::current_exe().expect("the test binary");
    let mut command = std::process::Command::new(exe);
    command.args(["--exact", test, "--ignored", "--nocapture"]);
    command
}

/// The environment variable that tells a worker process the URL of its test's server.
pub const WORKER_URL: &str = "REIN_TEST_WORKER_URL";

/// `n` [`worker`]s of `test`, started, each told the URL of `server` in [`WORKER_URL`], its
/// stderr shown; `each(i, command)` adds what worker `i` needs besides.
pub fn spawn_workers(
    test: &str,
    n: usize,
    server: &RedisServer,
    each: impl Fn(usize, &mut std::process::Command),
) -> Vec<std::process::Child> {
    (0..n)
        .map(|i| {
            let mut command = worker(test);
            command
                .env(WORKER_URL, server.url())
                .stderr(std::process::Stdio::inherit());
            each(i, &mut command);
            command.spawn().expect("start a worker process")
        })
        .collect()
}

/// The integer at `key` on `server`, 0 if there is none.
pub fn counter(server: &RedisServer, key: &str) -> u64 {
    let reply = server.command(&["GET", key]).expect("GET");
    // `$<len>\r\n<value>\r\n`, or `$-1` for no value.
    reply
        .lines()
        .nth(1)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until `n` workers have counted themselves ready at `key` on `server`; fails after
/// a minute.
pub fn await_ready(server: &RedisServer, key: &str, n: usize) {
    let started = std::time::Instant::now();
    while counter(server, key) < n as u64 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the workers never got ready"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A TCP server on 127.0.0.1 that speaks just enough RESP to be mistaken for Redis: it
/// answers every complete command it receives with `reply` (or with nothing at all, if
/// `reply` is empty). It counts the bytes it received.
pub struct FakeServer {
    pub port: u16,
    pub received: Arc<AtomicUsize>,
}

impl FakeServer {
    pub async fn start(reply: &'static [u8]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let received = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        counter.fetch_add(n, Ordering::SeqCst);
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(used) = complete_command(&buf) {
                            buf.drain(..used);
                            if !reply.is_empty() && socket.write_all(reply).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self { port, received }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// The length of the first complete RESP command (an array of bulk strings) in `buf`.
fn complete_command(buf: &[u8]) -> Option<usize> {
    let line = |from: usize| -> Option<(&[u8], usize)> {
        let end = buf.get(from..)?.windows(2).position(|w| w == b"\r\n")? + from;
        Some((&buf[from..end], end + 2))
    };
    let (header, mut at) = line(0)?;
    let count: usize = std::str::from_utf8(header.strip_prefix(b"*")?)
        .ok()?
        .parse()
        .ok()?;
    for _ in 0..count {
        let (len, next) = line(at)?;
        let len: usize = std::str::from_utf8(len.strip_prefix(b"$")?)
            .ok()?
            .parse()
            .ok()?;
        at = next + len + 2;
        if buf.len() < at {
            return None;
        }
    }
    Some(at)
}

/// A `MultiplexedConnection` to `port` that sends nothing on connect, so it can be made to
/// a server that never answers.
pub async fn quiet_connection(port: u16) -> MultiplexedConnection {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let info = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
    let (conn, driver) =
        MultiplexedConnection::new_with_config(&info, stream, redis::AsyncConnectionConfig::new())
            .await
            .expect("multiplexed connection");
    tokio::spawn(driver);
    conn
}
