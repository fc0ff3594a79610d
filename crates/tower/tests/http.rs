//! The layer behind real HTTP servers, over a real private `redis-server`, hit by a real HTTP
//! client on loopback: two server *processes* sharing one limit, forwarding headers that
//! must not change the key, Redis killed mid-run, and a config reloaded while it serves.
//!
//! The server processes are this test binary run again (`child_server_process`, ignored in
//! a normal run), each building its limiter and layer from a config file exactly as an
//! application would (`Config::load(..).build()`).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rein_core::{Decision, Limiter};
use rein_redis::{RedisPolicy, RedisStore};
use rein_redis_harness::RedisServer;
use rein_tower::{Config, Reload, ReloadError, Reloader};

/// The Redis store's deadline in the config files here.
const DEADLINE: Duration = Duration::from_millis(50);

/// How much longer than [`DEADLINE`] a whole HTTP round trip may take while Redis is dead:
/// the limiter's and the layer's 5 ms safety nets, loopback HTTP through a debug-build
/// client and server, and scheduling on a loaded 2-core machine. A hang, a retry or a wait
/// for a reconnect costs at least another deadline, or forever, and is caught.
const MARGIN: Duration = Duration::from_millis(100);

/// The child server's environment variable: the config file to serve.
const CHILD_CONFIG: &str = "REIN_TOWER_TEST_CHILD_CONFIG";

