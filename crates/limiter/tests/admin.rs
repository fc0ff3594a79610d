//! An operator's changes to one key through `ResilientLimiter` (its `KeyAdmin`), over a
//! real, private `redis-server`: each reaches Redis, this process's caches never hide one,
//! and a store that is away is a clear error, not a failure policy's answer.

use std::time::Duration;

use rein::{FailurePolicy, PolicyTable, ResilientLimiter, Source};
use rein_core::admin::{AdminError, KeyAdmin, KeyState, Until};
use rein_core::{Decision, Limit, Limiter, Micros, NamedPolicy, Policy};
use rein_redis::RedisStoreBuilder;
use rein_redis_harness::RedisServer;

fn login() -> NamedPolicy {
    let limit = Limit::fixed_window(1, Micros::from_secs(3_600)).expect("valid");
    NamedPolicy::new("login", Policy::single(limit)).expect("valid name")
}

#[tokio::test]
async fn changes_reach_redis_and_no_cached_denial_hides_them() {
    let mut server = RedisServer::start().expect("start redis-server");
    let store = RedisStoreBuilder::new()
        .deadline(Duration::from_secs(1))
        .connect(&server.url())
        .await
        .expect("connect");
    let limiter =
        ResilientLimiter::builder(store, PolicyTable::new(login()), FailurePolicy::FailClosed)
            .build()
            .expect("valid");
    let policy = limiter.prepare(&login()).expect("in the table");

    assert!(
        limiter
            .acquire("alice", 1)
            .await
            .expect("valid")
            .is_allowed()
    );
    assert!(
        !limiter
            .acquire("alice", 1)
            .await
            .expect("valid")
            .is_allowed()
    );
    let cached = limiter.acquire("alice", 1).await.expect("valid");
    assert_eq!(cached.source, Source::DenyCache, "the denial is cached");
    // A reset through the limiter forgets the cached denial: the next request asks Redis.
    assert!(limiter.reset(&policy, b"alice").await.expect("reset"));
    let after = limiter.acquire("alice", 1).await.expect("valid");
    assert_eq!((after.is_allowed(), after.source), (true, Source::Store));

    // Set, then a penalty, then a block, each as Redis holds it.
    assert_eq!(left(limiter.set_remaining(&policy, b"bob", 1).await), 1);
    assert_eq!(left(limiter.penalize(&policy, b"bob", 5).await), 0);
    assert!(!limiter.acquire("bob", 1).await.expect("valid").is_allowed());
    let until = Until::For(Micros::from_secs(60));
    assert!(
        limiter
            .block(&policy, b"carol", until, "ticket 3")
            .await
            .expect("block")
    );
    let denied = limiter.acquire("carol", 1).await.expect("valid");
    assert_eq!((denied.is_allowed(), denied.source), (false, Source::Store));
    assert!(denied.decision.retry_after > Micros::from_secs(55));
    match limiter.inspect(&policy, b"carol").await.expect("inspect") {
        KeyState::Blocked { reason, .. } => assert_eq!(reason, "ticket 3"),
        other => panic!("{other:?}"),
    }
    // The block's denial was cached; the unblock forgets it.
    assert!(limiter.unblock(&policy, b"carol").await.expect("unblock"));
    assert!(
        limiter
            .acquire("carol", 1)
            .await
            .expect("valid")
            .is_allowed()
    );
    assert!(matches!(
        limiter.penalize(&policy, b"", 1).await,
        Err(AdminError::InvalidKey(_))
    ));

    // Redis away: an error, never a failure policy's answer, and bounded by the deadline.
    server.kill().expect("kill redis-server");
    let started = std::time::Instant::now();
    let away = limiter.block(&policy, b"dave", until, "").await;
    assert!(matches!(away, Err(AdminError::Unavailable(_))), "{away:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// What an operator's change left the key, or the test fails.
fn left(change: Result<Decision, AdminError>) -> u64 {
    change.expect("a change").remaining
}
