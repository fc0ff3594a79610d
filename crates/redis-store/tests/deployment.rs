//! Running against a real deployment: AUTH, a least-privilege ACL user, TLS, and replacing
//! a connection that died (silently, or with the server).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::FakeServer;
use redis::aio::MultiplexedConnection;
use rein_core::{DecideError, StoreError};
use rein_core::{Limit, Limiter, Micros, Policy};
use rein_redis::{ConnectError, RedisPolicy, RedisStore, RedisStoreBuilder};
use rein_redis_harness::RedisServer;

/// A policy with one limit of each algorithm, so every command the script uses runs.
fn policy() -> RedisPolicy {
    common::mixed_policy("deploy")
}

#[tokio::test]
async fn auth_from_the_url_and_a_wrong_password_is_an_auth_error() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]).expect("start redis-server");
    let port = server.port();
    let store = RedisStore::connect(&format!("redis://:s3cret@127.0.0.1:{port}/"))
        .await
        .expect("connect with the password");
    assert!(common::admits(&store, &policy(), b"u", 1).await);

    let wrong = RedisStore::connect(&format!("redis://:nope@127.0.0.1:{port}/")).await;
    common::assert_matches!(wrong, Err(ConnectError::Auth(_)));
    let missing = RedisStore::connect(&format!("redis://127.0.0.1:{port}/")).await;
    common::assert_matches!(missing, Err(ConnectError::Auth(_)));
}

/// Everything the store sends after connecting (which loads its scripts): decisions of
/// every algorithm, the first after the server lost its scripts (a restart, a failover:
/// `EVAL` of the source), a peek, refunds (one back to full, which deletes its key),
/// a state read, and a lone fixed window kept as one integer (`INCRBY`, `PEXPIRE` on its
/// first admission, a denial that takes its cost back).
async fn every_command_the_store_sends(
    server: &RedisServer,
    store: &RedisStore<redis::aio::ConnectionManager>,
) -> Result<(), String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    assert_eq!(
        server.command(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH"),
        "+OK\r\n"
    );
    // A unit of `u` under `policy`, taken or given back; an error says `what` failed.
    let acquire = async |policy: &RedisPolicy, what: &str| {
        store
            .acquire(None, policy, b"u", 1)
            .await
            .map_err(|e| fail(what, &e))
    };
    let refund = async |policy: &RedisPolicy, what: &str| {
        store
            .refund(None, policy, b"u", 1)
            .await
            .map_err(|e| fail(what, &e))
    };
    let policy = policy();
    for _ in 0..12 {
        acquire(&policy, "acquire").await?;
    }
    store
        .peek(None, &policy, b"u", 1)
        .await
        .map_err(|e| fail("peek", &e))?;
    refund(&policy, "refund").await?;
    store
        .state(&policy, "u")
        .await
        .map_err(|e| fail("state", &e))?;
    let bucket = RedisPolicy::new(
        "bucket",
        Policy::single(Limit::token_bucket(5, 1, Micros::from_secs(60)).expect("valid")),
    )
    .expect("valid name");
    acquire(&bucket, "a bucket's acquire").await?;
    refund(&bucket, "a bucket's refund to full").await?;
    let window = RedisPolicy::new(
        "window",
        Policy::single(Limit::fixed_window(2, Micros::from_secs(60)).expect("valid")),
    )
    .expect("valid name");
    for allowed in [true, true, false] {
        let decision = acquire(&window, "a window's acquire").await?;
        assert_eq!(decision.is_allowed(), allowed);
    }
    refund(&window, "a window's refund").await?;
    // On the caller's clock (the `*_at` methods) an admission in a window already counting
    // sets the key's TTL: `PEXPIRE`.
    let now = rein_core::Timestamp::from_micros(1_764_000_000_000_000);
    for _ in 0..2 {
        store
            .acquire(Some(now), &window, b"v", 1)
            .await
            .map_err(|e| fail("a window's acquire on the caller's clock", &e))?;
    }
    Ok(())
}