#[test]
#[ignore = "a server process of two_server_processes_sharing_redis_admit_exactly_the_limit"]
fn child_server_process() {
    let Ok(path) = std::env::var(CHILD_CONFIG) else {
        panic!("a server process of two_server_processes_sharing_redis_admit_exactly_the_limit");
    };
    // Exit when the parent closes our stdin (or dies), so no server outlives its test.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let config = Config::load(&path).expect("child: load config");
        let layer = config.build().await.expect("child: build");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("child: bind");
        println!("LISTENING {}", listener.local_addr().expect("addr"));
        axum::serve(
            listener,
            app()
                .layer(layer)
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("child: serve");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_sharing_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start().expect("start redis-server");
    // 5 requests, then one more an hour: nothing refills during the test. The key is the
    // peer address, with the forwarding header explicitly trusted through zero hops.
    let path = write_config(
        "two-processes",
        &redis,
        r#"
[failure]
policy = "fail_closed"

[policies.api]
limits = [{ algorithm = "token_bucket", capacity = 5, refill = 1, period = "1h" }]

[http]
key = { from = "x-forwarded-for", trusted_hops = 0 }
admitted_headers = "all"

[[routes]]
prefix = "/api"
policy = "api"
"#,
    );
    let config = Config::load(&path).expect("load");
    let servers = [ChildServer::spawn(&path), ChildServer::spawn(&path)];
    let (store, policy) = observer(&redis, &config).await;
    let client = client();

    let mut admitted = [0; 2];
    let mut statuses = Vec::new();
    for i in 0..14 {
        let server = i % 2;
        // Every request claims another client address: without trusted hops, ignored.
        let spoofed = format!("198.51.100.{i}, 203.0.113.{i}");
        let before = peek(&store, &policy).await;
        let response = send(
            &client,
            servers[server].addr,
            "/api/items",
            &[("x-forwarded-for", &spoofed)],
        )
        .await;
        let after = peek(&store, &policy).await;
        statuses.push(response.status.as_u16());
        let headers = &response.headers;
        assert_eq!(
            header(headers, "ratelimit-policy"),
            r#""api";q=5;w=18000"#,
            "request {i}"
        );
        match response.status {
            StatusCode::OK => {
                admitted[server] += 1;
                let total = admitted[0] + admitted[1];
                let (r, t) = rate_limit(headers);
                assert_eq!(
                    r,
                    5 - total,
                    "request {i}: remaining after {total} admitted"
                );
                assert!(t <= 18_000, "request {i}: t={t}");
            }
            StatusCode::TOO_MANY_REQUESTS => {
                // The decision was made between the two peeks, and nothing changes the
                // bucket in between (a denial writes nothing), so its figures, rounded up
                // to seconds, lie between theirs. The deny cache may report its countdown a
                // few ms short of Redis's; 50 ms of slack covers it.
                let retry_after: u64 = header(headers, "retry-after").parse().expect("int");
                assert!(
                    ceil_secs_minus(after.retry_after, 50) <= retry_after
                        && retry_after <= ceil_secs(before.retry_after),
                    "request {i}: Retry-After {retry_after}, decision between {after:?} and {before:?}"
                );
                // On a denial `t` names the same instant as `Retry-After`.
                let (r, t) = rate_limit(headers);
                assert_eq!((r, t), (0, retry_after), "request {i}");
                assert_eq!(retry_after, 3_600, "one token an hour, just spent");
            }
            other => panic!("request {i}: unexpected {other}"),
        }
    }
    assert_eq!(
        statuses,
        [
            200, 200, 200, 200, 200, 429, 429, 429, 429, 429, 429, 429, 429, 429
        ]
    );
    assert_eq!(
        admitted,
        [3, 2],
        "both processes admitted from the one limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_gives_the_configured_answers_within_the_deadline() {
    let mut redis = RedisServer::start().expect("start redis-server");
    let routes = r#"
[policies.api]
limits = [{ algorithm = "fixed_window", limit = 1000, window = "1h" }]

[[routes]]
path = "/api/quota"
policy = "api"
peek = true

[[routes]]
prefix = "/api"
policy = "api"
"#;
    let open = serve(&write_config(
        "fail-open",
        &redis,
        &format!("[failure]\npolicy = \"fail_open\"\n{routes}"),
    ))
    .await;
    let closed = serve(&write_config(
        "fail-closed",
        &redis,
        &format!(
            "[failure]\npolicy = \"fail_closed\"\n\n[http]\non_unavailable = \"pass\"\n{routes}"
        ),
    ))
    .await;
    let client = client();
    for server in [open, closed] {
        for path in ["/api/x", "/api/quota"] {
            let response = send(&client, server, path, &[]).await;
            assert_eq!(response.status, StatusCode::OK, "{path} before the kill");
        }
    }

    redis.kill().expect("kill redis-server");
    // Over the resilient limiter, the failure policy answers an acquire, and a peek alike:
    // it goes through the same deadline, breaker and failure policy (`on_unavailable =
    // "pass"` is for what the limiter leaves unanswered). A denial says when to retry.
    let expected = [
        ("fail open", open, "/api/x", StatusCode::OK),
        (
            "fail closed",
            closed,
            "/api/x",
            StatusCode::TOO_MANY_REQUESTS,
        ),
        ("peek, fail open", open, "/api/quota", StatusCode::OK),
        (
            "peek, fail closed",
            closed,
            "/api/quota",
            StatusCode::TOO_MANY_REQUESTS,
        ),
    ];
    for round in 0..5 {
        for (what, server, path, status) in expected {
            let response = send(&client, server, path, &[]).await;
            assert_eq!(response.status, status, "{what}, round {round}");
            if status == StatusCode::TOO_MANY_REQUESTS {
                assert!(
                    response.headers.contains_key("retry-after"),
                    "{what}, round {round}: no Retry-After"
                );
            }
            assert_within_deadline(&response, round);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_hops_key_by_the_address_the_trusted_proxy_saw() {
    // The positive control of the spoofing test: with one trusted hop, the header's last
    // entry is the key, so two clients behind the proxy have two limits.
    let redis = RedisServer::start().expect("start redis-server");
    let path = write_config(
        "trusted-hop",
        &redis,
        r#"
[policies.api]
limits = [{ algorithm = "fixed_window", limit = 1, window = "1h" }]

[http]
key = { from = "x-forwarded-for", trusted_hops = 1 }

[[routes]]
prefix = "/api"
policy = "api"
"#,
    );
    let server = serve(&path).await;
    let client = client();
    let expected = [
        ("192.0.2.1", StatusCode::OK),
        ("192.0.2.1", StatusCode::TOO_MANY_REQUESTS),
        // A spoofed entry to the left of the proxy's changes nothing.
        ("6.6.6.6, 192.0.2.1", StatusCode::TOO_MANY_REQUESTS),
        ("192.0.2.2", StatusCode::OK),
    ];
    for (xff, status) in expected {
        let response = send(&client, server, "/api/x", &[("x-forwarded-for", xff)]).await;
        assert_eq!(response.status, status, "X-Forwarded-For: {xff}");
    }
    // No header: fewer entries than trusted hops is no key, answered 500.
    let response = send(&client, server, "/api/x", &[]).await;
    assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn the_layer_serves_plain_hyper_with_the_peer_address_as_an_extension() {
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use rein_core::{Limit, Micros, NamedPolicy, Policy};
    use rein_tower::{PeerAddr, RateLimitLayer, Route};

    let policy = NamedPolicy::new(
        "api",
        Policy::single(Limit::fixed_window(2, Micros::from_secs(3_600)).expect("valid")),
    )
    .expect("valid name");
    let layer = RateLimitLayer::builder(rein_memory::MemoryStore::new())
        .policy(policy)
        .route(Route::any().policy("api"))
        .build()
        .expect("layer");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            // Plain hyper has no `ConnectInfo`: the connection's peer goes in as `PeerAddr`.
            let service = tower::ServiceBuilder::new()
                .map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(PeerAddr(peer));
                    request
                })
                .layer(layer.clone())
                .service_fn(|_: Request<Incoming>| async {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("ok"))))
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
            );
        }
    });
    let client = client();
    assert_eq!(statuses(&client, addr, "/", 3).await, TWO_THEN_DENIED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_naming_cluster_nodes_limits_through_the_cluster() {
    let cluster = rein_redis_harness::RedisCluster::start().expect("start a Redis Cluster");
    let nodes: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| format!("\"{url}\""))
        .collect();
    let text = format!(
        r#"
[redis]
cluster = [{}]
deadline = "200ms"

[failure]
policy = "fail_closed"

[policies.api]
limits = [{{ algorithm = "fixed_window", limit = 2, window = "1h" }}]

[http]
default_policy = "api"
"#,
        nodes.join(", ")
    );
    let path = std::env::temp_dir().join(format!("rein-tower-cluster-{}.toml", std::process::id()));
    std::fs::write(&path, text).expect("write config");
    let config = Config::load(&path).expect("load");
    assert!(
        matches!(config.redis.endpoint, rein_tower::RedisEndpoint::Cluster(ref n) if n.len() == 3)
    );
    let server = serve(&path).await;
    let client = client();
    // Fail closed: a 200 can only have come from the cluster.
    assert_eq!(
        statuses(&client, server, "/api/x", 3).await,
        TWO_THEN_DENIED
    );
}

