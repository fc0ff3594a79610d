//! Per-key overrides kept in Redis, as two processes see them (two stores, each with its
//! own connection and cache): a change applies in the other within its staleness, a raised
//! limit keeps what was counted and a lowered one applies to it, a key's own override wins
//! over a prefix's, and bad input is a typed error.

mod common;

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use rein_core::admin::{AdminError, KeyAdmin, Until};
use rein_core::overrides::MAX_OVERRIDES;
use rein_core::overrides::{KeyMatch, Override};
use rein_core::{Limit, Limiter, Micros, Policy};
use rein_redis::{RedisPolicy, RedisStore, RedisStoreBuilder};
use rein_redis_harness::{RedisCluster, RedisServer};

const STALENESS: Duration = Duration::from_millis(200);

fn api() -> RedisPolicy {
    let window = Limit::fixed_window(5, Micros::from_secs(3600)).expect("valid");
    RedisPolicy::new("api", Policy::single(window)).expect("valid name")
}

fn per_hour(limit: u64) -> Override {
    Override::Limits(Policy::single(
        Limit::fixed_window(limit, Micros::from_secs(3600)).expect("valid"),
    ))
}

fn key(k: &str) -> KeyMatch {
    KeyMatch::Key(k.as_bytes().into())
}

fn prefix(p: &str) -> KeyMatch {
    KeyMatch::Prefix(p.as_bytes().into())
}

/// How many of `n` requests of cost 1 `store` admits for `user`.
async fn admitted<C>(store: &RedisStore<C>, user: &str, n: u64) -> u64
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut admitted = 0;
    for _ in 0..n {
        let d = store
            .acquire(None, &api(), user.as_bytes(), 1)
            .await
            .expect("decision");
        admitted += u64::from(d.is_allowed());
    }
    admitted
}

/// `writer` changes overrides; `reader` (another process's store) decides.
async fn two_processes<C>(writer: &RedisStore<C>, reader: &RedisStore<C>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    assert_eq!(
        admitted(reader, "tenant-7", 6).await,
        5,
        "the policy's own limit"
    );

    // Raised to 10: once the reader's cache is re-read, it admits 5 more, not 10: what was
    // counted is kept.
    assert!(
        !writer
            .set_override("api", &key("tenant-7"), &per_hour(10))
            .await
            .expect("set")
    );
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    assert_eq!(admitted(reader, "tenant-7", 8).await, 5, "raised to 10");
    // The writer applies its own change at once.
    assert!(
        writer
            .set_override("api", &key("tenant-7"), &per_hour(12))
            .await
            .expect("set")
    );
    assert_eq!(
        admitted(writer, "tenant-7", 3).await,
        2,
        "raised to 12, seen by the writer"
    );

    // Lowered to 7: 12 counted, nothing more.
    writer
        .set_override("api", &key("tenant-7"), &per_hour(7))
        .await
        .expect("set");
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    let denied = reader
        .acquire(None, &api(), b"tenant-7", 1)
        .await
        .expect("decision");
    assert!(!denied.is_allowed());
    assert_eq!(denied.limit, 7, "the override's limit, in the decision");

    // A prefix without limit; the key's own override still wins over it.
    writer
        .set_override("api", &prefix("tenant-"), &Override::Unlimited)
        .await
        .expect("set");
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    assert_eq!(admitted(reader, "tenant-9", 50).await, 50, "unlimited");
    assert_eq!(admitted(reader, "tenant-7", 1).await, 0, "its own override");
    assert_eq!(admitted(reader, "guest", 6).await, 5, "no override");
    // An unlimited key is never counted: nothing was written for it.
    let state = reader.state(&api(), "tenant-9").await.expect("state");
    assert_eq!(
        state,
        api().policy().new_state(),
        "50 admitted, none counted"
    );

    let mut listed = writer.overrides().await.expect("list").entries;
    listed.sort_by(|a, b| a.keys.cmp(&b.keys));
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].keys, key("tenant-7"));
    assert_eq!(listed[0].value, per_hour(7));
    assert_eq!(listed[1].value, Override::Unlimited);

    // Removed: tenant-7 falls to the prefix's override.
    assert!(
        writer
            .remove_override("api", &key("tenant-7"))
            .await
            .expect("rm")
    );
    assert!(
        !writer
            .remove_override("api", &key("tenant-7"))
            .await
            .expect("rm")
    );
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    assert_eq!(admitted(reader, "tenant-7", 3).await, 3);
}

