//! Counts reported for `rein watch` (`RedisStoreBuilder::report_counts`): every decision of
//! `acquire`, made by any of several processes, is counted exactly once in Redis; peeks and
//! stores that do not report add nothing; bad reads are typed errors.

mod common;

use std::time::Duration;

use redis::aio::ConnectionLike;
use rein_core::admin::AdminError;
use rein_core::{Limit, Limiter, Micros, Policy};
use rein_redis::watch::{Counted, MAX_SECONDS_READ, REPORT_EVERY};
use rein_redis::{RedisPolicy, RedisStore, RedisStoreBuilder};
use rein_redis_harness::{RedisCluster, RedisServer};

fn api() -> RedisPolicy {
    let window = Limit::fixed_window(300, Micros::from_secs(3600)).expect("valid");
    RedisPolicy::new("api", Policy::single(window)).expect("valid name")
}

/// Redis's clock in whole seconds.
async fn server_second<C>(store: &RedisStore<C>) -> u64
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    store.server_time().await.expect("TIME").as_micros() / 1_000_000
}

/// The totals of every second from `first` to now, once every report has landed.
async fn totals<C>(store: &RedisStore<C>, first: u64) -> (u64, u64)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    // A decision is reported at the next tick (at most REPORT_EVERY later); one more tick
    // for the call itself.
    tokio::time::sleep(REPORT_EVERY * 2 + Duration::from_millis(500)).await;
    let last = server_second(store).await;
    let seconds: Vec<Counted> = store.counts("api", first, last).await.expect("counts");
    assert_eq!(seconds.len() as u64, last - first + 1);
    let admitted = seconds.iter().map(|c| c.admitted).sum();
    let denied = seconds.iter().map(|c| c.denied).sum();
    (admitted, denied)
}

/// Eight tasks over two reporting stores decide one key 800 times against a limit of 300;
/// a third store, not reporting, decides another key; peeks are made too.
async fn counted_once<C>(reporting: [RedisStore<C>; 2], silent: RedisStore<C>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let first = server_second(&silent).await;
    let mut tasks = Vec::new();
    for task in 0..8 {
        let store = reporting[task % 2].clone();
        tasks.push(tokio::spawn(async move {
            let policy = api();
            let mut admitted = 0u64;
            for _ in 0..100 {
                let decision = store
                    .acquire(None, &policy, b"k", 1)
                    .await
                    .expect("decision");
                admitted += u64::from(decision.is_allowed());
                store.peek(None, &policy, b"k", 1).await.expect("peek");
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.expect("task");
    }
    assert_eq!(admitted, 300);
    for _ in 0..50 {
        silent
            .acquire(None, &api(), b"other", 1)
            .await
            .expect("decision");
    }
    assert_eq!(totals(&silent, first).await, (300, 500));
}

async fn stores<C>(
    connect: impl AsyncFn(RedisStoreBuilder) -> RedisStore<C>,
) -> ([RedisStore<C>; 2], RedisStore<C>) {
    let reporting = RedisStoreBuilder::new()
        .deadline(Duration::from_secs(2))
        .report_counts(true);
    let silent = RedisStoreBuilder::new().deadline(Duration::from_secs(2));
    (
        [connect(reporting.clone()).await, connect(reporting).await],
        connect(silent).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_is_counted_once_by_the_processes_that_report() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let (reporting, silent) =
        stores(async |builder| builder.connect(&url).await.expect("connect")).await;
    counted_once(reporting, silent).await;
    // Each second's hash is kept for two minutes.
    let mut conn = common::raw_at(&url).await;
    let keys: Vec<String> = common::query(&mut conn, &["KEYS", "rein:watch:*"]).await;
    assert!(!keys.is_empty(), "no second reported");
    for key in keys {
        let ttl: i64 = common::query(&mut conn, &["TTL", &key]).await;
        assert!((1..=120).contains(&ttl), "{key}: TTL {ttl}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_too() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    let urls = cluster.urls();
    let (reporting, silent) = stores(async |builder| {
        builder
            .connect_cluster(urls.clone())
            .await
            .expect("connect")
    })
    .await;
    counted_once(reporting, silent).await;
}

#[tokio::test]
async fn bad_reads_are_typed_errors() {
    let server = RedisServer::start().expect("start redis-server");
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    for (policy, first, last) in [
        ("api", 10, 9),
        ("api", 0, MAX_SECONDS_READ),
        ("not a name", 0, 0),
    ] {
        let read = store.counts(policy, first, last).await;
        common::assert_matches!(
            read,
            Err(AdminError::InvalidRequest(_)),
            "{policy} {first}..={last}"
        );
    }
    let nothing = store.counts("api", 5, 6).await.expect("read");
    assert_eq!(
        nothing,
        vec![
            Counted {
                second: 5,
                admitted: 0,
                denied: 0
            },
            Counted {
                second: 6,
                admitted: 0,
                denied: 0
            },
        ]
    );
}