/// A reload while requests keep coming: a raised limit admits the difference at once (the
/// count is kept), a bad file or a changed `[redis]` is refused and the config in force
/// keeps serving, a watched file reloads by itself (a renamed policy, then shadow mode on
/// and off). Requests run
/// concurrently with every reload; each answers 200 or 429, never anything else, and the
/// total admitted is exactly what the limits in force allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_limit_while_serving_and_a_bad_file_changes_nothing() {
    let redis = RedisServer::start().expect("start redis-server");
    let policy = |capacity: u64, name: &str| {
        format!(
            r#"
[failure]
policy = "fail_closed"

[policies.{name}]
limits = [{{ algorithm = "fixed_window", limit = {capacity}, window = "1h" }}]

[[routes]]
prefix = "/api"
policy = "{name}"
"#
        )
    };
    let path = write_config("reload", &redis, &policy(4, "api"));
    let reloader = Reloader::load(&path).await.expect("load and build");
    let addr = listen(app().layer(reloader.layer())).await;
    let client = client();
    // `count` requests at once, each of which must be answered 200 or 429; the 200s.
    let burst = |count: usize| {
        let client = client.clone();
        async move {
            let asks = (0..count).map(|_| {
                let client = client.clone();
                async move { send(&client, addr, "/api/x", &[]).await }
            });
            let answers = futures_join_all(asks).await;
            for answer in &answers {
                assert!(
                    answer.status == StatusCode::OK
                        || answer.status == StatusCode::TOO_MANY_REQUESTS,
                    "{:?}",
                    answer.status
                );
            }
            answers
                .iter()
                .filter(|a| a.status == StatusCode::OK)
                .count()
        }
    };
    assert_eq!(burst(3).await, 3, "3 of 4");

    // Raised to 10 while requests run: the 3 counted stay counted, whatever the order.
    write_config("reload", &redis, &policy(10, "api"));
    let (during, reloaded) = tokio::join!(burst(6), async { reloader.reload() });
    assert_eq!(reloaded.expect("a valid file reloads"), Reload::Applied);
    assert_eq!(during + burst(6).await, 7, "10 in all, 3 already counted");
    // The same text again (a touch, a save unchanged): the limiter in force keeps serving,
    // its counts (and breaker, caches, fallback) as they were; a rebuild started them afresh.
    let decided = reloader.layer().limiter().stats().decisions;
    assert_eq!(reloader.reload().expect("the same file"), Reload::Unchanged);
    assert_eq!(reloader.layer().limiter().stats().decisions, decided);

    // A bad file: refused with its line and field, and the limit in force keeps deciding.
    std::fs::write(&path, "[redis]\nurl = 7\n").expect("write");
    match reloader.reload() {
        Err(ReloadError::Load { source, .. }) => {
            let message = source.to_string();
            let at = format!("{}: line 2: redis.url:", path.display());
            assert!(message.starts_with(&at), "{message}");
        }
        other => panic!("a bad file must be refused: {other:?}"),
    }
    assert_eq!(burst(2).await, 0, "still the raised limit, spent");
    // A changed [redis] is refused too: the connection is never replaced.
    let elsewhere = format!(
        "[redis]\nurl = \"redis://127.0.0.1:1/\"\n{}",
        policy(10, "api")
    );
    std::fs::write(&path, elsewhere).expect("write");
    assert!(matches!(
        reloader.reload(),
        Err(ReloadError::RedisChanged { .. })
    ));
    assert_eq!(reloader.config().policies[0].policy().capacity(), 10);

    // Watched: a renamed policy (new keys, an empty count) takes effect by itself.
    let _watching = reloader.watch(Duration::from_millis(20));
    write_config("reload", &redis, &policy(2, "api_v2"));
    watched(
        || reloader.config().policies[0].name() == "api_v2",
        "the renamed policy",
    )
    .await;
    assert_eq!(burst(5).await, 2, "the new policy's 2");

    // Shadow mode on and off again, without a restart: spent, it lets everything through,
    // then denies again.
    let shadowed = policy(2, "api_v2").replace("limits = [", "shadow = true\nlimits = [");
    for (text, shadow, admitted) in [(shadowed, true, 4), (policy(2, "api_v2"), false, 0)] {
        write_config("reload", &redis, &text);
        let what = format!("shadow {shadow}");
        watched(|| reloader.config().shadow.is_empty() != shadow, &what).await;
        assert_eq!(burst(4).await, admitted, "shadow {shadow}");
    }
    let _ = std::fs::remove_file(&path);
}

