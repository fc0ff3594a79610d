//! A policy of several limits is decided in one call, all-or-nothing, on a standalone
//! server and on a Redis Cluster, where all its keys share one hash slot; and on the
//! Cluster, the operations a lease runs (held units, rate shares) answer as rein-core does.

mod common;

use redis::aio::ConnectionLike;
use rein_core::rate_share::{RateAnswer, RateOp, RateShares, RateState, ReturnRequest, Taken};
use rein_core::{Leasable, Limit, LimitState, Micros, Policy, PolicyState, Timestamp};
use rein_redis::{RedisPolicy, RedisStore};
use rein_redis_harness::{RedisCluster, RedisServer};

/// Takes 2, then 1 (the window is now full), then asks for 1 more: the window denies, and
/// no limit's state changes.
async fn a_denial_by_one_limit_leaves_the_others_untouched<C>(store: &RedisStore<C>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let policy = common::mixed_policy("all-or-nothing");
    let key = "user-7";
    assert!(common::admits(store, &policy, key.as_ref(), 2).await);
    assert!(common::admits(store, &policy, key.as_ref(), 1).await);
    let before = store.state(&policy, key).await.expect("state");
    common::the_window_denies(store, &policy, key.as_ref()).await;
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
    let keys = store
        .keys(&common::mixed_policy("all-or-nothing"), "user-7")
        .expect("valid key");
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
            common::admits(
                &store,
                &common::mixed_policy("all-or-nothing"),
                user.as_ref(),
                1
            )
            .await
        );
    }
}

/// The lease operations on a Cluster: a held acquire of a policy of several limits, its
/// return from the stamp, and a token bucket's rate shares (take, a direct decision,
/// return) each answer as rein-core does and leave its state, on keys in several slots.
#[tokio::test]
async fn cluster_leases_held_units_and_rate_shares_as_the_core_does() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    let store = common::cluster_store(&cluster).await;
    let named = common::mixed_policy("leased");
    let policy = named.policy().clone();
    let t = |s: u64| Timestamp::from_micros(1_900_000_000_000_000 + s * 1_000_000);
    let hold = Micros::from_secs(2);
    for user in ["a", "b", "c", "d"] {
        let mut core = policy.new_state();
        let expected = policy
            .acquire_held(t(0), &mut core, 2, hold)
            .expect("shape");
        let held = Leasable::acquire_held(&store, Some(t(0)), &named, user.as_ref(), 2, hold)
            .await
            .expect("held acquire");
        assert_eq!((held.decision, held.stamp), (expected, t(2)), "{user}");
        policy
            .refund_held(t(1), &mut core, 1, held.stamp)
            .expect("shape");
        Leasable::refund_held(&store, Some(t(1)), &named, user.as_ref(), 1, held.stamp)
            .await
            .expect("held refund");
        assert_eq!(
            store.state(&named, user).await.expect("state"),
            core,
            "{user}"
        );
    }

    let bucket = Limit::token_bucket(100, 10, Micros::from_secs(1)).expect("valid bucket");
    let Limit::TokenBucket(tb) = bucket else {
        unreachable!("a token bucket")
    };
    let shares = RateShares::new(&tb).expect("shareable");
    let named = RedisPolicy::new("shared", Policy::single(bucket)).expect("valid name");
    for user in ["a", "b", "c", "d"] {
        let mut core = RateState::default();
        let take = common::first_take(5, Micros::from_secs(1));
        let mut ops = vec![(t(0), take), (t(1), RateOp::Direct(3))];
        let expected = shares.apply(t(0), &mut core.clone(), take).expect("a take");
        let RateAnswer::Taken(Taken::Granted(grant)) = expected else {
            panic!("the core grants the first take: {expected:?}")
        };
        let give_back = ReturnRequest {
            node: 1,
            id: grant.id,
            seq: 2,
            units: 1,
        };
        ops.push((t(1), RateOp::Return(give_back)));
        for (at, op) in ops {
            let expected = shares.apply(at, &mut core, op);
            let answer = store.share_rate(Some(at), &named, user.as_ref(), op).await;
            match (expected, answer) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{user} {op:?}"),
                (a, b) => panic!("{user} {op:?}: core {a:?}, the Cluster {b:?}"),
            }
        }
        let stored = store.rate_state(&named, user).await.expect("shares");
        assert_eq!(stored.unwrap_or_default(), core, "{user}");
    }
}
