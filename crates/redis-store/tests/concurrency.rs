//! Many callers on one key: exact counts under real contention, and no failed decision while
//! the server's script cache is flushed under load.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use rein_core::{Limit, LimitState, Limiter, Micros, Policy};
use rein_redis::{Coalesce, RedisPolicy, RedisStore, RedisStoreBuilder};
use rein_redis_harness::RedisServer;

const LIMIT: u64 = 100;
const TASKS_PER_INSTANCE: usize = 32;
const FLUSHES: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_of_32_tasks_admit_exactly_the_limit() {
    let server = RedisServer::start().expect("start redis-server");
    // Two independent limiter instances: separate stores, separate connections.
    let instances = [common::store(&server).await, common::store(&server).await];
    for policy in common::unrefilled(LIMIT) {
        let policy = Arc::new(policy);
        let admitted = Arc::new(AtomicU64::new(0));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most_in_flight = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for store in &instances {
            for _ in 0..TASKS_PER_INSTANCE {
                let (store, policy) = (store.clone(), Arc::clone(&policy));
                let (admitted, in_flight, most) =
                    (admitted.clone(), in_flight.clone(), most_in_flight.clone());
                tasks.push(tokio::spawn(async move {
                    // Until this task has seen denials: with no refill, every later call is
                    // denied too.
                    loop {
                        let now_in_flight = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now_in_flight, Ordering::SeqCst);
                        let decision = store.acquire(None, &policy, b"shared-key", 1).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        if decision.expect("a decision").is_allowed() {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        } else {
                            break;
                        }
                    }
                }));
            }
        }
        for task in tasks {
            task.await.expect("task");
        }
        let most = most_in_flight.load(Ordering::SeqCst);
        assert!(
            most >= 8,
            "{}: at most {most} calls were in flight at once",
            policy.name()
        );
        assert_eq!(admitted.load(Ordering::SeqCst), LIMIT, "{}", policy.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flushes_during_traffic_fail_no_decision() {
    let server = RedisServer::start().expect("start redis-server");
    let store = common::store(&server).await;
    let mut flusher = common::raw(&server).await;
    let policy = Arc::new(
        RedisPolicy::new(
            "flush",
            Policy::new([
                Limit::token_bucket(1_000, 1_000, Micros::from_secs(1)).expect("valid"),
                Limit::sliding_log(50, Micros::from_millis(100)).expect("valid"),
            ])
            .expect("valid policy"),
        )
        .expect("valid name"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let decisions = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..16 {
        let (store, policy, stop, decisions): (RedisStore<ConnectionManager>, _, _, _) = (
            store.clone(),
            policy.clone(),
            stop.clone(),
            decisions.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let key = format!("user-{}", task % 4);
            while !stop.load(Ordering::SeqCst) {
                if let Err(e) = store.acquire(None, &policy, key.as_ref(), 1).await {
                    panic!("a failed decision while the script cache was flushed: {e}");
                }
                decisions.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for _ in 0..FLUSHES {
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut flusher)
            .await
            .expect("SCRIPT FLUSH");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("no decision failed");
    }
    let info: String = common::query(&mut flusher, &["INFO", "commandstats"]).await;
    let evals = rein_redis_harness::parse_commandstat(&info, "eval")
        .expect("INFO commandstats in the known format")
        .calls;
    eprintln!("{FLUSHES} flushes, {evals} EVAL fallbacks");
    assert!(
        evals > 10,
        "the script was resent only {evals} times: flushes did not bite"
    );
    let decisions = decisions.load(Ordering::SeqCst);
    assert!(
        decisions > 200,
        "{decisions} decisions: too little traffic to mean anything"
    );
}

/// Coalescing (the default): 64 tasks on one store share script calls, and every decision
/// is still its own atomic step. On each key exactly `LIMIT` are admitted, and the admitted
/// decisions' `remaining` figures are `LIMIT - 1` down to 0, each once: each was decided on
/// the state the previous one left, as separate calls would be. The same store with
/// coalescing off sends one call per decision, which is how the counting is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_decisions_are_exact_each_atomic_and_share_calls() {
    const TASKS: usize = 64;
    const KEYS: usize = 4;
    let server = RedisServer::start().expect("start redis-server");
    let mut raw = common::raw(&server).await;
    let coalescing = common::store(&server).await;
    let off = RedisStoreBuilder::new()
        .deadline(Duration::from_secs(5))
        .coalesce(Coalesce::OFF)
        .connect(&server.url())
        .await
        .expect("connect the store");
    for (store, coalesced) in [(coalescing, true), (off, false)] {
        // The token bucket, fixed window and sliding log run the lean scripts, which
        // coalesce; the sliding counter runs the policy script, which does not.
        for policy in common::unrefilled(LIMIT) {
            let () = redis::cmd("FLUSHALL")
                .query_async(&mut raw)
                .await
                .expect("FLUSHALL");
            let before = server
                .commandstat_calls("evalsha")
                .expect("INFO commandstats");
            let policy = Arc::new(policy);
            let mut tasks = Vec::new();
            for task in 0..TASKS {
                let (store, policy) = (store.clone(), Arc::clone(&policy));
                tasks.push(tokio::spawn(async move {
                    let key = format!("user-{}", task % KEYS);
                    let (mut remaining, mut decisions) = (Vec::new(), 0u64);
                    loop {
                        let decision = store
                            .acquire(None, &policy, key.as_ref(), 1)
                            .await
                            .expect("a decision");
                        decisions += 1;
                        if !decision.is_allowed() {
                            assert_eq!(decision.remaining, 0);
                            assert!(decision.retry_after.as_micros() > 0);
                            return (task % KEYS, remaining, decisions);
                        }
                        assert_eq!(decision.limit, LIMIT);
                        remaining.push(decision.remaining);
                    }
                }));
            }
            let mut per_key = vec![Vec::new(); KEYS];
            let mut decisions = 0;
            for task in tasks {
                let (key, remaining, n) = task.await.expect("task");
                per_key[key].extend(remaining);
                decisions += n;
            }
            for (key, mut remaining) in per_key.into_iter().enumerate() {
                remaining.sort_unstable();
                assert_eq!(
                    remaining,
                    (0..LIMIT).collect::<Vec<_>>(),
                    "{}: key {key}: the admitted decisions' remaining figures",
                    policy.name()
                );
            }
            let calls = server
                .commandstat_calls("evalsha")
                .expect("INFO commandstats")
                - before;
            let lean = policy.name() != "sc";
            if coalesced && lean {
                assert!(
                    calls < decisions,
                    "{}: {calls} calls for {decisions} decisions: nothing was coalesced",
                    policy.name()
                );
            } else {
                assert_eq!(calls, decisions, "{}: one call per decision", policy.name());
            }
        }
    }
}

/// A coalesced call that gets no reply fails every decision it carried, and none is sent
/// again: with the server frozen (`SIGSTOP`) 64 concurrent decisions all fail within their
/// deadline; once it runs again, the key counts at most 64 (each decision at most once,
/// whatever was in flight), and the store decides at once and exactly from that count:
/// no lane is left waiting for a call that ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_call_without_a_reply_fails_its_decisions_and_replays_none() {
    let server = RedisServer::start().expect("start redis-server");
    let store = RedisStoreBuilder::new()
        .deadline(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .expect("connect the store");
    let policy = Arc::new(
        common::unrefilled(LIMIT)
            .into_iter()
            .find(|p| p.name() == "fw")
            .expect("the fixed window"),
    );
    server.pause().expect("SIGSTOP");
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (store, policy) = (store.clone(), Arc::clone(&policy));
        tasks.push(tokio::spawn(async move {
            store.acquire(None, &policy, b"frozen", 1).await
        }));
    }
    for task in tasks {
        let result = task.await.expect("task");
        assert!(result.is_err(), "a frozen server answered: {result:?}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the decisions took {:?} to fail",
        started.elapsed()
    );
    server.resume().expect("SIGCONT");

    // The frozen server now runs what reached it, then answers this, on the same connection.
    let state = store.state(&policy, "frozen").await.expect("state");
    let counted = match state.iter().next() {
        Some(LimitState::FixedWindow(window)) => window.count,
        other => panic!("not a fixed window's state: {other:?}"),
    };
    assert!(
        counted <= 64,
        "{counted} counted for 64 decisions: replayed"
    );

    // The store is not stuck: a burst decides at once, exactly from the count.
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (store, policy) = (store.clone(), Arc::clone(&policy));
        tasks.push(tokio::spawn(async move {
            store.acquire(None, &policy, b"frozen", 1).await
        }));
    }
    let mut remaining = Vec::new();
    for task in tasks {
        let decision = task
            .await
            .expect("task")
            .expect("a decision after the freeze");
        assert!(decision.is_allowed());
        remaining.push(decision.remaining);
    }
    remaining.sort_unstable();
    let left = LIMIT - counted;
    assert_eq!(remaining, (left - 16..left).collect::<Vec<_>>());
}