/// A watch started after the file changed applies the change: it compares with the file
/// as `load` read it (before, with the file as it was when the watch started, so an edit
/// made in between, e.g. by config management during startup, waited for the next one).
#[tokio::test]
async fn a_watch_started_after_an_edit_applies_it() {
    let redis = RedisServer::start().expect("start redis-server");
    let file = |name: &str| {
        format!(
            "[policies.{name}]\nlimits = [{{ algorithm = \"fixed_window\", limit = 1, window = \"1h\" }}]\n\n[[routes]]\nprefix = \"/api\"\npolicy = \"{name}\"\n"
        )
    };
    let path = write_config("late-watch", &redis, &file("first"));
    let reloader = Reloader::load(&path).await.expect("load and build");
    // A different length, so the change shows whatever the clock's resolution.
    write_config("late-watch", &redis, &file("second_one"));
    let _watching = reloader.watch(Duration::from_millis(20));
    watched(
        || reloader.config().policies[0].name() == "second_one",
        "the edit made before the watch",
    )
    .await;
    let _ = std::fs::remove_file(&path);
}

/// `[leases]` over a real Redis: requests for one hot key decided mostly from leases
/// through the layer, every one of the limit's first 60 admitted; a reload gives back what
/// the replaced limiter's leases held (Redis then counts just the 60), and the new limiter,
/// its file without `[leases]`, admits exactly the 40 left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_from_the_file_admit_exactly_and_a_reload_gives_back_what_they_held() {
    let redis = RedisServer::start().expect("start redis-server");
    let text = |leases: &str| {
        format!(
            r#"
[failure]
policy = "fail_closed"
{leases}
[policies.api]
limits = [{{ algorithm = "fixed_window", limit = 100, window = "1h" }}]

[[routes]]
prefix = "/api"
policy = "api"
"#
        )
    };
    let path = write_config("leases", &redis, &text("[leases]\nexpected_nodes = 1\n"));
    let reloader = Reloader::load(&path).await.expect("load and build");
    let addr = listen(app().layer(reloader.layer())).await;
    let (store, policy) = observer(&redis, &reloader.config()).await;
    let client = client();
    let admitted = |statuses: Vec<StatusCode>| {
        statuses
            .into_iter()
            .filter(|&status| status == StatusCode::OK)
            .count()
    };
    assert_eq!(admitted(statuses(&client, addr, "/api/x", 60).await), 60);
    let stats = || reloader.layer().limiter().lease_stats().expect("leases on");
    assert!(stats().leased > 0, "leases answered: {:?}", stats());
    // Every reservation answered, so that the store shows what the leases hold. (One
    // still in flight at the reload would be waited for by the replaced limiter's shutdown,
    // crates/limiter/tests/lease.rs.)
    watched(
        || stats().reservations_pending() == 0,
        "every reservation answered",
    )
    .await;
    let left = peek(&store, &policy).await.remaining;
    assert!(
        left < 40,
        "the leases hold units beyond the 60 admitted: {left} left"
    );

    write_config("leases", &redis, &text(""));
    reloader.reload().expect("a valid file reloads");
    assert_eq!(reloader.layer().limiter().lease_stats(), None, "leases off");
    let started = Instant::now();
    while units_left(&store, &policy).await != 40 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the replaced limiter's leases never gave back what they held"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(admitted(statuses(&client, addr, "/api/x", 45).await), 40);
    let _ = std::fs::remove_file(&path);
}

