//! An operator's changes to one key (penalize, set remaining, block, unblock) on a real
//! redis-server and a Redis Cluster: exact (the figures rein-core computes), atomic
//! against concurrent decisions (no decision lost, none counted twice), and seen by every
//! script and by the optimistic store.

mod common;

use std::time::Duration;

use redis::aio::ConnectionLike;
use rein_core::admin::MAX_REASON_LEN;
use rein_core::admin::{AdminError, KeyAdmin, KeyState, Until};
use rein_core::{Limit, Limiter, Micros, Policy};
use rein_redis::{OptimisticStore, RedisPolicy, RedisStore, StateError};
use rein_redis_harness::{RedisCluster, RedisServer};

/// A policy of one limit of each kind whose figures do not move within a test: an hour's
/// window, a token per hour.
fn policies() -> Vec<RedisPolicy> {
    let hour = Micros::from_secs(3600);
    let lone = |name: &str, limit: Limit| {
        RedisPolicy::new(name, Policy::single(limit)).expect("valid name")
    };
    vec![
        lone("tb", Limit::token_bucket(10, 1, hour).expect("valid")),
        lone("fw", Limit::fixed_window(10, hour).expect("valid")),
        lone("sl", Limit::sliding_log(10, hour).expect("valid")),
        lone("sc", Limit::sliding_counter(10, hour).expect("valid")),
        RedisPolicy::new(
            "multi",
            Policy::new([
                Limit::fixed_window(10, hour).expect("valid"),
                Limit::token_bucket(20, 1, hour).expect("valid"),
            ])
            .expect("valid"),
        )
        .expect("valid name"),
    ]
}

async fn remaining<C>(store: &RedisStore<C>, policy: &RedisPolicy, key: &str) -> u64
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    store
        .peek(None, policy, key.as_bytes(), 0)
        .await
        .expect("peek")
        .remaining
}

/// Penalties, set remaining, blocks and unblocks, as a user sees them through decisions.
async fn every_change_as_decisions_see_it<C>(store: &RedisStore<C>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    for policy in policies() {
        let name = policy.name().to_owned();
        let key = "user-42";
        // Whether there was something to block, or to unblock.
        let block = async |span: Micros, reason: &'static str| {
            store
                .block(&policy, key.as_bytes(), Until::For(span), reason)
                .await
                .expect("block")
        };
        let unblock = async || {
            store
                .unblock(&policy, key.as_bytes())
                .await
                .expect("unblock")
        };
        store
            .acquire(None, &policy, key.as_bytes(), 3)
            .await
            .expect("acquire");
        // 7 left: a penalty of 5 leaves 2, another leaves none (never past empty).
        let after = store
            .penalize(&policy, key.as_bytes(), 5)
            .await
            .expect("penalize");
        assert_eq!(after.remaining, 2, "{name}");
        assert_eq!(remaining(store, &policy, key).await, 2, "{name}");
        let after = store
            .penalize(&policy, key.as_bytes(), 5)
            .await
            .expect("penalize");
        assert_eq!(after.remaining, 0, "{name}");
        assert!(
            !common::admits(store, &policy, key.as_bytes(), 1).await,
            "{name}"
        );

        // Set to 7: every limit has 7 (the token bucket of 20 too).
        let set = store
            .set_remaining(&policy, key.as_bytes(), 7)
            .await
            .expect("set");
        assert_eq!(set.remaining, 7, "{name}");
        let KeyState::Counting(state) = store
            .inspect(&policy, key.as_bytes())
            .await
            .expect("inspect")
        else {
            panic!("{name}: not counting");
        };
        for (limit, part) in policy.policy().limits().iter().zip(state.iter()) {
            let now = rein_core::Timestamp::from_micros(wall_clock());
            let left = limit.peek(now, part, 0).expect("its state").remaining;
            assert_eq!(left, 7, "{name}: {limit:?}");
        }
        // Set above every capacity: full, and the key is gone.
        assert_eq!(
            store
                .set_remaining(&policy, key.as_bytes(), 1_000)
                .await
                .expect("set")
                .remaining,
            10
        );
        // Every limit full again: a full state is written as no key at all (or as empty
        // parts), which reads back as the policy's new state.
        let full = store.state(&policy, key).await.expect("state");
        assert_eq!(full, policy.policy().new_state(), "{name}");

        // A block denies every decision, whatever is left, with the time to its end.
        assert!(block(Micros::from_secs(60), "ticket 7: abuse").await);
        for cost in [0, 1] {
            let denied = store
                .acquire(None, &policy, key.as_bytes(), cost)
                .await
                .expect("acquire");
            assert!(!denied.is_allowed(), "{name}: cost {cost}");
            assert_eq!(denied.remaining, 0);
            let wait = denied.retry_after.as_micros();
            assert!((55_000_000..=60_000_000).contains(&wait), "{name}: {wait}");
            assert_eq!(denied.reset_after, denied.retry_after);
        }
        // A penalty on a blocked key answers the block and leaves it.
        assert!(
            !store
                .penalize(&policy, key.as_bytes(), 1)
                .await
                .expect("penalize")
                .is_allowed()
        );
        match store
            .inspect(&policy, key.as_bytes())
            .await
            .expect("inspect")
        {
            KeyState::Blocked { reason, .. } => assert_eq!(reason, "ticket 7: abuse"),
            other => panic!("{name}: {other:?}"),
        }
        assert!(matches!(
            store.state(&policy, key).await,
            Err(StateError::Blocked(_))
        ));
        // Unblocked, the key is new; a second unblock finds nothing.
        assert!(unblock().await);
        assert!(!unblock().await);
        assert_eq!(remaining(store, &policy, key).await, 10, "{name}");

        // A short block ends by itself: the key then decides as one never seen, and its
        // first admission replaces the block.
        assert!(block(Micros::from_millis(30), "").await);
        assert!(!common::admits(store, &policy, key.as_bytes(), 1).await);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let d = store
            .acquire(None, &policy, key.as_bytes(), 1)
            .await
            .expect("acquire");
        assert!(d.is_allowed(), "{name}");
        assert_eq!(d.remaining, 9, "{name}");
        // A block for no time blocks nothing.
        assert!(!block(Micros::ZERO, "").await);
        assert_eq!(remaining(store, &policy, key).await, 9, "{name}");
    }
}

