//! The layer's request path over an in-process `MemoryStore`, called as a tower service (no
//! socket): routes, keys, costs, peeks, answers and headers. The same layer over Redis, on
//! real sockets, is `tests/http.rs`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::{HeaderName, Method, Request, StatusCode};
use metrics::{SharedString, Unit};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use rein_core::{Limit, Limiter, Micros, NamedPolicy, Policy};
use rein_memory::MemoryStore;
use rein_redis_harness::{Fault, Faulty};
use rein_tower::{
    AdmittedHeaders, Answer, KeySource, LayerError, PeerAddr, RateLimitLayer,
    RateLimitLayerBuilder, Route,
};
use tower::ServiceExt;

fn window(name: &str, limit: u64) -> NamedPolicy {
    let limit = Limit::fixed_window(limit, Micros::from_secs(3_600)).expect("valid");
    NamedPolicy::new(name, Policy::single(limit)).expect("valid name")
}

fn builder() -> RateLimitLayerBuilder<MemoryStore> {
    RateLimitLayer::builder(MemoryStore::new())
}

fn app<L: rein_core::Limiter + 'static>(layer: RateLimitLayer<L>) -> Router {
    Router::new()
        .route("/api/{*rest}", get(|| async { "api" }))
        .route("/login", post(|| async { "welcome" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer)
}

struct Answered {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

async fn call(app: &Router, method: Method, path: &str, peer: Option<&str>) -> Answered {
    call_with(app, method, path, peer, &[]).await
}

/// The status of a request from [`PEER`].
async fn status(app: &Router, method: Method, path: &str) -> StatusCode {
    call(app, method, path, PEER).await.status
}

async fn call_with(
    app: &Router,
    method: Method,
    path: &str,
    peer: Option<&str>,
    headers: &[(&str, &str)],
) -> Answered {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(peer) = peer {
        let addr: SocketAddr = peer.parse().expect("addr");
        request = request.extension(PeerAddr(addr));
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).expect("request"))
        .await
        .expect("infallible");
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 16).await.expect("body");
    Answered {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

const PEER: Option<&str> = Some("192.0.2.7:40000");

#[tokio::test]
async fn a_denial_is_a_429_with_retry_after_and_both_ietf_headers() {
    let layer = builder()
        .policy(window("api", 2))
        .route(Route::prefix("/api").policy("api"))
        .build()
        .expect("layer");
    let app = app(layer);
    for remaining in [1, 0] {
        let ok = call(&app, Method::GET, "/api/x", PEER).await;
        assert_eq!(ok.status, StatusCode::OK);
        let rate_limit = ok.headers["ratelimit"].to_str().unwrap();
        assert!(
            rate_limit.starts_with(&format!("\"api\";r={remaining};t=")),
            "{rate_limit}"
        );
        assert!(
            !ok.headers.contains_key("ratelimit-policy"),
            "not by default"
        );
    }
    let denied = call(&app, Method::GET, "/api/x", PEER).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = denied.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3_600).contains(&retry_after), "{retry_after}");
    assert_eq!(denied.headers["ratelimit-policy"], r#""api";q=2;w=3600"#);
    assert_eq!(
        denied.headers["ratelimit"].to_str().unwrap(),
        format!("\"api\";r=0;t={retry_after}")
    );
    assert!(denied.body.contains("retry in"), "{}", denied.body);
    // Another client has its own limit.
    let other = call(&app, Method::GET, "/api/x", Some("192.0.2.8:1")).await;
    assert_eq!(other.status, StatusCode::OK);
}

#[tokio::test]
async fn a_request_without_a_key_gets_the_configured_answer_never_a_shared_bucket() {
    let layer = builder()
        .policy(window("api", 1))
        .route(Route::prefix("/api").policy("api"))
        .build()
        .expect("layer");
    let app = app(layer);
    for _ in 0..3 {
        let answered = call(&app, Method::GET, "/api/x", None).await;
        assert_eq!(answered.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            answered.body.contains("no rate-limit key"),
            "{}",
            answered.body
        );
    }
    // Keyed clients are unaffected by those.
    assert_eq!(status(&app, Method::GET, "/api/x").await, StatusCode::OK);

    let passing = builder()
        .policy(window("api", 1))
        .route(Route::prefix("/api").policy("api"))
        .on_missing_key(Answer::Pass)
        .build()
        .expect("layer");
    let app = self::app(passing);
    for _ in 0..3 {
        assert_eq!(
            call(&app, Method::GET, "/api/x", None).await.status,
            StatusCode::OK
        );
    }
}

#[tokio::test]
async fn the_first_matching_route_decides_and_unmatched_requests_pass() {
    let layer = builder()
        .policy(window("login", 1))
        .policy(window("api", 1))
        .route(Route::exact("/login").method(Method::POST).policy("login"))
        .route(Route::prefix("/health").exempt())
        .route(Route::prefix("/api").policy("api"))
        .build()
        .expect("layer");
    let app = app(layer);
    for _ in 0..3 {
        assert_eq!(status(&app, Method::GET, "/health").await, StatusCode::OK);
    }
    assert_eq!(status(&app, Method::POST, "/login").await, StatusCode::OK);
    assert_eq!(
        status(&app, Method::POST, "/login").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The login policy is spent; the api policy is another limit.
    assert_eq!(status(&app, Method::GET, "/api/a").await, StatusCode::OK);
    // A path no route matches is not limited.
    for _ in 0..3 {
        let other = call(&app, Method::GET, "/elsewhere", PEER).await;
        assert_eq!(other.status, StatusCode::NOT_FOUND);
        assert!(!other.headers.contains_key("ratelimit"));
    }
}

#[tokio::test]
async fn peek_only_routes_stop_when_spent_but_take_nothing() {
    let layer = builder()
        .policy(window("api", 2))
        .route(Route::exact("/api/quota").policy("api").peek_only())
        .route(Route::prefix("/api").policy("api"))
        .build()
        .expect("layer");
    let app = app(layer);
    // A quota check shows what is left now, not what its own admission would leave (before,
    // `r=1` of a fresh 2: the figures of a take that never happened).
    for _ in 0..5 {
        let quota = call(&app, Method::GET, "/api/quota", PEER).await;
        assert_eq!(quota.status, StatusCode::OK);
        assert!(quota.headers["ratelimit"].to_str().unwrap().contains("r=2"));
    }
    assert_eq!(status(&app, Method::GET, "/api/x").await, StatusCode::OK);
    let quota = call(&app, Method::GET, "/api/quota", PEER).await;
    assert!(quota.headers["ratelimit"].to_str().unwrap().contains("r=1"));
    assert_eq!(status(&app, Method::GET, "/api/x").await, StatusCode::OK);
    assert_eq!(
        status(&app, Method::GET, "/api/quota").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn costs_come_from_the_request_and_one_above_capacity_is_413() {
    let layer = builder()
        .policy(window("api", 10))
        .route(Route::prefix("/api").policy("api").cost_fn(|parts| {
            parts
                .uri
                .query()
                .and_then(|q| q.strip_prefix("n="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(1)
        }))
        .build()
        .expect("layer");
    let app = app(layer);
    let seven = call(&app, Method::GET, "/api/x?n=7", PEER).await;
    assert_eq!(seven.status, StatusCode::OK);
    assert!(
        seven.headers["ratelimit"]
            .to_str()
            .unwrap()
            .contains("r=3;")
    );
    assert_eq!(
        status(&app, Method::GET, "/api/x?n=4").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&app, Method::GET, "/api/x?n=11").await,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(
        status(&app, Method::GET, "/api/x?n=3").await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn route_keys_override_the_default_key() {
    let api_key = HeaderName::from_static("x-api-key");
    let layer = builder()
        .policy(window("api", 1))
        .route(
            Route::prefix("/api")
                .policy("api")
                .key(KeySource::header(api_key)),
        )
        .admitted_headers(AdmittedHeaders::All)
        .build()
        .expect("layer");
    let app = app(layer);
    // Same peer, two API keys: two limits.
    for key in ["k1", "k2"] {
        let ok = call_with(&app, Method::GET, "/api/x", PEER, &[("x-api-key", key)]).await;
        assert_eq!(ok.status, StatusCode::OK, "{key}");
        assert_eq!(ok.headers["ratelimit-policy"], r#""api";q=1;w=3600"#);
    }
    let again = call_with(&app, Method::GET, "/api/x", PEER, &[("x-api-key", "k1")]).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    // The peer alone is not this route's key.
    assert_eq!(
        status(&app, Method::GET, "/api/x").await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[tokio::test]
async fn a_multi_limit_policy_names_the_limit_that_spoke() {
    let policy = NamedPolicy::new(
        "login",
        Policy::new([
            Limit::fixed_window(3, Micros::from_secs(60)).expect("valid"),
            Limit::fixed_window(2, Micros::from_secs(3_600)).expect("valid"),
        ])
        .expect("valid"),
    )
    .expect("valid name");
    let layer = builder()
        .policy(policy)
        .route(Route::exact("/login").policy("login"))
        .build()
        .expect("layer");
    let app = app(layer);
    call(&app, Method::POST, "/login", PEER).await;
    call(&app, Method::POST, "/login", PEER).await;
    let denied = call(&app, Method::POST, "/login", PEER).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.headers["ratelimit-policy"],
        r#""login.0";q=3;w=60, "login.1";q=2;w=3600"#
    );
    // The hourly limit (2) denied; the minute's (3) has one left before this request, none
    // after it, as many as the hourly: a tie, which names the limit that denied.
    let rate_limit = denied.headers["ratelimit"].to_str().unwrap();
    assert!(rate_limit.starts_with(r#""login.1";r=0;"#), "{rate_limit}");
}

#[test]
fn building_refuses_unknown_and_duplicate_policies_and_mixed_key_sources() {
    let unknown = builder()
        .policy(window("api", 1))
        .route(Route::any().policy("apj"))
        .build();
    assert_eq!(
        unknown.err(),
        Some(LayerError::UnknownPolicy {
            route: "*".into(),
            policy: "apj".into()
        })
    );
    let duplicate = builder()
        .policy(window("api", 1))
        .policy(window("api", 2))
        .build();
    assert_eq!(
        duplicate.err(),
        Some(LayerError::DuplicatePolicy("api".into()))
    );
    // One policy counted by a header's value and by the peer address: a client could send
    // another's address as its header. Sources a client does not choose (addresses, fixed
    // keys) may share one; so may routes of one header.
    let api_key = || KeySource::header(HeaderName::from_static("x-api-key"));
    let mixed = builder()
        .policy(window("api", 1))
        .route(Route::prefix("/partner").policy("api").key(api_key()))
        .route(Route::any().policy("api"))
        .build();
    assert_eq!(
        mixed.err(),
        Some(LayerError::MixedKeySources {
            policy: "api".into(),
            first: "/partner*".into(),
            second: "*".into(),
        })
    );
    let forwarded_and_header = builder()
        .policy(window("api", 1))
        .route(
            Route::prefix("/a")
                .policy("api")
                .key(KeySource::x_forwarded_for(1)),
        )
        .route(Route::prefix("/b").policy("api").key(api_key()))
        .route(Route::prefix("/c").policy("api").key(api_key()))
        .route(Route::any().policy("other"))
        .policy(window("other", 1))
        .build();
    assert!(matches!(
        forwarded_and_header.err(),
        Some(LayerError::MixedKeySources { .. })
    ));
    let apart = builder()
        .policy(window("api", 1))
        .policy(window("partner", 1))
        .route(Route::prefix("/partner").policy("partner").key(api_key()))
        .route(Route::prefix("/b").policy("partner").key(api_key()))
        .route(
            Route::prefix("/fwd")
                .policy("api")
                .key(KeySource::x_forwarded_for(1)),
        )
        .route(
            Route::prefix("/g")
                .policy("api")
                .key(KeySource::fixed("global")),
        )
        .route(Route::any().policy("api"))
        .build();
    assert!(apart.is_ok(), "{:?}", apart.err());
}

#[tokio::test]
async fn the_layer_and_its_service_are_clone_and_share_one_limit() {
    let layer = builder()
        .policy(window("api", 1))
        .route(Route::any().policy("api"))
        .build()
        .expect("layer");
    // Two routers, as two connections or two route_layer uses would have: one limit.
    let first = app(layer.clone());
    let second = app(layer);
    assert_eq!(status(&first, Method::GET, "/api/x").await, StatusCode::OK);
    assert_eq!(
        status(&second, Method::GET, "/api/x").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_limiter_that_never_answers_gets_the_configured_answer_at_the_deadline() {
    let deadline = Duration::from_millis(50);
    for (answer, status) in [
        (
            Answer::Status(StatusCode::SERVICE_UNAVAILABLE),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (Answer::Pass, StatusCode::OK),
    ] {
        let layer = RateLimitLayer::builder(Faulty::new(MemoryStore::new(), Fault::Hang))
            .policy(window("api", 1))
            .route(Route::any().policy("api"))
            .on_unavailable(answer)
            .deadline(deadline)
            .build()
            .expect("layer");
        let app = Router::new()
            .route("/api/{*rest}", get(|| async { "api" }))
            .layer(layer);
        let started = Instant::now();
        let answered = call(&app, Method::GET, "/api/x", PEER).await;
        let elapsed = started.elapsed();
        assert_eq!(answered.status, status, "{answer:?}");
        // At the deadline: not before it, and not much after (tokio's 1 ms timer, a debug
        // build, a loaded machine).
        assert!(
            elapsed >= deadline && elapsed < deadline + Duration::from_millis(100),
            "{answer:?}: answered after {elapsed:?}"
        );
    }
}

/// The defect this pins: with the layer's deadline (15 ms) below the limiter's, a frozen
/// store made every request time out in the layer, forever: the limiter's call was dropped,
/// its breaker saw only abandoned calls, and its local fallback never answered.
#[tokio::test]
async fn a_layer_deadline_not_above_the_limiters_is_refused_and_the_default_lets_the_fallback_answer()
 {
    let policy = window("api", 1);
    let limiter = || {
        let table = rein::PolicyTable::new(policy.clone());
        let fallback = rein::FailurePolicy::LocalFallback {
            expected_nodes: std::num::NonZeroU32::MIN,
        };
        rein::ResilientLimiter::builder(
            Faulty::new(MemoryStore::new(), Fault::Hang),
            table,
            fallback,
        )
        .build()
        .expect("limiter")
    };
    let limiter_deadline = limiter().deadline().expect("the resilient limiter has one");
    for layer_deadline in [Duration::from_millis(15), limiter_deadline] {
        let refused = RateLimitLayer::builder(limiter())
            .policy(policy.clone())
            .route(Route::any().policy("api"))
            .deadline(layer_deadline)
            .build();
        assert!(
            matches!(
                refused,
                Err(LayerError::DeadlineNotAboveLimiter { layer, limiter })
                    if layer == layer_deadline && limiter == limiter_deadline
            ),
            "{layer_deadline:?}"
        );
    }
    // The default: the limiter's deadline plus a margin. The frozen store's calls time out in
    // the limiter, whose local fallback answers: 1 admitted, then 429, never 503.
    let layer = RateLimitLayer::builder(limiter())
        .policy(policy.clone())
        .route(Route::any().policy("api"))
        .build()
        .expect("layer");
    assert!(layer.deadline().expect("a deadline") > limiter_deadline);
    let app = Router::new()
        .route("/api/{*rest}", get(|| async { "api" }))
        .layer(layer);
    let first = call(&app, Method::GET, "/api/x", PEER).await;
    let second = call(&app, Method::GET, "/api/x", PEER).await;
    assert_eq!(
        (first.status, second.status),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
    );
}

/// With the store away, a failure policy's answers carry no `RateLimit` header: nothing is
/// known of the limit (before, `r=0;t=0`, "nothing left, full again now", on every
/// response while Redis was away). Failing closed, the 429 says to retry in a second at
/// least (before, `Retry-After: 0` while the breaker was closed: straight back at Redis).
#[tokio::test]
async fn failure_policy_answers_show_no_rate_limit_figures() {
    for (failure, status) in [
        (rein::FailurePolicy::FailOpen, StatusCode::OK),
        (
            rein::FailurePolicy::FailClosed,
            StatusCode::TOO_MANY_REQUESTS,
        ),
    ] {
        let policy = window("api", 1);
        let limiter = rein::ResilientLimiter::builder(
            Faulty::new(MemoryStore::new(), Fault::Hang),
            rein::PolicyTable::new(policy.clone()),
            failure,
        )
        .build()
        .expect("limiter");
        let app = app(RateLimitLayer::builder(limiter)
            .policy(policy)
            .route(Route::any().policy("api"))
            .build()
            .expect("layer"));
        // Past the breaker's five failures: while closed and once open (its wait then
        // the `Retry-After`).
        for _ in 0..7 {
            let answered = call(&app, Method::GET, "/api/x", PEER).await;
            assert_eq!(answered.status, status, "{failure:?}");
            let headers = &answered.headers;
            assert!(
                !headers.contains_key("ratelimit"),
                "{failure:?}: {headers:?}"
            );
            if status == StatusCode::TOO_MANY_REQUESTS {
                let retry = headers["retry-after"].to_str().expect("ascii");
                assert!(retry.parse::<u64>().expect("seconds") >= 1, "{headers:?}");
            }
        }
    }
}

#[test]
fn requests_are_counted_by_route_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Handles are taken when the layer is built: the recorder must be in place by then.
    let layer = metrics::with_local_recorder(&recorder, || {
        builder()
            .policy(window("api", 1))
            .route(Route::prefix("/api").policy("api").named("api"))
            .build()
            .expect("layer")
    });
    let app = app(layer);
    let runtime = current_thread();
    runtime.block_on(async {
        call(&app, Method::GET, "/api/x", PEER).await;
        call(&app, Method::GET, "/api/x", PEER).await;
        call(&app, Method::GET, "/api/x", PEER).await;
        call(&app, Method::GET, "/api/x", None).await;
    });
    // A snapshot drains the debugging recorder's counters: take one.
    let snapshot = snapshotter.snapshot().into_vec();
    let counted = |outcome: &str| {
        counter(
            &snapshot,
            "rein_http_requests_total",
            &[("route", "api"), ("outcome", outcome)],
        )
    };
    assert_eq!(counted("allowed"), Some(&DebugValue::Counter(1)));
    assert_eq!(counted("denied"), Some(&DebugValue::Counter(2)));
    assert_eq!(counted("missing_key"), Some(&DebugValue::Counter(1)));
    assert_eq!(counted("unavailable"), Some(&DebugValue::Counter(0)));
}

/// A runtime for the tests that must build the layer outside one (a local metrics recorder
/// is in place only while the layer is built).
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The value of the metric `name` whose labels are exactly `wanted`, in order.
fn counter<'a>(
    snapshot: &'a [(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)],
    name: &str,
    wanted: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    snapshot.iter().find_map(|(key, _, _, value)| {
        let labels = key.key().labels().map(|l| (l.key(), l.value()));
        (key.key().name() == name && labels.eq(wanted.iter().copied())).then_some(value)
    })
}

/// Shadow mode: the policy decides and counts as usual (the limit's count moves exactly as
/// without it), but what it would deny reaches the service, without rate-limit headers,
/// and is counted per policy; another policy of the same layer still denies.
#[test]
fn a_policy_in_shadow_mode_passes_what_it_would_deny_and_counts_it() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let store = MemoryStore::new();
    let layer = metrics::with_local_recorder(&recorder, || {
        RateLimitLayer::builder(store.clone())
            .policy(window("api", 2))
            .policy(window("login", 1))
            .shadow("api")
            .route(Route::prefix("/api").policy("api").named("api"))
            .route(Route::exact("/login").policy("login").named("login"))
            .build()
            .expect("layer")
    });
    let app = app(layer);
    let runtime = current_thread();
    runtime.block_on(async {
        for i in 0..5 {
            let answered = call(&app, Method::GET, "/api/x", PEER).await;
            assert_eq!(
                (answered.status, answered.body.as_str()),
                (StatusCode::OK, "api")
            );
            // The first two are admitted, the rest pass in shadow: none shows the trial
            // policy to the client (a client pacing on `RateLimit` would slow down for it).
            assert!(!answered.headers.contains_key("ratelimit"), "request {i}");
        }
        let statuses = [
            call(&app, Method::POST, "/login", PEER).await.status,
            call(&app, Method::POST, "/login", PEER).await.status,
        ];
        assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str, wanted: &[(&str, &str)]| counter(&snapshot, name, wanted);
    assert_eq!(
        counter("rein_http_shadow_denials_total", &[("policy", "api")]),
        Some(&DebugValue::Counter(3))
    );
    assert_eq!(
        counter(
            "rein_http_requests_total",
            &[("route", "api"), ("outcome", "shadow_denied")]
        ),
        Some(&DebugValue::Counter(3))
    );
    assert_eq!(
        counter("rein_http_shadow_denials_total", &[("policy", "login")]),
        None,
        "only shadowed policies have the counter"
    );
    // What a shadow policy cannot decide passes too: a request without its key, and one
    // costing more than its capacity (before, 500 and 413: a trial refused clients).
    let layer = builder()
        .policy(window("keyed", 2))
        .policy(window("costly", 2))
        .shadow("keyed")
        .shadow("costly")
        .route(
            Route::exact("/api/keyed")
                .policy("keyed")
                .key(KeySource::header(HeaderName::from_static("x-api-key"))),
        )
        .route(Route::exact("/api/costly").policy("costly").cost(3))
        .build()
        .expect("layer");
    let trial = self::app(layer);
    runtime.block_on(async {
        for path in ["/api/keyed", "/api/costly"] {
            let answered = call(&trial, Method::GET, path, PEER).await;
            assert_eq!(answered.status, StatusCode::OK, "{path}");
        }
    });
    let unknown = builder().policy(window("api", 1)).shadow("apj").build();
    assert_eq!(
        unknown.err(),
        Some(LayerError::UnknownShadowPolicy("apj".into()))
    );
}

#[tokio::test]
async fn route_layer_limits_only_the_axum_routes_it_wraps() {
    let layer = builder()
        .policy(window("login", 1))
        .route(Route::any().policy("login"))
        .build()
        .expect("layer");
    // axum's `route_layer` wraps the routes added before it, after routing.
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route_layer(layer)
        .route("/health", get(|| async { "ok" }));
    assert_eq!(status(&app, Method::POST, "/login").await, StatusCode::OK);
    assert_eq!(
        status(&app, Method::POST, "/login").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        assert_eq!(status(&app, Method::GET, "/health").await, StatusCode::OK);
    }
}

#[test]
fn each_decision_has_a_span_with_route_policy_and_outcome() {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::format::FmtSpan;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let layer = builder()
        .policy(window("api", 1))
        .route(Route::prefix("/api").policy("api").named("search"))
        .build()
        .expect("layer");
    let app = app(layer);
    let runtime = current_thread();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            call(&app, Method::GET, "/api/x", PEER).await;
            call(&app, Method::GET, "/api/x", PEER).await;
            // No peer, so no key: a span too (before, none, though docs named the outcome).
            call(&app, Method::GET, "/api/x", None).await;
        });
    });
    let output = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
    let closed: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("rein_http") && line.contains("close"))
        .collect();
    assert_eq!(closed.len(), 3, "{output}");
    for (line, outcome) in closed.iter().zip(["allowed", "denied", "missing_key"]) {
        for field in [
            "route=\"search\"".to_owned(),
            "policy=\"api\"".to_owned(),
            format!("outcome=\"{outcome}\""),
        ] {
            assert!(line.contains(&field), "{field} in {line}");
        }
    }
}