/// A store on `server` that applies the overrides `source` gives, read again after
/// [`STALENESS`], each call within `deadline`.
async fn sourced(
    server: &RedisServer,
    source: impl rein_core::overrides::OverrideSource,
    deadline: Duration,
) -> RedisStore<ConnectionManager> {
    RedisStoreBuilder::new()
        .deadline(deadline)
        .override_source(source, STALENESS)
        .connect(&server.url())
        .await
        .expect("connect")
}

/// A store that applies overrides, read again after `staleness` at the latest.
fn applying(staleness: Duration) -> RedisStoreBuilder {
    RedisStoreBuilder::new()
        .deadline(Duration::from_secs(5))
        .overrides(staleness)
}

/// Two stores on the server at `url`, as two processes would have: a writer and a reader.
async fn stores(url: &str, staleness: Duration) -> [RedisStore<ConnectionManager>; 2] {
    let store = || async { applying(staleness).connect(url).await.expect("connect") };
    [store().await, store().await]
}

#[tokio::test]
async fn standalone_overrides_reach_another_process_within_their_staleness() {
    let server = RedisServer::start().expect("start redis-server");
    let [writer, reader] = stores(&server.url(), STALENESS).await;
    two_processes(&writer, &reader).await;
    // A store that does not apply overrides decides by the policy alone.
    let plain = common::store(&server).await;
    assert_eq!(admitted(&plain, "tenant-9", 6).await, 5);
}

#[tokio::test]
async fn cluster_overrides_reach_another_process_within_their_staleness() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    let store = || async {
        let store = applying(STALENESS).connect_cluster(cluster.urls()).await;
        store.expect("connect")
    };
    two_processes(&store().await, &store().await).await;
}

#[tokio::test]
async fn bad_overrides_are_typed_errors_and_a_bad_entry_is_left_out() {
    let server = RedisServer::start().expect("start redis-server");
    let [writer, reader] = stores(&server.url(), STALENESS).await;
    for (policy, keys) in [
        ("no spaces", key("k")),
        ("api", key("")),
        ("api", prefix("")),
    ] {
        let e = writer
            .set_override(policy, &keys, &Override::Unlimited)
            .await;
        common::assert_matches!(
            e,
            Err(AdminError::InvalidOverride(_) | AdminError::InvalidKey(_)),
            "{policy:?} {keys:?}"
        );
    }
    // An entry written by hand that does not read: the others still apply.
    let mut raw = common::raw(&server).await;
    let _: () = redis::cmd("HSET")
        .arg("rein:overrides")
        .arg("api:=broken")
        .arg("fw:0:1")
        .query_async(&mut raw)
        .await
        .expect("HSET");
    writer
        .set_override("api", &key("vip"), &per_hour(8))
        .await
        .expect("set");
    assert_eq!(admitted(&reader, "vip", 9).await, 8);
    assert_eq!(admitted(&reader, "broken", 6).await, 5);
    // The list reads the rest, and names the field that does not read (it was an error
    // for the whole list, which left an operator no way to see or remove it).
    let listed = writer.overrides().await.expect("list");
    assert_eq!(listed.entries.len(), 1, "{listed:?}");
    assert_eq!(listed.unreadable.len(), 1, "{listed:?}");
    assert!(
        listed.unreadable[0].starts_with("field \"api:=broken\": "),
        "{listed:?}"
    );

    // At most MAX_OVERRIDES: fill the hash, then one more is refused, a replacement is not.
    let mut fill = redis::cmd("HSET");
    fill.arg("rein:overrides");
    for i in 0..MAX_OVERRIDES - 2 {
        fill.arg(format!("api:=filler-{i}")).arg("unlimited");
    }
    let _: () = fill.query_async(&mut raw).await.expect("HSET");
    let e = writer
        .set_override("api", &key("one-more"), &Override::Unlimited)
        .await;
    common::assert_matches!(e, Err(AdminError::InvalidOverride(_)));
    assert!(
        writer
            .set_override("api", &key("vip"), &per_hour(9))
            .await
            .expect("replace")
    );
}

