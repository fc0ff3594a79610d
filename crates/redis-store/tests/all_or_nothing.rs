//! A policy of several limits is decided in one call, all-or-nothing, on a standalone
//! server and on a Redis Cluster, where all its keys share one hash slot.

mod common;

use redis::aio::ConnectionLike;
use rein_core::{Limit, LimitState, Limiter, Micros, Policy, PolicyState};
use rein_redis::{RedisPolicy, RedisStore};
use rein_redis_harness::{RedisCluster, RedisServer};

/// Four limits, one of each algorithm; the fixed window is the tightest (3).
fn policy() -> RedisPolicy {
    let hour = Micros::from_secs(3600);
    let limits = [
        Limit::token_bucket(10, 1, hour),
        Limit::sliding_log(10, hour),
        Limit::fixed_window(3, rein_core::MAX_SPAN),
        Limit::sliding_counter(10, Micros::from_micros(45_000_000_000_000)),
    ];
    let limits = limits.map(|l| l.expect("valid limit"));
    RedisPolicy::new("all-or-nothing", Policy::new(limits).expect("valid")).expect("valid name")
}

/// Takes 2, then 1 (the window is now full), then asks for 1 more: the window denies, and
/// no limit's state changes.
async fn a_denial_by_one_limit_leaves_the_others_untouched<C>(store: &RedisStore<C>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let policy = policy();
    let key = "user-7";
    assert!(
        store
            .acquire(None, &policy, key.as_ref(), 2)
            .await
            .expect("decision")
            .is_allowed()
    );
    assert!(
        store
            .acquire(None, &policy, key.as_ref(), 1)
            .await
            .expect("decision")
            .is_allowed()
    );
    let before = store.state(&policy, key).await.expect("state");
    let denied = store
        .acquire(None, &policy, key.as_ref(), 1)
        .await
        .expect("decision");
    assert!(!denied.is_allowed());
    assert_eq!(
        (denied.limit, denied.remaining),
        (3, 0),
        "the window speaks"
    );
    let after = store.state(&policy, key).await.expect("state");
    assert_eq!(before, after, "a denial wrote something");
    assert_eq!(counts(&after), [3, 3, 3, 3], "every limit took exactly 3");
}

/// How much each limit has taken, read from the stored state.
fn counts(state: &PolicyState) -> Vec<u64> {
    let wall_clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    state
        .iter()
        .map(|s| match s {
            // Each token moves `tat` one emission interval (an hour) past a full bucket's
            // `now`; Redis's clock is this machine's.
            LimitState::TokenBucket(tb) => {
                let ahead = tb.tat.as_micros().saturating_sub(wall_clock);
                (ahead + 60_000_000) / 3_600_000_000
            }
            LimitState::SlidingLog(log) => log.entries().map(|e| e.cost).sum(),
            LimitState::FixedWindow(w) => w.count,
            LimitState::SlidingCounter(c) => c.current,
        })
        .collect()
}

#[tokio::test]
async fn standalone_multi_limit_policy_is_all_or_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let store = common::store(&server).await;
    a_denial_by_one_limit_leaves_the_others_untouched(&store).await;
}

#[tokio::test]
async fn cluster_multi_limit_policy_is_all_or_nothing_in_one_slot() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    let store = common::cluster_store(&cluster).await;
    a_denial_by_one_limit_leaves_the_others_untouched(&store).await;

    // The policy's state is one key (issue 22: a migration cannot split it), on the node
    // that owns its slot.
    let keys = store.keys(&policy(), "user-7").expect("valid key");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let node = &cluster.nodes()[0];
    let slots: Vec<String> = keys
        .iter()
        .map(|k| node.command(&["CLUSTER", "KEYSLOT", k]).expect("KEYSLOT"))
        .collect();
    assert!(
        slots.iter().all(|s| s == &slots[0]),
        "{keys:?} in slots {slots:?}"
    );
    let holders: Vec<usize> = cluster
        .nodes()
        .iter()
        .map(|n| {
            keys.iter()
                .filter(|k| n.command(&["EXISTS", k]).expect("EXISTS") == ":1\r\n")
                .count()
        })
        .collect();
    assert!(
        holders.contains(&keys.len()),
        "keys spread over nodes: {holders:?}"
    );

    // Another user key lands in another slot, and works all the same.
    for user in ["a", "b", "c", "d"] {
        assert!(
            store
                .acquire(None, &policy(), user.as_ref(), 1)
                .await
                .expect("decision")
                .is_allowed()
        );
    }
}
