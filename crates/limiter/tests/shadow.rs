//! Shadow mode in `ResilientLimiter` itself: a policy tried on live traffic admits what it
//! would deny, counts it, takes nothing for it, and is turned off and on without a rebuild.

use rein::{FailurePolicy, PolicyTable, RequestError, ResilienceConfigError, ResilientLimiter};
use rein_core::{Limit, Micros, NamedPolicy, Policy};
use rein_memory::MemoryStore;

fn window(name: &str, limit: u64) -> NamedPolicy {
    let limit = Limit::fixed_window(limit, Micros::from_secs(3_600)).expect("valid");
    NamedPolicy::new(name, Policy::single(limit)).expect("valid name")
}

#[tokio::test]
async fn a_policy_in_shadow_mode_admits_what_it_would_deny_and_counts_it() {
    let table = PolicyTable::new(window("api", 100))
        .with_policy(window("trial", 2))
        .expect("unique")
        .route_prefix("t:", "trial")
        .expect("known");
    let limiter = ResilientLimiter::builder(MemoryStore::new(), table, FailurePolicy::FailClosed)
        .shadow("trial")
        .build()
        .expect("valid");

    for i in 0..5 {
        let decided = limiter.acquire("t:alice", 1).await.expect("valid");
        assert!(decided.is_allowed(), "request {i}");
        if i >= 2 {
            assert_eq!(decided.decision.remaining, 0, "the denial's figures");
            assert_eq!(decided.decision.retry_after, Micros::ZERO);
        }
    }
    assert_eq!(limiter.shadow_denials("trial").expect("known"), 3);
    assert_eq!(limiter.shadow_denials("api").expect("known"), 0);
    // Counted as the denials they were, and nothing taken for them.
    assert_eq!(limiter.stats().denied, 3);
    let peek = limiter.peek("t:alice", 0).await.expect("valid");
    assert_eq!(peek.decision.remaining, 0);

    // Off: the policy denies; on again: it admits. No rebuild, every clone at once.
    let clone = limiter.clone();
    assert!(limiter.set_shadow("trial", false).expect("known"));
    assert!(
        !clone
            .acquire("t:alice", 1)
            .await
            .expect("valid")
            .is_allowed()
    );
    assert!(!limiter.set_shadow("trial", true).expect("known"));
    assert!(
        clone
            .acquire("t:alice", 1)
            .await
            .expect("valid")
            .is_allowed()
    );
    assert_eq!(limiter.shadow_denials("trial").expect("known"), 4);

    assert!(matches!(
        limiter.set_shadow("nope", true),
        Err(RequestError::UnknownPolicy(_))
    ));
    let unknown = ResilientLimiter::builder(
        MemoryStore::new(),
        PolicyTable::new(window("api", 1)),
        FailurePolicy::FailClosed,
    )
    .shadow("nope")
    .build();
    assert!(matches!(
        unknown,
        Err(ResilienceConfigError::UnknownPolicy(_))
    ));
}