/// The sliding log the load test decides by: no window boundary to cross mid-test, and
/// every admission of the test still in it.
fn hot_log(limit: u64) -> Policy {
    Policy::single(Limit::sliding_log(limit, Micros::from_secs(3_600)).expect("valid"))
}

/// What the load test's key admits: rein-core replaying the operator's changes on one
/// state, each phase saturated (the load asks far more than any limit).
struct Oracle {
    state: rein_core::PolicyState,
    blocked: bool,
    admitted: u64,
}

impl Oracle {
    fn saturate(&mut self, limits: &Policy) -> u64 {
        let now = rein_core::Timestamp::from_micros(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_micros() as u64,
        );
        while !self.blocked
            && limits
                .acquire(now, &mut self.state, 1)
                .expect("the oracle's state fits")
                .is_allowed()
        {
            self.admitted += 1;
        }
        self.admitted
    }
}

const ADMITTED: &str = "overrides-test:admitted";
const READY: &str = "overrides-test:ready";
const STOP: &str = "overrides-test:stop";

/// Two OS processes under load (this test binary started again as `override_load_worker`,
/// four tasks each on its own store) decide one key while this process, the operator,
/// raises and lowers its override, resets, blocks and unblocks it. After each change has
/// had its staleness, the total admitted (counted in Redis by the workers) is exactly what
/// rein-core admits replaying the same changes on one state.
#[test]
fn two_processes_under_load_follow_each_change_within_its_staleness() {
    const WORKERS: usize = 2;
    let server = RedisServer::start().expect("start redis-server");
    let workers = common::spawn_workers("override_load_worker", WORKERS, &server, |_, command| {
        command.stdout(std::process::Stdio::null());
    });
    let get = |key: &str| common::counter(&server, key);
    common::await_ready(&server, READY, WORKERS);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let operator = runtime.block_on(async {
        RedisStoreBuilder::new()
            .deadline(Duration::from_secs(5))
            .connect(&server.url())
            .await
            .expect("connect")
    });
    let policy = RedisPolicy::new("api", hot_log(5)).expect("valid");
    let settle = || std::thread::sleep(STALENESS * 2);
    let mut oracle = Oracle {
        state: hot_log(5).new_state(),
        blocked: false,
        admitted: 0,
    };
    let phase = |what: &str, limits: &Policy, oracle: &mut Oracle| {
        settle();
        let expected = oracle.saturate(limits);
        assert_eq!(get(ADMITTED), expected, "{what}");
        eprintln!("{what}: {expected} admitted in all");
    };
    let over = |limit| Override::Limits(hot_log(limit));
    let hot = key("hot");
    phase("the policy's own 5", &hot_log(5), &mut oracle);
    runtime
        .block_on(operator.set_override("api", &hot, &over(40)))
        .expect("set");
    phase("raised to 40", &hot_log(40), &mut oracle);
    runtime
        .block_on(operator.set_override("api", &hot, &over(20)))
        .expect("set");
    phase("lowered to 20", &hot_log(20), &mut oracle);
    assert!(
        runtime
            .block_on(operator.reset(&policy, b"hot"))
            .expect("reset")
    );
    oracle.state = hot_log(20).new_state();
    phase("reset", &hot_log(20), &mut oracle);
    let block = operator.block(&policy, b"hot", Until::For(Micros::from_secs(60)), "load");
    assert!(runtime.block_on(block).expect("block"));
    oracle.blocked = true;
    phase("blocked", &hot_log(20), &mut oracle);
    assert!(
        runtime
            .block_on(operator.unblock(&policy, b"hot"))
            .expect("unblock")
    );
    (oracle.blocked, oracle.state) = (false, hot_log(20).new_state());
    phase("unblocked", &hot_log(20), &mut oracle);
    runtime
        .block_on(operator.remove_override("api", &hot))
        .expect("rm");
    phase("back to the policy's 5", &hot_log(5), &mut oracle);

    server.command(&["SET", STOP, "1"]).expect("SET");
    for worker in workers {
        let output = worker.wait_with_output().expect("a worker");
        assert!(output.status.success(), "a worker process failed");
    }
}

