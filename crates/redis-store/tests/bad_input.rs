//! Absurd keys, invalid settings, impossible costs, servers that are not Redis and servers
//! that never answer: each gives a typed error (or, for odd keys, a decision), never a panic.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::FakeServer;
use rein_core::{DecideError, KeyError, StoreError};
use rein_core::{Limit, Limiter, Micros, OverCapacity, Policy};
use rein_redis::{
    ConnectError, MAX_DURATION, RedisPolicy, RedisStore, RedisStoreBuilder, SettingsError,
    StateError,
};
use rein_redis_harness::RedisServer;

fn policy() -> RedisPolicy {
    let limits = [
        Limit::token_bucket(10, 1, Micros::from_secs(1)).expect("valid"),
        Limit::sliding_log(20, Micros::from_secs(1)).expect("valid"),
    ];
    RedisPolicy::new("bad-input", Policy::new(limits).expect("valid")).expect("valid name")
}

/// A store that waits long enough for a fake server on a busy machine: these tests are
/// about the shape of replies, not about time.
fn patient(
    conn: redis::aio::MultiplexedConnection,
) -> RedisStore<redis::aio::MultiplexedConnection> {
    RedisStoreBuilder::new()
        .deadline(Duration::from_secs(5))
        .build(conn)
        .expect("valid settings")
}

/// Connects by URL to `fake`, which loads the script first, giving up after `timeout`.
async fn connect_to(
    fake: &FakeServer,
    timeout: Duration,
) -> Result<RedisStore<redis::aio::ConnectionManager>, ConnectError> {
    RedisStoreBuilder::new()
        .connect_timeout(timeout)
        .connect(&fake.url())
        .await
}

#[tokio::test]
async fn odd_user_keys_are_hashed_and_the_empty_and_over_long_keys_are_refused() {
    let server = RedisServer::start().expect("start redis-server");
    let store = common::store(&server).await;
    let policy = policy();
    let longest = vec![b'k'; rein_core::limiter::MAX_KEY_BYTES];
    let odd: [&[u8]; 6] = [
        b"{",
        b"}{",
        b"{user}",
        b"\0\xff\xfe\r\n",
        &longest,
        "ключ 🔑".as_bytes(),
    ];
    for key in odd {
        let decision = store
            .acquire(None, &policy, key.as_ref(), 1)
            .await
            .expect("a decision");
        assert!(decision.is_allowed());
        assert_eq!(decision.remaining, 9, "each odd key is its own limit");
    }
    // The longest key and its one-byte-shorter sibling do not share a limit.
    let decision = store
        .acquire(None, &policy, &longest[1..], 1)
        .await
        .expect("a decision");
    assert_eq!(decision.remaining, 9);
    // One byte longer is refused: keys are bounded (they are held in process memory).
    let over = [longest.as_slice(), b"k"].concat();
    assert!(matches!(
        store.acquire(None, &policy, &over, 1).await,
        Err(DecideError::InvalidKey(KeyError::TooLong { len: 1025 }))
    ));

    assert!(matches!(
        store.acquire(None, &policy, b"", 1).await,
        Err(DecideError::InvalidKey(KeyError::Empty))
    ));
    assert!(matches!(
        store.peek(None, &policy, b"".as_ref(), 0).await,
        Err(DecideError::InvalidKey(KeyError::Empty))
    ));
    assert!(matches!(
        store.refund(None, &policy, b"", 1).await,
        Err(DecideError::InvalidKey(KeyError::Empty))
    ));
    assert!(matches!(
        store.state(&policy, "").await,
        Err(StateError::InvalidKey(KeyError::Empty))
    ));
    assert_eq!(store.keys(&policy, ""), Err(KeyError::Empty));
}

#[test]
fn invalid_settings_are_typed_config_errors() {
    // Invalid limits never reach the store: rein-core refuses to build them.
    assert!(matches!(
        Limit::token_bucket(0, 1, Micros::from_secs(1)),
        Err(rein_core::ConfigError::Zero { .. })
    ));
    assert!(matches!(
        Limit::sliding_counter(1 << 30, Micros::from_secs(1 << 30)),
        Err(rein_core::ConfigError::TooLarge { .. })
    ));
    assert!(matches!(
        Policy::new([]),
        Err(rein_core::ConfigError::NoLimits)
    ));

    let single = || Policy::single(Limit::fixed_window(1, Micros::from_secs(1)).expect("valid"));
    for name in ["", "has space", "a:b", "{tag}", "é", &"n".repeat(65)] {
        assert_eq!(
            RedisPolicy::new(name, single()),
            Err(rein_core::ConfigError::InvalidName(name.to_owned())),
        );
    }
    assert!(RedisPolicy::new("Api_v2.login-1", single()).is_ok());

    // Bad store settings are refused before any connection is made.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        for (builder, expected) in [
            (
                RedisStoreBuilder::new().prefix("a{b}"),
                SettingsError::InvalidPrefix("a{b}".into()),
            ),
            (
                RedisStoreBuilder::new().prefix(""),
                SettingsError::InvalidPrefix(String::new()),
            ),
            (
                RedisStoreBuilder::new().deadline(Duration::ZERO),
                SettingsError::ZeroDuration("deadline"),
            ),
            (
                RedisStoreBuilder::new().connect_timeout(Duration::ZERO),
                SettingsError::ZeroDuration("connect timeout"),
            ),
            // A year would overflow no clock, but `300000000000y` in a file would; an hour
            // is the bound.
            (
                RedisStoreBuilder::new().deadline(MAX_DURATION + Duration::from_nanos(1)),
                SettingsError::TooLong("deadline"),
            ),
            (
                RedisStoreBuilder::new().connect_timeout(Duration::from_secs(u64::MAX)),
                SettingsError::TooLong("connect timeout"),
            ),
        ] {
            // Port 1 is never a Redis: a config check that let this through would fail
            // differently.
            match builder.connect("redis://127.0.0.1:1/").await {
                Err(ConnectError::Config(e)) => assert_eq!(e, expected),
                other => panic!("expected {expected:?}, got {other:?}"),
            }
        }
    });
}