/// The ACL docs/redis.md recommends is enough, and no more than enough: without any one of
/// its commands but `INCRBY`, something the store does is refused; without `INCRBY` a lone
/// fixed window's admission, still exact, takes the slower `GET` and `SET` path.
#[tokio::test]
async fn a_least_privilege_acl_user_can_decide_on_its_prefix_only() {
    let server = RedisServer::start().expect("start redis-server");
    assert_eq!(
        server
            .command(&common::LEAST_PRIVILEGE)
            .expect("ACL SETUSER"),
        "+OK\r\n"
    );
    let url = format!("redis://rein:pw@127.0.0.1:{}/", server.port());
    let store = RedisStore::connect(&url)
        .await
        .expect("connect as the ACL user");
    assert_eq!(
        server.command(&["CONFIG", "RESETSTAT"]).expect("reset"),
        "+OK\r\n"
    );
    every_command_the_store_sends(&server, &store)
        .await
        .expect("the least-privilege user does everything the store does");
    assert_eq!(
        server.command(&["DBSIZE"]).expect("DBSIZE"),
        ":3\r\n",
        "only the `deploy` policy's one key and the window's two"
    );
    let gets_with_everything = server.commandstat_calls("get").expect("INFO");
    for (i, removed) in common::LEAST_PRIVILEGE
        .iter()
        .filter(|part| part.starts_with('+'))
        .enumerate()
    {
        let user = format!("without{i}");
        let acl: Vec<&str> = common::LEAST_PRIVILEGE
            .iter()
            .map(|part| if *part == "rein" { user.as_str() } else { part })
            .filter(|part| part != removed)
            .collect();
        assert_eq!(server.command(&acl).expect("ACL SETUSER"), "+OK\r\n");
        for reset in [&["FLUSHALL"][..], &["CONFIG", "RESETSTAT"]] {
            assert_eq!(server.command(reset).expect("reset"), "+OK\r\n");
        }
        let url = format!("redis://{user}:pw@127.0.0.1:{}/", server.port());
        // Refused at connect (`SCRIPT LOAD`) or later.
        let refused = match RedisStore::connect(&url).await {
            Err(_) => true,
            Ok(store) => every_command_the_store_sends(&server, &store)
                .await
                .is_err(),
        };
        if *removed == "+incrby" {
            assert!(!refused, "without INCRBY a fixed window takes the GET path");
            let gets = server.commandstat_calls("get").expect("INFO");
            assert!(
                gets > gets_with_everything,
                "the GET path: {gets} GETs, against {gets_with_everything} with INCRBY"
            );
        } else {
            assert!(
                refused,
                "{removed} is not needed: everything ran without it"
            );
        }
    }

    // Outside its prefix the same user is refused by the server: a typed server error.
    let policy = policy();
    let elsewhere = RedisStoreBuilder::new()
        .prefix("other")
        .connect(&url)
        .await
        .expect("connect as the ACL user");
    let refused = elsewhere.acquire(None, &policy, b"u", 1).await;
    common::assert_matches!(
        refused,
        Err(DecideError::Unavailable(StoreError::Server(_)))
    );
}