/// The worker half of `two_processes_under_load_follow_each_change_within_its_staleness`,
/// run only by it (ignored otherwise, so that a plain run reports it as not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker of two_processes_under_load_follow_each_change_within_its_staleness"]
async fn override_load_worker() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let Ok(url) = std::env::var(common::WORKER_URL) else {
        panic!("run by two_processes_under_load_follow_each_change_within_its_staleness");
    };
    let mut counter = common::raw_at(&url).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let store = RedisStoreBuilder::new()
            .deadline(Duration::from_secs(5))
            .overrides(STALENESS)
            .connect(&url)
            .await
            .expect("connect");
        let (stop, mut counter) = (stop.clone(), counter.clone());
        load.spawn(async move {
            let policy = RedisPolicy::new("api", hot_log(5)).expect("valid");
            while !stop.load(Ordering::Relaxed) {
                let d = store
                    .acquire(None, &policy, b"hot", 1)
                    .await
                    .expect("decision");
                if d.is_allowed() {
                    let _: u64 = common::query(&mut counter, &["INCR", ADMITTED]).await;
                }
                tokio::task::yield_now().await;
            }
        });
    }
    let _: u64 = common::query(&mut counter, &["INCR", READY]).await;
    loop {
        let stopped: Option<String> = common::query(&mut counter, &["GET", STOP]).await;
        if stopped.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(task) = load.join_next().await {
        task.expect("a load task");
    }
}

/// The application's own source (a list it changes at run time) feeds the same cache: a
/// change applies within the staleness, and a source that fails leaves the copy in force.
#[tokio::test]
async fn an_applications_own_source_feeds_the_same_cache() {
    use std::sync::{Arc, Mutex};

    use rein_core::limiter::SourceError;
    use rein_core::overrides::{BoxFuture, OverrideEntry, OverrideSource};

    type Shared = Arc<Mutex<Result<Vec<OverrideEntry>, String>>>;
    struct Table(Shared);
    impl OverrideSource for Table {
        fn load(&self) -> BoxFuture<'_, Result<Vec<OverrideEntry>, SourceError>> {
            let now = self.0.lock().expect("not poisoned").clone();
            Box::pin(async move { now.map_err(|e| SourceError::new(std::io::Error::other(e))) })
        }
    }
    let entry = |k: &str, value: Override| OverrideEntry {
        policy: "api".into(),
        keys: key(k),
        value,
    };

    let server = RedisServer::start().expect("start redis-server");
    let table: Shared = Arc::new(Mutex::new(Ok(vec![entry("vip", per_hour(8))])));
    let store = sourced(&server, Table(table.clone()), Duration::from_secs(5)).await;
    assert_eq!(
        admitted(&store, "vip", 9).await,
        8,
        "read as the store connected"
    );
    *table.lock().expect("not poisoned") = Ok(vec![entry("vip", per_hour(10))]);
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    assert_eq!(admitted(&store, "vip", 3).await, 2, "raised to 10");

    *table.lock().expect("not poisoned") = Err("the database is down".into());
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    assert_eq!(admitted(&store, "other", 6).await, 5);
    assert_eq!(admitted(&store, "vip", 1).await, 0, "the copy, still 10");
    *table.lock().expect("not poisoned") = Ok(vec![entry("other", Override::Unlimited)]);
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    assert_eq!(
        admitted(&store, "other", 10).await,
        10,
        "back, and unlimited"
    );
    assert_eq!(
        admitted(&store, "vip", 1).await,
        0,
        "10 counted, the policy's 5"
    );
}