#[tokio::test]
async fn cost_above_capacity_is_refused_without_calling_redis() {
    // A server that records what it receives and never answers.
    let silent = FakeServer::start(b"").await;
    let store = RedisStore::new(common::quiet_connection(silent.port).await);
    let policy = policy();
    for result in [
        store.acquire(None, &policy, b"k", 11).await,
        store.peek(None, &policy, b"k", u64::MAX).await,
        store
            .acquire(Some(rein_core::Timestamp::EPOCH), &policy, b"k", 12)
            .await,
    ] {
        common::assert_matches!(
            result,
            Err(DecideError::InsufficientCapacity(OverCapacity {
                capacity: 10,
                ..
            }))
        );
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        silent.received.load(Ordering::SeqCst),
        0,
        "Redis was called"
    );
}

#[tokio::test]
async fn replies_of_the_wrong_shape_are_unexpected_replies() {
    let policy = policy();
    for reply in [
        &b"+OK\r\n"[..],
        b":1\r\n",
        b"$-1\r\n",
        b"*2\r\n:1\r\n:2\r\n",
        b"*6\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n$2\r\nhi\r\n",
        b"*6\r\n:7\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n",
    ] {
        let fake = FakeServer::start(reply).await;
        let store = patient(common::quiet_connection(fake.port).await);
        let shown = String::from_utf8_lossy(reply);
        let result = store.acquire(None, &policy, b"k", 1).await;
        common::assert_matches!(
            result,
            Err(DecideError::Unavailable(StoreError::UnexpectedReply(_))),
            "{shown}"
        );
        let result = store.refund(None, &policy, b"k", 1).await;
        common::assert_matches!(
            result,
            Err(DecideError::Unavailable(StoreError::UnexpectedReply(_))),
            "{shown}"
        );
        // State is read with one `GET` per limit, for which a nil is a missing key (a
        // full limit), so only the other shapes are wrong there.
        let result = store.state(&policy, "k").await;
        assert!(
            matches!(
                result,
                Err(StateError::Unavailable(StoreError::UnexpectedReply(_)))
            ) || (reply == b"$-1\r\n" && result.is_ok()),
            "{shown}: {result:?}"
        );
        // Connecting by URL loads the script first, and notices.
        let result = connect_to(&fake, Duration::from_millis(500)).await;
        common::assert_matches!(
            result,
            Err(ConnectError::Unavailable(StoreError::UnexpectedReply(_))),
            "{shown}"
        );
    }
    // Bytes that are not RESP at all break the connection's parser.
    let garbage = FakeServer::start(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
    let store = patient(common::quiet_connection(garbage.port).await);
    let result = store.acquire(None, &policy, b"k", 1).await;
    common::assert_matches!(
        result,
        Err(DecideError::Unavailable(StoreError::UnexpectedReply(_))
            | DecideError::Unavailable(StoreError::Connection(_)))
    );
    // An error reply is the server's.
    let erring = FakeServer::start(b"-ERR unknown command 'EVALSHA'\r\n").await;
    let store = patient(common::quiet_connection(erring.port).await);
    let result = store.acquire(None, &policy, b"k", 1).await;
    common::assert_matches!(result, Err(DecideError::Unavailable(StoreError::Server(_))));
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_timeout_within_the_deadline() {
    let silent = FakeServer::start(b"").await;
    let deadline = Duration::from_millis(50);
    let store = RedisStoreBuilder::new()
        .deadline(deadline)
        .build(common::quiet_connection(silent.port).await)
        .expect("valid settings");
    let policy = policy();
    for _ in 0..3 {
        let started = Instant::now();
        let result = store.acquire(None, &policy, b"k", 1).await;
        let took = started.elapsed();
        common::assert_matches!(
            result,
            Err(DecideError::Unavailable(StoreError::Timeout(d))) if *d == deadline
        );
        assert!(
            took >= deadline && took < deadline + Duration::from_millis(250),
            "{took:?}"
        );
    }
    assert!(
        silent.received.load(Ordering::SeqCst) > 0,
        "the call was never sent"
    );

    // Connecting by URL to it times out as well, within the connect timeout.
    let started = Instant::now();
    let result = connect_to(&silent, Duration::from_millis(200)).await;
    common::assert_matches!(
        result,
        Err(ConnectError::Unavailable(StoreError::Timeout(_)))
    );
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
}