/// Waits, up to 10 s, until `reloaded` says the watch has reloaded the file to `what`.
async fn watched(reloaded: impl Fn() -> bool, what: &str) {
    let started = Instant::now();
    while !reloaded() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the watch never reloaded: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every future of `futures`, run at once, their outputs in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.expect("a request's task"));
    }
    out
}

/// The routes every test server has behind the layer.
fn app() -> Router {
    Router::new()
        .route("/api/{*rest}", get(|| async { "ok" }))
        .route("/health", get(|| async { "ok" }))
}

/// Serves `config` in this process on a free loopback port.
async fn serve(path: &PathBuf) -> SocketAddr {
    let layer = Config::load(path)
        .expect("load")
        .build()
        .await
        .expect("build");
    listen(app().layer(layer)).await
}

/// Serves `router`, with each connection's peer address, on a free loopback port.
async fn listen(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    addr
}

/// A config file for the private server: `[redis]` plus `rest`.
fn write_config(name: &str, redis: &RedisServer, rest: &str) -> PathBuf {
    let text = format!(
        "[redis]\nurl = \"{}\"\ndeadline = \"{}ms\"\nkey_prefix = \"{PREFIX}\"\n{rest}",
        redis.url(),
        DEADLINE.as_millis()
    );
    let path = std::env::temp_dir().join(format!(
        "rein-tower-{name}-{}-{}.toml",
        std::process::id(),
        redis.port()
    ));
    std::fs::write(&path, text).expect("write config");
    path
}