/// The overrides' hash lost (a restart without persistence, a flush, an eviction) and
/// written again as often is another version: a store that read the old one re-reads it
/// (before, the version counted writes only, so the reader kept the lost overrides until
/// the next write).
#[tokio::test]
async fn a_hash_lost_and_written_again_is_never_mistaken_for_the_one_read() {
    let server = RedisServer::start().expect("start redis-server");
    let [writer, reader] = stores(&server.url(), STALENESS).await;
    // `user` overridden to `limit` an hour: what the reader admits of one more, once it
    // re-read.
    let written_then_read = |user: &'static str, limit: u64| {
        let (writer, reader) = (&writer, &reader);
        async move {
            writer
                .set_override("api", &key(user), &per_hour(limit))
                .await
                .expect("set");
            tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
            admitted(reader, user, limit + 1).await
        }
    };
    assert_eq!(written_then_read("vip", 8).await, 8, "the first write");
    let mut raw = common::raw(&server).await;
    let _: () = redis::cmd("DEL")
        .arg("rein:overrides")
        .query_async(&mut raw)
        .await
        .expect("DEL");
    assert_eq!(
        written_then_read("other", 2).await,
        2,
        "the hash written again"
    );
    // Rolled back (a replica promoted, a backup restored): the hash one write older, then
    // written once. The new version is one no store has read (before, the write counted on
    // from the old version to the one the reader held, with other contents, and the reader
    // kept what it had until the next write).
    assert_eq!(written_then_read("third", 4).await, 4);
    let version: u64 = server
        .command(&["HGET", "rein:overrides", "#v"])
        .expect("HGET")
        .lines()
        .last()
        .and_then(|line| line.parse().ok())
        .expect("a version (RESP: its length, then it)");
    let older = (version - 1).to_string();
    server
        .command(&["HDEL", "rein:overrides", "api:=third"])
        .expect("HDEL");
    server
        .command(&["HSET", "rein:overrides", "#v", &older])
        .expect("HSET");
    assert_eq!(
        written_then_read("fourth", 3).await,
        3,
        "the hash rolled back and written"
    );
}

