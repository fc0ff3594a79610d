//! [`ConfiguredStore`](rein_tower::ConfiguredStore) over a real private `redis-server`: the
//! store a config file names runs every operation, the rate shares of a token bucket (what
//! a `rein::lease::LeasedLimiter` leases it by) among them, also through the resilient
//! limiter a config file builds over it.

use rein_core::{
    Leasable, Limiter,
    rate_share::{RateAnswer, RateOp},
};
use rein_redis_harness::RedisServer;
use rein_tower::Config;

#[tokio::test]
async fn a_configured_store_answers_rate_shares_also_through_the_resilient_limiter() {
    let redis = RedisServer::start().expect("start redis-server");
    let config: Config = format!(
        r#"
[redis]
url = "{}"

[failure]
policy = "fail_closed"

[policies.bucket]
limits = [{{ algorithm = "token_bucket", capacity = 2, refill = 1, period = "1h" }}]

[http]
default_policy = "bucket"
"#,
        redis.url()
    )
    .parse()
    .expect("a valid config");
    let named = config.policies[0].clone();
    let store = config.connect_store().await.expect("connect");

    let policy = store.prepare(&named).expect("prepare");
    let answer = store
        .share_rate(None, &policy, b"direct", RateOp::Direct(1))
        .await;
    assert!(
        matches!(answer, Ok(RateAnswer::Decided(d)) if d.is_allowed() && d.remaining == 1),
        "{answer:?}"
    );

    // Fail closed: an admission can only be the store's answer.
    let resilient = config.resilient(store).expect("limiter");
    let policy = resilient.prepare(&named).expect("prepare");
    for remaining in [1, 0] {
        let answer = resilient
            .share_rate(None, &policy, b"resilient", RateOp::Direct(1))
            .await;
        assert!(
            matches!(answer, Ok(RateAnswer::Decided(d)) if d.is_allowed() && d.remaining == remaining),
            "{answer:?}"
        );
    }
    let stats = resilient.stats();
    assert_eq!(stats.store_errors, 0, "{stats:?}");
}