/// A fixed window kept as one integer counts an admission with `INCRBY` before it sets the
/// key's TTL; when the server refuses the `PEXPIRE` (here an ACL without it), the decision
/// fails and the count is taken back: nothing is counted, no key is left without a TTL.
#[tokio::test]
async fn a_refused_ttl_takes_the_fixed_windows_count_back() {
    let server = RedisServer::start().expect("start redis-server");
    let acl: Vec<&str> = common::LEAST_PRIVILEGE
        .into_iter()
        .filter(|command| *command != "+pexpire")
        .collect();
    assert_eq!(server.command(&acl).expect("ACL SETUSER"), "+OK\r\n");
    let url = format!("redis://rein:pw@127.0.0.1:{}/", server.port());
    let store = RedisStore::connect(&url).await.expect("connect");
    let window = RedisPolicy::new(
        "window",
        Policy::single(Limit::fixed_window(5, Micros::from_secs(60)).expect("valid")),
    )
    .expect("valid name");
    // A caller's `now` sets the TTL on every admission in a window already counting, and on
    // a key INCRBY creates in the window at index 0 (`now` below the window's length).
    let refused = |result: Result<rein_core::Decision, DecideError>| {
        common::assert_matches!(result, Err(DecideError::Unavailable(StoreError::Server(_))));
    };
    let early = rein_core::Timestamp::from_micros(1_000);
    for _ in 0..2 {
        refused(store.acquire(Some(early), &window, b"u", 1).await);
    }
    assert_eq!(server.command(&["DBSIZE"]).expect("DBSIZE"), ":0\r\n");
    let now = rein_core::Timestamp::from_micros(1_764_000_000_000_000);
    let first = store
        .acquire(Some(now), &window, b"u", 1)
        .await
        .expect("a new window: SET");
    assert_eq!(first.remaining, 4);
    for _ in 0..2 {
        refused(store.acquire(Some(now), &window, b"u", 1).await);
    }
    let state = store.state(&window, "u").await.expect("state");
    assert!(
        matches!(state.iter().next(), Some(rein_core::LimitState::FixedWindow(w)) if w.count == 1),
        "{state:?}"
    );
    // On the server's clock a new window is one `SET ... PX`, which the ACL allows; then
    // an admission in it keeps that TTL and needs no `PEXPIRE`.
    for remaining in [4, 3] {
        let decision = store
            .acquire(None, &window, b"u", 1)
            .await
            .expect("decision");
        assert_eq!(decision.remaining, remaining);
    }
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_with_a_private_ca_and_rediss_urls() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls");
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &format!("{dir}/server.crt"),
        "--tls-key-file",
        &format!("{dir}/server.key"),
        "--tls-ca-cert-file",
        &format!("{dir}/ca.crt"),
        "--tls-auth-clients",
        "no",
    ])
    .expect("start redis-server with TLS");
    let url = format!("rediss://localhost:{tls_port}/");

    // A `rediss://` URL verifies against the platform's roots, which do not hold the test
    // CA: a typed connection error, not a panic in the TLS stack.
    let untrusted = RedisStore::connect(&url).await;
    common::assert_matches!(
        untrusted,
        Err(ConnectError::Unavailable(StoreError::Connection(_)))
    );

    // With the private CA, as docs/redis.md shows: build the connection, hand it over.
    let ca = std::fs::read(format!("{dir}/ca.crt")).expect("test CA");
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca),
    };
    let client = redis::Client::build_with_tls(url.as_str(), certs).expect("TLS client");
    let conn = client
        .get_connection_manager()
        .await
        .expect("TLS connection");
    let store = RedisStoreBuilder::new()
        .build(conn)
        .expect("valid settings");
    assert!(common::admits(&store, &policy(), b"u", 1).await);
    drop(server);
}

/// A plain `MultiplexedConnection`, as a simulator's connector would make one.
async fn multiplexed(port: u16) -> redis::RedisResult<MultiplexedConnection> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let info = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
    let (conn, driver) =
        MultiplexedConnection::new_with_config(&info, stream, redis::AsyncConnectionConfig::new())
            .await?;
    tokio::spawn(driver);
    Ok(conn)
}