/// A write is published, and a store that listens re-reads at its next decision: with a
/// staleness of a minute, the other process applies the change within a round trip or two.
#[tokio::test]
async fn a_published_change_applies_at_once_not_after_the_staleness() {
    let server = RedisServer::start().expect("start redis-server");
    let [writer, reader] = stores(&server.url(), Duration::from_secs(60)).await;
    assert_eq!(
        admitted(&reader, "vip", 6).await,
        5,
        "read once, no override"
    );
    // The subscription is made in the background: give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer
        .set_override("api", &key("vip"), &per_hour(8))
        .await
        .expect("set");
    let started = std::time::Instant::now();
    while admitted(&reader, "vip", 1).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the change was not applied within 2 s of a 60 s staleness"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A first read that fails is made once, not once per decision waiting for it. A store
/// that connects reads as it connects; one built over the caller's connection reads at its
/// first decision: sixteen decisions at once over a source that keeps failing cost one read,
/// decide by the policy's own limit, and the next read is a re-read, a staleness later.
/// (Before, each waiting decision read again, one after another: 16 reads, each within the
/// store's deadline, and a store that connected read at its first decision too.)
#[tokio::test]
async fn a_failed_first_read_is_made_once_and_decisions_go_on_without_overrides() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rein_core::limiter::SourceError;
    use rein_core::overrides::{BoxFuture, OverrideEntry, OverrideSource};

    struct Down(Arc<AtomicUsize>);
    impl OverrideSource for Down {
        fn load(&self) -> BoxFuture<'_, Result<Vec<OverrideEntry>, SourceError>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Err(SourceError::new(std::io::Error::other(
                    "the database is down",
                )))
            })
        }
    }
    let server = RedisServer::start().expect("start redis-server");
    let reads = Arc::new(AtomicUsize::new(0));
    let connected = RedisStoreBuilder::new()
        .override_source(Down(reads.clone()), STALENESS)
        .connect(&server.url())
        .await
        .expect("connect");
    assert_eq!(reads.load(Ordering::Relaxed), 1, "read as it connected");
    drop(connected);

    let reads = Arc::new(AtomicUsize::new(0));
    let conn = redis::Client::open(server.url())
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let store = RedisStoreBuilder::new()
        .deadline(Duration::from_secs(5))
        .override_source(Down(reads.clone()), STALENESS)
        .build(conn)
        .expect("valid settings");
    assert_eq!(reads.load(Ordering::Relaxed), 0, "built: not read yet");
    let policy = api();
    let decisions: Vec<_> = (0..16)
        .map(|i| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                store
                    .acquire(None, &policy, format!("k{i}").as_bytes(), 1)
                    .await
                    .expect("a decision")
            })
        })
        .collect();
    for decision in decisions {
        assert!(decision.await.expect("a task").is_allowed());
    }
    assert_eq!(reads.load(Ordering::Relaxed), 1, "one first read");
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    assert_eq!(admitted(&store, "k0", 5).await, 4, "the policy's own 5");
    assert_eq!(
        reads.load(Ordering::Relaxed),
        2,
        "then a re-read, a staleness later"
    );
}

/// Reading the overrides is part of a decision's deadline, not added to it: a re-read that
/// takes the whole deadline (a source that hangs) leaves no time for the script, which is
/// then not sent. The decision is a `Timeout`, and Redis counted nothing. Before, the
/// script was sent with a deadline of its own after the read: answered up to twice the
/// deadline late, which a resilient limiter above had cut off at its own deadline, the
/// request counted in Redis all the same.
#[tokio::test]
async fn an_override_read_that_takes_the_deadline_leaves_the_script_unsent() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rein_core::limiter::SourceError;
    use rein_core::overrides::{BoxFuture, OverrideEntry, OverrideSource};
    use rein_core::{DecideError, StoreError};

    /// Answers its first read at once; every later one hangs.
    struct Hangs(Arc<AtomicUsize>);
    impl OverrideSource for Hangs {
        fn load(&self) -> BoxFuture<'_, Result<Vec<OverrideEntry>, SourceError>> {
            let first = self.0.fetch_add(1, Ordering::Relaxed) == 0;
            Box::pin(async move {
                if !first {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                Ok(vec![OverrideEntry {
                    policy: "api".into(),
                    keys: key("vip"),
                    value: per_hour(8),
                }])
            })
        }
    }
    let server = RedisServer::start().expect("start redis-server");
    let reads = Arc::new(AtomicUsize::new(0));
    let store = sourced(&server, Hangs(reads.clone()), Duration::from_millis(100)).await;
    let policy = api();
    tokio::time::sleep(STALENESS + Duration::from_millis(50)).await;
    let late = store.acquire(None, &policy, b"vip", 1).await;
    assert!(
        matches!(late, Err(DecideError::Unavailable(StoreError::Timeout(_)))),
        "{late:?}"
    );
    assert_eq!(reads.load(Ordering::Relaxed), 2, "the re-read was made");
    // The next read is a staleness away: this peek reads Redis, with the copy in force.
    let left = store.peek(None, &policy, b"vip", 0).await.expect("a peek");
    assert_eq!(left.remaining, 8, "nothing counted: {left:?}");
}