const PREFIX: &str = "rein-tower-test";

/// A server process: this test binary running `child_server_process`.
struct ChildServer {
    child: Child,
    addr: SocketAddr,
}

impl ChildServer {
    fn spawn(config: &PathBuf) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "child_server_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_CONFIG, config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a server process");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("LISTENING ") {
                    let _ = tx.send(addr.parse::<SocketAddr>());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the server process did not start listening within 30 s")
            .expect("address");
        Self { child, addr }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test's own view of the limit: the same Redis keys the servers decide on.
async fn observer(
    redis: &RedisServer,
    config: &Config,
) -> (RedisStore<redis::aio::ConnectionManager>, RedisPolicy) {
    let store = rein_redis::RedisStoreBuilder::new()
        .prefix(PREFIX)
        .connect(&redis.url())
        .await
        .expect("connect the observer");
    let policy = store.prepare(&config.policies[0]).expect("prepare");
    (store, policy)
}

/// What the limit would answer the peer `127.0.0.1` right now, taking nothing.
async fn peek(store: &RedisStore<redis::aio::ConnectionManager>, policy: &RedisPolicy) -> Decision {
    Limiter::peek(store, None, policy, b"127.0.0.1", 1)
        .await
        .expect("peek")
}

/// The units the limit has left for the peer `127.0.0.1` right now (a peek of 0: a peek of
/// 1 answers what would be left after it).
async fn units_left(
    store: &RedisStore<redis::aio::ConnectionManager>,
    policy: &RedisPolicy,
) -> u64 {
    Limiter::peek(store, None, policy, b"127.0.0.1", 0)
        .await
        .expect("peek")
        .remaining
}

struct Answered {
    status: StatusCode,
    headers: HeaderMap,
    elapsed: Duration,
}

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// What three requests get from a limit of 2 that does not refill meanwhile.
const TWO_THEN_DENIED: [StatusCode; 3] = [
    StatusCode::OK,
    StatusCode::OK,
    StatusCode::TOO_MANY_REQUESTS,
];

/// The statuses of `n` requests for `path`, one after another.
async fn statuses(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    path: &str,
    n: usize,
) -> Vec<StatusCode> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(send(client, addr, path, &[]).await.status);
    }
    statuses
}

async fn send(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Answered {
    let mut request = Request::get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Empty::new()).expect("request");
    let started = Instant::now();
    let response = client.request(request).await.expect("HTTP round trip");
    let (parts, body) = response.into_parts();
    body.collect().await.expect("body");
    Answered {
        status: parts.status,
        headers: parts.headers,
        elapsed: started.elapsed(),
    }
}

fn assert_within_deadline(response: &Answered, round: usize) {
    assert!(
        response.elapsed < DEADLINE + MARGIN,
        "round {round}: answered in {:?}, deadline {DEADLINE:?} + margin {MARGIN:?}",
        response.elapsed
    );
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header in {headers:?}"))
        .to_str()
        .expect("ASCII")
}

/// `r` and `t` of a `RateLimit` value `"name";r=R;t=T`.
fn rate_limit(headers: &HeaderMap) -> (u64, u64) {
    let value = header(headers, "ratelimit");
    let mut r = None;
    let mut t = None;
    for parameter in value.split(';').skip(1) {
        match parameter.split_once('=') {
            Some(("r", v)) => r = v.parse().ok(),
            Some(("t", v)) => t = v.parse().ok(),
            _ => {}
        }
    }
    (r.expect("r"), t.expect("t"))
}

fn ceil_secs(span: rein_core::Micros) -> u64 {
    span.as_micros().div_ceil(1_000_000)
}

/// Seconds, rounded up, of `span` less `slack_ms`.
fn ceil_secs_minus(span: rein_core::Micros, slack_ms: u64) -> u64 {
    span.as_micros()
        .saturating_sub(slack_ms * 1_000)
        .div_ceil(1_000_000)
}