/// `connect_timeout` bounds the connect as a whole. Through a tunnel that holds each
/// command for a fifth of it, every step (the connection, each of the six `SCRIPT LOAD`s)
/// fits in the setting but all of them do not: the connect is a timeout, not a store
/// that took several times the setting to build.
#[tokio::test]
async fn connect_timeout_bounds_the_whole_connect_not_each_step() {
    let server = RedisServer::start().expect("start redis-server");
    let timeout = Duration::from_secs(1);
    let tunnel = rein_redis_harness::Proxy::start(server.addr(), timeout / 5).addr();
    let connected = RedisStoreBuilder::new()
        .connect_timeout(timeout)
        .connect(&format!("redis://{tunnel}/"))
        .await;
    common::assert_matches!(
        connected,
        Err(ConnectError::Unavailable(StoreError::Timeout(t))) if *t == timeout
    );
}

#[tokio::test]
async fn a_connection_that_went_silent_is_replaced_after_a_timeout() {
    let server = RedisServer::start().expect("start redis-server");
    // The first connection goes to a server that never answers, as a stream cut by a
    // partition does; the connector's later ones go to Redis.
    let silent = FakeServer::start(b"").await;
    let (silent_port, redis_port) = (silent.port, server.port());
    let connects = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&connects);
    let store = RedisStoreBuilder::new()
        .deadline(Duration::from_millis(300))
        .connect_with(move || {
            let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
            multiplexed(if first { silent_port } else { redis_port })
        })
        .await
        .expect("first connection");
    let policy = policy();
    let timed_out = store.acquire(None, &policy, b"u", 1).await;
    common::assert_matches!(
        timed_out,
        Err(DecideError::Unavailable(StoreError::Timeout(_)))
    );
    // The next call waits for the reconnect within its own deadline (a busy machine may
    // need another try).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let decision = loop {
        match store.acquire(None, &policy, b"u", 1).await {
            Ok(decision) => break decision,
            Err(DecideError::Unavailable(StoreError::Timeout(_)))
                if tokio::time::Instant::now() < deadline => {}
            Err(e) => panic!("no decision after reconnecting: {e}"),
        }
    };
    assert!(decision.is_allowed());
    assert!(connects.load(Ordering::SeqCst) >= 2);
}

#[tokio::test]
async fn a_connection_lost_with_its_server_is_replaced_once_the_server_is_back() {
    let mut server = RedisServer::start().expect("start redis-server");
    let port = server.port();
    let connects = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&connects);
    let store = RedisStoreBuilder::new()
        .deadline(Duration::from_millis(200))
        .connect_with(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            multiplexed(port)
        })
        .await
        .expect("first connection");
    let policy = policy();
    assert!(common::admits(&store, &policy, b"u", 1).await);

    server.kill().expect("kill redis-server");
    for _ in 0..5 {
        let result = store.acquire(None, &policy, b"u", 1).await;
        common::assert_matches!(
            result,
            Err(DecideError::Unavailable(StoreError::Connection(_))
                | DecideError::Unavailable(StoreError::Timeout(_)))
        );
    }
    server.restart().expect("restart redis-server");
    // Connects are paced after a failure; soon after the restart the store is back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match store.acquire(None, &policy, b"u", 1).await {
            Ok(decision) => {
                // The restarted server is empty: a fresh limit (its tightest, the fixed
                // window of 3, less this one), and the script is resent.
                assert_eq!(decision.remaining, 2);
                break;
            }
            Err(
                DecideError::Unavailable(StoreError::Connection(_))
                | DecideError::Unavailable(StoreError::Timeout(_)),
            ) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("still failing after the restart: {e}"),
        }
    }
    assert!(connects.load(Ordering::SeqCst) >= 2);
}