fn wall_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

#[tokio::test]
async fn standalone_changes_are_exact_and_every_script_sees_a_block() {
    let server = RedisServer::start().expect("start redis-server");
    every_change_as_decisions_see_it(&common::store(&server).await).await;
}

#[tokio::test]
async fn cluster_changes_are_exact_and_every_script_sees_a_block() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    let store = common::cluster_store(&cluster).await;
    every_change_as_decisions_see_it(&store).await;
}

/// Penalties race admissions on one key: each is a compare-and-set, so neither overwrites
/// the other. 400 admissions and 8 penalties of 1 on a window of 1000: the window counts
/// exactly what was admitted plus 8. A read-modify-write that lost a race would count less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_racing_admissions_lose_none_of_either() {
    let server = RedisServer::start().expect("start redis-server");
    let store = common::store(&server).await;
    let policy = RedisPolicy::new(
        "race",
        Policy::single(Limit::fixed_window(1_000, Micros::from_secs(3600)).expect("valid")),
    )
    .expect("valid name");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..408 {
        let (store, policy) = (store.clone(), policy.clone());
        tasks.spawn(async move {
            if i % 51 == 0 {
                store.penalize(&policy, b"k", 1).await.map(|_| 0)
            } else {
                let d = store
                    .acquire(None, &policy, b"k", 1)
                    .await
                    .expect("acquire");
                Ok(u64::from(d.is_allowed()))
            }
        });
    }
    let mut admitted = 0;
    while let Some(done) = tasks.join_next().await {
        admitted += done.expect("task").expect("penalize");
    }
    assert_eq!(admitted, 400);
    assert_eq!(remaining(&store, &policy, "k").await, 1_000 - 400 - 8);
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_changes_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let store = common::store(&server).await;
    let policy = &policies()[1];
    let long = "x".repeat(MAX_REASON_LEN + 1);
    for reason in [long.as_str(), "two\nlines"] {
        let e = store
            .block(policy, b"k", Until::For(Micros::from_secs(1)), reason)
            .await;
        common::assert_matches!(e, Err(AdminError::InvalidReason(_)));
    }
    assert!(matches!(
        store.penalize(policy, b"", 1).await,
        Err(AdminError::InvalidKey(_))
    ));
    assert_eq!(remaining(&store, policy, "k").await, 10);
    // A value under the policy's key that is no state and no block: an error, not a reset.
    let key = store.keys(policy, "k").expect("keys").remove(0);
    let mut raw = common::raw(&server).await;
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("Bnot-a-block")
        .query_async(&mut raw)
        .await
        .expect("SET");
    let e = store.set_remaining(policy, b"k", 1).await;
    common::assert_matches!(e, Err(AdminError::Unavailable(_)));
    let kept: String = common::query(&mut raw, &["GET", &key]).await;
    assert_eq!(kept, "Bnot-a-block");
}

/// The optimistic store decides on the same keys: it sees a block as the scripts do.
#[tokio::test]
async fn the_optimistic_store_sees_a_block() {
    let server = RedisServer::start().expect("start redis-server");
    let store = common::store(&server).await;
    let optimistic = OptimisticStore::connect(&server.url())
        .await
        .expect("connect");
    for policy in policies() {
        assert!(
            store
                .block(&policy, b"k", Until::For(Micros::from_secs(60)), "r")
                .await
                .expect("block")
        );
        let denied = optimistic
            .acquire(None, &policy, b"k", 1)
            .await
            .expect("acquire");
        assert!(!denied.is_allowed(), "{}", policy.name());
        assert!(denied.retry_after > Micros::from_secs(55));
        assert!(store.unblock(&policy, b"k").await.expect("unblock"));
        assert!(common::admits(&optimistic, &policy, b"k", 1).await);
    }
}
