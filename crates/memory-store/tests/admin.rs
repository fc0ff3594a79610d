//! An operator's changes to one key in process (`MemoryStore`'s `KeyAdmin`), for every
//! shape of table the store keeps (each algorithm alone, a token bucket of whole µs, a
//! policy of several limits): the figures rein-core computes, and blocks that deny until
//! their end.

use rein_core::admin::{AdminError, KeyAdmin, KeyState, Until};
use rein_core::{Decision, Limit, Limiter, Micros, NamedPolicy, Policy, Timestamp};
use rein_memory::{Clock, FakeClock, MemoryStore};

/// A memory store's future, which is ready at once: its output.
fn ready<F: std::future::Future>(future: F) -> F::Output {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(future).poll(&mut context) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("a memory store never waits"),
    }
}

fn shapes() -> Vec<Policy> {
    let hour = Micros::from_secs(3_600);
    let single = |limit: Result<Limit, _>| Policy::single(limit.expect("valid"));
    vec![
        single(Limit::token_bucket(10, 1, hour)),
        // One token every 3 600 000 000 / 7 µs: not a whole number, the full state.
        single(Limit::token_bucket(10, 7, hour)),
        single(Limit::fixed_window(10, hour)),
        single(Limit::sliding_log(10, hour)),
        single(Limit::sliding_counter(10, hour)),
        Policy::new([
            Limit::fixed_window(10, hour).expect("valid"),
            Limit::token_bucket(20, 1, hour).expect("valid"),
        ])
        .expect("valid"),
    ]
}

#[test]
fn every_shape_takes_sets_and_blocks_as_rein_core_says() {
    ready(every_shape());
}

async fn every_shape() {
    let clock = FakeClock::new(Timestamp::from_micros(1_000_000_000));
    let store = MemoryStore::with_clock(clock.clone());
    for (i, policy) in shapes().into_iter().enumerate() {
        let what = format!("shape {i}");
        let named = NamedPolicy::new(format!("p{i}"), policy).expect("valid");
        let p = store.prepare(&named).expect("prepare");
        let key = b"user-42";
        assert!(
            store
                .acquire(None, &p, key, 3)
                .await
                .expect("acquire")
                .is_allowed()
        );
        assert_eq!(left(store.penalize(&p, key, 5).await), 2, "{what}");
        assert_eq!(left(store.penalize(&p, key, 5).await), 0, "{what}");
        assert!(
            !store
                .acquire(None, &p, key, 1)
                .await
                .expect("acquire")
                .is_allowed()
        );
        assert_eq!(left(store.set_remaining(&p, key, 7).await), 7, "{what}");
        let KeyState::Counting(state) = store.inspect(&p, key).await.expect("inspect") else {
            panic!("{what}: not counting");
        };
        for (limit, part) in named.policy().limits().iter().zip(state.iter()) {
            let left = limit
                .peek(clock.now(), part, 0)
                .expect("its state")
                .remaining;
            assert_eq!(left, 7, "{what}: {limit:?}");
        }

        let until = Until::For(Micros::from_secs(60));
        assert!(
            store
                .block(&p, key, until, "ticket 7")
                .await
                .expect("block")
        );
        let denied = store.acquire(None, &p, key, 0).await.expect("acquire");
        assert!(!denied.is_allowed(), "{what}");
        assert_eq!(denied.retry_after, Micros::from_secs(60), "{what}");
        assert!(
            !store
                .penalize(&p, key, 1)
                .await
                .expect("penalize")
                .is_allowed()
        );
        // A cost no request can have is an error, blocked or not, as in Redis.
        let capacity = named.policy().capacity();
        let too_costly = store.acquire(None, &p, key, capacity + 1).await;
        assert!(too_costly.is_err(), "{what}: {too_costly:?}");
        match store.inspect(&p, key).await.expect("inspect") {
            KeyState::Blocked { reason, .. } => assert_eq!(reason, "ticket 7"),
            other => panic!("{what}: {other:?}"),
        }
        // At its end the key is as one never seen.
        clock.advance(Micros::from_secs(60));
        let d = store.acquire(None, &p, key, 1).await.expect("acquire");
        assert_eq!((d.is_allowed(), d.remaining), (true, 9), "{what}");

        assert!(store.block(&p, key, until, "").await.expect("block"));
        assert!(store.unblock(&p, key).await.expect("unblock"));
        assert!(!store.unblock(&p, key).await.expect("unblock"));
        assert_eq!(
            store.peek(None, &p, key, 0).await.expect("peek").remaining,
            10,
            "{what}"
        );
        store.acquire(None, &p, key, 2).await.expect("acquire");
        assert!(store.reset(&p, key).await.expect("reset"));
        assert_eq!(
            store.peek(None, &p, key, 0).await.expect("peek").remaining,
            10,
            "{what}"
        );
        assert!(
            !store
                .block(&p, key, Until::For(Micros::ZERO), "")
                .await
                .expect("block")
        );
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    ready(bad_input());
}

async fn bad_input() {
    let store = MemoryStore::new();
    let named = NamedPolicy::new("p", shapes().remove(2)).expect("valid");
    let p = store.prepare(&named).expect("prepare");
    assert!(matches!(
        store.penalize(&p, b"", 1).await,
        Err(AdminError::InvalidKey(_))
    ));
    let long = "x".repeat(rein_core::admin::MAX_REASON_LEN + 1);
    let until = Until::For(Micros::from_secs(1));
    assert!(matches!(
        store.block(&p, b"k", until, &long).await,
        Err(AdminError::InvalidReason(_))
    ));
    assert_eq!(
        store.peek(None, &p, b"k", 0).await.expect("peek").remaining,
        10
    );
}

/// What an operator's change left the key, or the test fails.
fn left(change: Result<Decision, AdminError>) -> u64 {
    change.expect("a change").remaining
}