/// A standalone primary demoted to a replica (a failover moved the primary elsewhere, and
/// the store was given this address alone) refuses every write with `READONLY`. The store
/// answers that call at once as a connection error, one `EVALSHA` sent: before, it resent
/// the call up to five times, spending the caller's whole deadline on a server that stays a
/// replica.
#[tokio::test]
async fn a_primary_demoted_to_a_replica_is_a_connection_error_sent_once() {
    let primary = RedisServer::start().expect("start redis-server");
    let demoted = RedisServer::start().expect("start redis-server");
    let store = RedisStoreBuilder::new()
        .deadline(Duration::from_secs(2))
        .build(
            redis::Client::open(demoted.url())
                .expect("client")
                .get_connection_manager()
                .await
                .expect("connect"),
        )
        .expect("store");
    let policy = policy();
    assert!(common::admits(&store, &policy, b"u", 1).await);
    let port = primary.port().to_string();
    demoted
        .command(&["REPLICAOF", "127.0.0.1", &port])
        .expect("REPLICAOF");
    let sent = demoted.commandstat_calls("evalsha").expect("INFO");
    let refused = store.acquire(None, &policy, b"u", 1).await;
    common::assert_matches!(
        refused,
        Err(DecideError::Unavailable(StoreError::Connection(_)))
    );
    assert_eq!(
        demoted.commandstat_calls("evalsha").expect("INFO"),
        sent + 1
    );
}

/// A managed failover: the primary is demoted in place (it stays up, a replica, and keeps
/// its clients), and the address the store connected to now leads to the new primary. A
/// store connected by URL sees its writes refused (`READONLY`), makes a new connection to
/// the URL, and decides on the new primary. Before, its `ConnectionManager` kept the
/// socket to the demoted server, and every admission failed until the process restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_managed_failover_the_store_reaches_the_new_primary() {
    // A policy of several limits (one script, whose refused write fails the call) and a
    // lone token bucket (a lean script, whose decisions each answer their own refusal).
    let bucket = Limit::token_bucket(10, 1, Micros::from_secs(60)).expect("valid");
    let lean = RedisPolicy::new("lean", Policy::single(bucket)).expect("valid name");
    for policy in [policy(), lean] {
        let old = RedisServer::start().expect("start redis-server");
        let new = RedisServer::start().expect("start redis-server");
        let address = rein_redis_harness::Proxy::start(old.addr(), Duration::ZERO);
        let store = RedisStoreBuilder::new()
            .deadline(Duration::from_secs(1))
            .connect(&format!("redis://{}/", address.addr()))
            .await
            .expect("connect through the address");
        assert!(common::admits(&store, &policy, b"u", 1).await);
        // The failover: the old primary follows the new one, and the address moves, late:
        // meanwhile each new connection reaches the demoted server again, and is not
        // replaced at once (a connect per call), but at most once in 100 ms.
        let port = new.port().to_string();
        old.command(&["REPLICAOF", "127.0.0.1", &port])
            .expect("REPLICAOF");
        let connections = || {
            let stats = old.command(&["INFO", "stats"]).expect("INFO");
            let field = "total_connections_received:";
            stats
                .lines()
                .find_map(|line| line.strip_prefix(field)?.trim().parse::<u64>().ok())
                .expect("a connection count")
        };
        let (before, lagging) = (connections(), std::time::Instant::now());
        for _ in 0..20 {
            assert!(store.acquire(None, &policy, b"u", 1).await.is_err());
        }
        let made = connections() - before;
        let allowed = 2 + lagging.elapsed().as_millis() as u64 / 100;
        assert!(
            made <= allowed,
            "{made} connections in {:?}",
            lagging.elapsed()
        );
        address.retarget(new.addr());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut refused = 0;
        loop {
            match store.acquire(None, &policy, b"u", 1).await {
                Ok(decision) => {
                    assert!(decision.is_allowed(), "{decision:?}");
                    break;
                }
                Err(DecideError::Unavailable(StoreError::Connection(_)))
                    if tokio::time::Instant::now() < deadline =>
                {
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{}: still failing after the failover: {e}", policy.name()),
            }
        }
        assert!(refused >= 1, "the demoted server refused a write first");
        let decided = new.commandstat_calls("evalsha").expect("INFO")
            + new.commandstat_calls("eval").expect("INFO");
        assert!(decided > 0, "{}: decided on the new primary", policy.name());
    }
}
