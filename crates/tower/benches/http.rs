//! What the layer adds to one request: the same axum route, called in process through
//! tower's `oneshot` (no socket, so the figures are the layer's own cost), with
//!
//! - `bare`: no rate limiting;
//! - `rein_memory`: rein-tower over a `rein_memory::MemoryStore`;
//! - `rein_memory_no_headers`: the same without `RateLimit` on admitted responses;
//! - `rein_redis`: rein-tower over a `rein_redis::RedisStore` and a private local
//!   `redis-server` (one script call per request: mostly the loopback round trip);
//! - `tower_governor`: tower-governor 0.8 with the same quota, keyed by the peer IP.
//!
//! Two paths: `allowed` (a quota no request exhausts) and `denied` (a quota spent before
//! measuring). One hot key, the peer `127.0.0.1`, as `ConnectInfo<SocketAddr>`.
//!
//! ```text
//! cargo bench -p rein-tower --bench http
//! ```
//! Figures and the machine: docs/http.md.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http::Request;
use rein_core::{Limit, Micros, NamedPolicy, Policy};
use rein_memory::MemoryStore;
use rein_redis::RedisStoreBuilder;
use rein_redis_harness::RedisServer;
use rein_tower::{AdmittedHeaders, RateLimitLayer, Route};
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

fn added_latency(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let redis = RedisServer::start().expect("start redis-server");
    let mut group = c.benchmark_group("http_added_latency");
    group
        .throughput(Throughput::Elements(1))
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    for path in [Path::Allowed, Path::Denied] {
        let policy = path.policy();
        let routers = [
            ("bare", bare()),
            (
                "rein_memory",
                bare().layer(
                    RateLimitLayer::builder(MemoryStore::new())
                        .policy(policy.clone())
                        .route(Route::any().policy("api"))
                        .build()
                        .expect("layer"),
                ),
            ),
            (
                "rein_memory_no_headers",
                bare().layer(
                    RateLimitLayer::builder(MemoryStore::new())
                        .policy(policy.clone())
                        .route(Route::any().policy("api"))
                        .admitted_headers(AdmittedHeaders::None)
                        .build()
                        .expect("layer"),
                ),
            ),
            (
                "rein_redis",
                bare().layer(runtime.block_on(async {
                    let store = RedisStoreBuilder::new()
                        .prefix(format!("bench-{}", path.name()))
                        .connect(&redis.url())
                        .await
                        .expect("connect");
                    RateLimitLayer::builder(store)
                        .policy(policy.clone())
                        .route(Route::any().policy("api"))
                        .build()
                        .expect("layer")
                })),
            ),
            ("tower_governor", bare().layer(path.governor())),
        ];
        for (name, router) in routers {
            if path == Path::Denied && matches!(name, "bare" | "rein_memory_no_headers") {
                continue;
            }
            // Spend the quota of the denied path before measuring.
            runtime.block_on(async {
                for _ in 0..2 {
                    let _ = router.clone().oneshot(request()).await;
                }
            });
            group.bench_function(BenchmarkId::new(path.name(), name), |b| {
                b.to_async(&runtime).iter(|| {
                    let router = router.clone();
                    async move {
                        let response = router.oneshot(request()).await.expect("infallible");
                        assert_eq!(response.status().as_u16(), path.status(), "{name}");
                        response
                    }
                });
            });
        }
    }
    group.finish();
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Allowed,
    Denied,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Allowed => "allowed",
            Path::Denied => "denied",
        }
    }

    fn status(self) -> u16 {
        match self {
            Path::Allowed => 200,
            Path::Denied => 429,
        }
    }

    /// Allowed: bursts of 10^9 refilled at 10^9 a second. Denied: 1, then one an hour.
    fn policy(self) -> NamedPolicy {
        let limit = match self {
            Path::Allowed => {
                Limit::token_bucket(1_000_000_000, 1_000_000_000, Micros::from_secs(1))
            }
            Path::Denied => Limit::token_bucket(1, 1, Micros::from_secs(3_600)),
        };
        NamedPolicy::new("api", Policy::single(limit.expect("valid"))).expect("valid name")
    }

    /// The same quotas for tower-governor.
    fn governor(
        self,
    ) -> GovernorLayer<
        tower_governor::key_extractor::PeerIpKeyExtractor,
        governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
        Body,
    > {
        let mut builder = GovernorConfigBuilder::default();
        match self {
            Path::Allowed => builder.per_nanosecond(1).burst_size(1_000_000_000),
            Path::Denied => builder.per_second(3_600).burst_size(1),
        };
        GovernorLayer::new(Arc::new(builder.finish().expect("valid quota")))
    }
}

fn bare() -> Router {
    Router::new().route("/api", get(|| async { "ok" }))
}

fn request() -> Request<Body> {
    let peer = SocketAddr::from(([127, 0, 0, 1], 40_000));
    let mut request = Request::get("/api").body(Body::empty()).expect("request");
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

criterion_group!(benches, added_latency);
criterion_main!(benches);
