//! A server started without the peer address (axum served without `ConnectInfo`): every
//! peer-keyed request answers `on_missing_key`, and the layer says why in one error log
//! line, once per process. Its own test binary, so that "once per process" is this test's.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use rein_core::{Limit, Micros, NamedPolicy, Policy};
use rein_memory::MemoryStore;
use rein_tower::{RateLimitLayer, Route};
use tower::ServiceExt;

/// Collects what the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("not poisoned")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn without_a_peer_address_the_layer_logs_the_fix_once_per_process() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let limit = Limit::fixed_window(100, Micros::from_secs(60)).expect("valid");
    let policy = NamedPolicy::new("api", Policy::single(limit)).expect("valid name");
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy)
        .route(Route::any().policy("api"))
        .build()
        .expect("layer");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..3 {
        let request = Request::get("/").body(Body::empty()).expect("request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    let log = String::from_utf8(captured.0.lock().expect("not poisoned").clone()).expect("utf-8");
    let fix = "into_make_service_with_connect_info::<std::net::SocketAddr>()";
    assert_eq!(log.matches(fix).count(), 1, "{log}");
    assert!(log.contains("ERROR"), "{log}");
}
